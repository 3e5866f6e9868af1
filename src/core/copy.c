/*
 * copy.c -- one large copy split over threads started for it.
 *
 * A tensor that crosses a channel new is copied once, into a block of the
 * sender's pool (already faulted: blocks are created prefaulted and
 * reused).  One thread's memcpy of 64 MiB is bounded by what one core can
 * pull from memory, about half of what two can; torch's copy_ splits the
 * same copy over its intra-op threads.  bh_copy does what copy_ does, on
 * threads of bulkhead's own: the calling thread copies the first share and
 * threads-1 helper threads, started for this call and joined before it
 * returns, copy one contiguous share each.  The helpers are started per
 * call, not kept in a pool: a worker forked from a zygote inherits no
 * threads, and a start costs tens of microseconds against the milliseconds
 * of a copy large enough to be split.  How many threads to use is the
 * caller's choice (Python's channel/tensors.py reads how many CPUs are
 * idle): on a machine whose CPUs are all busy a split copy waits for its
 * slowest share's thread to be scheduled, and one thread is faster.
 */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#define BH__COPY_THREADS_MAX 16
#define BH__COPY_ALIGN 64 /* shares start on cache-line multiples */

struct bh__share {
  char *dst;
  const char *src;
  size_t nbytes;
};

static void *copy_share(void *arg) {
  struct bh__share *s = arg;
  memcpy(s->dst, s->src, s->nbytes);
  return NULL;
}

int bh_copy(void *dst, const void *src, size_t nbytes, unsigned threads) {
  if ((!dst || !src) && nbytes) return -EINVAL;
  if (threads == 0) return -EINVAL;
  if (threads > BH__COPY_THREADS_MAX) threads = BH__COPY_THREADS_MAX;
  size_t share = (nbytes / threads + BH__COPY_ALIGN - 1) & ~(size_t)(BH__COPY_ALIGN - 1);
  if (threads == 1 || share == 0 || share >= nbytes) {
    if (nbytes) memcpy(dst, src, nbytes);
    return 1;
  }
  struct bh__share shares[BH__COPY_THREADS_MAX];
  pthread_t tids[BH__COPY_THREADS_MAX];
  int started[BH__COPY_THREADS_MAX] = {0};
  unsigned n = 0;
  for (size_t off = 0; off < nbytes && n < threads; off += share, n++) {
    shares[n].dst = (char *)dst + off;
    shares[n].src = (const char *)src + off;
    shares[n].nbytes = nbytes - off < share ? nbytes - off : share;
  }
  /* The last share takes whatever the rounding left. */
  size_t covered = (size_t)(shares[n - 1].dst - (char *)dst) + shares[n - 1].nbytes;
  shares[n - 1].nbytes += nbytes - covered;
  int copied_by = 1;
  for (unsigned i = 1; i < n; i++) {
    /* A helper that cannot be started leaves its share to this thread. */
    started[i] = pthread_create(&tids[i], NULL, copy_share, &shares[i]) == 0;
    copied_by += started[i];
  }
  copy_share(&shares[0]);
  for (unsigned i = 1; i < n; i++) {
    if (started[i])
      pthread_join(tids[i], NULL);
    else
      copy_share(&shares[i]);
  }
  return copied_by;
}
