/*
 * test-codec.c -- the value codec: every tag round-trips bit-exactly, and
 * every malformed class of input is refused with its own named error.
 *
 * Decoding is meant to be total (bulkhead.h, bh_dec_next): any byte string
 * yields an item or a BH_E* code, never an over-read.  So the tests feed
 * bh_dec_validate copies in heap blocks of exactly the input's length (an
 * over-read is then an ASan report in the sanitizer build), and check its
 * answer against a small recursive walker built on bh_dec_next: the two
 * must agree on every input, valid or not, including 300k random and
 * mutated ones from a fixed seed.
 */
#include "task.h"

#include <math.h>

/* ---- helpers ---- */

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  rng_state = x;
  return x * 0x2545f4914f6cdd1dull;
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* bh_dec_validate on a heap copy of exactly len bytes. */
static int validate_exact(const void *p, size_t len, unsigned max_depth) {
  uint8_t *q = calloc(1, len ? len : 1);
  ASSERT_NOT_NULL(q);
  if (len) memcpy(q, p, len);
  int rc = bh_dec_validate(q, len, max_depth);
  free(q);
  return rc;
}

/* The reference: a recursive walk over bh_dec_next, checking depth before
 * descending into a non-empty container, then requiring the end. */
static int ref_walk(bh_reader *r, unsigned depth, unsigned max_depth) {
  bh_item it;
  int rc = bh_dec_next(r, &it);
  if (rc) return rc;
  if (it.tag != BH_TAG_LIST && it.tag != BH_TAG_TUPLE && it.tag != BH_TAG_MAP &&
      it.tag != BH_TAG_SET && it.tag != BH_TAG_FROZENSET)
    return 0;
  uint64_t n = it.tag == BH_TAG_MAP ? 2 * (uint64_t)it.u.count : it.u.count;
  if (n == 0) return 0;
  if (depth + 1 > max_depth) return -BH_EDEPTH;
  for (uint64_t i = 0; i < n; i++)
    if ((rc = ref_walk(r, depth + 1, max_depth))) return rc;
  return 0;
}

static int ref_validate(const void *p, size_t len, unsigned max_depth) {
  bh_reader r;
  uint8_t *q = calloc(1, len ? len : 1);
  ASSERT_NOT_NULL(q);
  if (len) memcpy(q, p, len);
  bh_reader_init(&r, q, len);
  if (max_depth > BH_MAX_DEPTH) max_depth = BH_MAX_DEPTH;
  int rc = ref_walk(&r, 0, max_depth);
  if (!rc && r.pos != len) rc = -BH_ETRAILING;
  free(q);
  return rc;
}

static int is_decode_error(int rc) {
  switch (-rc) {
  case BH_EOVERRUN: case BH_EBADTAG: case BH_EUTF8: case BH_ETRAILING:
  case BH_EDEPTH: case BH_ECOUNT: case BH_ETENSOR: case BH_EDTYPE: case BH_EBODY:
    return 1;
  }
  return 0;
}

/* Validation and the reference agree, and the answer is 0 or a decode
 * error. */
static int check_validate(const uint8_t *p, size_t len, unsigned max_depth) {
  int rc = validate_exact(p, len, max_depth);
  int ref = ref_validate(p, len, max_depth);
  if (rc != ref) {
    fprintf(stderr, "input (%zu bytes, max_depth %u):", len, max_depth);
    for (size_t i = 0; i < len && i < 96; i++) fprintf(stderr, " %02x", p[i]);
    fputc('\n', stderr);
  }
  ASSERT_RC(rc, ref);
  if (rc) ASSERT(is_decode_error(rc));
  return rc;
}

/* A value described as a flat token list, for the round trips. */
typedef struct tok {
  uint8_t tag;
  int64_t i;
  uint64_t fbits;
  const char *s; /* STR, BYTES */
  uint32_t n;    /* STR/BYTES length; LIST/TUPLE/MAP count */
} tok;

static void enc_tok(bh_buf *b, const tok *t) {
  double f;
  switch (t->tag) {
  case BH_TAG_NIL: ASSERT_OK(bh_enc_nil(b)); break;
  case BH_TAG_FALSE: ASSERT_OK(bh_enc_bool(b, 0)); break;
  case BH_TAG_TRUE: ASSERT_OK(bh_enc_bool(b, 7)); break; /* any nonzero */
  case BH_TAG_INT: ASSERT_OK(bh_enc_int(b, t->i)); break;
  case BH_TAG_FLOAT:
    memcpy(&f, &t->fbits, 8);
    ASSERT_OK(bh_enc_float(b, f));
    break;
  case BH_TAG_STR: ASSERT_OK(bh_enc_str(b, t->s, t->n)); break;
  case BH_TAG_BYTES: ASSERT_OK(bh_enc_bytes(b, t->s, t->n)); break;
  case BH_TAG_LIST: ASSERT_OK(bh_enc_list(b, t->n)); break;
  case BH_TAG_TUPLE: ASSERT_OK(bh_enc_tuple(b, t->n)); break;
  case BH_TAG_MAP: ASSERT_OK(bh_enc_map(b, t->n)); break;
  case BH_TAG_SET: ASSERT_OK(bh_enc_set(b, t->n)); break;
  case BH_TAG_FROZENSET: ASSERT_OK(bh_enc_frozenset(b, t->n)); break;
  default: FAIL("bad token tag %u", t->tag);
  }
}

static void expect_tok(bh_reader *r, const tok *t) {
  bh_item it;
  uint64_t bits;
  ASSERT_OK(bh_dec_next(r, &it));
  ASSERT_EQ(it.tag, t->tag);
  switch (t->tag) {
  case BH_TAG_INT: ASSERT_EQ(it.u.i, t->i); break;
  case BH_TAG_FLOAT:
    memcpy(&bits, &it.u.f, 8);
    ASSERT_UEQ(bits, t->fbits);
    break;
  case BH_TAG_STR:
  case BH_TAG_BYTES:
    ASSERT_EQ(it.u.s.n, t->n);
    ASSERT_MEM_EQ(it.u.s.p, t->s, t->n);
    break;
  case BH_TAG_LIST:
  case BH_TAG_TUPLE:
  case BH_TAG_SET:
  case BH_TAG_FROZENSET:
  case BH_TAG_MAP: ASSERT_EQ(it.u.count, t->n); break;
  }
}

/* Encodes the tokens, checks the encoding validates (and needs exactly
 * `depth` levels when depth >= 0), decodes them back, and checks every
 * proper prefix is refused as truncated.  Returns the encoding. */
static bh_buf roundtrip(const tok *toks, size_t n, int depth) {
  bh_buf b;
  bh_buf_init(&b);
  for (size_t i = 0; i < n; i++) enc_tok(&b, &toks[i]);
  ASSERT_OK(b.err);
  ASSERT_RC(check_validate(b.data, b.len, BH_MAX_DEPTH), 0);
  if (depth > 0) {
    ASSERT_RC(check_validate(b.data, b.len, (unsigned)depth), 0);
    ASSERT_RC(check_validate(b.data, b.len, (unsigned)depth - 1), -BH_EDEPTH);
  }
  bh_reader r;
  bh_reader_init(&r, b.data, b.len);
  for (size_t i = 0; i < n; i++) expect_tok(&r, &toks[i]);
  ASSERT_EQ(r.pos, b.len);
  for (size_t cut = 0; cut < b.len; cut++) {
    int rc = check_validate(b.data, cut, BH_MAX_DEPTH);
    if (rc != -BH_EOVERRUN && rc != -BH_ECOUNT) {
      fprintf(stderr, "truncated to %zu of %zu bytes\n", cut, b.len);
      ASSERT_RC(rc, -BH_EOVERRUN);
    }
  }
  return b;
}

static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

/* ---- round trips ---- */

TEST_IMPL(codec_roundtrip_scalars) {
  static const int64_t ints[] = {0, 1, -1, 127, 128, -128, 255, 256, 65535, INT32_MAX,
                                 INT32_MIN, (int64_t)UINT32_MAX, INT64_MAX, INT64_MIN,
                                 INT64_MIN + 1, INT64_MAX - 1, 0x0102030405060708};
  static const uint64_t floats[] = {
      0x0000000000000000ull, /* +0 */
      0x8000000000000000ull, /* -0 */
      0x3ff8000000000000ull, /* 1.5 */
      0x7fefffffffffffffull, /* DBL_MAX */
      0x0010000000000000ull, /* DBL_MIN */
      0x0000000000000001ull, /* smallest subnormal */
      0x7ff0000000000000ull, /* +inf */
      0xfff0000000000000ull, /* -inf */
      0x7ff8000000000000ull, /* quiet NaN */
      0xfff8000000000000ull, /* negative quiet NaN */
      0x7ff8000000000abcull, /* quiet NaN with payload */
      0x7ff0000000000001ull, /* signalling NaN */
      0x7ff4000000000000ull, /* signalling NaN, other payload */
      0xffffffffffffffffull, /* all ones: a NaN */
  };
  tok t[3] = {{.tag = BH_TAG_NIL}, {.tag = BH_TAG_FALSE}, {.tag = BH_TAG_TRUE}};
  for (int k = 0; k < 3; k++) {
    bh_buf b = roundtrip(&t[k], 1, -1);
    ASSERT_EQ(b.len, 1);
    ASSERT_EQ(b.data[0], t[k].tag);
    bh_buf_free(&b);
  }
  for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
    tok ti = {.tag = BH_TAG_INT, .i = ints[k]};
    bh_buf b = roundtrip(&ti, 1, -1);
    ASSERT_EQ(b.len, 9);
    bh_buf_free(&b);
  }
  for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++) {
    tok tf = {.tag = BH_TAG_FLOAT, .fbits = floats[k]};
    bh_buf b = roundtrip(&tf, 1, -1);
    ASSERT_EQ(b.len, 9);
    bh_buf_free(&b);
  }
  /* The decoded doubles are the values, not just the bits. */
  tok tinf = {.tag = BH_TAG_FLOAT, .fbits = dbits(-INFINITY)};
  bh_buf b = roundtrip(&tinf, 1, -1);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, b.data, b.len);
  ASSERT_OK(bh_dec_next(&r, &it));
  ASSERT(isinf(it.u.f) && it.u.f < 0);
  bh_buf_free(&b);

  /* The wire format is fixed: tag, then little-endian. */
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_int(&b, 0x0102030405060708));
  ASSERT_OK(bh_enc_float(&b, 1.5));
  static const uint8_t want[] = {0x03, 8, 7, 6, 5, 4, 3, 2, 1,
                                 0x04, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f};
  ASSERT_EQ(b.len, sizeof want);
  ASSERT_MEM_EQ(b.data, want, sizeof want);
  bh_buf_free(&b);
  return 0;
}

