/*
 * codec.c -- bulkhead's typed value encoding.
 *
 * A value is one tag byte followed by its body (little-endian):
 *   NIL FALSE TRUE                 no body
 *   INT                            i64
 *   FLOAT                          f64 (IEEE-754 bits)
 *   STR BYTES                      u32 length, bytes (STR is UTF-8)
 *   LIST TUPLE                     u32 count, count values
 *   MAP                            u32 count, count (key, value) pairs
 *   TENSOR                         u8 lib (low 4 bits; a torch tensor's
 *                                  flags in the high 4: protocol 9),
 *                                  u8 dtype, u8 ndim, u32 block,
 *                                  u64 offset, u64 nbytes,
 *                                  ndim x i64 shape, ndim x i64 strides,
 *                                  and for block BH_BLOCK_INLINE the
 *                                  nbytes bytes of the tensor
 *   HANDLE                         u8 space, u64 id, u16 type-name length,
 *                                  type name (UTF-8, at most BH_TYPE_NAME_MAX)
 *   SET FROZENSET                  u32 count, count values (protocol 8)
 *   COMPLEX                        f64 real, f64 imaginary
 *   RANGE                          i64 start, i64 stop, i64 step (never 0)
 *   ARRAY                          u16 description length (1 at least),
 *                                  description (UTF-8), then one whole
 *                                  TENSOR value, tag and all: a numpy
 *                                  array whose dtype no BH_DT_* code names
 *                                  (a record, datetime64[unit], a
 *                                  byte-swapped or string dtype) as the
 *                                  uint8 tensor of its bytes, shape
 *                                  (..., itemsize), the last stride 1; lib
 *                                  NUMPY, or NUMPY_SCALAR with shape
 *                                  (itemsize).  The description is the
 *                                  glue's (channel/tensors.py: JSON of
 *                                  the dtype); the core bounds it and
 *                                  checks its UTF-8, the glue checks that
 *                                  it names a dtype of that itemsize.
 *
 * Decoding is total: every read checks the bytes left first, a container's
 * count may not exceed the bytes left (each item takes one byte at least)
 * nor, over the whole value, BH_MAX_ITEMS (what a decoder builds from one
 * frame stays bounded whatever its size),
 * strings are checked for UTF-8, tensor refs for consistency, a range's
 * step and an ARRAY's tensor for what their tags promise (-BH_EBODY).  A
 * set's items are not checked for hashability here: the Python glue does
 * (src/python/codec.c), where hashing means something.  Nothing here
 * allocates on the decode side.
 */
#include "internal.h"

/* ---- dtypes ---- */

unsigned bh_dtype_itemsize(unsigned dtype) {
  switch (dtype) {
#define BH__DT_SIZE(name, code, size, str) case code: return size;
    BH_DTYPE_MAP(BH__DT_SIZE)
#undef BH__DT_SIZE
  }
  return 0;
}

const char *bh_dtype_name(unsigned dtype) {
  switch (dtype) {
#define BH__DT_STR(name, code, size, str) case code: return str;
    BH_DTYPE_MAP(BH__DT_STR)
#undef BH__DT_STR
  }
  return NULL;
}

/* ---- output buffer ---- */

void bh_buf_init(bh_buf *b) { memset(b, 0, sizeof *b); }

void bh_buf_free(bh_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

int bh_buf_reserve(bh_buf *b, size_t extra) {
  if (b->err) return b->err;
  if (extra <= b->cap - b->len) return 0;
  if (extra > SIZE_MAX / 2 - b->len) return b->err = -ENOMEM;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < extra) cap *= 2;
  uint8_t *p = realloc(b->data, cap);
  if (!p) return b->err = -ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}

static uint8_t *bh__grow(bh_buf *b, size_t n) {
  if (bh_buf_reserve(b, n)) return NULL;
  uint8_t *p = b->data + b->len;
  b->len += n;
  return p;
}

int bh_enc_nil(bh_buf *b) {
  uint8_t *p = bh__grow(b, 1);
  if (p) *p = BH_TAG_NIL;
  return b->err;
}

int bh_enc_bool(bh_buf *b, int v) {
  uint8_t *p = bh__grow(b, 1);
  if (p) *p = v ? BH_TAG_TRUE : BH_TAG_FALSE;
  return b->err;
}

