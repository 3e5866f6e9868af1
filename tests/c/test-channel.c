/*
 * test-channel.c -- frames over a SOCK_SEQPACKET socketpair: the round
 * trip, blocks lent and returned, spilled payloads, deadlines, EOF, and
 * every way a frame can be malformed (written by hand on a raw socket),
 * each refused with its own code, its fds closed, and the channel still
 * usable for the next good frame.
 *
 * Both ends usually live in the test's own process; where a second process
 * matters (another uid, another pid, a real peer that echoes) a forked
 * helper sits on the other end.  Every test checks it ends with the fds it
 * started with.
 */
#include "task.h"
#include "src/core/internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

#define MiB (1024u * 1024u)

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static bh_pool_stats stats_of(bh_channel *c) {
  bh_pool_stats s;
  ASSERT_OK(bh_pool_stats_get(bh_channel_pool(c), &s));
  return s;
}

/* A tensor-ref value for `n` bytes of uint8 at the start of block `b`. */
static bh_buf tensor_value(const bh_block *b, size_t n) {
  bh_tensor_ref t = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 1,
                     .block = bh_block_id(b), .nbytes = n, .shape = {(int64_t)n},
                     .strides = {1}};
  bh_buf v;
  bh_buf_init(&v);
  ASSERT_OK(bh_enc_tensor(&v, &t));
  return v;
}

/* Reads the tensor-ref a frame carries. */
static bh_tensor_ref frame_tensor(const bh_frame *f) {
  bh_reader r;
  bh_item it;
  ASSERT_OK(bh_dec_validate(f->value, f->value_len, 0));
  bh_reader_init(&r, f->value, f->value_len);
  ASSERT_OK(bh_dec_next(&r, &it));
  ASSERT_EQ(it.tag, BH_TAG_TENSOR);
  return it.u.t;
}

/* Whether a frame (or EOF) is waiting, without reading it. */
static int readable(bh_channel *c) {
  struct pollfd pf = {bh_channel_fd(c), POLLIN, 0};
  ASSERT_SYS(poll(&pf, 1, 0));
  return pf.revents != 0;
}

static void wait_exit0(pid_t pid) {
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL("helper %d ended with status 0x%x", (int)pid, st);
}

/* A sealed memfd as bulkhead makes them, for frames written by hand. */
static int make_memfd(size_t size, unsigned seals, int allow_sealing) {
  int fd = memfd_create("test-memfd", MFD_CLOEXEC | (allow_sealing ? MFD_ALLOW_SEALING : 0));
  ASSERT_SYS(fd);
  ASSERT_SYS(ftruncate(fd, (off_t)size));
  if (seals) ASSERT_SYS(fcntl(fd, F_ADD_SEALS, seals));
  return fd;
}

/* ---- basics ---- */

TEST_IMPL(channel_send_recv) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  ASSERT_GT(bh_channel_fd(a), 2);
  bh_buf v;
  bh_buf_init(&v);
  bh_enc_list(&v, 2);
  bh_enc_int(&v, 7);
  bh_enc_str(&v, "x\xc3\xa9", 3);
  ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 0x1122334455667788ull, v.data, v.len, NULL, 0));
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.magic, BH_FRAME_MAGIC);
  ASSERT_EQ(f.h.version, BH_PROTOCOL_VERSION);
  ASSERT_EQ(f.h.kind, BH_KIND_CALL);
  ASSERT_UEQ(f.h.request_id, 0x1122334455667788ull);
  ASSERT_EQ(f.h.flags, 0);
  ASSERT_EQ(f.h.fd_count, 0);
  ASSERT_EQ(f.h.payload_bytes, BH_TEST_SEC + v.len);
  ASSERT_EQ(f.value_len, v.len);
  ASSERT_MEM_EQ(f.value, v.data, v.len);
  ASSERT_EQ(f.sender_pid, getpid());
  bh_channel_frame_done(b, &f);
  ASSERT_NULL(f.value);
  /* The other way, every kind the API lets a caller send. */
  for (uint16_t k = 1; k <= BH_KIND_MAX_; k++) {
    if (k == BH_KIND_BLOCKS) continue; /* consumed by recv, never returned */
    ASSERT_OK(bh_test_send(b, k, k, v.data, v.len, NULL, 0));
    ASSERT_OK(bh_test_recv(a, &f, 5000));
    ASSERT_EQ(f.h.kind, k);
    ASSERT_UEQ(f.h.request_id, k);
  }
  /* An empty value is a frame too (the value is the caller's to judge). */
  ASSERT_OK(bh_test_send(a, BH_KIND_BYE, 0, NULL, 0, NULL, 0));
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.kind, BH_KIND_BYE);
  ASSERT_EQ(f.value_len, 0);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(channel_bad_args) {
  int fds0 = bh_test_fd_count();
  bh_channel_opts o = {.peer_uid = getuid()};
  bh_channel *c = NULL;
  /* The fd is consumed even when opening fails. */
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  ASSERT_RC(bh_channel_open(&c, sv[0], NULL), -EINVAL);
  ASSERT_EQ(fcntl(sv[0], F_GETFD), -1);
  ASSERT_RC(bh_channel_open(NULL, sv[1], &o), -EINVAL);
  ASSERT_EQ(fcntl(sv[1], F_GETFD), -1);
  /* Not a socket: SO_PASSCRED fails, the fd is still consumed. */
  int p[2];
  ASSERT_SYS(pipe2(p, O_CLOEXEC));
  ASSERT_RC(bh_channel_open(&c, p[0], &o), -ENOTSOCK);
  ASSERT_EQ(fcntl(p[0], F_GETFD), -1);
  close(p[1]);
  ASSERT_RC(bh_channel_open(&c, 1, &o), -EINVAL); /* never stdio */
  ASSERT_SYS(fcntl(1, F_GETFD));
  ASSERT_FD_COUNT(fds0);

  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_RC(bh_test_send(a, 0, 0, &nil, 1, NULL, 0), -EINVAL);
  ASSERT_RC(bh_test_send(a, BH_KIND_MAX_ + 1, 0, &nil, 1, NULL, 0), -EINVAL);
  ASSERT_RC(bh_test_send(a, BH_KIND_RESULT, 0, &nil, 1, NULL, 1), -EINVAL);
  ASSERT_RC(bh_channel_send(NULL, NULL), -EINVAL);
  bh_frame f;
  ASSERT_RC(bh_channel_recv(a, NULL, -1), -EINVAL);
  ASSERT_RC(bh_channel_recv(NULL, &f, -1), -EINVAL);
  bh_block *blk;
  ASSERT_RC(bh_channel_peer_block(a, 1, &blk), -BH_EBLOCK);
  ASSERT_RC(bh_channel_block_acquire(a, 0, &blk), -EINVAL);
  /* Nothing was sent by the refused calls. */
  ASSERT(!readable(b));
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- blocks ---- */

TEST_IMPL(channel_block_lend_return_reuse) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  const size_t n = 3 * 4096 + 100;
  bh_block *blk;
  ASSERT_OK(bh_channel_block_acquire(a, n, &blk));
  ASSERT(bh_block_is_own(blk));
  ASSERT_GE(bh_block_size(blk), n);
  uint32_t id = bh_block_id(blk);
  uint8_t *p = bh_block_addr(blk);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + 3);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.own_blocks, 1);
  ASSERT_EQ(s.free_blocks, 0);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.created, 1);

  bh_buf v = tensor_value(blk, n);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, &blk, 1));
  bh_block_unref(blk); /* the loan keeps it */
  s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 1);
  ASSERT_EQ(s.free_blocks, 0);

  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 1); /* the block's memfd, introduced */
  bh_tensor_ref t = frame_tensor(&f);
  ASSERT_UEQ(t.block, id);
  bh_channel_frame_done(b, &f);
  bh_block *pb;
  ASSERT_OK(bh_channel_peer_block(b, id, &pb));
  ASSERT(!bh_block_is_own(pb));
  ASSERT_EQ(bh_block_id(pb), id);
  ASSERT_EQ(bh_block_size(pb), bh_block_size(blk));
  ASSERT_MEM_EQ(bh_block_addr(pb), p, n);
  ASSERT_NE((uintptr_t)bh_block_addr(pb), (uintptr_t)p); /* its own mapping */
  s = stats_of(b);
  ASSERT_EQ(s.peer_blocks, 1);
  ASSERT_EQ(s.own_blocks, 0);
  bh_block_unref(pb);

  /* Any frame back carries the return. */
  ASSERT_OK(bh_test_send_nil(b, 2));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_UEQ(f.h.request_id, 2);
  s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, 1);
  ASSERT_EQ(s.own_blocks, 1);

  /* The second acquire reuses it, and lending it again sends no fd. */
  int fds_before = bh_test_fd_count();
  bh_block *again;
  ASSERT_OK(bh_channel_block_acquire(a, n, &again));
  ASSERT_EQ(bh_block_id(again), id);
  ASSERT_EQ((uintptr_t)again, (uintptr_t)blk);
  s = stats_of(a);
  ASSERT_EQ(s.reused, 1);
  ASSERT_EQ(s.created, 1);
  ASSERT_EQ(s.own_blocks, 1);
  memset(p, 0x5a, n);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 3, v.data, v.len, &again, 1));
  bh_block_unref(again);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 0);
  ASSERT_FD_COUNT(fds_before);
  ASSERT_EQ(stats_of(b).peer_blocks, 1);
  ASSERT_OK(bh_channel_peer_block(b, id, &pb));
  ASSERT_EQ(((uint8_t *)bh_block_addr(pb))[0], 0x5a);
  ASSERT_EQ(((uint8_t *)bh_block_addr(pb))[n - 1], 0x5a);
  bh_block_unref(pb);
  ASSERT_OK(bh_test_send_nil(b, 4));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, 1);

  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* More blocks in one message than one frame may carry fds for: the extra
 * introductions go first in BLOCKS frames, which recv consumes. */
TEST_IMPL(channel_many_blocks) {
  enum { N = 150 };
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *blks[N];
  for (int i = 0; i < N; i++) {
    ASSERT_OK(bh_channel_block_acquire(a, 4096, &blks[i]));
    memset(bh_block_addr(blks[i]), i, 4096);
  }
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 9, &nil, 1, blks, N));
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.kind, BH_KIND_CALL); /* the BLOCKS frames were consumed */
  ASSERT_UEQ(f.h.request_id, 9);
  ASSERT_EQ(stats_of(b).peer_blocks, N);
  for (int i = 0; i < N; i++) {
    bh_block *pb;
    ASSERT_OK(bh_channel_peer_block(b, bh_block_id(blks[i]), &pb));
    ASSERT_EQ(((uint8_t *)bh_block_addr(pb))[4095], (uint8_t)i);
    bh_block_unref(pb);
    bh_block_unref(blks[i]);
  }
  /* b has them: our memfds closed once the frames went; b's mappings
   * keep no fd either. */
  ASSERT_FD_COUNT(fds0 + 2);
  ASSERT_OK(bh_test_send_nil(b, 10));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  /* Returned, they are free; the pool keeps BH__KEEP_FREE_BLOCKS of them
   * (mapped, with no fd), the oldest went. */
  ASSERT_EQ(s.free_blocks, BH__KEEP_FREE_BLOCKS);
  ASSERT_FD_COUNT(fds0 + 2);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A send that fails half-way through lending leaves nothing lent. */
TEST_IMPL(channel_send_rollback) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *own, *other, *pb;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &own));
  ASSERT_OK(bh_channel_block_acquire(b, 4096, &other));
  bh_buf v = tensor_value(other, 8);
  ASSERT_OK(bh_test_send(b, BH_KIND_RESULT, 1, v.data, v.len, &other, 1));
  bh_frame f;
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_OK(bh_channel_peer_block(a, bh_block_id(other), &pb));
  /* A peer block is not ours to lend: refused, and the own block before
   * it in the list is not left lent. */
  bh_block *list[2] = {own, pb};
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_RC(bh_test_send(a, BH_KIND_RESULT, 2, &nil, 1, list, 2), -EINVAL);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT(!readable(b));
  /* Lent for real afterwards, it is introduced (its fd travels). */
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 3, &nil, 1, &own, 1));
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 1);
  ASSERT_EQ(stats_of(a).lent_blocks, 1);
  bh_block_unref(pb);
  bh_block_unref(own);
  bh_block_unref(other);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* With a small pool, returned blocks beyond keep_bytes are destroyed and
 * the peer is told to unmap them. */
TEST_IMPL(channel_retire_reaches_peer) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 1 * MiB);
  bh_block *x[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(bh_channel_block_acquire(a, MiB, &x[i]));
  uint32_t ids[3] = {bh_block_id(x[0]), bh_block_id(x[1]), bh_block_id(x[2])};
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, &nil, 1, x, 3));
  for (int i = 0; i < 3; i++) bh_block_unref(x[i]);
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(stats_of(b).peer_blocks, 3);
  for (int i = 0; i < 3; i++) {
    bh_block *pb;
    ASSERT_OK(bh_channel_peer_block(b, ids[i], &pb));
    bh_block_unref(pb);
  }
  ASSERT_OK(bh_test_send_nil(b, 2));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.own_blocks, 1);
  ASSERT_EQ(s.free_blocks, 1);
  ASSERT_EQ(s.lent_blocks, 0);
  /* The next frame tells b; b unmaps the two retired ones. */
  ASSERT_OK(bh_test_send_nil(a, 3));
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(stats_of(b).peer_blocks, 1);
  int kept = 0;
  for (int i = 0; i < 3; i++) {
    bh_block *pb;
    int rc = bh_channel_peer_block(b, ids[i], &pb);
    if (rc == 0) {
      kept++;
      bh_block_unref(pb);
    } else {
      ASSERT_RC(rc, -BH_EBLOCK);
    }
  }
  ASSERT_EQ(kept, 1);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/*
 * Regression test, bug fixed in (src/core/shm.c bh__pool_lend vs bh__unref_locked): the sender
 * counts one loan per listing of a block in a sent message (b->lent++ per
 * bh_msg.blocks entry), but the receiver queues one return per time its
 * reference count drops to zero.  A block listed twice -- one message
 * carrying the same tensor twice, e.g. a node returning (img, img), which
 * src/python/codec.c encodes by listing the lease's block once per tensor
 * -- is returned once and stays lent forever: never free, never reused,
 * never trimmed.
 */