TEST_IMPL(codec_roundtrip_str_bytes) {
  static const char *const strs[] = {
      "",
      "hello",
      "h\xc3\xa9llo",               /* é */
      "\xc2\x80",                   /* U+0080, first 2-byte */
      "\xdf\xbf",                   /* U+07FF, last 2-byte */
      "\xe0\xa0\x80",               /* U+0800, first 3-byte */
      "\xe2\x82\xac",               /* € */
      "\xed\x9f\xbf",               /* U+D7FF, just below the surrogates */
      "\xee\x80\x80",               /* U+E000, just above them */
      "\xef\xbf\xbf",               /* U+FFFF */
      "\xf0\x90\x80\x80",           /* U+10000, first 4-byte */
      "\xf0\x9f\x98\x80",           /* 😀 */
      "\xf4\x8f\xbf\xbf",           /* U+10FFFF, the last code point */
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e / \xd0\xa0\xd1\x83\xd1\x81 / \xce\xb1\xce\xb2",
  };
  for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++) {
    tok t = {.tag = BH_TAG_STR, .s = strs[k], .n = (uint32_t)strlen(strs[k])};
    bh_buf b = roundtrip(&t, 1, -1);
    ASSERT_EQ(b.len, 5 + t.n);
    bh_buf_free(&b);
  }
  /* An embedded NUL is a valid code point. */
  tok tnul = {.tag = BH_TAG_STR, .s = "a\0b", .n = 3};
  bh_buf b = roundtrip(&tnul, 1, -1);
  bh_buf_free(&b);

  /* Bytes are any bytes, all 256 values and invalid UTF-8 included. */
  char all[256];
  for (int i = 0; i < 256; i++) all[i] = (char)i;
  tok tb[3] = {{.tag = BH_TAG_BYTES, .s = all, .n = 256},
               {.tag = BH_TAG_BYTES, .s = "", .n = 0},
               {.tag = BH_TAG_BYTES, .s = "\xff\xfe\xc0\x80\xed\xa0\x80", .n = 7}};
  for (int k = 0; k < 3; k++) {
    b = roundtrip(&tb[k], 1, -1);
    bh_buf_free(&b);
  }
  /* A 100 KB string. */
  size_t big = 100 * 1024;
  char *s = malloc(big);
  ASSERT_NOT_NULL(s);
  for (size_t i = 0; i < big; i += 2) s[i] = (char)0xc3, s[i + 1] = (char)0xa9;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_str(&b, s, big));
  ASSERT_RC(validate_exact(b.data, b.len, 0), 0);
  s[big - 1] = 'x'; /* now a truncated sequence */
  bh_buf_free(&b);
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_str(&b, s, big));
  ASSERT_RC(validate_exact(b.data, b.len, 0), -BH_EUTF8);
  bh_buf_free(&b);
  free(s);
  return 0;
}

TEST_IMPL(codec_roundtrip_nested) {
  static const tok toks[] = {
      {.tag = BH_TAG_MAP, .n = 5},
      {.tag = BH_TAG_STR, .s = "a", .n = 1},
      {.tag = BH_TAG_LIST, .n = 3},
      {.tag = BH_TAG_INT, .i = 1},
      {.tag = BH_TAG_TUPLE, .n = 2},
      {.tag = BH_TAG_FLOAT, .fbits = 0x4004000000000000ull},
      {.tag = BH_TAG_NIL},
      {.tag = BH_TAG_MAP, .n = 0},
      {.tag = BH_TAG_STR, .s = "b", .n = 1},
      {.tag = BH_TAG_TUPLE, .n = 2},
      {.tag = BH_TAG_TRUE},
      {.tag = BH_TAG_LIST, .n = 0},
      {.tag = BH_TAG_STR, .s = "\xc3\xa7", .n = 2},
      {.tag = BH_TAG_BYTES, .s = "\x00\xff\x80", .n = 3},
      {.tag = BH_TAG_INT, .i = -7},
      {.tag = BH_TAG_MAP, .n = 1},
      {.tag = BH_TAG_STR, .s = "x", .n = 1},
      {.tag = BH_TAG_LIST, .n = 1},
      {.tag = BH_TAG_LIST, .n = 1},
      {.tag = BH_TAG_TUPLE, .n = 1},
      {.tag = BH_TAG_LIST, .n = 1},
      {.tag = BH_TAG_NIL},
      {.tag = BH_TAG_TUPLE, .n = 0}, /* a key may be anything on the wire */
      {.tag = BH_TAG_FALSE},
  };
  /* map(1) > map(2) > list(3) > list(4) > tuple(5) > list(6) > nil */
  bh_buf b = roundtrip(toks, sizeof toks / sizeof toks[0], 6);
  bh_buf_free(&b);

  /* Empty containers need no depth at all. */
  static const tok empties[] = {{.tag = BH_TAG_LIST, .n = 0}};
  b = roundtrip(empties, 1, -1);
  ASSERT_RC(validate_exact(b.data, b.len, 0), 0);
  bh_buf_free(&b);
  return 0;
}

static void contiguous(bh_tensor_ref *t) {
  int64_t s = 1;
  uint64_t count = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->strides[i] = s;
    s *= t->shape[i];
    count *= (uint64_t)t->shape[i];
  }
  t->nbytes = count * bh_dtype_itemsize(t->dtype);
}

static void expect_tensor_eq(const bh_tensor_ref *a, const bh_tensor_ref *b) {
  ASSERT_EQ(a->lib, b->lib);
  ASSERT_EQ(a->dtype, b->dtype);
  ASSERT_EQ(a->ndim, b->ndim);
  ASSERT_UEQ(a->block, b->block);
  ASSERT_UEQ(a->offset, b->offset);
  ASSERT_UEQ(a->nbytes, b->nbytes);
  for (unsigned i = 0; i < a->ndim; i++) {
    ASSERT_EQ(a->shape[i], b->shape[i]);
    ASSERT_EQ(a->strides[i], b->strides[i]);
  }
}

/* Encodes t, decodes it back, and cuts the encoding at every offset (an
 * inline tensor's bytes included: they follow the ref). */
static void tensor_roundtrip(const bh_tensor_ref *t) {
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_tensor_ref_check(t));
  ASSERT_OK(bh_enc_tensor(&b, t));
  size_t head = 24 + 16 * (size_t)t->ndim;
  int inline_data = t->block == BH_BLOCK_INLINE;
  ASSERT_EQ(b.len, head + (inline_data ? (size_t)t->nbytes : 0));
  if (inline_data) ASSERT(memcmp(b.data + head, t->data, (size_t)t->nbytes) == 0);
  ASSERT_RC(check_validate(b.data, b.len, 0), 0);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, b.data, b.len);
  ASSERT_OK(bh_dec_next(&r, &it));
  ASSERT_EQ(it.tag, BH_TAG_TENSOR);
  expect_tensor_eq(&it.u.t, t);
  ASSERT(it.u.t.data == (inline_data ? b.data + head : NULL));
  ASSERT_EQ(r.pos, b.len);
  for (size_t cut = 0; cut < b.len; cut++)
    ASSERT_RC(check_validate(b.data, cut, 0), -BH_EOVERRUN);
  bh_buf_free(&b);
}

