/*
 * test-shm.c -- the block pool behind a channel: reuse and best fit,
 * blocks as sealed prefaulted memfds, trimming to pool_keep_bytes, blocks
 * that outlive their channel, and unrefs from other threads.
 *
 * Blocks are reached through the public API (a channel's pool); a block's
 * memfd, which the API does not expose, is found by its name in
 * /proc/self/fd ("memfd:bulkhead-block-<id>").
 */
#include "task.h"
#include "src/core/internal.h" /* the pool's bounds */

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define MiB (1024u * 1024u)

static bh_pool_stats stats_of(bh_channel *c) {
  bh_pool_stats s;
  ASSERT_OK(bh_pool_stats_get(bh_channel_pool(c), &s));
  return s;
}

/* This process's fd for own block `id`, or -1. */
static int block_fd(uint32_t id) {
  char want[64];
  snprintf(want, sizeof want, "/memfd:bulkhead-block-%u (deleted)", id);
  DIR *d = opendir("/proc/self/fd");
  ASSERT_NOT_NULL(d);
  struct dirent *e;
  int found = -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[128];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) continue;
    target[n] = 0;
    if (strcmp(target, want) == 0) found = atoi(e->d_name);
  }
  closedir(d);
  return found;
}

TEST_IMPL(shm_reuse_same_id) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x, *y;
  ASSERT_OK(bh_channel_block_acquire(a, 10000, &x));
  uint32_t id = bh_block_id(x);
  ASSERT_EQ(bh_block_size(x), 12288); /* whole pages */
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.own_blocks, 1);
  ASSERT_EQ(s.own_bytes, 12288);
  ASSERT_EQ(s.free_blocks, 0);
  ASSERT_EQ(s.created, 1);
  ASSERT_EQ(s.reused, 0);
  bh_block_unref(x);
  s = stats_of(a);
  ASSERT_EQ(s.free_blocks, 1);
  ASSERT_EQ(s.free_bytes, 12288);
  ASSERT_OK(bh_channel_block_acquire(a, 10000, &y));
  ASSERT_EQ(bh_block_id(y), id);
  s = stats_of(a);
  ASSERT_EQ(s.reused, 1);
  ASSERT_EQ(s.created, 1);
  /* Held blocks are never handed out twice. */
  ASSERT_OK(bh_channel_block_acquire(a, 10000, &x));
  ASSERT_NE(bh_block_id(x), id);
  ASSERT_EQ(stats_of(a).created, 2);
  /* An extra reference keeps a block from the free list. */
  bh_block_ref(x);
  bh_block_unref(x);
  ASSERT_EQ(stats_of(a).free_blocks, 0);
  bh_block_unref(x);
  bh_block_unref(y);
  s = stats_of(a);
  ASSERT_EQ(s.free_blocks, 2);
  ASSERT_EQ(s.own_blocks, 2);
  /* Smaller requests within half the size reuse too. */
  ASSERT_OK(bh_channel_block_acquire(a, 6145, &x));
  ASSERT_EQ(bh_block_size(x), 12288);
  ASSERT_EQ(stats_of(a).reused, 2);
  bh_block_unref(x);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(shm_best_fit) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *m1, *m2, *m3, *x;
  ASSERT_OK(bh_channel_block_acquire(a, 1 * MiB, &m1));
  ASSERT_OK(bh_channel_block_acquire(a, 3 * MiB, &m3));
  ASSERT_OK(bh_channel_block_acquire(a, 2 * MiB, &m2));
  uint32_t id1 = bh_block_id(m1), id2 = bh_block_id(m2), id3 = bh_block_id(m3);
  bh_block_unref(m1);
  bh_block_unref(m3);
  bh_block_unref(m2);
  ASSERT_EQ(stats_of(a).free_blocks, 3);
  /* 1.5 MiB: the 2 MiB block, not the 3 MiB one listed before it. */
  ASSERT_OK(bh_channel_block_acquire(a, 3 * MiB / 2, &x));
  ASSERT_EQ(bh_block_id(x), id2);
  bh_block_unref(x);
  ASSERT_OK(bh_channel_block_acquire(a, 1 * MiB, &x));
  ASSERT_EQ(bh_block_id(x), id1);
  bh_block_unref(x);
  ASSERT_OK(bh_channel_block_acquire(a, 5 * MiB / 2, &x));
  ASSERT_EQ(bh_block_id(x), id3);
  bh_block_unref(x);
  ASSERT_EQ(stats_of(a).created, 3);
  /* A much smaller request does not take a big block: a new one. */
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &x));
  ASSERT_EQ(bh_block_size(x), 4096);
  ASSERT(bh_block_id(x) != id1 && bh_block_id(x) != id2 && bh_block_id(x) != id3);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.created, 4);
  ASSERT_EQ(s.free_blocks, 3);
  bh_block_unref(x);
  /* Nor one just under half of it. */
  ASSERT_OK(bh_channel_block_acquire(a, 1 * MiB - 4096, &x));
  ASSERT_NE(bh_block_id(x), id2);
  ASSERT_NE(bh_block_id(x), id3);
  bh_block_unref(x);
  /* Bigger than every free block: a new one. */
  ASSERT_OK(bh_channel_block_acquire(a, 3 * MiB + 1, &x));
  ASSERT_EQ(bh_block_size(x), 3 * MiB + 4096);
  bh_block_unref(x);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(shm_block_is_sealed_memfd) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x;
  ASSERT_OK(bh_channel_block_acquire(a, 64 * 1024, &x));
  size_t size = bh_block_size(x);
  int fd = block_fd(bh_block_id(x));
  if (fd < 0) {
    bh_test_fd_dump("fds");
    FAIL("no fd named memfd:bulkhead-block-%u", bh_block_id(x));
  }
  ASSERT_EQ(bh_test_fd_count(), fds0 + 3);
  int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_SYS(seals);
  ASSERT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW), F_SEAL_SHRINK | F_SEAL_GROW);
  ASSERT_EQ(seals & F_SEAL_WRITE, 0); /* we write tensors into it */
  ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  struct stat st;
  ASSERT_SYS(fstat(fd, &st));
  ASSERT_EQ(st.st_size, size);
  /* Neither shrinking nor growing is possible. */
  errno = 0;
  ASSERT_EQ(ftruncate(fd, 0), -1);
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(ftruncate(fd, (off_t)size * 2), -1);
  ASSERT_EQ(errno, EPERM);
  ASSERT_EQ(ftruncate(fd, (off_t)size - 4096), -1);
  ASSERT_EQ(errno, EPERM);
  /* The mapping is the memfd's memory. */
  ASSERT_EQ(pwrite(fd, "seal", 4, 4096), 4);
  ASSERT_MEM_EQ((uint8_t *)bh_block_addr(x) + 4096, "seal", 4);
  /* Prefaulted: every page is resident already. */
  size_t pages = size / 4096;
  unsigned char *vec = malloc(pages);
  ASSERT_NOT_NULL(vec);
  ASSERT_SYS(mincore(bh_block_addr(x), size, vec));
  for (size_t i = 0; i < pages; i++)
    if (!(vec[i] & 1)) FAIL("page %zu of the new block is not resident", i);
  free(vec);

  /* The peer maps the same memory: its writes show in ours. */
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, &nil, 1, &x, 1));
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  bh_block *pb;
  ASSERT_OK(bh_channel_peer_block(b, bh_block_id(x), &pb));
  ASSERT_MEM_EQ((uint8_t *)bh_block_addr(pb) + 4096, "seal", 4);
  memcpy(bh_block_addr(pb), "peer", 4);
  ASSERT_MEM_EQ(bh_block_addr(x), "peer", 4);
  bh_block_unref(pb);
  bh_block_unref(x);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Every own block holds an fd: at most BH__OWN_BLOCKS_MAX at once (past
 * it -BH_EPOOLFULL, nothing created), and once they are free the pool
 * keeps BH__KEEP_FREE_BLOCKS of them, not all (a call that failed after
 * taking many must not leave the process without fds). */
