/*
 * internal.h -- declarations shared by the files of src/core/ and nothing
 * else.  Public names live in include/bulkhead/bulkhead.h.
 */
#ifndef BULKHEAD_INTERNAL_H
#define BULKHEAD_INTERNAL_H

#include "bulkhead/bulkhead.h"
#include "bulkhead/ledger.h"
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "Can't happen" branches: abort under BH_TESTING so tests see them. */
#ifdef BH_TESTING
#define BH__UNREACHABLE(what) bh__die(__FILE__, __LINE__, what)
#else
#define BH__UNREACHABLE(what) ((void)0)
#endif
void bh__die(const char *file, int line, const char *what) __attribute__((noreturn));

/* sandbox.c: runs fn(arg) on a thread of its own restricted to *s first
 * (what fn spawns execs inside the sandbox; the caller's thread is left
 * as it was).  Returns fn's result, or the sandbox's -errno (why says). */
int bh__sandbox_run(const bh_sandbox *s, int (*fn)(void *), void *arg, char *why, size_t why_n);

/* close() that keeps errno and refuses stdio fds. */
void bh__close(int fd);

/* Little-endian loads/stores on unaligned bytes. */
static inline void bh__put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void bh__put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void bh__put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t bh__get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t bh__get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t bh__get_u64(const uint8_t *p) {
  return (uint64_t)bh__get_u32(p) | (uint64_t)bh__get_u32(p + 4) << 32;
}

/* ---- shm.c: the block pool behind a channel ---- */

#define BH__KEEP_FREE_BLOCKS 64u  /* free own blocks a pool keeps for reuse */
#define BH__OWN_BLOCKS_MAX 256u   /* own blocks still holding their fd (not introduced yet), per pool */
/* Peer blocks one channel maps at once: a quarter of Linux's default
 * vm.max_map_count (65530), far more blocks than any value lends, and the
 * process keeps room for its own mappings.  Also what one frame may lend. */
#define BH__PEER_BLOCKS_MAX 16384u

struct bh_block {
  bh_pool *pool;
  uint32_t id;
  uint8_t own;         /* ours (1) or the peer's (0) */
  uint8_t peer_mapped; /* own: the peer has our fd mapped */
  int fd;              /* own: the memfd until the peer has it (-1 after); peer: -1 */
  void *addr;
  size_t size;
  atomic_int refs;     /* holders; an own block lent to the peer counts 1 */
  int lent;            /* own: 1 while the peer holds it (one loan at a time) */
  uint64_t last_used;  /* own: reuse order for trimming */
  /* own, a forward: the block of ANOTHER channel's peer this one shows
   * (one reference held; addr, size and the fd to introduce are its); at
   * its last reference it is destroyed, or kept dormant for the next
   * forward of the same source, holding no reference (shm.c).  NULL
   * otherwise. */
  bh_block *src;
  /* peer: the peer sealed it against writes (a block it forwards, or one
   * it keeps for a tensor it sends again): mapped copy-on-write here,
   * sent back or forwarded by reference only where unwritten here
   * (bh__range_clean), its written pages dropped at each return (so a
   * next loan reads the owner's bytes).  In a pool that forwards, the
   * only peer blocks that keep their fd and may be forwarded (shm.c). */
  uint8_t private_map;
  /* peer, private_map: write-protected by this process's userfaultfd
   * since a return found it unwritten (async: a write clears its page's
   * bit, so a check reads the bits, not each page's kind: shm.c), in
   * process wp_pid (0: not; a forked child is not); clean_returns: returns
   * that found it unwritten (it is write-protected at the second). */
  pid_t wp_pid;
  uint8_t clean_returns;
  /* own: sealed against writes before the peer mapped it (the peer maps
   * it copy-on-write and drops what it wrote there before each return, so
   * it is reused as any block, by bh__pool_acquire_sealed first). */
  uint8_t sealed;
  /* A third process may hold this block's memfd (protocol 10).  peer: a
   * forward of it was made here, so its return note carries
   * BH__RETURN_SPENT.  own: the peer's return said so: the block is never
   * reused for other bytes (whoever kept that fd would read them), but
   * destroyed at its last reference with a retire note (shm.c). */
  uint8_t spent;
};