TEST_IMPL(channel_block_listed_twice_in_one_frame) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &x));
  uint32_t id = bh_block_id(x);
  bh_buf t = tensor_value(x, 16), v;
  bh_buf_init(&v);
  bh_enc_tuple(&v, 2);
  bh_buf_reserve(&v, 2 * t.len);
  memcpy(v.data + v.len, t.data, t.len);
  memcpy(v.data + v.len + t.len, t.data, t.len);
  v.len += 2 * t.len;
  ASSERT_OK(bh_dec_validate(v.data, v.len, 1));
  bh_block *twice[2] = {x, x};
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, twice, 2));
  bh_block_unref(x);
  bh_frame f;
  bh_block *p1, *p2;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 1);
  /* One reference per tensor, as the decoder takes them. */
  ASSERT_OK(bh_channel_peer_block(b, id, &p1));
  ASSERT_OK(bh_channel_peer_block(b, id, &p2));
  bh_block_unref(p1);
  bh_block_unref(p2);
  ASSERT_OK(bh_test_send_nil(b, 2));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, 1);
  bh_buf_free(&t);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A block goes out once until the peer returns it: lending it again in a
 * second frame before the return fails with -EBUSY and changes nothing;
 * the first loan comes back normally. */
TEST_IMPL(channel_block_lent_in_two_frames) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &x));
  uint32_t id = bh_block_id(x);
  bh_buf v = tensor_value(x, 16);
  ASSERT_OK(bh_test_send(a, BH_KIND_PROGRESS, 1, v.data, v.len, &x, 1));
  ASSERT_RC(bh_test_send(a, BH_KIND_RESULT, 2, v.data, v.len, &x, 1), -EBUSY);
  bh_block_unref(x);
  bh_frame f;
  bh_block *p1;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_OK(bh_channel_peer_block(b, id, &p1));
  bh_block_unref(p1);
  ASSERT_OK(bh_test_send_nil(b, 3));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, 1);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/*
 * Regression test, bug fixed in (src/core/shm.c bh__unref_locked + bh__pool_returned): the
 * other side of the same mismatch.  A receiver that takes and drops its
 * reference twice for one loan (bh_channel_peer_block still succeeds for
 * a block already queued for return) queues two returns; the sender's
 * recv then fails the whole (good) frame with -BH_EBLOCK at the second
 * return, and the frame's value is lost.
 */
TEST_IMPL(channel_block_peer_ref_twice) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x, *pb;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &x));
  uint32_t id = bh_block_id(x);
  bh_buf v = tensor_value(x, 16);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, &x, 1));
  bh_block_unref(x);
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  /* e.g. the worker wraps the tensor, drops it, wraps it again */
  ASSERT_OK(bh_channel_peer_block(b, id, &pb));
  bh_block_unref(pb);
  ASSERT_OK(bh_channel_peer_block(b, id, &pb));
  bh_block_unref(pb);
  ASSERT_OK(bh_test_send_nil(b, 2));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_UEQ(f.h.request_id, 2);
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, 1);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- payload sizes ---- */

static void send_bytes_value(bh_channel *from, bh_channel *to, size_t n, int spilled) {
  uint8_t *data = malloc(n);
  ASSERT_NOT_NULL(data);
  for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i ^ (i >> 8) ^ (i >> 16));
  bh_buf v;
  bh_buf_init(&v);
  ASSERT_OK(bh_enc_bytes(&v, data, n));
  ASSERT_OK(bh_test_send(from, BH_KIND_RESULT, n, v.data, v.len, NULL, 0));
  bh_frame f;
  ASSERT_OK(bh_test_recv(to, &f, 10000));
  ASSERT_UEQ(f.h.request_id, n);
  ASSERT_EQ(f.h.payload_bytes, BH_TEST_SEC + v.len);
  ASSERT_EQ(!!(f.h.flags & BH_FRAME_SPILLED), spilled);
  ASSERT_EQ(f.h.fd_count, spilled ? 1 : 0);
  ASSERT_EQ(f.value_len, v.len);
  ASSERT_OK(bh_dec_validate(f.value, f.value_len, 0));
  ASSERT_MEM_EQ(f.value + 5, data, n);
  bh_channel_frame_done(to, &f);
  bh_buf_free(&v);
  free(data);
}

TEST_IMPL(channel_spill_large) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  /* section (BH_TEST_SEC) + value (5 + n) against BH_FRAME_INLINE_MAX */
  size_t edge = BH_FRAME_INLINE_MAX - BH_TEST_SEC - 5;
  send_bytes_value(a, b, edge, 0);
  send_bytes_value(a, b, edge + 1, 1);
  send_bytes_value(a, b, 5 * MiB, 1);
  send_bytes_value(b, a, 5 * MiB + 3, 1);
  ASSERT_FD_COUNT(fds0 + 2); /* spill fds closed, spill mappings gone */
  /* A spilled frame with blocks: intro fds first, the spill fd last. */
  bh_block *x;
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &x));
  memset(bh_block_addr(x), 0xab, 8192);
  size_t n = 200 * 1024;
  uint8_t *big = calloc(1, n);
  ASSERT_NOT_NULL(big);
  bh_buf v;
  bh_buf_init(&v);
  bh_enc_list(&v, 2);
  bh_tensor_ref t = {.dtype = BH_DT_UINT8, .ndim = 1, .block = bh_block_id(x), .nbytes = 8192,
                     .shape = {8192}, .strides = {1}};
  bh_enc_tensor(&v, &t);
  bh_enc_bytes(&v, big, n);
  ASSERT_OK(v.err);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 77, v.data, v.len, &x, 1));
  bh_block_unref(x);
  bh_frame f;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 2);
  ASSERT(f.h.flags & BH_FRAME_SPILLED);
  ASSERT_EQ(f.value_len, v.len);
  ASSERT_MEM_EQ(f.value, v.data, v.len);
  bh_block *pb;
  ASSERT_OK(bh_channel_peer_block(b, t.block, &pb));
  ASSERT_EQ(((uint8_t *)bh_block_addr(pb))[8191], 0xab);
  bh_block_unref(pb);
  bh_channel_frame_done(b, &f);
  free(big);
  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- time and EOF ---- */

TEST_IMPL(channel_deadline) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_frame f;
  int64_t start = bh_now_ns(), deadline = start + 50 * 1000000;
  ASSERT_RC(bh_channel_recv(a, &f, deadline), -ETIMEDOUT);
  int64_t end = bh_now_ns();
  if (end < deadline)
    FAIL("recv returned ETIMEDOUT %.3f ms before its deadline", (double)(deadline - end) / 1e6);
  /* A deadline already past: ETIMEDOUT at once. */
  ASSERT_RC(bh_channel_recv(a, &f, bh_now_ns() - 1), -ETIMEDOUT);
  /* ... but a frame that is there is read with a deadline already past
   * (serve(0)), whichever way the wait goes: the spin, the peer's pidfd,
   * SO_RCVTIMEO.  It used to be left unread, so a reader polling the
   * socket saw it readable and spun forever (issue 16). */
  bh_channel_opts ways[] = {{.peer_uid = getuid(), .spin_ns = 1000000},
                            {.peer_uid = getuid(), .peer_pid = getpid(), .spin_ns = -1},
                            {.peer_uid = getuid(), .spin_ns = -1}};
  for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
    int sv[2];
    bh_channel *x, *y;
    ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
    ASSERT_OK(bh_channel_open(&x, sv[0], &ways[i]));
    ASSERT_OK(bh_channel_open(&y, sv[1], &ways[i]));
    ASSERT_OK(bh_test_send_nil(y, 4));
    ASSERT_OK(bh_channel_recv(x, &f, bh_now_ns() - 1));
    ASSERT_UEQ(f.h.request_id, 4);
    ASSERT_RC(bh_channel_recv(x, &f, bh_now_ns() - 1), -ETIMEDOUT);
    bh_channel_close(x);
    bh_channel_close(y);
  }
  /* A frame that is there is returned before the deadline. */
  ASSERT_OK(bh_test_send_nil(b, 5));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_UEQ(f.h.request_id, 5);
  /* And after a timeout the channel still works, deadline or none. */
  ASSERT_OK(bh_test_send_nil(b, 6));
  ASSERT_OK(bh_test_recv(a, &f, -1));
  ASSERT_UEQ(f.h.request_id, 6);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/*
 * Regression test, bug fixed in (src/core/channel.c bh__arm_timeout): it keeps any SO_RCVTIMEO
 * already set that is shorter than the time now left
 * (`c->rcvtimeo_ns > 0 && c->rcvtimeo_ns <= want` returns early), and
 * bh_channel_recv turns the resulting EAGAIN into -ETIMEDOUT without
 * looking at the deadline.  So after one recv with a short deadline, a
 * recv with a longer one times out early, at the short one.
 */
TEST_IMPL(channel_deadline_after_shorter) {
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_frame f;
  ASSERT_RC(bh_test_recv(a, &f, 20), -ETIMEDOUT);
  int64_t deadline = bh_now_ns() + 300 * 1000000;
  ASSERT_RC(bh_channel_recv(a, &f, deadline), -ETIMEDOUT);
  int64_t end = bh_now_ns();
  if (end < deadline)
    FAIL("recv returned ETIMEDOUT %.1f ms before its deadline", (double)(deadline - end) / 1e6);
  bh_channel_close(a);
  bh_channel_close(b);
  return 0;
}

static void on_alarm(int sig) { (void)sig; }

/* A signal interrupts a blocking recv with -EINTR; the next recv works. */
TEST_IMPL(channel_recv_eintr) {
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm; /* no SA_RESTART */
  ASSERT_SYS(sigaction(SIGALRM, &sa, NULL));
  /* Repeating, so a signal that lands before recv blocks is not the
   * only one. */
  struct itimerval it = {.it_value = {0, 30000}, .it_interval = {0, 30000}}, off = {{0, 0}, {0, 0}};
  ASSERT_SYS(setitimer(ITIMER_REAL, &it, NULL));
  bh_frame f;
  ASSERT_RC(bh_test_recv(a, &f, -1), -EINTR);
  ASSERT_RC(bh_test_recv(a, &f, 5000), -EINTR);
  ASSERT_SYS(setitimer(ITIMER_REAL, &off, NULL));
  ASSERT_OK(bh_test_send_nil(b, 1));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_UEQ(f.h.request_id, 1);
  bh_channel_close(a);
  bh_channel_close(b);
  return 0;
}

TEST_IMPL(channel_eof) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  ASSERT_OK(bh_test_send_nil(b, 1));
  bh_channel_close(b);
  bh_frame f;
  /* What was sent before the close still arrives, then EOF, at once and
   * every time after. */
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  int64_t start = bh_test_now_ms();
  ASSERT_RC(bh_test_recv(a, &f, 5000), -BH_EEOF);
  ASSERT_RC(bh_test_recv(a, &f, -1), -BH_EEOF);
  ASSERT_LT(bh_test_now_ms() - start, 2000);
  int rc = bh_test_send_nil(a, 2);
  if (rc != -BH_EEOF) ASSERT_RC(rc, -EPIPE);
  bh_channel_close(a);

  /* A peer process that dies. */
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(sv[0]);
    bh_test_sleep_ms(50);
    _exit(0);
  }
  close(sv[1]);
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = pid};
  ASSERT_OK(bh_channel_open(&a, sv[0], &o));
  ASSERT_RC(bh_test_recv(a, &f, 5000), -BH_EEOF);
  wait_exit0(pid);
  bh_channel_close(a);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- malformed frames ---- */

TEST_IMPL(channel_header_check) {
  bh_frame_header h = {.magic = BH_FRAME_MAGIC, .version = BH_PROTOCOL_VERSION,
                       .kind = BH_KIND_CALL, .payload_bytes = 13};
  ASSERT_OK(bh_frame_header_check(&h));
  bh_frame_header x = h;
  x.magic = 0x4b484c43;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EMAGIC);
  x = h, x.version = 0;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EVERSION);
  x = h, x.version = BH_PROTOCOL_VERSION + 1;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EVERSION);
  x = h, x.kind = 0;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EKIND);
  x = h, x.kind = BH_KIND_MAX_ + 1;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EKIND);
  x = h, x.flags = 2;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EHEADER);
  x = h, x.flags = BH_FRAME_SPILLED;
  ASSERT_OK(bh_frame_header_check(&x));
  x = h, x.cpu = 0x80000000u;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EHEADER);
  x = h, x.cpu = BH_FRAME_CPU_MAX + 1;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EHEADER);
  x = h, x.cpu = BH_FRAME_CPU_MAX;
  ASSERT_OK(bh_frame_header_check(&x));
  x = h, x.fd_count = BH_FRAME_FDS_MAX + 1;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EFDCOUNT);
  x = h, x.fd_count = BH_FRAME_FDS_MAX;
  ASSERT_OK(bh_frame_header_check(&x));
  x = h, x.payload_bytes = BH_FRAME_PAYLOAD_MAX + 1;
  ASSERT_RC(bh_frame_header_check(&x), -BH_E2BIG);
  /* The first problem wins: magic before version before kind. */
  x = h, x.magic = 0, x.version = 9, x.kind = 0;
  ASSERT_RC(bh_frame_header_check(&x), -BH_EMAGIC);
  return 0;
}

/* Which SO_RCVTIMEO settings a wait keeps without a setsockopt. */
TEST_IMPL(channel_rcvtimeo_keep) {
  const int64_t MS = 1000000, S = 1000 * MS;
  ASSERT(bh__rcvtimeo_keep(0, 0));            /* forever, set to forever */
  ASSERT(!bh__rcvtimeo_keep(30 * S, 0));      /* forever needs the setting cleared */
  ASSERT(!bh__rcvtimeo_keep(0, 30 * S));      /* a deadline needs a setting */
  ASSERT(bh__rcvtimeo_keep(30 * S, 30 * S));
  /* The idle loop re-arms ~30 s after every frame: what is left of the
   * last setting is a little shorter or longer, and kept. */
  ASSERT(bh__rcvtimeo_keep(30 * S - 5 * MS, 30 * S));
  ASSERT(bh__rcvtimeo_keep(30 * S + MS / 2, 30 * S));
  /* At most 1 ms late; at most 1% + 1 ms early. */
  ASSERT(!bh__rcvtimeo_keep(30 * S + 2 * MS, 30 * S));
  ASSERT(!bh__rcvtimeo_keep(29 * S, 30 * S));
  /* A 1 us setting left by an almost-expired wait must not serve a 60 s
   * wait: that would be 60 million early wake-ups. */
  ASSERT(!bh__rcvtimeo_keep(1000, 60 * S));
  ASSERT(!bh__rcvtimeo_keep(MS, 60 * S));
  return 0;
}

