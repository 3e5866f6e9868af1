/*
 * policy.c -- bulkhead's memory rules (see include/bulkhead/policy.h).
 *
 * Pure functions only: no I/O, no clock, no allocation, no globals.  Each
 * rule is table-tested in tests/c/test-policy.c; the glue measures and
 * acts, this file decides.  Arithmetic saturates rather than wraps, since
 * callers pass figures from ComfyUI (1e30 "everything") that do not fit.
 */
#include "internal.h"
#include "bulkhead/policy.h"

#include <math.h>

static int64_t sat_add_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

static int64_t sat_sub_i64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? INT64_MAX : INT64_MIN;
  return r;
}

static uint64_t sat_add_u64(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* x * num / den rounded up, without overflowing the intermediate. */
static uint64_t mul_ratio_up(uint64_t x, uint64_t num, uint64_t den) {
  unsigned __int128 r = ((unsigned __int128)x * num + den - 1) / den;
  return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

static uint64_t mul_ratio(uint64_t x, uint64_t num, uint64_t den) {
  unsigned __int128 r = (unsigned __int128)x * num / den;
  return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

int64_t bh_policy_ask_target(int64_t need_bytes, int64_t upstream_free_bytes,
                             int64_t host_cache_bytes, int64_t true_free_bytes,
                             int true_free_valid) {
  if (!true_free_valid) return need_bytes;
  int64_t blind_free = sat_sub_i64(upstream_free_bytes, host_cache_bytes);
  /* Never clamped: negative while blind < true (the idle case). */
  return sat_add_i64(need_bytes, sat_sub_i64(blind_free, true_free_bytes));
}

uint64_t bh_policy_headroom(uint64_t bytes) {
  return mul_ratio_up(bytes, BH_POLICY_HEADROOM_NUM, BH_POLICY_HEADROOM_DEN);
}

uint64_t bh_policy_admission_need(uint64_t weights_bytes, uint64_t memory_required_bytes,
                                  uint64_t minimum_inference_bytes, uint64_t extra_reserved_bytes,
                                  uint64_t cast_buffers_bytes) {
  uint64_t extra = sat_add_u64(memory_required_bytes, extra_reserved_bytes);
  if (extra < minimum_inference_bytes) extra = minimum_inference_bytes;
  return sat_add_u64(sat_add_u64(bh_policy_headroom(weights_bytes), extra), cast_buffers_bytes);
}

uint64_t bh_policy_pending(uint64_t admitted_bytes, uint64_t held_at_admission_bytes,
                           uint64_t held_now_bytes) {
  uint64_t grown = held_now_bytes > held_at_admission_bytes
                       ? held_now_bytes - held_at_admission_bytes : 0;
  return admitted_bytes > grown ? admitted_bytes - grown : 0;
}

uint64_t bh_policy_reserve(uint64_t base_reserve_bytes, const uint64_t *pending_bytes, size_t n) {
  uint64_t r = base_reserve_bytes;
  for (size_t i = 0; pending_bytes != NULL && i < n; i++) r = sat_add_u64(r, pending_bytes[i]);
  return r;
}

uint64_t bh_policy_load_bytes(double extra_memory, uint64_t size_bytes, uint64_t resident_bytes) {
  uint64_t missing = size_bytes > resident_bytes ? size_bytes - resident_bytes : 0;
  if (!(extra_memory > 0)) return 0; /* NaN, 0, negative */
  if (extra_memory >= BH_POLICY_EVERYTHING) return missing;
  double whole = floor(extra_memory); /* 0.1 -> 0: "essentially nothing" */
  if (whole >= (double)missing) return missing;
  return (uint64_t)whole;
}

uint64_t bh_policy_unload_bytes(double memory_to_free, uint64_t resident_bytes) {
  if (!(memory_to_free > 0)) return 0;
  double whole = ceil(memory_to_free);
  if (whole >= (double)resident_bytes) return resident_bytes;
  return (uint64_t)whole;
}

uint64_t bh_policy_ask_bytes(double size) {
  if (!(size > 0)) return 0;
  if (size >= (double)BH_POLICY_ASK_MAX) return BH_POLICY_ASK_MAX;
  return (uint64_t)size;
}

uint64_t bh_policy_freed(uint64_t before_bytes, uint64_t after_bytes) {
  return before_bytes > after_bytes ? before_bytes - after_bytes : 0;
}

static uint64_t above_floor(const bh_policy_worker *w) {
  return w->resident_bytes > w->floor_bytes ? w->resident_bytes - w->floor_bytes : 0;
}

/* Least recently used first; ties by index, so the order is total. */
static int lru_before(const bh_policy_worker *workers, size_t a, size_t b) {
  if (workers[a].last_used_ns != workers[b].last_used_ns)
    return workers[a].last_used_ns < workers[b].last_used_ns;
  return a < b;
}

/* Picks, among candidates not yet taken, the least recently used one that
 * passes `want`; n is small (workers of one machine), so a selection scan
 * keeps this allocation-free.  Returns n when none is left. */
static size_t next_lru(const bh_policy_worker *workers, size_t n, const uint8_t *taken,
                       int (*want)(const bh_policy_worker *, const void *), const void *arg) {
  size_t best = n;
  for (size_t i = 0; i < n; i++) {
    if (taken[i] || !want(&workers[i], arg)) continue;
    if (best == n || lru_before(workers, i, best)) best = i;
  }
  return best;
}

static int want_releasable(const bh_policy_worker *w, const void *arg) {
  (void)arg;
  return w->idle && above_floor(w) > 0;
}

struct sweep_arg { uint64_t now_ns, idle_after_ns; };

static int want_swept(const bh_policy_worker *w, const void *arg) {
  const struct sweep_arg *s = arg;
  return w->idle && above_floor(w) > 0 && w->last_used_ns <= s->now_ns &&
         s->now_ns - w->last_used_ns >= s->idle_after_ns;
}

/* Planning is bounded by this many workers (a ledger holds fewer). */
#define BH__POLICY_MAX_WORKERS 256

int bh_policy_release_plan(const bh_policy_worker *workers, size_t n, uint64_t shortfall_bytes,
                           bh_policy_ask *asks, size_t max_asks, uint64_t *uncovered_bytes) {
  if ((n > 0 && workers == NULL) || (max_asks > 0 && asks == NULL) || n > BH__POLICY_MAX_WORKERS)
    return -EINVAL;
  uint8_t taken[BH__POLICY_MAX_WORKERS] = {0};
  uint64_t missing = shortfall_bytes;
  size_t k = 0;
  while (missing > 0 && k < max_asks) {
    size_t i = next_lru(workers, n, taken, want_releasable, NULL);
    if (i == n) break;
    taken[i] = 1;
    uint64_t give = above_floor(&workers[i]);
    if (give > missing) give = missing;
    asks[k].index = i;
    asks[k].bytes = give;
    k++;
    missing -= give;
  }
  if (uncovered_bytes != NULL) *uncovered_bytes = missing;
  return (int)k;
}

int bh_policy_idle_sweep(const bh_policy_worker *workers, size_t n, uint64_t now_ns,
                         uint64_t idle_after_ns, size_t *out, size_t max_out) {
  if ((n > 0 && workers == NULL) || (max_out > 0 && out == NULL) || n > BH__POLICY_MAX_WORKERS)
    return -EINVAL;
  if (idle_after_ns == 0) return 0;
  uint8_t taken[BH__POLICY_MAX_WORKERS] = {0};
  struct sweep_arg arg = {now_ns, idle_after_ns};
  size_t k = 0;
  while (k < max_out) {
    size_t i = next_lru(workers, n, taken, want_swept, &arg);
    if (i == n) break;
    taken[i] = 1;
    out[k++] = i;
  }
  return (int)k;
}

uint64_t bh_policy_pin_ceiling(uint64_t ram_bytes, uint64_t swap_bytes, int windows) {
  const uint64_t gib = 1024ull * 1024 * 1024;
  uint64_t floor40 = mul_ratio(ram_bytes, 40, 100);
  if (windows) return floor40;
  uint64_t m = mul_ratio(ram_bytes, 90, 100);
  uint64_t ram_less_4g = ram_bytes > 4 * gib ? ram_bytes - 4 * gib : 0;
  if (ram_less_4g < m) m = ram_less_4g;
  uint64_t with_swap = sat_add_u64(ram_bytes, swap_bytes);
  with_swap = with_swap > 16 * gib ? with_swap - 16 * gib : 0;
  if (with_swap < m) m = with_swap;
  return m > floor40 ? m : floor40;
}

uint64_t bh_policy_share(uint64_t total_bytes, unsigned n_processes) {
  return total_bytes / (n_processes ? n_processes : 1);
}