/* Set on a return note's id (own ids stay below BH_BLOCK_BACK, this bit):
 * the block was forwarded to a third process, which got its memfd; the
 * owner retires it instead of reusing it (protocol 10). */
#define BH__RETURN_SPENT 0x80000000u
_Static_assert(BH__RETURN_SPENT == BH_BLOCK_BACK, "own ids stay below the spent bit");

/* Peer blocks of at least this size that their owner sealed keep their
 * memfd in a pool that forwards (bh_channel_opts.forward), so another
 * channel can introduce them; smaller ones cost less to copy than a
 * mapping does. */
#define BH__FORWARD_MIN (1u << 20)

int bh__pool_open(bh_pool **out, size_t keep_bytes, int forward);
/* Drops the channel's reference; the pool goes when its last block does. */
void bh__pool_close(bh_pool *p);
int bh__pool_acquire(bh_pool *p, size_t nbytes, bh_block **out);
/* bh__pool_acquire, for a free block sealed before, or one the peer has
 * never mapped, sealed against writes now (F_SEAL_FUTURE_WRITE) and marked
 * sealed.  -ENOTSUP where the kernel refuses the seal. */
int bh__pool_acquire_sealed(bh_pool *p, size_t nbytes, bh_block **out);
/* Marks an own block lent (one more reference) and tells whether its fd
 * must travel with this frame (the peer has not mapped it yet).  -EBUSY if
 * it is lent already: a block goes out once until the peer returns it. */
int bh__pool_lend(bh_pool *p, bh_block *b, int *needs_fd);
/* The frames introducing intro[0..n) were sent: their memfds close (the
 * peer holds its own, and the mapping here needs none). */
void bh__pool_introduced(bh_pool *p, bh_block *const *intro, uint32_t n);
/* Block memfds open in this process now, over every pool, and the most
 * there may be (a quarter of the soft RLIMIT_NOFILE, at least
 * BH__KEEP_FREE_BLOCKS). */
size_t bh__block_fds_open(void);
size_t bh__block_fds_max(void);
/* The peer returned own block `id` (drop the lent reference); a return
 * for a block not lent is a harmless duplicate.  -BH_EBLOCK if unknown.
 * With BH__RETURN_SPENT set in id the block was forwarded: it is marked
 * spent, never reused, destroyed at its last reference. */
int bh__pool_returned(bh_pool *p, uint32_t id);
/* Maps a peer block introduced by a frame; consumes fd. */
int bh__pool_adopt(bh_pool *p, uint32_t id, int fd, uint64_t size);
/* The peer retired its block `id`: unmap it (it must hold no references). */
int bh__pool_retire_peer(bh_pool *p, uint32_t id);
int bh__pool_peer_get(bh_pool *p, uint32_t id, bh_block **out);
/* A back ref (bh_channel_frame_block): own block id (t->block without
 * BH_BLOCK_BACK) lent to the peer and not returned, the range aligned and
 * within it; takes a reference.  -BH_EBLOCK / -BH_ETENSOR. */
int bh__pool_back_get(bh_pool *p, const bh_tensor_ref *t, bh_block **out);
/* The held peer block holding [addr, addr + n) at an aligned offset; takes
 * a reference.  -ENOENT if none (or it is mapped copy-on-write). */
int bh__pool_peer_find(bh_pool *p, const void *addr, uint64_t n, bh_block **out, uint64_t *offset);
/* 1 when no page of [addr, addr + n) is an anonymous (written,
 * copy-on-write) page of this process (/proc/self/pagemap's flags: not
 * present, or a file page), 0 when one is, or a negative errno.  One
 * PAGEMAP_SCAN ioctl where the kernel has it (6.7), else pagemap read. */
int bh__range_clean(const void *addr, uint64_t n);
/* For tests: 1 makes bh__range_clean read pagemap as on a kernel without
 * PAGEMAP_SCAN (before 6.7); 0 lets it scan again. */
void bh__range_clean_scan_off(int off);
/* For tests: 1 keeps copy-on-write blocks unprotected (as where the kernel
 * has no async write protection, before 6.7, or refuses userfaultfd); 0
 * lets them be protected again. */
void bh__range_clean_wp_off(int off);
/* Whether b (a copy-on-write peer block) is write-protected in this
 * process: its checks read the protection bits. */