TEST_IMPL(codec_roundtrip_tensor) {
  /* Every ndim 0..16, every dtype, every library. */
  for (unsigned ndim = 0; ndim <= BH_MAX_DIMS; ndim++) {
    for (unsigned dt = 1; dt <= BH_DT_CLONGDOUBLE; dt++) {
      bh_tensor_ref t;
      memset(&t, 0, sizeof t);
      t.lib = (uint8_t)((ndim + dt) % 3); /* numpy, torch, numpy scalar */
      t.dtype = (uint8_t)dt;
      t.ndim = (uint8_t)ndim;
      t.block = 7 + ndim;
      t.offset = 4096ull * ndim;
      for (unsigned i = 0; i < ndim; i++) t.shape[i] = 1 + (i + dt) % 3;
      contiguous(&t);
      tensor_roundtrip(&t);
    }
  }
  /* Empty: a zero dimension, no block. */
  bh_tensor_ref e = {.lib = BH_TENSOR_TORCH, .dtype = BH_DT_FLOAT32, .ndim = 2,
                     .block = BH_BLOCK_NONE, .shape = {0, 5}, .strides = {5, 1}};
  tensor_roundtrip(&e);
  /* A torch tensor's flags (protocol 9) cross in the lib byte's high bits:
   * requires_grad on every floating-point and complex dtype, inference on
   * any dtype, both at once. */
  for (unsigned dt = BH_DT_FLOAT16; dt <= BH_DT_FLOAT8_E5M2FNUZ; dt++) {
    bh_tensor_ref g = {.lib = BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD, .dtype = (uint8_t)dt, .ndim = 1,
                       .block = 2, .shape = {3}};
    contiguous(&g);
    tensor_roundtrip(&g);
    g.lib |= BH_TENSOR_INFERENCE;
    tensor_roundtrip(&g);
  }
  e.lib = BH_TENSOR_TORCH | BH_TENSOR_INFERENCE | BH_TENSOR_PARAMETER; /* a Parameter not requiring grad */
  e.dtype = BH_DT_INT64;
  tensor_roundtrip(&e);
  e.lib = BH_TENSOR_TORCH | BH_TENSOR_PARAMETER | BH_TENSOR_REQUIRES_GRAD;
  e.dtype = BH_DT_BFLOAT16;
  tensor_roundtrip(&e);
  /* Broadcast (stride 0) and a transposed view stay within nbytes. */
  bh_tensor_ref bc = {.dtype = BH_DT_INT64, .ndim = 2, .block = 3, .nbytes = 12 * 8,
                      .shape = {4, 3}, .strides = {0, 1}};
  tensor_roundtrip(&bc);
  bh_tensor_ref tr = {.dtype = BH_DT_UINT8, .ndim = 2, .block = 3, .nbytes = 12,
                      .shape = {4, 3}, .strides = {1, 4}};
  tensor_roundtrip(&tr);

  /* The wire layout, pinned. */
  bh_tensor_ref one = {.lib = BH_TENSOR_TORCH, .dtype = BH_DT_FLOAT16, .ndim = 1,
                       .block = 0x01020304, .offset = 0x10, .nbytes = 6,
                       .shape = {3}, .strides = {1}};
  static const uint8_t want[] = {
      0x09, 1, 10, 1, 4, 3, 2, 1,            /* tag lib dtype ndim block */
      0x10, 0, 0, 0, 0, 0, 0, 0,             /* offset */
      6, 0, 0, 0, 0, 0, 0, 0,                /* nbytes */
      3, 0, 0, 0, 0, 0, 0, 0,                /* shape */
      1, 0, 0, 0, 0, 0, 0, 0};               /* strides */
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_tensor(&b, &one));
  ASSERT_EQ(b.len, sizeof want);
  ASSERT_MEM_EQ(b.data, want, sizeof want);
  bh_buf_free(&b);
  return 0;
}

TEST_IMPL(codec_roundtrip_handle) {
  static const bh_handle_ref hs[] = {
      {BH_HANDLE_CALLABLE, 0, NULL, 0},
      {BH_HANDLE_OBJECT, 1, "packa.nodes.Model", 17},
      {0, UINT64_MAX, "\xc3\xa9t\xc3\xa9", 6},
      {255, 0x0102030405060708ull, NULL, 0}};
  for (size_t k = 0; k < sizeof hs / sizeof hs[0]; k++) {
    bh_buf b;
    bh_buf_init(&b);
    ASSERT_OK(bh_enc_handle(&b, &hs[k]));
    ASSERT_EQ(b.len, 12 + (size_t)hs[k].type_len);
    ASSERT_EQ(b.data[0], BH_TAG_HANDLE);
    ASSERT_RC(check_validate(b.data, b.len, 0), 0);
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, b.data, b.len);
    ASSERT_OK(bh_dec_next(&r, &it));
    ASSERT_EQ(it.tag, BH_TAG_HANDLE);
    ASSERT_EQ(it.u.h.space, hs[k].space);
    ASSERT_UEQ(it.u.h.id, hs[k].id);
    ASSERT_EQ(it.u.h.type_len, hs[k].type_len);
    if (hs[k].type_len) ASSERT_MEM_EQ(it.u.h.type, hs[k].type, hs[k].type_len);
    else ASSERT(it.u.h.type == NULL);
    for (size_t cut = 0; cut < b.len; cut++)
      ASSERT_RC(check_validate(b.data, cut, 0), -BH_EOVERRUN);
    bh_buf_free(&b);
  }
  return 0;
}

/* A handle's type name: over BH_TYPE_NAME_MAX refused on both sides, and
 * UTF-8 checked on decode. */
TEST_IMPL(codec_handle_type_name_bounds) {
  static char name[BH_TYPE_NAME_MAX + 1];
  memset(name, 'x', sizeof name);
  bh_buf b;
  bh_buf_init(&b);
  bh_handle_ref h = {BH_HANDLE_OBJECT, 3, name, BH_TYPE_NAME_MAX + 1};
  ASSERT_RC(bh_enc_handle(&b, &h), -EINVAL);
  ASSERT_EQ(b.len, 0);
  h.type_len = BH_TYPE_NAME_MAX;
  ASSERT_OK(bh_enc_handle(&b, &h));
  ASSERT_RC(check_validate(b.data, b.len, 0), 0);
  b.data[10] = (uint8_t)((BH_TYPE_NAME_MAX + 1) & 0xff); /* the length field, over the limit */
  b.data[11] = (uint8_t)((BH_TYPE_NAME_MAX + 1) >> 8);
  ASSERT_RC(check_validate(b.data, b.len, 0), -BH_ECOUNT);
  bh_buf_free(&b);
  uint8_t bad[] = {BH_TAG_HANDLE, BH_HANDLE_OBJECT, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0xc3, 0x28};
  ASSERT_RC(check_validate(bad, sizeof bad, 0), -BH_EUTF8);
  return 0;
}

/* Every value kind in one list, cut at every byte. */
TEST_IMPL(codec_truncation_every_offset) {
  bh_buf b;
  bh_buf_init(&b);
  bh_tensor_ref t = {.dtype = BH_DT_FLOAT32, .ndim = 3, .block = 1, .shape = {2, 3, 4}};
  contiguous(&t);
  bh_handle_ref h = {BH_HANDLE_CALLABLE, 99, "m.f", 3};
  bh_enc_list(&b, 12);
  bh_enc_nil(&b);
  bh_enc_bool(&b, 1);
  bh_enc_bool(&b, 0);
  bh_enc_int(&b, INT64_MIN);
  bh_enc_float(&b, NAN);
  bh_enc_str(&b, "\xf0\x9f\x98\x80x", 5);
  bh_enc_bytes(&b, "\0\1\2", 3);
  bh_enc_tuple(&b, 2);
  bh_enc_int(&b, 1);
  bh_enc_map(&b, 1);
  bh_enc_str(&b, "k", 1);
  bh_enc_list(&b, 0);
  bh_enc_tensor(&b, &t);
  bh_enc_handle(&b, &h);
  bh_enc_map(&b, 0);
  bh_enc_tuple(&b, 0);
  ASSERT_OK(b.err);
  ASSERT_RC(check_validate(b.data, b.len, BH_MAX_DEPTH), 0);
  for (size_t cut = 0; cut < b.len; cut++) {
    int rc = check_validate(b.data, cut, BH_MAX_DEPTH);
    if (rc != -BH_EOVERRUN && rc != -BH_ECOUNT) {
      fprintf(stderr, "cut at %zu of %zu\n", cut, b.len);
      ASSERT_RC(rc, -BH_EOVERRUN);
    }
  }
  bh_buf_free(&b);
  return 0;
}

/* ---- malformed input, one class at a time ---- */

TEST_IMPL(codec_bad_tag) {
  for (unsigned tag = BH_TAG_ARRAY + 1; tag <= 0xff; tag++) {
    uint8_t alone[1] = {(uint8_t)tag};
    ASSERT_RC(check_validate(alone, 1, BH_MAX_DEPTH), -BH_EBADTAG);
    uint8_t padded[16] = {(uint8_t)tag};
    ASSERT_RC(check_validate(padded, sizeof padded, BH_MAX_DEPTH), -BH_EBADTAG);
    uint8_t in_list[7] = {BH_TAG_LIST, 2, 0, 0, 0, BH_TAG_NIL, (uint8_t)tag};
    ASSERT_RC(check_validate(in_list, sizeof in_list, BH_MAX_DEPTH), -BH_EBADTAG);
    uint8_t as_key[8] = {BH_TAG_MAP, 1, 0, 0, 0, (uint8_t)tag, BH_TAG_NIL, BH_TAG_NIL};
    ASSERT_RC(check_validate(as_key, sizeof as_key, BH_MAX_DEPTH), -BH_EBADTAG);
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, alone, 1);
    ASSERT_RC(bh_dec_next(&r, &it), -BH_EBADTAG);
  }
  return 0;
}

static void expect_utf8_bad(const char *what, const char *s, size_t n) {
  uint8_t buf[64];
  ASSERT(n + 6 <= sizeof buf);
  buf[0] = BH_TAG_STR;
  put_u32(buf + 1, (uint32_t)n);
  memcpy(buf + 5, s, n);
  int rc = check_validate(buf, 5 + n, 0);
  if (rc != -BH_EUTF8) fprintf(stderr, "case: %s\n", what);
  ASSERT_RC(rc, -BH_EUTF8);
  /* Same inside a list, and as a map key. */
  uint8_t nested[80] = {BH_TAG_MAP, 1, 0, 0, 0};
  memcpy(nested + 5, buf, 5 + n);
  nested[10 + n] = BH_TAG_NIL;
  ASSERT_RC(check_validate(nested, 11 + n, 1), -BH_EUTF8);
  /* The same bytes as BYTES are fine. */
  buf[0] = BH_TAG_BYTES;
  ASSERT_RC(check_validate(buf, 5 + n, 0), 0);
}