/* Header fields that lie, each refused, each followed by a good frame. */
TEST_IMPL(channel_bad_frames) {
  int fds0 = bh_test_fd_count();
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  uint8_t payload[64] = {0}; /* empty block section + nil */
  const uint32_t P = BH_TEST_SEC + 1;
  struct {
    const char *what;
    uint32_t magic;
    uint16_t version, kind;
    uint32_t flags, payload_bytes, fd_count, cpu;
    size_t send_len; /* bytes after the header actually sent */
    int want;
  } cases[] = {
      {"bad magic", 0xdeadbeef, BH_PROTOCOL_VERSION, 3, 0, P, 0, 0, P, -BH_EMAGIC},
      {"magic byte-swapped", 0x424c484b, BH_PROTOCOL_VERSION, 3, 0, P, 0, 0, P, -BH_EMAGIC},
      {"version 99", BH_FRAME_MAGIC, 99, 3, 0, P, 0, 0, P, -BH_EVERSION},
      {"version 0", BH_FRAME_MAGIC, 0, 3, 0, P, 0, 0, P, -BH_EVERSION},
      {"kind 0", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 0, 0, P, 0, 0, P, -BH_EKIND},
      {"kind 200", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 200, 0, P, 0, 0, P, -BH_EKIND},
      {"kind 12", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 12, 0, P, 0, 0, P, -BH_EKIND},
      {"cpu hint past the limit", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, P, 0, BH_FRAME_CPU_MAX + 1, P, -BH_EHEADER},
      {"version 1 (before the cpu hint)", BH_FRAME_MAGIC, 1, 3, 0, P, 0, 0, P, -BH_EVERSION},
      {"unknown flag", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 4, P, 0, 0, P, -BH_EHEADER},
      {"payload_bytes one more than sent", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, P + 1, 0, 0, P, -BH_ESHORT},
      {"payload_bytes one less than sent", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, P - 1, 0, 0, P, -BH_ESHORT},
      {"payload_bytes 0 with a payload", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, 0, 0, 0, P, -BH_ESHORT},
      {"payload_bytes past the limit", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, BH_FRAME_PAYLOAD_MAX + 1, 0, 0, P, -BH_E2BIG},
      {"fd_count past the limit", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, P, 65, 0, P, -BH_EFDCOUNT},
      {"payload too short for the block section", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, 8, 0, 0, 8, -BH_EBLOCKSEC},
      {"no payload at all", BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, 0, 0, 0, 0, -BH_EBLOCKSEC},
  };
  uint8_t hdr[32];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    payload[BH_TEST_SEC] = BH_TAG_NIL;
    bh_test_header(hdr, cases[k].magic, cases[k].version, cases[k].kind, 100 + k,
                   cases[k].flags, cases[k].payload_bytes, cases[k].fd_count,
                   cases[k].cpu);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, cases[k].send_len, NULL, 0),
              32 + cases[k].send_len);
    bh_frame f;
    ASSERT_RC(bh_test_recv(c, &f, 5000), cases[k].want);
    bh_test_raw_good(raw, k);
    bh_test_expect_good(c, k);
  }
  /* Shorter than a header: 1, 10, 31 bytes. */
  static const size_t shorts[] = {1, 10, 31};
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, 0, 13, 0, 0);
  for (size_t k = 0; k < 3; k++) {
    ASSERT_EQ(bh_test_raw_send(raw, hdr, shorts[k], NULL, 0, NULL, 0), shorts[k]);
    bh_frame f;
    ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_ESHORT);
    bh_test_raw_good(raw, 200 + k);
    bh_test_expect_good(c, 200 + k);
  }
  /* Larger than a frame may be inline: truncated by the kernel, refused. */
  size_t big = BH_FRAME_INLINE_MAX + 4096;
  uint8_t *junk = calloc(1, big);
  ASSERT_NOT_NULL(junk);
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, 3, 0, 0, (uint32_t)big, 0, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, junk, big, NULL, 0), 32 + big);
  bh_frame f;
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_E2BIG);
  free(junk);
  bh_test_raw_good(raw, 300);
  bh_test_expect_good(c, 300);
  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A sparse sealed memfd of `size` bytes, introduced by the raw peer as
 * block `id` on a RESULT frame (request `req`). */
static void send_sparse_intro(int raw, uint32_t id, uint64_t size, uint64_t req) {
  int mfd = memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_SYS(mfd);
  ASSERT_SYS(ftruncate(mfd, (off_t)size));
  ASSERT_SYS(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW));
  uint8_t payload[BH_TEST_SEC + 12 + 1] = {0};
  payload[0] = 1; /* n_intro */
  memcpy(payload + BH_TEST_SEC, &id, 4);
  memcpy(payload + BH_TEST_SEC + 4, &size, 8);
  payload[BH_TEST_SEC + 12] = BH_TAG_NIL;
  uint8_t hdr[32];
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, req, 0, sizeof payload, 1, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, sizeof payload, &mfd, 1), 32 + (ssize_t)sizeof payload);
  close(mfd);
}

/* This process's resident bytes (/proc/self/statm). */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "re");
  ASSERT_NOT_NULL(f);
  unsigned long long size = 0, resident = 0;
  ASSERT_EQ(fscanf(f, "%llu %llu", &size, &resident), 2);
  fclose(f);
  return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* A peer declares its blocks' sizes: a sparse 256 MiB block costs this
 * side nothing until read (no MAP_POPULATE), and one larger than the
 * machine's RAM is refused with BH_EPEERMEM, the channel usable after. */
TEST_IMPL(channel_peer_blocks_are_bounded_and_lazy) {
  int fds0 = bh_test_fd_count();
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  uint64_t before = rss_bytes();
  send_sparse_intro(raw, 1, 256ull << 20, 1);
  bh_frame f;
  ASSERT_OK(bh_test_recv(c, &f, 5000));
  uint64_t after = rss_bytes();
  if (after > before + (64ull << 20))
    FAIL("adopting a sparse 256 MiB block made RSS grow by %llu MiB",
         (unsigned long long)((after - before) >> 20));
  bh_pool_stats st;
  ASSERT_OK(bh_pool_stats_get(bh_channel_pool(c), &st));
  ASSERT_EQ(st.peer_blocks, 1);
  uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  send_sparse_intro(raw, 2, ram + (1ull << 30), 2);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EPEERMEM);
  ASSERT_OK(bh_pool_stats_get(bh_channel_pool(c), &st));
  ASSERT_EQ(st.peer_blocks, 1);
  bh_test_raw_good(raw, 3);
  bh_test_expect_good(c, 3);
  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A block section whose notes name nothing we know. */
TEST_IMPL(channel_bad_block_section) {
  int fds0 = bh_test_fd_count();
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  struct {
    const char *what;
    uint32_t n_intro, n_ret, n_retire;
    uint32_t words; /* u32 entries after the counts that are sent */
    int want;
  } cases[] = {
      {"return of an id never lent", 0, 1, 0, 1, -BH_EBLOCK},
      {"retire of an id never introduced", 0, 0, 1, 1, -BH_EBLOCK},
      {"more returns than the limit", 0, 5000, 0, 0, -BH_EBLOCKSEC},
      {"more retires than the limit", 0, 0, 5000, 0, -BH_EBLOCKSEC},
      {"more intros than fds could carry", 65, 0, 0, 0, -BH_EBLOCKSEC},
      {"notes past the payload's end", 0, 3, 0, 1, -BH_EBLOCKSEC},
      {"an intro without its fd", 1, 0, 0, 3, -BH_EFDCOUNT},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    uint8_t payload[64] = {0};
    put_u32(payload, cases[k].n_intro);
    put_u32(payload + 4, cases[k].n_ret);
    put_u32(payload + 8, cases[k].n_retire);
    for (uint32_t i = 0; i < cases[k].words; i++) put_u32(payload + BH_TEST_SEC + 4 * i, 4242);
    size_t len = BH_TEST_SEC + 4 * cases[k].words;
    payload[len++] = BH_TAG_NIL;
    uint8_t hdr[32];
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, k, 0, (uint32_t)len, 0, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, len, NULL, 0), 32 + len);
    bh_frame f;
    ASSERT_RC(bh_test_recv(c, &f, 5000), cases[k].want);
    bh_test_raw_good(raw, k);
    bh_test_expect_good(c, k);
  }
  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Frames whose fds do not match what the header and section say: refused,
 * and every fd that came with them closed. */
TEST_IMPL(channel_bad_fds) {
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  int fds0 = bh_test_fd_count();
  uint8_t hdr[32], payload[64] = {0};
  bh_frame f;
  const uint32_t P = BH_TEST_SEC + 1;
  payload[BH_TEST_SEC] = BH_TAG_NIL;

  /* Header says 1, no fds. */
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P, 1, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, P, NULL, 0), 32 + P);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EFDCOUNT);
  bh_test_raw_good(raw, 1);
  bh_test_expect_good(c, 1);

  /* fds attached, header says 0. */
  int p[2];
  ASSERT_SYS(pipe2(p, O_CLOEXEC));
  int three[3] = {p[0], p[1], p[0]};
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P, 0, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, P, three, 1), 32 + P);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, P, three, 3), 32 + P);
  close(p[0]);
  close(p[1]);
  ASSERT_FD_COUNT(fds0);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EFDCOUNT);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EFDCOUNT);
  ASSERT_FD_COUNT(fds0);
  bh_test_raw_good(raw, 2);
  bh_test_expect_good(c, 2);

  /* Header and fds agree (2) but the section introduces none. */
  int m1 = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW, 1);
  int two[2] = {m1, m1};
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P, 2, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, P, two, 2), 32 + P);
  close(m1);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EFDCOUNT);
  ASSERT_FD_COUNT(fds0);
  bh_test_raw_good(raw, 3);
  bh_test_expect_good(c, 3);

  /* More fds than a frame may carry: the kernel truncates the control
   * data, the ones that did arrive are closed. */
  int many[100];
  ASSERT_SYS(pipe2(p, O_CLOEXEC));
  for (int i = 0; i < 100; i++) many[i] = p[i & 1];
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P, 64, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, P, many, 100), 32 + P);
  close(p[0]);
  close(p[1]);
  int rc = bh_test_recv(c, &f, 5000);
  if (rc != -BH_EFDCOUNT) ASSERT_RC(rc, -BH_ECTRUNC);
  ASSERT_FD_COUNT(fds0);
  bh_test_raw_good(raw, 4);
  bh_test_expect_good(c, 4);

  /* Intros whose fds are not sealed memfds (a pipe; a memfd without the
   * shrink seal; one smaller than declared): refused, closed. */
  struct {
    const char *what;
    int kind; /* 0 pipe, 1 unsealed, 2 unsealable, 3 too small, 4 size 0 */
    int want;
  } intros[] = {{"pipe", 0, -BH_ESEALS},
                {"unsealed memfd", 1, -BH_ESEALS},
                {"memfd without sealing", 2, -BH_ESEALS},
                {"sealed memfd smaller than declared", 3, -BH_ESEALS},
                {"declared size 0", 4, -BH_EBLOCKSEC}};
  for (size_t k = 0; k < sizeof intros / sizeof intros[0]; k++) {
    fprintf(stderr, "intro case: %s\n", intros[k].what);
    int fd, other = -1;
    switch (intros[k].kind) {
    case 0:
      ASSERT_SYS(pipe2(p, O_CLOEXEC));
      fd = p[0], other = p[1];
      break;
    case 1: fd = make_memfd(8192, 0, 1); break;
    case 2: fd = make_memfd(8192, 0, 0); break;
    default: fd = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW, 1); break;
    }
    uint8_t sec[32] = {0};
    put_u32(sec, 1);
    put_u32(sec + BH_TEST_SEC, 50 + (uint32_t)k);
    put_u64(sec + BH_TEST_SEC + 4, intros[k].kind == 4 ? 0 : 8192);
    sec[BH_TEST_SEC + 12] = BH_TAG_NIL;
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P + 12, 1, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, sec, P + 12, &fd, 1), 32 + P + 12);
    close(fd);
    if (other >= 0) close(other);
    ASSERT_RC(bh_test_recv(c, &f, 5000), intros[k].want);
    ASSERT_FD_COUNT(fds0);
    bh_block *blk;
    ASSERT_RC(bh_channel_peer_block(c, 50 + (uint32_t)k, &blk), -BH_EBLOCK);
    bh_test_raw_good(raw, 10 + k);
    bh_test_expect_good(c, 10 + k);
  }

  /* A proper intro by hand is adopted; the same id again is refused. */
  for (int round = 0; round < 2; round++) {
    int fd = make_memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW, 1);
    ASSERT_EQ(pwrite(fd, "hand", 4, 0), 4);
    uint8_t sec[32] = {0};
    put_u32(sec, 1);
    put_u32(sec + BH_TEST_SEC, 99);
    put_u64(sec + BH_TEST_SEC + 4, 8192);
    sec[BH_TEST_SEC + 12] = BH_TAG_NIL;
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, P + 12, 1, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, sec, P + 12, &fd, 1), 32 + P + 12);
    close(fd);
    if (round == 0) {
      ASSERT_OK(bh_test_recv(c, &f, 5000));
      bh_block *blk;
      ASSERT_OK(bh_channel_peer_block(c, 99, &blk));
      ASSERT_MEM_EQ(bh_block_addr(blk), "hand", 4);
      bh_block_unref(blk);
    } else {
      ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EBLOCK);
    }
    ASSERT_FD_COUNT(fds0);
  }
  bh_test_raw_good(raw, 20);
  bh_test_expect_good(c, 20);

  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0 - 2);
  return 0;
}

/* A spilled payload must come in a memfd sealed against writes and
 * shrinking, at least as long as the header says. */
