/*
 * helpers.c -- channel helpers the channel, shm and supervisor tests share
 * (declared in task.h): a channel pair, a channel facing a raw socket, and
 * frames written by hand.
 *
 * Hand-written frames follow channel.c: a 32-byte little-endian header
 * (bh_frame_header), then the payload: the block section (u32 n_intro,
 * u32 n_return, u32 n_retire, u32 n_lend and their entries) followed by
 * the value.
 */
#include "task.h"

#include <sys/socket.h>
#include <sys/uio.h>

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void bh_test_pair(bh_channel **a, bh_channel **b, size_t pool_keep_bytes) {
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = 0, .pool_keep_bytes = pool_keep_bytes};
  ASSERT_OK(bh_channel_open(a, sv[0], &o));
  ASSERT_OK(bh_channel_open(b, sv[1], &o));
}

void bh_test_raw_pair(bh_channel **c, int *raw) {
  int sv[2];
  ASSERT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  bh_channel_opts o = {.peer_uid = getuid()};
  ASSERT_OK(bh_channel_open(c, sv[0], &o));
  *raw = sv[1];
}

int bh_test_send(bh_channel *c, uint16_t kind, uint64_t req, const void *value, size_t len,
                 bh_block *const *blocks, uint32_t n_blocks) {
  bh_msg m = {.kind = kind, .request_id = req, .value = value, .value_len = len,
              .blocks = blocks, .n_blocks = n_blocks};
  return bh_channel_send(c, &m);
}

int bh_test_send_nil(bh_channel *c, uint64_t req) {
  static const uint8_t nil = BH_TAG_NIL;
  return bh_test_send(c, BH_KIND_RESULT, req, &nil, 1, NULL, 0);
}

int bh_test_recv(bh_channel *c, bh_frame *f, int timeout_ms) {
  int64_t deadline = timeout_ms < 0 ? -1 : bh_now_ns() + (int64_t)timeout_ms * 1000000;
  return bh_channel_recv(c, f, deadline);
}

void bh_test_header(uint8_t out[32], uint32_t magic, uint16_t version, uint16_t kind,
                    uint64_t req, uint32_t flags, uint32_t payload_bytes, uint32_t fd_count,
                    uint32_t cpu) {
  put_u32(out, magic);
  put_u16(out + 4, version);
  put_u16(out + 6, kind);
  put_u64(out + 8, req);
  put_u32(out + 16, flags);
  put_u32(out + 20, payload_bytes);
  put_u32(out + 24, fd_count);
  put_u32(out + 28, cpu);
}

ssize_t bh_test_raw_send(int fd, const void *a, size_t alen, const void *b, size_t blen,
                         const int *fds, int nfds) {
  struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = blen ? 2 : 1};
  union {
    char buf[CMSG_SPACE(sizeof(int) * 253)];
    struct cmsghdr align;
  } u;
  if (nfds > 0) {
    memset(u.buf, 0, sizeof u.buf);
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
  return n < 0 ? -errno : n;
}

void bh_test_raw_good(int fd, uint64_t req) {
  uint8_t hdr[32], payload[BH_TEST_SEC + 1] = {0};
  payload[BH_TEST_SEC] = BH_TAG_NIL;
  bh_test_header(hdr, BH_FRAME_MAGIC, BH_PROTOCOL_VERSION, BH_KIND_RESULT, req, 0,
                 sizeof payload, 0, 0);
  ASSERT_EQ(bh_test_raw_send(fd, hdr, sizeof hdr, payload, sizeof payload, NULL, 0),
            32 + BH_TEST_SEC + 1);
}

void bh_test_expect_good(bh_channel *c, uint64_t req) {
  bh_frame f;
  ASSERT_OK(bh_test_recv(c, &f, 5000));
  ASSERT_EQ(f.h.kind, BH_KIND_RESULT);
  ASSERT_UEQ(f.h.request_id, req);
  ASSERT_EQ(f.value_len, 1);
  ASSERT_EQ(f.value[0], BH_TAG_NIL);
  ASSERT_EQ(f.sender_pid, getpid());
  bh_channel_frame_done(c, &f);
}
