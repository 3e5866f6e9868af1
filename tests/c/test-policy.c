/*
 * test-policy.c -- every memory rule as rows of a table (DESIGN.md 5,
 * seed 002 Part 3).  The functions are pure, so each row is inputs and
 * the one right answer; a row names the rule it pins.
 */
#include "task.h"

#include "bulkhead/policy.h"

#include <math.h>

#define MiB (1024ll * 1024)
#define GiB (1024ll * MiB)

TEST_IMPL(policy_ask_target) {
  static const struct {
    const char *rule;
    int64_t need, upstream_free, cache, true_free;
    int valid;
    int64_t want;
  } rows[] = {
    {"blind == true: the term vanishes", 2 * GiB, 5 * GiB, 0, 5 * GiB, 1, 2 * GiB},
    {"blind above true (WDDM pinned budget): ask more", 2 * GiB, 8 * GiB, 0, 5 * GiB, 1, 5 * GiB},
    {"blind below true: the term is negative, never clamped", 2 * GiB, 3 * GiB, 0, 5 * GiB, 1, 0},
    {"negative result stays negative", 1 * GiB, 3 * GiB, 0, 6 * GiB, 1, -2 * GiB},
    {"host cache is subtracted from the blind figure", 2 * GiB, 6 * GiB, 1 * GiB, 5 * GiB, 1, 2 * GiB},
    {"cache only: upstream's re-measure adds it back", 1 * GiB, 5 * GiB, 2 * GiB, 3 * GiB, 1, 1 * GiB},
    {"no driver: upstream's own semantics", 2 * GiB, 8 * GiB, 1 * GiB, 0, 0, 2 * GiB},
    {"saturates high", INT64_MAX, INT64_MAX, 0, INT64_MIN, 1, INT64_MAX},
    {"saturates low", INT64_MIN, INT64_MIN, 0, INT64_MAX, 1, INT64_MIN},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    int64_t got = bh_policy_ask_target(rows[i].need, rows[i].upstream_free, rows[i].cache,
                                       rows[i].true_free, rows[i].valid);
    if (got != rows[i].want) fprintf(stderr, "row %zu: %s\n", i, rows[i].rule);
    ASSERT_EQ(got, rows[i].want);
    /* The identity the rule exists for: upstream then frees
     * target - (blind + cache) = need - true_free - cache. */
    if (rows[i].valid && i < 7) {
      int64_t upstream_frees = got - rows[i].upstream_free;
      ASSERT_EQ(upstream_frees, rows[i].need - rows[i].true_free - rows[i].cache);
    }
  }
  return 0;
}

TEST_IMPL(policy_headroom_and_admission) {
  ASSERT_UEQ(bh_policy_headroom(0), 0);
  ASSERT_UEQ(bh_policy_headroom(10), 11);
  ASSERT_UEQ(bh_policy_headroom(1), 2); /* rounds up: errs high */
  ASSERT_UEQ(bh_policy_headroom(1000 * MiB), 1100 * MiB);
  ASSERT_UEQ(bh_policy_headroom(UINT64_MAX), UINT64_MAX);

  static const struct {
    const char *rule;
    uint64_t weights, required, min_inf, extra_reserved, cast, want;
  } rows[] = {
    {"minimum inference wins over a small ask", 1000 * MiB, 0, 800 * MiB, 400 * MiB, 0,
     1100 * MiB + 800 * MiB},
    {"memory_required + reserve wins when larger", 1000 * MiB, 600 * MiB, 800 * MiB, 400 * MiB,
     0, 1100 * MiB + 1000 * MiB},
    {"cast buffers are booked into the ask", 1000 * MiB, 0, 800 * MiB, 0, 64 * MiB,
     1100 * MiB + 800 * MiB + 64 * MiB},
    {"nothing to load still asks for the floor", 0, 0, 800 * MiB, 0, 0, 800 * MiB},
    {"saturates", UINT64_MAX, UINT64_MAX, 0, UINT64_MAX, 1, UINT64_MAX},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    uint64_t got = bh_policy_admission_need(rows[i].weights, rows[i].required, rows[i].min_inf,
                                            rows[i].extra_reserved, rows[i].cast);
    if (got != rows[i].want) fprintf(stderr, "row %zu: %s\n", i, rows[i].rule);
    ASSERT_UEQ(got, rows[i].want);
  }
  return 0;
}

