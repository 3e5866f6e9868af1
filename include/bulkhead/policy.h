/*
 * policy.h -- bulkhead's memory rules as pure functions.
 *
 * Every decision about memory that bulkhead makes is one of these
 * functions: numbers in, numbers out, no clock, no I/O, no global state.
 * The glue measures (NVML, /proc, the ledger, ComfyUI's own figures) and
 * acts (publishes a reserve, sends RELEASE); what to do in between is
 * decided here, so every rule of seed 002 Part 3 and DESIGN.md section 5
 * is a row in tests/c/test-policy.c.
 *
 * Byte counts are int64_t where a difference may be legitimately negative
 * (the change-of-variables term), uint64_t where it cannot.  Arithmetic
 * saturates instead of wrapping.  Arguments that come from ComfyUI as
 * floats (0.1, 1e32, total * 1.1 + extra) are taken as double and turned
 * into bytes by the functions that say how.
 */
#ifndef BULKHEAD_POLICY_H
#define BULKHEAD_POLICY_H

#include "bulkhead/bulkhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ComfyUI's own factor on the weights it is about to load (load_models_gpu:
 * total_memory_required * 1.1).  bulkhead keeps it: errors are one-sided,
 * over-admission hurts a bystander silently, under-admission costs a
 * reload, so headroom errs high. */
#define BH_POLICY_HEADROOM_NUM 11
#define BH_POLICY_HEADROOM_DEN 10

/* A float argument at or above this means "everything" (upstream passes
 * 1e32 to partially_load for "no limit" and 1e30 to free_memory from
 * unload_all_models). */
#define BH_POLICY_EVERYTHING 1e30

/* The change of variables (seed 002 Part 3).  Upstream computes
 * memory_to_free = memory_required - get_free_memory(device), and its free
 * figure is blind to other processes where the driver is (WDDM) or lags
 * where a worker has not allocated yet.  Passing
 *
 *     memory_required = need + (blind_free - true_free)
 *
 * makes upstream target need - true_free whatever its own reading says.
 * blind_free is upstream's figure WITHOUT this process's allocator cache
 * (get_free_memory(dev, torch_free_too=True) gives both; the cache is
 * subtracted here, arithmetically, never by flushing it), so upstream's
 * own re-measure (which adds the cache back) ends up counting the cache
 * once, as reusable.  The term is never clamped: it is negative while the
 * blind figure sits below the true one, and clamping it would over-evict.
 *
 * true_free_valid == 0 (no driver: nothing to arbitrate) returns need,
 * which is upstream's own semantics.  Saturates at INT64_MIN/MAX. */
BH_EXTERN int64_t bh_policy_ask_target(int64_t need_bytes, int64_t upstream_free_bytes,
                                       int64_t host_cache_bytes, int64_t true_free_bytes,
                                       int true_free_valid);

/* bytes * 1.1, rounded up, saturating: the headroom on weights. */
BH_EXTERN uint64_t bh_policy_headroom(uint64_t bytes);

/* What a worker's load must be admitted for, the way upstream's
 * load_models_gpu sizes its own free_memory call:
 *   headroom(weights) + max(minimum_inference, memory_required + extra_reserved)
 *   + cast_buffers
 * weights_bytes are the bytes still to load (the offloaded part of models
 * already on the device), cast_buffers_bytes the cast buffers the load
 * will allocate (booked into the ask, seed 004). */
BH_EXTERN uint64_t bh_policy_admission_need(uint64_t weights_bytes, uint64_t memory_required_bytes,
                                            uint64_t minimum_inference_bytes,
                                            uint64_t extra_reserved_bytes,
                                            uint64_t cast_buffers_bytes);

/* The part of an admitted worker load that no reading shows yet: what was
 * admitted minus what the worker's held bytes grew by since.  Never
 * negative; once the allocation shows in the worker's census it is 0. */
BH_EXTERN uint64_t bh_policy_pending(uint64_t admitted_bytes, uint64_t held_at_admission_bytes,
                                     uint64_t held_now_bytes);

/* The one value the host writes into ComfyUI, EXTRA_RESERVED_VRAM:
 * upstream's own reserve plus everything admitted to workers that no
 * reading shows yet.  Saturating. */