TEST_IMPL(codec_bad_utf8) {
  static const struct {
    const char *what, *s;
  } cases[] = {
      {"overlong NUL (2 bytes)", "\xc0\x80"},
      {"overlong '?' (2 bytes)", "\xc1\xbf"},
      {"overlong U+007F (3 bytes)", "\xe0\x81\xbf"},
      {"overlong U+07FF (3 bytes)", "\xe0\x9f\xbf"},
      {"overlong U+0000 (4 bytes)", "\xf0\x80\x80\x80"},
      {"overlong U+FFFF (4 bytes)", "\xf0\x8f\xbf\xbf"},
      {"high surrogate U+D800", "\xed\xa0\x80"},
      {"low surrogate U+DFFF", "\xed\xbf\xbf"},
      {"surrogate pair as CESU-8", "\xed\xa0\xbd\xed\xb8\x80"},
      {"U+110000", "\xf4\x90\x80\x80"},
      {"U+13FFFF", "\xf4\xbf\xbf\xbf"},
      {"F5 lead", "\xf5\x80\x80\x80"},
      {"F7 lead (U+1FFFFF)", "\xf7\xbf\xbf\xbf"},
      {"5-byte form", "\xf8\x88\x80\x80\x80"},
      {"6-byte form", "\xfc\x84\x80\x80\x80\x80"},
      {"FE", "\xfe"},
      {"FF", "\xff"},
      {"stray continuation 80", "\x80"},
      {"stray continuation BF", "\xbf"},
      {"stray continuation mid-string", "ab\x80" "cd"},
      {"continuation after a complete char", "\xc3\xa9\xa9"},
      {"lead byte without continuation at end", "abc\xc3"},
      {"3-byte sequence cut short", "\xe2\x82"},
      {"3-byte sequence interrupted by ASCII", "\xe2\x82" "a"},
      {"4-byte sequence interrupted", "\xf0\x9f\x98" "x"},
      {"lead byte followed by a lead byte", "\xc3\xc3\xa9"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    expect_utf8_bad(cases[k].what, cases[k].s, strlen(cases[k].s));
  /* Through bh_dec_next directly too. */
  uint8_t buf[7] = {BH_TAG_STR, 2, 0, 0, 0, 0xc0, 0x80};
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, buf, sizeof buf);
  ASSERT_RC(bh_dec_next(&r, &it), -BH_EUTF8);
  return 0;
}

TEST_IMPL(codec_trailing) {
  static const uint8_t two_nils[] = {BH_TAG_NIL, BH_TAG_NIL};
  ASSERT_RC(check_validate(two_nils, 2, 0), -BH_ETRAILING);
  static const uint8_t int_plus[] = {BH_TAG_INT, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_RC(check_validate(int_plus, sizeof int_plus, 0), -BH_ETRAILING);
  static const uint8_t list_plus[] = {BH_TAG_LIST, 1, 0, 0, 0, BH_TAG_TRUE, BH_TAG_FALSE};
  ASSERT_RC(check_validate(list_plus, sizeof list_plus, 1), -BH_ETRAILING);
  static const uint8_t str_plus[] = {BH_TAG_STR, 1, 0, 0, 0, 'a', 'b'};
  ASSERT_RC(check_validate(str_plus, sizeof str_plus, 0), -BH_ETRAILING);
  /* An empty container followed by junk that would be a bad tag: the
   * trailing bytes are what's wrong, not their content. */
  static const uint8_t empty_plus[] = {BH_TAG_MAP, 0, 0, 0, 0, 0xee};
  ASSERT_RC(check_validate(empty_plus, sizeof empty_plus, 0), -BH_ETRAILING);
  return 0;
}

/* k nested containers of one item each around a nil. */
static uint8_t *nested(unsigned k, uint8_t tag, size_t *len) {
  size_t per = tag == BH_TAG_MAP ? 6 : 5;
  uint8_t *p = malloc(k * per + 1);
  ASSERT_NOT_NULL(p);
  size_t at = 0;
  for (unsigned i = 0; i < k; i++) {
    p[at] = tag;
    put_u32(p + at + 1, 1);
    at += 5;
    if (tag == BH_TAG_MAP) p[at++] = BH_TAG_NIL; /* the key */
  }
  p[at++] = BH_TAG_NIL;
  *len = at;
  return p;
}

TEST_IMPL(codec_depth_limit) {
  static const uint8_t tags[] = {BH_TAG_LIST, BH_TAG_TUPLE, BH_TAG_MAP};
  for (int k = 0; k < 3; k++) {
    size_t len;
    uint8_t *p = nested(BH_MAX_DEPTH, tags[k], &len);
    ASSERT_RC(check_validate(p, len, BH_MAX_DEPTH), 0);
    ASSERT_RC(check_validate(p, len, BH_MAX_DEPTH - 1), -BH_EDEPTH);
    free(p);
    p = nested(BH_MAX_DEPTH + 1, tags[k], &len);
    ASSERT_RC(check_validate(p, len, BH_MAX_DEPTH), -BH_EDEPTH);
    /* A caller's larger limit is clamped to BH_MAX_DEPTH. */
    ASSERT_RC(check_validate(p, len, 1000), -BH_EDEPTH);
    ASSERT_RC(check_validate(p, len, UINT32_MAX), -BH_EDEPTH);
    free(p);
    p = nested(3, tags[k], &len);
    ASSERT_RC(check_validate(p, len, 3), 0);
    ASSERT_RC(check_validate(p, len, 2), -BH_EDEPTH);
    ASSERT_RC(check_validate(p, len, 0), -BH_EDEPTH);
    free(p);
  }
  /* Far deeper than any stack: refused, not recursed into. */
  size_t len;
  uint8_t *p = nested(200000, BH_TAG_LIST, &len);
  ASSERT_RC(bh_dec_validate(p, len, BH_MAX_DEPTH), -BH_EDEPTH);
  free(p);
  /* Depth 0 allows scalars and empty containers only. */
  static const uint8_t nil[] = {BH_TAG_NIL}, empty[] = {BH_TAG_LIST, 0, 0, 0, 0},
                       one[] = {BH_TAG_LIST, 1, 0, 0, 0, BH_TAG_NIL};
  ASSERT_RC(check_validate(nil, 1, 0), 0);
  ASSERT_RC(check_validate(empty, 5, 0), 0);
  ASSERT_RC(check_validate(one, 6, 0), -BH_EDEPTH);
  return 0;
}

/* At most BH_MAX_ITEMS items per value, containers counted: a list of
 * BH_MAX_ITEMS - 1 nils passes, one more is -BH_ETOOMANY (and so is a map
 * whose keys and values together pass it). */
TEST_IMPL(codec_items_limit) {
  for (int extra = 0; extra < 2; extra++) {
    uint32_t n = BH_MAX_ITEMS - 1 + (uint32_t)extra;
    size_t len = 5 + (size_t)n;
    uint8_t *p = malloc(len);
    ASSERT_NOT_NULL(p);
    p[0] = BH_TAG_LIST;
    memcpy(p + 1, &n, 4);
    memset(p + 5, BH_TAG_NIL, n);
    ASSERT_RC(validate_exact(p, len, BH_MAX_DEPTH), extra ? -BH_ETOOMANY : 0);
    free(p);
  }
  uint32_t pairs = BH_MAX_ITEMS / 2;
  size_t len = 5 + 2 * (size_t)pairs;
  uint8_t *p = malloc(len);
  ASSERT_NOT_NULL(p);
  p[0] = BH_TAG_MAP;
  memcpy(p + 1, &pairs, 4);
  memset(p + 5, BH_TAG_NIL, 2 * (size_t)pairs);
  ASSERT_RC(validate_exact(p, len, BH_MAX_DEPTH), -BH_ETOOMANY);
  free(p);
  ASSERT_STR_CONTAINS(bh_strerror(-BH_ETOOMANY), "BH_MAX_ITEMS");
  return 0;
}

TEST_IMPL(codec_count_lies) {
  /* A list claiming 4e9 items in a tiny buffer. */
  uint8_t huge[8] = {BH_TAG_LIST, 0, 0, 0, 0, BH_TAG_NIL, BH_TAG_NIL, BH_TAG_NIL};
  put_u32(huge + 1, 4000000000u);
  ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), -BH_ECOUNT);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, huge, sizeof huge);
  ASSERT_RC(bh_dec_next(&r, &it), -BH_ECOUNT);
  for (int k = 0; k < 3; k++) {
    static const uint8_t tags[] = {BH_TAG_LIST, BH_TAG_TUPLE, BH_TAG_MAP};
    huge[0] = tags[k];
    put_u32(huge + 1, UINT32_MAX);
    ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), -BH_ECOUNT);
  }
  /* A map's pairs take two bytes each: 2^31 + 1 pairs must not wrap. */
  huge[0] = BH_TAG_MAP;
  put_u32(huge + 1, 0x80000001u);
  ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), -BH_ECOUNT);
  /* Exactly enough bytes left is fine; one item more is not. */
  uint8_t fit[8] = {BH_TAG_LIST, 3, 0, 0, 0, BH_TAG_NIL, BH_TAG_NIL, BH_TAG_NIL};
  ASSERT_RC(check_validate(fit, sizeof fit, 1), 0);
  fit[1] = 4;
  ASSERT_RC(check_validate(fit, sizeof fit, 1), -BH_ECOUNT);
  uint8_t map_fit[7] = {BH_TAG_MAP, 1, 0, 0, 0, BH_TAG_NIL, BH_TAG_NIL};
  ASSERT_RC(check_validate(map_fit, sizeof map_fit, 1), 0);
  ASSERT_RC(check_validate(map_fit, 6, 1), -BH_ECOUNT);
  /* Strings: a length past the end is an overrun. */
  uint8_t s[6] = {BH_TAG_STR, 0xff, 0xff, 0xff, 0xff, 'a'};
  ASSERT_RC(check_validate(s, sizeof s, 0), -BH_EOVERRUN);
  s[0] = BH_TAG_BYTES;
  ASSERT_RC(check_validate(s, sizeof s, 0), -BH_EOVERRUN);
  return 0;
}