int bh__block_write_protected(const bh_block *b);
/* A check of part [addr, addr + n) of a range: 1 where it passes, else
 * what the whole check answers (0, or a negative errno). */
typedef int (*bh__check_fn)(int fd, const void *addr, size_t n);
/* check over [addr, addr + n) in 4 MiB parts, on the calling thread and
 * the copy helpers (copy.c); on this thread alone where one CPU is usable
 * or the helpers serve a copy.  1 where every part passes, else the first
 * other answer (the parts after it are not checked). */
int bh__split_check(bh__check_fn check, int fd, const void *addr, size_t n);
/* A forward: the held peer block of ANOTHER open pool of this process
 * that its owner sealed against writes (F_SEAL_FUTURE_WRITE: the owner's
 * mapping stays writable, new ones cannot be), that holds [addr, addr + n)
 * alone and kept its memfd, shown in `p` as an own block of p's id space
 * (src set, one reference owned by the caller) that p's peer maps
 * copy-on-write when it is lent.  -ENOENT if none (no such block, one its
 * owner did not seal, no fd kept, a range of it, written here): the
 * caller copies the bytes instead. */
int bh__pool_forward(bh_pool *p, const void *addr, uint64_t n, bh_block **out, uint64_t *offset);
/* The fd a frame introducing own block b passes (a forward's: its
 * source's), or -1. */
int bh__block_intro_fd(const bh_block *b);
/* Whether tensor ref t fits a block of size bytes as a back ref: offset a
 * multiple of BH_ARENA_ALIGN, range within.  0 or -BH_ETENSOR.  Pure. */
int bh__back_range(uint64_t size, const bh_tensor_ref *t);
struct bh__lend;
/* 0 when every block of l[0..n) (ids ascending, no two alike) is a peer
 * block mapped here with exactly that size; else -BH_EBLOCK. */
int bh__pool_peer_check(bh_pool *p, const struct bh__lend *l, uint32_t n);
/* Moves queued returns (peer ids) and retires (own ids) into the arrays,
 * at most max of each; returns counts through the pointers. */
void bh__pool_take_notes(bh_pool *p, uint32_t *returns, uint32_t *n_returns,
                         uint32_t *retires, uint32_t *n_retires, uint32_t max);
/* Creates a sealed memfd of `size` bytes, mapped; for spilled payloads too. */
int bh__memfd_create(const char *name, size_t size, int *fd_out, void **addr_out);
/* Checks a received fd is a memfd sealed against shrinking, at least size
 * bytes long. */
int bh__memfd_check(int fd, uint64_t size);

/* ---- channel.c: the receive path's pure decoders ----
 *
 * bh_channel_recv runs these on every message it takes off the socket;
 * they read only the bytes they are given (no fds, no pool), so the
 * fuzzers (fuzz/fuzz_frame.c) drive exactly the code a peer's bytes reach. */

/* Checks one received message (msg[0..n): header + inline payload) that
 * came with n_fds fds: length, bh_frame_header_check, fd count, and the
 * inline length against payload_bytes (a SPILLED frame has nothing inline,
 * a non-empty payload and its fd last).  Copies the header into *h.
 * Returns 0, -BH_ESHORT, -BH_EFDCOUNT or a header code. */
int bh__frame_check(const uint8_t *msg, size_t n, uint32_t n_fds, bh_frame_header *h);
/* channel.c: whether SO_RCVTIMEO `have` ns serves a wait of `want` ns (0 = forever). */
int bh__rcvtimeo_keep(int64_t have, int64_t want);

/* A block section, parsed: the entries point into the payload. */
typedef struct bh__section {
  uint32_t n_intro, n_return, n_retire, n_lend;
  const uint8_t *intro;   /* n_intro x (u32 id, u64 size) */
  const uint8_t *returns; /* n_return x u32 id */
  const uint8_t *retires; /* n_retire x u32 id */
  const uint8_t *lend;    /* n_lend x (u32 id, u64 size), ids ascending */
  size_t len;             /* bytes the section takes; the value follows */
} bh__section;

/* Parses the block section at the front of a payload of len bytes whose
 * frame carries n_fds intro fds (the spill fd not counted).  Returns 0,
 * -BH_EBLOCKSEC (counts over their limits or past the payload, lend ids
 * not strictly ascending, a lent size of 0, an intro or lend id with
 * BH_BLOCK_BACK set) or -BH_EFDCOUNT
 * (n_intro != n_fds).  *s borrows p. */
