/*
 * seeds.c -- writes the seed corpus of every fuzz target (make fuzz-seeds):
 *
 *   seeds OUTDIR      OUTDIR/<target>/<name> for codec, frame, ledger,
 *                     ram and answer (fuzz/corpus is what is committed)
 *
 * The seeds are valid inputs made with the real encoders, so the fuzzers
 * start deep inside each format instead of at its first check:
 *
 *   codec   one value of every tag (edge integers and floats, UTF-8 of
 *           each width, a tensor of every dtype, empty and strided
 *           tensors, torch tensors' flags, handles; sets, frozensets,
 *           complex numbers, ranges and described arrays: a PLY vertex
 *           record inline and in a block, datetime64, a record scalar,
 *           an empty one), nested containers, a deep list.
 *   frame   frames bh_channel_send really writes, taken off the socket
 *           between two real channels (a relay in the middle passes each
 *           on, so the sections carry real intros, return and retire
 *           notes), each stored as "u8 fd count, message bytes": every
 *           kind, tensor intros, a BLOCKS frame, a spilled header.
 *   ledger  file images made with the ledger's own writers on an image in
 *           memory (bh__ledger_open_mem): empty, records of a host and two
 *           workers with devices and models (alive under the fuzz build's
 *           rule, BH__FUZZ_START_TIME), a dead record, a record left
 *           mid-write, a full ledger, another version, all zero.  Each
 *           is stored without its trailing zeros (fuzz_ledger.c reads a
 *           short input both as it is and as the start of a whole file).
 *   ram     fixture trees (fuzz_ram.c's NUL-separated layout): cgroup v2,
 *           v1, hybrid, nested limits, none, per-CPU lists in zoneinfo.
 *   answer  what a host's control socket answers `bulkhead release`: a
 *           receipt, an error, keys of the wrong types, extra nested keys,
 *           a string longer than its field, not a map.
 *
 * Runs in a second and leaves nothing behind but the files it writes.
 */
#include "bulkhead/bulkhead.h"
#include "bulkhead/ledger.h"
#include "src/core/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *outdir;