int bh_enc_int(bh_buf *b, int64_t v) {
  uint8_t *p = bh__grow(b, 9);
  if (p) {
    p[0] = BH_TAG_INT;
    bh__put_u64(p + 1, (uint64_t)v);
  }
  return b->err;
}

int bh_enc_float(bh_buf *b, double v) {
  uint8_t *p = bh__grow(b, 9);
  if (p) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    p[0] = BH_TAG_FLOAT;
    bh__put_u64(p + 1, bits);
  }
  return b->err;
}

static int bh__enc_blob(bh_buf *b, uint8_t tag, const void *s, size_t n) {
  if (n > UINT32_MAX) return b->err ? b->err : (b->err = -BH_E2BIG);
  uint8_t *p = bh__grow(b, 5 + n);
  if (p) {
    p[0] = tag;
    bh__put_u32(p + 1, (uint32_t)n);
    if (n) memcpy(p + 5, s, n);
  }
  return b->err;
}

int bh_enc_str(bh_buf *b, const char *s, size_t n) { return bh__enc_blob(b, BH_TAG_STR, s, n); }
int bh_enc_bytes(bh_buf *b, const void *p, size_t n) { return bh__enc_blob(b, BH_TAG_BYTES, p, n); }

static int bh__enc_count(bh_buf *b, uint8_t tag, uint32_t count) {
  uint8_t *p = bh__grow(b, 5);
  if (p) {
    p[0] = tag;
    bh__put_u32(p + 1, count);
  }
  return b->err;
}

int bh_enc_list(bh_buf *b, uint32_t count) { return bh__enc_count(b, BH_TAG_LIST, count); }
int bh_enc_tuple(bh_buf *b, uint32_t count) { return bh__enc_count(b, BH_TAG_TUPLE, count); }
int bh_enc_map(bh_buf *b, uint32_t count) { return bh__enc_count(b, BH_TAG_MAP, count); }
int bh_enc_set(bh_buf *b, uint32_t count) { return bh__enc_count(b, BH_TAG_SET, count); }
int bh_enc_frozenset(bh_buf *b, uint32_t count) { return bh__enc_count(b, BH_TAG_FROZENSET, count); }

int bh_enc_complex(bh_buf *b, double real, double imag) {
  uint8_t *p = bh__grow(b, 17);
  if (p) {
    uint64_t bits[2];
    memcpy(&bits[0], &real, 8);
    memcpy(&bits[1], &imag, 8);
    p[0] = BH_TAG_COMPLEX;
    bh__put_u64(p + 1, bits[0]);
    bh__put_u64(p + 9, bits[1]);
  }
  return b->err;
}

int bh_enc_range(bh_buf *b, int64_t start, int64_t stop, int64_t step) {
  if (b->err) return b->err;
  if (step == 0) return -EINVAL;
  uint8_t *p = bh__grow(b, 25);
  if (p) {
    p[0] = BH_TAG_RANGE;
    bh__put_u64(p + 1, (uint64_t)start);
    bh__put_u64(p + 9, (uint64_t)stop);
    bh__put_u64(p + 17, (uint64_t)step);
  }
  return b->err;
}

#define BH__TENSOR_FIXED (1 + 1 + 1 + 1 + 4 + 8 + 8)

int bh_enc_tensor(bh_buf *b, const bh_tensor_ref *t) {
  if (b->err) return b->err;
  if (!t || bh_tensor_ref_check(t)) return -EINVAL;
  int inline_data = t->block == BH_BLOCK_INLINE;
  if (inline_data && !t->data) return -EINVAL;
  uint8_t *p = bh__grow(b, BH__TENSOR_FIXED + (size_t)t->ndim * 16 +
                               (inline_data ? (size_t)t->nbytes : 0));
  if (!p) return b->err;
  p[0] = BH_TAG_TENSOR;
  p[1] = t->lib;
  p[2] = t->dtype;
  p[3] = t->ndim;
  bh__put_u32(p + 4, t->block);
  bh__put_u64(p + 8, t->offset);
  bh__put_u64(p + 16, t->nbytes);
  p += BH__TENSOR_FIXED;
  for (unsigned i = 0; i < t->ndim; i++) bh__put_u64(p + 8 * i, (uint64_t)t->shape[i]);
  p += 8 * t->ndim;
  for (unsigned i = 0; i < t->ndim; i++) bh__put_u64(p + 8 * i, (uint64_t)t->strides[i]);
  if (inline_data) memcpy(p + 8 * t->ndim, t->data, (size_t)t->nbytes);
  return 0;
}