int bh__section_parse(const uint8_t *p, size_t len, uint32_t n_fds, bh__section *s);

/* One block a received frame lends, and how far its refs reached. */
typedef struct bh__lend {
  uint32_t id;
  uint64_t size;
  uint64_t end; /* end of the last ref into it so far (0: none yet) */
} bh__lend;

/* Reads a parsed section's lend list into l[0..s->n_lend), ends at 0. */
void bh__lend_load(const bh__section *s, bh__lend *l);
/* Checks tensor ref t (a block ref: not NONE, not INLINE, passed
 * bh_tensor_ref_check) against the lend table l[0..n) (ids ascending) and
 * advances its block's end.  Returns the entry's index, -BH_EBLOCK (not
 * lent by the frame) or -BH_ETENSOR (offset not a multiple of
 * BH_ARENA_ALIGN, range past the block, or starting before the end of the
 * previous ref into that block).  Pure: what bh_channel_frame_block runs,
 * and the fuzzers. */
int bh__lend_claim(bh__lend *l, uint32_t n, const bh_tensor_ref *t);

/* Applies a parsed section to the pool: adopts each intro (consuming
 * fds[i], set to -1), then the returns and the retires.  Every entry is
 * applied; returns 0 or the first error. */
int bh__section_apply(bh_pool *pool, const bh__section *s, int *fds);

/* ---- ledger.c ---- */

/* Start time of process pid (/proc/<pid>/stat field 22, clock ticks since
 * boot), parsed after the LAST ')' so any comm is safe.  0, -ESRCH when
 * there is no such process, -EINVAL for a line it cannot parse. */
int bh__proc_start_time(pid_t pid, uint64_t *out);
/* 1 while the process that started at start_time as pid runs (a zombie is
 * gone; a /proc that cannot be read counts as alive), else 0. */
int bh__alive(pid_t pid, uint64_t start_time);
/* The segment's robust mutex (EOWNERDEAD is recovered here).  For tests:
 * a process may take it and die holding it. */
int bh__ledger_lock(bh_ledger *l);
void bh__ledger_unlock(bh_ledger *l);
/* For tests: makes slot a LIVE record of (pid, start_time), as a crashed
 * process or one whose pid was reused would have left it. */
int bh__ledger_forge(bh_ledger *l, int slot, pid_t pid, uint64_t start_time);
#ifdef BH_TESTING
/* Test builds only: the most milliseconds a caller waits for the segment's
 * mutex and its file locks (2000, the product's wait).  A test of a
 * stopped holder sets it lower in its own forked process, so the bounded
 * wait it checks ends sooner; the paths it takes are the product's. */
extern int bh__ledger_lock_wait_ms;
#endif
/* For the fuzzer and tests: a handle over a ledger file's image in memory
 * (len bytes at image, writable), validated exactly as bh_ledger_open
 * validates a file: -BH_ELEDGER / -BH_ELEDGERVER for one it refuses, and
 * an all-zero header at full size is initialised, as a file's would be
 * (an empty image is -BH_ELEDGER: an empty file is where bh_ledger_open
 * creates the ledger, but an image cannot grow).
 * The image is borrowed: it must outlive the handle, which reads and
 * reaps in it like in a mapped file; bh_ledger_close frees only the
 * handle (nothing to unlock, unmap or unlink). */
int bh__ledger_open_mem(bh_ledger **out, void *image, size_t len);

/* rundir.c: the default ledger path (bh_ledger_default_path's rules) into
 * buf; with create, its private directory is made and a taken one is an
 * error (-EPERM, -EACCES, -ENOTDIR, -ELOOP as bh_private_dir).  Returns the
 * length, or -ENAMETOOLONG. */
int bh__ledger_home(char *buf, size_t n, int create);
/* Fuzz builds (-DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, fuzz/ only):
 * a record is alive iff its start_time is this function of its pid, so an
 * input decides its own records' fate without /proc. */
#define BH__FUZZ_START_TIME(pid) ((uint64_t)(uint32_t)(pid) * 1000003u + 17u)

#endif
