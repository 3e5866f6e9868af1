/*
 * test-probe.c -- the memory probes.
 *
 * GPU: a table backend (a test double of struct bh_gpu_backend) for the
 * arithmetic on UUIDs (prefix matching, CUDA_VISIBLE_DEVICES as tables of
 * rows), then the NVML backend against the fake driver library
 * (BH_FAKE_NVML_LIB, built from fake_nvml.c), whose state file each test
 * writes and rewrites (atomically, by rename) to change what the driver
 * says between reads or to make calls fail; a missing library and a
 * library without the required symbols must fail whole and leave nothing
 * loaded.
 *
 * RAM: fixture trees (a fake /proc and /sys/fs/cgroup in a temporary
 * directory) for cgroup v2, v1, hybrid and none, nested limits, reclaim,
 * and malformed contents (a table), then one read of this machine.
 */
#include "task.h"

#include "bulkhead/probe.h"

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/stat.h>

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * 1024ull * 1024ull)

/* ------------------------------------------------------------ fixtures */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void make_tmpdir(char out[64]) {
  snprintf(out, 64, "/tmp/bh-probe-XXXXXX");
  ASSERT_NOT_NULL(mkdtemp(out));
}

static void mkdir_p(char *path) {
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(path, 0755) != 0 && errno != EEXIST) FAIL("mkdir %s: %s", path, strerror(errno));
      *p = '/';
    }
}

/* Writes root/rel (creating directories), replacing it atomically. */
/* root/rel holds exactly content[0..n) (NUL bytes too), written aside and
 * renamed into place. */