TEST_IMPL(channel_bad_spill) {
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  int fds0 = bh_test_fd_count();
  uint8_t hdr[32], payload[BH_TEST_SEC + 1] = {0};
  payload[BH_TEST_SEC] = BH_TAG_NIL;
  bh_frame f;
  struct {
    const char *what;
    int kind;
    int want;
  } cases[] = {
      {"a pipe", 0, -BH_ESEALS},
      {"memfd without seals", 1, -BH_ESEALS},
      {"memfd that cannot be sealed", 2, -BH_ESEALS},
      {"memfd sealed against shrinking but still writable", 3, -BH_ESEALS},
      {"sealed memfd shorter than payload_bytes", 4, -BH_ESEALS},
      {"the right memfd", 5, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    int fd, other = -1, p[2];
    uint32_t declared = sizeof payload;
    switch (cases[k].kind) {
    case 0:
      ASSERT_SYS(pipe2(p, O_CLOEXEC));
      ASSERT_EQ(write(p[1], payload, sizeof payload), (ssize_t)sizeof payload);
      fd = p[0], other = p[1];
      break;
    case 1: fd = make_memfd(sizeof payload, 0, 1); break;
    case 2: fd = make_memfd(sizeof payload, 0, 0); break;
    case 3: fd = make_memfd(sizeof payload, F_SEAL_SHRINK | F_SEAL_GROW, 1); break;
    case 4:
      fd = make_memfd(sizeof payload, 0, 1);
      declared = 4096;
      break;
    default: fd = make_memfd(sizeof payload, 0, 1); break;
    }
    if (cases[k].kind != 0) {
      ASSERT_EQ(pwrite(fd, payload, sizeof payload, 0), (ssize_t)sizeof payload);
      if (cases[k].kind >= 4)
        ASSERT_SYS(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE));
    }
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 7, BH_FRAME_SPILLED, declared, 1, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, NULL, 0, &fd, 1), 32);
    close(fd);
    if (other >= 0) close(other);
    int rc = bh_test_recv(c, &f, 5000);
    ASSERT_RC(rc, cases[k].want);
    if (rc == 0) {
      ASSERT_EQ(f.value_len, 1);
      ASSERT_EQ(f.value[0], BH_TAG_NIL);
      bh_channel_frame_done(c, &f);
    }
    ASSERT_FD_COUNT(fds0);
    bh_test_raw_good(raw, k);
    bh_test_expect_good(c, k);
  }
  /* SPILLED but no fd; SPILLED with inline bytes as well. */
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, BH_FRAME_SPILLED, 13, 0, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, NULL, 0, NULL, 0), 32);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_ESHORT);
  int fd = make_memfd(sizeof payload, 0, 1);
  ASSERT_EQ(pwrite(fd, payload, sizeof payload, 0), (ssize_t)sizeof payload);
  ASSERT_SYS(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE));
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, BH_FRAME_SPILLED, 13, 1, 0);
  ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, 13, &fd, 1), 45);
  close(fd);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_ESHORT);
  ASSERT_FD_COUNT(fds0);
  bh_test_raw_good(raw, 99);
  bh_test_expect_good(c, 99);
  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0 - 2);
  return 0;
}

/* ---- credentials ---- */

TEST_IMPL(channel_peer_uid) {
  if (getuid() != 0) {
    fprintf(stderr, "skip: setuid to another user needs root\n");
    return TEST_SKIP;
  }
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  int fds0 = bh_test_fd_count();
  /* A helper as user 65534 sends a valid frame lending a block. */
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    if (setgid(65534) < 0 || setuid(65534) < 0) _exit(10);
    bh_channel_opts o = {.peer_uid = 0};
    bh_channel *h;
    bh_block *blk;
    if (bh_channel_open(&h, raw, &o)) _exit(11);
    if (bh_channel_block_acquire(h, 4096, &blk)) _exit(12);
    static const uint8_t nil = BH_TAG_NIL;
    if (bh_test_send(h, BH_KIND_HELLO, 1, &nil, 1, &blk, 1)) _exit(13);
    _exit(0);
  }
  wait_exit0(pid);
  bh_frame f;
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EPEERCRED);
  ASSERT_FD_COUNT(fds0); /* the block's fd did not stay */
  ASSERT_EQ(stats_of(c).peer_blocks, 0);
  bh_test_raw_good(raw, 1);
  bh_test_expect_good(c, 1);
  close(raw);
  bh_channel_close(c);
  return 0;
}

TEST_IMPL(channel_peer_pid) {
  int fds0 = bh_test_fd_count();
  int sv[2], go[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  ASSERT_SYS(pipe2(go, O_CLOEXEC));
  /* The helper sends a good frame when told to. */
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    char x;
    close(go[1]);
    while (read(go[0], &x, 1) == 1) bh_test_raw_good(sv[1], (uint64_t)x);
    _exit(0);
  }
  close(go[0]);
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = pid};
  bh_channel *c;
  ASSERT_OK(bh_channel_open(&c, sv[0], &o));
  bh_frame f;
  /* From us, not the expected pid: refused. */
  bh_test_raw_good(sv[1], 1);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EPEERCRED);
  /* From the helper: accepted, with its pid. */
  ASSERT_EQ(write(go[1], "\x02", 1), 1);
  ASSERT_OK(bh_test_recv(c, &f, 5000));
  ASSERT_UEQ(f.h.request_id, 2);
  ASSERT_EQ(f.sender_pid, pid);
  /* Once the expected pid is ours, ours pass and the helper's do not. */
  bh_channel_set_peer_pid(c, getpid());
  ASSERT_EQ(write(go[1], "\x03", 1), 1);
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EPEERCRED);
  bh_test_raw_good(sv[1], 4);
  bh_test_expect_good(c, 4);
  close(go[1]);
  wait_exit0(pid);
  close(sv[1]);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- a real peer process ---- */

/* The helper: for each CALL whose value is a uint8 tensor in a block,
 * answers RESULT with a tensor in one of its own blocks holding each byte
 * plus one; exits on BYE. */
static int echo_peer(int fd) {
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = getppid()};
  bh_channel *c;
  if (bh_channel_open(&c, fd, &o)) return 20;
  for (;;) {
    bh_frame f;
    int rc = bh_test_recv(c, &f, 10000);
    if (rc) return 21;
    if (f.h.kind == BH_KIND_BYE) break;
    if (f.h.kind != BH_KIND_CALL) return 22;
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, f.value, f.value_len);
    if (bh_dec_next(&r, &it) || it.tag != BH_TAG_TENSOR) return 23;
    bh_tensor_ref t = it.u.t;
    bh_block *in, *out;
    if (bh_channel_peer_block(c, t.block, &in)) return 24;
    if (bh_channel_block_acquire(c, t.nbytes, &out)) return 25;
    const uint8_t *src = (const uint8_t *)bh_block_addr(in) + t.offset;
    uint8_t *dst = bh_block_addr(out);
    for (uint64_t i = 0; i < t.nbytes; i++) dst[i] = (uint8_t)(src[i] + 1);
    bh_block_unref(in);
    t.block = bh_block_id(out);
    t.offset = 0;
    bh_buf v;
    bh_buf_init(&v);
    bh_enc_tensor(&v, &t);
    rc = bh_test_send(c, BH_KIND_RESULT, f.h.request_id, v.data, v.len, &out, 1);
    bh_block_unref(out);
    bh_buf_free(&v);
    if (rc) return 26;
  }
  bh_channel_close(c);
  return 0;
}

/* The peer dies while a process it forked still holds its end of the
 * socket (a pack's helper inheriting fd 3): no EOF ever comes, yet a wait
 * with no deadline ends with -BH_EEOF once the peer is gone; what it sent
 * before dying is still received first. */
TEST_IMPL(channel_peer_death_hidden_by_a_forked_child) {
  int fds0 = bh_test_fd_count();
  int sv[2], ready[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(sv[0]);
    close(ready[0]);
    pid_t helper = fork();
    if (helper == 0) { /* keeps the peer's end open, outliving the peer */
      close(ready[1]);
      sleep(30);
      _exit(0);
    }
    bh_channel_opts po = {.peer_uid = getuid()};
    bh_channel *pc;
    if (helper < 0 || bh_channel_open(&pc, sv[1], &po) < 0) _exit(1);
    static const uint8_t nil = BH_TAG_NIL;
    if (bh_test_send(pc, BH_KIND_RESULT, 7, &nil, 1, NULL, 0) < 0) _exit(1);
    char pid_s[16];
    int n = snprintf(pid_s, sizeof pid_s, "%d", (int)helper);
    if (write(ready[1], pid_s, (size_t)n) != n) _exit(1);
    _exit(0); /* the helper still holds the socket */
  }
  close(sv[1]);
  close(ready[1]);
  char pid_s[16] = {0};
  ASSERT_GT(read(ready[0], pid_s, sizeof pid_s - 1), 0);
  close(ready[0]);
  pid_t helper = (pid_t)atoi(pid_s);
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = pid};
  bh_channel *c;
  ASSERT_OK(bh_channel_open(&c, sv[0], &o));
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid); /* dead and reaped: only the helper holds the end */
  bh_frame f;
  ASSERT_OK(bh_channel_recv(c, &f, -1)); /* its last words come first */
  ASSERT_UEQ(f.h.request_id, 7);
  int64_t t0 = bh_now_ns();
  ASSERT_EQ(bh_channel_recv(c, &f, bh_now_ns() + 10ll * 1000000000), -BH_EEOF);
  ASSERT_LT(bh_now_ns() - t0, 5ll * 1000000000); /* at once, not at the deadline */
  bh_channel_close(c);
  kill(helper, SIGKILL);
  (void)waitpid(helper, NULL, 0); /* ours when the runner made us a subreaper */
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Refuses poll() and ppoll() in this process from now on with ENOTSUP
 * (a seccomp filter); 0, or -errno where seccomp is not to be had.  No
 * arch check: this process makes only native syscalls. */
static int refuse_poll(void) {
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef __NR_poll
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_poll, 1, 0),
#else
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ppoll, 1, 0),
#endif
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ppoll, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOTSUP),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -errno;
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) return -errno;
  return 0;
}

/* A wait that also watches the peer's pidfd reads a frame with recvmsg
 * alone, no poll() beside it, while the slice lasts: a poll before every
 * recvmsg was one more syscall per frame, 1.3 us of a 10 us round trip on
 * one CPU (issue 40).  A child receives with poll and ppoll refused; a
 * wait that outlasts the slice does poll (the peer's death hidden by a
 * forked child is still seen), and there the refusal shows. */
TEST_IMPL(channel_pidfd_wait_reads_without_poll) {
  int fds0 = bh_test_fd_count();
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    /* No spin, so each receive waits: x watches our own pidfd. */
    bh_channel_opts ox = {.peer_uid = getuid(), .peer_pid = getpid(), .spin_ns = -1};
    bh_channel_opts oy = {.peer_uid = getuid(), .spin_ns = -1};
    bh_channel *x, *y;
    bh_frame f;
    if (bh_channel_open(&x, sv[0], &ox) < 0 || bh_channel_open(&y, sv[1], &oy) < 0) _exit(2);
    int rc = refuse_poll();
    if (rc == -EINVAL || rc == -ENOSYS || rc == -EACCES) _exit(TEST_SKIP);
    if (rc) _exit(3);
    if (bh_test_send_nil(y, 1) < 0) _exit(4);
    rc = bh_channel_recv(x, &f, -1);
    if (rc) _exit(rc == -ENOTSUP ? 10 : 11); /* 10: it polled */
    if (f.h.request_id != 1) _exit(12);
    if (bh_test_send_nil(y, 2) < 0) _exit(4);
    rc = bh_channel_recv(x, &f, bh_now_ns() + 5ll * 1000000000);
    if (rc) _exit(rc == -ENOTSUP ? 20 : 21);
    if (f.h.request_id != 2) _exit(22);
    /* Nothing comes: past the slice the wait polls, which is refused. */
    rc = bh_channel_recv(x, &f, bh_now_ns() + 5ll * 1000000000);
    if (rc != -ENOTSUP) _exit(30);
    bh_channel_close(x);
    bh_channel_close(y);
    _exit(0);
  }
  close(sv[0]);
  close(sv[1]);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  if (WEXITSTATUS(st) == TEST_SKIP) return TEST_SKIP;
  if (WEXITSTATUS(st) != 0)
    FAIL("child exited %d (10, 20: the receive polled; 30: a wait past the slice did not)",
         WEXITSTATUS(st));
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(channel_helper_process_echo) {
  int fds0 = bh_test_fd_count();
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(sv[0]);
    _exit(echo_peer(sv[1]));
  }
  close(sv[1]);
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = pid};
  bh_channel *c;
  ASSERT_OK(bh_channel_open(&c, sv[0], &o));
  for (int round = 0; round < 20; round++) {
    size_t n = 1000 + (size_t)round * 3000;
    bh_block *x;
    ASSERT_OK(bh_channel_block_acquire(c, n, &x));
    uint8_t *p = bh_block_addr(x);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i + round);
    bh_buf v = tensor_value(x, n);
    ASSERT_OK(bh_test_send(c, BH_KIND_CALL, (uint64_t)round, v.data, v.len, &x, 1));
    bh_block_unref(x);
    bh_buf_free(&v);
    bh_frame f;
    ASSERT_OK(bh_test_recv(c, &f, 5000));
    ASSERT_EQ(f.h.kind, BH_KIND_RESULT);
    ASSERT_UEQ(f.h.request_id, round);
    ASSERT_EQ(f.sender_pid, pid);
    bh_tensor_ref t = frame_tensor(&f);
    ASSERT_UEQ(t.nbytes, n);
    bh_block *y;
    ASSERT_OK(bh_channel_peer_block(c, t.block, &y));
    const uint8_t *q = bh_block_addr(y);
    for (size_t i = 0; i < n; i++)
      if (q[i] != (uint8_t)(i + round + 1)) FAIL("round %d byte %zu: %u", round, i, q[i]);
    bh_block_unref(y);
  }
  /* Blocks went back and forth and were reused on both sides. */
  bh_pool_stats s = stats_of(c);
  ASSERT_GT(s.reused, 0);
  ASSERT_LE(s.lent_blocks, 1);
  ASSERT_OK(bh_test_send(c, BH_KIND_BYE, 0, NULL, 0, NULL, 0));
  bh_frame f;
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EEOF);
  wait_exit0(pid);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* ---- arenas: many small tensors in one message share blocks ---- */

/* A list value of n uint8 tensor refs (blocks[i], offs[i], lens[i]). */
static bh_buf refs_value(bh_block *const *blocks, const uint64_t *offs, const uint64_t *lens,
                         uint32_t n) {
  bh_buf v;
  bh_buf_init(&v);
  ASSERT_OK(bh_enc_list(&v, n));
  for (uint32_t i = 0; i < n; i++) {
    bh_tensor_ref t = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 1,
                       .block = bh_block_id(blocks[i]), .offset = offs[i], .nbytes = lens[i],
                       .shape = {(int64_t)lens[i]}, .strides = {1}};
    ASSERT_OK(bh_enc_tensor(&v, &t));
  }
  return v;
}

/* Claims every tensor ref of the frame in order (as a decoder does), up to
 * max of them into out[]; returns how many succeeded before the first
 * failure and that failure's code through *rc (0 if none). */
