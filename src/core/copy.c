/*
 * copy.c -- one large copy (or page-table check), split over helper
 * threads kept for it.
 *
 * A tensor that crosses a channel new is copied once, into a block of the
 * sender's pool (already faulted: blocks are created prefaulted and
 * reused).  Two things decide what that copy costs on a machine like ours
 * (2 CPUs, 64 MiB):
 *
 *   - How it stores.  A destination this large does not stay in any cache
 *     for the peer, and ordinary stores read each destination line before
 *     writing it.  Stores that bypass the cache (x86's non-temporal
 *     stores) write lines without reading them: one thread copies 64 MiB
 *     in about 60 % of memcpy's time here, as fast as torch's copy_ on its
 *     two intra-op threads.  glibc's memcpy streams so only past its
 *     x86_non_temporal_threshold, 3/4 of the shared cache it computes,
 *     which on some machines is far above any tensor (240 MiB on our 2-CPU
 *     EPYC VM, whose L3 is 32 MiB; ld.so --list-tunables shows it).
 *     Copies of at least BH__COPY_STREAM_MIN bytes stream (8 and 12 MiB
 *     here too: a copy and a read of it 0.8 and 1.2 ms against memcpy's
 *     1.0 and 2.1, and a reader on the other CPU found memcpy's bytes no
 *     faster); smaller ones stay memcpy's (a 3 MiB IMAGE, which the next
 *     node may find in a large cache elsewhere).
 *   - How many threads share it.  Two cores pull about twice what one
 *     does.  The calling thread and up to threads-1 helpers claim 1 MiB
 *     chunks from one counter until none is left, so a helper that is not
 *     scheduled (a busy machine) costs nothing: the caller copies its
 *     chunks, and waits only for chunks a helper has claimed.  A split
 *     into fixed shares (what this file did, and torch's copy_ does)
 *     waits for the slowest share's thread to be scheduled.
 *
 * The helpers are started at the first split copy and kept, asleep on a
 * condition variable between copies (starting threads per call cost a
 * clone and a join that waits for the thread to be scheduled and exit,
 * whether or not it copied anything).  One copy uses them at a time: a
 * copy that finds them serving another copies alone.  A process forked
 * from one that has them (a worker forked by a zygote) has none: the fork
 * handler forgets them, and its first split copy starts its own.  They
 * block every signal, so a signal meant for the process never runs on
 * them.
 *
 * The same helpers run a large check (bh__split_check), 4 MiB a claim:
 * shm.c's of a copy-on-write range for pages written here
 * (bh__range_clean: a block mapped copy-on-write, at its return, not
 * write-protected), where the kernel's walk of present pages costs ~25 ns
 * a page on our VM, 0.4 ms for 64 MiB read, and two threads walk it in
 * ~0.25 ms.  The first part that fails ends the check: chunks claimed
 * after it are counted, not checked.  (The check is a function the caller
 * passes: this file calls no other of the core's.)
 *
 * Claims and jobs: the job is published under `mu` (its fields, then the
 * claim word, then `gen`); a helper reads the fields under `mu` and then
 * claims chunks with a compare-and-swap on the claim word, whose high 32
 * bits are the job's sequence number.  A helper that wakes late, after
 * its job went and another began, finds another sequence there and claims
 * nothing, so it never writes with an old job's pointers.  The caller
 * returns once every chunk is copied (`done`), so no helper touches the
 * caller's memory after bh_copy returns.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#ifdef BH_HAS_STREAM_STORES
#include <emmintrin.h>
#define BH__COPY_RELAX() _mm_pause()
#else
#define BH__COPY_RELAX() ((void)0)
#endif

#define BH__COPY_THREADS_MAX 16
#define BH__COPY_CHUNK ((size_t)1 << 20)        /* what one claim copies */
#define BH__CHECK_CHUNK ((size_t)4 << 20)        /* what one claim of a check covers: 1,024 pages */
#define BH__CHECK_THREADS_MAX 4
#define BH__COPY_STREAM_MIN ((size_t)4 << 20)   /* copies this large bypass the cache */
#define BH__COPY_HELPER_STACK ((size_t)64 << 10)
#define BH__COPY_SPIN 2000 /* checks of `done` (with a pause each) before the caller sleeps */

static struct {
  pthread_mutex_t busy; /* held by the copy the helpers serve */
  pthread_mutex_t mu;   /* the job's fields, gen, slots, n_helpers */
  pthread_cond_t wake;  /* helpers: a new job */
  pthread_cond_t done_cv; /* the caller: the last chunk is copied */
  unsigned n_helpers;
  uint32_t gen;   /* the current job's sequence number */
  unsigned slots; /* helpers the current job still takes */
  char *dst;
  const char *src;
  size_t nbytes, n_chunks;
  int stream;
  bh__check_fn check;     /* a check's (bh__split_check), or NULL: a copy */
  int check_fd;           /* the check's fd */
  _Atomic int clean;      /* a check's verdict: 1 passed, else the first other answer */
  _Atomic uint64_t claim; /* gen << 32 | next chunk */
  _Atomic size_t done;    /* chunks copied */
  _Atomic unsigned helped; /* helpers that copied a chunk of this job */
} bh__cp = {
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};
static pthread_once_t bh__cp_once = PTHREAD_ONCE_INIT;

