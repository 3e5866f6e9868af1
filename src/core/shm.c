/*
 * shm.c -- shared-memory blocks and the per-channel pool that reuses them.
 *
 * Tensors cross a channel in blocks: memfds sealed against shrinking and
 * growing (so a peer can never truncate a mapping under us and turn a read
 * into SIGBUS), mapped once in each process and kept mapped.  A fresh
 * memfd's first touch costs several memcpys (page allocation + zeroing), so
 * blocks are created prefaulted and reused:
 *
 *   own block   created here; free -> acquired (copy data in) -> lent to
 *               the peer with the frame that references it -> returned by
 *               the peer (a note on a later frame) -> free again.  The fd
 *               travels once, the first time the block is lent; after that
 *               only its id does.  While lent, the peer may send it
 *               back by reference (a back ref, BH_BLOCK_BACK | id): a
 *               view of it here takes a reference, so it is not reused
 *               when the peer returns it before that view goes.
 *   peer block  the peer's block, mapped here on its first introduction
 *               and kept mapped; references are held by the objects that
 *               wrap it, and when the last one goes its id is queued as a
 *               return note for the next outgoing frame.  It is mapped
 *               without populating: a page costs this process memory only
 *               once something here reads it (the peer declares the size,
 *               and a sparse memfd must not become our RSS).  The peer's
 *               blocks mapped at once are bounded, in count
 *               (BH__PEER_BLOCKS_MAX: each is a mapping, and mappings are
 *               a per-process limit) and in bytes (the machine's RAM);
 *               an introduction past either is refused with
 *               -BH_EPEERMEM.
 *   forward     (protocol 7) a peer block of ANOTHER channel's pool, shown
 *               here as an own block (src set) so this channel's peer
 *               maps it too: a host passes worker A's output to worker B
 *               with no copy.  Only a block its owner sealed against
 *               writes before lending it (F_SEAL_FUTURE_WRITE,
 *               bh__pool_acquire_sealed: a tensor the owner keeps and
 *               sends again, tensors.SendCache) is forwarded: a pool opened
 *               to forward keeps the memfd of each such peer block of at
 *               least BH__FORWARD_MIN bytes (within a process-wide bound,
 *               apart from own blocks').  Any other block of the owner's
 *               is one its pool reuses for its next output; forwarding it
 *               would spend it (below), and its owner would pay a fresh
 *               memfd per output (~40 ms per 64 MiB on a small VM, every
 *               page faulted in B besides), so its bytes are copied
 *               instead into a block of this channel's pool, one memcpy
 *               into pages B has mapped already, and the owner gets its
 *               block back for reuse: B never sees a block its owner
 *               reuses.  B, seeing the seal, maps a forward copy-on-write
 *               (its writes stay its own; the owner's mapping, made
 *               before the seal, stays writable) and sends it back by
 *               reference only where it wrote nothing (bh__range_clean,
 *               as for any copy-on-write block).  B maps the whole block,
 *               so only a tensor that fills its block alone is forwarded
 *               (from offset 0 to the last page, whose tail the owner's
 *               acquire cleared); a range of a larger block (another array
 *               of an arena, a reused block's older bytes) is copied, as
 *               B must read no byte A did not send it.  The forward holds a reference on its source,
 *               so A's pool does not reuse the block while B holds it, and
 *               goes at its last reference.  It is not retired then
 *               (B would unmap A's block and fault every page in again
 *               at the next forward of it, 1,024 faults for 64 MiB):
 *               it is kept dormant (at most BH__DORMANT_MAX per pool,
 *               holding no reference on its source, so A gets its block
 *               back as ever) and the next forward of the same source
 *               block on this channel lends it again, B's mapping and
 *               page tables as they were (B dropped what it wrote there
 *               before it returned it, as for any copy-on-write block,
 *               so it reads the bytes it was sent).  B has the block's
 *               memfd for good (a B whose code keeps it needs no mapping
 *               and no note), so A must never put other bytes in that
 *               block: from its first forward the source is spent, its
 *               return note says so (BH__RETURN_SPENT, protocol 10), and
 *               A never reuses it (a tensor A keeps there goes again
 *               unchanged, as the same block: the forward kept for it
 *               serves) but destroys it at its last reference, with a
 *               retire note; A's next such block takes a fresh memfd.  The
 *               host unmaps the block at that note and retires its
 *               dormant forwards first (a retire note: B unmaps;
 *               bh__forwards_forget), as does a pool that closes.  A
 *               process that dies leaves every mapping of its block, and
 *               so its pages, to the others.
 *
 * Free own blocks beyond keep_bytes, or beyond BH__KEEP_FREE_BLOCKS of
 * them, are destroyed least recently used first; if the peer had mapped
 * one, a retire note tells it to unmap.  An own block holds its memfd only
 * until the frame that introduces it to the peer is sent (the peer then
 * has its own fd, and a mapping needs none), so the fds blocks hold are
 * those of blocks not lent yet (and, in a pool that forwards, the large
 * peer blocks', bounded apart).  Their count is bounded twice: at most
 * BH__OWN_BLOCKS_MAX own blocks holding an fd per pool (blocks the peer
 * holds from earlier messages count only as mappings, at most as many as
 * the peer maps: BH__PEER_BLOCKS_MAX; an acquire past either destroys free
 * blocks first, then fails -BH_EPOOLFULL), and at most
 * bh__block_fds_max() block memfds open in the whole process, over every
 * pool (a quarter of the soft RLIMIT_NOFILE: a host with many workers
 * keeps its fds for everything else; past it -BH_EPOOLFULL too).  Small
 * tensors need no block at all: they travel inline (BH_BLOCK_INLINE),
 * and those a little larger share blocks within one message (an arena,
 * bh_arena_take: aligned ranges of a block the message lends once; the
 * block comes back when the peer dropped its last view of any of them).
 *
 * A spent block's retire and its successor are kept off the call path
 * (protocol 10 makes every forwarded block of the owner's a fresh memfd,
 * whose pages cost ~40 ms per 64 MiB to allocate and map on a small VM):
 * at a spent block's last reference a thread of the pool's (the spare
 * thread, one at a time, joined before the next and at close) unmaps it
 * and prepares one spare block of its size, created and populated, which
 * the next take of that size gets at once (or waits for, if it is still
 * being prepared: never two at once); a take that got the spare asks for
 * the next, so outputs forwarded back to back find theirs ready (about
 * 60 -> 49 ms per 64 MiB output on a 2-CPU VM; 63 -> 13 ms where the calls
 * leave 100 ms between them).  A pool holds at most one spare (another
 * size replaces it); it counts in the process's block fds and in
 * bh_pool_stats.spare_bytes, and goes at bh_pool_trim and at close.  It
 * holds nobody's bytes: fresh pages, its fd never sent before a take makes
 * it an own block.
 *
 * Locking: one mutex per pool guards every block's refs and the pool's
 * lists; bh_block_unref may run on any thread (a tensor's deleter).  The
 * pool lives until the channel closed it and its last referenced block
 * went.
 */
#include "internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>
#include <unistd.h>

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif

/* Spent blocks queued for the spare thread at most (past it, destroyed
 * on the call path). */
#define BH__SPARE_GONE_MAX 4