static void put_n(const char *root, const char *rel, const char *content, size_t n) {
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  mkdir_p(path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_SYS(fd);
  ASSERT_EQ(write(fd, content, n), (ssize_t)n);
  ASSERT_SYS(close(fd));
  ASSERT_SYS(rename(tmp, path));
}

static void put(const char *root, const char *rel, const char *content) {
  put_n(root, rel, content, strlen(content));
}

static void putf(const char *root, const char *rel, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void putf(const char *root, const char *rel, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  put(root, rel, buf);
}

/* The errno values the probes return have names (the Python exceptions
 * carry them as .errname). */
TEST_IMPL(probe_error_names) {
  static const struct {
    int e;
    const char *name;
  } errs[] = {{ENOTSUP, "ENOTSUP"}, {ENODATA, "ENODATA"}, {ENOTUNIQ, "ENOTUNIQ"},
              {ERANGE, "ERANGE"}, {ENOSPC, "ENOSPC"}, {ENAMETOOLONG, "ENAMETOOLONG"},
              {BH_ENODRIVER, "BH_ENODRIVER"}, {BH_ECGROUP, "BH_ECGROUP"}};
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++) ASSERT_STR_EQ(bh_errname(-errs[i].e), errs[i].name);
  return 0;
}

/* ------------------------------------------------- the table backend */

typedef struct {
  int n;
  const char *uuid[4];
  bh_gpu_memory mem[4];
  int closed;
} table_ctx;

static int t_count(void *c) { return ((table_ctx *)c)->n; }
static int t_uuid(void *c, int i, char *buf, size_t len) {
  return snprintf(buf, len, "%s", ((table_ctx *)c)->uuid[i]) < (int)len ? 0 : -ERANGE;
}
static int t_name(void *c, int i, char *buf, size_t len) {
  (void)c;
  return snprintf(buf, len, "Table GPU %d", i) < (int)len ? 0 : -ERANGE;
}
static int t_memory(void *c, int i, bh_gpu_memory *out) {
  *out = ((table_ctx *)c)->mem[i];
  return 0;
}
static int closes;
static void t_close(void *c) {
  (void)c;
  closes++;
}

static const struct bh_gpu_backend table_backend = {
    .name = "table", .count = t_count, .uuid = t_uuid, .device_name = t_name,
    .memory = t_memory, .close = t_close};

static table_ctx three_gpus = {
    .n = 3,
    .uuid = {"GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-aaaa2222-0000-0000-0000-000000000000",
             "GPU-bbbb3333-0000-0000-0000-000000000000"},
    .mem = {{0, 80 * GiB, 70 * GiB, 10 * GiB, 0}, {0, 80 * GiB, 1 * GiB, 79 * GiB, 0},
            {0, 40 * GiB, 40 * GiB, 0, 0}}};

static bh_gpu *open_table(void) {
  bh_gpu *g;
  char err[128];
  ASSERT_OK(bh_gpu_open_backend(&g, &table_backend, &three_gpus, err, sizeof err));
  return g;
}

TEST_IMPL(probe_gpu_table_backend) {
  closes = 0;
  bh_gpu *g = open_table();
  ASSERT_STR_EQ(bh_gpu_backend_name(g), "table");
  ASSERT_EQ(bh_gpu_count(g), 3);
  char buf[BH_GPU_UUID_MAX];
  ASSERT_EQ(bh_gpu_uuid(g, 2, buf, sizeof buf), 40);
  ASSERT_STR_EQ(buf, "GPU-bbbb3333-0000-0000-0000-000000000000");
  ASSERT_RC(bh_gpu_uuid(g, 2, buf, 10), -ERANGE);
  ASSERT_RC(bh_gpu_uuid(g, 3, buf, sizeof buf), -BH_ENODEVICE);
  ASSERT_RC(bh_gpu_uuid(g, -1, buf, sizeof buf), -BH_ENODEVICE);
  ASSERT_GE(bh_gpu_name(g, 1, buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, "Table GPU 1");
  bh_gpu_memory m;
  ASSERT_OK(bh_gpu_memory_read(g, 1, &m));
  ASSERT_EQ(m.valid, 1);
  ASSERT_UEQ(m.free_bytes, 1 * GiB);
  ASSERT_RC(bh_gpu_memory_read(g, 7, &m), -BH_ENODEVICE);
  ASSERT_EQ(m.valid, 0);
  uint64_t used;
  ASSERT_RC(bh_gpu_process_used(g, 0, getpid(), &used), -ENOTSUP);
  bh_gpu_close(g);
  ASSERT_EQ(closes, 1);
  bh_gpu_close(NULL);
  /* A backend missing a required function is refused (and ctx not used). */
  struct bh_gpu_backend half = table_backend;
  half.memory = NULL;
  ASSERT_RC(bh_gpu_open_backend(&g, &half, &three_gpus, NULL, 0), -EINVAL);
  ASSERT_EQ(closes, 1);
  return 0;
}

TEST_IMPL(probe_gpu_find_prefix) {
  bh_gpu *g = open_table();
  static const struct {
    const char *s;
    int want;
  } rows[] = {
      {"GPU-aaaa1111-0000-0000-0000-000000000000", 0},
      {"GPU-AAAA2222-0000-0000-0000-000000000000", 1}, /* case-insensitive */
      {"GPU-aaaa1", 0},
      {"GPU-aaaa2", 1},
      {"GPU-b", 2},
      {"GPU-aaaa", -ENOTUNIQ}, /* two devices */
      {"GPU-", -ENOTUNIQ},
      {"GPU-cccc", -BH_ENODEVICE},
      {"GPU-aaaa1111-0000-0000-0000-000000000000X", -BH_ENODEVICE},
      {"MIG-aaaa", -BH_ENODEVICE}, /* the table cannot look MIG up */
      {"0", -BH_ENODEVICE},
      {"", -EINVAL},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    int got = bh_gpu_find(g, rows[i].s);
    if (got != rows[i].want)
      FAIL("find(\"%s\") = %d (%s), want %d (%s)", rows[i].s, got, bh_test_errname(got),
           rows[i].want, bh_test_errname(rows[i].want));
  }
  ASSERT_RC(bh_gpu_find(g, NULL), -EINVAL);
  ASSERT_RC(bh_gpu_find(NULL, "GPU-a"), -EINVAL);
  bh_gpu_close(g);
  return 0;
}

TEST_IMPL(probe_gpu_cuda_visible_devices) {
  bh_gpu *g = open_table();
  static const struct {
    const char *cvd; /* NULL: unset */
    int ordinal;
    int want;
  } rows[] = {
      {NULL, 0, 0},
      {NULL, 2, 2},
      {NULL, 3, -BH_ENODEVICE},
      {NULL, -1, -BH_ENODEVICE},
      {"", 0, -BH_ENODEVICE}, /* empty: no devices */
      {"2,0", 0, 2},
      {"2,0", 1, 0},
      {"2,0", 2, -BH_ENODEVICE},
      {"1,7,0", 0, 1},
      {"1,7,0", 1, -BH_ENODEVICE}, /* 7 is invalid: the list ends there */
      {"1,7,0", 2, -BH_ENODEVICE},
      {" 1 , 2 ", 1, 2},           /* blanks around entries */
      {"0,0", 0, 0},
      {"0,0", 1, -BH_ENODEVICE},   /* a repeat is invalid */
      {"0,,1", 1, -BH_ENODEVICE},  /* an empty entry is invalid */
      {"-1", 0, -BH_ENODEVICE},    /* the usual way to hide every GPU */
      {"abc,0", 0, -BH_ENODEVICE},
      {"1a", 0, -BH_ENODEVICE},
      {"99999999999999999999", 0, -BH_ENODEVICE},
      {"GPU-bbbb", 0, 2},
      {"GPU-bbbb,GPU-aaaa1", 1, 0},
      {"GPU-aaaa,0", 0, -BH_ENODEVICE}, /* ambiguous prefix: invalid */
      {"gpu-aaaa2,0", 0, 1},
      {"GPU-aaaa2,0", 1, 0},
      {"GPU-bbbb,2", 1, -BH_ENODEVICE}, /* the same device twice */
      {"GPU-ffff,0", 0, -BH_ENODEVICE},
      {"MIG-0000,0", 0, -BH_ENODEVICE},
      {"2", 1, -BH_ENODEVICE},
      {"2,", 0, 2},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    int got = bh_gpu_visible(g, rows[i].cvd, rows[i].ordinal);
    if (got != rows[i].want)
      FAIL("visible(%s%s%s, %d) = %d (%s), want %d (%s)", rows[i].cvd ? "\"" : "",
           rows[i].cvd ? rows[i].cvd : "NULL", rows[i].cvd ? "\"" : "", rows[i].ordinal, got,
           bh_test_errname(got), rows[i].want, bh_test_errname(rows[i].want));
  }
  ASSERT_RC(bh_gpu_visible(NULL, NULL, 0), -EINVAL);
  bh_gpu_close(g);
  return 0;
}

/* ------------------------------------------------- the fake driver */

#define UUID0 "GPU-11111111-2222-3333-4444-555555555555"
#define UUID1 "GPU-66666666-7777-8888-9999-000000000000"
#define MIG0 "MIG-abcdef01-2345-6789-abcd-ef0123456789"

static char fake_dir[64];

/* A temporary directory with a state file, BH_FAKE_NVML pointing at it. */
static void fake_setup(const char *state) {
  make_tmpdir(fake_dir);
  char path[128];
  snprintf(path, sizeof path, "%s/state", fake_dir);
  put(fake_dir, "state", state);
  ASSERT_SYS(setenv("BH_FAKE_NVML", path, 1));
}

static void fake_state(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fake_state(const char *fmt, ...) {
  char buf[16384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  put(fake_dir, "state", buf);
}

static void fake_teardown(void) { rm_rf(fake_dir); }

#define TWO_DEVICES                                                                    \
  "device " UUID0 " \"Fake H200\" total=150000000000 free=140000000000 used=9000000000 " \
  "reserved=1000000000\n"                                                              \
  "device " UUID1 " \"Fake A100\" total=80000000000 free=80000000000 used=0\n"

static bh_gpu *open_fake(void) {
  bh_gpu *g = NULL;
  char err[512];
  int rc = bh_gpu_open_nvml(&g, BH_FAKE_NVML_LIB, err, sizeof err);
  if (rc != 0) FAIL("open fake NVML: %s (%s)", bh_test_errname(rc), err);
  return g;
}

/* Whether a library whose path contains `name` is mapped here. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "re");
  ASSERT_NOT_NULL(f);
  char line[1024];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, name)) found = 1;
  fclose(f);
  return found;
}

TEST_IMPL(probe_nvml_fake_reads) {
  fake_setup(TWO_DEVICES);
  int fds = bh_test_fd_count();
  bh_gpu *g = open_fake();
  ASSERT_EQ(mapped("libnvidia-ml.so.1"), 1);
  ASSERT_STR_EQ(bh_gpu_backend_name(g), "nvml");
  ASSERT_EQ(bh_gpu_count(g), 2);
  char buf[BH_GPU_UUID_MAX];
  ASSERT_GE(bh_gpu_uuid(g, 1, buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, UUID1);
  ASSERT_GE(bh_gpu_name(g, 0, buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, "Fake H200");
  ASSERT_EQ(bh_gpu_find(g, UUID1), 1);
  ASSERT_EQ(bh_gpu_find(g, "GPU-1111"), 0);
  ASSERT_EQ(bh_gpu_visible(g, "GPU-6666,GPU-1111", 1), 0);

  bh_gpu_memory m;
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_EQ(m.valid, 1);
  ASSERT_UEQ(m.total_bytes, 150000000000ull);
  ASSERT_UEQ(m.free_bytes, 140000000000ull);
  ASSERT_UEQ(m.used_bytes, 9000000000ull);
  ASSERT_UEQ(m.reserved_bytes, 1000000000ull); /* the v2 call answered */

  /* The driver's answer changes between two reads. */
  fake_state("device " UUID0 " \"Fake H200\" total=150000000000 free=12345 used=149999987655\n"
             "device " UUID1 " \"Fake A100\" total=80000000000 free=80000000000 used=0\n");
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.free_bytes, 12345);
  fake_state(TWO_DEVICES);
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.free_bytes, 140000000000ull);
  ASSERT_OK(bh_gpu_memory_read(g, 1, &m));
  ASSERT_UEQ(m.total_bytes, 80000000000ull);

  /* A second probe shares the driver (NVML counts inits); closing one
   * leaves the other working. */
  bh_gpu *g2 = open_fake();
  bh_gpu_close(g);
  ASSERT_OK(bh_gpu_memory_read(g2, 0, &m));
  bh_gpu_close(g2);
  ASSERT_EQ(mapped("libnvidia-ml.so.1"), 0);
  ASSERT_FD_COUNT(fds);
  fake_teardown();
  return 0;
}

TEST_IMPL(probe_nvml_memory_v1_fallback) {
  /* A driver without a working v2 call: read through v1 from then on. */
  fake_setup(TWO_DEVICES "fail nvmlDeviceGetMemoryInfo_v2=13\n");
  bh_gpu *g = open_fake();
  bh_gpu_memory m;
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.free_bytes, 140000000000ull);
  ASSERT_UEQ(m.used_bytes, 10000000000ull); /* v1 counts the reservation */
  ASSERT_UEQ(m.reserved_bytes, 0);
  /* Even with v2 working again, v1 is kept. */
  fake_state(TWO_DEVICES);
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.reserved_bytes, 0);
  bh_gpu_close(g);

  /* NOT_SUPPORTED on v2 falls back for that read only. */
  fake_state(TWO_DEVICES "fail nvmlDeviceGetMemoryInfo_v2=3\n");
  g = open_fake();
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.reserved_bytes, 0);
  fake_state(TWO_DEVICES);
  ASSERT_OK(bh_gpu_memory_read(g, 0, &m));
  ASSERT_UEQ(m.reserved_bytes, 1000000000ull);
  bh_gpu_close(g);
  fake_teardown();
  return 0;
}