TEST_IMPL(shm_own_blocks_are_bounded) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  static bh_block *x[BH__OWN_BLOCKS_MAX];
  for (unsigned i = 0; i < BH__OWN_BLOCKS_MAX; i++) ASSERT_OK(bh_channel_block_acquire(a, 4096, &x[i]));
  ASSERT_EQ(bh_test_fd_count(), fds0 + 2 + (int)BH__OWN_BLOCKS_MAX);
  bh_block *y;
  ASSERT_RC(bh_channel_block_acquire(a, 4096, &y), -BH_EPOOLFULL);
  ASSERT_EQ(stats_of(a).own_blocks, BH__OWN_BLOCKS_MAX);
  for (unsigned i = 0; i < BH__OWN_BLOCKS_MAX; i++) bh_block_unref(x[i]);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.free_blocks, BH__KEEP_FREE_BLOCKS);
  ASSERT_EQ(s.own_blocks, BH__KEEP_FREE_BLOCKS);
  ASSERT_EQ(bh_test_fd_count(), fds0 + 2 + (int)BH__KEEP_FREE_BLOCKS);
  /* Full, with free blocks of the wrong size among them: a new one still
   * fits, a free one goes to make room. */
  enum { HELD = BH__OWN_BLOCKS_MAX - BH__KEEP_FREE_BLOCKS };
  for (unsigned i = 0; i < BH__OWN_BLOCKS_MAX; i++)
    ASSERT_OK(bh_channel_block_acquire(a, i < HELD ? 4096 : 8192, &x[i]));
  for (unsigned i = HELD; i < BH__OWN_BLOCKS_MAX; i++) bh_block_unref(x[i]), x[i] = NULL;
  s = stats_of(a);
  ASSERT_EQ(s.own_blocks, BH__OWN_BLOCKS_MAX);
  ASSERT_EQ(s.free_blocks, BH__KEEP_FREE_BLOCKS);
  ASSERT_OK(bh_channel_block_acquire(a, 1 << 20, &y));
  ASSERT_EQ(stats_of(a).own_blocks, BH__OWN_BLOCKS_MAX);
  bh_block_unref(y);
  for (unsigned i = 0; i < BH__OWN_BLOCKS_MAX; i++)
    if (x[i]) bh_block_unref(x[i]);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_EQ(bh_test_fd_count(), fds0);
  return 0;
}