struct bh_pool {
  pthread_mutex_t mu;
  int closed;
  size_t keep_bytes;
  uint32_t next_id;
  uint64_t clock;
  bh_block **own;
  size_t n_own, cap_own;
  bh_block **peer;
  size_t n_peer, cap_peer;
  uint64_t peer_bytes;     /* sum of the peer blocks' sizes */
  uint64_t peer_max_bytes; /* what the peer may have mapped here at once */
  uint32_t *returns; /* peer ids to hand back */
  size_t n_returns, cap_returns;
  uint32_t *retires; /* own ids the peer must unmap */
  size_t n_retires, cap_retires;
  uint64_t created, reused;
  uint64_t spare_takes; /* created blocks that were the spare */
  uint64_t spent;    /* own blocks retired at their last reference, forwarded */
  int forward;       /* keep large peer blocks' memfds, for forwards */
  uint64_t forwarded; /* forwards made here, ever */
  bh_pool *next;     /* the process's open pools (bh__pools), for forwards */
  /* Forwards the peer returned and still maps, kept for the next forward
   * of the same source (their src is not referenced: it is only compared,
   * and bh__forwards_forget drops them before their source is freed). */
  bh_block **dormant;
  size_t n_dormant, cap_dormant;
  /* Set before this pool closes (no lock): a forward of one of its peer
   * blocks is not kept dormant from then on. */
  atomic_int closing;
  /* The spare (see the top): ready (its id reserved, not in own yet), or
   * being prepared by spare_thread (spare_busy; spare_size 0 when that
   * thread only unmaps), which first destroys spare_gone. */
  bh_block *spare;
  bh_block *spare_gone[BH__SPARE_GONE_MAX]; /* spent blocks to destroy */
  size_t n_spare_gone;
  size_t spare_want, spare_size; /* asked for / being prepared (0: none) */
  uint32_t spare_want_id, spare_id;
  int spare_busy, spare_joinable, spare_stop;
  pthread_t spare_thread;
  pthread_cond_t spare_cv;
  /* This process's /proc/self/pagemap for the copy-on-write checks
   * (bh__pool_pagemap; -1: not open), closed with the pool.  The file
   * reads the memory of the process that opened it: pagemap_pid says
   * which (a pool copied into a forked child opens its own). */
  int pagemap_fd;
  pid_t pagemap_pid;
  /* This process's userfaultfd for its copy-on-write peer blocks' write
   * protection (bh__pool_uffd; -1: none), closed with the pool (which
   * unregisters what it registered); uffd_pid as pagemap_pid. */
  int uffd;
  pid_t uffd_pid;
};

/* Dormant forwards a pool keeps at most (each a mapping in the peer). */
#define BH__DORMANT_MAX 16

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; an older kernel refuses it: no forwards */
#endif
#define BH__WRITE_SEALS (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)

/* Every open pool of this process: a forward looks for its bytes in the
 * other channels' peer blocks.  Lock order: bh__pools_mu, then a pool's
 * mu; a pool's mu is never held while another pool's is taken (a
 * forward's source is unreferenced after its pool's lock is dropped). */
static pthread_mutex_t bh__pools_mu = PTHREAD_MUTEX_INITIALIZER;
static bh_pool *bh__pools;

#define BH__PAGE 4096u
#define BH__DEFAULT_KEEP (256u << 20)

/* Own-block memfds open in this process (every pool). */
static atomic_size_t bh__block_fds;
/* Peer-block memfds kept for forwards (every pool), bounded apart. */
static atomic_size_t bh__peer_fds;

size_t bh__block_fds_open(void) { return atomic_load(&bh__block_fds); }

size_t bh__block_fds_max(void) {
  struct rlimit rl;
  size_t max = 1024 / 4;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    max = rl.rlim_cur == RLIM_INFINITY ? (size_t)1 << 16 : (size_t)(rl.rlim_cur / 4);
  return max < BH__KEEP_FREE_BLOCKS ? BH__KEEP_FREE_BLOCKS : max;
}

static void bh__block_close_fd(bh_block *b) {
  if (b->fd < 0) return;
  bh__close(b->fd);
  b->fd = -1;
  atomic_fetch_sub(b->own ? &bh__block_fds : &bh__peer_fds, 1);
}

int bh__block_intro_fd(const bh_block *b) { return b->src ? b->src->fd : b->fd; }

int bh__memfd_create(const char *name, size_t size, int *fd_out, void **addr_out) {
  int fd = -1;
  void *addr = MAP_FAILED;
  int rc;
  fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  if (ftruncate(fd, (off_t)size) < 0) goto err;
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) goto err;
  if (addr_out && size) {
    addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) goto err;
  }
  *fd_out = fd;
  if (addr_out) *addr_out = size ? addr : NULL;
  return 0;
err:
  rc = -errno;
  bh__close(fd);
  return rc;
}

int bh__memfd_check(int fd, uint64_t size) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) return -BH_ESEALS;
  struct stat st;
  if (fstat(fd, &st) < 0 || st.st_size < 0 || (uint64_t)st.st_size < size) return -BH_ESEALS;
  return 0;
}

/* Faults every page in now, so the first copy runs at memcpy speed. */
static void bh__prefault(void *addr, size_t size) {
#ifdef BH_HAS_MADV_POPULATE_WRITE
  if (madvise(addr, size, MADV_POPULATE_WRITE) == 0) return;
#endif
  volatile uint8_t *p = addr;
  for (size_t off = 0; off < size; off += BH__PAGE) p[off] = 0;
}

/* A new own block of pool p: its memfd "bulkhead-block-<id>" of size
 * bytes, mapped and prefaulted, with refs references.  The caller counted
 * its fd in bh__block_fds.  0, or -errno with *out NULL. */
static int bh__block_new(bh_pool *p, uint32_t id, size_t size, int refs, bh_block **out) {
  char name[32];
  bh_block *b = calloc(1, sizeof *b);
  *out = NULL;
  if (!b) return -ENOMEM;
  snprintf(name, sizeof name, "bulkhead-block-%u", id);
  int rc = bh__memfd_create(name, size, &b->fd, &b->addr);
  if (rc) {
    free(b);
    return rc;
  }
  bh__prefault(b->addr, size);
  b->pool = p;
  b->id = id;
  b->own = 1;
  b->size = size;
  atomic_init(&b->refs, refs);
  *out = b;
  return 0;
}

int bh__pool_open(bh_pool **out, size_t keep_bytes, int forward) {
  bh_pool *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->spare_cv, NULL);
  p->keep_bytes = keep_bytes ? keep_bytes : BH__DEFAULT_KEEP;
  p->next_id = 1;
  p->forward = forward != 0;
  p->pagemap_fd = -1;
  p->uffd = -1;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  p->peer_max_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
  pthread_mutex_lock(&bh__pools_mu);
  p->next = bh__pools;
  bh__pools = p;
  pthread_mutex_unlock(&bh__pools_mu);
  *out = p;
  return 0;
}

static void bh__pools_remove(bh_pool *p) {
  pthread_mutex_lock(&bh__pools_mu);
  for (bh_pool **at = &bh__pools; *at; at = &(*at)->next)
    if (*at == p) {
      *at = p->next;
      break;
    }
  pthread_mutex_unlock(&bh__pools_mu);
}

static int bh__push_ptr(bh_block ***arr, size_t *n, size_t *cap, bh_block *b) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    bh_block **na = realloc(*arr, nc * sizeof *na);
    if (!na) return -ENOMEM;
    *arr = na;
    *cap = nc;
  }
  (*arr)[(*n)++] = b;
  return 0;
}

static int bh__push_id(uint32_t **arr, size_t *n, size_t *cap, uint32_t id) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    uint32_t *na = realloc(*arr, nc * sizeof *na);
    if (!na) return -ENOMEM;
    *arr = na;
    *cap = nc;
  }
  (*arr)[(*n)++] = id;
  return 0;
}

/* Frees a block; a forward's source (the caller unreferences it, with no
 * pool lock held) keeps the mapping it shows. */
static void bh__block_destroy(bh_block *b) {
  if (b->addr && b->size && !b->src) munmap(b->addr, b->size);
  bh__block_close_fd(b);
  free(b);
}

static void bh__remove_at(bh_block **arr, size_t *n, size_t i) {
  arr[i] = arr[--*n];
}

/* The spare thread: destroys the spent blocks queued for it and prepares
 * the spare asked for (a fresh memfd, populated), till nothing is left to
 * do; publishes each spare as it is ready. */