#define CHECK(expr)                                                      \
  do {                                                                   \
    if (!(expr)) {                                                       \
      fprintf(stderr, "seeds.c:%d: failed: %s\n", __LINE__, #expr);      \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

static void write_seed(const char *target, const char *name, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", outdir, target);
  CHECK(mkdir(path, 0755) == 0 || errno == EEXIST);
  snprintf(path, sizeof path, "%s/%s/%s", outdir, target, name);
  FILE *f = fopen(path, "wbe");
  CHECK(f != NULL);
  CHECK(n == 0 || fwrite(p, 1, n, f) == n);
  CHECK(fclose(f) == 0);
}

/* ------------------------------------------------------------------ codec */

static void seed_buf(const char *name, bh_buf *b) {
  CHECK(b->err == 0);
  CHECK(bh_dec_validate(b->data, b->len, BH_MAX_DEPTH) == 0);
  write_seed("codec", name, b->data, b->len);
  bh_buf_free(b);
}

static void tensor(bh_buf *b, uint8_t lib, uint8_t dtype, unsigned ndim, const int64_t *shape,
                   const int64_t *strides, uint32_t block, uint64_t offset) {
  bh_tensor_ref t = {.lib = lib, .dtype = dtype, .ndim = (uint8_t)ndim, .block = block,
                     .offset = offset};
  uint64_t count = 1;
  for (unsigned i = 0; i < ndim; i++) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
    count *= (uint64_t)shape[i];
  }
  t.nbytes = count * bh_dtype_itemsize(dtype);
  if (count == 0) t.block = BH_BLOCK_NONE, t.offset = 0;
  CHECK(bh_enc_tensor(b, &t) == 0);
}

static void codec_seeds(void) {
  bh_buf b;
  bh_buf_init(&b), bh_enc_nil(&b), seed_buf("nil", &b);
  bh_buf_init(&b), bh_enc_bool(&b, 0), seed_buf("false", &b);
  bh_buf_init(&b), bh_enc_bool(&b, 1), seed_buf("true", &b);
  bh_buf_init(&b), bh_enc_int(&b, 0), seed_buf("int_zero", &b);
  bh_buf_init(&b), bh_enc_int(&b, -1), seed_buf("int_minus_one", &b);
  bh_buf_init(&b), bh_enc_int(&b, INT64_MIN), seed_buf("int_min", &b);
  bh_buf_init(&b), bh_enc_int(&b, INT64_MAX), seed_buf("int_max", &b);
  bh_buf_init(&b), bh_enc_float(&b, 0.5), seed_buf("float", &b);
  bh_buf_init(&b), bh_enc_float(&b, -0.0), seed_buf("float_minus_zero", &b);
  bh_buf_init(&b), bh_enc_float(&b, __builtin_nan("")), seed_buf("float_nan", &b);
  bh_buf_init(&b), bh_enc_float(&b, __builtin_inf()), seed_buf("float_inf", &b);
  bh_buf_init(&b), bh_enc_str(&b, "", 0), seed_buf("str_empty", &b);
  bh_buf_init(&b), bh_enc_str(&b, "model.safetensors", 17), seed_buf("str_ascii", &b);
  /* One code point of every UTF-8 width, and the edges of the ranges. */
  static const char utf8[] = "a\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf"
                             "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
  bh_buf_init(&b), bh_enc_str(&b, utf8, sizeof utf8 - 1), seed_buf("str_utf8_widths", &b);
  bh_buf_init(&b), bh_enc_bytes(&b, "\x00\xff\x80", 3), seed_buf("bytes", &b);
  bh_buf_init(&b), bh_enc_bytes(&b, "", 0), seed_buf("bytes_empty", &b);
  bh_buf_init(&b), bh_enc_list(&b, 0), seed_buf("list_empty", &b);
  bh_buf_init(&b), bh_enc_map(&b, 0), seed_buf("map_empty", &b);
  bh_buf_init(&b), bh_enc_tuple(&b, 0), seed_buf("tuple_empty", &b);

  /* A call's arguments: (args tuple, kwargs map) with one of everything. */
  bh_buf_init(&b);
  bh_enc_tuple(&b, 2);
  bh_enc_list(&b, 6);
  bh_enc_int(&b, 42);
  bh_enc_float(&b, 1.25);
  bh_enc_str(&b, "euler", 5);
  bh_enc_nil(&b);
  bh_enc_bool(&b, 1);
  bh_enc_bytes(&b, "\x01\x02", 2);
  bh_enc_map(&b, 3);
  bh_enc_str(&b, "steps", 5), bh_enc_int(&b, 20);
  bh_enc_str(&b, "cfg", 3), bh_enc_float(&b, 7.5);
  bh_enc_str(&b, "model", 5);
  bh_handle_ref h = {.space = BH_HANDLE_OBJECT, .id = 7, .type = "packa.nodes.Model", .type_len = 17};
  bh_enc_handle(&b, &h);
  seed_buf("call_args", &b);

  bh_handle_ref cb = {.space = BH_HANDLE_CALLABLE, .id = UINT64_MAX};
  bh_buf_init(&b), bh_enc_handle(&b, &cb), seed_buf("handle_callable", &b);

  /* Nesting: a list 63 deep (BH_MAX_DEPTH is 64), and maps of tuples. */
  bh_buf_init(&b);
  for (int i = 0; i < 63; i++) bh_enc_list(&b, 1);
  bh_enc_int(&b, 1);
  seed_buf("deep_list", &b);
  bh_buf_init(&b);
  bh_enc_map(&b, 2);
  bh_enc_int(&b, 1), bh_enc_tuple(&b, 2), bh_enc_nil(&b), bh_enc_list(&b, 1), bh_enc_map(&b, 0);
  bh_enc_str(&b, "k", 1), bh_enc_map(&b, 1), bh_enc_bytes(&b, "", 0), bh_enc_tuple(&b, 0);
  seed_buf("nested_maps", &b);

  /* Tensors: every dtype as a 1-d array, then the shapes that matter. */
  for (unsigned dt = 1; dt < 64; dt++) {
    if (!bh_dtype_itemsize(dt)) continue;
    char name[64];
    int64_t shape[1] = {3}, strides[1] = {1};
    bh_buf_init(&b);
    tensor(&b, BH_TENSOR_TORCH, (uint8_t)dt, 1, shape, strides, 1, 0);
    snprintf(name, sizeof name, "tensor_%s", bh_dtype_name(dt));
    seed_buf(name, &b);
  }
  /* A torch tensor's flags (protocol 9): requires_grad, inference, Parameter. */
  {
    int64_t shape[1] = {3}, strides[1] = {1};
    bh_buf_init(&b);
    tensor(&b, BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD, BH_DT_FLOAT32, 1, shape, strides, 1, 0);
    seed_buf("tensor_requires_grad", &b);
    bh_buf_init(&b);
    tensor(&b, BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD | BH_TENSOR_PARAMETER, BH_DT_FLOAT16, 1, shape,
           strides, 1, 0);
    seed_buf("tensor_parameter", &b);
    bh_buf_init(&b);
    tensor(&b, BH_TENSOR_TORCH | BH_TENSOR_REQUIRES_GRAD | BH_TENSOR_INFERENCE, BH_DT_BFLOAT16, 1, shape,
           strides, 1, 0);
    seed_buf("tensor_inference_requires_grad", &b);
  }
  int64_t s2[2] = {4, 8}, st2[2] = {8, 1}, st2t[2] = {1, 4};
  bh_buf_init(&b), tensor(&b, BH_TENSOR_NUMPY, BH_DT_FLOAT32, 2, s2, st2, 3, 4096),
      seed_buf("tensor_2d", &b);
  bh_buf_init(&b), tensor(&b, BH_TENSOR_NUMPY, BH_DT_FLOAT32, 2, s2, st2t, 3, 0),
      seed_buf("tensor_2d_transposed_strides", &b);
  int64_t s0[2] = {0, 5}, st0[2] = {5, 1};
  bh_buf_init(&b), tensor(&b, BH_TENSOR_TORCH, BH_DT_FLOAT16, 2, s0, st0, 0, 0),
      seed_buf("tensor_empty", &b);
  bh_buf_init(&b), tensor(&b, BH_TENSOR_NUMPY_SCALAR, BH_DT_FLOAT64, 0, NULL, NULL, 9, 64),
      seed_buf("tensor_scalar", &b);
  int64_t sb[1] = {5}, stb[1] = {0};
  bh_buf_init(&b), tensor(&b, BH_TENSOR_TORCH, BH_DT_INT64, 1, sb, stb, 2, 0),
      seed_buf("tensor_broadcast_stride0", &b);
  int64_t s16[16], st16[16];
  for (int i = 0; i < 16; i++) s16[i] = 2, st16[i] = (int64_t)1 << (15 - i);
  bh_buf_init(&b), tensor(&b, BH_TENSOR_TORCH, BH_DT_UINT8, 16, s16, st16, 4, 0),
      seed_buf("tensor_16_dims", &b);
  /* A small tensor inline: its bytes follow the ref. */
  static const float inline_data[32] = {1.0f, -2.5f, 3.25f};
  bh_tensor_ref in = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_FLOAT32, .ndim = 2,
                      .block = BH_BLOCK_INLINE, .nbytes = sizeof inline_data, .shape = {4, 8},
                      .strides = {8, 1}, .data = (const uint8_t *)inline_data};
  bh_buf_init(&b);
  CHECK(bh_enc_tensor(&b, &in) == 0);
  seed_buf("tensor_inline", &b);

  /* Protocol 8's tags: sets (of a tuple, a frozenset inside), complex
   * numbers at the edges, ranges, and described arrays. */
  bh_buf_init(&b), bh_enc_set(&b, 0), seed_buf("set_empty", &b);
  bh_buf_init(&b);
  bh_enc_set(&b, 4);
  bh_enc_int(&b, 1), bh_enc_str(&b, "a", 1), bh_enc_tuple(&b, 2), bh_enc_int(&b, 2), bh_enc_nil(&b);
  bh_enc_frozenset(&b, 2), bh_enc_bytes(&b, "\x00", 1), bh_enc_complex(&b, 1.0, -2.0);
  seed_buf("set_mixed", &b);
  bh_buf_init(&b), bh_enc_frozenset(&b, 0), seed_buf("frozenset_empty", &b);
  bh_buf_init(&b);
  bh_enc_map(&b, 1), bh_enc_frozenset(&b, 2), bh_enc_int(&b, 3), bh_enc_range(&b, 0, 10, 3);
  bh_enc_set(&b, 1), bh_enc_frozenset(&b, 1), bh_enc_frozenset(&b, 0);
  seed_buf("frozenset_as_key", &b);
  bh_buf_init(&b), bh_enc_complex(&b, 1.5, -0.0), seed_buf("complex", &b);
  bh_buf_init(&b), bh_enc_complex(&b, __builtin_nan(""), __builtin_inf()), seed_buf("complex_nan_inf", &b);
  bh_buf_init(&b), bh_enc_range(&b, 0, 0, 1), seed_buf("range_empty", &b);
  bh_buf_init(&b), bh_enc_range(&b, INT64_MAX, INT64_MIN, INT64_MIN), seed_buf("range_extremes", &b);
  bh_buf_init(&b), bh_enc_range(&b, 3, -10, -2), seed_buf("range_negative_step", &b);
  /* A PLY vertex (x, y, z float32, red uint8: 13 bytes) x 4, inline. */
  static const char ply[] = "{\"names\":[\"x\",\"y\",\"z\",\"red\"],\"formats\":[\"<f4\",\"<f4\",\"<f4\","
                            "\"|u1\"],\"offsets\":[0,4,8,12],\"itemsize\":13}";
  static const uint8_t ply_bytes[52] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0xff};
  bh_tensor_ref pa = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_INLINE,
                      .nbytes = 52, .shape = {4, 13}, .strides = {13, 1}, .data = ply_bytes};
  bh_buf_init(&b);
  CHECK(bh_enc_array(&b, ply, sizeof ply - 1, &pa) == 0);
  seed_buf("array_ply_inline", &b);
  bh_tensor_ref pb = pa;
  pb.block = 5, pb.offset = 128, pb.data = NULL, pb.shape[0] = 1000, pb.nbytes = 13000;
  bh_buf_init(&b);
  CHECK(bh_enc_array(&b, ply, sizeof ply - 1, &pb) == 0);
  seed_buf("array_ply_block", &b);
  static const uint8_t ns[16] = {1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0x80};
  bh_tensor_ref dt = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_INLINE,
                      .nbytes = 16, .shape = {2, 8}, .strides = {8, 1}, .data = ns};
  bh_buf_init(&b);
  CHECK(bh_enc_array(&b, "\"<M8[ns]\"", 9, &dt) == 0);
  seed_buf("array_datetime64", &b);
  bh_tensor_ref sc = {.lib = BH_TENSOR_NUMPY_SCALAR, .dtype = BH_DT_UINT8, .ndim = 1,
                      .block = BH_BLOCK_INLINE, .nbytes = 13, .shape = {13}, .strides = {1},
                      .data = ply_bytes};
  bh_buf_init(&b);
  CHECK(bh_enc_array(&b, ply, sizeof ply - 1, &sc) == 0);
  seed_buf("array_record_scalar", &b);
  bh_tensor_ref em = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = BH_BLOCK_NONE,
                      .shape = {0, 8}, .strides = {8, 1}};
  bh_buf_init(&b);
  bh_enc_list(&b, 2);
  CHECK(bh_enc_array(&b, "\"<m8[ms]\"", 9, &em) == 0);
  bh_enc_set(&b, 0);
  seed_buf("array_empty_in_list", &b);
}