/* Writes a tensor-ref on the wire without any check (the encoder refuses
 * bad ones).  ndim may exceed BH_MAX_DIMS: the extra dims are zeros. */
static size_t raw_tensor(uint8_t *p, const bh_tensor_ref *t, unsigned ndim) {
  p[0] = BH_TAG_TENSOR;
  p[1] = t->lib;
  p[2] = t->dtype;
  p[3] = (uint8_t)ndim;
  put_u32(p + 4, t->block);
  put_u64(p + 8, t->offset);
  put_u64(p + 16, t->nbytes);
  uint8_t *q = p + 24;
  for (unsigned i = 0; i < ndim; i++) put_u64(q + 8 * i, i < BH_MAX_DIMS ? (uint64_t)t->shape[i] : 1);
  q += 8 * ndim;
  for (unsigned i = 0; i < ndim; i++) put_u64(q + 8 * i, i < BH_MAX_DIMS ? (uint64_t)t->strides[i] : 1);
  return 24 + 16 * (size_t)ndim;
}

TEST_IMPL(codec_tensor_lies) {
  const bh_tensor_ref good = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_FLOAT32, .ndim = 2,
                              .block = 1, .nbytes = 48, .shape = {3, 4}, .strides = {4, 1}};
  struct lie {
    const char *what;
    bh_tensor_ref t;
    unsigned ndim; /* on the wire */
    int want;
  } lies[32];
  int n = 0;
#define LIE(desc, code, ...)                                     \
  do {                                                           \
    lies[n].what = desc;                                         \
    lies[n].t = good;                                            \
    { bh_tensor_ref *t = &lies[n].t; __VA_ARGS__; }              \
    lies[n].ndim = lies[n].t.ndim;                               \
    lies[n].want = code;                                         \
    n++;                                                         \
  } while (0)
  LIE("nbytes short of itemsize*prod(shape)", -BH_ETENSOR, t->nbytes = 44);
  LIE("nbytes past itemsize*prod(shape)", -BH_ETENSOR, t->nbytes = 52);
  LIE("nbytes 0 for a non-empty shape", -BH_ETENSOR, t->nbytes = 0; t->block = BH_BLOCK_NONE);
  LIE("row stride too big: extent past nbytes", -BH_ETENSOR, t->strides[0] = 5);
  LIE("column stride 2: extent past nbytes", -BH_ETENSOR, t->strides[1] = 2);
  LIE("stride overflows", -BH_ETENSOR, t->strides[0] = INT64_MAX);
  LIE("negative stride", -BH_ETENSOR, t->strides[1] = -1);
  LIE("negative shape", -BH_ETENSOR, t->shape[0] = -3; t->nbytes = 48);
  LIE("shape product overflows", -BH_ETENSOR, t->shape[0] = (int64_t)1 << 62; t->shape[1] = 8;
      t->strides[0] = 8; t->strides[1] = 1);
  LIE("nbytes overflows with itemsize", -BH_ETENSOR, t->shape[0] = ((int64_t)1 << 62) + 1;
      t->shape[1] = 1; t->strides[0] = 1; t->nbytes = 0);
  LIE("block NONE with nbytes > 0", -BH_ETENSOR, t->block = BH_BLOCK_NONE);
  LIE("empty tensor with a block", -BH_ETENSOR, t->shape[0] = 0; t->nbytes = 0);
  LIE("empty tensor with an offset", -BH_ETENSOR, t->shape[0] = 0; t->nbytes = 0;
      t->block = BH_BLOCK_NONE; t->offset = 8);
  LIE("offset + nbytes overflows", -BH_ETENSOR, t->offset = UINT64_MAX - 10);
  LIE("inline at an offset", -BH_ETENSOR, t->block = BH_BLOCK_INLINE; t->offset = 8);
  LIE("inline past BH_TENSOR_INLINE_MAX", -BH_ETENSOR, t->block = BH_BLOCK_INLINE;
      t->shape[0] = 4097; t->nbytes = 4097 * 4 * 4);
  LIE("unknown library", -BH_ETENSOR, t->lib = 200);
  LIE("unknown library under a known flag", -BH_ETENSOR, t->lib = BH_TENSOR_INFERENCE | 3);
  LIE("an unknown flag", -BH_ETENSOR, t->lib = BH_TENSOR_TORCH | 0x80);
  LIE("a Parameter in numpy", -BH_ETENSOR, t->lib = BH_TENSOR_NUMPY | BH_TENSOR_PARAMETER);
  LIE("a torch flag on a numpy tensor", -BH_ETENSOR, t->lib = BH_TENSOR_NUMPY | BH_TENSOR_INFERENCE);
  LIE("requires_grad on an integer dtype", -BH_ETENSOR, t->lib = BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD;
      t->dtype = BH_DT_INT32);
  LIE("requires_grad on bool", -BH_ETENSOR, t->lib = BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD;
      t->dtype = BH_DT_BOOL; t->nbytes = 12; t->strides[0] = 4);
  LIE("ndim 17", -BH_ETENSOR, t->ndim = 17);
  LIE("ndim 255", -BH_ETENSOR, t->ndim = 255);
  LIE("dtype 0", -BH_EDTYPE, t->dtype = 0);
  LIE("dtype past the table", -BH_EDTYPE, t->dtype = BH_DT_CLONGDOUBLE + 1);
  LIE("dtype 255", -BH_EDTYPE, t->dtype = 255);
#undef LIE
  uint8_t *wire = malloc(24 + 16 * 255 + 16);
  ASSERT_NOT_NULL(wire);
  for (int k = 0; k < n; k++) {
    const struct lie *l = &lies[k];
    fprintf(stderr, "case: %s\n", l->what);
    ASSERT_RC(bh_tensor_ref_check(&l->t), l->want);
    bh_buf b;
    bh_buf_init(&b);
    ASSERT_RC(bh_enc_tensor(&b, &l->t), -EINVAL);
    ASSERT_EQ(b.len, 0);
    ASSERT_OK(b.err); /* a refused ref is not an allocation failure */
    bh_buf_free(&b);
    size_t len = raw_tensor(wire, &l->t, l->ndim);
    ASSERT_RC(check_validate(wire, len, 0), l->want);
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, wire, len);
    ASSERT_RC(bh_dec_next(&r, &it), l->want);
    /* Inside a tuple, after a good value. */
    uint8_t *in = malloc(5 + 24 + 32 + len);
    ASSERT_NOT_NULL(in);
    in[0] = BH_TAG_TUPLE;
    put_u32(in + 1, 2);
    size_t glen = raw_tensor(in + 5, &good, 2);
    memcpy(in + 5 + glen, wire, len);
    ASSERT_RC(check_validate(in, 5 + glen + len, 1), l->want);
    free(in);
  }
  free(wire);
  ASSERT_OK(bh_tensor_ref_check(&good));
  return 0;
}

/* A small tensor inline: its bytes follow the ref, the decoded ref points
 * at them, every truncation (into the data too) is an overrun, and an
 * inline ref without data is refused. */
TEST_IMPL(codec_tensor_inline) {
  float data[12];
  for (int i = 0; i < 12; i++) data[i] = (float)i * 1.5f;
  bh_tensor_ref t = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_FLOAT32, .ndim = 2,
                     .block = BH_BLOCK_INLINE, .nbytes = sizeof data, .shape = {3, 4},
                     .strides = {4, 1}, .data = (const uint8_t *)data};
  tensor_roundtrip(&t);
  /* The largest inline tensor, then one byte more: refused. */
  uint8_t *big = calloc(1, BH_TENSOR_INLINE_MAX + 1);
  ASSERT_NOT_NULL(big);
  bh_tensor_ref m = {.dtype = BH_DT_UINT8, .ndim = 1, .block = BH_BLOCK_INLINE,
                     .nbytes = BH_TENSOR_INLINE_MAX, .shape = {BH_TENSOR_INLINE_MAX},
                     .strides = {1}, .data = big};
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_tensor(&b, &m));
  ASSERT_RC(check_validate(b.data, b.len, 0), 0);
  m.nbytes++, m.shape[0]++;
  ASSERT_RC(bh_enc_tensor(&b, &m), -EINVAL);
  free(big);
  /* Inline with no data: refused, nothing written. */
  t.data = NULL;
  bh_buf_free(&b);
  bh_buf_init(&b);
  ASSERT_RC(bh_enc_tensor(&b, &t), -EINVAL);
  ASSERT_EQ(b.len, 0);
  bh_buf_free(&b);
  return 0;
}