static void *bh__spare_main(void *arg) {
  bh_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    bh_block *gone[BH__SPARE_GONE_MAX];
    size_t n_gone = p->n_spare_gone;
    memcpy(gone, p->spare_gone, n_gone * sizeof *gone);
    p->n_spare_gone = 0;
    size_t size = p->spare_size = p->spare_want;
    uint32_t id = p->spare_id = p->spare_want_id;
    p->spare_want = 0;
    if (!n_gone && !size) break;
    pthread_mutex_unlock(&p->mu);
    bh_block *b = NULL;
    /* The spare first: it is what the next take waits for. */
    if (size) {
      if (bh__block_new(p, id, size, 0, &b) != 0)
        atomic_fetch_sub(&bh__block_fds, 1); /* counted when asked for */
    }
    pthread_mutex_lock(&p->mu);
    bh_block *old = p->spare;
    if (b) p->spare = b;
    else old = NULL;
    p->spare_size = 0;
    pthread_cond_broadcast(&p->spare_cv);
    pthread_mutex_unlock(&p->mu);
    if (old) bh__block_destroy(old); /* one of another size, never taken */
    for (size_t i = 0; i < n_gone; i++) bh__block_destroy(gone[i]);
    pthread_mutex_lock(&p->mu);
  }
  p->spare_busy = 0;
  pthread_cond_broadcast(&p->spare_cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Has the spare thread run, starting it if it is not running (lock held).
 * Returns 0, or -1 where no thread could start (the caller does the work
 * itself). */
static int bh__spare_kick(bh_pool *p) {
  if (p->spare_busy) return 0;
  /* The last one is done (it said so under this lock): reaped now. */
  if (p->spare_joinable) pthread_join(p->spare_thread, NULL);
  p->spare_joinable = 0;
  /* Signals stay with the process's own threads. */
  sigset_t all, was;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &was);
  int rc = pthread_create(&p->spare_thread, NULL, bh__spare_main, p);
  pthread_sigmask(SIG_SETMASK, &was, NULL);
  if (rc) return -1;
  p->spare_busy = p->spare_joinable = 1;
  return 0;
}

/* Asks for a spare of `size` bytes (lock held), unless one is ready or on
 * its way: after a spent block's last reference, and after a take got the
 * spare, so the next is prepared while the calls go on. */
static void bh__spare_want(bh_pool *p, size_t size) {
  if (p->closed || p->spare_stop) return;
  if ((p->spare && p->spare->size == size) || p->spare_size == size || p->spare_want == size) return;
  if (p->next_id >= BH_BLOCK_BACK) return;
  if (atomic_fetch_add(&bh__block_fds, 1) >= bh__block_fds_max()) {
    atomic_fetch_sub(&bh__block_fds, 1);
    return;
  }
  if (p->spare_want) atomic_fetch_sub(&bh__block_fds, 1); /* replaced: its id goes unused */
  p->spare_want = size;
  p->spare_want_id = p->next_id++;
  if (bh__spare_kick(p)) {
    p->spare_want = 0;
    atomic_fetch_sub(&bh__block_fds, 1);
  }
}

/* A spent own block's last reference (lock held; it is out of own): the
 * spare thread destroys it and prepares a spare of its size; where no
 * thread can run, or too many wait, it is destroyed here. */
static void bh__spare_start(bh_pool *p, bh_block *spent) {
  bh__spare_want(p, spent->size);
  if (!p->closed && !p->spare_stop && p->n_spare_gone < BH__SPARE_GONE_MAX && bh__spare_kick(p) == 0) {
    p->spare_gone[p->n_spare_gone++] = spent;
    return;
  }
  bh__block_destroy(spent);
}

/* Stops the spare thread (no new one starts) and destroys the spare: at
 * close.  No lock held. */
static void bh__spare_stop(bh_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->spare_stop = 1;
  if (p->spare_want) atomic_fetch_sub(&bh__block_fds, 1); /* not prepared after all */
  p->spare_want = 0;
  int join = p->spare_joinable;
  p->spare_joinable = 0;
  pthread_mutex_unlock(&p->mu);
  if (join) pthread_join(p->spare_thread, NULL);
  pthread_mutex_lock(&p->mu);
  bh_block *b = p->spare;
  p->spare = NULL;
  pthread_mutex_unlock(&p->mu);
  if (b) bh__block_destroy(b);
}

static void bh__pool_free(bh_pool *p) {
  if (p->pagemap_fd >= 0) close(p->pagemap_fd);
  if (p->uffd >= 0) close(p->uffd);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->spare_cv);
  free(p->dormant);
  free(p->own);
  free(p->peer);
  free(p->returns);
  free(p->retires);
  free(p);
}

/* Drops the dormant forwards, in every open pool, of the n source blocks
 * in srcs (n 0: of every source), each with a retire note (its peer
 * unmaps it): called before those sources are freed, or once they are
 * (the pointers are compared, never followed).  No pool lock held. */
static void bh__forwards_forget(bh_block *const *srcs, size_t n) {
  pthread_mutex_lock(&bh__pools_mu);
  for (bh_pool *q = bh__pools; q; q = q->next) {
    pthread_mutex_lock(&q->mu);
    for (size_t i = q->n_dormant; i-- > 0;) {
      bh_block *f = q->dormant[i];
      int match = n == 0;
      for (size_t k = 0; k < n && !match; k++) match = f->src == srcs[k];
      if (!match) continue;
      bh__remove_at(q->dormant, &q->n_dormant, i);
      /* Without memory for the note the peer keeps a mapping of an id
       * never lent again, until the channel closes (as for any retire). */
      (void)bh__push_id(&q->retires, &q->n_retires, &q->cap_retires, f->id);
      bh__block_destroy(f);
    }
    pthread_mutex_unlock(&q->mu);
  }
  pthread_mutex_unlock(&bh__pools_mu);
}

/* Called with the lock held when the pool is closed: is anything left? */
static int bh__pool_empty(bh_pool *p) { return p->n_own == 0 && p->n_peer == 0; }

void bh__pool_close(bh_pool *p) {
  if (!p) return;
  atomic_store(&p->closing, 1); /* no forward of its blocks goes dormant from here */
  bh__pools_remove(p);
  bh__spare_stop(p);
  pthread_mutex_lock(&p->mu);
  p->closed = 1;
  /* Its dormant forwards go with the peer they were lent to. */
  for (size_t i = 0; i < p->n_dormant; i++) bh__block_destroy(p->dormant[i]);
  p->n_dormant = 0;
  /* Its peer blocks kept for forwards (those freed here and those their
   * last reference frees later): other channels' dormant forwards of them
   * are dropped once the lock is (on no memory for the list, every
   * dormant forward is). */
  size_t n_gone = 0, n_fwd = 0;
  for (size_t i = 0; i < p->n_peer; i++) n_fwd += p->peer[i]->fd >= 0;
  bh_block **gone = n_fwd ? malloc(sizeof *gone * n_fwd) : NULL;
  for (size_t i = 0; gone && i < p->n_peer; i++)
    if (p->peer[i]->fd >= 0) gone[n_gone++] = p->peer[i];
  /* Forwards' sources, unreferenced once the lock is dropped (on no
   * memory for the list, a forward stays: its source stays mapped). */
  bh_block **srcs = p->n_own ? malloc(sizeof *srcs * p->n_own) : NULL;
  size_t n_srcs = 0;
  for (size_t i = p->n_own; i-- > 0;) {
    bh_block *b = p->own[i];
    /* Lent references die with the peer: nobody will return them. */
    atomic_fetch_sub(&b->refs, b->lent);
    b->lent = 0;
    if (atomic_load(&b->refs) == 0 && (!b->src || srcs)) {
      bh__remove_at(p->own, &p->n_own, i);
      if (b->src) srcs[n_srcs++] = b->src;
      bh__block_destroy(b);
    }
  }
  for (size_t i = p->n_peer; i-- > 0;) {
    bh_block *b = p->peer[i];
    if (atomic_load(&b->refs) == 0) {
      bh__remove_at(p->peer, &p->n_peer, i);
      bh__block_destroy(b);
    }
  }
  int empty = bh__pool_empty(p);
  pthread_mutex_unlock(&p->mu);
  if (n_fwd) bh__forwards_forget(gone, gone ? n_gone : 0);
  free(gone);
  for (size_t i = 0; i < n_srcs; i++) bh_block_unref(srcs[i]);
  free(srcs);
  if (empty) bh__pool_free(p);
}

/* Own blocks that still hold their memfd (not introduced to the peer yet).
 * Lock held. */
static size_t bh__own_fds(const bh_pool *p) {
  size_t n = 0;
  for (size_t i = 0; i < p->n_own; i++) n += p->own[i]->fd >= 0;
  return n;
}

/* Room for one more own block: at most BH__OWN_BLOCKS_MAX of them holding
 * an fd (a lent block holds none: the peer has its own), and at most as
 * many in all as the peer maps from one channel.  Lock held. */
static int bh__pool_room(const bh_pool *p) {
  return p->n_own < BH__PEER_BLOCKS_MAX && bh__own_fds(p) < BH__OWN_BLOCKS_MAX;
}