TEST_IMPL(policy_pending_and_reserve) {
  /* admitted, held at admission, held now -> still pending */
  ASSERT_UEQ(bh_policy_pending(2 * GiB, 1 * GiB, 1 * GiB), 2 * GiB);  /* nothing shows yet */
  ASSERT_UEQ(bh_policy_pending(2 * GiB, 1 * GiB, 2 * GiB), 1 * GiB);  /* half shows */
  ASSERT_UEQ(bh_policy_pending(2 * GiB, 1 * GiB, 5 * GiB), 0);        /* all shows */
  ASSERT_UEQ(bh_policy_pending(2 * GiB, 3 * GiB, 1 * GiB), 2 * GiB);  /* it shrank */

  uint64_t pending[] = {1 * GiB, 0, 512 * MiB};
  ASSERT_UEQ(bh_policy_reserve(400 * MiB, pending, 3), 400 * MiB + 1 * GiB + 512 * MiB);
  ASSERT_UEQ(bh_policy_reserve(400 * MiB, NULL, 0), 400 * MiB);
  uint64_t huge[] = {UINT64_MAX, 5};
  ASSERT_UEQ(bh_policy_reserve(1, huge, 2), UINT64_MAX);
  return 0;
}

TEST_IMPL(policy_load_and_unload_bytes) {
  const uint64_t size = 1000 * MiB;
  static const struct {
    const char *rule;
    double arg;
    uint64_t resident, want;
  } loads[] = {
    {"1e32 means everything", 1e32, 0, 1000 * MiB},
    {"1e32 with part resident: the rest", 1e32, 300 * MiB, 700 * MiB},
    {"0.1 means essentially nothing", 0.1, 0, 0},
    {"0.9 is still nothing", 0.9, 0, 0},
    {"a byte budget is obeyed", 123456789.0, 0, 123456789},
    {"a float budget is floored", 1.9e8 + 0.75, 0, 190000000},
    {"budget above what is missing is clamped", 900.0 * MiB, 300 * MiB, 700 * MiB},
    {"0 loads nothing", 0.0, 0, 0},
    {"negative loads nothing", -5.0, 0, 0},
    {"NaN loads nothing", NAN, 0, 0},
    {"infinity means everything", INFINITY, 100 * MiB, 900 * MiB},
    {"fully resident: nothing to add", 1e32, 1000 * MiB, 0},
  };
  for (size_t i = 0; i < sizeof loads / sizeof loads[0]; i++) {
    uint64_t got = bh_policy_load_bytes(loads[i].arg, size, loads[i].resident);
    if (got != loads[i].want) fprintf(stderr, "load row %zu: %s\n", i, loads[i].rule);
    ASSERT_UEQ(got, loads[i].want);
  }
  static const struct {
    const char *rule;
    double arg;
    uint64_t resident, want;
  } unloads[] = {
    {"exactly n bytes", 300.0 * MiB, 1000 * MiB, 300 * MiB},
    {"a fraction of a byte rounds up", 0.5, 1000, 1},
    {"float arithmetic from upstream", 1.1 * 100 * MiB + 0.2, 1000 * MiB,
     (uint64_t)ceil(1.1 * 100 * MiB + 0.2)},
    {"more than resident: all of it", 5e9, 1000 * MiB, 1000 * MiB},
    {"1e30 from unload_all_models", 1e30, 1000 * MiB, 1000 * MiB},
    {"nothing resident", 5.0, 0, 0},
    {"zero", 0.0, 1000, 0},
    {"negative", -1.0, 1000, 0},
    {"NaN", NAN, 1000, 0},
  };
  for (size_t i = 0; i < sizeof unloads / sizeof unloads[0]; i++) {
    uint64_t got = bh_policy_unload_bytes(unloads[i].arg, unloads[i].resident);
    if (got != unloads[i].want) fprintf(stderr, "unload row %zu: %s\n", i, unloads[i].rule);
    ASSERT_UEQ(got, unloads[i].want);
  }
  static const struct {
    const char *rule;
    double arg;
    uint64_t want;
  } asks[] = {
    {"a byte count is taken as it is", 300.0 * MiB, 300 * MiB},
    {"a float ask is floored", 100.0 * MiB + 0.5, 100 * MiB},
    {"under a byte is nothing", 0.5, 0},
    {"1e30 (everything) is capped", 1e30, BH_POLICY_ASK_MAX},
    {"infinity is capped", INFINITY, BH_POLICY_ASK_MAX},
    {"2^62 exactly", 4611686018427387904.0, BH_POLICY_ASK_MAX},
    {"zero", 0.0, 0},
    {"negative", -5.0, 0},
    {"minus infinity", -INFINITY, 0},
    {"NaN", NAN, 0},
  };
  for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
    uint64_t got = bh_policy_ask_bytes(asks[i].arg);
    if (got != asks[i].want) fprintf(stderr, "ask row %zu: %s\n", i, asks[i].rule);
    ASSERT_UEQ(got, asks[i].want);
  }
  ASSERT_UEQ(bh_policy_freed(1000, 400), 600);
  ASSERT_UEQ(bh_policy_freed(400, 1000), 0);
  ASSERT_UEQ(bh_policy_freed(7, 7), 0);
  return 0;
}

