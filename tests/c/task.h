/*
 * task.h -- what every C test file includes: the test declaration macros
 * and the assertions.
 *
 * A test is `TEST_IMPL(name) { ...; return 0; }`, listed once in
 * test-list.h.  The runner (runner.c) runs each test in its own forked
 * process with a timeout, so a test may crash, hang, leak fds or leave
 * children behind without disturbing the others; what it printed is shown
 * when it fails.  A test passes by returning 0 (and, under ASan, by the
 * leak check at exit finding nothing), is skipped by returning TEST_SKIP
 * (after saying why on stderr), and fails through an assertion.
 *
 * A failed assertion prints where it was, the expression, and both sides
 * (error codes by name), then ends the test's process at once with
 * _exit(1): nothing else of the test runs, and the leak checker does not
 * add noise about what the interrupted test still held.  (libuv
 * test/task.h, minus the abort() core dumps.)
 */
#ifndef BH_TESTS_TASK_H
#define BH_TESTS_TASK_H

#include "bulkhead/bulkhead.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TEST_SKIP 77

#define TEST_IMPL(name)          \
  int run_test_##name(void);     \
  int run_test_##name(void)
#define TEST_DECLARE(name) int run_test_##name(void);

/* ---- assertions ---- */

#define BH__FAIL_HEAD()                                                         \
  fprintf(stderr, "%s:%d: assertion failed in %s(): ", __FILE__, __LINE__, __func__)
#define BH__FAIL_END() \
  do {                 \
    fflush(stderr);    \
    fflush(stdout);    \
    _exit(1);          \
  } while (0)