static int bh__utf8_ok(const uint8_t *s, size_t n);

/* What an ARRAY's tensor must be beyond bh_tensor_ref_check: its bytes as
 * uint8, shape (..., itemsize) with the last stride 1; a scalar's is
 * (itemsize). */
static int bh__array_bytes_ok(const bh_tensor_ref *t) {
  if (t->dtype != BH_DT_UINT8 || t->ndim < 1 || t->strides[t->ndim - 1] != 1) return 0;
  if (t->lib == BH_TENSOR_NUMPY) return 1;
  return t->lib == BH_TENSOR_NUMPY_SCALAR && t->ndim == 1;
}

int bh_enc_array(bh_buf *b, const char *desc, size_t desc_len, const bh_tensor_ref *t) {
  if (b->err) return b->err;
  if (!desc || !t || desc_len == 0 || desc_len > BH_ARRAY_DESC_MAX ||
      !bh__utf8_ok((const uint8_t *)desc, desc_len) || bh_tensor_ref_check(t) ||
      !bh__array_bytes_ok(t) || (t->block == BH_BLOCK_INLINE && !t->data))
    return -EINVAL;
  uint8_t *p = bh__grow(b, 3 + desc_len);
  if (!p) return b->err;
  p[0] = BH_TAG_ARRAY;
  p[1] = (uint8_t)(desc_len & 0xff);
  p[2] = (uint8_t)(desc_len >> 8);
  memcpy(p + 3, desc, desc_len);
  return bh_enc_tensor(b, t); /* checked above: fails only to allocate */
}

int bh_enc_handle(bh_buf *b, const bh_handle_ref *h) {
  if (h->type_len > BH_TYPE_NAME_MAX || (h->type_len && !h->type)) return -EINVAL;
  uint8_t *p = bh__grow(b, 12 + (size_t)h->type_len);
  if (p) {
    p[0] = BH_TAG_HANDLE;
    p[1] = h->space;
    bh__put_u64(p + 2, h->id);
    p[10] = (uint8_t)(h->type_len & 0xff);
    p[11] = (uint8_t)(h->type_len >> 8);
    if (h->type_len) memcpy(p + 12, h->type, h->type_len);
  }
  return b->err;
}

/* ---- validation ---- */

int bh_tensor_ref_check(const bh_tensor_ref *t) {
  unsigned isz = bh_dtype_itemsize(t->dtype);
  if (!isz) return -BH_EDTYPE;
  unsigned lib = t->lib & BH_TENSOR_LIB_MASK, flags = t->lib & ~BH_TENSOR_LIB_MASK;
  if (lib > BH_TENSOR_NUMPY_SCALAR || t->ndim > BH_MAX_DIMS) return -BH_ETENSOR;
  /* flags: known ones, on a torch tensor; requires_grad on a dtype autograd takes */
  if (flags & ~(BH_TENSOR_REQUIRES_GRAD | BH_TENSOR_INFERENCE | BH_TENSOR_PARAMETER)) return -BH_ETENSOR;
  if (flags && lib != BH_TENSOR_TORCH) return -BH_ETENSOR;
  if ((flags & BH_TENSOR_REQUIRES_GRAD) && (t->dtype < BH_DT_FLOAT16 || t->dtype > BH_DT_FLOAT8_E5M2FNUZ))
    return -BH_ETENSOR;
  /* count = product(shape); extent = 1 + sum((shape-1) * stride), elements */
  uint64_t count = 1, extent = 1;
  int empty = 0;
  for (unsigned i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0 || t->strides[i] < 0) return -BH_ETENSOR;
    uint64_t d = (uint64_t)t->shape[i], s = (uint64_t)t->strides[i];
    if (d == 0) {
      empty = 1;
      continue;
    }
    if (count > UINT64_MAX / d) return -BH_ETENSOR;
    count *= d;
    if (s && (d - 1) > (UINT64_MAX - extent) / s) return -BH_ETENSOR;
    extent += (d - 1) * s;
  }
  if (empty) count = 0;
  if (count > UINT64_MAX / isz) return -BH_ETENSOR;
  if (t->nbytes != count * isz) return -BH_ETENSOR;
  if (count == 0) return t->block == BH_BLOCK_NONE && t->offset == 0 ? 0 : -BH_ETENSOR;
  if (t->block == BH_BLOCK_NONE) return -BH_ETENSOR;
  if (t->block == BH_BLOCK_INLINE && (t->offset != 0 || t->nbytes > BH_TENSOR_INLINE_MAX))
    return -BH_ETENSOR;
  if (extent > UINT64_MAX / isz || extent * isz > t->nbytes) return -BH_ETENSOR;
  if (t->offset > UINT64_MAX - t->nbytes) return -BH_ETENSOR;
  return 0;
}