/* ------------------------------------------------------------------ frame */

/* The relay between two channels: a <-> ra ... rb <-> b.  Every message
 * is stored as a seed, then passed on with its fds. */
static int ra, rb;

static void relay(int from, int to, const char *name) {
  uint8_t buf[BH_FRAME_INLINE_MAX + 64], seed[sizeof buf + 1];
  union {
    char c[CMSG_SPACE(sizeof(int) * BH_FRAME_FDS_MAX)];
    struct cmsghdr align;
  } u;
  struct iovec iov = {buf, sizeof buf};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c,
                      .msg_controllen = sizeof u.c};
  ssize_t n = recvmsg(from, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  CHECK(n >= 0 && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)));
  int fds[BH_FRAME_FDS_MAX];
  uint32_t n_fds = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    memcpy(fds + n_fds, CMSG_DATA(cm), k * sizeof(int));
    n_fds += (uint32_t)k;
  }
  seed[0] = (uint8_t)n_fds;
  memcpy(seed + 1, buf, (size_t)n);
  write_seed("frame", name, seed, (size_t)n + 1);

  struct msghdr out = {.msg_iov = &iov, .msg_iovlen = 1};
  iov.iov_len = (size_t)n;
  if (n_fds) {
    out.msg_control = u.c;
    out.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&out);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
  }
  CHECK(sendmsg(to, &out, MSG_NOSIGNAL) == n);
  for (uint32_t i = 0; i < n_fds; i++) close(fds[i]);
}