TEST_IMPL(codec_buf_errors) {
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_nil(&b));
  /* A length that cannot fit u32 is refused before the bytes are read. */
  ASSERT_RC(bh_enc_bytes(&b, "x", (size_t)UINT32_MAX + 1), -BH_E2BIG);
  /* ... and the error is sticky. */
  ASSERT_RC(bh_enc_int(&b, 1), -BH_E2BIG);
  ASSERT_RC(b.err, -BH_E2BIG);
  ASSERT_EQ(b.len, 1);
  bh_buf_free(&b);
  bh_buf_init(&b);
  ASSERT_RC(bh_buf_reserve(&b, SIZE_MAX), -ENOMEM);
  ASSERT_RC(bh_enc_nil(&b), -ENOMEM);
  ASSERT_RC(bh_enc_str(&b, "a", 1), -ENOMEM);
  ASSERT_EQ(b.len, 0);
  bh_buf_free(&b);
  /* Growth keeps what was written. */
  bh_buf_init(&b);
  for (int i = 0; i < 10000; i++) ASSERT_OK(bh_enc_int(&b, i));
  ASSERT_EQ(b.len, 90000);
  ASSERT_LE(b.len, b.cap);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, b.data, b.len);
  for (int i = 0; i < 10000; i++) {
    ASSERT_OK(bh_dec_next(&r, &it));
    ASSERT_EQ(it.u.i, i);
  }
  ASSERT_RC(bh_dec_next(&r, &it), -BH_EOVERRUN);
  bh_buf_free(&b);
  /* An empty or NULL input is an overrun, not a crash. */
  ASSERT_RC(bh_dec_validate(NULL, 0, 0), -BH_EOVERRUN);
  ASSERT_RC(bh_dec_validate(NULL, 100, 0), -BH_EOVERRUN);
  return 0;
}

/* ---- random inputs ---- */

static const uint8_t interesting[] = {0x00, 0x01, 0x02, 0x05, 0x07, 0x08, 0x09, 0x0a, 0x0b,
                                      0x0c, 0x10, 0x7f, 0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xed,
                                      0xf0, 0xf4, 0xf5, 0xfe, 0xff};

static uint8_t rnd_byte(void) {
  uint64_t x = rnd();
  switch (x & 3) {
  case 0: return (uint8_t)((x >> 8) % (BH_TAG_ARRAY + 1)); /* a tag */
  case 1: return interesting[(x >> 8) % sizeof interesting];
  default: return (uint8_t)(x >> 8);
  }
}

TEST_IMPL(codec_fuzz_random) {
  enum { N = 200000, MAXLEN = 96 };
  uint8_t buf[MAXLEN];
  unsigned ok = 0, by_err[BH_EBODY - BH_EBADTAG + 1] = {0};
  for (int iter = 0; iter < N; iter++) {
    size_t len = (size_t)(rnd() % MAXLEN);
    for (size_t i = 0; i < len; i++) buf[i] = rnd_byte();
    /* Small counts and lengths, so containers and strings often fit. */
    for (size_t i = 0; i + 4 < len; i++)
      if (((buf[i] >= BH_TAG_STR && buf[i] <= BH_TAG_MAP) || buf[i] == BH_TAG_SET ||
           buf[i] == BH_TAG_FROZENSET) && (rnd() & 1)) {
        put_u32(buf + i + 1, (uint32_t)(rnd() % 6));
        i += 4;
      }
    unsigned depth = (unsigned)(rnd() % 8);
    int rc = check_validate(buf, len, depth);
    if (rc == 0) ok++;
    else by_err[-rc - BH_EBADTAG]++;
  }
  printf("random: %u valid; by error:", ok);
  for (int e = 0; e <= BH_EBODY - BH_EBADTAG; e++)
    if (by_err[e]) printf(" %s=%u", bh_errname(BH_EBADTAG + e), by_err[e]);
  printf("\n");
  /* The generator reaches every class the decoder can name. */
  ASSERT_GT(ok, 0);
  ASSERT_GT(by_err[BH_EOVERRUN - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_EBADTAG - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_ETRAILING - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_ECOUNT - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_EUTF8 - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_EDEPTH - BH_EBADTAG], 0);
  ASSERT_GT(by_err[BH_EBODY - BH_EBADTAG], 0);
  return 0;
}

/* Valid encodings of every kind, then 1-4 random edits each. */
TEST_IMPL(codec_fuzz_mutations) {
  enum { SEEDS = 8, PER = 20000 };
  bh_buf seeds[SEEDS];
  bh_tensor_ref t = {.lib = 1, .dtype = BH_DT_BFLOAT16, .ndim = 4, .block = 2, .offset = 64,
                     .shape = {2, 1, 3, 2}};
  contiguous(&t);
  bh_tensor_ref e = {.dtype = BH_DT_BOOL, .ndim = 1, .block = BH_BLOCK_NONE};
  bh_handle_ref h = {BH_HANDLE_OBJECT, 5, "torch.nn.Linear", 15};
  for (int s = 0; s < SEEDS; s++) bh_buf_init(&seeds[s]);
  bh_enc_map(&seeds[0], 2);
  bh_enc_str(&seeds[0], "img", 3);
  bh_enc_tensor(&seeds[0], &t);
  bh_enc_str(&seeds[0], "n", 1);
  bh_enc_int(&seeds[0], 3);
  bh_enc_list(&seeds[1], 4);
  bh_enc_float(&seeds[1], -0.0);
  bh_enc_str(&seeds[1], "\xe2\x82\xac\xf0\x9f\x98\x80", 7);
  bh_enc_handle(&seeds[1], &h);
  bh_enc_tensor(&seeds[1], &e);
  bh_enc_tuple(&seeds[2], 2);
  bh_enc_tuple(&seeds[2], 1);
  bh_enc_list(&seeds[2], 1);
  bh_enc_map(&seeds[2], 1);
  bh_enc_nil(&seeds[2]);
  bh_enc_bool(&seeds[2], 1);
  bh_enc_bytes(&seeds[2], "\xff\x00", 2);
  bh_enc_tensor(&seeds[3], &t);
  bh_enc_str(&seeds[4], "plain ascii text", 16);
  bh_enc_list(&seeds[5], 3);
  bh_enc_map(&seeds[5], 0);
  bh_enc_list(&seeds[5], 0);
  bh_enc_tuple(&seeds[5], 0);
  bh_enc_set(&seeds[6], 3);
  bh_enc_frozenset(&seeds[6], 1);
  bh_enc_complex(&seeds[6], 1.0, -0.0);
  bh_enc_range(&seeds[6], -5, 5, 2);
  bh_enc_str(&seeds[6], "s", 1);
  static const uint8_t rec[26] = {1, 2, 3};
  bh_tensor_ref a = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_INLINE,
                     .nbytes = 26, .shape = {2, 13}, .strides = {13, 1}, .data = rec};
  bh_enc_array(&seeds[7], "\"<M8[ns]\"", 9, &a);
  for (int s = 0; s < SEEDS; s++) {
    ASSERT_OK(seeds[s].err);
    ASSERT_RC(check_validate(seeds[s].data, seeds[s].len, BH_MAX_DEPTH), 0);
  }
  uint8_t buf[512];
  unsigned valid = 0, total = 0;
  for (int s = 0; s < SEEDS; s++) {
    for (int iter = 0; iter < PER; iter++) {
      size_t len = seeds[s].len;
      memcpy(buf, seeds[s].data, len);
      int edits = 1 + (int)(rnd() % 4);
      for (int k = 0; k < edits; k++) {
        size_t at = len ? (size_t)(rnd() % len) : 0;
        switch (rnd() % 7) {
        case 0: if (len) buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: if (len) buf[at] = interesting[rnd() % sizeof interesting]; break;
        case 2: if (len) buf[at] = (uint8_t)rnd(); break;
        case 3: /* insert */
          if (len < sizeof buf - 1) {
            memmove(buf + at + 1, buf + at, len - at);
            buf[at] = rnd_byte();
            len++;
          }
          break;
        case 4: /* delete */
          if (len) {
            memmove(buf + at, buf + at + 1, len - at - 1);
            len--;
          }
          break;
        case 5: len = at; break; /* truncate */
        case 6: /* a u32 field gets an interesting value */
          if (len >= 4) {
            static const uint32_t v[] = {0, 1, 2, 0x7fffffff, 0x80000000, 0xffffffff, 4000000000u};
            at = (size_t)(rnd() % (len - 3));
            put_u32(buf + at, v[rnd() % (sizeof v / sizeof v[0])]);
          }
          break;
        }
      }
      valid += check_validate(buf, len, (unsigned)(rnd() % (BH_MAX_DEPTH + 2))) == 0;
      total++;
    }
  }
  printf("mutations: %u of %u still valid\n", valid, total);
  ASSERT_GT(valid, 0);
  ASSERT_LT(valid, total);
  for (int s = 0; s < SEEDS; s++) bh_buf_free(&seeds[s]);
  return 0;
}

/* ---- protocol 8: sets, complex numbers, ranges, described arrays ---- */