#define ASSERT(expr)                                         \
  do {                                                       \
    if (!(expr)) {                                           \
      BH__FAIL_HEAD();                                       \
      fprintf(stderr, "%s\n", #expr);                        \
      BH__FAIL_END();                                        \
    }                                                        \
  } while (0)

#define FAIL(...)                    \
  do {                               \
    BH__FAIL_HEAD();                 \
    fprintf(stderr, __VA_ARGS__);    \
    fputc('\n', stderr);             \
    BH__FAIL_END();                  \
  } while (0)

/* Signed integer comparisons print both sides. */
#define BH__ASSERT_INT(a, op, b)                                                \
  do {                                                                          \
    int64_t bh__a = (int64_t)(a), bh__b = (int64_t)(b);                         \
    if (!(bh__a op bh__b)) {                                                    \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s %s %s\n    left:  %" PRId64 " (0x%" PRIx64 ")\n"      \
                      "    right: %" PRId64 " (0x%" PRIx64 ")\n",               \
              #a, #op, #b, bh__a, (uint64_t)bh__a, bh__b, (uint64_t)bh__b);     \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_EQ(a, b) BH__ASSERT_INT(a, ==, b)
#define ASSERT_NE(a, b) BH__ASSERT_INT(a, !=, b)
#define ASSERT_LT(a, b) BH__ASSERT_INT(a, <, b)
#define ASSERT_LE(a, b) BH__ASSERT_INT(a, <=, b)
#define ASSERT_GT(a, b) BH__ASSERT_INT(a, >, b)
#define ASSERT_GE(a, b) BH__ASSERT_INT(a, >=, b)

/* Unsigned 64-bit (sizes, bit patterns, ids). */
#define ASSERT_UEQ(a, b)                                                        \
  do {                                                                          \
    uint64_t bh__a = (uint64_t)(a), bh__b = (uint64_t)(b);                      \
    if (bh__a != bh__b) {                                                       \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s == %s\n    left:  %" PRIu64 " (0x%" PRIx64 ")\n"      \
                      "    right: %" PRIu64 " (0x%" PRIx64 ")\n",               \
              #a, #b, bh__a, bh__a, bh__b, bh__b);                              \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_NULL(p)                                                          \
  do {                                                                          \
    const void *bh__p = (const void *)(p);                                      \
    if (bh__p != NULL) {                                                        \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s == NULL\n    got: %p\n", #p, bh__p);                  \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_NOT_NULL(p)                                                      \
  do {                                                                          \
    if ((const void *)(p) == NULL) {                                            \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s != NULL\n", #p);                                      \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_STR_EQ(a, b)                                                     \
  do {                                                                          \
    const char *bh__a = (a), *bh__b = (b);                                      \
    if (!bh__a || !bh__b || strcmp(bh__a, bh__b) != 0) {                        \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s equals %s\n    left:  \"%s\"\n    right: \"%s\"\n",   \
              #a, #b, bh__a ? bh__a : "(null)", bh__b ? bh__b : "(null)");      \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

/* `hay` contains `needle`. */
#define ASSERT_STR_CONTAINS(hay, needle)                                        \
  do {                                                                          \
    const char *bh__h = (hay), *bh__n = (needle);                               \
    if (!bh__h || !bh__n || !strstr(bh__h, bh__n)) {                            \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s contains %s\n    haystack: \"%s\"\n    needle:   \"%s\"\n", \
              #hay, #needle, bh__h ? bh__h : "(null)", bh__n ? bh__n : "(null)");\
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_MEM_EQ(a, b, n)                                                  \
  do {                                                                          \
    const unsigned char *bh__a = (const unsigned char *)(a);                    \
    const unsigned char *bh__b = (const unsigned char *)(b);                    \
    size_t bh__n = (size_t)(n);                                                 \
    for (size_t bh__i = 0; bh__i < bh__n; bh__i++)                              \
      if (bh__a[bh__i] != bh__b[bh__i]) {                                       \
        BH__FAIL_HEAD();                                                        \
        fprintf(stderr, "%s and %s equal for %zu bytes\n"                       \
                        "    first difference at byte %zu: 0x%02x vs 0x%02x\n", \
                #a, #b, bh__n, bh__i, bh__a[bh__i], bh__b[bh__i]);              \
        BH__FAIL_END();                                                         \
      }                                                                         \
  } while (0)

/* A bulkhead return code: prints both codes with their names. */
#define ASSERT_RC(rc, expected)                                                 \
  do {                                                                          \
    int bh__r = (int)(rc), bh__e = (int)(expected);                             \
    if (bh__r != bh__e) {                                                       \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s == %s\n    got:      %d %s (%s)\n"                    \
                      "    expected: %d %s (%s)\n",                             \
              #rc, #expected, bh__r, bh_test_errname(bh__r), bh_strerror(bh__r),\
              bh__e, bh_test_errname(bh__e), bh_strerror(bh__e));               \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#define ASSERT_OK(rc) ASSERT_RC(rc, 0)

/* A libc call that returns -1 and sets errno on failure. */
#define ASSERT_SYS(expr)                                                        \
  do {                                                                          \
    if ((expr) == -1) {                                                         \
      int bh__e = errno;                                                        \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "%s succeeds\n    errno: %d %s (%s)\n", #expr, bh__e,     \
              bh_test_errname(-bh__e), strerror(bh__e));                        \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

/* ---- helpers shared by the test files (runner.c) ---- */

/* bh_errname, or "0" for success and "?" for a code it does not name. */
const char *bh_test_errname(int rc);
/* Number of open fds in this process (entries of /proc/self/fd). */
int bh_test_fd_count(void);
/* Prints the fds of this process and what they point at, to stderr. */
void bh_test_fd_dump(const char *why);
/* CLOCK_MONOTONIC milliseconds. */
int64_t bh_test_now_ms(void);
/* Sleeps this many milliseconds (restarting after signals). */
void bh_test_sleep_ms(int ms);

/* ---- channel helpers (helpers.c) ---- */

/* A connected pair of channels in this process (SOCK_SEQPACKET
 * socketpair, peer_uid getuid(), any pid); asserts on failure. */
void bh_test_pair(bh_channel **a, bh_channel **b, size_t pool_keep_bytes);
/* A socketpair whose first end is opened as a channel (*c) and whose
 * second end stays a plain socket (*raw) to write frames by hand. */
void bh_test_raw_pair(bh_channel **c, int *raw);
/* Sends a frame carrying `value` and lending `blocks`. */
int bh_test_send(bh_channel *c, uint16_t kind, uint64_t req, const void *value, size_t len,
                 bh_block *const *blocks, uint32_t n_blocks);
/* Sends a RESULT frame whose value is nil. */
int bh_test_send_nil(bh_channel *c, uint64_t req);
/* bh_channel_recv with a deadline timeout_ms from now (<0: none). */
int bh_test_recv(bh_channel *c, bh_frame *f, int timeout_ms);
/* Fills a 32-byte little-endian frame header. */
void bh_test_header(uint8_t out[32], uint32_t magic, uint16_t version, uint16_t kind,
                    uint64_t req, uint32_t flags, uint32_t payload_bytes, uint32_t fd_count,
                    uint32_t cpu);
/* One sendmsg of a and then b (either may be empty) with fds attached;
 * returns bytes sent or -errno. */
ssize_t bh_test_raw_send(int fd, const void *a, size_t alen, const void *b, size_t blen,
                         const int *fds, int nfds);
/* Sends, on a raw socket, a well-formed RESULT frame: no blocks, value nil,
 * request id `req`. */
/* Bytes of an empty block section (u32 n_intro, n_return, n_retire,
 * n_lend, all 0): hand-written frames put their value after it. */
#define BH_TEST_SEC 16
void bh_test_raw_good(int fd, uint64_t req);
/* Receives on c and checks it is the frame bh_test_raw_good(req) sent. */
void bh_test_expect_good(bh_channel *c, uint64_t req);

/* Asserts the process has exactly `before` fds open, listing them if not. */
#define ASSERT_FD_COUNT(before)                                                 \
  do {                                                                          \
    int bh__now = bh_test_fd_count(), bh__before = (before);                    \
    if (bh__now != bh__before) {                                                \
      bh_test_fd_dump("fds now");                                               \
      BH__FAIL_HEAD();                                                          \
      fprintf(stderr, "open fds unchanged\n    now:    %d\n    before: %d\n",   \
              bh__now, bh__before);                                             \
      BH__FAIL_END();                                                           \
    }                                                                           \
  } while (0)

#endif