TEST_IMPL(probe_nvml_failures) {
  fake_setup(TWO_DEVICES);
  char err[512];
  bh_gpu *g = NULL;
  bh_gpu_memory m;

  /* The GPU falls off the bus between reads. */
  g = open_fake();
  fake_state(TWO_DEVICES "fail nvmlDeviceGetMemoryInfo_v2=15\n");
  ASSERT_RC(bh_gpu_memory_read(g, 0, &m), -BH_ENVML);
  ASSERT_EQ(m.valid, 0);
  ASSERT_UEQ(m.free_bytes, 0);
  fake_state(TWO_DEVICES "fail nvmlDeviceGetMemoryInfo_v2=3\nfail nvmlDeviceGetMemoryInfo=3\n");
  ASSERT_RC(bh_gpu_memory_read(g, 0, &m), -ENOTSUP);
  fake_state(TWO_DEVICES "fail nvmlDeviceGetMemoryInfo_v2=4\n");
  ASSERT_RC(bh_gpu_memory_read(g, 0, &m), -EACCES);
  fake_state(TWO_DEVICES "fail nvmlDeviceGetName=999\n");
  char name[BH_GPU_NAME_MAX];
  ASSERT_RC(bh_gpu_name(g, 0, name, sizeof name), -BH_ENVML);
  bh_gpu_close(g);

  /* nvmlInit fails: no driver, and the library is unloaded again. */
  fake_state(TWO_DEVICES "fail nvmlInit_v2=9\n");
  ASSERT_RC(bh_gpu_open_nvml(&g, BH_FAKE_NVML_LIB, err, sizeof err), -BH_ENODRIVER);
  ASSERT_NULL(g);
  ASSERT_STR_CONTAINS(err, "nvmlInit_v2");
  ASSERT_STR_CONTAINS(err, "Driver Not Loaded");
  ASSERT_EQ(mapped("libnvidia-ml.so.1"), 0);

  /* No state at all: the library is there, the kernel driver is not. */
  ASSERT_SYS(unsetenv("BH_FAKE_NVML"));
  ASSERT_RC(bh_gpu_open_nvml(&g, BH_FAKE_NVML_LIB, err, sizeof err), -BH_ENODRIVER);

  /* The count fails after init: shut down, unloaded, a clear error. */
  char path[128];
  snprintf(path, sizeof path, "%s/state", fake_dir);
  ASSERT_SYS(setenv("BH_FAKE_NVML", path, 1));
  fake_state(TWO_DEVICES "fail nvmlDeviceGetCount_v2=999\n");
  ASSERT_RC(bh_gpu_open_nvml(&g, BH_FAKE_NVML_LIB, err, sizeof err), -BH_ENVML);
  ASSERT_STR_CONTAINS(err, "nvmlDeviceGetCount");
  ASSERT_EQ(mapped("libnvidia-ml.so.1"), 0);

  /* A device whose UUID cannot be read stays in the list, unmatched. */
  fake_state(TWO_DEVICES "fail nvmlDeviceGetUUID=4\n");
  g = open_fake();
  ASSERT_EQ(bh_gpu_count(g), 2);
  ASSERT_RC(bh_gpu_find(g, UUID0), -BH_ENODEVICE);
  char uuid[BH_GPU_UUID_MAX];
  ASSERT_RC(bh_gpu_uuid(g, 0, uuid, sizeof uuid), -EACCES);
  fake_state(TWO_DEVICES);
  ASSERT_GE(bh_gpu_uuid(g, 0, uuid, sizeof uuid), 0); /* asked again */
  bh_gpu_close(g);
  fake_teardown();
  return 0;
}

