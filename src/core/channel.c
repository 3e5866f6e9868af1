/*
 * channel.c -- framed messages over a SOCK_SEQPACKET socketpair.
 *
 * One sendmsg is one frame:
 *
 *   [bh_frame_header, 32 bytes][block section][value]     + SCM_RIGHTS fds
 *
 * The block section carries the pool's bookkeeping (see shm.c):
 *   u32 n_intro, u32 n_return, u32 n_retire, u32 n_lend,
 *   n_intro x (u32 id, u64 size)   own blocks mapped by the peer from now on;
 *                                  their fds are the first n_intro fds
 *   n_return x u32 id              peer blocks we no longer hold; the top
 *                                  bit (BH__RETURN_SPENT, protocol 10) set
 *                                  where this side forwarded the block to a
 *                                  third process, which got its memfd: the
 *                                  owner retires it, never reuses it
 *   n_retire x u32 id              own blocks destroyed; the peer unmaps
 *   n_lend x (u32 id, u64 size)    own blocks this frame lends (ids strictly
 *                                  ascending): the only blocks its value's
 *                                  tensor refs may name (protocol 5)
 * A tensor ref may also name a block of the receiver's own, one it lent
 * this side and has not had back (BH_BLOCK_BACK | id, protocol 6): a value
 * that came from the peer goes back by reference, unlisted (nothing is
 * lent), checked against the receiver's pool as it is decoded.  An
 * introduced block may be a third process's that this side forwards (a
 * view of another channel's peer block, protocol 7): its memfd is sealed
 * against writes and the receiver maps it copy-on-write; to the frame
 * it is one more block lent (shm.c, bh__pool_forward).
 * A lent block is one the peer has mapped (introduced by this frame or an
 * earlier one) with exactly that size.  The refs into one block, in the
 * value's order, start at multiples of BH_ARENA_ALIGN, each at or after the
 * end of the one before, and end within the block: many small tensors share
 * one block (bh_arena_take) and every view of them is checked, zero-copy,
 * against the frame's list as it is decoded (bh_channel_frame_block).
 * A payload (section + value) larger than BH_FRAME_INLINE_MAX is written to
 * a memfd sealed against writes and passed as the last fd (SPILLED), so a
 * seqpacket message never exceeds the socket buffer and a peer can never
 * change a payload while we decode it.
 *
 * Every frame is checked before anything in it is used: sender uid (and pid
 * once known) from SCM_CREDENTIALS, header magic/version/kind/flags, sizes,
 * fd counts, MSG_TRUNC/MSG_CTRUNC.  The checks that look at bytes alone
 * (bh__frame_check, bh__section_parse) are pure functions, which is what
 * fuzz/fuzz_frame.c drives.  Every fd received is either kept or
 * closed, on every path.  Waits use SO_RCVTIMEO against an absolute
 * deadline; the peer's death shows as EOF at once.  A channel that knows
 * its peer's pid also holds a pidfd on it: a peer that died while a
 * process it forked still holds its end (so no EOF comes) reads as EOF all
 * the same, once nothing is left to receive.  Such a wait first blocks in
 * recvmsg alone for up to BH__SLICE_NS, as a reply usually comes within
 * it, and only then in poll() on both: a poll before every recvmsg was one
 * more syscall per frame, 1.3 us of a 10 us round trip on one CPU.
 */
#include "internal.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#define BH__HDR ((size_t)sizeof(bh_frame_header))
#define BH__NOTES_MAX 1024u
#define BH__FLAT_MAX 1024u /* frames up to this size are sent with send(), copied flat */
/* How long a wait that also watches the peer's pidfd blocks in recvmsg
 * alone before it polls on both: the longest a peer's death hidden by a
 * forked child goes unseen. */
#define BH__SLICE_NS (10 * 1000000ll)
/* One turn of the spin (a recvmsg and a yield) that took longer than this
 * ran another task. */
#define BH__YIELD_BUSY_NS (20 * 1000ll)
#define BH__CMSG_SPACE (CMSG_SPACE(sizeof(int) * BH_FRAME_FDS_MAX) + CMSG_SPACE(sizeof(struct ucred)))

_Static_assert(sizeof(bh_frame_header) == 32, "frame header is 32 bytes");

