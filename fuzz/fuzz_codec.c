/*
 * fuzz_codec.c -- the value decoder on arbitrary bytes.
 *
 * What a peer's value bytes reach: bh_dec_validate (the receiver checks a
 * whole value before building anything from it) and bh_reader/bh_dec_next
 * (the walk the extension and the command do item by item).  Checked on
 * every input:
 *   - a flat walk with bh_dec_next never moves backwards or past the end,
 *     leaves the position alone on an error, returns only the codes the
 *     header promises, and every item it yields re-encodes (through the
 *     real encoders) to exactly the bytes it consumed: strings and bytes
 *     point inside the buffer (each byte is read, for ASan), tensor refs
 *     pass bh_tensor_ref_check (an ARRAY's too, its description inside
 *     the item and never empty), a range's step is never 0, and
 *     bh_item_children counts exactly a container's items;
 *   - bh_dec_validate agrees with a recursive reference walk built on
 *     bh_dec_next, at the depth the input's first byte picks and at
 *     BH_MAX_DEPTH;
 *   - a value that validates needs exactly the nesting it has: it passes
 *     at that depth and fails with BH_EDEPTH one below.
 */
#include "fuzz.h"

#include <string.h>

/* The item re-encoded; 0 when it gives back exactly p[0..n). */
static int reencode_differs(const bh_item *it, const uint8_t *p, size_t n) {
  bh_buf b;
  int rc = 0;
  bh_buf_init(&b);
  switch (it->tag) {
  case BH_TAG_NIL: rc = bh_enc_nil(&b); break;
  case BH_TAG_FALSE: rc = bh_enc_bool(&b, 0); break;
  case BH_TAG_TRUE: rc = bh_enc_bool(&b, 1); break;
  case BH_TAG_INT: rc = bh_enc_int(&b, it->u.i); break;
  case BH_TAG_FLOAT: rc = bh_enc_float(&b, it->u.f); break;
  case BH_TAG_STR: rc = bh_enc_str(&b, (const char *)it->u.s.p, it->u.s.n); break;
  case BH_TAG_BYTES: rc = bh_enc_bytes(&b, it->u.s.p, it->u.s.n); break;
  case BH_TAG_LIST: rc = bh_enc_list(&b, it->u.count); break;
  case BH_TAG_TUPLE: rc = bh_enc_tuple(&b, it->u.count); break;
  case BH_TAG_MAP: rc = bh_enc_map(&b, it->u.count); break;
  case BH_TAG_TENSOR: rc = bh_enc_tensor(&b, &it->u.t); break;
  case BH_TAG_HANDLE: rc = bh_enc_handle(&b, &it->u.h); break;
  case BH_TAG_SET: rc = bh_enc_set(&b, it->u.count); break;
  case BH_TAG_FROZENSET: rc = bh_enc_frozenset(&b, it->u.count); break;
  case BH_TAG_COMPLEX: rc = bh_enc_complex(&b, it->u.c.real, it->u.c.imag); break;
  case BH_TAG_RANGE: rc = bh_enc_range(&b, it->u.r.start, it->u.r.stop, it->u.r.step); break;
  case BH_TAG_ARRAY: rc = bh_enc_array(&b, it->desc, it->desc_len, &it->u.t); break;
  default: rc = -1;
  }
  int differs = rc != 0 || b.len != n || memcmp(b.data, p, n) != 0;
  bh_buf_free(&b);
  return differs;
}

static int is_container(uint8_t tag) {
  return tag == BH_TAG_LIST || tag == BH_TAG_TUPLE || tag == BH_TAG_MAP || tag == BH_TAG_SET ||
         tag == BH_TAG_FROZENSET;
}

/* The reference: one value, recursively, as the header describes it. */
static int ref_value(bh_reader *r, unsigned depth, unsigned max_depth, unsigned *deepest) {
  bh_item it;
  int rc = bh_dec_next(r, &it);
  if (rc) return rc;
  if (!is_container(it.tag)) return 0;
  uint64_t n = it.tag == BH_TAG_MAP ? 2 * (uint64_t)it.u.count : it.u.count;
  if (n == 0) return 0;
  if (depth + 1 > max_depth) return -BH_EDEPTH;
  if (depth + 1 > *deepest) *deepest = depth + 1;
  for (uint64_t i = 0; i < n; i++)
    if ((rc = ref_value(r, depth + 1, max_depth, deepest))) return rc;
  return 0;
}