/* Destroys least recently used free own blocks until the free bytes fit
 * keep_bytes, at most keep_blocks free blocks remain and (keep_room) the
 * pool has room for one more block.  Lock held.  Returns the bytes freed. */
static size_t bh__pool_trim_to(bh_pool *p, size_t keep_bytes, size_t keep_blocks, int keep_room) {
  size_t freed = 0;
  for (;;) {
    size_t free_bytes = 0, free_blocks = 0, victim = SIZE_MAX;
    uint64_t oldest = UINT64_MAX;
    for (size_t i = 0; i < p->n_own; i++) {
      bh_block *b = p->own[i];
      if (atomic_load(&b->refs) != 0) continue;
      free_bytes += b->size;
      free_blocks++;
      if (b->last_used < oldest) oldest = b->last_used, victim = i;
    }
    if (victim == SIZE_MAX) return freed;
    if (free_bytes <= keep_bytes && free_blocks <= keep_blocks &&
        (!keep_room || bh__pool_room(p)))
      return freed;
    bh_block *b = p->own[victim];
    if (b->peer_mapped && bh__push_id(&p->retires, &p->n_retires, &p->cap_retires, b->id))
      return freed; /* keep it rather than leave the peer a stale mapping */
    bh__remove_at(p->own, &p->n_own, victim);
    freed += b->size;
    bh__block_destroy(b);
  }
}

static void bh__pool_trim(bh_pool *p) { bh__pool_trim_to(p, p->keep_bytes, BH__KEEP_FREE_BLOCKS, 0); }

size_t bh_pool_trim(bh_pool *p, size_t keep_bytes) {
  if (!p) return 0;
  pthread_mutex_lock(&p->mu);
  size_t freed = bh__pool_trim_to(p, keep_bytes, BH__KEEP_FREE_BLOCKS, 0);
  /* The spare goes too (one being prepared stays: at most one block). */
  bh_block *spare = p->spare;
  p->spare = NULL;
  pthread_mutex_unlock(&p->mu);
  if (spare) {
    freed += spare->size;
    bh__block_destroy(spare);
  }
  return freed;
}

/* fresh: only a block the peer has never mapped (its fd still open). */
static int bh__pool_take(bh_pool *p, size_t nbytes, int fresh, bh_block **out) {
  if (!p || !out || nbytes == 0) return -EINVAL;
  if (nbytes > (size_t)1 << 46) return -BH_E2BIG;
  size_t size = (nbytes + BH__PAGE - 1) & ~(size_t)(BH__PAGE - 1);
  pthread_mutex_lock(&p->mu);
  bh_block *best = NULL;
  for (size_t i = 0; i < p->n_own; i++) {
    bh_block *b = p->own[i];
    /* best fit, but never more than twice the need */
    if (atomic_load(&b->refs) == 0 && b->size >= size && b->size / 2 <= size &&
        !b->spent && (!fresh || !b->peer_mapped || b->sealed) && (!best || b->size < best->size))
      best = b;
  }
  if (best) {
    atomic_store(&best->refs, 1);
    best->last_used = ++p->clock;
    p->reused++;
    pthread_mutex_unlock(&p->mu);
    /* The last page's tail past the new bytes holds an earlier message's:
     * cleared, so a forward of this block shows its receiver only the
     * tensor (bh__pool_forward; a fresh memfd reads zero already). */
    if (size > nbytes) memset((char *)best->addr + nbytes, 0, size - nbytes);
    *out = best;
    return 0;
  }
  bh__pool_trim_to(p, p->keep_bytes, BH__KEEP_FREE_BLOCKS, 1);
  if (!bh__pool_room(p)) {
    pthread_mutex_unlock(&p->mu);
    return -BH_EPOOLFULL;
  }
  /* The spare of this size: taken as it is (waited for while the spare
   * thread prepares it: creating another meanwhile would only double the
   * work).  Counted in the block fds already. */
  while (p->spare_busy && ((p->spare_size >= size && p->spare_size / 2 <= size) ||
                           (p->spare_want >= size && p->spare_want / 2 <= size)))
    pthread_cond_wait(&p->spare_cv, &p->mu);
  if (p->spare && p->spare->size >= size && p->spare->size / 2 <= size &&
      bh__push_ptr(&p->own, &p->n_own, &p->cap_own, p->spare) == 0) {
    bh_block *b = p->spare;
    p->spare = NULL;
    atomic_store(&b->refs, 1);
    b->last_used = ++p->clock;
    p->created++;
    p->spare_takes++;
    bh__spare_want(p, b->size); /* the next, while this one is used */
    pthread_mutex_unlock(&p->mu);
    *out = b;
    return 0;
  }
  /* The process-wide bound: counted before the memfd exists, so that
   * threads creating blocks at once cannot pass it together. */
  if (atomic_fetch_add(&bh__block_fds, 1) >= bh__block_fds_max()) {
    atomic_fetch_sub(&bh__block_fds, 1);
    pthread_mutex_unlock(&p->mu);
    return -BH_EPOOLFULL;
  }
  if (p->next_id >= BH_BLOCK_BACK) { /* own ids stay below the back-ref bit */
    atomic_fetch_sub(&bh__block_fds, 1);
    pthread_mutex_unlock(&p->mu);
    return -BH_EPOOLFULL;
  }
  uint32_t id = p->next_id++;
  pthread_mutex_unlock(&p->mu);

  bh_block *b;
  int rc = bh__block_new(p, id, size, 1, &b);
  if (rc) {
    atomic_fetch_sub(&bh__block_fds, 1);
    return rc;
  }

  pthread_mutex_lock(&p->mu);
  b->last_used = ++p->clock;
  rc = bh__push_ptr(&p->own, &p->n_own, &p->cap_own, b);
  if (!rc) p->created++;
  pthread_mutex_unlock(&p->mu);
  if (rc) {
    bh__block_destroy(b);
    return rc;
  }
  *out = b;
  return 0;
}

int bh__pool_acquire(bh_pool *p, size_t nbytes, bh_block **out) {
  return bh__pool_take(p, nbytes, 0, out);
}