TEST_IMPL(probe_nvml_missing_library) {
  int fds = bh_test_fd_count();
  char err[512];
  bh_gpu *g = (bh_gpu *)1;
  ASSERT_RC(bh_gpu_open_nvml(&g, "/nonexistent/bulkhead/libnvidia-ml.so.1", err, sizeof err),
            -BH_ENODRIVER);
  ASSERT_NULL(g);
  ASSERT_STR_CONTAINS(err, "/nonexistent/bulkhead/libnvidia-ml.so.1"); /* dlerror's text */
  ASSERT_STR_CONTAINS(err, "No such file");
  ASSERT_RC(bh_gpu_open_nvml(&g, "", err, sizeof err), -EINVAL);
  ASSERT_RC(bh_gpu_open_nvml(NULL, NULL, err, sizeof err), -EINVAL);
  ASSERT_FD_COUNT(fds);
  return 0;
}

TEST_IMPL(probe_nvml_broken_library) {
  int fds = bh_test_fd_count();
  char err[512];
  bh_gpu *g = NULL;
  ASSERT_RC(bh_gpu_open_nvml(&g, BH_FAKE_NVML_BROKEN_LIB, err, sizeof err), -BH_ENODRIVER);
  ASSERT_NULL(g);
  ASSERT_STR_CONTAINS(err, "lacks nvmlShutdown");
  ASSERT_STR_CONTAINS(err, "undefined symbol"); /* dlerror's text */
  ASSERT_EQ(mapped("libfake_nvml_broken.so"), 0); /* all or nothing */
  /* No err buffer is fine too. */
  ASSERT_RC(bh_gpu_open_nvml(&g, BH_FAKE_NVML_BROKEN_LIB, NULL, 0), -BH_ENODRIVER);
  ASSERT_FD_COUNT(fds);
  return 0;
}

TEST_IMPL(probe_nvml_process_used) {
  fake_setup(TWO_DEVICES "process 0 pid=4242 used=1000\n"
                         "process 0 pid=4242 used=24\n" /* two contexts: summed */
                         "process 0 pid=77 used=na\n"
                         "process 1 pid=4242 used=5\n");
  bh_gpu *g = open_fake();
  uint64_t b = 99;
  ASSERT_OK(bh_gpu_process_used(g, 0, 4242, &b));
  ASSERT_UEQ(b, 1024);
  ASSERT_OK(bh_gpu_process_used(g, 1, 4242, &b));
  ASSERT_UEQ(b, 5);
  ASSERT_OK(bh_gpu_process_used(g, 0, 31337, &b)); /* holds nothing */
  ASSERT_UEQ(b, 0);
  b = 99;
  ASSERT_RC(bh_gpu_process_used(g, 0, 77, &b), -ENODATA);
  ASSERT_UEQ(b, 99);
  ASSERT_RC(bh_gpu_process_used(g, 0, 0, &b), -EINVAL);
  ASSERT_RC(bh_gpu_process_used(g, 5, 4242, &b), -BH_ENODEVICE);

  /* More processes than the first buffer holds. */
  char state[8192];
  int off = snprintf(state, sizeof state, "%s", TWO_DEVICES);
  for (int i = 0; i < 100; i++)
    off += snprintf(state + off, sizeof state - (size_t)off, "process 0 pid=%d used=%d\n", 1000 + i, i);
  fake_state("%s", state);
  ASSERT_OK(bh_gpu_process_used(g, 0, 1099, &b));
  ASSERT_UEQ(b, 99);

  /* v3 missing in the driver: the plain call. */
  fake_state(TWO_DEVICES "process 0 pid=4242 used=7\n"
                         "fail nvmlDeviceGetComputeRunningProcesses_v3=13\n");
  ASSERT_OK(bh_gpu_process_used(g, 0, 4242, &b));
  ASSERT_UEQ(b, 7);
  fake_state(TWO_DEVICES "fail nvmlDeviceGetComputeRunningProcesses_v3=3\n");
  ASSERT_RC(bh_gpu_process_used(g, 0, 4242, &b), -ENOTSUP);
  fake_state(TWO_DEVICES "fail nvmlDeviceGetComputeRunningProcesses_v3=4\n");
  ASSERT_RC(bh_gpu_process_used(g, 0, 4242, &b), -ENODATA);
  bh_gpu_close(g);
  fake_teardown();
  return 0;
}