/* An own block holds its memfd only until the frame that introduces it
 * is sent; lent again later it needs none.  Block memfds open in the whole
 * process are bounded (a quarter of the soft RLIMIT_NOFILE), over every
 * pool: a host with many workers keeps fds for everything else. */
TEST_IMPL(shm_block_fds_close_once_sent_and_are_bounded_per_process) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b, *c, *d;
  bh_test_pair(&a, &b, 0);
  bh_test_pair(&c, &d, 0);
  static const uint8_t nil = BH_TAG_NIL;
  bh_frame f;
  bh_block *x, *pb;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &x));
  ASSERT(block_fd(bh_block_id(x)) >= 0);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, &nil, 1, &x, 1));
  ASSERT_EQ(block_fd(bh_block_id(x)), -1);
  ASSERT_EQ(bh_test_fd_count(), fds0 + 4);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_OK(bh_channel_peer_block(b, bh_block_id(x), &pb));
  memcpy(bh_block_addr(pb), "one", 4);
  bh_block_unref(pb);
  ASSERT_OK(bh_test_send_nil(b, 2)); /* carries the return note */
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_EQ(stats_of(a).lent_blocks, 0);
  /* lent again: by id, no fd, the same memory */
  memcpy(bh_block_addr(x), "two", 4);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 3, &nil, 1, &x, 1));
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 0);
  ASSERT_OK(bh_channel_peer_block(b, bh_block_id(x), &pb));
  ASSERT_MEM_EQ(bh_block_addr(pb), "two", 4);
  bh_block_unref(pb);
  bh_block_unref(x);

  /* The process-wide bound, over two pools each far from its own. */
  struct rlimit old, low;
  ASSERT_SYS(getrlimit(RLIMIT_NOFILE, &old));
  low = old;
  low.rlim_cur = 4 * BH__KEEP_FREE_BLOCKS;
  ASSERT_SYS(setrlimit(RLIMIT_NOFILE, &low));
  ASSERT_UEQ(bh__block_fds_max(), BH__KEEP_FREE_BLOCKS);
  size_t room = BH__KEEP_FREE_BLOCKS - bh__block_fds_open();
  static bh_block *y[BH__KEEP_FREE_BLOCKS];
  for (size_t i = 0; i < room; i++) ASSERT_OK(bh_channel_block_acquire(i % 2 ? a : c, 4096, &y[i]));
  bh_block *z;
  ASSERT_RC(bh_channel_block_acquire(a, 4096, &z), -BH_EPOOLFULL);
  ASSERT_RC(bh_channel_block_acquire(c, 4096, &z), -BH_EPOOLFULL);
  ASSERT(stats_of(a).own_blocks < BH__OWN_BLOCKS_MAX / 2);
  /* one of c's sent to d: its memfd closes, and a may make one more */
  ASSERT_OK(bh_test_send(c, BH_KIND_RESULT, 4, &nil, 1, &y[0], 1));
  ASSERT_OK(bh_test_recv(d, &f, 5000));
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &z));
  ASSERT_RC(bh_channel_block_acquire(a, 4096, &y[room]), -BH_EPOOLFULL);
  ASSERT_SYS(setrlimit(RLIMIT_NOFILE, &old));
  bh_block_unref(z);
  for (size_t i = 0; i < room; i++) bh_block_unref(y[i]);
  bh_channel_close(a);
  bh_channel_close(b);
  bh_channel_close(c);
  bh_channel_close(d);
  ASSERT_FD_COUNT(fds0);
  ASSERT_UEQ(bh__block_fds_open(), 0);
  return 0;
}