int bh__pool_acquire_sealed(bh_pool *p, size_t nbytes, bh_block **out) {
  bh_block *b;
  int rc = bh__pool_take(p, nbytes, 1, &b);
  if (rc) return rc;
  if (b->sealed) { /* one sealed before, free again */
    *out = b;
    return 0;
  }
  /* Never mapped by the peer, so its fd is open; this process's mapping,
   * made before, stays writable (the caller copies into it). */
  if (fcntl(b->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0) {
    bh_block_unref(b); /* back to the free list: it is still an ordinary block */
    return -ENOTSUP;
  }
  pthread_mutex_lock(&p->mu);
  b->sealed = 1;
  pthread_mutex_unlock(&p->mu);
  *out = b;
  return 0;
}

static bh_block *bh__find(bh_block **arr, size_t n, uint32_t id, size_t *at) {
  for (size_t i = 0; i < n; i++)
    if (arr[i]->id == id) {
      if (at) *at = i;
      return arr[i];
    }
  return NULL;
}

void bh__pool_introduced(bh_pool *p, bh_block *const *intro, uint32_t n) {
  pthread_mutex_lock(&p->mu);
  for (uint32_t i = 0; i < n; i++) bh__block_close_fd(intro[i]);
  pthread_mutex_unlock(&p->mu);
}

int bh__pool_lend(bh_pool *p, bh_block *b, int *needs_fd) {
  if (!b->own || b->pool != p) return -EINVAL;
  pthread_mutex_lock(&p->mu);
  if (b->lent) { /* one loan at a time: the peer returns it once */
    pthread_mutex_unlock(&p->mu);
    return -EBUSY;
  }
  atomic_fetch_add(&b->refs, 1);
  b->lent = 1;
  *needs_fd = !b->peer_mapped;
  b->peer_mapped = 1;
  pthread_mutex_unlock(&p->mu);
  return 0;
}

/* Drop one reference with the lock held; returns 1 if the pool must be
 * freed by the caller after unlocking.  A forward's last reference
 * destroys it and leaves its source in *src for the caller to unreference
 * after unlocking (its pool's lock is another). */
static int bh__pool_pagemap(bh_pool *p);
/* Copy-on-write blocks at least this large are write-protected once found
 * unwritten at two returns (bh__block_protect; a smaller one's walk is
 * cheap). */
#define BH__WP_MIN ((size_t)1 << 20)
static int bh__pool_range_clean(int fd, pid_t wp_pid, const void *addr, uint64_t n);
static void bh__block_protect(bh_pool *p, bh_block *b);
static void bh__block_unprotect(bh_pool *p, bh_block *b);

static int bh__unref_locked(bh_pool *p, bh_block *b, bh_block **src) {
  *src = NULL;
  int left = atomic_fetch_sub(&b->refs, 1) - 1;
  if (left > 0) return 0;
  if (left < 0) {
    BH__UNREACHABLE("block reference count below zero");
    atomic_store(&b->refs, 0);
    return 0;
  }
  size_t at;
  if (p->closed) {
    bh_block **arr = b->own ? p->own : p->peer;
    size_t *n = b->own ? &p->n_own : &p->n_peer;
    if (bh__find(arr, *n, b->id, &at) == b) bh__remove_at(arr, n, at);
    *src = b->src;
    bh__block_destroy(b);
    return bh__pool_empty(p);
  }
  if (b->src) {
    /* A forward: its source goes back to that channel's peer, spent
     * (bh__pool_forward marked it): its owner never puts other bytes in
     * it, so the peer here may keep its mapping while the forward is
     * dormant (one per source, BH__DORMANT_MAX at most; not where the
     * source's pool is closing: nothing would retire it), for the next
     * forward of that source (a tensor its owner keeps there and sends
     * again), till the owner retires the block (bh__pool_retire_peer);
     * otherwise it unmaps it (without memory for the note it keeps a
     * mapping of an id never lent again, until the channel closes:
     * memory held longer, never reused too early). */
    if (bh__find(p->own, p->n_own, b->id, &at) == b) bh__remove_at(p->own, &p->n_own, at);
    *src = b->src;
    int keep = b->peer_mapped && p->n_dormant < BH__DORMANT_MAX && !atomic_load(&b->src->pool->closing);
    for (size_t i = 0; keep && i < p->n_dormant; i++) keep = p->dormant[i]->src != b->src;
    if (keep && bh__push_ptr(&p->dormant, &p->n_dormant, &p->cap_dormant, b) == 0) return 0;
    if (b->peer_mapped) (void)bh__push_id(&p->retires, &p->n_retires, &p->cap_retires, b->id);
    bh__block_destroy(b);
    return 0;
  }
  if (b->own) {
    b->last_used = ++p->clock;
    /* Forwarded by the peer: another process may have kept its memfd and
     * would read whatever went there next.  Destroyed now, with a retire
     * note (the peer unmaps it too); without memory for the note it stays,
     * free but never taken (bh__pool_take), till a trim retires it. */
    if (b->spent && bh__push_id(&p->retires, &p->n_retires, &p->cap_retires, b->id) == 0) {
      if (bh__find(p->own, p->n_own, b->id, &at) == b) bh__remove_at(p->own, &p->n_own, at);
      p->spent++;
      bh__spare_start(p, b); /* unmapped, and its successor prepared, off the call path */
      return 0;
    }
    bh__pool_trim(p);
    return 0;
  }
  /* A copy-on-write block: what was written here goes before the return
   * (the owner sends it again unchanged, or reuses it), so the next loan
   * reads the owner's bytes; an unwritten one keeps its pages mapped. */
  if (b->private_map) {
    if (bh__pool_range_clean(bh__pool_pagemap(p), b->wp_pid, b->addr, b->size) != 1) {
      (void)madvise(b->addr, b->size, MADV_DONTNEED);
      bh__block_unprotect(p, b);
      b->clean_returns = 0;
    } else if (b->wp_pid != getpid() && b->size >= BH__WP_MIN) {
      if (b->clean_returns < 2) b->clean_returns++;
      if (b->clean_returns == 2) bh__block_protect(p, b);
    }
  }
  /* Forwarded from here (b->spent): a third process got its memfd, so the
   * owner must retire it rather than reuse it; the note says so. */
  if (bh__push_id(&p->returns, &p->n_returns, &p->cap_returns, b->id | (b->spent ? BH__RETURN_SPENT : 0))) {
    /* Out of memory for the note: the peer keeps the block lent.  It is
     * only memory held longer, never memory reused too early. */
  }
  return 0;
}

int bh__pool_returned(bh_pool *p, uint32_t id) {
  int spent = (id & BH__RETURN_SPENT) != 0;
  id &= ~BH__RETURN_SPENT;
  pthread_mutex_lock(&p->mu);
  bh_block *b = bh__find(p->own, p->n_own, id, NULL);
  if (!b) {
    pthread_mutex_unlock(&p->mu);
    return -BH_EBLOCK;
  }
  if (b->lent == 0) { /* a duplicate return: nothing to give back */
    pthread_mutex_unlock(&p->mu);
    return 0;
  }
  b->lent--;
  /* Forwarded (a forward's own return never says so: its source is
   * another's, and it is never reused anyway). */
  if (spent && !b->src) b->spent = 1;
  bh_block *src;
  int free_pool = bh__unref_locked(p, b, &src);
  pthread_mutex_unlock(&p->mu);
  if (src) bh_block_unref(src);
  if (free_pool) bh__pool_free(p);
  return 0;
}

int bh__pool_adopt(bh_pool *p, uint32_t id, int fd, uint64_t size) {
  int rc = bh__memfd_check(fd, size);
  if (rc) goto out;
  if (size == 0 || size > SIZE_MAX) {
    rc = -BH_EBLOCKSEC;
    goto out;
  }
  pthread_mutex_lock(&p->mu);
  bh_block *old = bh__find(p->peer, p->n_peer, id, NULL);
  int over = p->n_peer >= BH__PEER_BLOCKS_MAX || size > p->peer_max_bytes - p->peer_bytes;
  pthread_mutex_unlock(&p->mu);
  if (old) {
    rc = -BH_EBLOCK;
    goto out;
  }
  if (over) {
    rc = -BH_EPEERMEM;
    goto out;
  }
  bh_block *b = calloc(1, sizeof *b);
  if (!b) {
    rc = -ENOMEM;
    goto out;
  }
  /* A block sealed against writes is another process's that the peer
   * forwards: mapped copy-on-write, so a write here stays here (a shared
   * writable mapping of it is refused anyway). */
  int seals = fcntl(fd, F_GET_SEALS);
  b->private_map = seals >= 0 && (seals & BH__WRITE_SEALS);
  b->addr = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, b->private_map ? MAP_PRIVATE : MAP_SHARED,
                 fd, 0); /* lazily */
  if (b->addr == MAP_FAILED) {
    rc = -errno;
    free(b);
    goto out;
  }
  b->pool = p;
  b->id = id;
  b->size = (size_t)size;
  b->fd = -1;
  /* A pool that forwards keeps the fd of a large block its owner sealed
   * (within the process's bound) so another channel can introduce it:
   * only those are forwarded (bh__pool_forward). */
  if (p->forward && b->private_map && size >= BH__FORWARD_MIN) {
    if (atomic_fetch_add(&bh__peer_fds, 1) < bh__block_fds_max()) b->fd = fd, fd = -1;
    else atomic_fetch_sub(&bh__peer_fds, 1);
  }
  atomic_init(&b->refs, 0);
  pthread_mutex_lock(&p->mu);
  rc = bh__push_ptr(&p->peer, &p->n_peer, &p->cap_peer, b);
  if (!rc) p->peer_bytes += b->size;
  pthread_mutex_unlock(&p->mu);
  if (rc) bh__block_destroy(b);
out:
  if (fd >= 0) bh__close(fd);
  return rc;
}

int bh__pool_retire_peer(bh_pool *p, uint32_t id) {
  size_t at;
  pthread_mutex_lock(&p->mu);
  bh_block *b = bh__find(p->peer, p->n_peer, id, &at);
  if (!b || atomic_load(&b->refs) != 0) {
    pthread_mutex_unlock(&p->mu);
    return -BH_EBLOCK;
  }
  bh__remove_at(p->peer, &p->n_peer, at);
  p->peer_bytes -= b->size;
  pthread_mutex_unlock(&p->mu);
  if (b->fd >= 0) bh__forwards_forget(&b, 1); /* kept for forwards: those dormant go first */
  bh__block_destroy(b);
  return 0;
}