struct bh_channel {
  int fd;
  uid_t peer_uid;
  pid_t peer_pid;
  int peer_pidfd;      /* readable once peer_pid exited; -1: none (no pid, no pidfd_open) */
  bh_pool *pool;
  int64_t rcvtimeo_ns; /* what SO_RCVTIMEO is set to now; 0 = none */
  int64_t spin_ns;     /* poll before blocking; 0 = don't */
  uint32_t peer_cpu;   /* cpu hint of the peer's last frame (CPU + 1, 0 unknown) */
  uint8_t *rx;         /* header + inline payload */
  void *spill_addr;    /* payload of the frame being read, if spilled */
  size_t spill_len;
  bh__lend *lend;      /* the blocks the frame being read lends */
  uint32_t n_lend, cap_lend;
};

static const char *const bh__kind_names[] = {
    NULL, "HELLO", "CALL", "RESULT", "ERROR", "PROGRESS", "CALLBACK",
    "INTERRUPT", "RELEASE", "RESIDENCY", "BYE", "BLOCKS"};

const char *bh_kind_name(unsigned kind) {
  return kind >= 1 && kind <= BH_KIND_MAX_ ? bh__kind_names[kind] : NULL;
}

int bh_frame_header_check(const bh_frame_header *h) {
  if (h->magic != BH_FRAME_MAGIC) return -BH_EMAGIC;
  if (h->version != BH_PROTOCOL_VERSION) return -BH_EVERSION;
  if (h->kind < 1 || h->kind > BH_KIND_MAX_) return -BH_EKIND;
  if ((h->flags & ~(uint32_t)BH_FRAME_FLAGS_KNOWN_) || h->cpu > BH_FRAME_CPU_MAX) return -BH_EHEADER;
  if (h->fd_count > BH_FRAME_FDS_MAX) return -BH_EFDCOUNT;
  if (h->payload_bytes > BH_FRAME_PAYLOAD_MAX) return -BH_E2BIG;
  return 0;
}

/* A pidfd on pid (close-on-exec), or -1 when there is none to have (no
 * pid, an old kernel, the process already reaped). */
static int bh__peer_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  if (pid > 0) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0); /* pidfds are always close-on-exec */
    if (fd >= 0 && fd <= 2) {
      int hi = fcntl(fd, F_DUPFD_CLOEXEC, 3); /* keep stdio's numbers free (bh__close asserts) */
      close(fd);
      fd = hi;
    }
    return fd;
  }
#endif
  (void)pid;
  return -1;
}

int bh_channel_open(bh_channel **out, int fd, const bh_channel_opts *o) {
  int rc = -EINVAL, one = 1, sndbuf = 1 << 20;
  bh_channel *c = NULL;
  if (!out || fd <= 2 || !o) goto err;
  c = calloc(1, sizeof *c);
  if (!c) {
    rc = -ENOMEM;
    goto err;
  }
  c->fd = fd;
  c->peer_pidfd = -1;
  /* A worker's fd came through exec without FD_CLOEXEC; what the worker
   * execs must not hold the channel open after the worker dies. */
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
    rc = -errno;
    goto err;
  }
  c->peer_uid = o->peer_uid;
  c->peer_pid = o->peer_pid;
  c->peer_pidfd = bh__peer_pidfd(o->peer_pid);
  c->spin_ns = o->spin_ns < 0 ? 0 : o->spin_ns ? o->spin_ns : 100000;
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2) c->spin_ns = 0;
  c->rx = malloc(BH__HDR + BH_FRAME_INLINE_MAX);
  if (!c->rx) {
    rc = -ENOMEM;
    goto err;
  }
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0) {
    rc = -errno;
    goto err;
  }
  /* Best effort: a bigger send buffer only means fewer waits. */
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  struct timeval tv = {.tv_sec = 30};
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  rc = bh__pool_open(&c->pool, o->pool_keep_bytes, o->forward);
  if (rc) goto err;
  *out = c;
  return 0;
err:
  if (c) {
    if (c->peer_pidfd >= 0) bh__close(c->peer_pidfd);
    free(c->rx);
  }
  free(c);
  if (fd > 2) bh__close(fd);
  return rc;
}

void bh_channel_close(bh_channel *c) {
  if (!c) return;
  bh_channel_frame_done(c, NULL);
  if (c->fd >= 0) bh__close(c->fd);
  if (c->peer_pidfd >= 0) bh__close(c->peer_pidfd);
  bh__pool_close(c->pool);
  free(c->lend);
  free(c->rx);
  free(c);
}