TEST_IMPL(shm_trim_keep_bytes) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 1 * MiB);
  bh_block *x[4];
  uint32_t id[4];
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(bh_channel_block_acquire(a, MiB, &x[i]));
    id[i] = bh_block_id(x[i]);
  }
  ASSERT_EQ(bh_test_fd_count(), fds0 + 2 + 4);
  static const int own_after[4] = {4, 3, 2, 1};
  for (int i = 0; i < 4; i++) {
    bh_block_unref(x[i]);
    bh_pool_stats s = stats_of(a);
    ASSERT_EQ(s.own_blocks, own_after[i]);
    ASSERT_EQ(s.free_blocks, 1);
    ASSERT_LE(s.free_bytes, 1 * MiB);
  }
  /* The oldest went, with their memfds; the last freed stays. */
  ASSERT_EQ(bh_test_fd_count(), fds0 + 2 + 1);
  for (int i = 0; i < 3; i++) ASSERT_EQ(block_fd(id[i]), -1);
  ASSERT_GT(block_fd(id[3]), 2);
  bh_block *y;
  ASSERT_OK(bh_channel_block_acquire(a, MiB, &y));
  ASSERT_EQ(bh_block_id(y), id[3]);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.created, 4);
  ASSERT_EQ(s.reused, 1);
  /* Held blocks are never trimmed, however far over the limit. */
  bh_block *z[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(bh_channel_block_acquire(a, MiB, &z[i]));
  ASSERT_EQ(stats_of(a).own_blocks, 4);
  for (int i = 0; i < 3; i++) bh_block_unref(z[i]);
  bh_block_unref(y);
  ASSERT_EQ(stats_of(a).own_blocks, 1);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

static void *unref_thread(void *arg) {
  bh_block *blk = arg;
  memset(bh_block_addr(blk), 0x77, bh_block_size(blk));
  bh_block_unref(blk);
  return NULL;
}

/* Blocks still referenced when their channel closes stay mapped until the
 * last unref (the ASan build checks nothing is touched after free). */
TEST_IMPL(shm_close_keeps_mapping) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *own, *lent_held, *lent_only, *spare, *pb;
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &own));
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &lent_held));
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &lent_only));
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &spare));
  memset(bh_block_addr(lent_held), 0x11, 8192);
  bh_block *lend[2] = {lent_held, lent_only};
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, &nil, 1, lend, 2));
  bh_block_unref(lent_only); /* only the loan holds it now */
  bh_block_unref(spare);     /* free in the pool */
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_OK(bh_channel_peer_block(b, bh_block_id(lent_held), &pb));
  ASSERT_EQ(bh_test_fd_count(), fds0 + 2 + 2); /* the lent two closed their memfds when sent */

  /* a closes: the free block and the lent-only block go at once. */
  bh_channel_close(a);
  ASSERT_EQ(bh_test_fd_count(), fds0 + 1 + 1);
  uint8_t *p = bh_block_addr(own);
  memset(p, 0x42, 8192);
  ASSERT_EQ(p[8191], 0x42);
  ASSERT_EQ(bh_block_size(own), 8192);
  ASSERT(bh_block_is_own(own));
  bh_block_ref(own);
  bh_block_unref(own);
  ASSERT_EQ(p[0], 0x42);
  bh_block_unref(own);
  ASSERT_EQ(bh_test_fd_count(), fds0 + 1);
  /* The last one is unreferenced from another thread. */
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, unref_thread, lent_held), 0);
  ASSERT_EQ(pthread_join(th, NULL), 0);
  ASSERT_EQ(bh_test_fd_count(), fds0 + 1);

  /* b closes while holding a's block: still readable, then let go. */
  bh_channel_close(b);
  const uint8_t *q = bh_block_addr(pb);
  ASSERT_EQ(q[0], 0x77); /* written through a's mapping before it went */
  ASSERT_EQ(q[8191], 0x77);
  ((uint8_t *)bh_block_addr(pb))[100] = 1;
  bh_block_unref(pb);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(shm_bad_args) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x = NULL;
  ASSERT_RC(bh_channel_block_acquire(a, 0, &x), -EINVAL);
  ASSERT_RC(bh_channel_block_acquire(a, (size_t)1 << 47, &x), -BH_E2BIG);
  ASSERT_RC(bh_channel_block_acquire(NULL, 4096, &x), -EINVAL);
  ASSERT_RC(bh_channel_block_acquire(a, 4096, NULL), -EINVAL);
  ASSERT_NULL(x);
  bh_pool_stats s;
  ASSERT_RC(bh_pool_stats_get(NULL, &s), -EINVAL);
  ASSERT_RC(bh_pool_stats_get(bh_channel_pool(a), NULL), -EINVAL);
  bh_block_unref(NULL); /* a no-op */
  ASSERT_EQ(stats_of(a).own_blocks, 0);
  bh_channel_close(a);
  bh_channel_close(b);
  bh_channel_close(NULL);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Acquire and unref from several threads on one pool. */