int bh__pool_peer_get(bh_pool *p, uint32_t id, bh_block **out) {
  pthread_mutex_lock(&p->mu);
  bh_block *b = bh__find(p->peer, p->n_peer, id, NULL);
  if (b) atomic_fetch_add(&b->refs, 1);
  pthread_mutex_unlock(&p->mu);
  if (!b) return -BH_EBLOCK;
  *out = b;
  return 0;
}

int bh__back_range(uint64_t size, const bh_tensor_ref *t) {
  if (t->offset % BH_ARENA_ALIGN || t->offset > size || t->nbytes > size - t->offset)
    return -BH_ETENSOR;
  return 0;
}

int bh__pool_back_get(bh_pool *p, const bh_tensor_ref *t, bh_block **out) {
  uint32_t id = t->block & ~BH_BLOCK_BACK;
  if (!(t->block & BH_BLOCK_BACK) || t->block == BH_BLOCK_NONE || t->block == BH_BLOCK_INLINE)
    return -BH_EBLOCK;
  pthread_mutex_lock(&p->mu);
  bh_block *b = bh__find(p->own, p->n_own, id, NULL);
  /* Lent: the peer maps it and holds a view, so its bytes are the ones the
   * peer read; once returned it may be reused at any time. */
  int rc = !b || !b->lent ? -BH_EBLOCK : bh__back_range(b->size, t);
  if (rc == 0) atomic_fetch_add(&b->refs, 1);
  pthread_mutex_unlock(&p->mu);
  if (rc == 0) *out = b;
  return rc;
}

/* PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>; spelled here for older headers). */
struct bh__page_region {
  uint64_t start, end, categories;
};
struct bh__pm_scan_arg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define BH__PAGEMAP_SCAN _IOWR('f', 16, struct bh__pm_scan_arg)
#define BH__PM_SCAN_CHECK_WPASYNC (1u << 1)
#define BH__PAGE_IS_WRITTEN (1u << 1)
#define BH__PAGE_IS_FILE (1u << 2)
#define BH__PAGE_IS_PRESENT (1u << 3)
#define BH__PAGE_IS_SWAPPED (1u << 4)
/* Ranges at least this large are checked on the copy helpers too. */
#define BH__SCAN_SPLIT_MIN ((uint64_t)16 << 20)

/* PAGEMAP_SCAN refused (an older kernel): pagemap is read instead. */
static atomic_int bh__pagemap_scan_off;

/* One PAGEMAP_SCAN of [addr, addr + n) for the first page whose
 * categories, with `inverted` flipped, hold every bit of `mask` and one
 * of `anyof`: 1 (its address in *at), 0 where none does, or a negative
 * errno.  The kernel walks the page tables itself, copies out no entry
 * per page, and skips ranges with no page tables. */
static int bh__scan_pages(int fd, const void *addr, size_t n, uint64_t flags, uint64_t inverted, uint64_t mask,
                          uint64_t anyof, uintptr_t *at) {
  uintptr_t first = (uintptr_t)addr / BH__PAGE, last = ((uintptr_t)addr + n - 1) / BH__PAGE;
  struct bh__page_region hit;
  struct bh__pm_scan_arg a = {
      .size = sizeof a, .flags = flags, .start = first * BH__PAGE, .end = (last + 1) * BH__PAGE,
      .vec = (uintptr_t)&hit, .vec_len = 1, .max_pages = 1,
      .category_inverted = inverted, .category_mask = mask, .category_anyof_mask = anyof,
      /* Only the kinds asked for: each one the kernel reports costs its
       * read (a page's file or anonymous kind: its struct page's). */
      .return_mask = mask | anyof};
  int got = ioctl(fd, BH__PAGEMAP_SCAN, &a);
  if (got < 0) return -errno;
  if (got > 0) *at = (uintptr_t)hit.start;
  return got > 0;
}

/* One PAGEMAP_SCAN of [addr, addr + n) on pagemap fd `fd`: 1 when no
 * page there is an anonymous one of this process, 0 when one is, or a
 * negative errno (-ENOTTY, -EINVAL: a kernel before 6.7). */
static int bh__scan_clean(int fd, const void *addr, size_t n) {
  /* Present or swapped, and not a file's: an anonymous page, written. */
  uintptr_t at;
  int rc = bh__scan_pages(fd, addr, n, 0, BH__PAGE_IS_FILE, BH__PAGE_IS_FILE,
                          BH__PAGE_IS_PRESENT | BH__PAGE_IS_SWAPPED, &at);
  return rc < 0 ? rc : rc == 0;
}

/* The first page of [addr, addr + n) present or swapped, of any kind:
 * where a check's walk of present pages starts. */
static int bh__scan_first(int fd, const void *addr, size_t n, uintptr_t *at) {
  return bh__scan_pages(fd, addr, n, 0, 0, 0, BH__PAGE_IS_PRESENT | BH__PAGE_IS_SWAPPED, at);
}

/* bh__range_clean on pagemap fd `fd` (open: the caller's). */
static int bh__range_clean_fd(int fd, const void *addr, uint64_t n) {
  const uint64_t PRESENT = 1ull << 63, SWAPPED = 1ull << 62, FILE_PAGE = 1ull << 61;
  uintptr_t first = (uintptr_t)addr / BH__PAGE, last = ((uintptr_t)addr + n - 1) / BH__PAGE;
  int rc = 1;
  if (!atomic_load_explicit(&bh__pagemap_scan_off, memory_order_relaxed)) {
    /* A walk of present pages costs ~25-50 ns a page here (64 MiB read:
     * 0.4-0.8 ms), so a large range is split over the copy helpers
     * (copy.c), from its first present page: a range never touched here
     * (a worker's cached tensor the host drops unread) is one quick walk
     * of no page tables, with no helper woken. */
    uintptr_t at = 0;
    if (n < BH__SCAN_SPLIT_MIN) {
      rc = bh__scan_clean(fd, addr, n);
    } else if ((rc = bh__scan_first(fd, addr, n, &at)) == 1) {
      uintptr_t skip = at > (uintptr_t)addr ? at - (uintptr_t)addr : 0;
      rc = bh__split_check(bh__scan_clean, fd, (const char *)addr + skip, n - skip);
    } else if (rc == 0) {
      rc = 1; /* nothing present or swapped: nothing written */
    }
    if (rc != -ENOTTY && rc != -EINVAL) return rc;
    atomic_store(&bh__pagemap_scan_off, 1);
    rc = 1;
  }
  uint64_t entries[512];
  for (uintptr_t page = first; page <= last && rc == 1;) {
    size_t want = last - page + 1 < 512 ? (size_t)(last - page + 1) : 512;
    ssize_t got = pread(fd, entries, want * sizeof *entries, (off_t)(page * sizeof *entries));
    if (got < (ssize_t)sizeof *entries) {
      rc = got < 0 ? -errno : -EIO;
      break;
    }
    size_t k = (size_t)got / sizeof *entries;
    for (size_t i = 0; i < k; i++)
      if ((entries[i] & SWAPPED) || ((entries[i] & PRESENT) && !(entries[i] & FILE_PAGE))) {
        rc = 0; /* a private (anonymous) page: written here */
        break;
      }
    page += k;
  }
  return rc;
}

int bh__range_clean(const void *addr, uint64_t n) {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = bh__range_clean_fd(fd, addr, n);
  close(fd);
  return rc;
}

/* p's pagemap fd (mu held), opened at its first check in this process:
 * an open of /proc/self/pagemap is half of what a check of a range never
 * touched here costs (a worker's cached tensor the host drops unread). */
static int bh__pool_pagemap(bh_pool *p) {
  pid_t me = getpid();
  if (p->pagemap_fd >= 0 && p->pagemap_pid == me) return p->pagemap_fd;
  if (p->pagemap_fd >= 0) close(p->pagemap_fd); /* the parent's, in a forked child */
  p->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  p->pagemap_pid = me;
  return p->pagemap_fd;
}

/* userfaultfd's asynchronous write protection (Linux 6.7; spelled here
 * for older headers).  A copy-on-write block's check above walks every
 * present page and reads its page's kind (~25-50 ns a page: a cache miss
 * each); a block write-protected asynchronously needs no such read: a
 * write there (the process's, or the kernel's on its behalf) clears its
 * page's protection bit as it copies the page, and the check is one
 * PAGEMAP_SCAN for a page without it (~1 ns a page: 64 MiB 17-25 us
 * against 400-600 us).  Protecting costs ~1.5-2 ms per 64 MiB mapped, so
 * only a block found unwritten at two returns is protected (one lent
 * again and again: a tensor its owner keeps and sends again, a dormant
 * forward), at its return, when no view of it is left to write in it
 * between the check and the protection.  A block written since is
 * unprotected when its written pages are dropped. */