TEST_IMPL(codec_roundtrip_sets) {
  /* A set of a frozenset of a tuple, and a frozenset as a map key. */
  static const tok toks[] = {
      {.tag = BH_TAG_LIST, .n = 3},
      {.tag = BH_TAG_SET, .n = 3},
      {.tag = BH_TAG_INT, .i = 1},
      {.tag = BH_TAG_STR, .s = "a", .n = 1},
      {.tag = BH_TAG_FROZENSET, .n = 1},
      {.tag = BH_TAG_TUPLE, .n = 1},
      {.tag = BH_TAG_NIL},
      {.tag = BH_TAG_MAP, .n = 1},
      {.tag = BH_TAG_FROZENSET, .n = 0},
      {.tag = BH_TAG_SET, .n = 0},
      {.tag = BH_TAG_FROZENSET, .n = 0},
  };
  /* list(1) > set(2) > frozenset(3) > tuple(4) > nil */
  bh_buf b = roundtrip(toks, sizeof toks / sizeof toks[0], 4);
  bh_buf_free(&b);
  /* The wire layout, pinned: tag, u32 count, items. */
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_set(&b, 1));
  ASSERT_OK(bh_enc_frozenset(&b, 0));
  static const uint8_t want[] = {0x0c, 1, 0, 0, 0, 0x0d, 0, 0, 0, 0};
  ASSERT_EQ(b.len, sizeof want);
  ASSERT_MEM_EQ(b.data, want, sizeof want);
  bh_buf_free(&b);
  /* Depth and counts are a list's: at the limit, past it, lying. */
  static const uint8_t tags[] = {BH_TAG_SET, BH_TAG_FROZENSET};
  for (int k = 0; k < 2; k++) {
    size_t len;
    uint8_t *p = nested(BH_MAX_DEPTH, tags[k], &len);
    ASSERT_RC(check_validate(p, len, BH_MAX_DEPTH), 0);
    ASSERT_RC(check_validate(p, len, BH_MAX_DEPTH - 1), -BH_EDEPTH);
    free(p);
    uint8_t huge[8] = {tags[k], 0, 0, 0, 0, BH_TAG_NIL, BH_TAG_NIL, BH_TAG_NIL};
    put_u32(huge + 1, UINT32_MAX);
    ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), -BH_ECOUNT);
    put_u32(huge + 1, 4);
    ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), -BH_ECOUNT);
    put_u32(huge + 1, 3);
    ASSERT_RC(check_validate(huge, sizeof huge, BH_MAX_DEPTH), 0);
    /* BH_MAX_ITEMS counts a set's items as a list's. */
    uint32_t n = BH_MAX_ITEMS;
    p = malloc(5 + (size_t)n);
    ASSERT_NOT_NULL(p);
    p[0] = tags[k];
    put_u32(p + 1, n);
    memset(p + 5, BH_TAG_NIL, n);
    ASSERT_RC(validate_exact(p, 5 + (size_t)n, BH_MAX_DEPTH), -BH_ETOOMANY);
    put_u32(p + 1, n - 1);
    ASSERT_RC(validate_exact(p, 4 + (size_t)n, BH_MAX_DEPTH), 0);
    free(p);
  }
  return 0;
}

TEST_IMPL(codec_roundtrip_complex_range) {
  static const double parts[] = {0.0, -0.0, 1.5, -2.25e300, 5e-324, INFINITY, -INFINITY, NAN};
  size_t np = sizeof parts / sizeof parts[0];
  for (size_t i = 0; i < np; i++)
    for (size_t j = 0; j < np; j++) {
      bh_buf b;
      bh_buf_init(&b);
      ASSERT_OK(bh_enc_complex(&b, parts[i], parts[j]));
      ASSERT_EQ(b.len, 17);
      ASSERT_RC(check_validate(b.data, b.len, 0), 0);
      bh_reader r;
      bh_item it;
      bh_reader_init(&r, b.data, b.len);
      ASSERT_OK(bh_dec_next(&r, &it));
      ASSERT_EQ(it.tag, BH_TAG_COMPLEX);
      ASSERT_UEQ(dbits(it.u.c.real), dbits(parts[i]));
      ASSERT_UEQ(dbits(it.u.c.imag), dbits(parts[j]));
      ASSERT_UEQ(bh_item_children(&it), 0);
      for (size_t cut = 0; cut < b.len; cut++) ASSERT_RC(check_validate(b.data, cut, 0), -BH_EOVERRUN);
      bh_buf_free(&b);
    }
  static const int64_t ends[] = {0, 1, -1, 10, INT64_MAX, INT64_MIN};
  static const int64_t steps[] = {1, -1, 3, -7, INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < 6; i++)
    for (size_t j = 0; j < 6; j++)
      for (size_t k = 0; k < 6; k++) {
        bh_buf b;
        bh_buf_init(&b);
        ASSERT_OK(bh_enc_range(&b, ends[i], ends[j], steps[k]));
        ASSERT_EQ(b.len, 25);
        ASSERT_RC(check_validate(b.data, b.len, 0), 0);
        bh_reader r;
        bh_item it;
        bh_reader_init(&r, b.data, b.len);
        ASSERT_OK(bh_dec_next(&r, &it));
        ASSERT_EQ(it.tag, BH_TAG_RANGE);
        ASSERT_EQ(it.u.r.start, ends[i]);
        ASSERT_EQ(it.u.r.stop, ends[j]);
        ASSERT_EQ(it.u.r.step, steps[k]);
        for (size_t cut = 0; cut < b.len; cut++) ASSERT_RC(check_validate(b.data, cut, 0), -BH_EOVERRUN);
        bh_buf_free(&b);
      }
  /* The wire layouts, pinned. */
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_complex(&b, 1.5, -2.0));
  ASSERT_OK(bh_enc_range(&b, 1, -2, 3));
  static const uint8_t want[] = {0x0e, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0xc0,
                                 0x0f, 1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff, 0xff, 3, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(b.len, sizeof want);
  ASSERT_MEM_EQ(b.data, want, sizeof want);
  bh_buf_free(&b);
  /* Step 0: no range has it, refused on both sides. */
  bh_buf_init(&b);
  ASSERT_RC(bh_enc_range(&b, 0, 5, 0), -EINVAL);
  ASSERT_EQ(b.len, 0);
  ASSERT_OK(b.err);
  bh_buf_free(&b);
  uint8_t zero[25] = {BH_TAG_RANGE};
  put_u64(zero + 1, 1);
  put_u64(zero + 9, 5);
  ASSERT_RC(check_validate(zero, sizeof zero, 0), -BH_EBODY);
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, zero, sizeof zero);
  ASSERT_RC(bh_dec_next(&r, &it), -BH_EBODY);
  ASSERT_EQ(r.pos, 0);
  /* Inside a set, after a good item. */
  uint8_t in_set[5 + 1 + 25] = {BH_TAG_SET, 2, 0, 0, 0, BH_TAG_NIL};
  memcpy(in_set + 6, zero, sizeof zero);
  ASSERT_RC(check_validate(in_set, sizeof in_set, 1), -BH_EBODY);
  return 0;
}

static const char ply_desc[] = "{\"names\":[\"x\",\"y\",\"z\",\"red\"],\"formats\":[\"<f4\",\"<f4\","
                               "\"<f4\",\"|u1\"],\"offsets\":[0,4,8,12],\"itemsize\":13}";

/* An ARRAY's encoding: the tag, u16 length, description, then the TENSOR. */
static size_t raw_array(uint8_t *p, const char *desc, size_t n, const bh_tensor_ref *t, unsigned ndim) {
  p[0] = BH_TAG_ARRAY;
  p[1] = (uint8_t)(n & 0xff);
  p[2] = (uint8_t)(n >> 8);
  memcpy(p + 3, desc, n);
  return 3 + n + raw_tensor(p + 3 + n, t, ndim);
}

TEST_IMPL(codec_roundtrip_array) {
  static uint8_t bytes[13 * 5];
  for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 7);
  const bh_tensor_ref cases[] = {
      /* A PLY vertex record array inline, in a block, as a scalar, empty. */
      {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_INLINE,
       .nbytes = 65, .shape = {5, 13}, .strides = {13, 1}, .data = bytes},
      {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 3, .block = 4, .offset = 4096,
       .nbytes = 13 * 6000, .shape = {2, 3000, 13}, .strides = {3000 * 13, 13, 1}},
      {.lib = BH_TENSOR_NUMPY_SCALAR, .dtype = BH_DT_UINT8, .ndim = 1, .block = BH_BLOCK_INLINE,
       .nbytes = 13, .shape = {13}, .strides = {1}, .data = bytes},
      {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_NONE,
       .shape = {0, 13}, .strides = {13, 1}},
      /* Rows in reverse order of storage (a transposed view): only the
       * last stride must be 1. */
      {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 3, .block = 9, .nbytes = 78,
       .shape = {3, 2, 13}, .strides = {13, 39, 1}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const bh_tensor_ref *t = &cases[k];
    bh_buf b;
    bh_buf_init(&b);
    ASSERT_OK(bh_enc_array(&b, ply_desc, sizeof ply_desc - 1, t));
    ASSERT_RC(check_validate(b.data, b.len, 0), 0);
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, b.data, b.len);
    ASSERT_OK(bh_dec_next(&r, &it));
    ASSERT_EQ(it.tag, BH_TAG_ARRAY);
    ASSERT_EQ(r.pos, b.len);
    ASSERT_EQ(it.desc_len, sizeof ply_desc - 1);
    ASSERT_MEM_EQ(it.desc, ply_desc, sizeof ply_desc - 1);
    ASSERT(it.desc == (const char *)b.data + 3);
    expect_tensor_eq(&it.u.t, t);
    if (t->block == BH_BLOCK_INLINE) ASSERT_MEM_EQ(it.u.t.data, t->data, (size_t)t->nbytes);
    ASSERT_UEQ(bh_item_children(&it), 0);
    for (size_t cut = 0; cut < b.len; cut++) ASSERT_RC(check_validate(b.data, cut, 0), -BH_EOVERRUN);
    bh_buf_free(&b);
  }
  /* The wire layout, pinned: a datetime64[ns] scalar. */
  static const uint8_t ns[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  bh_tensor_ref one = {.lib = BH_TENSOR_NUMPY_SCALAR, .dtype = BH_DT_UINT8, .ndim = 1,
                       .block = BH_BLOCK_INLINE, .nbytes = 8, .shape = {8}, .strides = {1}, .data = ns};
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_array(&b, "\"<M8\"", 5, &one));
  static const uint8_t want[] = {0x10, 5, 0, '"', '<', 'M', '8', '"',
                                 0x09, 2, 3, 1, 0xfe, 0xff, 0xff, 0xff,
                                 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0,
                                 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                 1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(b.len, sizeof want);
  ASSERT_MEM_EQ(b.data, want, sizeof want);
  bh_buf_free(&b);
  /* The longest description, then one byte more (refused). */
  char *longest = malloc(BH_ARRAY_DESC_MAX + 1);
  ASSERT_NOT_NULL(longest);
  memset(longest, 'x', BH_ARRAY_DESC_MAX + 1);
  bh_buf_init(&b);
  ASSERT_OK(bh_enc_array(&b, longest, BH_ARRAY_DESC_MAX, &cases[0]));
  ASSERT_RC(check_validate(b.data, b.len, 0), 0);
  bh_buf_free(&b);
  bh_buf_init(&b);
  ASSERT_RC(bh_enc_array(&b, longest, BH_ARRAY_DESC_MAX + 1, &cases[0]), -EINVAL);
  ASSERT_EQ(b.len, 0);
  bh_buf_free(&b);
  free(longest);
  return 0;
}