/* Strict UTF-8: no overlongs, no surrogates, nothing above U+10FFFF. */
static int bh__utf8_ok(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t need;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) need = 1, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) need = 2, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) need = 3, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (need > n - i - 1) return 0;
    for (size_t k = 1; k <= need; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    i += need + 1;
  }
  return 1;
}

/* ---- reader ---- */

void bh_reader_init(bh_reader *r, const void *p, size_t len) {
  r->p = p;
  r->len = p ? len : 0;
  r->pos = 0;
}

#define BH__NEED(r, n) \
  do { if ((n) > (r)->len - (r)->pos) return -BH_EOVERRUN; } while (0)

/* A TENSOR value (its tag at p[0], `avail` bytes there) into *t; *used:
 * the bytes it takes.  Reads nothing past p + avail. */
static int bh__dec_tensor(const uint8_t *p, size_t avail, bh_tensor_ref *t, size_t *used) {
  if (avail < BH__TENSOR_FIXED) return -BH_EOVERRUN;
  t->lib = p[1];
  t->dtype = p[2];
  t->ndim = p[3];
  t->block = bh__get_u32(p + 4);
  t->offset = bh__get_u64(p + 8);
  t->nbytes = bh__get_u64(p + 16);
  if (t->ndim > BH_MAX_DIMS) return -BH_ETENSOR;
  size_t head = BH__TENSOR_FIXED + (size_t)t->ndim * 16;
  if (avail < head) return -BH_EOVERRUN;
  const uint8_t *q = p + BH__TENSOR_FIXED;
  for (unsigned i = 0; i < t->ndim; i++) t->shape[i] = (int64_t)bh__get_u64(q + 8 * i);
  q += 8 * t->ndim;
  for (unsigned i = 0; i < t->ndim; i++) t->strides[i] = (int64_t)bh__get_u64(q + 8 * i);
  int rc = bh_tensor_ref_check(t);
  if (rc) return rc;
  t->data = NULL;
  if (t->block == BH_BLOCK_INLINE) { /* checked: nbytes <= BH_TENSOR_INLINE_MAX */
    if (avail - head < (size_t)t->nbytes) return -BH_EOVERRUN;
    t->data = p + head;
    head += (size_t)t->nbytes;
  }
  *used = head;
  return 0;
}

uint64_t bh_item_children(const bh_item *it) {
  switch (it->tag) {
  case BH_TAG_LIST:
  case BH_TAG_TUPLE:
  case BH_TAG_SET:
  case BH_TAG_FROZENSET: return it->u.count;
  case BH_TAG_MAP: return 2 * (uint64_t)it->u.count;
  }
  return 0;
}