int bh_channel_fd(const bh_channel *c) { return c->fd; }
bh_pool *bh_channel_pool(bh_channel *c) { return c->pool; }
void bh_channel_set_peer_pid(bh_channel *c, pid_t pid) {
  if (pid == c->peer_pid) return;
  if (c->peer_pidfd >= 0) bh__close(c->peer_pidfd);
  c->peer_pid = pid;
  c->peer_pidfd = bh__peer_pidfd(pid);
}

int bh_channel_block_acquire(bh_channel *c, size_t nbytes, bh_block **out) {
  if (!c) return -EINVAL;
  return bh__pool_acquire(c->pool, nbytes, out);
}

int bh_channel_block_acquire_sealed(bh_channel *c, size_t nbytes, bh_block **out) {
  if (!c) return -EINVAL;
  return bh__pool_acquire_sealed(c->pool, nbytes, out);
}

int bh_channel_peer_block(bh_channel *c, uint32_t id, bh_block **out) {
  if (!c || !out) return -EINVAL;
  return bh__pool_peer_get(c->pool, id, out);
}

int bh_channel_frame_block(bh_channel *c, const bh_tensor_ref *t, bh_block **out) {
  if (!c || !t || !out || t->block == BH_BLOCK_NONE || t->block == BH_BLOCK_INLINE) return -EINVAL;
  if (t->block & BH_BLOCK_BACK) return bh__pool_back_get(c->pool, t, out);
  int i = bh__lend_claim(c->lend, c->n_lend, t);
  if (i < 0) return i;
  return bh__pool_peer_get(c->pool, t->block, out);
}

int bh_channel_peer_find(bh_channel *c, const void *addr, uint64_t nbytes, bh_block **out,
                         uint64_t *offset) {
  if (!c || !addr || !nbytes || !out || !offset) return -EINVAL;
  int rc = bh__pool_peer_find(c->pool, addr, nbytes, out, offset);
  if (rc == -ENOENT) rc = bh__pool_forward(c->pool, addr, nbytes, out, offset);
  return rc;
}

/* ---- send ---- */

#define BH__SECTION_HEAD 16u

static size_t bh__section_len(uint32_t n_intro, uint32_t n_ret, uint32_t n_retire, uint32_t n_lend) {
  return BH__SECTION_HEAD + ((size_t)n_intro + n_lend) * 12 + ((size_t)n_ret + n_retire) * 4;
}

/* The blocks one frame introduces and lends, for its section. */
typedef struct {
  bh_block *const *intro;
  uint32_t n_intro;
  bh_block *const *lend; /* ids ascending */
  uint32_t n_lend;
} bh__frame_blocks;

static void bh__section_write(uint8_t *p, const bh__frame_blocks *fb, const uint32_t *ret,
                              uint32_t n_ret, const uint32_t *retire, uint32_t n_retire) {
  bh__put_u32(p, fb->n_intro);
  bh__put_u32(p + 4, n_ret);
  bh__put_u32(p + 8, n_retire);
  bh__put_u32(p + 12, fb->n_lend);
  p += BH__SECTION_HEAD;
  for (uint32_t i = 0; i < fb->n_intro; i++, p += 12) {
    bh__put_u32(p, fb->intro[i]->id);
    bh__put_u64(p + 4, fb->intro[i]->size);
  }
  for (uint32_t i = 0; i < n_ret; i++, p += 4) bh__put_u32(p, ret[i]);
  for (uint32_t i = 0; i < n_retire; i++, p += 4) bh__put_u32(p, retire[i]);
  for (uint32_t i = 0; i < fb->n_lend; i++, p += 12) {
    bh__put_u32(p, fb->lend[i]->id);
    bh__put_u64(p + 4, fb->lend[i]->size);
  }
}

/* Writes the payload into a memfd sealed against writes; returns its fd. */
static int bh__spill(const uint8_t *sec, size_t sec_len, const uint8_t *val, size_t val_len, int *fd_out) {
  int fd = -1, rc;
  rc = bh__memfd_create("bulkhead-spill", sec_len + val_len, &fd, NULL);
  if (rc) return rc;
  const uint8_t *parts[2] = {sec, val};
  size_t lens[2] = {sec_len, val_len};
  off_t off = 0;
  for (int k = 0; k < 2; k++) {
    size_t done = 0;
    while (done < lens[k]) {
      ssize_t n = pwrite(fd, parts[k] + done, lens[k] - done, off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) goto err;
      done += (size_t)n;
      off += n;
    }
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0) goto err;
  *fd_out = fd;
  return 0;
err:
  rc = errno ? -errno : -EIO;
  bh__close(fd);
  return rc;
}