/* Every way an ARRAY can lie, refused with its own code on both sides. */
TEST_IMPL(codec_array_lies) {
  const bh_tensor_ref good = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = 1,
                              .nbytes = 39, .shape = {3, 13}, .strides = {13, 1}};
  struct lie {
    const char *what, *desc;
    size_t desc_len;
    bh_tensor_ref t;
    int want;
  } lies[16];
  int n = 0;
#define LIE(about, code, ...)                                    \
  do {                                                           \
    lies[n].what = about;                                        \
    lies[n].desc = ply_desc;                                     \
    lies[n].desc_len = sizeof ply_desc - 1;                      \
    lies[n].t = good;                                            \
    { struct lie *l = &lies[n]; bh_tensor_ref *t = &l->t; (void)t; __VA_ARGS__; } \
    lies[n].want = code;                                         \
    n++;                                                         \
  } while (0)
  LIE("an empty description", -BH_EBODY, l->desc_len = 0);
  LIE("a description that is not UTF-8", -BH_EUTF8, l->desc = "\"\xc0\x80\""; l->desc_len = 4);
  LIE("bytes of another dtype", -BH_EBODY, t->dtype = BH_DT_INT8);
  LIE("bytes of float32", -BH_EBODY, t->dtype = BH_DT_FLOAT32; t->nbytes = 39 * 4);
  LIE("a torch tensor", -BH_EBODY, t->lib = BH_TENSOR_TORCH);
  LIE("no dimension for the itemsize", -BH_EBODY, t->ndim = 0; t->nbytes = 1);
  LIE("the itemsize axis strided", -BH_EBODY, t->shape[1] = 1; t->strides[0] = 1; t->strides[1] = 2;
      t->nbytes = 3);
  LIE("the itemsize axis broadcast", -BH_EBODY, t->strides[1] = 0);
  LIE("a scalar of two dimensions", -BH_EBODY, t->lib = BH_TENSOR_NUMPY_SCALAR);
  LIE("its tensor lies", -BH_ETENSOR, t->nbytes = 40);
  LIE("its tensor's dtype unknown", -BH_EDTYPE, t->dtype = 0);
#undef LIE
  uint8_t wire[512];
  for (int k = 0; k < n; k++) {
    const struct lie *l = &lies[k];
    fprintf(stderr, "case: %s\n", l->what);
    bh_buf b;
    bh_buf_init(&b);
    ASSERT_RC(bh_enc_array(&b, l->desc, l->desc_len, &l->t), -EINVAL);
    ASSERT_EQ(b.len, 0);
    ASSERT_OK(b.err);
    bh_buf_free(&b);
    size_t len = raw_array(wire, l->desc, l->desc_len, &l->t, l->t.ndim);
    ASSERT_RC(check_validate(wire, len, 0), l->want);
    bh_reader r;
    bh_item it;
    bh_reader_init(&r, wire, len);
    ASSERT_RC(bh_dec_next(&r, &it), l->want);
    ASSERT_EQ(r.pos, 0);
    /* Inside a frozenset, after a good ARRAY. */
    uint8_t in[5 + 512 + 512];
    in[0] = BH_TAG_FROZENSET;
    put_u32(in + 1, 2);
    size_t glen = raw_array(in + 5, ply_desc, sizeof ply_desc - 1, &good, 2);
    memcpy(in + 5 + glen, wire, len);
    ASSERT_RC(check_validate(in, 5 + glen + len, 1), l->want);
  }
  /* What follows the description is not a TENSOR: another tag, a nested
   * ARRAY, nothing at all. */
  static const uint8_t next_tags[] = {BH_TAG_NIL, BH_TAG_LIST, BH_TAG_ARRAY, BH_TAG_HANDLE, 0xee};
  for (size_t k = 0; k < sizeof next_tags; k++) {
    size_t len = raw_array(wire, "\"<M8\"", 5, &good, 2);
    wire[3 + 5] = next_tags[k];
    ASSERT_RC(check_validate(wire, len, 0), -BH_EBODY);
  }
  static const uint8_t bare[] = {BH_TAG_ARRAY, 2, 0, '"', '"'};
  ASSERT_RC(check_validate(bare, sizeof bare, 0), -BH_EOVERRUN);
  /* A length past the end is an overrun. */
  static const uint8_t past[] = {BH_TAG_ARRAY, 0xff, 0xff, '"'};
  ASSERT_RC(check_validate(past, sizeof past, 0), -BH_EOVERRUN);
  return 0;
}

/* The children a header says follow it: what every walk steps by. */
TEST_IMPL(codec_item_children) {
  static const struct {
    uint8_t tag;
    uint32_t count;
    uint64_t want;
  } cases[] = {{BH_TAG_LIST, 3, 3}, {BH_TAG_TUPLE, 0, 0}, {BH_TAG_SET, 7, 7},
               {BH_TAG_FROZENSET, UINT32_MAX, UINT32_MAX}, {BH_TAG_MAP, UINT32_MAX, 2ull * UINT32_MAX},
               {BH_TAG_NIL, 5, 0}, {BH_TAG_STR, 5, 0}, {BH_TAG_TENSOR, 5, 0}, {BH_TAG_ARRAY, 5, 0},
               {BH_TAG_RANGE, 5, 0}, {BH_TAG_COMPLEX, 5, 0}, {0xee, 5, 0}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    bh_item it;
    memset(&it, 0, sizeof it);
    it.tag = cases[k].tag;
    it.u.count = cases[k].count;
    ASSERT_UEQ(bh_item_children(&it), cases[k].want);
  }
  return 0;
}

/* ---- names ---- */

TEST_IMPL(codec_error_names) {
  int values[64], n = 0;
#define CHECK_ERR(name, value, msg)                      \
  ASSERT_EQ(name, value);                                \
  ASSERT_STR_EQ(bh_errname(-name), #name);               \
  ASSERT_STR_EQ(bh_errname(name), #name);                \
  ASSERT_STR_EQ(bh_strerror(-name), msg);                \
  ASSERT_STR_EQ(bh_strerror(name), msg);                 \
  values[n++] = value;
  BH_ERRNO_MAP(CHECK_ERR)
#undef CHECK_ERR
  ASSERT_EQ(n, 34);
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) ASSERT_NE(values[i], values[j]);
  /* errno values go through strerror, and the common ones have names. */
  static const struct {
    int e;
    const char *name;
  } errs[] = {{ETIMEDOUT, "ETIMEDOUT"}, {EINTR, "EINTR"}, {EPIPE, "EPIPE"},
              {ENOENT, "ENOENT"}, {EACCES, "EACCES"}, {EINVAL, "EINVAL"},
              {ENOMEM, "ENOMEM"}, {ECONNRESET, "ECONNRESET"}};
  for (size_t k = 0; k < sizeof errs / sizeof errs[0]; k++) {
    ASSERT_STR_EQ(bh_errname(-errs[k].e), errs[k].name);
    ASSERT_STR_EQ(bh_strerror(-errs[k].e), strerror(errs[k].e));
  }
  ASSERT_NULL(bh_errname(-99999));
  ASSERT_NULL(bh_errname(0));
  ASSERT_NOT_NULL(bh_strerror(-99999));
  ASSERT_NOT_NULL(bh_strerror(0));
  return 0;
}

TEST_IMPL(codec_dtype_and_kind_names) {
  int n = 0;
#define CHECK_DT(name, code, size, str)              \
  ASSERT_EQ(bh_dtype_itemsize(code), size);          \
  ASSERT_STR_EQ(bh_dtype_name(code), str);           \
  ASSERT_EQ(name, code);                             \
  n++;
  BH_DTYPE_MAP(CHECK_DT)
#undef CHECK_DT
  ASSERT_EQ(n, 22);
  ASSERT_EQ(bh_dtype_itemsize(0), 0);
  ASSERT_EQ(bh_dtype_itemsize(BH_DT_CLONGDOUBLE + 1), 0);
  ASSERT_EQ(bh_dtype_itemsize(UINT32_MAX), 0);
  ASSERT_NULL(bh_dtype_name(0));
  ASSERT_NULL(bh_dtype_name(255));
  ASSERT_STR_EQ(bh_dtype_name(BH_DT_BFLOAT16), "bfloat16");
  ASSERT_EQ(bh_dtype_itemsize(BH_DT_COMPLEX128), 16);

  static const char *const kinds[] = {NULL, "HELLO", "CALL", "RESULT", "ERROR", "PROGRESS",
                                      "CALLBACK", "INTERRUPT", "RELEASE", "RESIDENCY", "BYE",
                                      "BLOCKS"};
  ASSERT_EQ(BH_KIND_MAX_, 11);
  for (unsigned k = 1; k <= BH_KIND_MAX_; k++) ASSERT_STR_EQ(bh_kind_name(k), kinds[k]);
  ASSERT_NULL(bh_kind_name(0));
  ASSERT_NULL(bh_kind_name(BH_KIND_MAX_ + 1));
  ASSERT_NULL(bh_kind_name(UINT32_MAX));
  return 0;
}