static void send_and_pass(bh_channel *from, int relay_from, int relay_to, bh_channel *to,
                          const char *name, uint16_t kind, uint64_t req, const bh_buf *v,
                          bh_block *const *blocks, uint32_t n_blocks) {
  bh_msg m = {.kind = kind, .request_id = req, .value = v ? v->data : NULL,
              .value_len = v ? v->len : 0, .blocks = blocks, .n_blocks = n_blocks};
  CHECK(bh_channel_send(from, &m) == 0);
  /* More intros than one frame carries go first in BLOCKS frames. */
  for (uint32_t extra = 0; n_blocks > BH_FRAME_FDS_MAX - 1; n_blocks -= BH_FRAME_FDS_MAX - 1) {
    char bname[128];
    snprintf(bname, sizeof bname, "%s_blocks%u", name, extra++);
    relay(relay_from, relay_to, bname);
  }
  relay(relay_from, relay_to, name);
  bh_frame f;
  int rc = bh_channel_recv(to, &f, bh_now_ns() + 1000000000);
  CHECK(rc == 0 && f.h.kind == kind);
  bh_channel_frame_done(to, &f);
}

static bh_buf tensor_in(const bh_block *blk, size_t n) {
  bh_buf v;
  int64_t shape[1] = {(int64_t)n}, strides[1] = {1};
  bh_buf_init(&v);
  tensor(&v, BH_TENSOR_NUMPY, BH_DT_UINT8, 1, shape, strides, bh_block_id(blk), 0);
  return v;
}