static int bh__sendmsg(int fd, const struct iovec *iov, int iovcnt, const int *fds, uint32_t nfds) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * BH_FRAME_FDS_MAX)];
    struct cmsghdr align;
  } u;
  struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
  if (nfds) {
    memset(u.buf, 0, sizeof u.buf);
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
  }
  /* A small frame without fds goes as one buffer through send(): the
   * kernel's msghdr and iovec handling cost more than copying it here. */
  char flat[BH__FLAT_MAX];
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  int use_flat = !nfds && total <= sizeof flat;
  if (use_flat) {
    char *p = flat;
    for (int i = 0; i < iovcnt; i++) {
      if (iov[i].iov_len) memcpy(p, iov[i].iov_base, iov[i].iov_len);
      p += iov[i].iov_len;
    }
  }
  for (;;) {
    ssize_t n = use_flat ? send(fd, flat, total, MSG_NOSIGNAL) : sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (n >= 0) return 0;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -ETIMEDOUT;
    if (errno == EPIPE || errno == ECONNRESET) return -BH_EEOF;
    return -errno;
  }
}

/* The CPU this thread runs on, + 1 (0 when unknown), for the header. */
static uint32_t bh__cpu_hint(void) {
  int cpu = sched_getcpu();
  return cpu >= 0 && (uint32_t)cpu < BH_FRAME_CPU_MAX ? (uint32_t)cpu + 1 : 0;
}

/* Sends one frame whose section introduces and lends fb's blocks and
 * carries the given notes. */
static int bh__send_frame(bh_channel *c, uint16_t kind, uint64_t req, const bh__frame_blocks *fb,
                          const uint32_t *ret, uint32_t n_ret, const uint32_t *retire,
                          uint32_t n_retire, const uint8_t *value, size_t value_len) {
  uint32_t n_intro = fb->n_intro;
  size_t sec_len = bh__section_len(n_intro, n_ret, n_retire, fb->n_lend);
  uint8_t small[256]; /* a frame without bookkeeping: no malloc */
  uint8_t *sec = sec_len <= sizeof small ? small : malloc(sec_len);
  int fds[BH_FRAME_FDS_MAX];
  int spill_fd = -1, rc;
  if (!sec) return -ENOMEM;
  bh__section_write(sec, fb, ret, n_ret, retire, n_retire);
  if (value_len > BH_FRAME_PAYLOAD_MAX - sec_len) {
    rc = -BH_E2BIG;
    goto out;
  }
  bh_frame_header h = {.magic = BH_FRAME_MAGIC,
                       .version = BH_PROTOCOL_VERSION,
                       .kind = kind,
                       .request_id = req,
                       .payload_bytes = (uint32_t)(sec_len + value_len),
                       .fd_count = n_intro,
                       .cpu = bh__cpu_hint()};
  for (uint32_t i = 0; i < n_intro; i++) fds[i] = bh__block_intro_fd(fb->intro[i]);
  struct iovec iov[3] = {{&h, BH__HDR}, {sec, sec_len}, {(void *)value, value_len}};
  int iovcnt = value_len ? 3 : 2;
  if (sec_len + value_len > BH_FRAME_INLINE_MAX) {
    rc = bh__spill(sec, sec_len, value, value_len, &spill_fd);
    if (rc) goto out;
    h.flags |= BH_FRAME_SPILLED;
    fds[h.fd_count++] = spill_fd;
    iovcnt = 1;
  }
  rc = bh__sendmsg(c->fd, iov, iovcnt, fds, h.fd_count);
out:
  if (spill_fd >= 0) bh__close(spill_fd);
  if (sec != small) free(sec);
  return rc;
}

static int bh__by_id(const void *a, const void *b) {
  uint32_t x = (*(bh_block *const *)a)->id, y = (*(bh_block *const *)b)->id;
  return x < y ? -1 : x > y;
}