enum { THREADS = 4, ROUNDS = 300 };

static void *churn_thread(void *arg) {
  bh_channel *c = arg;
  for (int i = 0; i < ROUNDS; i++) {
    bh_block *x;
    size_t n = 4096 * (size_t)(1 + (i % 4));
    if (bh_channel_block_acquire(c, n, &x)) return (void *)1;
    uint8_t *p = bh_block_addr(x);
    p[0] = (uint8_t)i;
    p[n - 1] = (uint8_t)i;
    bh_block_ref(x);
    bh_block_unref(x);
    if (p[0] != (uint8_t)i || p[n - 1] != (uint8_t)i) return (void *)2; /* shared with another */
    bh_block_unref(x);
  }
  return NULL;
}

TEST_IMPL(shm_threads) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) ASSERT_EQ(pthread_create(&th[i], NULL, churn_thread, a), 0);
  for (int i = 0; i < THREADS; i++) {
    void *r;
    ASSERT_EQ(pthread_join(th[i], &r), 0);
    ASSERT_NULL(r);
  }
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.created + s.reused, THREADS * ROUNDS);
  ASSERT_EQ(s.free_blocks, s.own_blocks);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_LE(s.own_blocks, THREADS * 4);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* bh_copy: every byte lands where one memcpy puts it, for sizes that split
 * unevenly into cache-line shares and thread counts past the bound; the
 * bytes around the destination stay untouched. */
TEST_IMPL(shm_copy_split) {
  /* The last two sizes stream past the cache (4 MiB and up), from and to
   * addresses off a cache line, with a tail short of one. */
  static const size_t sizes[] = {0, 1, 63, 64 * 3 + 5, MiB + 17, 4 * MiB, 9 * MiB + 4093};
  static const unsigned threads[] = {1, 2, 3, 4, 16, 17};
  size_t most = 9 * MiB + 4093;
  uint8_t *src = malloc(most), *dst = malloc(most + 2), *want = malloc(most + 2);
  ASSERT_NOT_NULL(src);
  ASSERT_NOT_NULL(dst);
  ASSERT_NOT_NULL(want);
  for (size_t i = 0; i < most; i++) src[i] = (uint8_t)(i * 131 + (i >> 12));
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
      memset(dst, 0xA5, most + 2);
      memset(want, 0xA5, most + 2);
      memcpy(want + 1, src, sizes[s]);
      int rc = bh_copy(dst + 1, src, sizes[s], threads[t]);
      ASSERT_GE(rc, 1);
      ASSERT_LE(rc, 16);
      ASSERT_EQ(memcmp(dst, want, most + 2), 0);
    }
  }
  ASSERT_RC(bh_copy(NULL, src, 1, 2), -EINVAL);
  ASSERT_RC(bh_copy(dst, src, 1, 0), -EINVAL);
  ASSERT_EQ(bh_copy(NULL, NULL, 0, 2), 1);
  free(want);
  free(dst);
  free(src);
  return 0;
}