static uint32_t claim_refs(bh_channel *c, const bh_frame *f, bh_block **out, uint32_t max, int *rc) {
  bh_reader r;
  bh_item it;
  uint32_t n = 0;
  *rc = 0;
  ASSERT_OK(bh_dec_validate(f->value, f->value_len, BH_MAX_DEPTH));
  bh_reader_init(&r, f->value, f->value_len);
  while (r.pos < r.len) {
    ASSERT_OK(bh_dec_next(&r, &it));
    if (it.tag != BH_TAG_TENSOR || it.u.t.block == BH_BLOCK_INLINE || it.u.t.block == BH_BLOCK_NONE)
      continue;
    ASSERT_LT(n, max);
    *rc = bh_channel_frame_block(c, &it.u.t, &out[n]);
    if (*rc) return n;
    const uint8_t *p = (const uint8_t *)bh_block_addr(out[n]) + it.u.t.offset;
    ASSERT_EQ(((uintptr_t)p) % BH_ARENA_ALIGN, 0);
    n++;
  }
  return n;
}

/* 1,000 arrays of 70 KiB (past the inline size) in one message: they share
 * a few arena blocks instead of taking 1,000 (more than the 256 a pool may
 * hold with their fds), each an aligned range; the receiver maps each block
 * once and checks every ref; a block comes back when the receiver dropped
 * its last view of it, not before. */
TEST_IMPL(channel_arena_packs_small_tensors) {
  enum { N = 1000 };
  const uint64_t n = 70 * 1024;
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  static bh_block *blk[N], *pb[N];
  static uint64_t off[N], len[N];
  bh_arena ar = {0};
  uint32_t distinct = 0;
  bh_block *tmp;
  uint64_t o;
  ASSERT_RC(bh_arena_take(bh_channel_pool(a), &ar, 0, &tmp, &o), -EINVAL);
  ASSERT_RC(bh_arena_take(bh_channel_pool(a), &ar, BH_ARENA_ITEM_MAX + 1, &tmp, &o), -EINVAL);
  ASSERT_RC(bh_arena_take(NULL, &ar, 1, &tmp, &o), -EINVAL);
  for (uint32_t i = 0; i < N; i++) {
    ASSERT_OK(bh_arena_take(bh_channel_pool(a), &ar, n, &blk[i], &off[i]));
    len[i] = n;
    ASSERT_EQ(off[i] % BH_ARENA_ALIGN, 0);
    ASSERT_LE(off[i] + n, bh_block_size(blk[i]));
    if (i == 0 || blk[i] != blk[i - 1]) distinct++;
    else ASSERT_GE(off[i], off[i - 1] + n);
    memset((uint8_t *)bh_block_addr(blk[i]) + off[i], (int)(i % 251), n);
  }
  bh_arena_close(&ar);
  ASSERT_LE(distinct, 32); /* 256 KiB, 512 KiB, ... 4 MiB blocks: 21 */
  ASSERT_EQ(stats_of(a).created, distinct);
  bh_buf v = refs_value(blk, off, len, N);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, blk, N));
  for (uint32_t i = 0; i < N; i++) bh_block_unref(blk[i]); /* the loans keep them */
  ASSERT_EQ(stats_of(a).lent_blocks, distinct);

  bh_frame f;
  int rc;
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, pb, N, &rc), N);
  ASSERT_OK(rc);
  for (uint32_t i = 0; i < N; i++) {
    const uint8_t *p = (const uint8_t *)bh_block_addr(pb[i]) + off[i];
    ASSERT_EQ(p[0], i % 251);
    ASSERT_EQ(p[n - 1], i % 251);
  }
  bh_channel_frame_done(b, &f);
  ASSERT_EQ(stats_of(b).peer_blocks, distinct);
  /* After frame_done the frame's lend list is gone. */
  bh_tensor_ref late = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 1,
                        .block = bh_block_id(pb[0]), .nbytes = 1, .shape = {1}, .strides = {1}};
  ASSERT_RC(bh_channel_frame_block(b, &late, &tmp), -BH_EBLOCK);

  /* Every view but the first array's: only its block stays lent. */
  for (uint32_t i = 1; i < N; i++) bh_block_unref(pb[i]);
  ASSERT_OK(bh_test_send_nil(b, 2));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_pool_stats s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 1);
  ASSERT_EQ(s.free_blocks, distinct - 1);
  bh_block_unref(pb[0]);
  ASSERT_OK(bh_test_send_nil(b, 3));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  s = stats_of(a);
  ASSERT_EQ(s.lent_blocks, 0);
  ASSERT_EQ(s.free_blocks, distinct);

  /* The next message reuses the free blocks: nothing new, no fd. */
  int fds1 = bh_test_fd_count();
  for (uint32_t i = 0; i < N; i++) ASSERT_OK(bh_arena_take(bh_channel_pool(a), &ar, n, &blk[i], &off[i]));
  bh_arena_close(&ar);
  ASSERT_EQ(stats_of(a).created, distinct);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 4, v.data, v.len, blk, N));
  for (uint32_t i = 0; i < N; i++) bh_block_unref(blk[i]);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 0);
  ASSERT_FD_COUNT(fds1);
  bh_channel_frame_done(b, &f);

  bh_buf_free(&v);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Tensor refs a peer may write into a value, each checked against the
 * frame's lend list as they are decoded: a clean error naming the ref,
 * the refs before it fine, the channel usable after. */
TEST_IMPL(channel_frame_refs_are_checked) {
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *other;
  bh_frame f;
  int rc;
  /* A block b has mapped from an earlier message, returned since. */
  ASSERT_OK(bh_channel_block_acquire(a, 8192, &other));
  {
    uint64_t off0 = 0, len0 = 64;
    bh_block *pb1;
    bh_buf v = refs_value(&other, &off0, &len0, 1);
    ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, &other, 1));
    bh_buf_free(&v);
    ASSERT_OK(bh_test_recv(b, &f, 5000));
    ASSERT_EQ(claim_refs(b, &f, &pb1, 1, &rc), 1);
    ASSERT_OK(rc);
    bh_channel_frame_done(b, &f);
    bh_block_unref(pb1);
    ASSERT_OK(bh_test_send_nil(b, 2));
    ASSERT_OK(bh_test_recv(a, &f, 5000));
    ASSERT_EQ(stats_of(a).lent_blocks, 0);
  }
  const uint64_t S = 8192; /* the lent block's size */
  struct {
    const char *what;
    uint32_t n;
    uint64_t off[3], len[3];
    int other_at;       /* index of the ref into `other` (not lent), or -1 */
    uint32_t good;      /* refs accepted before the failure */
    int want;
  } cases[] = {
      {"refs side by side, aligned, to the block's end", 3, {0, 128, S - 64}, {100, 128, 64}, -1, 3, 0},
      {"a block the frame does not lend", 2, {0, 0}, {64, 64}, 1, 1, -BH_EBLOCK},
      {"an offset not a multiple of 64", 1, {32}, {16}, -1, 0, -BH_ETENSOR},
      {"a range past the block's end", 1, {S - 64}, {128}, -1, 0, -BH_ETENSOR},
      {"an offset past the block", 1, {S + 64}, {1}, -1, 0, -BH_ETENSOR},
      {"overlapping the ref before", 2, {0, 64}, {128, 64}, -1, 1, -BH_ETENSOR},
      {"the same range twice", 2, {0, 0}, {64, 64}, -1, 1, -BH_ETENSOR},
      {"before the ref before (out of order)", 2, {128, 0}, {64, 64}, -1, 1, -BH_ETENSOR},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    bh_block *x, *refs[3], *pb[3];
    /* A fresh block each case: one never claimed is never returned. */
    ASSERT_OK(bh_channel_block_acquire(a, S, &x));
    ASSERT_EQ(bh_block_size(x), S);
    for (uint32_t i = 0; i < cases[k].n; i++) refs[i] = (int)i == cases[k].other_at ? other : x;
    bh_buf v = refs_value(refs, cases[k].off, cases[k].len, cases[k].n);
    ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 10 + k, v.data, v.len, &x, 1)); /* lends x only */
    bh_buf_free(&v);
    bh_block_unref(x);
    ASSERT_OK(bh_test_recv(b, &f, 5000));
    ASSERT_EQ(claim_refs(b, &f, pb, 3, &rc), cases[k].good);
    ASSERT_RC(rc, cases[k].want);
    bh_channel_frame_done(b, &f);
    for (uint32_t i = 0; i < cases[k].good; i++) bh_block_unref(pb[i]);
    ASSERT_OK(bh_test_send_nil(b, 100 + k));
    ASSERT_OK(bh_test_recv(a, &f, 5000));
    ASSERT_UEQ(f.h.request_id, 100 + k);
  }
  bh_block_unref(other);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Lend lists written by hand: each refused with its code, the channel
 * usable after.  Block 99 (8192 bytes) is introduced first. */
TEST_IMPL(channel_bad_lend_list) {
  int fds0 = bh_test_fd_count();
  bh_channel *c;
  int raw;
  bh_test_raw_pair(&c, &raw);
  bh_frame f;
  uint8_t hdr[32];
  {
    int fd = make_memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW, 1);
    uint8_t sec[BH_TEST_SEC + 12 + 1] = {0};
    put_u32(sec, 1);
    put_u32(sec + BH_TEST_SEC, 99);
    put_u64(sec + BH_TEST_SEC + 4, 8192);
    sec[BH_TEST_SEC + 12] = BH_TAG_NIL;
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, 0, 0, sizeof sec, 1, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, sec, sizeof sec, &fd, 1), 32 + (ssize_t)sizeof sec);
    close(fd);
    ASSERT_OK(bh_test_recv(c, &f, 5000));
    bh_channel_frame_done(c, &f);
  }
  struct {
    const char *what;
    uint32_t n_lend;   /* as the section says */
    uint32_t entries;  /* (id, size) pairs sent */
    uint32_t id[2];
    uint64_t size[2];
    int want;
  } cases[] = {
      {"the introduced block, its size", 1, 1, {99}, {8192}, 0},
      {"a block never introduced", 1, 1, {98}, {8192}, -BH_EBLOCK},
      {"another size than the block's", 1, 1, {99}, {4096}, -BH_EBLOCK},
      {"size 0", 1, 1, {99}, {0}, -BH_EBLOCKSEC},
      {"the same block twice", 2, 2, {99, 99}, {8192, 8192}, -BH_EBLOCKSEC},
      {"ids descending", 2, 2, {99, 7}, {8192, 8192}, -BH_EBLOCKSEC},
      {"more entries than the payload holds", 2, 1, {99}, {8192}, -BH_EBLOCKSEC},
      {"more than a channel maps", BH__PEER_BLOCKS_MAX + 1, 0, {0}, {0}, -BH_EBLOCKSEC},
      {"an id with the back-ref bit", 1, 1, {99 | BH_BLOCK_BACK}, {8192}, -BH_EBLOCKSEC},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    uint8_t payload[BH_TEST_SEC + 24 + 1] = {0};
    put_u32(payload + 12, cases[k].n_lend);
    size_t len = BH_TEST_SEC;
    for (uint32_t i = 0; i < cases[k].entries; i++, len += 12) {
      put_u32(payload + len, cases[k].id[i]);
      put_u64(payload + len + 4, cases[k].size[i]);
    }
    payload[len++] = BH_TAG_NIL;
    bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, k, 0, (uint32_t)len, 0, 0);
    ASSERT_EQ(bh_test_raw_send(raw, hdr, 32, payload, len, NULL, 0), 32 + (ssize_t)len);
    ASSERT_RC(bh_test_recv(c, &f, 5000), cases[k].want);
    if (cases[k].want == 0) bh_channel_frame_done(c, &f);
    ASSERT_FD_COUNT(fds0 + 2);
    bh_test_raw_good(raw, k);
    bh_test_expect_good(c, k);
  }
  close(raw);
  bh_channel_close(c);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* bh__lend_claim, the pure check behind bh_channel_frame_block: a table of
 * refs against one lend list ({3, 4096}, {7, 65536}), in order. */
TEST_IMPL(channel_lend_claim_table) {
  bh__lend l[2] = {{3, 4096, 0}, {7, 65536, 0}};
  struct {
    uint32_t block;
    uint64_t offset, nbytes;
    int want; /* >= 0: the entry's index */
  } rows[] = {
      {3, 0, 100, 0},          {3, 100, 10, -BH_ETENSOR}, /* misaligned */
      {3, 64, 10, -BH_ETENSOR}, /* before the end of [0, 100) */
      {3, 128, 3968, 0},       /* to the block's end exactly */
      {3, 4096, 1, -BH_ETENSOR}, {7, 0, 65536, 1}, {7, 0, 1, -BH_ETENSOR},
      {5, 0, 1, -BH_EBLOCK},   {8, 0, 1, -BH_EBLOCK},     {2, 0, 1, -BH_EBLOCK},
      {BH_BLOCK_INLINE - 1, 0, 1, -BH_EBLOCK},
  };
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    bh_tensor_ref t = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 1,
                       .block = rows[k].block, .offset = rows[k].offset, .nbytes = rows[k].nbytes,
                       .shape = {(int64_t)rows[k].nbytes}, .strides = {1}};
    fprintf(stderr, "row %zu\n", k);
    ASSERT_EQ(bh__lend_claim(l, 2, &t), rows[k].want);
  }
  ASSERT_UEQ(l[0].end, 4096);
  ASSERT_UEQ(l[1].end, 65536);
  bh_tensor_ref t = {.dtype = BH_DT_UINT8, .ndim = 1, .block = 3, .nbytes = 1, .shape = {1}, .strides = {1}};
  ASSERT_RC(bh__lend_claim(NULL, 0, &t), -BH_EBLOCK); /* a frame that lends nothing */
  return 0;
}

/* ---- back refs: a value that came from the peer goes back by reference ---- */

/* A list value of n uint8 back refs: block ids[i] | BH_BLOCK_BACK. */
static bh_buf back_value(const uint32_t *ids, const uint64_t *offs, const uint64_t *lens, uint32_t n) {
  bh_buf v;
  bh_buf_init(&v);
  ASSERT_OK(bh_enc_list(&v, n));
  for (uint32_t i = 0; i < n; i++) {
    bh_tensor_ref t = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 1,
                       .block = ids[i] | BH_BLOCK_BACK, .offset = offs[i], .nbytes = lens[i],
                       .shape = {(int64_t)lens[i]}, .strides = {1}};
    ASSERT_OK(bh_enc_tensor(&v, &t));
  }
  return v;
}

/* a lends block X to b; b finds X by the address of its view
 * (bh_channel_peer_find) and sends it back as a back ref: a resolves it to
 * X itself (no copy, no new block, nothing lent by b).  X outlives b's
 * return while a's view of it lives: it is not reused until that goes. */