int bh_channel_send(bh_channel *c, const bh_msg *m) {
  if (!c || !m || !bh_kind_name(m->kind) || (m->n_blocks && !m->blocks)) return -EINVAL;
  bh_block **intro = NULL, **lend = NULL;
  uint32_t n_intro = 0, n_lend = 0, n_lent = 0;
  uint32_t notes[2 * BH__NOTES_MAX], n_ret = 0, n_retire = 0; /* 8 KiB: no malloc per frame */
  int rc = 0;
  if (m->n_blocks) {
    intro = malloc(sizeof *intro * m->n_blocks);
    lend = malloc(sizeof *lend * m->n_blocks);
    if (!intro || !lend) {
      free(intro);
      free(lend);
      return -ENOMEM;
    }
    /* The lend list: each block once (listed twice: one loan), ids
     * ascending, as the receiver requires. */
    memcpy(lend, m->blocks, sizeof *lend * m->n_blocks);
    qsort(lend, m->n_blocks, sizeof *lend, bh__by_id);
    for (uint32_t i = 0; i < m->n_blocks; i++)
      if (n_lend == 0 || lend[n_lend - 1] != lend[i]) lend[n_lend++] = lend[i];
    if (n_lend > BH__PEER_BLOCKS_MAX) { /* more than the peer maps: the pool never has so many */
      rc = -BH_EPOOLFULL;
      goto rollback;
    }
  }
  for (; n_lent < n_lend; n_lent++) {
    int needs_fd = 0;
    rc = bh__pool_lend(c->pool, lend[n_lent], &needs_fd);
    if (rc) goto rollback;
    if (needs_fd) intro[n_intro++] = lend[n_lent];
  }
  bh__pool_take_notes(c->pool, notes, &n_ret, notes + BH__NOTES_MAX, &n_retire, BH__NOTES_MAX);
  /* Introductions beyond one frame's fds go first in BLOCKS frames. */
  uint32_t sent = 0, per = BH_FRAME_FDS_MAX - 1;
  while (n_intro - sent > per) {
    bh__frame_blocks fb = {.intro = intro + sent, .n_intro = per};
    rc = bh__send_frame(c, BH_KIND_BLOCKS, 0, &fb, NULL, 0, NULL, 0, NULL, 0);
    if (rc) goto rollback;
    sent += per;
  }
  /* intro is NULL without blocks, and NULL + 0 is undefined in C. */
  bh__frame_blocks fb = {.intro = intro ? intro + sent : NULL, .n_intro = n_intro - sent,
                         .lend = lend, .n_lend = n_lend};
  rc = bh__send_frame(c, m->kind, m->request_id, &fb, notes, n_ret, notes + BH__NOTES_MAX,
                      n_retire, m->value, m->value_len);
  if (rc) goto rollback;
  if (n_intro) bh__pool_introduced(c->pool, intro, n_intro);
  free(intro);
  free(lend);
  return 0;
rollback:
  /* The peer never saw these loans; give the references back.  Notes taken
   * are dropped: a failed send means the peer is gone. */
  for (uint32_t i = 0; i < n_lent; i++) bh__pool_returned(c->pool, lend[i]->id);
  for (uint32_t i = 0; i < n_intro; i++) intro[i]->peer_mapped = 0;
  free(intro);
  free(lend);
  return rc;
}

/* ---- receive ---- */

static void bh__close_fds(int *fds, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    if (fds[i] > 2) bh__close(fds[i]);
}

/* Whether an SO_RCVTIMEO of `have` ns (0: none) serves a wait of `want`
 * ns (0: forever) without a setsockopt: it may wake up to 1% + 1 ms early
 * (the wait then goes round once more) and at most 1 ms late.  A much
 * shorter setting left by an earlier short wait is NOT kept: it would turn
 * a long wait into a loop of early wake-ups. */
int bh__rcvtimeo_keep(int64_t have, int64_t want) {
  if (want == 0 || have == 0) return have == want;
  return have <= want + 1000000 && have >= want - (want / 100 + 1000000);
}

/* Sets SO_RCVTIMEO so a blocking recvmsg wakes no later than about the
 * deadline (see bh__rcvtimeo_keep). */
static int bh__arm_timeout(bh_channel *c, int64_t deadline_ns) {
  int64_t want = 0;
  if (deadline_ns >= 0) {
    want = deadline_ns - bh_now_ns();
    if (want <= 0) return -ETIMEDOUT;
    if (want < 1000) want = 1000; /* 0 would mean forever */
  }
  if (bh__rcvtimeo_keep(c->rcvtimeo_ns, want)) return 0;
  struct timeval tv = {.tv_sec = want / 1000000000, .tv_usec = (want % 1000000000) / 1000};
  if (want && tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) return -errno;
  c->rcvtimeo_ns = want;
  return 0;
}