#define BH__UFFD_FEATURE_WP_ASYNC (1ull << 15)
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1 /* Linux 5.11: all an unprivileged process may ask */
#endif

/* Refused here for good (no userfaultfd, not allowed: a container's
 * seccomp, or no asynchronous protection: a kernel before 6.7): blocks are
 * checked by their pages' kind only. */
static atomic_int bh__wp_off;

void bh__range_clean_wp_off(int off) { atomic_store(&bh__wp_off, off); }

/* p's userfaultfd (mu held), opened at its first protection in this
 * process, or -1. */
static int bh__pool_uffd(bh_pool *p) {
  pid_t me = getpid();
  if (p->uffd >= 0 && p->uffd_pid == me) return p->uffd;
  /* The parent's, in a forked child: it acts on the parent's memory.
   * Closing this copy leaves the parent's registrations as they are. */
  if (p->uffd >= 0) close(p->uffd);
  p->uffd = -1;
  if (atomic_load_explicit(&bh__wp_off, memory_order_relaxed) ||
      atomic_load_explicit(&bh__pagemap_scan_off, memory_order_relaxed))
    return -1;
  int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
  struct uffdio_api api = {.api = UFFD_API, .features = BH__UFFD_FEATURE_WP_ASYNC};
  if (fd >= 0 && ioctl(fd, UFFDIO_API, &api) == 0) {
    p->uffd = fd;
    p->uffd_pid = me;
    return fd;
  }
  int err = errno;
  if (fd >= 0) close(fd);
  if (err != EMFILE && err != ENFILE && err != ENOMEM) atomic_store(&bh__wp_off, 1);
  return -1;
}

/* Write-protects b (a copy-on-write peer block of p's, mu held, no view of
 * it left, found unwritten): from here its written pages are those without
 * the bit.  Best effort: unprotected, it is checked page by page. */
static void bh__block_protect(bh_pool *p, bh_block *b) {
  /* Only a block read here: one never touched is checked by a walk of no
   * page tables, where protecting it would put a marker in every page's
   * entry (tables it had none of) for each check to walk. */
  int uffd = bh__pool_uffd(p); /* first: where it is refused, no scan at each return */
  uintptr_t at;
  int pm = bh__pool_pagemap(p);
  if (uffd < 0 || pm < 0 || bh__scan_first(pm, b->addr, b->size, &at) != 1) return;
  struct uffdio_register reg = {.range = {(uintptr_t)b->addr, b->size}, .mode = UFFDIO_REGISTER_MODE_WP};
  struct uffdio_writeprotect wp = {.range = {(uintptr_t)b->addr, b->size}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) return;
  if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) == 0) {
    b->wp_pid = getpid();
    return;
  }
  /* Not protected after all (some pages may be): checked page by page, and
   * not left registered (bh__block_unprotect says why). */
  (void)ioctl(uffd, UFFDIO_UNREGISTER, &reg.range);
}

/* Unregisters b (mu held), protected here, once its written pages are
 * dropped: pages read again would come without the bit, and a range
 * registered for protection is faulted in a page at a time (the kernel
 * maps no neighbours with a fault there: 64 MiB read 17 ms, against 4-5
 * ms with them). */
static void bh__block_unprotect(bh_pool *p, bh_block *b) {
  if (b->wp_pid != getpid()) return;
  b->wp_pid = 0;
  /* Protected in this process: by p->uffd, which is this process's. */
  struct uffdio_range range = {(uintptr_t)b->addr, b->size};
  (void)ioctl(p->uffd, UFFDIO_UNREGISTER, &range);
}

/* bh__range_clean of [addr, addr + n) in a copy-on-write block write-
 * protected in process wp_pid (0: none) on pagemap fd `fd` (bh__pool_
 * pagemap's, or < 0: opened for this check).  Protected here: a page
 * without its bit was written (one scan); -EPERM there means the range is
 * not registered after all (checked page by page). */
static int bh__pool_range_clean(int fd, pid_t wp_pid, const void *addr, uint64_t n) {
  if (fd < 0) return bh__range_clean(addr, n);
  if (wp_pid == getpid()) { /* 0 (none) never is */
    uintptr_t at;
    int rc = bh__scan_pages(fd, addr, n, BH__PM_SCAN_CHECK_WPASYNC, 0, BH__PAGE_IS_WRITTEN, 0, &at);
    if (rc >= 0) return rc == 0;
  }
  return bh__range_clean_fd(fd, addr, n);
}

int bh__block_write_protected(const bh_block *b) {
  pthread_mutex_lock(&b->pool->mu);
  int on = b->private_map && b->wp_pid == getpid();
  pthread_mutex_unlock(&b->pool->mu);
  return on;
}

/* For tests: read pagemap as on a kernel without PAGEMAP_SCAN (1), or try
 * it again (0). */
void bh__range_clean_scan_off(int off) { atomic_store(&bh__pagemap_scan_off, off); }

int bh__pool_peer_find(bh_pool *p, const void *addr, uint64_t n, bh_block **out, uint64_t *offset) {
  uintptr_t a = (uintptr_t)addr;
  bh_block *found = NULL;
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < p->n_peer; i++) {
    bh_block *b = p->peer[i];
    uintptr_t lo = (uintptr_t)b->addr;
    if (a < lo || a - lo > b->size || n > b->size - (a - lo)) continue;
    /* Held: a view of it lives (the caller's), so no return is queued and
     * the peer keeps it lent; the reference taken keeps it so. */
    if (atomic_load(&b->refs) == 0 || (a - lo) % BH_ARENA_ALIGN) break;
    atomic_fetch_add(&b->refs, 1);
    found = b;
    *offset = a - lo;
    break;
  }
  int fd = found && found->private_map ? bh__pool_pagemap(p) : -1; /* p lives: found holds it */
  /* Changed only at a return (no reference left): not while found holds one. */
  pid_t wp_pid = found ? found->wp_pid : 0;
  pthread_mutex_unlock(&p->mu);
  if (!found) return -ENOENT;
  /* A copy-on-write one only where nothing was written here: the peer's
   * bytes are these. */
  if (found->private_map && bh__pool_range_clean(fd, wp_pid, addr, n) != 1) {
    bh_block_unref(found);
    return -ENOENT;
  }
  *out = found;
  return 0;
}