/* n bytes from src to dst; stream: with stores that bypass the cache
 * (ordered before return by a fence), where the CPU has them. */
static void copy_bytes(char *dst, const char *src, size_t n, int stream) {
#ifdef BH_HAS_STREAM_STORES
  if (stream) {
    size_t head = (size_t)(-(uintptr_t)dst & 63); /* to a cache line */
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
      __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i));
      __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
      __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32));
      __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
      _mm_stream_si128((__m128i *)(void *)(dst + i), a);
      _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
      _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c);
      _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + body, src + body, n - body);
    return;
  }
#endif
  (void)stream;
  memcpy(dst, src, n);
}

/* Claims and copies chunks of job `gen` (whose fields the caller read)
 * until none is left or the job is another's.  A helper counts itself in
 * `helped` at its first chunk, before that chunk counts in `done` (which
 * the caller reads before `helped`).  Returns the chunks copied. */
static size_t copy_chunks(uint32_t gen, char *dst, const char *src, size_t nbytes, size_t n_chunks, int stream,
                          bh__check_fn check, int check_fd, int helper) {
  size_t copied = 0, chunk = check ? BH__CHECK_CHUNK : BH__COPY_CHUNK;
  uint64_t w = atomic_load_explicit(&bh__cp.claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(w >> 32) != gen || (w & UINT32_MAX) >= n_chunks) break;
    if (!atomic_compare_exchange_weak_explicit(&bh__cp.claim, &w, w + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue;
    size_t off = (size_t)(w & UINT32_MAX) * chunk;
    size_t n = nbytes - off < chunk ? nbytes - off : chunk;
    if (!check) {
      copy_bytes(dst + off, src + off, n, stream);
    } else if (atomic_load_explicit(&bh__cp.clean, memory_order_relaxed) == 1) { /* else decided */
      int rc = check(check_fd, src + off, n);
      int one = 1;
      if (rc != 1) atomic_compare_exchange_strong(&bh__cp.clean, &one, rc);
    }
    if (helper && copied == 0) atomic_fetch_add_explicit(&bh__cp.helped, 1, memory_order_relaxed);
    copied++;
    if (atomic_fetch_add_explicit(&bh__cp.done, 1, memory_order_acq_rel) + 1 == n_chunks) {
      pthread_mutex_lock(&bh__cp.mu); /* the caller waits for `done` under mu */
      pthread_cond_signal(&bh__cp.done_cv);
      pthread_mutex_unlock(&bh__cp.mu);
    }
    w = atomic_load_explicit(&bh__cp.claim, memory_order_acquire);
  }
  return copied;
}

/* arg: the last job before the helper was started (the next, published
 * while it starts, is one for it). */
static void *copy_helper(void *arg) {
  uint32_t seen = (uint32_t)(uintptr_t)arg;
  pthread_mutex_lock(&bh__cp.mu);
  for (;;) {
    while (bh__cp.gen == seen || bh__cp.slots == 0) {
      seen = bh__cp.gen; /* a job that wants no more helpers is not this one's */
      pthread_cond_wait(&bh__cp.wake, &bh__cp.mu);
    }
    seen = bh__cp.gen;
    bh__cp.slots--;
    char *dst = bh__cp.dst;
    const char *src = bh__cp.src;
    size_t nbytes = bh__cp.nbytes, n_chunks = bh__cp.n_chunks;
    int stream = bh__cp.stream, check_fd = bh__cp.check_fd;
    bh__check_fn check = bh__cp.check;
    pthread_mutex_unlock(&bh__cp.mu);
    copy_chunks(seen, dst, src, nbytes, n_chunks, stream, check, check_fd, 1);
    pthread_mutex_lock(&bh__cp.mu);
  }
  return NULL;
}

/* A forked child has none of its parent's helpers; the locks and condition
 * variables may have been held by threads that are not there. */
static void copy_atfork_child(void) {
  pthread_mutex_init(&bh__cp.busy, NULL);
  pthread_mutex_init(&bh__cp.mu, NULL);
  pthread_cond_init(&bh__cp.wake, NULL);
  pthread_cond_init(&bh__cp.done_cv, NULL);
  bh__cp.n_helpers = 0;
  bh__cp.slots = 0;
}

static void copy_register_atfork(void) { pthread_atfork(NULL, NULL, copy_atfork_child); }

/* Starts helpers until there are `want` (mu held); fewer where a thread
 * cannot be started (the copy then has fewer hands). */
static void copy_start_helpers(unsigned want) {
  if (bh__cp.n_helpers >= want) return;
  pthread_once(&bh__cp_once, copy_register_atfork);
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, BH__COPY_HELPER_STACK);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* a new thread inherits the mask */
  while (bh__cp.n_helpers < want) {
    pthread_t tid;
    if (pthread_create(&tid, &attr, copy_helper, (void *)(uintptr_t)bh__cp.gen) != 0) break;
    bh__cp.n_helpers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
}

/* Runs one job on the calling thread and up to threads - 1 helpers (the
 * caller holds `busy`): a copy, or a check (check set).  Returns the
 * threads that took part. */
static int run_job(char *dst, const char *src, size_t nbytes, size_t n_chunks, int stream, bh__check_fn check,
                   int check_fd, unsigned threads) {
  pthread_mutex_lock(&bh__cp.mu);
  copy_start_helpers(threads - 1);
  uint32_t gen = ++bh__cp.gen;
  bh__cp.dst = dst;
  bh__cp.src = src;
  bh__cp.nbytes = nbytes;
  bh__cp.n_chunks = n_chunks;
  bh__cp.stream = stream;
  bh__cp.check = check;
  bh__cp.check_fd = check_fd;
  atomic_store_explicit(&bh__cp.clean, 1, memory_order_relaxed);
  atomic_store_explicit(&bh__cp.done, 0, memory_order_relaxed);
  atomic_store_explicit(&bh__cp.helped, 0, memory_order_relaxed);
  atomic_store_explicit(&bh__cp.claim, (uint64_t)gen << 32, memory_order_release);
  bh__cp.slots = threads - 1 < bh__cp.n_helpers ? threads - 1 : bh__cp.n_helpers;
  for (unsigned i = 0; i < bh__cp.slots; i++) pthread_cond_signal(&bh__cp.wake);
  pthread_mutex_unlock(&bh__cp.mu);

  copy_chunks(gen, dst, src, nbytes, n_chunks, stream, check, check_fd, 0);
  /* What is left is a helper's last chunk or two: tens of microseconds
   * where the helper runs, so spin that long before sleeping. */
  for (int i = 0; i < BH__COPY_SPIN && atomic_load_explicit(&bh__cp.done, memory_order_acquire) != n_chunks; i++)
    BH__COPY_RELAX();
  if (atomic_load_explicit(&bh__cp.done, memory_order_acquire) != n_chunks) {
    pthread_mutex_lock(&bh__cp.mu);
    while (atomic_load_explicit(&bh__cp.done, memory_order_acquire) != n_chunks)
      pthread_cond_wait(&bh__cp.done_cv, &bh__cp.mu);
    pthread_mutex_unlock(&bh__cp.mu);
  }
  pthread_mutex_lock(&bh__cp.mu);
  bh__cp.slots = 0; /* helpers not woken yet take no part */
  pthread_mutex_unlock(&bh__cp.mu);
  return 1 + (int)atomic_load_explicit(&bh__cp.helped, memory_order_relaxed);
}

int bh_copy(void *dst, const void *src, size_t nbytes, unsigned threads) {
  if ((!dst || !src) && nbytes) return -EINVAL;
  if (threads == 0) return -EINVAL;
  if (threads > BH__COPY_THREADS_MAX) threads = BH__COPY_THREADS_MAX;
  int stream = nbytes >= BH__COPY_STREAM_MIN;
  size_t n_chunks = (nbytes + BH__COPY_CHUNK - 1) / BH__COPY_CHUNK;
  /* One thread, one chunk, or the helpers serving another copy: here. */
  if (threads == 1 || n_chunks < 2 || pthread_mutex_trylock(&bh__cp.busy) != 0) {
    if (nbytes) copy_bytes(dst, src, nbytes, stream);
    return 1;
  }
  int copied_by = run_job(dst, src, nbytes, n_chunks, stream, NULL, -1, threads);
  pthread_mutex_unlock(&bh__cp.busy);
  return copied_by;
}

int bh__split_check(bh__check_fn check, int fd, const void *addr, size_t nbytes) {
  size_t n_chunks = (nbytes + BH__CHECK_CHUNK - 1) / BH__CHECK_CHUNK;
  cpu_set_t cpus;
  unsigned threads = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? (unsigned)CPU_COUNT(&cpus) : 1;
  if (threads > BH__CHECK_THREADS_MAX) threads = BH__CHECK_THREADS_MAX;
  if (threads < 2 || n_chunks < 2 || pthread_mutex_trylock(&bh__cp.busy) != 0)
    return check(fd, addr, nbytes);
  run_job(NULL, addr, nbytes, n_chunks, 0, check, fd, threads);
  int rc = atomic_load_explicit(&bh__cp.clean, memory_order_relaxed);
  pthread_mutex_unlock(&bh__cp.busy);
  return rc;
}