int bh__frame_check(const uint8_t *msg, size_t n, uint32_t n_fds, bh_frame_header *h) {
  if (n < BH__HDR) return -BH_ESHORT;
  memcpy(h, msg, BH__HDR);
  int rc = bh_frame_header_check(h);
  if (rc) return rc;
  if (h->fd_count != n_fds) return -BH_EFDCOUNT;
  size_t inline_len = n - BH__HDR;
  if (h->flags & BH_FRAME_SPILLED) {
    /* The payload is the last fd's: nothing inline, and something there. */
    if (n_fds == 0 || inline_len != 0 || h->payload_bytes == 0) return -BH_ESHORT;
  } else if (inline_len != h->payload_bytes) {
    return -BH_ESHORT;
  }
  return 0;
}

int bh__section_parse(const uint8_t *p, size_t len, uint32_t n_fds, bh__section *s) {
  if (len < BH__SECTION_HEAD) return -BH_EBLOCKSEC;
  uint32_t n_intro = bh__get_u32(p), n_ret = bh__get_u32(p + 4), n_retire = bh__get_u32(p + 8);
  uint32_t n_lend = bh__get_u32(p + 12);
  if (n_intro > BH_FRAME_FDS_MAX || n_ret > BH__NOTES_MAX || n_retire > BH__NOTES_MAX ||
      n_lend > BH__PEER_BLOCKS_MAX)
    return -BH_EBLOCKSEC;
  size_t need = bh__section_len(n_intro, n_ret, n_retire, n_lend);
  if (need > len) return -BH_EBLOCKSEC;
  if (n_intro != n_fds) return -BH_EFDCOUNT;
  s->n_intro = n_intro;
  s->n_return = n_ret;
  s->n_retire = n_retire;
  s->n_lend = n_lend;
  s->intro = p + BH__SECTION_HEAD;
  s->returns = s->intro + (size_t)n_intro * 12;
  s->retires = s->returns + (size_t)n_ret * 4;
  s->lend = s->retires + (size_t)n_retire * 4;
  s->len = need;
  /* Block ids stay below BH_BLOCK_BACK: a back ref to one is unambiguous. */
  for (uint32_t i = 0; i < n_intro; i++)
    if (bh__get_u32(s->intro + (size_t)i * 12) & BH_BLOCK_BACK) return -BH_EBLOCKSEC;
  /* Strictly ascending: no block twice, and a ref finds its block by a
   * binary search. */
  for (uint32_t i = 0; i < n_lend; i++) {
    const uint8_t *q = s->lend + (size_t)i * 12;
    if (bh__get_u64(q + 4) == 0 || (bh__get_u32(q) & BH_BLOCK_BACK)) return -BH_EBLOCKSEC;
    if (i && bh__get_u32(q) <= bh__get_u32(q - 12)) return -BH_EBLOCKSEC;
  }
  return 0;
}

void bh__lend_load(const bh__section *s, bh__lend *l) {
  for (uint32_t i = 0; i < s->n_lend; i++) {
    const uint8_t *q = s->lend + (size_t)i * 12;
    l[i].id = bh__get_u32(q);
    l[i].size = bh__get_u64(q + 4);
    l[i].end = 0;
  }
}

int bh__lend_claim(bh__lend *l, uint32_t n, const bh_tensor_ref *t) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (l[mid].id < t->block) lo = mid + 1;
    else hi = mid;
  }
  if (lo == n || l[lo].id != t->block) return -BH_EBLOCK;
  bh__lend *e = &l[lo];
  if (t->offset % BH_ARENA_ALIGN || t->offset < e->end || t->offset > e->size ||
      t->nbytes > e->size - t->offset)
    return -BH_ETENSOR;
  e->end = t->offset + t->nbytes; /* > 0: a block ref has bytes */
  return (int)lo;
}

int bh__section_apply(bh_pool *pool, const bh__section *s, int *fds) {
  int rc = 0, r;
  for (uint32_t i = 0; i < s->n_intro; i++) {
    const uint8_t *q = s->intro + (size_t)i * 12;
    r = bh__pool_adopt(pool, bh__get_u32(q), fds[i], bh__get_u64(q + 4));
    fds[i] = -1; /* consumed either way */
    if (r && !rc) rc = r;
  }
  for (uint32_t i = 0; i < s->n_return; i++)
    if ((r = bh__pool_returned(pool, bh__get_u32(s->returns + (size_t)i * 4))) && !rc) rc = r;
  for (uint32_t i = 0; i < s->n_retire; i++)
    if ((r = bh__pool_retire_peer(pool, bh__get_u32(s->retires + (size_t)i * 4))) && !rc) rc = r;
  return rc;
}

/* One recvmsg; fills the header and the fds.  On any error every fd
 * received has been closed. */