TEST_IMPL(policy_release_plan) {
  /* idle, last_used, resident, floor */
  const bh_policy_worker w[] = {
    {1, 300, 4 * GiB, 0},          /* 0: idle, used recently */
    {1, 100, 2 * GiB, 512 * MiB},  /* 1: idle, least recently used */
    {0, 50, 8 * GiB, 0},           /* 2: busy: never asked */
    {1, 200, 1 * GiB, 1 * GiB},    /* 3: idle, nothing above its floor */
    {1, 200, 3 * GiB, 0},          /* 4: idle, middle */
  };
  bh_policy_ask asks[8];
  uint64_t uncovered = 1;

  /* Covered by the least recently used alone: one ask, for the minimum. */
  ASSERT_EQ(bh_policy_release_plan(w, 5, 1 * GiB, asks, 8, &uncovered), 1);
  ASSERT_UEQ(asks[0].index, 1);
  ASSERT_UEQ(asks[0].bytes, 1 * GiB);
  ASSERT_UEQ(uncovered, 0);

  /* Needs three: LRU order 1, 4, 0; the last asked only for the rest. */
  ASSERT_EQ(bh_policy_release_plan(w, 5, 6 * GiB, asks, 8, &uncovered), 3);
  ASSERT_UEQ(asks[0].index, 1);
  ASSERT_UEQ(asks[0].bytes, 1536 * MiB);
  ASSERT_UEQ(asks[1].index, 4);
  ASSERT_UEQ(asks[1].bytes, 3 * GiB);
  ASSERT_UEQ(asks[2].index, 0);
  ASSERT_UEQ(asks[2].bytes, 6 * GiB - 1536 * MiB - 3 * GiB);
  ASSERT_UEQ(uncovered, 0);

  /* More than all idle workers hold: everything idle, the rest uncovered;
   * the busy one (8 GiB) is not touched. */
  ASSERT_EQ(bh_policy_release_plan(w, 5, 20 * GiB, asks, 8, &uncovered), 3);
  ASSERT_UEQ(uncovered, 20 * GiB - (1536 * MiB + 3 * GiB + 4 * GiB));

  /* max_asks bounds the plan. */
  ASSERT_EQ(bh_policy_release_plan(w, 5, 20 * GiB, asks, 1, &uncovered), 1);
  ASSERT_UEQ(asks[0].index, 1);

  /* Nothing short: no asks. */
  ASSERT_EQ(bh_policy_release_plan(w, 5, 0, asks, 8, &uncovered), 0);
  ASSERT_UEQ(uncovered, 0);

  /* Ties in last-used go to the lower index. */
  const bh_policy_worker tie[] = {{1, 5, GiB, 0}, {1, 5, GiB, 0}};
  ASSERT_EQ(bh_policy_release_plan(tie, 2, 1, asks, 8, NULL), 1);
  ASSERT_UEQ(asks[0].index, 0);

  ASSERT_EQ(bh_policy_release_plan(NULL, 1, 1, asks, 8, NULL), -EINVAL);
  ASSERT_EQ(bh_policy_release_plan(w, 5, 1, NULL, 8, NULL), -EINVAL);
  ASSERT_EQ(bh_policy_release_plan(NULL, 0, 1, NULL, 0, &uncovered), 0);
  ASSERT_UEQ(uncovered, 1);
  return 0;
}