static void frame_seeds(void) {
  int sa[2], sb[2];
  CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sa) == 0);
  CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sb) == 0);
  /* The channels' ends ask for credentials (SO_PASSCRED): the kernel
   * attaches this process's to what the relay sends on. */
  ra = sa[1], rb = sb[1];
  bh_channel_opts oa = {.peer_uid = getuid(), .pool_keep_bytes = 4096, .spin_ns = -1};
  bh_channel_opts ob = {.peer_uid = getuid(), .spin_ns = -1};
  bh_channel *a, *b;
  CHECK(bh_channel_open(&a, sa[0], &oa) == 0);
  CHECK(bh_channel_open(&b, sb[0], &ob) == 0);

  bh_buf v;
  bh_buf_init(&v);
  bh_enc_tuple(&v, 2), bh_enc_list(&v, 1), bh_enc_str(&v, "prompt", 6), bh_enc_map(&v, 0);
  send_and_pass(a, ra, rb, b, "hello", BH_KIND_HELLO, 0, &v, NULL, 0);
  send_and_pass(a, ra, rb, b, "call", BH_KIND_CALL, 1, &v, NULL, 0);
  send_and_pass(b, rb, ra, a, "result_empty_value", BH_KIND_RESULT, 1, NULL, NULL, 0);
  for (uint16_t k = BH_KIND_ERROR; k <= BH_KIND_BYE; k++) {
    char name[32];
    snprintf(name, sizeof name, "kind_%s", bh_kind_name(k));
    send_and_pass(b, rb, ra, a, name, k, 100 + k, &v, NULL, 0);
  }
  bh_buf_free(&v);

  /* A tensor in a block: the frame introduces it (an fd comes along). */
  bh_block *b1, *b2;
  CHECK(bh_channel_block_acquire(a, 4096, &b1) == 0);
  v = tensor_in(b1, 4096);
  send_and_pass(a, ra, rb, b, "intro_tensor", BH_KIND_RESULT, 2, &v, &b1, 1);
  bh_buf_free(&v);
  /* b drops its view of it: a return note rides on b's next frame. */
  bh_block *peer;
  CHECK(bh_channel_peer_block(b, bh_block_id(b1), &peer) == 0);
  bh_block_unref(peer);
  send_and_pass(b, rb, ra, a, "return_note", BH_KIND_PROGRESS, 0, NULL, NULL, 0);
  /* a frees b1 and takes a bigger block: b1 is trimmed (keep 4096) and
   * b, which mapped it, gets a retire note. */
  bh_block_unref(b1);
  CHECK(bh_channel_block_acquire(a, 8192, &b2) == 0);
  v = tensor_in(b2, 8192);
  send_and_pass(a, ra, rb, b, "intro_second_block", BH_KIND_CALL, 3, &v, &b2, 1);
  bh_buf_free(&v);
  CHECK(bh_channel_peer_block(b, bh_block_id(b2), &peer) == 0);
  bh_block_unref(peer);
  send_and_pass(b, rb, ra, a, "return_second", BH_KIND_RESULT, 3, NULL, NULL, 0);
  bh_block_unref(b2);
  bh_block *b3;
  CHECK(bh_channel_block_acquire(a, 16384, &b3) == 0); /* trims b2: retire */
  send_and_pass(a, ra, rb, b, "retire_note", BH_KIND_RELEASE, 4, NULL, NULL, 0);

  /* Three blocks in one frame, and more than one frame's fds. */
  bh_block *many[70];
  for (int i = 0; i < 70; i++) CHECK(bh_channel_block_acquire(a, 4096, &many[i]) == 0);
  bh_buf_init(&v);
  bh_enc_list(&v, 3);
  for (int i = 0; i < 3; i++) {
    bh_buf t = tensor_in(many[i], 16);
    CHECK(bh_buf_reserve(&v, t.len) == 0);
    memcpy(v.data + v.len, t.data, t.len);
    v.len += t.len;
    bh_buf_free(&t);
  }
  send_and_pass(a, ra, rb, b, "three_intros", BH_KIND_CALL, 5, &v, many, 3);
  bh_buf_free(&v);
  send_and_pass(a, ra, rb, b, "seventy_blocks", BH_KIND_CALLBACK, 6, NULL, many + 3, 67);

  /* Small tensors sharing an arena block, each an aligned range, and refs
   * a receiver refuses (bh_channel_frame_block): to a block the frame does
   * not lend, misaligned, overlapping, past the block's end. */
  bh_arena ar = {0};
  bh_block *ab[4];
  uint64_t ao[4];
  for (int i = 0; i < 4; i++) CHECK(bh_arena_take(bh_channel_pool(a), &ar, 100, &ab[i], &ao[i]) == 0);
  bh_arena_close(&ar);
  static const struct {
    const char *name;
    uint64_t off[4]; /* UINT64_MAX: the arena's own offset */
    uint64_t len;
    int other; /* the last ref names many[0]'s block, not lent by this frame */
  } arena[] = {
      {"arena_refs", {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX}, 100, 0},
      {"arena_ref_not_lent", {UINT64_MAX, UINT64_MAX, UINT64_MAX, 0}, 100, 1},
      {"arena_ref_misaligned", {0, 100, 192, 256}, 100, 0},
      {"arena_ref_overlap", {0, 64, 192, 256}, 100, 0},
      {"arena_ref_out_of_order", {128, 0, 256, 384}, 100, 0},
      {"arena_ref_past_block", {0, 128, 256, BH_ARENA_BLOCK_MIN - 64}, 100, 0},
  };
  for (size_t k = 0; k < sizeof arena / sizeof arena[0]; k++) {
    bh_buf_init(&v);
    bh_enc_list(&v, 4);
    for (int i = 0; i < 4; i++) {
      int64_t shape[1] = {(int64_t)arena[k].len}, strides[1] = {1};
      uint64_t off = arena[k].off[i] == UINT64_MAX ? ao[i] : arena[k].off[i];
      const bh_block *blk = arena[k].other && i == 3 ? many[0] : ab[i];
      tensor(&v, BH_TENSOR_NUMPY, BH_DT_UINT8, 1, shape, strides, bh_block_id(blk), off);
    }
    send_and_pass(a, ra, rb, b, arena[k].name, BH_KIND_RESULT, 8 + k, &v, ab, 4);
    bh_buf_free(&v);
    /* b's views of the arena (none, as the seeds only relay): returned by
     * taking and dropping one, so the next seed may lend it again. */
    bh_block *pv;
    CHECK(bh_channel_peer_block(b, bh_block_id(ab[0]), &pv) == 0);
    bh_block_unref(pv);
    send_and_pass(b, rb, ra, a, "return_arena", BH_KIND_PROGRESS, 0, NULL, NULL, 0);
  }
  /* A described array (an ARRAY: a record's bytes) in an arena block,
   * beside a plain tensor in the next: its ref is claimed like any. */
  bh_buf_init(&v);
  bh_enc_list(&v, 2);
  bh_tensor_ref rec = {.lib = BH_TENSOR_NUMPY, .dtype = BH_DT_UINT8, .ndim = 2, .block = bh_block_id(ab[0]),
                       .offset = ao[0], .nbytes = 100, .shape = {4, 25}, .strides = {25, 1}};
  CHECK(bh_enc_array(&v, "\"|V25\"", 7, &rec) == 0);
  int64_t shape1[1] = {100}, strides1[1] = {1};
  tensor(&v, BH_TENSOR_NUMPY, BH_DT_UINT8, 1, shape1, strides1, bh_block_id(ab[1]), ao[1]);
  send_and_pass(a, ra, rb, b, "arena_array", BH_KIND_RESULT, 20, &v, ab, 2);
  bh_buf_free(&v);
  bh_block *pv;
  CHECK(bh_channel_peer_block(b, bh_block_id(ab[0]), &pv) == 0);
  bh_block_unref(pv);
  send_and_pass(b, rb, ra, a, "return_arena", BH_KIND_PROGRESS, 0, NULL, NULL, 0);
  for (int i = 0; i < 4; i++) bh_block_unref(ab[i]);

  /* Back refs (protocol 6): b names a block of a's own, as a value a lent
   * it and b sends back.  fuzz_frame's pool has one own block, id 1 of
   * 4096 bytes, lent before each input (and returned by an input's return
   * note): each ref twice (back refs may overlap), then what a receiver
   * refuses: a block it does not have, misaligned, past the block. */
  static const struct {
    const char *name;
    uint32_t id;
    uint64_t off, len;
  } back[] = {
      {"back_ref", 1, 0, 4096},           {"back_ref_part", 1, 64, 100},
      {"back_ref_unknown", 2, 0, 64},     {"back_ref_misaligned", 1, 32, 64},
      {"back_ref_past_block", 1, 4032, 128},
  };
  for (size_t k = 0; k < sizeof back / sizeof back[0]; k++) {
    int64_t shape[1] = {(int64_t)back[k].len}, strides[1] = {1};
    bh_buf_init(&v);
    bh_enc_list(&v, 2);
    for (int i = 0; i < 2; i++)
      tensor(&v, BH_TENSOR_NUMPY, BH_DT_UINT8, 1, shape, strides, back[k].id | BH_BLOCK_BACK,
             back[k].off);
    send_and_pass(b, rb, ra, a, back[k].name, BH_KIND_CALL, 20 + k, &v, NULL, 0);
    bh_buf_free(&v);
  }

  /* A return of a block b forwarded to a third process (protocol 10: the
   * note's id carries BH__RETURN_SPENT): a retires the block at its last
   * reference instead of reusing it, and b gets the retire note. */
  bh_block *b4;
  CHECK(bh_channel_block_acquire(a, 4096, &b4) == 0);
  v = tensor_in(b4, 4096);
  send_and_pass(a, ra, rb, b, "intro_forwarded", BH_KIND_RESULT, 30, &v, &b4, 1);
  bh_buf_free(&v);
  CHECK(bh_channel_peer_block(b, bh_block_id(b4), &peer) == 0);
  peer->spent = 1; /* what a forward of it marks (bh__pool_forward) */
  bh_block_unref(peer);
  send_and_pass(b, rb, ra, a, "return_spent_note", BH_KIND_PROGRESS, 0, NULL, NULL, 0);
  bh_block_unref(b4);
  send_and_pass(a, ra, rb, b, "retire_spent", BH_KIND_RELEASE, 31, NULL, NULL, 0);

  /* A payload over BH_FRAME_INLINE_MAX spills: the message is the header. */
  bh_buf_init(&v);
  char *big = calloc(1, 70000);
  CHECK(big != NULL);
  bh_enc_bytes(&v, big, 70000);
  free(big);
  send_and_pass(a, ra, rb, b, "spilled", BH_KIND_RESULT, 7, &v, NULL, 0);
  bh_buf_free(&v);

  for (int i = 0; i < 70; i++) bh_block_unref(many[i]);
  bh_block_unref(b3);
  bh_channel_close(a);
  bh_channel_close(b);
  close(ra);
  close(rb);
}