int bh_dec_next(bh_reader *r, bh_item *it) {
  BH__NEED(r, 1);
  const uint8_t *p = r->p + r->pos;
  uint8_t tag = p[0];
  memset(it, 0, sizeof *it);
  it->tag = tag;
  switch (tag) {
  case BH_TAG_NIL:
  case BH_TAG_FALSE:
  case BH_TAG_TRUE:
    r->pos += 1;
    return 0;
  case BH_TAG_INT:
  case BH_TAG_FLOAT: {
    BH__NEED(r, 9);
    uint64_t v = bh__get_u64(p + 1);
    if (tag == BH_TAG_INT) it->u.i = (int64_t)v;
    else memcpy(&it->u.f, &v, 8);
    r->pos += 9;
    return 0;
  }
  case BH_TAG_STR:
  case BH_TAG_BYTES: {
    BH__NEED(r, 5);
    uint32_t n = bh__get_u32(p + 1);
    BH__NEED(r, 5 + (size_t)n);
    if (tag == BH_TAG_STR && !bh__utf8_ok(p + 5, n)) return -BH_EUTF8;
    it->u.s.p = p + 5;
    it->u.s.n = n;
    r->pos += 5 + (size_t)n;
    return 0;
  }
  case BH_TAG_LIST:
  case BH_TAG_TUPLE:
  case BH_TAG_SET:
  case BH_TAG_FROZENSET:
  case BH_TAG_MAP: {
    BH__NEED(r, 5);
    uint32_t n = bh__get_u32(p + 1);
    uint64_t min_bytes = (uint64_t)n * (tag == BH_TAG_MAP ? 2 : 1);
    if (min_bytes > r->len - r->pos - 5) return -BH_ECOUNT;
    it->u.count = n;
    r->pos += 5;
    return 0;
  }
  case BH_TAG_TENSOR: {
    size_t used;
    int rc = bh__dec_tensor(p, r->len - r->pos, &it->u.t, &used);
    if (rc) return rc;
    r->pos += used;
    return 0;
  }
  case BH_TAG_ARRAY: {
    BH__NEED(r, 3);
    uint16_t n = (uint16_t)(p[1] | p[2] << 8);
    if (n == 0) return -BH_EBODY;
    BH__NEED(r, 3 + (size_t)n + 1);
    if (!bh__utf8_ok(p + 3, n)) return -BH_EUTF8;
    if (p[3 + n] != BH_TAG_TENSOR) return -BH_EBODY;
    size_t used;
    int rc = bh__dec_tensor(p + 3 + n, r->len - r->pos - 3 - n, &it->u.t, &used);
    if (rc) return rc;
    if (!bh__array_bytes_ok(&it->u.t)) return -BH_EBODY;
    it->desc = (const char *)p + 3;
    it->desc_len = n;
    r->pos += 3 + (size_t)n + used;
    return 0;
  }
  case BH_TAG_COMPLEX: {
    BH__NEED(r, 17);
    uint64_t re = bh__get_u64(p + 1), im = bh__get_u64(p + 9);
    memcpy(&it->u.c.real, &re, 8);
    memcpy(&it->u.c.imag, &im, 8);
    r->pos += 17;
    return 0;
  }
  case BH_TAG_RANGE: {
    BH__NEED(r, 25);
    it->u.r.start = (int64_t)bh__get_u64(p + 1);
    it->u.r.stop = (int64_t)bh__get_u64(p + 9);
    it->u.r.step = (int64_t)bh__get_u64(p + 17);
    if (it->u.r.step == 0) return -BH_EBODY;
    r->pos += 25;
    return 0;
  }
  case BH_TAG_HANDLE: {
    BH__NEED(r, 12);
    uint16_t n = (uint16_t)(p[10] | p[11] << 8);
    if (n > BH_TYPE_NAME_MAX) return -BH_ECOUNT;
    BH__NEED(r, 12 + (size_t)n);
    if (!bh__utf8_ok(p + 12, n)) return -BH_EUTF8;
    it->u.h.space = p[1];
    it->u.h.id = bh__get_u64(p + 2);
    it->u.h.type = n ? (const char *)p + 12 : NULL;
    it->u.h.type_len = n;
    r->pos += 12 + (size_t)n;
    return 0;
  }
  }
  return -BH_EBADTAG;
}

/* Iterative walk: a stack of "items left" per open container. */
int bh_dec_validate(const void *p, size_t len, unsigned max_depth) {
  bh_reader r;
  bh_item it;
  uint64_t left[BH_MAX_DEPTH + 1];
  unsigned depth = 0;
  uint64_t items = 0;
  if (max_depth > BH_MAX_DEPTH) max_depth = BH_MAX_DEPTH;
  bh_reader_init(&r, p, len);
  left[0] = 1;
  for (;;) {
    while (depth > 0 && left[depth] == 0) depth--;
    if (depth == 0 && left[0] == 0) break;
    int rc = bh_dec_next(&r, &it);
    if (rc) return rc;
    if (++items > BH_MAX_ITEMS) return -BH_ETOOMANY;
    left[depth]--;
    uint64_t n = bh_item_children(&it);
    if (n == 0) continue;
    if (depth + 1 > max_depth) return -BH_EDEPTH;
    left[++depth] = n;
  }
  return r.pos == r.len ? 0 : -BH_ETRAILING;
}