TEST_IMPL(policy_idle_sweep) {
  const uint64_t s = 1000000000ull;
  const bh_policy_worker w[] = {
    {1, 100 * s, GiB, 0},     /* 0: idle 900 s */
    {1, 990 * s, GiB, 0},     /* 1: idle 10 s */
    {0, 0, GiB, 0},           /* 2: busy */
    {1, 50 * s, GiB, GiB},    /* 3: idle long, nothing above floor */
    {1, 40 * s, 2 * GiB, 0},  /* 4: idle longest */
    {1, 2000 * s, GiB, 0},    /* 5: last used "after now" (clock skew): not idle */
  };
  size_t out[8];
  ASSERT_EQ(bh_policy_idle_sweep(w, 6, 1000 * s, 60 * s, out, 8), 2);
  ASSERT_UEQ(out[0], 4);
  ASSERT_UEQ(out[1], 0);
  ASSERT_EQ(bh_policy_idle_sweep(w, 6, 1000 * s, 5 * s, out, 8), 3);
  ASSERT_UEQ(out[2], 1);
  ASSERT_EQ(bh_policy_idle_sweep(w, 6, 1000 * s, 0, out, 8), 0); /* disabled */
  ASSERT_EQ(bh_policy_idle_sweep(w, 6, 1000 * s, 5 * s, out, 1), 1);
  ASSERT_EQ(bh_policy_idle_sweep(NULL, 1, 0, 1, out, 8), -EINVAL);
  return 0;
}

TEST_IMPL(policy_pin_ceiling_and_share) {
  static const struct {
    const char *rule;
    uint64_t ram, swap;
    int windows;
    uint64_t want;
  } rows[] = {
    {"64 GiB, no swap: ram - 16 GiB beats 90% and ram - 4", 64 * GiB, 0, 0, 48 * GiB},
    {"32 GiB + 32 GiB swap: ram - 4 GiB", 32 * GiB, 32 * GiB, 0, 28 * GiB},
    {"64 GiB + 64 GiB swap: 90%", 64 * GiB, 64 * GiB, 0, (uint64_t)(64 * GiB) * 9 / 10},
    {"24 GiB, no swap: 40% floor beats ram - 16", 24 * GiB, 0, 0, (uint64_t)(24 * GiB) * 4 / 10},
    {"2 GiB: ram - 4 would be negative; 40%", 2 * GiB, 0, 0, (uint64_t)(2 * GiB) * 4 / 10},
    {"Windows: 40%", 64 * GiB, 64 * GiB, 1, (uint64_t)(64 * GiB) * 4 / 10},
    {"nothing", 0, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    uint64_t got = bh_policy_pin_ceiling(rows[i].ram, rows[i].swap, rows[i].windows);
    if (got != rows[i].want) fprintf(stderr, "row %zu: %s\n", i, rows[i].rule);
    ASSERT_UEQ(got, rows[i].want);
  }
  ASSERT_UEQ(bh_policy_share(12 * GiB, 3), 4 * GiB);
  ASSERT_UEQ(bh_policy_share(12 * GiB, 0), 12 * GiB);
  ASSERT_UEQ(bh_policy_share(10, 3), 3);
  return 0;
}