TEST_IMPL(channel_back_ref_resolves_to_own_block) {
  const size_t S = 1 * MiB;
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *x, *pb, *found, *back, *y;
  bh_frame f;
  int rc;
  uint64_t off, zero = 0, len = S;
  ASSERT_OK(bh_channel_block_acquire(a, S, &x));
  memset(bh_block_addr(x), 0x5a, S);
  bh_buf v = refs_value(&x, &zero, &len, 1);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, &x, 1));
  bh_buf_free(&v);
  bh_block_unref(x); /* the loan keeps it */
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, &pb, 1, &rc), 1);
  ASSERT_OK(rc);
  bh_channel_frame_done(b, &f);

  /* What b finds, and what it does not. */
  uint8_t *at = bh_block_addr(pb);
  ASSERT_RC(bh_channel_peer_find(b, NULL, 64, &found, &off), -EINVAL);
  ASSERT_RC(bh_channel_peer_find(b, at, 0, &found, &off), -EINVAL);
  ASSERT_RC(bh_channel_peer_find(b, at + 1, 64, &found, &off), -ENOENT);   /* misaligned */
  ASSERT_RC(bh_channel_peer_find(b, at + 64, S, &found, &off), -ENOENT);   /* past its end */
  ASSERT_RC(bh_channel_peer_find(b, &off, 8, &found, &off), -ENOENT);      /* not a block */
  ASSERT_OK(bh_channel_peer_find(b, at + 128, S - 128, &found, &off));
  ASSERT_EQ(found, pb);
  ASSERT_UEQ(off, 128);
  bh_block_unref(found);
  ASSERT_OK(bh_channel_peer_find(b, at, S, &found, &off));
  ASSERT_UEQ(off, 0);

  /* Sent back: unlisted, no fd, nothing of b's lent. */
  uint32_t id = bh_block_id(found);
  uint64_t offs[2] = {0, 0}, lens[2] = {S, 64}; /* the same bytes twice may overlap */
  v = back_value((uint32_t[]){id, id}, offs, lens, 2);
  ASSERT_OK(bh_test_send(b, BH_KIND_CALL, 2, v.data, v.len, NULL, 0));
  bh_buf_free(&v);
  bh_block_unref(found); /* sent: the frame carried no return of it */
  ASSERT_EQ(stats_of(b).own_blocks, 0);
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 0);
  bh_block *views[2];
  ASSERT_EQ(claim_refs(a, &f, views, 2, &rc), 2);
  ASSERT_OK(rc);
  bh_channel_frame_done(a, &f);
  back = views[0];
  ASSERT_EQ(back, x); /* a's own block: a view, no copy */
  ASSERT_EQ(views[1], x);
  bh_block_unref(views[1]);
  ASSERT_EQ(((uint8_t *)bh_block_addr(back))[S - 1], 0x5a);
  bh_pool_stats s = stats_of(a);
  ASSERT_UEQ(s.created, 1);
  ASSERT_UEQ(s.lent_blocks, 1);

  /* b drops its view: the return reaches a, X stays held by a's view. */
  bh_block_unref(pb);
  ASSERT_OK(bh_test_send_nil(b, 3));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  s = stats_of(a);
  ASSERT_UEQ(s.lent_blocks, 0);
  ASSERT_UEQ(s.free_blocks, 0);
  ASSERT_OK(bh_channel_block_acquire(a, S, &y)); /* not X: it is in use */
  ASSERT_NE(y, x);
  ASSERT_UEQ(stats_of(a).created, 2);
  bh_block_unref(y);
  /* Returned: b may no longer name it. */
  v = back_value(&id, offs, lens, 1);
  ASSERT_OK(bh_test_send(b, BH_KIND_CALL, 4, v.data, v.len, NULL, 0));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_EQ(claim_refs(a, &f, views, 1, &rc), 0);
  ASSERT_RC(rc, -BH_EBLOCK);
  bh_channel_frame_done(a, &f);
  ASSERT_RC(bh_channel_peer_find(b, at, S, &found, &off), -ENOENT); /* b holds no view */
  bh_block_unref(back);
  s = stats_of(a);
  ASSERT_UEQ(s.free_blocks, 2);

  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Back refs a peer may write, each checked against the receiver's own
 * pool: only a block it lent the peer and has not had back, aligned and
 * within it; a clean error otherwise, the channel usable after. */
TEST_IMPL(channel_back_refs_are_checked) {
  const uint64_t S = 8192;
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *lent, *idle, *pb, *peer_of_a, *views[3];
  bh_frame f;
  int rc;
  uint64_t zero = 0, len = S;
  /* lent: out to b (b holds a view); idle: a's, never lent. */
  ASSERT_OK(bh_channel_block_acquire(a, S, &lent));
  ASSERT_OK(bh_channel_block_acquire(a, S, &idle));
  bh_buf v = refs_value(&lent, &zero, &len, 1);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, v.data, v.len, &lent, 1));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, &pb, 1, &rc), 1);
  bh_channel_frame_done(b, &f);
  /* peer_of_a: b's block, lent to a (an id in b's space, not a's). */
  ASSERT_OK(bh_channel_block_acquire(b, 3 * S, &peer_of_a));
  v = refs_value(&peer_of_a, &zero, &len, 1);
  ASSERT_OK(bh_test_send(b, BH_KIND_RESULT, 2, v.data, v.len, &peer_of_a, 1));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_block *held;
  ASSERT_EQ(claim_refs(a, &f, &held, 1, &rc), 1);
  bh_channel_frame_done(a, &f);

  uint32_t L = bh_block_id(lent), I = bh_block_id(idle);
  struct {
    const char *what;
    uint32_t n, id[3];
    uint64_t off[3], len[3];
    uint32_t good;
    int want;
  } cases[] = {
      {"the lent block, whole, twice, and a part", 3, {L, L, L}, {0, 0, 4096}, {S, S, 64}, 3, 0},
      {"a block of a's never lent", 1, {I}, {0}, {64}, 0, -BH_EBLOCK},
      {"an id a never made", 2, {L, 77}, {0, 0}, {64, 64}, 1, -BH_EBLOCK},
      {"id 0", 1, {0}, {0}, {64}, 0, -BH_EBLOCK},
      {"an offset not a multiple of 64", 1, {L}, {32}, {16}, 0, -BH_ETENSOR},
      {"a range past the block's end", 1, {L}, {S - 64}, {128}, 0, -BH_ETENSOR},
      {"an offset past the block", 1, {L}, {S + 64}, {1}, 0, -BH_ETENSOR},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    v = back_value(cases[k].id, cases[k].off, cases[k].len, cases[k].n);
    ASSERT_OK(bh_test_send(b, BH_KIND_CALL, 10 + k, v.data, v.len, NULL, 0));
    bh_buf_free(&v);
    ASSERT_OK(bh_test_recv(a, &f, 5000));
    ASSERT_EQ(claim_refs(a, &f, views, 3, &rc), cases[k].good);
    ASSERT_RC(rc, cases[k].want);
    bh_channel_frame_done(a, &f);
    for (uint32_t i = 0; i < cases[k].good; i++) {
      ASSERT_EQ(views[i], lent);
      bh_block_unref(views[i]);
    }
    ASSERT_OK(bh_test_send_nil(a, 100 + k));
    ASSERT_OK(bh_test_recv(b, &f, 5000));
    ASSERT_UEQ(f.h.request_id, 100 + k);
    bh_channel_frame_done(b, &f);
  }
  /* And the other way: a sends b's block back; b resolves it to its own. */
  uint32_t P = bh_block_id(held);
  v = back_value(&P, &zero, &len, 1);
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 200, v.data, v.len, NULL, 0));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, views, 1, &rc), 1);
  ASSERT_EQ(views[0], peer_of_a);
  bh_block_unref(views[0]);
  bh_channel_frame_done(b, &f);
  /* After b returns the lent block, a back ref to it is refused. */
  bh_block_unref(pb);
  ASSERT_OK(bh_test_send_nil(b, 300));
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  bh_channel_frame_done(a, &f);
  ASSERT_UEQ(stats_of(a).lent_blocks, 0);
  v = back_value(&L, &zero, &len, 1);
  ASSERT_OK(bh_test_send(b, BH_KIND_CALL, 301, v.data, v.len, NULL, 0));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(a, &f, 5000));
  ASSERT_EQ(claim_refs(a, &f, views, 1, &rc), 0);
  ASSERT_RC(rc, -BH_EBLOCK);
  bh_channel_frame_done(a, &f);

  bh_block_unref(held);
  bh_block_unref(peer_of_a);
  bh_block_unref(lent);
  bh_block_unref(idle);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* bh__back_range, the pure range check of a back ref. */
TEST_IMPL(channel_back_range_table) {
  struct {
    uint64_t size, offset, nbytes;
    int want;
  } rows[] = {
      {4096, 0, 4096, 0},          {4096, 64, 4032, 0},          {4096, 64, 4033, -BH_ETENSOR},
      {4096, 32, 1, -BH_ETENSOR},  {4096, 4096, 0, 0},           {4096, 4160, 0, -BH_ETENSOR},
      {4096, UINT64_MAX - 63, 64, -BH_ETENSOR}, {4096, 0, UINT64_MAX, -BH_ETENSOR},
  };
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    bh_tensor_ref t = {.block = 1 | BH_BLOCK_BACK, .offset = rows[k].offset, .nbytes = rows[k].nbytes};
    fprintf(stderr, "row %zu\n", k);
    ASSERT_EQ(bh__back_range(rows[k].size, &t), rows[k].want);
  }
  return 0;
}

/* ---- forwards (protocol 7): worker A's block to worker B through a host ---- */

/* The host's end of a pair (*host, opened to forward: it keeps the memfds
 * of large peer blocks) and the worker's (*worker). */
static void forward_pair(bh_channel **host, bh_channel **worker, int forward) {
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  bh_channel_opts o = {.peer_uid = getuid(), .forward = forward};
  ASSERT_OK(bh_channel_open(host, sv[0], &o));
  o.forward = 0;
  ASSERT_OK(bh_channel_open(worker, sv[1], &o));
}

/* Worker A (wa) lends the host (ha) a block X of S bytes filled with
 * `fill`, sealed against writes before (a tensor A keeps and sends again,
 * the only blocks forwarded) or not (A's next output takes it again once
 * it is back); returns the host's held view of it. */
static bh_block *lend_source(bh_channel *wa, bh_channel *ha, size_t S, uint8_t fill, bh_block **x,
                             int sealed) {
  bh_frame f;
  bh_block *held;
  int rc;
  uint64_t zero = 0, len = S;
  if (sealed) ASSERT_OK(bh_channel_block_acquire_sealed(wa, S, x));
  else ASSERT_OK(bh_channel_block_acquire(wa, S, x));
  memset(bh_block_addr(*x), fill, S);
  bh_buf v = refs_value(x, &zero, &len, 1);
  ASSERT_OK(bh_test_send(wa, BH_KIND_RESULT, 1, v.data, v.len, x, 1));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(ha, &f, 5000));
  ASSERT_EQ(claim_refs(ha, &f, &held, 1, &rc), 1);
  ASSERT_OK(rc);
  bh_channel_frame_done(ha, &f);
  return held;
}

static bh_block *forward_source(bh_channel *wa, bh_channel *ha, size_t S, uint8_t fill, bh_block **x) {
  return lend_source(wa, ha, S, fill, x, 1);
}

/* Sends one nil frame from `from` and receives it on `to`: the notes
 * queued on `from` (returns, retires) reach `to`. */
static void carry_notes(bh_channel *from, bh_channel *to) {
  bh_frame f;
  ASSERT_OK(bh_test_send_nil(from, 99));
  ASSERT_OK(bh_test_recv(to, &f, 5000));
  bh_channel_frame_done(to, &f);
}

/* The host finds worker A's block (mapped from its channel with A) by the
 * address of its view and lends it to worker B as a block of its channel
 * with B: no copy, no block made.  B maps it copy-on-write (its writes stay
 * in B; A's later writes show in pages B did not write) and never finds it
 * to send back.  A's block stays lent while the forward lives; B's return
 * ends the forward (B is told to unmap), and then A gets its block back. */