/* ----------------------------------------------------------------- ledger */

#define LEDGER_BYTES 2248704u
#define SLOT_BYTES 4384u

/* Joins as this process, fills the record, then hands it to a made-up
 * pid that the fuzz build's rule counts alive (or, if dead, not). */
static void add_record(bh_ledger *l, int role, const char *pack, pid_t as, int alive,
                       int n_devices, int n_models) {
  int slot = bh_ledger_join(l, role, pack, "3.12.1", 2, role == BH_ROLE_WORKER ? 4100 : 0);
  CHECK(slot >= 0);
  static const char *const devs[] = {"cpu", "cuda:GPU-8f3a0c1e-0000-4000-8000-000000000001",
                                     "cuda:GPU-8f3a0c1e-0000-4000-8000-000000000002", "mps"};
  for (int i = 0; i < n_devices; i++) {
    bh_ledger_device d = {.held_bytes = (uint64_t)(i + 1) << 30, .pinned_bytes = 1 << 20,
                          .pin_ceiling_bytes = 8u << 20, .pager_bytes = 4096,
                          .floor_bytes = 1 << 25, .reserve_bytes = 1 << 24};
    snprintf(d.device, sizeof d.device, "%s", devs[i % 4]);
    CHECK(bh_ledger_set_device(l, &d) == 0);
  }
  for (int i = 0; i < n_models; i++) {
    bh_ledger_model m = {.id = 1000u + (uint64_t)i, .size_bytes = (uint64_t)(i + 1) << 28,
                         .resident_bytes = (uint64_t)i << 27};
    snprintf(m.name, sizeof m.name, "model-%d", i);
    if (n_devices) snprintf(m.device, sizeof m.device, "%s", devs[i % n_devices]);
    CHECK(bh_ledger_set_model(l, &m) == 0);
  }
  CHECK(bh_ledger_set_run(l, BH_RUN_BUSY) == 0);
  CHECK(bh_ledger_note_release(l, 123456) == 0);
  CHECK(bh__ledger_forge(l, slot, as, alive ? BH__FUZZ_START_TIME(as) : 1) == 0);
}

