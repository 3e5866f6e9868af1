/*
 * test-fuzz.c -- the committed fuzz corpus (fuzz/corpus/), replayed through
 * the decoders in this build (gcc, normal and under ASan+UBSan), so the
 * inputs the fuzzers found (found-*) and the seeds stay harmless without
 * clang.  The fuzzers themselves (fuzz/, `make fuzz`) check much more per
 * input; this replay only needs each decoder to return one of its
 * documented codes, and a frame's parts to stay inside the message.  Each
 * input that once crashed also has its own regression test next to its
 * subsystem's tests (probe_ram_fuzz_found_*, ...).
 *
 * The corpus is found through BH_SOURCE_ROOT (tests/c/meson.build).
 */
#include "task.h"

#include "bulkhead/ledger.h"
#include "cli.h"
#include "src/core/internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>

#define LEDGER_BYTES 2248704u

typedef void (*replay_fn)(const uint8_t *p, size_t n);

/* Calls fn on a copy (exactly its size) of every file in
 * fuzz/corpus/<target>; returns how many there were. */
static int replay(const char *target, replay_fn fn) {
  char dir[4096], path[4096 + 256];
  snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", BH_SOURCE_ROOT, target);
  DIR *d = opendir(dir);
  ASSERT_NOT_NULL(d);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ASSERT_SYS(fd);
    struct stat st;
    ASSERT_SYS(fstat(fd, &st));
    size_t n = (size_t)st.st_size;
    uint8_t *p = malloc(n ? n : 1);
    ASSERT_NOT_NULL(p);
    ASSERT_EQ(n ? read(fd, p, n) : 0, (ssize_t)n);
    close(fd);
    fprintf(stderr, "%s/%s (%zu bytes)\n", target, e->d_name, n);
    fn(p, n);
    free(p);
    count++;
  }
  closedir(d);
  return count;
}

static int value_rc_ok(int rc) {
  return rc == 0 || rc == -BH_EOVERRUN || rc == -BH_EBADTAG || rc == -BH_EUTF8 ||
         rc == -BH_ECOUNT || rc == -BH_ETENSOR || rc == -BH_EDTYPE || rc == -BH_EDEPTH ||
         rc == -BH_ETRAILING || rc == -BH_EBODY;
}

static void replay_value(const uint8_t *p, size_t n) {
  ASSERT(value_rc_ok(bh_dec_validate(p, n, BH_MAX_DEPTH)));
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, p, n);
  while (r.pos < r.len && bh_dec_next(&r, &it) == 0) ASSERT_LE(r.pos, r.len);
}

static void replay_frame(const uint8_t *p, size_t n) {
  if (n == 0) return;
  uint32_t n_fds = p[0] % (BH_FRAME_FDS_MAX + 1);
  bh_frame_header h;
  int rc = bh__frame_check(p + 1, n - 1, n_fds, &h);
  if (rc || (h.flags & BH_FRAME_SPILLED)) return;
  ASSERT_EQ(n - 1 - sizeof h, h.payload_bytes);
  bh__section sec;
  const uint8_t *payload = p + 1 + sizeof h;
  if (bh__section_parse(payload, h.payload_bytes, n_fds, &sec) != 0) return;
  ASSERT_LE(sec.len, h.payload_bytes);
  const uint8_t *value = payload + sec.len;
  size_t len = h.payload_bytes - sec.len;
  int rc2 = bh_dec_validate(value, len, BH_MAX_DEPTH);
  ASSERT(value_rc_ok(rc2));
  if (rc2) return;
  /* Its tensor refs against its lend list, as bh_channel_frame_block
   * checks them. */
  bh__lend *l = malloc(sizeof *l * (sec.n_lend ? sec.n_lend : 1));
  ASSERT_NOT_NULL(l);
  bh__lend_load(&sec, l);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, value, len);
  while (r.pos < r.len) {
    ASSERT_OK(bh_dec_next(&r, &it));
    if (it.tag != BH_TAG_TENSOR || it.u.t.block == BH_BLOCK_NONE || it.u.t.block == BH_BLOCK_INLINE)
      continue;
    int k = bh__lend_claim(l, sec.n_lend, &it.u.t);
    ASSERT(k >= 0 || k == -BH_EBLOCK || k == -BH_ETENSOR);
    if (k >= 0) ASSERT_UEQ(l[k].end, it.u.t.offset + it.u.t.nbytes);
  }
  free(l);
}

/* As fuzz_ledger.c: the input as it is, then as the start of a whole file;
 * the mutex bytes are a fresh one (they are lock state, not data). */
static void ledger_image(uint8_t *img, size_t n) {
  static pthread_mutex_t fresh;
  static int init;
  if (!init) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&fresh, &a);
    init = 1;
  }
  if (n >= 32 + sizeof fresh) memcpy(img + 32, &fresh, sizeof fresh);
  bh_ledger *l = NULL;
  int rc = bh__ledger_open_mem(&l, img, n);
  if (rc < 0) {
    ASSERT(rc == -BH_ELEDGER || rc == -BH_ELEDGERVER);
    return;
  }
  bh_ledger_record *recs = calloc(BH_LEDGER_SLOTS, sizeof *recs);
  ASSERT_NOT_NULL(recs);
  int k = bh_ledger_snapshot(l, recs, BH_LEDGER_SLOTS);
  ASSERT(k >= 0 || k == -EAGAIN);
  for (int i = 0; i < k; i++) {
    ASSERT_LE(recs[i].n_devices, BH_LEDGER_DEVICES);
    ASSERT_LE(recs[i].n_models, BH_LEDGER_MODELS);
  }
  free(recs);
  bh_ledger_close(l);
}

static void replay_ledger(const uint8_t *p, size_t n) {
  uint8_t *img = malloc(n ? n : 1);
  ASSERT_NOT_NULL(img);
  memcpy(img, p, n);
  ledger_image(img, n);
  free(img);
  if (n < LEDGER_BYTES) {
    img = calloc(1, LEDGER_BYTES);
    ASSERT_NOT_NULL(img);
    memcpy(img, p, n);
    ledger_image(img, LEDGER_BYTES);
    free(img);
  }
}

static void replay_answer(const uint8_t *p, size_t n) {
  bh_cli_answer a;
  memset(&a, 0, sizeof a);
  int rc = bh_cli_answer_read(p, n, &a);
  ASSERT(rc <= 0);
  ASSERT(memchr(a.message, 0, sizeof a.message) != NULL);
  bh_cli_pack rows[4];
  int k = -1;
  ASSERT(bh_cli_packs_read(p, n, rows, 4, &k) <= 0 && k >= 0 && k <= 4);
}

TEST_IMPL(fuzz_corpus_replay) {
  int fds0 = bh_test_fd_count();
  ASSERT_GT(replay("codec", replay_value), 10);
  ASSERT_GT(replay("frame", replay_frame), 10);
  ASSERT_GT(replay("ledger", replay_ledger), 3);
  ASSERT_GT(replay("answer", replay_answer), 3);
  ASSERT_FD_COUNT(fds0);
  return 0;
}
