/*
 * text.c -- the `bulkhead` command's own pure helpers: byte sizes and
 * seconds parsed ("1.5GiB", "0.5"), the bars `top` draws, and the answer a
 * host's control socket sends `release` decoded.  The helpers the status
 * renderings share (sizes and idle times printed, JSON strings, text for a
 * terminal) are the status library's (src/status/text.c).
 *
 * Nothing here does I/O or reads a clock, so tests/c/test-cli.c drives
 * every function with tables.  The answer comes from any process that can
 * listen on a host's control socket path, so its reader is total on any
 * bytes (fuzz/fuzz_answer.c).
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------ sizes */

static const struct {
  const char *suffix;
  uint64_t mult;
} bh__suffixes[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},   {"kib", 1ull << 10}, {"kb", 1000ull},
    {"m", 1ull << 20},   {"mib", 1ull << 20}, {"mb", 1000000ull},
    {"g", 1ull << 30},   {"gib", 1ull << 30}, {"gb", 1000000000ull},
    {"t", 1ull << 40},   {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    {"p", 1ull << 50},   {"pib", 1ull << 50}, {"pb", 1000000000000000ull},
};

int bh_cli_bytes_parse(const char *s, uint64_t *out) {
  uint64_t whole = 0, frac = 0, frac_scale = 1, mult = 0;
  int digits = 0, frac_digits = 0, point = 0, overflow = 0;
  const char *p = s;
  if (!s || !out) return -EINVAL;
  for (; *p >= '0' && *p <= '9'; p++, digits++) {
    unsigned d = (unsigned)(*p - '0');
    if (whole > (UINT64_MAX - d) / 10) overflow = 1;
    else whole = whole * 10 + d;
  }
  if (*p == '.') {
    point = 1;
    for (p++; *p >= '0' && *p <= '9'; p++, frac_digits++) {
      if (frac_digits < 18) { /* more digits cannot change whole bytes of a PiB */
        frac = frac * 10 + (uint64_t)(*p - '0');
        frac_scale *= 10;
      }
    }
  }
  if (digits + frac_digits == 0) return -EINVAL;
  while (*p == ' ') p++;
  for (size_t i = 0; i < sizeof bh__suffixes / sizeof bh__suffixes[0]; i++)
    if (strcasecmp(p, bh__suffixes[i].suffix) == 0) mult = bh__suffixes[i].mult;
  if (mult == 0) return -EINVAL;         /* unknown suffix or trailing junk */
  if (point && mult == 1) return -EINVAL; /* "1.5" bytes: say what you mean */
  if (overflow || (mult > 1 && whole > UINT64_MAX / mult)) return -ERANGE;
  uint64_t n = whole * mult;
  uint64_t part = (uint64_t)((long double)mult * (long double)frac / (long double)frac_scale);
  if (n > UINT64_MAX - part) return -ERANGE;
  *out = n + part;
  return 0;
}

/* ------------------------------------------------------------ times */

int bh_cli_seconds_parse(const char *s, double lo, double hi, double *out) {
  char *end = NULL;
  if (!s || !out || !*s) return -EINVAL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -EINVAL;
  *out = v;
  return 0;
}

/* ------------------------------------------------------------- bars */

void bh_cli_bar(char *dst, uint64_t part, uint64_t whole, unsigned width) {
  unsigned fill = 0;
  if (width > 0 && whole > 0 && part > 0) {
    long double f = (long double)part / (long double)whole * width + 0.5L;
    fill = f >= width ? width : (unsigned)f;
    if (fill == 0) fill = 1;
  }
  memset(dst, '|', fill);
  memset(dst + fill, '.', width - fill);
  dst[width] = 0;
}

/* ------------------------------------------------- a host's answer */

/* Steps over the rest of a value whose first item is `it`. */
static int bh__answer_skip(bh_reader *r, const bh_item *it) {
  uint64_t n = bh_item_children(it);
  for (uint64_t i = 0; i < n; i++) {
    bh_item sub;
    int rc = bh_dec_next(r, &sub);
    if (rc < 0 || (rc = bh__answer_skip(r, &sub)) < 0) return rc;
  }
  return 0;
}

static void bh__answer_str(char *dst, size_t len, const bh_item *it) {
  size_t n = it->u.s.n < len - 1 ? it->u.s.n : len - 1;
  memcpy(dst, it->u.s.p, n);
  dst[n] = 0;
}

/* Walks the entries of a map whose header is `map` (the reader just past
 * it): each value whose key is a string goes to take(key, its length,
 * the value's first item, ctx), every entry is stepped over whole. */