/* bh_copy's helpers serve one copy at a time and never write after it
 * returned: copies of three chunks into four buffers back to back, a
 * marker byte written at each chunk's start the moment bh_copy returns,
 * then the four checked (a helper that went on claiming chunks of a later
 * copy with an earlier copy's addresses would write the earlier bytes over
 * a marker); two threads copying at once each get their own bytes. */
struct copy_loop {
  uint8_t *src, *dst[4];
  size_t n;
  int rounds, bad;
};

static void *copy_loop_run(void *arg) {
  struct copy_loop *c = arg;
  for (int r = 0; r < c->rounds; r += 4) {
    for (int j = 0; j < 4; j++) {
      if (bh_copy(c->dst[j], c->src, c->n, 3) < 1) c->bad++;
      for (size_t off = 0; off < c->n; off += MiB) c->dst[j][off] = (uint8_t)(c->src[off] + 1);
    }
    for (int j = 0; j < 4; j++)
      for (size_t off = 0; off < c->n; off += MiB) {
        if (c->dst[j][off] != (uint8_t)(c->src[off] + 1)) c->bad++;
        size_t len = c->n - off - 1 < MiB - 1 ? c->n - off - 1 : MiB - 1;
        if (memcmp(c->dst[j] + off + 1, c->src + off + 1, len) != 0) c->bad++;
      }
  }
  return NULL;
}

TEST_IMPL(shm_copy_helpers_write_nothing_late) {
  struct copy_loop c[2];
  for (int k = 0; k < 2; k++) {
    c[k].n = 2 * MiB + 4096; /* three chunks */
    c[k].rounds = 400;
    c[k].bad = 0;
    c[k].src = malloc(c[k].n);
    ASSERT_NOT_NULL(c[k].src);
    for (size_t i = 0; i < c[k].n; i++) c[k].src[i] = (uint8_t)(i * 7 + k * 101 + (i >> 13));
    for (int j = 0; j < 4; j++) {
      c[k].dst[j] = malloc(c[k].n);
      ASSERT_NOT_NULL(c[k].dst[j]);
    }
  }
  copy_loop_run(&c[0]); /* alone */
  ASSERT_EQ(c[0].bad, 0);
  pthread_t t;
  ASSERT_OK(pthread_create(&t, NULL, copy_loop_run, &c[1])); /* and two at once */
  copy_loop_run(&c[0]);
  ASSERT_OK(pthread_join(t, NULL));
  ASSERT_EQ(c[0].bad, 0);
  ASSERT_EQ(c[1].bad, 0);
  for (int k = 0; k < 2; k++) {
    for (int j = 0; j < 4; j++) free(c[k].dst[j]);
    free(c[k].src);
  }
  return 0;
}

static int count_tasks(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Whether every thread of this process but the calling one blocks SIGINT,
 * SIGTERM and SIGCHLD (/proc/self/task/<tid>/status's SigBlk). */
static int others_block_signals(void) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  int ok = 1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == (int)gettid()) continue;
    char path[300], line[128];
    snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
    FILE *f = fopen(path, "r");
    unsigned long long blk = 0;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "SigBlk: %llx", &blk) == 1) break;
    if (f) fclose(f);
    unsigned long long want = 1ull << (SIGINT - 1) | 1ull << (SIGTERM - 1) | 1ull << (SIGCHLD - 1);
    ok = ok && (blk & want) == want;
  }
  closedir(d);
  return ok;
}

/* The helpers are kept (a second copy starts none) and block the signals
 * meant for the process, and a child forked after they started has none
 * of them: its first split copy starts its own and copies right (without
 * the fork handler it would count its parent's and start none). */