TEST_IMPL(channel_forward_lends_another_channels_block) {
  const size_t S = 2 * MiB;
  int fds0 = bh_test_fd_count();
  bh_channel *ha, *wa, *hb, *wb;
  forward_pair(&ha, &wa, 1);
  forward_pair(&hb, &wb, 1);
  bh_block *x, *fw, *seen, *found;
  bh_frame f;
  int rc;
  uint64_t off, len = S;
  bh_block *held = forward_source(wa, ha, S, 0x11, &x);
  bh_block_unref(x); /* the loan keeps it */
  ASSERT_UEQ(stats_of(ha).peer_fds, 1);
  uint8_t *at = bh_block_addr(held);

  ASSERT_OK(bh_channel_peer_find(hb, at, len, &fw, &off));
  ASSERT_EQ(bh_block_is_own(fw), 1);
  ASSERT_UEQ(off, 0);
  ASSERT_EQ(bh_block_addr(fw), at); /* the same mapping: nothing copied */
  bh_pool_stats s = stats_of(hb);
  ASSERT_UEQ(s.forward_blocks, 1);
  ASSERT_UEQ(s.forward_bytes, S);
  ASSERT_UEQ(s.forwarded, 1);
  ASSERT_UEQ(s.own_blocks, 0); /* counted on its owner, not here */
  ASSERT_UEQ(s.created, 0);
  bh_buf v = refs_value(&fw, &off, &len, 1);
  ASSERT_OK(bh_test_send(hb, BH_KIND_CALL, 2, v.data, v.len, &fw, 1));
  bh_buf_free(&v);
  bh_block_unref(fw); /* the loan keeps it */

  ASSERT_OK(bh_test_recv(wb, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 1);
  ASSERT_EQ(claim_refs(wb, &f, &seen, 1, &rc), 1);
  ASSERT_OK(rc);
  bh_channel_frame_done(wb, &f);
  uint8_t *in_b = (uint8_t *)bh_block_addr(seen);
  ASSERT_EQ(in_b[64], 0x11);
  ASSERT_EQ(in_b[S - 1], 0x11);
  /* Copy-on-write in B: B's write stays in B. */
  memset(in_b, 0x22, 4096);
  ASSERT_EQ(at[0], 0x11);
  ASSERT_EQ(((uint8_t *)bh_block_addr(x))[0], 0x11);
  /* The owner's mapping stays writable after the seal, and B sees the
   * pages it did not write. */
  memset((uint8_t *)bh_block_addr(x) + S - 4096, 0x33, 4096);
  ASSERT_EQ(at[S - 1], 0x33);
  ASSERT_EQ(in_b[S - 1], 0x33);
  ASSERT_EQ(in_b[0], 0x22);
  /* B's copy-on-write mapping goes back by reference only where B wrote
   * nothing (its first page it did). */
  ASSERT_RC(bh_channel_peer_find(wb, in_b, len, &found, &off), -ENOENT);
  ASSERT_OK(bh_channel_peer_find(wb, in_b + 4096, S - 4096, &found, &off));
  ASSERT_EQ(found, seen);
  ASSERT_UEQ(off, 4096);
  bh_block_unref(found);
  ASSERT_UEQ(stats_of(wb).own_blocks, 0);

  /* The host drops its view: the forward still holds A's block. */
  bh_block_unref(held);
  carry_notes(ha, wa);
  ASSERT_UEQ(stats_of(wa).lent_blocks, 1);
  /* B drops its view: the forward ends and A gets its block, marked
   * forwarded (protocol 10); B keeps its mapping (the forward kept for
   * the next forward of that block: A never puts other bytes there). */
  bh_block_unref(seen);
  carry_notes(wb, hb);
  s = stats_of(hb);
  ASSERT_UEQ(s.forward_blocks, 0);
  ASSERT_UEQ(s.lent_blocks, 0);
  carry_notes(hb, wb);
  ASSERT_UEQ(stats_of(wb).peer_blocks, 1);
  /* A retires its block rather than keep it for reuse; at its retire
   * note the host unmaps it and retires the kept forward: B unmaps. */
  carry_notes(ha, wa);
  s = stats_of(wa);
  ASSERT_UEQ(s.lent_blocks, 0);
  ASSERT_UEQ(s.own_blocks, 0);
  ASSERT_UEQ(s.spent, 1);
  carry_notes(wa, ha);
  s = stats_of(ha);
  ASSERT_UEQ(s.peer_blocks, 0);
  ASSERT_UEQ(s.peer_fds, 0);
  carry_notes(hb, wb);
  ASSERT_UEQ(stats_of(wb).peer_blocks, 0);

  bh_channel_close(ha);
  bh_channel_close(wa);
  bh_channel_close(hb);
  bh_channel_close(wb);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Worker A's channel closes (A died) while B holds its block through a
 * forward, and the host's channel with A closes too: A's pool is gone, but
 * every mapping keeps its pages, so B and the host still read A's bytes;
 * the block goes when B's return ends the forward, and nothing is left. */
TEST_IMPL(channel_forward_outlives_its_owner) {
  const size_t S = 1 * MiB;
  int fds0 = bh_test_fd_count();
  bh_channel *ha, *wa, *hb, *wb;
  forward_pair(&ha, &wa, 1);
  forward_pair(&hb, &wb, 1);
  bh_block *x, *fw, *seen;
  bh_frame f;
  int rc;
  uint64_t off, len = S;
  bh_block *held = forward_source(wa, ha, S, 0x44, &x);
  bh_block_unref(x);
  ASSERT_OK(bh_channel_peer_find(hb, bh_block_addr(held), len, &fw, &off));
  bh_buf v = refs_value(&fw, &off, &len, 1);
  ASSERT_OK(bh_test_send(hb, BH_KIND_CALL, 2, v.data, v.len, &fw, 1));
  bh_buf_free(&v);
  bh_block_unref(fw);
  ASSERT_OK(bh_test_recv(wb, &f, 5000));
  ASSERT_EQ(claim_refs(wb, &f, &seen, 1, &rc), 1);
  bh_channel_frame_done(wb, &f);

  bh_channel_close(wa); /* A dies: its pool unmaps X and closes its fd */
  bh_channel_close(ha); /* the host sees it: its pool with A closes */
  const uint8_t *in_b = bh_block_addr(seen), *in_host = bh_block_addr(held);
  ASSERT_EQ(in_b[0], 0x44);
  ASSERT_EQ(in_b[S - 1], 0x44);
  ASSERT_EQ(in_host[S / 2], 0x44);
  bh_block_unref(held); /* the forward keeps the host's mapping */
  ASSERT_EQ(in_b[S / 2], 0x44);
  /* No forward from a closed channel: its blocks are not found. */
  ASSERT_RC(bh_channel_peer_find(hb, bh_block_addr(fw), len, &x, &off), -ENOENT);
  bh_block_unref(seen);
  carry_notes(wb, hb);
  ASSERT_UEQ(stats_of(hb).forward_blocks, 0);
  carry_notes(hb, wb);
  ASSERT_UEQ(stats_of(wb).peer_blocks, 0);
  bh_channel_close(hb);
  bh_channel_close(wb);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Worker A (wa) lends the host (ha) its block x again (a tensor it keeps
 * and sends again, unchanged); returns the host's held view of it. */
static bh_block *send_source_again(bh_channel *wa, bh_channel *ha, bh_block *x) {
  bh_frame f;
  bh_block *held;
  int rc;
  uint64_t zero = 0, len = bh_block_size(x);
  bh_buf v = refs_value(&x, &zero, &len, 1);
  ASSERT_OK(bh_test_send(wa, BH_KIND_RESULT, 1, v.data, v.len, &x, 1));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(ha, &f, 5000));
  ASSERT_EQ(f.h.fd_count, 0);
  ASSERT_EQ(claim_refs(ha, &f, &held, 1, &rc), 1);
  ASSERT_OK(rc);
  bh_channel_frame_done(ha, &f);
  return held;
}

/* A forward B returned is kept for the next forward of the same block (B
 * keeps its mapping; the kept forward holds no reference on A's block) for
 * as long as A's block lives: A never puts other bytes in a block that was
 * forwarded (protocol 10).  A block A keeps (a tensor it sends again) goes
 * to the host and on to B again as the same block, B's mapping kept: no fd
 * travels, no page is faulted afresh, though the host dropped A's array in
 * between.  When A lets go, A retires the block; at that note the host
 * retires the kept forward, and B unmaps.  (471c5c9 kept B's mapping while
 * A reused the block; 2d328c7 unmapped it whenever the host dropped A's
 * array, so a tensor A sent again faulted B's pages each time.) */
TEST_IMPL(channel_forward_kept_till_its_source_retires) {
  const size_t S = 2 * MiB;
  int fds0 = bh_test_fd_count();
  bh_channel *ha, *wa, *hb, *wb;
  forward_pair(&ha, &wa, 1);
  forward_pair(&hb, &wb, 1);
  bh_block *x, *fw, *seen;
  bh_frame f;
  int rc;
  uint64_t off, len = S;
  bh_block *held = forward_source(wa, ha, S, 0x11, &x); /* A keeps x */
  uint8_t *at = bh_block_addr(held);
  for (int round = 0; round < 2; round++) {
    ASSERT_OK(bh_channel_peer_find(hb, at, len, &fw, &off));
    ASSERT_UEQ(stats_of(hb).forwarded, (uint64_t)round + 1);
    bh_buf v = refs_value(&fw, &off, &len, 1);
    ASSERT_OK(bh_test_send(hb, BH_KIND_CALL, 2, v.data, v.len, &fw, 1));
    bh_buf_free(&v);
    bh_block_unref(fw);
    ASSERT_OK(bh_test_recv(wb, &f, 5000));
    ASSERT_EQ(f.h.fd_count, round == 0 ? 1 : 0); /* the second: the kept forward */
    ASSERT_EQ(claim_refs(wb, &f, &seen, 1, &rc), 1);
    ASSERT_OK(rc);
    bh_channel_frame_done(wb, &f);
    ASSERT_EQ(((uint8_t *)bh_block_addr(seen))[S - 1], 0x11);
    /* B returns it and the host drops A's array: A has its block back,
     * marked forwarded, and keeps it (x); B keeps its mapping. */
    bh_block_unref(seen);
    carry_notes(wb, hb);
    ASSERT_UEQ(stats_of(hb).forward_blocks, 0);
    bh_block_unref(held);
    carry_notes(ha, wa);
    bh_pool_stats s = stats_of(wa);
    ASSERT_UEQ(s.lent_blocks, 0);
    ASSERT_UEQ(s.own_blocks, 1);
    carry_notes(hb, wb);
    ASSERT_UEQ(stats_of(wb).peer_blocks, 1);
    /* A sends the same block again (no fd: the host maps it still). */
    held = send_source_again(wa, ha, x);
    ASSERT_EQ(bh_block_addr(held) == at, 1);
  }

  /* A lets go: the block is destroyed, not freed for reuse; at its retire
   * note the host unmaps it and retires the kept forward: B unmaps. */
  bh_block_unref(held);
  carry_notes(ha, wa);
  bh_block_unref(x);
  bh_pool_stats s = stats_of(wa);
  ASSERT_UEQ(s.own_blocks, 0);
  ASSERT_UEQ(s.spent, 1);
  ASSERT_UEQ(s.created, 1);
  carry_notes(wa, ha);
  ASSERT_UEQ(stats_of(ha).peer_blocks, 0);
  carry_notes(hb, wb);
  ASSERT_UEQ(stats_of(wb).peer_blocks, 0);

  bh_channel_close(ha);
  bh_channel_close(wa);
  bh_channel_close(hb);
  bh_channel_close(wb);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Takes, as a receiver whose code keeps what it is given would, a copy of
 * every fd the next frame waiting on c carries (MSG_PEEK: the frame stays
 * for the channel, which closes its own copies as ever); returns how many,
 * up to max, into fds. */
static int peek_fds(bh_channel *c, int *fds, int max) {
  char byte;
  union {
    char buf[CMSG_SPACE(sizeof(int) * BH_FRAME_FDS_MAX)];
    struct cmsghdr align;
  } u;
  struct iovec iov = {&byte, 1};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  ASSERT_SYS(recvmsg(bh_channel_fd(c), &mh, MSG_PEEK | MSG_TRUNC | MSG_CMSG_CLOEXEC));
  int n = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      if (n < max) fds[n++] = fd;
      else close(fd);
    }
  }
  return n;
}

/* A receiver that keeps the fd of a forward it was sent (B's code dups it,
 * or ignores the note to unmap) reads through it nothing A writes later:
 * once the host has forwarded A's block, A never reuses it (the return note
 * says the block was forwarded, protocol 10): it is destroyed at A's last
 * reference, and A's next output of that size takes a fresh memfd.
 * Without, A reused the block for its next output and B read it (0x99). */
/* This process's threads (/proc/self/task's entries). */
static int task_count(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST_IMPL(channel_forward_kept_fd_reads_none_of_the_owners_next_output) {
  const size_t S = 2 * MiB;
  int fds0 = bh_test_fd_count();
  int tasks0 = task_count();
  bh_channel *ha, *wa, *hb, *wb;
  forward_pair(&ha, &wa, 1);
  forward_pair(&hb, &wb, 1);
  bh_block *x, *fw, *seen;
  bh_frame f;
  int rc, kept = -1;
  uint64_t off, len = S;
  bh_block *held = forward_source(wa, ha, S, 0x11, &x);
  bh_block_unref(x); /* the loan keeps it */
  ASSERT_OK(bh_channel_peer_find(hb, bh_block_addr(held), len, &fw, &off));
  bh_buf v = refs_value(&fw, &off, &len, 1);
  ASSERT_OK(bh_test_send(hb, BH_KIND_CALL, 2, v.data, v.len, &fw, 1));
  bh_buf_free(&v);
  bh_block_unref(fw);
  /* B's code keeps a copy of the block's fd. */
  ASSERT_EQ(peek_fds(wb, &kept, 1), 1);
  ASSERT_OK(bh_test_recv(wb, &f, 5000));
  ASSERT_EQ(claim_refs(wb, &f, &seen, 1, &rc), 1);
  ASSERT_OK(rc);
  bh_channel_frame_done(wb, &f);
  uint8_t got;
  ASSERT_EQ(pread(kept, &got, 1, S - 1), 1);
  ASSERT_EQ(got, 0x11);

  /* Everyone lets go: B returns the forward, the host drops A's array, A
   * has its block back. */
  bh_block_unref(seen);
  carry_notes(wb, hb);
  bh_block_unref(held);
  carry_notes(hb, wb);
  carry_notes(ha, wa);
  ASSERT_UEQ(stats_of(wa).lent_blocks, 0);

  /* A's next output, of the same size, different bytes: not in the block
   * B's fd shows. */
  held = forward_source(wa, ha, S, 0x99, &x);
  bh_block_unref(x);
  uint8_t *seen_by_b = mmap(NULL, S, PROT_READ, MAP_SHARED, kept, 0);
  ASSERT_EQ(seen_by_b != MAP_FAILED, 1);
  size_t leaked = 0;
  for (size_t i = 0; i < S; i++) leaked += seen_by_b[i] == 0x99;
  ASSERT_UEQ(leaked, 0);
  ASSERT_SYS(munmap(seen_by_b, S));
  bh_pool_stats s = stats_of(wa);
  ASSERT_UEQ(s.created, 2); /* a fresh block: the forwarded one is retired */
  ASSERT_UEQ(s.own_blocks, 1);
  /* ... prepared off the call path at that retire (shm.c's spare), and
   * the next asked for meanwhile: a 2 MiB spare at most besides. */
  ASSERT_UEQ(s.spare_takes, 1);
  ASSERT_EQ(s.spare_bytes == 0 || s.spare_bytes == S, 1);
  bh_block_unref(held);
  carry_notes(ha, wa);
  /* The retired block is unmapped in the host too (A's retire note). */
  ASSERT_UEQ(stats_of(ha).peer_blocks, 1);
  close(kept);

  bh_channel_close(ha);
  bh_channel_close(wa);
  bh_channel_close(hb);
  bh_channel_close(wb);
  /* The spare and its thread go with the pool. */
  ASSERT_FD_COUNT(fds0);
  ASSERT_UEQ(bh__block_fds_open(), 0);
  ASSERT_EQ(task_count(), tasks0);
  return 0;
}

/* What is not forwarded (copied instead): a channel not opened to forward
 * keeps no fd, nor does one for a block under 1 MiB or one its owner did
 * not seal (its pool's next output takes it again: the owner gets it back
 * for reuse, not spent); a misaligned range, a range past the block, a
 * block no view holds; and a channel's own peer block is a back ref, not
 * a forward. */
TEST_IMPL(channel_forward_only_what_it_may) {
  int fds0 = bh_test_fd_count();
  bh_channel *ha, *wa, *hb, *wb, *hc, *wc;
  forward_pair(&ha, &wa, 1);
  forward_pair(&hb, &wb, 0);
  forward_pair(&hc, &wc, 1);
  bh_block *xa, *xa_small, *xa_open, *xb, *found;
  uint64_t off;
  bh_block *big = forward_source(wa, ha, 1 * MiB, 1, &xa);
  bh_block *small = forward_source(wa, ha, 1 * MiB - 4096, 2, &xa_small);
  bh_block *unsealed = lend_source(wa, ha, 2 * MiB, 4, &xa_open, 0);
  bh_block *unkept = forward_source(wb, hb, 1 * MiB, 3, &xb);
  uint8_t *in_a = bh_block_addr(xa);
  bh_block_unref(xa);
  bh_block_unref(xa_small);
  bh_block_unref(xa_open);
  bh_block_unref(xb);
  ASSERT_UEQ(stats_of(ha).peer_fds, 1);
  ASSERT_UEQ(stats_of(hb).peer_fds, 0);
  uint8_t *at = bh_block_addr(big);
  ASSERT_RC(bh_channel_peer_find(hc, bh_block_addr(small), 4096, &found, &off), -ENOENT);
  ASSERT_RC(bh_channel_peer_find(hc, bh_block_addr(unkept), 4096, &found, &off), -ENOENT);
  ASSERT_RC(bh_channel_peer_find(hc, bh_block_addr(unsealed), 2 * MiB, &found, &off), -ENOENT);
  /* Not forwarded, so not spent: back from the host, A's next output of
   * that size takes it again. */
  bh_block_unref(unsealed);
  carry_notes(ha, wa);
  ASSERT_OK(bh_channel_block_acquire(wa, 2 * MiB, &found));
  ASSERT_EQ(found, xa_open);
  bh_block_unref(found);
  ASSERT_UEQ(stats_of(wa).spent, 0);
  ASSERT_UEQ(stats_of(hc).forwarded, 0);
  ASSERT_RC(bh_channel_peer_find(hc, at + 1, 64, &found, &off), -ENOENT);
  ASSERT_RC(bh_channel_peer_find(hc, at + 64, 1 * MiB, &found, &off), -ENOENT);
  /* Only bytes that fill their block alone (#37): the receiver maps the
   * whole block, so a range of it -- not from its start, ending a page or
   * more before its end, or leaving bytes that are not zero in its last
   * page -- would show it the rest; those are copied. */
  ASSERT_RC(bh_channel_peer_find(hc, at + 4096, 1 * MiB - 4096, &found, &off), -ENOENT);
  ASSERT_RC(bh_channel_peer_find(hc, at, 1 * MiB - 4096, &found, &off), -ENOENT);
  ASSERT_RC(bh_channel_peer_find(hc, at, 1 * MiB - 64, &found, &off), -ENOENT);
  memset(in_a + 1 * MiB - 64, 0, 64); /* a zero tail (A's bytes): the tensor is all the block shows */
  ASSERT_OK(bh_channel_peer_find(hc, at, 1 * MiB - 64, &found, &off));
  ASSERT_UEQ(off, 0);
  bh_block_unref(found);
  ASSERT_UEQ(stats_of(hc).forwarded, 1);
  /* A block reused for fewer bytes has its last page's tail cleared: what
   * an earlier use left there is not forwarded with the new tensor. */
  bh_block *r1, *r2;
  ASSERT_OK(bh_channel_block_acquire(wa, 1 * MiB + 8192, &r1));
  memset(bh_block_addr(r1), 0x77, 1 * MiB + 8192);
  bh_block_unref(r1);
  ASSERT_OK(bh_channel_block_acquire(wa, 1 * MiB + 4096 + 100, &r2));
  ASSERT_EQ(r2, r1); /* the same block, free again */
  const uint8_t *r = bh_block_addr(r2);
  ASSERT_EQ(r[1 * MiB + 4096 + 99], 0x77);
  for (size_t i = 1 * MiB + 4096 + 100; i < 1 * MiB + 8192; i++) ASSERT_EQ(r[i], 0);
  bh_block_unref(r2);
  /* The host's own channel with A: a back ref to A's block. */
  ASSERT_OK(bh_channel_peer_find(ha, at, 64, &found, &off));
  ASSERT_EQ(found, big);
  bh_block_unref(found);
  /* Held no more: nothing to forward. */
  bh_block_unref(big);
  ASSERT_RC(bh_channel_peer_find(hc, at, 64, &found, &off), -ENOENT);
  ASSERT_UEQ(stats_of(hc).forwarded, 1);
  bh_block_unref(small);
  bh_block_unref(unkept);
  bh_channel_close(ha);
  bh_channel_close(wa);
  bh_channel_close(hb);
  bh_channel_close(wb);
  bh_channel_close(hc);
  bh_channel_close(wc);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Whether this process's mapping at `addr` is registered for userfaultfd
 * write protection (its VmFlags in /proc/self/smaps say "uw"): -1 if no
 * mapping starts there. */
static int vma_uffd_wp(const void *addr) {
  FILE *f = fopen("/proc/self/smaps", "re");
  if (!f) return -1;
  char line[512];
  int in = 0, found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    uintptr_t lo, hi;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2) /* a mapping's first line */
      in = lo == (uintptr_t)addr;
    else if (in && strncmp(line, "VmFlags:", 8) == 0)
      found = strstr(line, " uw") != NULL;
  }
  fclose(f);
  return found;
}

/* A pair of channels and a sealed block of a's (S bytes of 0x5c, written
 * through a's own mapping after the seal), with a value naming it. */
static void sealed_pair(bh_channel **a, bh_channel **b, size_t S, bh_block **x, bh_buf *v) {
  static uint64_t zero = 0;
  uint64_t len = S;
  bh_test_pair(a, b, 0);
  ASSERT_OK(bh_channel_block_acquire_sealed(*a, S, x));
  memset(bh_block_addr(*x), 0x5c, S); /* this process's mapping stays writable */
  *v = refs_value(x, &zero, &len, 1);
}

/* A sealed block lent again and again, only read by the peer: from its
 * second unwritten return the peer write-protects its copy-on-write
 * mapping (userfaultfd, asynchronously), and checks read the protection
 * bits.  A write there, the peer's own or the kernel's for it (read(2)), is
 * still found, at a send back and at the return, where its pages go and
 * the protection with them; the next loans read the owner's bytes, and two
 * unwritten returns protect it again.  A forked child checks its pages by
 * their kind (the protection is its parent's).  The same with the
 * protection off (a kernel without it), and no fd left behind. */
TEST_IMPL(channel_sealed_block_write_protected_while_unwritten) {
  const size_t S = 2 * MiB;
  int fds0 = bh_test_fd_count();
  for (int wp_off = 0; wp_off < 2; wp_off++) {
    bh__range_clean_wp_off(wp_off);
    bh_channel *a, *b;
    bh_block *x, *seen, *found;
    bh_buf v;
    sealed_pair(&a, &b, S, &x, &v);
    /* What the peer does with each loan: 0 reads, 1 writes a byte, 2 has
     * read(2) write two, 3 reads and forks a child that writes. */
    static const int what[] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 3, 0};
    int protected = 0, clean = 0;
    for (size_t loan = 0; loan < sizeof what / sizeof *what; loan++) {
      bh_frame f;
      int rc;
      uint64_t off;
      ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 1, v.data, v.len, &x, 1));
      ASSERT_OK(bh_test_recv(b, &f, 5000));
      ASSERT_EQ(claim_refs(b, &f, &seen, 1, &rc), 1);
      bh_channel_frame_done(b, &f);
      uint8_t *in_b = bh_block_addr(seen);
      ASSERT_EQ(bh__block_write_protected(seen), protected);
      /* Registered only while protected: a registered range is faulted in
       * a page at a time. */
      ASSERT_EQ(vma_uffd_wp(in_b), protected);
      unsigned sum = 0;
      for (size_t i = 0; i < S; i += 4096) sum += in_b[i];
      ASSERT_UEQ(sum, 0x5cu * (S / 4096));
      ASSERT_EQ(in_b[S / 2 + 7], 0x5c); /* the owner's bytes, whatever was written before */
      ASSERT_EQ(in_b[S - 100], 0x5c);
      if (what[loan] == 1) in_b[S / 2 + 7] = 0x77;
      if (what[loan] == 2) {
        int pfd[2];
        ASSERT_EQ(pipe(pfd), 0);
        ASSERT_EQ(write(pfd[1], "xy", 2), 2);
        ASSERT_EQ(read(pfd[0], in_b + S - 100, 2), 2);
        close(pfd[0]);
        close(pfd[1]);
      }
      if (what[loan] == 3) {
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
          int ok = !bh__block_write_protected(seen);
          ok = ok && bh_channel_peer_find(b, in_b, S, &found, &off) == 0;
          if (ok) bh_block_unref(found);
          in_b[5] = 1; /* the child's page, not the parent's */
          ok = ok && bh_channel_peer_find(b, in_b, S, &found, &off) == -ENOENT;
          _exit(ok ? 0 : 1);
        }
        int st;
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
        ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        ASSERT_EQ(in_b[5], 0x5c);
      }
      rc = bh_channel_peer_find(b, in_b, S, &found, &off);
      if (what[loan] == 1 || what[loan] == 2) {
        ASSERT_RC(rc, -ENOENT);
        ASSERT_OK(bh_channel_peer_find(b, in_b, S / 2, &found, &off)); /* the half before the write */
      } else {
        ASSERT_OK(rc);
      }
      bh_block_unref(found);
      bh_block_unref(seen);
      carry_notes(b, a);
      if (what[loan] == 1 || what[loan] == 2) protected = clean = 0;
      else if (++clean >= 2) protected = !wp_off;
    }
    bh_buf_free(&v);
    bh_block_unref(x);
    bh_channel_close(a);
    bh_channel_close(b);
  }
  bh__range_clean_wp_off(0);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A sealed block (bh_channel_block_acquire_sealed), for a tensor sent
 * again unchanged: the owner fills it through its own mapping after the
 * seal; the peer maps it copy-on-write, so its write stays its own and is
 * dropped when it returns the block, and the next loan reads the owner's
 * bytes; it is found to send back only while unwritten there; lent, it is
 * not lent again; free again, it is reused, sealed acquires first. */
