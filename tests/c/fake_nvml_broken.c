/*
 * fake_nvml_broken.c -- a library that looks like the start of NVML and
 * then stops: it exports nvmlInit_v2 and nothing else, so opening it must
 * fail on the first missing required symbol and leave nothing loaded.
 * Built as tests/c/fake_nvml/libfake_nvml_broken.so.
 */
__attribute__((visibility("default"))) int nvmlInit_v2(void);
__attribute__((visibility("default"))) int nvmlInit_v2(void) { return 0; }