/* A ledger seed is the image without its trailing zeros: fuzz_ledger
 * reads a short input as the start of a full-size file. */
static void ledger_seed(const char *name, const uint8_t *img, size_t n) {
  while (n > 0 && img[n - 1] == 0) n--;
  write_seed("ledger", name, img, n);
}

static uint8_t *fresh_image(bh_ledger **l) {
  uint8_t *img = calloc(1, LEDGER_BYTES);
  CHECK(img != NULL);
  CHECK(bh__ledger_open_mem(l, img, LEDGER_BYTES) == 0); /* all zero: initialised */
  return img;
}

static void ledger_seeds(void) {
  bh_ledger *l;
  uint8_t *img = fresh_image(&l);
  ledger_seed("empty", img, LEDGER_BYTES);
  add_record(l, BH_ROLE_HOST, "", 4100, 1, 2, 3);
  add_record(l, BH_ROLE_WORKER, "old_numpy_pack", 4101, 1, 1, 2);
  add_record(l, BH_ROLE_WORKER, "new_numpy_pack", 4102, 1, 4, BH_LEDGER_MODELS);
  ledger_seed("host_and_two_workers", img, LEDGER_BYTES);
  add_record(l, BH_ROLE_TOOL, "", 4103, 0, 0, 0);
  ledger_seed("with_dead_record", img, LEDGER_BYTES);
  /* The first worker left mid-write: its seq is odd. */
  uint8_t *seq = img + 4096 + 1 * SLOT_BYTES;
  seq[0] |= 1;
  ledger_seed("mid_write", img, LEDGER_BYTES);
  bh_ledger_close(l);
  free(img);

  img = fresh_image(&l);
  for (int i = 0; i < BH_LEDGER_SLOTS; i++)
    add_record(l, BH_ROLE_WORKER, "p", 5000 + i, i % 5 != 4, 1, 1);
  ledger_seed("full", img, LEDGER_BYTES);
  bh_ledger_close(l);
  free(img);

  img = fresh_image(&l);
  bh_ledger_close(l);
  img[8] = BH_LEDGER_VERSION + 1; /* version */
  ledger_seed("other_version", img, LEDGER_BYTES);
  img[8] = BH_LEDGER_VERSION;
  memset(img, 0, LEDGER_BYTES);
  ledger_seed("all_zero", img, LEDGER_BYTES);
  free(img);
}

/* -------------------------------------------------------------------- ram */

#define MEMINFO                                                                 \
  "MemTotal:       16777216 kB\nMemFree:         1048576 kB\n"                   \
  "MemAvailable:    8388608 kB\nBuffers:            1024 kB\n"                   \
  "Cached:          2097152 kB\n"