TEST_IMPL(probe_nvml_mig_by_uuid) {
  fake_setup(TWO_DEVICES "mig " MIG0 " \"Fake MIG 1g.18gb\" total=18000000000 free=17000000000 "
                         "used=1000000000\n");
  bh_gpu *g = open_fake();
  ASSERT_EQ(bh_gpu_count(g), 2);
  int idx = bh_gpu_find(g, MIG0);
  ASSERT_EQ(idx, 2); /* after the physical devices */
  ASSERT_EQ(bh_gpu_find(g, "mig-ABCDEF01-2345-6789-abcd-ef0123456789"), 2);
  bh_gpu_memory m;
  ASSERT_OK(bh_gpu_memory_read(g, idx, &m));
  ASSERT_UEQ(m.total_bytes, 18000000000ull);
  char buf[BH_GPU_UUID_MAX];
  ASSERT_GE(bh_gpu_uuid(g, idx, buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, MIG0);
  ASSERT_EQ(bh_gpu_visible(g, "MIG-abcdef01-2345-6789-abcd-ef0123456789", 0), 2);
  ASSERT_RC(bh_gpu_find(g, "MIG-abcdef01"), -BH_ENODEVICE); /* MIG: full UUIDs only */
  ASSERT_RC(bh_gpu_memory_read(g, 3, &m), -BH_ENODEVICE);
  ASSERT_RC(bh_gpu_memory_read(g, -1, &m), -BH_ENODEVICE);
  bh_gpu_close(g);
  fake_teardown();
  return 0;
}

TEST_IMPL(probe_nvml_read_cost) {
  fake_setup(TWO_DEVICES);
  bh_gpu *g = open_fake();
  int fds = bh_test_fd_count();
  bh_gpu_memory m;
  const int n = 100000;
  int64_t t0 = bh_now_ns();
  for (int i = 0; i < n; i++) ASSERT_OK(bh_gpu_memory_read(g, i & 1, &m));
  int64_t per = (bh_now_ns() - t0) / n;
  fprintf(stderr, "memory read through the fake driver: %" PRId64 " ns\n", per);
  ASSERT_FD_COUNT(fds);
  ASSERT_LT(per, 1000000); /* a sanity bound only: the benchmark is elsewhere */
  bh_gpu_close(g);
  fake_teardown();
  return 0;
}

/* --------------------------------------------------------------- RAM */

static char ram_root[64];

#define MEMINFO_16G                                                                  \
  "MemTotal:       16777216 kB\nMemFree:         1048576 kB\nMemAvailable:    8388608 kB\n" \
  "Buffers:           1024 kB\nCached:          2097152 kB\nSwapTotal:             0 kB\n"
#define SWAPS_NONE "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
#define MOUNT_V2 "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
#define MOUNT_V1 "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"

/* A tree with meminfo, swaps and (if given) /proc/self/cgroup and
 * mountinfo. */
static void ram_tree(const char *cgroup, const char *mountinfo) {
  make_tmpdir(ram_root);
  put(ram_root, "proc/meminfo", MEMINFO_16G);
  put(ram_root, "proc/swaps", SWAPS_NONE);
  if (cgroup) put(ram_root, "proc/self/cgroup", cgroup);
  if (mountinfo) put(ram_root, "proc/self/mountinfo", mountinfo);
}

static bh_ram_reading ram_ok(void) {
  bh_ram_reading r;
  char err[512];
  int rc = bh_ram_read(ram_root, &r, err, sizeof err);
  if (rc != 0) FAIL("bh_ram_read: %s: %s", bh_test_errname(rc), err);
  ASSERT_EQ(r.valid, 1);
  return r;
}

TEST_IMPL(probe_ram_meminfo_only) {
  ram_tree(NULL, NULL);
  bh_ram_reading r = ram_ok();
  ASSERT_UEQ(r.total_bytes, 16 * GiB);
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  ASSERT_UEQ(r.meminfo_total_bytes, 16 * GiB);
  ASSERT_UEQ(r.meminfo_available_bytes, 8 * GiB);
  ASSERT_EQ(r.cgroup_version, 0);
  ASSERT_EQ(r.limited, 0);
  ASSERT_UEQ(r.swap_total_bytes, 0);
  /* A kernel before MemAvailable: MemFree + Buffers + Cached. */
  put(ram_root, "proc/meminfo",
      "MemTotal: 16777216 kB\nMemFree: 1048576 kB\nBuffers: 1024 kB\nCached: 2097152 kB\n");
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 1048576 * KiB + 1024 * KiB + 2097152 * KiB);
  /* No trailing newline, other lines in any order, unknown lines. */
  put(ram_root, "proc/meminfo", "Zswap: 5 kB\nMemAvailable: 100 kB\nHugepagesize: 2048 kB\nMemTotal: 200 kB");
  r = ram_ok();
  ASSERT_UEQ(r.total_bytes, 200 * KiB);
  ASSERT_UEQ(r.available_bytes, 100 * KiB);
  /* A trailing slash on the root. */
  char root2[80];
  snprintf(root2, sizeof root2, "%s/", ram_root);
  bh_ram_reading r2;
  ASSERT_OK(bh_ram_read(root2, &r2, NULL, 0));
  ASSERT_UEQ(r2.total_bytes, 200 * KiB);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_swaps) {
  ram_tree(NULL, NULL);
  put(ram_root, "proc/swaps",
      SWAPS_NONE "/dev/sda2                               partition\t8388604\t\t0\t\t-2\n"
                 "/swap\\040file                           file\t\t1048576\t\t512\t\t-3\n");
  bh_ram_reading r = ram_ok();
  ASSERT_UEQ(r.swap_total_bytes, (8388604ull + 1048576ull) * KiB);
  put(ram_root, "proc/swaps", SWAPS_NONE);
  ASSERT_UEQ(ram_ok().swap_total_bytes, 0);
  put(ram_root, "proc/swaps", "");
  ASSERT_UEQ(ram_ok().swap_total_bytes, 0);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/proc/swaps", ram_root);
  ASSERT_SYS(unlink(path)); /* a kernel without swap */
  ASSERT_UEQ(ram_ok().swap_total_bytes, 0);
  rm_rf(ram_root);
  return 0;
}

/* Free pages on the per-CPU lists (/proc/zoneinfo) count as available:
 * MemAvailable leaves them out. */