static int ref_validate(const uint8_t *p, size_t n, unsigned max_depth, unsigned *deepest) {
  bh_reader r;
  if (max_depth > BH_MAX_DEPTH) max_depth = BH_MAX_DEPTH;
  *deepest = 0;
  bh_reader_init(&r, p, n);
  int rc = ref_value(&r, 0, max_depth, deepest);
  if (rc) return rc;
  return r.pos == r.len ? 0 : -BH_ETRAILING;
}

static void flat_walk(const uint8_t *data, size_t size) {
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, data, size);
  while (r.pos < r.len) {
    size_t before = r.pos;
    int rc = bh_dec_next(&r, &it);
    if (rc) {
      FUZZ_RC_IN(rc, -BH_EOVERRUN, -BH_EBADTAG, -BH_EUTF8, -BH_ECOUNT, -BH_ETENSOR, -BH_EDTYPE,
                 -BH_EBODY);
      FUZZ_CHECK(r.pos == before);
      return;
    }
    FUZZ_CHECK(r.pos > before && r.pos <= r.len);
    if (it.tag == BH_TAG_STR || it.tag == BH_TAG_BYTES) {
      FUZZ_CHECK(it.u.s.p >= data + before && it.u.s.p + it.u.s.n <= data + r.pos);
      fuzz_touch(it.u.s.p, it.u.s.n);
    }
    if (it.tag == BH_TAG_TENSOR || it.tag == BH_TAG_ARRAY) FUZZ_CHECK(bh_tensor_ref_check(&it.u.t) == 0);
    if (it.tag == BH_TAG_ARRAY) { /* the description inside the item's bytes, never empty */
      FUZZ_CHECK(it.desc_len > 0 && (const uint8_t *)it.desc >= data + before &&
                 (const uint8_t *)it.desc + it.desc_len <= data + r.pos);
      fuzz_touch(it.desc, it.desc_len);
    } else {
      FUZZ_CHECK(it.desc == NULL);
    }
    if (it.tag == BH_TAG_RANGE) FUZZ_CHECK(it.u.r.step != 0);
    if (is_container(it.tag)) {
      /* Each item takes a byte at least: the count cannot exceed what is left. */
      uint64_t items = it.tag == BH_TAG_MAP ? 2 * (uint64_t)it.u.count : it.u.count;
      FUZZ_CHECK(items <= r.len - r.pos);
      FUZZ_CHECK(bh_item_children(&it) == items);
    } else {
      FUZZ_CHECK(bh_item_children(&it) == 0);
    }
    FUZZ_CHECK(!reencode_differs(&it, data + before, r.pos - before));
  }
  /* At the end: one more read is an overrun, nothing else. */
  FUZZ_CHECK(bh_dec_next(&r, &it) == -BH_EOVERRUN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned deepest;
  flat_walk(data, size);

  int full = bh_dec_validate(data, size, BH_MAX_DEPTH);
  FUZZ_CHECK(full == ref_validate(data, size, BH_MAX_DEPTH, &deepest));
  if (full == 0) {
    FUZZ_CHECK(bh_dec_validate(data, size, deepest) == 0);
    if (deepest > 0) FUZZ_CHECK(bh_dec_validate(data, size, deepest - 1) == -BH_EDEPTH);
  } else {
    FUZZ_RC_IN(full, -BH_EOVERRUN, -BH_EBADTAG, -BH_EUTF8, -BH_ECOUNT, -BH_ETENSOR, -BH_EDTYPE,
               -BH_EDEPTH, -BH_ETRAILING, -BH_EBODY);
  }

  /* A depth the input picks, past BH_MAX_DEPTH too (it is clamped). */
  unsigned d = size ? data[size - 1] % (BH_MAX_DEPTH + 8) : 0;
  FUZZ_CHECK(bh_dec_validate(data, size, d) == ref_validate(data, size, d, &deepest));
  return 0;
}