BH_EXTERN uint64_t bh_policy_reserve(uint64_t base_reserve_bytes, const uint64_t *pending_bytes,
                                     size_t n);

/* Bytes a StandIn's partially_load(device, extra_memory) asks its worker
 * to add: extra_memory >= BH_POLICY_EVERYTHING means the rest of the model;
 * anything else is floored to whole bytes (so upstream's 0.1 sentinel,
 * "load essentially nothing", is 0), clamped to what is not yet resident.
 * NaN and negative values are 0. */
BH_EXTERN uint64_t bh_policy_load_bytes(double extra_memory, uint64_t size_bytes,
                                        uint64_t resident_bytes);

/* Bytes a StandIn's partially_unload(device, memory_to_free) asks its
 * worker to release: exactly memory_to_free, rounded up to a whole byte,
 * clamped to what is resident.  NaN and negative values are 0. */
BH_EXTERN uint64_t bh_policy_unload_bytes(double memory_to_free, uint64_t resident_bytes);

/* The most a MemoryHolder ask plans for: the plan works in uint64 bytes,
 * and upstream asks with floats up to 1e30 ("everything"). */
#define BH_POLICY_ASK_MAX ((uint64_t)1 << 62)

/* Bytes the host's MemoryHolder plans for when upstream's eviction loop
 * asks release_memory(device, size): size floored to a whole byte, capped
 * at BH_POLICY_ASK_MAX (infinity and 1e30 included).  NaN, zero and
 * negative values are 0. */
BH_EXTERN uint64_t bh_policy_ask_bytes(double size);

/* Bytes actually freed, from residency read before and after (0 if it
 * grew). */
BH_EXTERN uint64_t bh_policy_freed(uint64_t before_bytes, uint64_t after_bytes);

/* One worker as the release planner sees it. */
typedef struct {
  int idle;                  /* not running a call, not releasing, not the asker */
  uint64_t last_used_ns;     /* CLOCK_MONOTONIC of its last call */
  uint64_t resident_bytes;   /* on the device in question */
  uint64_t floor_bytes;      /* what a full release cannot go below */
} bh_policy_worker;

/* One ask of a release plan. */
typedef struct {
  size_t index;              /* into the workers array */
  uint64_t bytes;            /* to release */
} bh_policy_ask;

/* The pressure-release plan: which idle workers release how much to cover
 * shortfall_bytes, least recently used first (ties: lower index first).
 * Busy workers are never asked; a worker is asked for at most what it
 * holds above its floor, and for no more than is still missing, so the
 * plan stops at the minimum.  Writes at most max_asks asks; returns how
 * many, and the shortfall the plan leaves uncovered through
 * *uncovered_bytes (may be NULL).  -EINVAL on NULL arrays with n > 0. */
BH_EXTERN int bh_policy_release_plan(const bh_policy_worker *workers, size_t n,
                                     uint64_t shortfall_bytes, bh_policy_ask *asks,
                                     size_t max_asks, uint64_t *uncovered_bytes);

/* The idle sweep: writes the indices of workers idle for at least
 * idle_after_ns at now_ns and holding anything above their floor, least
 * recently used first; at most max_out.  idle_after_ns == 0 disables the
 * sweep (returns 0).  Returns the count. */
BH_EXTERN int bh_policy_idle_sweep(const bh_policy_worker *workers, size_t n, uint64_t now_ns,
                                   uint64_t idle_after_ns, size_t *out, size_t max_out);

/* Upstream's pinned-memory ceiling on Linux (seed 002 1.7):
 *   max(ram * 0.40, min(ram * 0.90, ram - 4 GiB, ram + swap - 16 GiB))
 * and ram * 0.40 on Windows.  Never negative. */
BH_EXTERN uint64_t bh_policy_pin_ceiling(uint64_t ram_bytes, uint64_t swap_bytes, int windows);

/* One budget split across processes sharing a cgroup (seed 001 row 8):
 * each of n_processes gets an equal share of total_bytes; n_processes 0
 * is treated as 1. */
BH_EXTERN uint64_t bh_policy_share(uint64_t total_bytes, unsigned n_processes);

#ifdef __cplusplus
}
#endif
#endif