TEST_IMPL(probe_ram_pcp_lists) {
  ram_tree(NULL, NULL);
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.pcp_valid, 0); /* no zoneinfo: nothing added */
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  /* Two zones, two CPUs; the zone's own lines and other pageset fields
   * (high:, batch:) do not count; a count: that does not parse is skipped. */
  put(ram_root, "proc/zoneinfo",
      "Node 0, zone    DMA32\n  pages free     1000\n  pagesets\n    cpu: 0\n"
      "              count: 100\n              high:  2013\n              batch: 63\n"
      "    cpu: 1\n              count: 20\n"
      "Node 0, zone   Normal\n  pagesets\n    cpu: 0\n              count: 195696\n"
      "              high:  196014\n    cpu: 1\n              count: lots\n"
      "              count:\n              count: -3\n");
  r = ram_ok();
  ASSERT_EQ(r.pcp_valid, 1);
  ASSERT_UEQ(r.pcp_free_bytes, (100 + 20 + 195696) * page);
  ASSERT_UEQ(r.available_bytes, 8 * GiB + (100 + 20 + 195696) * page);
  ASSERT_UEQ(r.meminfo_available_bytes, 8 * GiB); /* as read */
  /* Never more than the total, however large the lists claim to be. */
  put(ram_root, "proc/zoneinfo", "  count: 18446744073709551615\n  count: 18446744073709551615\n");
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 16 * GiB);
  /* Garbage, or a NUL byte: nothing added, no error. */
  put(ram_root, "proc/zoneinfo", "\x01\xff:::\n");
  r = ram_ok();
  ASSERT_EQ(r.pcp_valid, 1);
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  put_n(ram_root, "proc/zoneinfo", "count: 5\0count: 7\n", 18);
  r = ram_ok();
  ASSERT_EQ(r.pcp_valid, 0);
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_cgroup_v2_limited) {
  ram_tree("0::/user.slice/app.scope\n", MOUNT_V2);
  const char *leaf = "sys/fs/cgroup/user.slice/app.scope/";
  char p[256];
  snprintf(p, sizeof p, "%smemory.max", leaf);
  putf(ram_root, p, "%llu\n", 2 * GiB);
  snprintf(p, sizeof p, "%smemory.current", leaf);
  putf(ram_root, p, "%llu\n", 1536 * MiB);
  snprintf(p, sizeof p, "%smemory.stat", leaf);
  putf(ram_root, p, "anon 100\nfile 200\ninactive_anon 3\nactive_file 7\ninactive_file %llu\n",
       256 * MiB);
  put(ram_root, "sys/fs/cgroup/user.slice/memory.max", "max\n");
  put(ram_root, "sys/fs/cgroup/user.slice/memory.current", "999999999999\n");
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 2);
  ASSERT_EQ(r.limited, 1);
  ASSERT_UEQ(r.cgroup_limit_bytes, 2 * GiB);
  ASSERT_UEQ(r.cgroup_current_bytes, 1536 * MiB);
  ASSERT_UEQ(r.cgroup_reclaimable_bytes, 256 * MiB);
  ASSERT_UEQ(r.available_bytes, 2 * GiB - 1536 * MiB + 256 * MiB); /* 768 MiB */
  ASSERT_UEQ(r.total_bytes, 2 * GiB);
  ASSERT_UEQ(r.meminfo_total_bytes, 16 * GiB);

  /* Reclaimable beyond current (can't be, but must not underflow). */
  snprintf(p, sizeof p, "%smemory.stat", leaf);
  putf(ram_root, p, "inactive_file %llu\n", 4 * GiB);
  ASSERT_UEQ(ram_ok().available_bytes, 2 * GiB);
  /* Over the limit (the kernel is reclaiming): 0, not a wrap. */
  putf(ram_root, p, "inactive_file 0\n");
  snprintf(p, sizeof p, "%smemory.current", leaf);
  putf(ram_root, p, "%llu", 3 * GiB); /* and no newline */
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 0);
  ASSERT_EQ(r.limited, 1);
  /* A limit above the machine: MemAvailable is what binds. */
  snprintf(p, sizeof p, "%smemory.max", leaf);
  putf(ram_root, p, "%llu\n", 64 * GiB);
  snprintf(p, sizeof p, "%smemory.current", leaf);
  putf(ram_root, p, "%llu\n", 1 * GiB);
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  ASSERT_UEQ(r.total_bytes, 16 * GiB);
  /* memory.stat missing: nothing reclaimable. */
  putf(ram_root, p, "%llu\n", 1 * GiB);
  snprintf(p, sizeof p, "%s/%smemory.stat", ram_root, leaf);
  ASSERT_SYS(unlink(p));
  snprintf(p, sizeof p, "%smemory.max", leaf);
  putf(ram_root, p, "%llu\n", 2 * GiB);
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 1 * GiB);
  ASSERT_UEQ(r.cgroup_reclaimable_bytes, 0);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_cgroup_v2_unlimited) {
  ram_tree("0::/a/b\n", MOUNT_V2);
  put(ram_root, "sys/fs/cgroup/a/b/memory.max", "max\n");
  put(ram_root, "sys/fs/cgroup/a/b/memory.current", "12345\n");
  put(ram_root, "sys/fs/cgroup/a/memory.max", "max");
  put(ram_root, "sys/fs/cgroup/a/memory.current", "12345\n");
  put(ram_root, "sys/fs/cgroup/memory.stat", "inactive_file 5\n"); /* the root: no memory.max */
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 2);
  ASSERT_EQ(r.limited, 0);
  ASSERT_UEQ(r.cgroup_limit_bytes, 0);
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  ASSERT_UEQ(r.total_bytes, 16 * GiB);
  /* The controller not enabled anywhere (no files at all): unlimited. */
  rm_rf(ram_root);
  ram_tree("0::/x\n", MOUNT_V2);
  r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 2);
  ASSERT_EQ(r.limited, 0);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_cgroup_v2_ancestor_tighter) {
  ram_tree("0::/pod/ctr\n", MOUNT_V2);
  /* Leaf: 4 GiB limit, 1 GiB used (3 GiB left).  Parent: 3 GiB limit,
   * 2.5 GiB used by all its children (0.5 GiB left, +128 MiB cache). */
  putf(ram_root, "sys/fs/cgroup/pod/ctr/memory.max", "%llu\n", 4 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/ctr/memory.current", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/ctr/memory.stat", "inactive_file 0\n");
  putf(ram_root, "sys/fs/cgroup/pod/memory.max", "%llu\n", 3 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/memory.current", "%llu\n", 2560 * MiB);
  putf(ram_root, "sys/fs/cgroup/pod/memory.stat", "inactive_file %llu\n", 128 * MiB);
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.limited, 1);
  ASSERT_UEQ(r.available_bytes, 640 * MiB);
  ASSERT_UEQ(r.cgroup_limit_bytes, 3 * GiB); /* the parent's figures */
  ASSERT_UEQ(r.cgroup_current_bytes, 2560 * MiB);
  ASSERT_UEQ(r.cgroup_reclaimable_bytes, 128 * MiB);
  ASSERT_UEQ(r.total_bytes, 3 * GiB);

  /* The parent has room but a smaller limit than the leaf's usage allows:
   * the total is still bounded by the smallest limit. */
  putf(ram_root, "sys/fs/cgroup/pod/memory.max", "%llu\n", 8 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/memory.current", "%llu\n", 7 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/memory.stat", "inactive_file 0\n");
  putf(ram_root, "sys/fs/cgroup/pod/ctr/memory.max", "%llu\n", 4 * GiB);
  putf(ram_root, "sys/fs/cgroup/pod/ctr/memory.current", "%llu\n", 512 * MiB);
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 1 * GiB);      /* parent: 8 - 7 */
  ASSERT_UEQ(r.cgroup_limit_bytes, 8 * GiB);
  ASSERT_UEQ(r.total_bytes, 4 * GiB);          /* leaf's limit */
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_cgroup_v2_paths) {
  /* The mount elsewhere (escaped blank), and a namespace root that is
   * stripped from the path. */
  ram_tree("0::/ns/job\n",
           "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
           "30 23 0:26 /ns /sys/fs/my\\040cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n");
  putf(ram_root, "sys/fs/my cgroup/job/memory.max", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/my cgroup/job/memory.current", "%llu\n", 256 * MiB);
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.limited, 1);
  ASSERT_UEQ(r.available_bytes, 768 * MiB);
  rm_rf(ram_root);

  /* A path that climbs out of the namespace is read as the mount root. */
  ram_tree("0::/../../outside\n", MOUNT_V2);
  putf(ram_root, "sys/fs/cgroup/memory.max", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/cgroup/memory.current", "%llu\n", 1 * GiB);
  r = ram_ok();
  ASSERT_EQ(r.limited, 1);
  ASSERT_UEQ(r.available_bytes, 0);
  rm_rf(ram_root);

  /* No mountinfo: /sys/fs/cgroup. */
  ram_tree("0::/\n", NULL);
  putf(ram_root, "sys/fs/cgroup/memory.max", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/cgroup/memory.current", "%llu\n", 0ull);
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 1 * GiB);
  rm_rf(ram_root);
  return 0;
}

/* Found by fuzz/fuzz_ram.c: a v1 mountinfo line whose super options field
 * is missing, because the line ends right after the source or because the
 * dash comes so late that the 16 fields read stop there.  The options were
 * read from past the fields found (an uninitialised pointer, or one past
 * the array); such a line cannot name the memory controller, so the
 * default mount is used. */
TEST_IMPL(probe_ram_fuzz_found_mountinfo_fields) {
  static const char *const lines[] = {
      "35 31 0:32 /elsewhere /mnt/x rw - cgroup cgroup\n",
      "35 31 0:32 /elsewhere /mnt/y rw a b c d e f g - cgroup cgroup\n",
      "35 31 0:32 /elsewhere /mnt/z rw a b c d e f g h - cgroup cgroup rw,memory\n",
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    ram_tree("4:memory:/w\n", lines[i]);
    putf(ram_root, "sys/fs/cgroup/memory/w/memory.limit_in_bytes", "%llu\n", 1 * GiB);
    putf(ram_root, "sys/fs/cgroup/memory/w/memory.usage_in_bytes", "%llu\n", 256 * MiB);
    bh_ram_reading r = ram_ok();
    ASSERT_EQ(r.cgroup_version, 1);
    ASSERT_EQ(r.limited, 1);
    ASSERT_UEQ(r.available_bytes, 768 * MiB);
    rm_rf(ram_root);
  }
  return 0;
}

TEST_IMPL(probe_ram_cgroup_v1) {
  /* Hybrid, as on this kind of host: v1 memory wins over the 0:: line. */
  ram_tree("12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n",
           MOUNT_V2 MOUNT_V1);
  const char *d = "sys/fs/cgroup/memory/docker/abc/";
  char p[256];
  snprintf(p, sizeof p, "%smemory.limit_in_bytes", d);
  putf(ram_root, p, "%llu\n", 3 * GiB);
  snprintf(p, sizeof p, "%smemory.usage_in_bytes", d);
  putf(ram_root, p, "%llu\n", 2 * GiB);
  snprintf(p, sizeof p, "%smemory.stat", d);
  putf(ram_root, p, "cache 5\ninactive_file 1\ntotal_cache 9\ntotal_inactive_file %llu\n", 512 * MiB);
  put(ram_root, "sys/fs/cgroup/memory/docker/memory.limit_in_bytes", "9223372036854771712\n");
  put(ram_root, "sys/fs/cgroup/memory/docker/memory.usage_in_bytes", "1\n");
  put(ram_root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  put(ram_root, "sys/fs/cgroup/memory/memory.usage_in_bytes", "1\n");
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 1);
  ASSERT_EQ(r.limited, 1);
  ASSERT_UEQ(r.cgroup_limit_bytes, 3 * GiB);
  ASSERT_UEQ(r.cgroup_reclaimable_bytes, 512 * MiB);
  ASSERT_UEQ(r.available_bytes, 1536 * MiB);
  ASSERT_UEQ(r.total_bytes, 3 * GiB);
  /* Without total_inactive_file, inactive_file. */
  putf(ram_root, p, "inactive_file %llu\n", 1 * GiB);
  ASSERT_UEQ(ram_ok().available_bytes, 2 * GiB);
  /* "Unlimited" at the leaf too. */
  snprintf(p, sizeof p, "%smemory.limit_in_bytes", d);
  put(ram_root, p, "9223372036854771712\n");
  r = ram_ok();
  ASSERT_EQ(r.limited, 0);
  ASSERT_UEQ(r.available_bytes, 8 * GiB);
  rm_rf(ram_root);

  /* Without cgroup namespaces a container's mount root is its cgroup. */
  ram_tree("4:memory:/docker/abc\n",
           "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  putf(ram_root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/cgroup/memory/memory.usage_in_bytes", "%llu\n", 256 * MiB);
  r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 1);
  ASSERT_UEQ(r.available_bytes, 768 * MiB);
  rm_rf(ram_root);

  /* v1 with no mountinfo: /sys/fs/cgroup/memory. */
  ram_tree("3:cpu,memory:/\n", NULL);
  putf(ram_root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "%llu\n", 1 * GiB);
  putf(ram_root, "sys/fs/cgroup/memory/memory.usage_in_bytes", "%llu\n", 1 * GiB);
  r = ram_ok();
  ASSERT_UEQ(r.available_bytes, 0);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_no_cgroup) {
  ram_tree("", NULL); /* empty: in no hierarchy */
  bh_ram_reading r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 0);
  ASSERT_EQ(r.limited, 0);
  rm_rf(ram_root);
  ram_tree("5:cpu:/x\n", NULL); /* v1 without a memory controller */
  r = ram_ok();
  ASSERT_EQ(r.cgroup_version, 0);
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_malformed) {
  static const struct {
    const char *file, *content, *names;
  } rows[] = {
      {"proc/meminfo", "", "proc/meminfo"},
      {"proc/meminfo", "MemTotal: lots kB\nMemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "MemTotal: -5 kB\nMemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "MemTotal: 99999999999999999999 kB\nMemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "MemTotal: 18014398509481984 kB\nMemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "MemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "MemTotal: 1 MB\nMemAvailable: 1 kB\n", "proc/meminfo"},
      {"proc/meminfo", "\x01\xff\n\n:::", "proc/meminfo"},
      {"proc/swaps", "garbage\n", "proc/swaps"},
      {"proc/swaps", SWAPS_NONE "/dev/sda2 partition lots 0 -2\n", "proc/swaps"},
      {"proc/swaps", SWAPS_NONE "/dev/sda2\n", "proc/swaps"},
      {"proc/swaps", SWAPS_NONE "/a p 18446744073709551615 0 -2\n", "proc/swaps"},
      {"proc/self/cgroup", "garbage\n", "proc/self/cgroup"},
      {"proc/self/cgroup", "0::relative\n", "proc/self/cgroup"},
      {"proc/self/cgroup", "0:\n", "proc/self/cgroup"},
      {"sys/fs/cgroup/a/memory.max", "", "memory.max"},
      {"sys/fs/cgroup/a/memory.max", "maximum\n", "memory.max"},
      {"sys/fs/cgroup/a/memory.max", "-1\n", "memory.max"},
      {"sys/fs/cgroup/a/memory.max", "12 34\n", "memory.max"},
      {"sys/fs/cgroup/a/memory.max", "18446744073709551616\n", "memory.max"},
      {"sys/fs/cgroup/a/memory.max", "0x100\n", "memory.max"},
      {"sys/fs/cgroup/a/memory.current", "", "memory.current"},
      {"sys/fs/cgroup/a/memory.current", "max\n", "memory.current"},
      {"sys/fs/cgroup/a/memory.stat", "inactive_file lots\n", "memory.stat"},
      {"sys/fs/cgroup/a/memory.stat", "inactive_file \n", "memory.stat"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    ram_tree("0::/a\n", MOUNT_V2);
    put(ram_root, "sys/fs/cgroup/a/memory.max", "1000\n");
    put(ram_root, "sys/fs/cgroup/a/memory.current", "10\n");
    put(ram_root, "sys/fs/cgroup/a/memory.stat", "inactive_file 1\n");
    ram_ok(); /* the good tree reads */
    put(ram_root, rows[i].file, rows[i].content);
    bh_ram_reading r;
    char err[512] = "";
    int rc = bh_ram_read(ram_root, &r, err, sizeof err);
    if (rc != -BH_ECGROUP || r.valid != 0 || !strstr(err, rows[i].names))
      FAIL("row %zu (%s = \"%s\"): rc %s valid %d err \"%s\"", i, rows[i].file, rows[i].content,
           bh_test_errname(rc), r.valid, err);
    rm_rf(ram_root);
  }
  /* A NUL byte in a file. */
  ram_tree(NULL, NULL);
  put_n(ram_root, "proc/meminfo", "MemTotal: 1 kB\n\0MemAvailable: 1 kB\n", 35);
  bh_ram_reading r;
  ASSERT_RC(bh_ram_read(ram_root, &r, NULL, 0), -BH_ECGROUP);
  rm_rf(ram_root);
  return 0;
}

/* Random bytes (and random mutations of good contents) in every file the
 * reader touches: a reading or BH_ECGROUP, never a crash or another code. */
TEST_IMPL(probe_ram_fuzz) {
  static const char *const files[] = {
      "proc/meminfo", "proc/swaps", "proc/self/cgroup", "proc/self/mountinfo",
      "sys/fs/cgroup/a/memory.max", "sys/fs/cgroup/a/memory.current", "sys/fs/cgroup/a/memory.stat"};
  static const char *const good[] = {
      MEMINFO_16G, SWAPS_NONE "/dev/sda2 partition 8 0 -2\n", "0::/a\n", MOUNT_V2, "1000\n",
      "10\n", "inactive_file 1\n"};
  static const char alphabet[] = "0123456789 \t\n:-/max,kBinactive_fileMemTotal\\0\xff";
  unsigned seed = 12345;
  ram_tree("0::/a\n", MOUNT_V2);
  for (int iter = 0; iter < 1500; iter++) {
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) put(ram_root, files[f], good[f]);
    size_t f = (size_t)rand_r(&seed) % (sizeof files / sizeof *files);
    char buf[256];
    size_t n;
    if (iter & 1) { /* mutate the good contents */
      n = strlen(good[f]) < sizeof buf - 1 ? strlen(good[f]) : sizeof buf - 1;
      memcpy(buf, good[f], n);
      for (int k = 0; k < 1 + rand_r(&seed) % 4 && n; k++)
        buf[(size_t)rand_r(&seed) % n] = alphabet[(size_t)rand_r(&seed) % (sizeof alphabet - 1)];
    } else {
      n = (size_t)rand_r(&seed) % 64;
      for (size_t k = 0; k < n; k++)
        buf[k] = (iter & 2) ? (char)(rand_r(&seed) & 0xff)
                            : alphabet[(size_t)rand_r(&seed) % (sizeof alphabet - 1)];
    }
    buf[n] = 0;
    for (size_t k = 0; k < n; k++)
      if (!buf[k]) buf[k] = '0'; /* put() writes C strings; NUL has its own test */
    put(ram_root, files[f], buf);
    bh_ram_reading r;
    char err[512];
    int rc = bh_ram_read(ram_root, &r, err, sizeof err);
    if (rc != 0 && rc != -BH_ECGROUP)
      FAIL("%s = \"%s\": %s (%s)", files[f], buf, bh_test_errname(rc), err);
    if (rc == 0) ASSERT_LE(r.available_bytes, r.total_bytes);
    ASSERT_EQ(r.valid, rc == 0);
  }
  rm_rf(ram_root);
  return 0;
}

TEST_IMPL(probe_ram_bad_args) {
  bh_ram_reading r;
  char err[256];
  ASSERT_RC(bh_ram_read(NULL, NULL, err, sizeof err), -EINVAL);
  ASSERT_RC(bh_ram_read("", &r, err, sizeof err), -EINVAL);
  ASSERT_RC(bh_ram_read("/nonexistent/bulkhead-root", &r, err, sizeof err), -ENOENT);
  ASSERT_EQ(r.valid, 0);
  ASSERT_STR_CONTAINS(err, "/nonexistent/bulkhead-root/proc/meminfo");
  char longroot[PATH_MAX + 10];
  memset(longroot, 'x', sizeof longroot - 1);
  longroot[0] = '/';
  longroot[sizeof longroot - 1] = 0;
  ASSERT_RC(bh_ram_read(longroot, &r, err, sizeof err), -ENAMETOOLONG);
  return 0;
}

TEST_IMPL(probe_ram_this_machine) {
  int fds = bh_test_fd_count();
  bh_ram_reading r;
  char err[512];
  int rc = bh_ram_read(NULL, &r, err, sizeof err);
  if (rc != 0) FAIL("bh_ram_read(NULL): %s: %s", bh_test_errname(rc), err);
  ASSERT_EQ(r.valid, 1);
  ASSERT_GT(r.total_bytes, 0);
  ASSERT_LE(r.available_bytes, r.total_bytes);
  ASSERT_LE(r.total_bytes, r.meminfo_total_bytes);
  ASSERT_OK(bh_ram_read("/", &r, err, sizeof err));
  fprintf(stderr,
          "total %" PRIu64 " available %" PRIu64 " cgroup v%d limited %d limit %" PRIu64
          " current %" PRIu64 " reclaimable %" PRIu64 " swap %" PRIu64 "\n",
          r.total_bytes, r.available_bytes, r.cgroup_version, r.limited, r.cgroup_limit_bytes,
          r.cgroup_current_bytes, r.cgroup_reclaimable_bytes, r.swap_total_bytes);
  ASSERT_FD_COUNT(fds);
  return 0;
}