static int bh__recv_one(bh_channel *c, bh_frame *f, int *fds, uint32_t *n_fds, int flags) {
  union {
    char buf[BH__CMSG_SPACE];
    struct cmsghdr align;
  } u;
  struct iovec iov = {c->rx, BH__HDR + BH_FRAME_INLINE_MAX};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | flags);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -ETIMEDOUT;
    if (errno == ECONNRESET) return -BH_EEOF;
    return -errno;
  }
  int have_cred = 0, rc = 0;
  struct ucred cred = {0};
  *n_fds = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET) continue;
    if (cm->cmsg_type == SCM_RIGHTS) {
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char *data = CMSG_DATA(cm);
      for (size_t i = 0; i < k; i++) {
        int one;
        memcpy(&one, data + i * sizeof(int), sizeof(int));
        if (*n_fds < BH_FRAME_FDS_MAX) fds[(*n_fds)++] = one;
        else bh__close(one), rc = -BH_EFDCOUNT;
      }
    } else if (cm->cmsg_type == SCM_CREDENTIALS && cm->cmsg_len >= CMSG_LEN(sizeof cred)) {
      memcpy(&cred, CMSG_DATA(cm), sizeof cred);
      have_cred = 1;
    }
  }
  if (n == 0 && *n_fds == 0 && !(mh.msg_flags & MSG_CTRUNC)) return -BH_EEOF;
  if (!rc && (mh.msg_flags & MSG_CTRUNC)) rc = -BH_ECTRUNC;
  if (!rc && (mh.msg_flags & MSG_TRUNC)) rc = -BH_E2BIG;
  if (!rc && (!have_cred || cred.uid != c->peer_uid || (c->peer_pid && cred.pid != c->peer_pid)))
    rc = -BH_EPEERCRED;
  if (!rc) rc = bh__frame_check(c->rx, (size_t)n, *n_fds, &f->h);
  if (rc) {
    bh__close_fds(fds, *n_fds);
    *n_fds = 0;
    return rc;
  }
  f->sender_pid = cred.pid;
  c->peer_cpu = f->h.cpu;
  return 0;
}

void bh_channel_frame_done(bh_channel *c, bh_frame *f) {
  if (c->spill_addr) munmap(c->spill_addr, c->spill_len);
  c->spill_addr = NULL;
  c->spill_len = 0;
  c->n_lend = 0;
  if (f) f->value = NULL, f->value_len = 0;
}

/* Waits until the socket is readable (0), the deadline passes
 * (-ETIMEDOUT), a signal arrives (-EINTR) or the peer process is gone
 * with nothing left to read (-BH_EEOF), in poll() on the socket and the
 * peer's pidfd. */
static int bh__wait_peer(bh_channel *c, int64_t deadline_ns) {
  for (;;) {
    int ms = -1;
    if (deadline_ns >= 0) {
      int64_t left = deadline_ns - bh_now_ns();
      if (left <= 0) return -ETIMEDOUT;
      ms = left > (int64_t)INT32_MAX * 1000000 ? INT32_MAX : (int)((left + 999999) / 1000000);
    }
    struct pollfd pf[2] = {{c->fd, POLLIN, 0}, {c->peer_pidfd, POLLIN, 0}};
    int r = poll(pf, 2, ms);
    if (r < 0) return -errno; /* -EINTR too: the caller checks its signals, as after recvmsg */
    if (pf[0].revents) return 0; /* a frame, EOF or an error: recvmsg says which */
    if (pf[1].revents) {
      /* Dead: what it sent before dying is still read first. */
      pf[0].revents = 0;
      if (poll(pf, 1, 0) > 0 && pf[0].revents) return 0;
      return -BH_EEOF;
    }
  }
}

/* Keeps the lend list of the frame just applied for bh_channel_frame_block:
 * each block must be mapped here with the size the frame says. */
static int bh__frame_lend_load(bh_channel *c, const bh__section *s) {
  c->n_lend = 0;
  if (s->n_lend > c->cap_lend) {
    bh__lend *l = realloc(c->lend, sizeof *l * s->n_lend);
    if (!l) return -ENOMEM;
    c->lend = l;
    c->cap_lend = s->n_lend;
  }
  bh__lend_load(s, c->lend);
  int rc = bh__pool_peer_check(c->pool, c->lend, s->n_lend);
  if (rc == 0) c->n_lend = s->n_lend;
  return rc;
}