static int bh__map_each(bh_reader *r, const bh_item *map,
                        void (*take)(const char *k, size_t kn, const bh_item *val, void *ctx), void *ctx) {
  bh_item key, val;
  int rc;
  for (uint32_t i = 0; i < map->u.count; i++) {
    if ((rc = bh_dec_next(r, &key)) < 0 || (rc = bh__answer_skip(r, &key)) < 0) return rc;
    if ((rc = bh_dec_next(r, &val)) < 0) return rc;
    if (key.tag == BH_TAG_STR) take((const char *)key.u.s.p, key.u.s.n, &val, ctx);
    if ((rc = bh__answer_skip(r, &val)) < 0) return rc;
  }
  return 0;
}

#define BH__KEY(name) (kn == sizeof(name) - 1 && memcmp(k, name, kn) == 0)

static void bh__take_answer(const char *k, size_t kn, const bh_item *val, void *ctx) {
  bh_cli_answer *a = ctx;
  if (val->tag == BH_TAG_INT) {
    if (BH__KEY("worker_pid")) a->worker_pid = val->u.i;
    else if (BH__KEY("before_bytes")) a->before_bytes = val->u.i;
    else if (BH__KEY("after_bytes")) a->after_bytes = val->u.i;
    else if (BH__KEY("freed_bytes")) a->freed_bytes = val->u.i;
  } else if (val->tag == BH_TAG_STR) {
    if (BH__KEY("pack")) bh__answer_str(a->pack, sizeof a->pack, val);
    else if (BH__KEY("type")) bh__answer_str(a->type, sizeof a->type, val);
    else if (BH__KEY("message")) bh__answer_str(a->message, sizeof a->message, val);
  }
}

#define BH__PACK_STR(member) {#member, offsetof(bh_cli_pack, member), sizeof((bh_cli_pack *)0)->member}
const bh_cli_pack_str bh_cli_pack_strs[BH_CLI_PACK_STRS] = {
    BH__PACK_STR(name),    BH__PACK_STR(state), BH__PACK_STR(reason),  BH__PACK_STR(fix),
    BH__PACK_STR(sandbox), BH__PACK_STR(log),   BH__PACK_STR(actions), BH__PACK_STR(command),
};
#undef BH__PACK_STR

static void bh__take_pack(const char *k, size_t kn, const bh_item *val, void *ctx) {
  bh_cli_pack *out = ctx;
  if (val->tag == BH_TAG_INT && BH__KEY("pid")) out->pid = val->u.i;
  else if (val->tag == BH_TAG_STR)
    for (int i = 0; i < BH_CLI_PACK_STRS; i++) {
      const bh_cli_pack_str *f = &bh_cli_pack_strs[i];
      if (kn == strlen(f->key) && memcmp(k, f->key, kn) == 0) {
        bh__answer_str((char *)out + f->offset, f->size, val);
        break;
      }
    }
}

#undef BH__KEY

int bh_cli_answer_read(const uint8_t *p, size_t n, bh_cli_answer *a) {
  bh_reader r;
  bh_item it;
  int rc = bh_dec_validate(p, n, BH_MAX_DEPTH);
  if (rc < 0) return rc;
  bh_reader_init(&r, p, n);
  if ((rc = bh_dec_next(&r, &it)) < 0) return rc;
  if (it.tag != BH_TAG_MAP) return -BH_EBADTAG;
  return bh__map_each(&r, &it, bh__take_answer, a);
}

/* ------------------------------------------------- a host's packs */

int bh_cli_packs_read(const uint8_t *p, size_t n, bh_cli_pack *rows, int max, int *count) {
  bh_reader r;
  bh_item it, row;
  int rc = bh_dec_validate(p, n, BH_MAX_DEPTH);
  *count = 0;
  if (rc < 0) return rc;
  bh_reader_init(&r, p, n);
  if ((rc = bh_dec_next(&r, &it)) < 0) return rc;
  if (it.tag != BH_TAG_LIST && it.tag != BH_TAG_TUPLE) return -BH_EBADTAG;
  for (uint32_t i = 0; i < it.u.count; i++) {
    if ((rc = bh_dec_next(&r, &row)) < 0) return rc;
    if (row.tag != BH_TAG_MAP || *count >= max) { /* not a row, or past what the caller keeps: skipped */
      if ((rc = bh__answer_skip(&r, &row)) < 0) return rc;
      continue;
    }
    bh_cli_pack *out = &rows[(*count)++];
    memset(out, 0, sizeof *out);
    out->pid = -1;
    if ((rc = bh__map_each(&r, &row, bh__take_pack, out)) < 0) return rc;
  }
  return 0;
}