#define SWAPS "Filename\tType\t\tSize\tUsed\tPriority\n/swapfile file\t\t2097148\t0\t-2\n"
#define MOUNT_V2 "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
#define MOUNT_V1 "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"

static void ram_seed(const char *name, int n, ...) {
  char buf[4096];
  size_t len = 0;
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) {
    const char *piece = va_arg(ap, const char *);
    size_t k = strlen(piece);
    CHECK(len + k + 1 <= sizeof buf);
    memcpy(buf + len, piece, k);
    len += k;
    if (i + 1 < n) buf[len++] = 0;
  }
  va_end(ap);
  write_seed("ram", name, buf, len);
}

static void ram_seeds(void) {
  ram_seed("meminfo_only", 1, MEMINFO);
  ram_seed("v2_leaf_limit", 10, MEMINFO, SWAPS, "0::/w\n", MOUNT_V2, "1073741824\n",
           "805306368\n", "anon 1\ninactive_file 104857600\nactive_file 5\n", "max\n",
           "2147483648\n", "inactive_file 0\n");
  ram_seed("v2_root_limit_tighter", 10, MEMINFO, "", "0::/w\n", MOUNT_V2, "max\n", "1\n",
           "inactive_file 1\n", "536870912\n", "600000000\n", "inactive_file 200000000\n");
  ram_seed("v1", 10, MEMINFO, SWAPS, "4:memory:/w\n1:name=systemd:/w\n", MOUNT_V1,
           "9223372036854771712\n", "1024\n", "total_inactive_file 512\n", "4294967296\n",
           "2147483648\n", "total_inactive_file 1073741824\ninactive_file 1\n");
  ram_seed("hybrid", 4, MEMINFO, SWAPS, "12:pids:/w\n4:memory:/w\n0::/w\n",
           MOUNT_V2 MOUNT_V1);
  ram_seed("no_mountinfo_escape", 3, MEMINFO "SwapTotal: 0 kB\n", SWAPS, "0::/../../w\n");
  ram_seed("pcp_lists", 11, MEMINFO, SWAPS, "0::/w\n", MOUNT_V2, "max\n", "1\n", "", "", "", "",
           "Node 0, zone   Normal\n  pagesets\n    cpu: 0\n              count: 195696\n"
           "              high:  196014\n              batch: 63\n    cpu: 1\n"
           "              count: 9147\n");
}

/* ----------------------------------------------------------------- answer */

static void answer_seed(const char *name, bh_buf *b) {
  CHECK(b->err == 0);
  write_seed("answer", name, b->data, b->len);
  bh_buf_free(b);
}

static void kv_int(bh_buf *b, const char *k, int64_t v) {
  bh_enc_str(b, k, strlen(k));
  bh_enc_int(b, v);
}

static void kv_str(bh_buf *b, const char *k, const char *v, size_t n) {
  bh_enc_str(b, k, strlen(k));
  bh_enc_str(b, v, n);
}

static void answer_seeds(void) {
  bh_buf b;
  bh_buf_init(&b);
  bh_enc_map(&b, 5);
  kv_int(&b, "worker_pid", 4242);
  kv_str(&b, "pack", "packa", 5);
  kv_int(&b, "before_bytes", 1 << 30);
  kv_int(&b, "after_bytes", 1 << 20);
  kv_int(&b, "freed_bytes", (1 << 30) - (1 << 20));
  answer_seed("receipt", &b);
  bh_buf_init(&b);
  bh_enc_map(&b, 3);
  kv_str(&b, "type", "LookupError", 11);
  kv_str(&b, "message", "no worker with pid 7 in this host", 33);
  kv_str(&b, "traceback", "Traceback (most recent call last):\n", 35);
  answer_seed("error", &b);
  bh_buf_init(&b); /* the right keys with the wrong types, and a nested value */
  bh_enc_map(&b, 4);
  kv_str(&b, "worker_pid", "12", 2);
  bh_enc_str(&b, "pack", 4), bh_enc_int(&b, 7);
  bh_enc_str(&b, "extra", 5), bh_enc_list(&b, 2), bh_enc_map(&b, 1), kv_int(&b, "x", 1), bh_enc_nil(&b);
  bh_enc_int(&b, 5), bh_enc_str(&b, "int key", 7);
  answer_seed("wrong_types", &b);
  static char long_msg[3000];
  memset(long_msg, 'm', sizeof long_msg);
  bh_buf_init(&b);
  bh_enc_map(&b, 1);
  kv_str(&b, "message", long_msg, sizeof long_msg);
  answer_seed("message_too_long", &b);
  bh_buf_init(&b), bh_enc_list(&b, 0), answer_seed("not_a_map", &b);
  bh_buf_init(&b), bh_enc_map(&b, 0), answer_seed("empty_map", &b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: seeds OUTDIR\n");
    return 2;
  }
  outdir = argv[1];
  CHECK(mkdir(outdir, 0755) == 0 || errno == EEXIST);
  codec_seeds();
  frame_seeds();
  ledger_seeds();
  ram_seeds();
  answer_seeds();
  return 0;
}