int bh_channel_recv(bh_channel *c, bh_frame *f, int64_t deadline_ns) {
  if (!c || !f) return -EINVAL;
  bh_channel_frame_done(c, f);
  int sliced = 0; /* the wait's first slice in recvmsg alone is spent */
  for (;;) {
    int fds[BH_FRAME_FDS_MAX];
    uint32_t n_fds = 0;
    bh__section sec;
    int rc = -ETIMEDOUT;
    /* A reply usually comes within microseconds: catching it awake is
     * much cheaper than being woken for it on another CPU.  But a peer
     * that last sent from this CPU will most likely run here again, and
     * then spinning only delays it: blocking hands it the CPU at once. */
    if (c->spin_ns && !sliced && !(c->peer_cpu && c->peer_cpu == bh__cpu_hint())) {
      int64_t t = bh_now_ns(), until = t + c->spin_ns;
      do {
        rc = bh__recv_one(c, f, fds, &n_fds, MSG_DONTWAIT);
        if (rc != -ETIMEDOUT) break;
        sched_yield();
        /* Another task ran in the yield: this CPU is wanted.  A spinner
         * yielding to it would see the reply only when the scheduler
         * comes back to it; blocked, it is woken by the reply. */
        int64_t then = t;
        t = bh_now_ns();
        if (t - then > BH__YIELD_BUSY_NS) break;
      } while (t < until);
    }
    /* A deadline already past (serve(0): "what is pending") still reads a
     * frame that is there: the waits below give up at once, and a reader
     * polling the socket would see it readable forever (issue 16). */
    if (rc == -ETIMEDOUT && deadline_ns >= 0 && bh_now_ns() >= deadline_ns) {
      rc = bh__recv_one(c, f, fds, &n_fds, MSG_DONTWAIT);
      if (rc == -ETIMEDOUT) return rc;
    }
    if (rc == -ETIMEDOUT && c->peer_pidfd >= 0 && !sliced) {
      /* One syscall, as with no pidfd, for the reply that comes soon; a
       * wait that outlasts the slice goes on in poll() below. */
      sliced = 1;
      int64_t until = bh_now_ns() + BH__SLICE_NS;
      if (deadline_ns >= 0 && deadline_ns < until) until = deadline_ns;
      rc = bh__arm_timeout(c, until);
      if (!rc) rc = bh__recv_one(c, f, fds, &n_fds, 0);
      if (rc == -ETIMEDOUT) continue; /* the deadline is checked above */
    } else if (rc == -ETIMEDOUT && c->peer_pidfd >= 0) {
      rc = bh__wait_peer(c, deadline_ns);
      if (rc) return rc;
      rc = bh__recv_one(c, f, fds, &n_fds, MSG_DONTWAIT);
      if (rc == -ETIMEDOUT) continue; /* readable, then not: wait again */
    } else if (rc == -ETIMEDOUT) {
      rc = bh__arm_timeout(c, deadline_ns);
      if (rc) return rc;
      rc = bh__recv_one(c, f, fds, &n_fds, 0);
      /* SO_RCVTIMEO may be shorter than what is left: wait again. */
      if (rc == -ETIMEDOUT && (deadline_ns < 0 || bh_now_ns() < deadline_ns)) continue;
    }
    if (rc) return rc;
    const uint8_t *payload = c->rx + BH__HDR;
    size_t payload_len = f->h.payload_bytes;
    if (f->h.flags & BH_FRAME_SPILLED) {
      /* bh__frame_check saw the fd there and nothing inline. */
      int sfd = fds[--n_fds];
      rc = bh__memfd_check(sfd, payload_len);
      if (!rc && !(fcntl(sfd, F_GET_SEALS) & F_SEAL_WRITE)) rc = -BH_ESEALS;
      if (!rc) {
        void *a = mmap(NULL, payload_len, PROT_READ, MAP_PRIVATE, sfd, 0);
        if (a == MAP_FAILED) rc = -errno;
        else c->spill_addr = a, c->spill_len = payload_len, payload = a;
      }
      bh__close(sfd);
    }
    if (!rc) rc = bh__section_parse(payload, payload_len, n_fds, &sec);
    if (!rc) rc = bh__section_apply(c->pool, &sec, fds);
    bh__close_fds(fds, n_fds); /* adopted ones are -1 already */
    if (!rc) rc = bh__frame_lend_load(c, &sec);
    if (rc) {
      bh_channel_frame_done(c, f);
      return rc;
    }
    if (f->h.kind == BH_KIND_BLOCKS) {
      bh_channel_frame_done(c, f);
      continue;
    }
    f->value = payload + sec.len;
    f->value_len = payload_len - sec.len;
    return 0;
  }
}