/* Whether n bytes at p are all zero. */
static int bh__zero(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

int bh__pool_forward(bh_pool *p, const void *addr, uint64_t n, bh_block **out, uint64_t *offset) {
  uintptr_t a = (uintptr_t)addr;
  bh_block *src = NULL, *f = NULL;
  uint64_t off = 0;
  int rc = -ENOENT;
  pthread_mutex_lock(&bh__pools_mu);
  for (bh_pool *q = bh__pools; q && !src; q = q->next) {
    if (q == p) continue;
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->n_peer; i++) {
      bh_block *b = q->peer[i];
      uintptr_t lo = (uintptr_t)b->addr;
      if (a < lo || a - lo > b->size || n > b->size - (a - lo)) continue;
      /* Held here (a view lives), so that peer keeps it lent; the
       * reference taken keeps it so while the forward lives.  Only a
       * block its owner sealed (see the top). */
      if (atomic_load(&b->refs) > 0 && b->fd >= 0 && b->private_map && (a - lo) % BH_ARENA_ALIGN == 0) {
        atomic_fetch_add(&b->refs, 1);
        src = b;
        off = a - lo;
      }
      break;
    }
    pthread_mutex_unlock(&q->mu);
  }
  pthread_mutex_unlock(&bh__pools_mu);
  if (!src) return -ENOENT;
  /* The receiver maps the whole block, so only a block that holds these
   * bytes alone goes: from its start, to its last page, whose tail is zero
   * (bh__pool_take clears it).  A range of a larger one -- another array
   * of the owner's message (an arena), the rest of the array a view was
   * cut from, the owner's older bytes past a tensor in a reused block --
   * would show the receiver bytes never sent to it: copied instead. */
  if (off != 0 || src->size - n >= BH__PAGE || !bh__zero((const char *)addr + n, src->size - n))
    goto err;
  /* Copy-on-write here (its owner sealed it): only where nothing was
   * written here, as the receiver must get the bytes this process sees. */
  pthread_mutex_lock(&p->mu);
  int fd = bh__pool_pagemap(p);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_lock(&src->pool->mu);
  pid_t wp_pid = src->wp_pid; /* changed only at a return: not while src is held */
  pthread_mutex_unlock(&src->pool->mu);
  if (bh__pool_range_clean(fd, wp_pid, addr, n) != 1) goto err;
  /* Sealed against writes by its owner (bh__pool_adopt saw the seal):
   * mappings made before (the owner's) stay writable, the receiver's
   * cannot be. */
  int seals = fcntl(src->fd, F_GET_SEALS);
  if (seals < 0 || !(seals & BH__WRITE_SEALS)) goto err;
  /* The receiver will hold its memfd for good: its owner must never
   * reuse the block for other bytes, which its return note will say.
   * Marked before the block can be forwarded, and kept where this forward
   * then fails (a block retired for nothing, never one reused too early). */
  pthread_mutex_lock(&src->pool->mu);
  src->spent = 1;
  pthread_mutex_unlock(&src->pool->mu);
  /* A dormant forward of this source: lent again as it is (the peer maps
   * it still), holding the reference just taken. */
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; !p->closed && i < p->n_dormant; i++) {
    bh_block *d = p->dormant[i];
    if (d->src != src) continue;
    if (bh__push_ptr(&p->own, &p->n_own, &p->cap_own, d)) break;
    bh__remove_at(p->dormant, &p->n_dormant, i);
    atomic_store(&d->refs, 1);
    d->last_used = ++p->clock;
    p->forwarded++;
    pthread_mutex_unlock(&p->mu);
    *out = d;
    *offset = off;
    return 0;
  }
  pthread_mutex_unlock(&p->mu);
  f = calloc(1, sizeof *f);
  if (!f) {
    rc = -ENOMEM;
    goto err;
  }
  f->pool = p;
  f->own = 1;
  f->src = src;
  f->addr = src->addr;
  f->size = src->size;
  f->fd = -1;
  atomic_init(&f->refs, 1);
  pthread_mutex_lock(&p->mu);
  if (p->closed || p->next_id >= BH_BLOCK_BACK || p->n_own >= BH__PEER_BLOCKS_MAX) {
    pthread_mutex_unlock(&p->mu);
    rc = -BH_EPOOLFULL;
    goto err;
  }
  f->id = p->next_id++;
  f->last_used = ++p->clock;
  rc = bh__push_ptr(&p->own, &p->n_own, &p->cap_own, f);
  if (!rc) p->forwarded++;
  pthread_mutex_unlock(&p->mu);
  if (rc) goto err;
  *out = f;
  *offset = off;
  return 0;
err:
  free(f);
  bh_block_unref(src);
  return rc;
}

int bh__pool_peer_check(bh_pool *p, const bh__lend *l, uint32_t n) {
  uint32_t found = 0;
  if (n == 0) return 0;
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < p->n_peer; i++) { /* peer ids are unique (adopt) */
    const bh_block *b = p->peer[i];
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (l[mid].id < b->id) lo = mid + 1;
      else hi = mid;
    }
    if (lo < n && l[lo].id == b->id && l[lo].size == b->size) found++;
  }
  pthread_mutex_unlock(&p->mu);
  return found == n ? 0 : -BH_EBLOCK;
}

static void bh__take(uint32_t *src, size_t *n_src, uint32_t *dst, uint32_t *n_dst, uint32_t max) {
  uint32_t n = *n_src < max ? (uint32_t)*n_src : max;
  if (n) memcpy(dst, src + (*n_src - n), n * sizeof *dst);
  *n_src -= n;
  *n_dst = n;
}

void bh__pool_take_notes(bh_pool *p, uint32_t *returns, uint32_t *n_returns,
                         uint32_t *retires, uint32_t *n_retires, uint32_t max) {
  pthread_mutex_lock(&p->mu);
  bh__take(p->returns, &p->n_returns, returns, n_returns, max);
  bh__take(p->retires, &p->n_retires, retires, n_retires, max);
  pthread_mutex_unlock(&p->mu);
}

/* ---- arenas: one message's small tensors, packed ---- */

_Static_assert(BH_ARENA_ITEM_MAX <= BH_ARENA_BLOCK_MIN && BH_ARENA_BLOCK_MIN <= BH_ARENA_BLOCK_MAX,
               "an arena block holds at least one item");
_Static_assert(BH__PAGE % BH_ARENA_ALIGN == 0, "blocks are whole pages: aligned offsets stay aligned");

int bh_arena_take(bh_pool *p, bh_arena *a, size_t nbytes, bh_block **out, uint64_t *offset) {
  if (!p || !a || !out || !offset || nbytes == 0 || nbytes > BH_ARENA_ITEM_MAX) return -EINVAL;
  size_t at = a->used;
  if (!a->block || nbytes > a->block->size - at) {
    size_t want = a->next_bytes ? a->next_bytes : BH_ARENA_BLOCK_MIN;
    bh_block *b;
    int rc = bh__pool_acquire(p, want, &b);
    if (rc) return rc;
    if (a->block) bh_block_unref(a->block); /* its tensors hold their own references */
    a->block = b;
    a->next_bytes = want < BH_ARENA_BLOCK_MAX ? want * 2 : BH_ARENA_BLOCK_MAX;
    at = 0;
  }
  /* nbytes <= BH_ARENA_ITEM_MAX <= BH_ARENA_BLOCK_MIN <= the block's size */
  a->used = (at + nbytes + BH_ARENA_ALIGN - 1) & ~(size_t)(BH_ARENA_ALIGN - 1);
  if (a->used > a->block->size) a->used = a->block->size;
  bh_block_ref(a->block);
  *out = a->block;
  *offset = at;
  return 0;
}

void bh_arena_close(bh_arena *a) {
  if (!a) return;
  if (a->block) bh_block_unref(a->block);
  memset(a, 0, sizeof *a);
}

/* ---- public block accessors ---- */

void *bh_block_addr(const bh_block *b) { return b->addr; }
size_t bh_block_size(const bh_block *b) { return b->size; }
uint32_t bh_block_id(const bh_block *b) { return b->id; }
int bh_block_is_own(const bh_block *b) { return b->own; }
int bh_block_is_private(const bh_block *b) { return b->private_map; }
int bh_block_is_lent(const bh_block *b) {
  pthread_mutex_lock(&b->pool->mu);
  int lent = b->lent != 0;
  pthread_mutex_unlock(&b->pool->mu);
  return lent;
}

void bh_block_ref(bh_block *b) { atomic_fetch_add(&b->refs, 1); }

void bh_block_unref(bh_block *b) {
  if (!b) return;
  bh_pool *p = b->pool;
  bh_block *src;
  pthread_mutex_lock(&p->mu);
  int free_pool = bh__unref_locked(p, b, &src);
  pthread_mutex_unlock(&p->mu);
  if (src) bh_block_unref(src);
  if (free_pool) bh__pool_free(p);
}

int bh_pool_stats_get(bh_pool *p, bh_pool_stats *s) {
  if (!p || !s) return -EINVAL;
  memset(s, 0, sizeof *s);
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < p->n_own; i++) {
    bh_block *b = p->own[i];
    if (b->src) { /* another channel's block: counted there */
      s->forward_blocks++;
      s->forward_bytes += b->size;
      continue;
    }
    s->own_blocks++;
    s->own_bytes += b->size;
    s->sealed_blocks += b->sealed;
    if (atomic_load(&b->refs) == 0) s->free_blocks++, s->free_bytes += b->size;
    if (b->lent) s->lent_blocks++;
  }
  for (size_t i = 0; i < p->n_peer; i++) {
    s->peer_blocks++;
    s->peer_bytes += p->peer[i]->size;
    s->peer_fds += p->peer[i]->fd >= 0;
  }
  s->created = p->created;
  s->reused = p->reused;
  s->forwarded = p->forwarded;
  s->spent = p->spent;
  s->spare_bytes = p->spare ? p->spare->size : 0;
  s->spare_takes = p->spare_takes;
  pthread_mutex_unlock(&p->mu);
  return 0;
}