TEST_IMPL(channel_sealed_block_is_copy_on_write_per_loan) {
  const size_t S = 1 * MiB;
  int fds0 = bh_test_fd_count();
  bh_channel *a, *b;
  bh_block *x, *seen, *found;
  bh_buf v;
  sealed_pair(&a, &b, S, &x, &v);
  bh_frame f;
  int rc;
  uint64_t zero = 0, len = S, off;
  ASSERT_UEQ(stats_of(a).sealed_blocks, 1);
  for (int loan = 0; loan < 3; loan++) {
    ASSERT_EQ(bh_block_is_lent(x), 0);
    ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 1, v.data, v.len, &x, 1));
    ASSERT_EQ(bh_block_is_lent(x), 1);
    ASSERT_RC(bh_test_send(a, BH_KIND_CALL, 1, v.data, v.len, &x, 1), -EBUSY); /* once at a time */
    ASSERT_OK(bh_test_recv(b, &f, 5000));
    ASSERT_EQ(f.h.fd_count, loan == 0 ? 1 : 0);
    ASSERT_EQ(claim_refs(b, &f, &seen, 1, &rc), 1);
    bh_channel_frame_done(b, &f);
    uint8_t *in_b = bh_block_addr(seen);
    ASSERT_EQ(in_b[0], 0x5c);
    ASSERT_EQ(in_b[S - 1], 0x5c);
    ASSERT_OK(bh_channel_peer_find(b, in_b, S, &found, &off)); /* read only: the owner's bytes */
    bh_block_unref(found);
    memset(in_b, 0x77, S); /* the peer's write stays its own */
    ASSERT_EQ(((uint8_t *)bh_block_addr(x))[S / 2], 0x5c);
    ASSERT_RC(bh_channel_peer_find(b, in_b, S, &found, &off), -ENOENT);
    bh_block_unref(seen); /* its written pages go with the return */
    carry_notes(b, a);
  }
  bh_buf_free(&v);
  /* Free again, sealed: the next sealed acquire takes it (its bytes
   * rewritten here reach the peer, which dropped its own written pages). */
  bh_block_unref(x);
  bh_pool_stats s = stats_of(a);
  ASSERT_UEQ(s.free_blocks, 1);
  ASSERT_UEQ(s.sealed_blocks, 1);
  bh_block *z;
  ASSERT_OK(bh_channel_block_acquire_sealed(a, S, &z));
  ASSERT_EQ(z, x);
  memset(bh_block_addr(z), 0x66, S);
  v = refs_value(&z, &zero, &len, 1);
  ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 2, v.data, v.len, &z, 1));
  bh_buf_free(&v);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, &seen, 1, &rc), 1);
  bh_channel_frame_done(b, &f);
  ASSERT_EQ(((uint8_t *)bh_block_addr(seen))[0], 0x66);
  ASSERT_EQ(((uint8_t *)bh_block_addr(seen))[S - 1], 0x66);
  bh_block_unref(seen);
  carry_notes(b, a);
  bh_block_unref(z);
  /* A free block the peer mapped shared is not sealed for this: a fresh one is. */
  bh_block *y;
  ASSERT_OK(bh_channel_block_acquire(a, S, &y)); /* takes x/z back: any free block */
  ASSERT_EQ(y, x);
  bh_block *w;
  ASSERT_OK(bh_channel_block_acquire(a, S, &w)); /* a new, ordinary one */
  bh_block_unref(y);
  v = refs_value(&w, &zero, &len, 1);
  ASSERT_OK(bh_test_send(a, BH_KIND_CALL, 3, v.data, v.len, &w, 1));
  bh_buf_free(&v);
  bh_block_unref(w);
  ASSERT_OK(bh_test_recv(b, &f, 5000));
  ASSERT_EQ(claim_refs(b, &f, &seen, 1, &rc), 1);
  bh_channel_frame_done(b, &f);
  bh_block_unref(seen);
  carry_notes(b, a); /* w is free again, mapped by the peer (shared) */
  ASSERT_OK(bh_channel_block_acquire_sealed(a, S, &z));
  ASSERT_EQ(z, x); /* the sealed one, not w */
  bh_block *z2;
  ASSERT_OK(bh_channel_block_acquire_sealed(a, S, &z2)); /* x taken, w mapped shared: a new one */
  ASSERT_NE(z2, w);
  ASSERT_NE(z2, x);
  ASSERT_OK(bh_channel_block_acquire(a, S, &y));
  ASSERT_EQ(y, w); /* an ordinary acquire reuses it */
  bh_block_unref(y);
  bh_block_unref(z2);
  bh_block_unref(z);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}
