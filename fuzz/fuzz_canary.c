/*
 * fuzz_canary.c -- the canary's tokenizer and analyzer (tools/canary.c)
 * on arbitrary source text.
 *
 * `bulkhead canary` reads a ComfyUI checkout's model_management.py, which
 * is whatever upstream wrote that day; the tokenizer and the analyzer
 * promise to be total on any bytes.  Checked on every input: tokenizing
 * succeeds and ends in one BH_TOK_END, every token lies inside the source
 * in order (lines and offsets never go back); the analysis succeeds, its
 * status is 0 or 1, and both renderings (text and JSON) write.
 */
#include "fuzz.h"
#include "canary.h"

static FILE *sink;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  sink = fopen("/dev/null", "we");
  FUZZ_CHECK(sink);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *src = (const char *)data;
  bh_canary_token *t = NULL;
  size_t n = 0;
  FUZZ_CHECK(bh_canary_tokenize(src ? src : "", size, &t, &n) == 0);
  FUZZ_CHECK(n >= 1 && t[n - 1].kind == BH_TOK_END);
  for (size_t i = 0; i < n; i++) {
    FUZZ_CHECK((uint64_t)t[i].off + t[i].len <= size && t[i].line >= 1);
    if (i) FUZZ_CHECK(t[i].line >= t[i - 1].line && t[i].off >= t[i - 1].off);
  }
  free(t);
  bh_canary_report *r = NULL;
  FUZZ_CHECK(bh_canary_analyze(src ? src : "", size, NULL, &r) == 0);
  int st = bh_canary_report_status(r);
  FUZZ_CHECK(st == 0 || st == 1);
  FUZZ_CHECK(bh_canary_report_write(r, "fuzz.py", 0, sink) == 0);
  FUZZ_CHECK(bh_canary_report_write(r, "fuzz.py", 1, sink) == 0);
  bh_canary_report_free(r);
  return 0;
}