TEST_IMPL(shm_copy_helpers_kept_and_not_inherited) {
  size_t n = 4 * MiB;
  uint8_t *src = malloc(n), *dst = malloc(n);
  ASSERT_NOT_NULL(src);
  ASSERT_NOT_NULL(dst);
  for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 13 + (i >> 11));
  ASSERT_GE(bh_copy(dst, src, n, 2), 1);
  int tasks = count_tasks();
  ASSERT_GE(tasks, 2); /* this thread and a helper, at least */
  ASSERT_GE(bh_copy(dst, src, n, 2), 1);
  ASSERT_EQ(count_tasks(), tasks);
  ASSERT_EQ(memcmp(dst, src, n), 0);
  ASSERT(others_block_signals());
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int ok = count_tasks() == 1;
    memset(dst, 0, n);
    ok = ok && bh_copy(dst, src, n, 2) >= 1 && memcmp(dst, src, n) == 0;
    ok = ok && count_tasks() == 2;
    _exit(ok ? 0 : 1);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(dst);
  free(src);
  return 0;
}

/* bh__range_clean, by PAGEMAP_SCAN and by reading pagemap (a kernel
 * before 6.7): a copy-on-write mapping of a memfd is clean untouched and
 * read, written where one page was written here, clean again once that
 * page is dropped; memory of this process's own (anonymous) is not.  A
 * forked child checks its own pages, not its parent's (the pagemap file
 * is opened per process). */
TEST_IMPL(shm_range_clean_sees_written_pages) {
  size_t n = 32 * MiB; /* past BH__SCAN_SPLIT_MIN: the copy helpers check too */
  int fd = memfd_create("bh-test-clean", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, (off_t)n), 0);
  uint8_t *w = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT(w != MAP_FAILED);
  memset(w, 7, n);
  uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ASSERT(p != MAP_FAILED);
  uint8_t *anon = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT(anon != MAP_FAILED);
  memset(anon, 1, 1 * MiB);
  for (int off = 0; off < 2; off++) {
    bh__range_clean_scan_off(off);
    ASSERT_EQ(bh__range_clean(p, n), 1); /* untouched */
    volatile unsigned sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += p[i];
    ASSERT_EQ(bh__range_clean(p, n), 1); /* read: the file's pages */
    p[21 * MiB + 3] = 9;
    ASSERT_EQ(bh__range_clean(p, n), 0);
    ASSERT_EQ(bh__range_clean(p, 21 * MiB), 1);       /* before the written page */
    ASSERT_EQ(bh__range_clean(p + 21 * MiB + 4096, 11 * MiB - 4096), 1); /* after it */
    ASSERT_EQ(bh__range_clean(p + 21 * MiB + 100, 1), 0);
    ASSERT_EQ(madvise(p, n, MADV_DONTNEED), 0);
    ASSERT_EQ(bh__range_clean(p, n), 1);
    ASSERT_EQ(p[21 * MiB + 3], 7); /* the file's byte again */
    for (size_t at = 0; at < n; at += 4 * MiB + 4096) { /* in each chunk of a split check */
      volatile unsigned again = 0;
      for (size_t i = 0; i < n; i += 4096) again += p[i];
      p[at] = 3;
      ASSERT_EQ(bh__range_clean(p, n), 0);
      ASSERT_EQ(madvise(p, n, MADV_DONTNEED), 0);
      ASSERT_EQ(bh__range_clean(p, n), 1);
    }
    /* Present pages only far into the range (the check starts at them). */
    volatile unsigned tail = p[n - 4096] + p[27 * MiB];
    (void)tail;
    ASSERT_EQ(bh__range_clean(p, n), 1);
    p[29 * MiB + 5] = 4;
    ASSERT_EQ(bh__range_clean(p, n), 0);
    ASSERT_EQ(madvise(p, n, MADV_DONTNEED), 0);
    ASSERT_EQ(bh__range_clean(anon, 1 * MiB), 0);
  }
  bh__range_clean_scan_off(0);
  ASSERT_EQ(bh__range_clean(p, n), 1); /* this process's pagemap open now */
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    p[100] = 1; /* the child's page, not the parent's */
    int ok = bh__range_clean(p, n) == 0;
    ok = ok && madvise(p, n, MADV_DONTNEED) == 0 && bh__range_clean(p, n) == 1;
    _exit(ok ? 0 : 1);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  p[200] = 1;
  ASSERT_EQ(bh__range_clean(p, n), 0); /* the parent's own fd still reads its pages */
  munmap(anon, 1 * MiB);
  munmap(p, n);
  munmap(w, n);
  close(fd);
  return 0;
}
