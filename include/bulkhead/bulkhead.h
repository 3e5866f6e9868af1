/*
 * bulkhead.h -- public interface of bulkhead's C core.
 *
 * bulkhead runs ComfyUI node packs in worker processes, each under its own
 * interpreter and environment.  This header is the core those processes
 * share: the typed value codec, the framed channel between a host and one
 * worker (a SOCK_SEQPACKET socketpair with memfd blocks passed by
 * SCM_RIGHTS), the pool of shared-memory blocks that tensors travel in, and
 * the supervisor that spawns, watches and stops a worker.
 *
 * Conventions (see STYLE.md):
 *  - functions return int: >= 0 on success, a negative errno or a negative
 *    BH_E* code on failure; bh_strerror() names either.  No global state.
 *  - ownership of returned memory and fds is stated on every prototype.
 *  - every fd bulkhead creates is close-on-exec.
 */
#ifndef BULKHEAD_BULKHEAD_H
#define BULKHEAD_BULKHEAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define BH_EXTERN __attribute__((visibility("default")))
#else
#define BH_EXTERN
#endif

/* ------------------------------------------------------------------ errors */

/* Error codes beyond errno.  X(name, value, message).  Values are returned
 * negated, like errno values: a function fails with -BH_EMAGIC. */
#define BH_ERRNO_MAP(X)                                                        \
  X(BH_EMAGIC, 10001, "frame has a bad magic number")                          \
  X(BH_EVERSION, 10002, "frame has an unsupported protocol version")           \
  X(BH_EKIND, 10003, "frame has an unknown kind")                              \
  X(BH_ESHORT, 10004, "frame is shorter than its header says")                 \
  X(BH_E2BIG, 10005, "frame is larger than the channel's limit")               \
  X(BH_EFDCOUNT, 10006, "frame carries a different number of fds than its header says") \
  X(BH_ECTRUNC, 10007, "frame's control data was truncated (fds dropped)")     \
  X(BH_EPEERCRED, 10008, "frame came from a peer with the wrong credentials")  \
  X(BH_EEOF, 10009, "peer closed the channel")                                 \
  X(BH_EHEADER, 10010, "frame header has nonzero reserved bits")               \
  X(BH_EBADTAG, 10020, "value has an unknown type tag")                        \
  X(BH_EOVERRUN, 10021, "value runs past the end of its frame")                \
  X(BH_EDEPTH, 10022, "value nests deeper than the limit")                     \
  X(BH_EUTF8, 10023, "string is not valid UTF-8")                              \
  X(BH_ETRAILING, 10024, "frame has bytes after its value")                    \
  X(BH_ECOUNT, 10025, "container claims more items than its frame can hold")   \
  X(BH_ETENSOR, 10026, "tensor reference is malformed")                        \
  X(BH_EDTYPE, 10027, "tensor reference has an unknown dtype")                 \
  X(BH_EBLOCK, 10028, "reference to an unknown shared-memory block")           \
  X(BH_ESEALS, 10029, "shared-memory block is not a sealed memfd of the declared size") \
  X(BH_EBLOCKSEC, 10030, "frame's block section is malformed")                 \
  X(BH_ETOOMANY, 10031, "value has more items than one frame may carry (BH_MAX_ITEMS)") \
  X(BH_EPEERMEM, 10032, "peer lends more shared memory than one channel maps (too many blocks or bytes)") \
  X(BH_EPOOLFULL, 10033, "too many shared-memory blocks in use at once, in one channel or in this process (send fewer, larger arrays; raise the soft RLIMIT_NOFILE)") \
  X(BH_EBODY, 10034, "value's body is malformed (a range with step 0, an array whose bytes do not fit its description)") \
  X(BH_ELEDGER, 10040, "segment is not a bulkhead ledger (bad magic or size)") \
  X(BH_ELEDGERVER, 10041, "ledger has another layout version (every bulkhead on this machine must match)") \
  X(BH_ELEDGERFULL, 10042, "ledger has no free record slot") \
  X(BH_ENOTJOINED, 10043, "this process has no record in the ledger (join first)") \
  X(BH_EMODELS, 10044, "ledger record has no room for another model or device") \
  X(BH_ENODRIVER, 10050, "GPU driver library is not available") \
  X(BH_ENVML, 10051, "NVML call failed") \
  X(BH_ENODEVICE, 10052, "no GPU with that UUID or index") \
  X(BH_ECGROUP, 10053, "cgroup or /proc memory file is malformed")

enum {
#define BH__ERR_ENUM(name, value, msg) name = value,
  BH_ERRNO_MAP(BH__ERR_ENUM)
#undef BH__ERR_ENUM
};

/* Names an error code, negative or positive, BH_E* or errno.  The returned
 * string is static. */
BH_EXTERN const char *bh_strerror(int err);
/* The symbolic name ("BH_EMAGIC", "ETIMEDOUT") of an error code, or NULL. */
BH_EXTERN const char *bh_errname(int err);

/* ------------------------------------------------------------------ dtypes */

/* Element types a tensor-ref can carry.  Codes are wire values: never
 * renumber. */
#define BH_DTYPE_MAP(X)                                                        \
  X(BH_DT_BOOL, 1, 1, "bool")                                                  \
  X(BH_DT_INT8, 2, 1, "int8")                                                  \
  X(BH_DT_UINT8, 3, 1, "uint8")                                                \
  X(BH_DT_INT16, 4, 2, "int16")                                                \
  X(BH_DT_UINT16, 5, 2, "uint16")                                              \
  X(BH_DT_INT32, 6, 4, "int32")                                                \
  X(BH_DT_UINT32, 7, 4, "uint32")                                              \
  X(BH_DT_INT64, 8, 8, "int64")                                                \
  X(BH_DT_UINT64, 9, 8, "uint64")                                              \
  X(BH_DT_FLOAT16, 10, 2, "float16")                                           \
  X(BH_DT_BFLOAT16, 11, 2, "bfloat16")                                         \
  X(BH_DT_FLOAT32, 12, 4, "float32")                                           \
  X(BH_DT_FLOAT64, 13, 8, "float64")                                           \
  X(BH_DT_COMPLEX32, 14, 4, "complex32")                                       \
  X(BH_DT_COMPLEX64, 15, 8, "complex64")                                       \
  X(BH_DT_COMPLEX128, 16, 16, "complex128")                                    \
  X(BH_DT_FLOAT8_E4M3FN, 17, 1, "float8_e4m3fn")                               \
  X(BH_DT_FLOAT8_E5M2, 18, 1, "float8_e5m2")                                   \
  X(BH_DT_FLOAT8_E4M3FNUZ, 19, 1, "float8_e4m3fnuz")                           \
  X(BH_DT_FLOAT8_E5M2FNUZ, 20, 1, "float8_e5m2fnuz")                           \
  X(BH_DT_LONGDOUBLE, 21, 16, "longdouble")                                    \
  X(BH_DT_CLONGDOUBLE, 22, 32, "clongdouble")

enum {
#define BH__DT_ENUM(name, code, size, str) name = code,
  BH_DTYPE_MAP(BH__DT_ENUM)
#undef BH__DT_ENUM
};

/* Bytes per element of a dtype code, or 0 for an unknown code. */
BH_EXTERN unsigned bh_dtype_itemsize(unsigned dtype);
/* Name of a dtype code ("bfloat16"), or NULL for an unknown code. */
BH_EXTERN const char *bh_dtype_name(unsigned dtype);

/* ------------------------------------------------------------------- codec */

/* Value tags on the wire.  Every value starts with one tag byte; integers
 * are little-endian. */
enum bh_tag {
  BH_TAG_NIL = 0x00,
  BH_TAG_FALSE = 0x01,
  BH_TAG_TRUE = 0x02,
  BH_TAG_INT = 0x03,     /* int64 */
  BH_TAG_FLOAT = 0x04,   /* IEEE-754 float64 */
  BH_TAG_STR = 0x05,     /* u32 length, UTF-8 bytes */
  BH_TAG_BYTES = 0x06,   /* u32 length, bytes */
  BH_TAG_LIST = 0x07,    /* u32 count, values */
  BH_TAG_MAP = 0x08,     /* u32 count, key/value pairs */
  BH_TAG_TENSOR = 0x09,  /* struct bh_tensor_ref, see bh_enc_tensor */
  BH_TAG_HANDLE = 0x0a,  /* u8 space, u64 id, u16 type-name length, UTF-8 type name */
  BH_TAG_TUPLE = 0x0b,   /* u32 count, values; a list the host reads as a tuple */
  BH_TAG_SET = 0x0c,       /* u32 count, values (protocol 8) */
  BH_TAG_FROZENSET = 0x0d, /* u32 count, values (protocol 8) */
  BH_TAG_COMPLEX = 0x0e,   /* f64 real, f64 imaginary (protocol 8) */
  BH_TAG_RANGE = 0x0f,     /* i64 start, i64 stop, i64 step (not 0) (protocol 8) */
  /* u16 description length, description (UTF-8, 1..BH_ARRAY_DESC_MAX
   * bytes), then a whole TENSOR value: an array of a dtype no BH_DT_* code
   * names (records, datetime64, byte-swapped, ...) as the uint8 tensor of
   * its bytes, see bh_enc_array (protocol 8) */
  BH_TAG_ARRAY = 0x10,
};

#define BH_MAX_DIMS 16
/* The longest dtype description an ARRAY value carries (its u16 length). */
#define BH_ARRAY_DESC_MAX 65535u
#define BH_MAX_DEPTH 64
/* Items (scalars and containers alike) in one value: what bounds the
 * objects a decoder builds from one frame (a list of empty lists costs 5
 * bytes each on the wire and some 60 as Python objects), whatever the
 * frame's size.  Past it: -BH_ETOOMANY. */
#define BH_MAX_ITEMS (1u << 20)
#define BH_BLOCK_NONE UINT32_MAX /* tensor-ref of an empty tensor */
/* tensor-ref whose nbytes bytes follow it in the value itself (a small
 * tensor: no block, no fd); nbytes is 1..BH_TENSOR_INLINE_MAX, offset 0 */
#define BH_BLOCK_INLINE (UINT32_MAX - 1)
/* A tensor-ref block id with this bit set (and not NONE or INLINE) names a
 * block of the RECEIVER's pool, id & ~BH_BLOCK_BACK: one the receiver lent
 * the sender and the sender still holds, sent back by reference, no copy
 * (protocol 6).  Own block ids stay below it. */
#define BH_BLOCK_BACK 0x80000000u
#define BH_TENSOR_INLINE_MAX (64u << 10)

/* Which library a tensor came from, so the receiver rebuilds the same kind
 * (a numpy scalar travels as a 0-d array and comes back a scalar). */
enum { BH_TENSOR_NUMPY = 0, BH_TENSOR_TORCH = 1, BH_TENSOR_NUMPY_SCALAR = 2 };
/* A torch tensor's flags, in the high bits of the same byte (protocol 9):
 * the receiver rebuilds a tensor the next node would have got in one
 * process.  REQUIRES_GRAD: it requires grad (a floating-point or complex
 * dtype only; the receiver's is a leaf: the graph stays behind).
 * INFERENCE: an inference tensor (made under torch.inference_mode()); the
 * receiver makes its tensor under inference mode, or out of it where
 * this flag is not set, whatever mode its own thread is in.  PARAMETER:
 * a torch.nn.Parameter (the receiver's is one too).  Never on a numpy
 * tensor. */
#define BH_TENSOR_LIB_MASK 0x0fu
#define BH_TENSOR_REQUIRES_GRAD 0x10u
#define BH_TENSOR_INFERENCE 0x20u
#define BH_TENSOR_PARAMETER 0x40u

/* A tensor living in a shared-memory block of the sender's pool, or (block
 * BH_BLOCK_INLINE) inline in the value.  Strides are in elements and
 * non-negative; shape * strides stays within nbytes. */
typedef struct bh_tensor_ref {
  uint8_t lib;    /* BH_TENSOR_*, a torch tensor's | its flags (BH_TENSOR_REQUIRES_GRAD, ...) */
  uint8_t dtype;  /* BH_DT_* */
  uint8_t ndim;   /* <= BH_MAX_DIMS */
  uint32_t block; /* sender's block id (or BH_BLOCK_BACK | receiver's), BH_BLOCK_NONE when nbytes == 0 */
  uint64_t offset;
  uint64_t nbytes;
  int64_t shape[BH_MAX_DIMS];
  int64_t strides[BH_MAX_DIMS];
  /* BH_BLOCK_INLINE: the nbytes bytes.  Borrowed: the encoder's caller
   * owns them (bh_enc_tensor copies them); a decoded ref points into the
   * reader's buffer.  Unused otherwise. */
  const uint8_t *data;
} bh_tensor_ref;

/* A reference to an object that stays in the process that owns it. */
typedef struct bh_handle_ref {
  uint8_t space; /* which table of the owner, e.g. BH_HANDLE_CALLABLE */
  uint64_t id;
  /* The qualified type name of the object, as its owner knows it (UTF-8,
   * at most BH_TYPE_NAME_MAX bytes; type_len 0: not said).  Borrowed: the
   * encoder's caller owns it; a decoded one points into the reader's
   * buffer. */
  const char *type;
  uint16_t type_len;
} bh_handle_ref;

#define BH_TYPE_NAME_MAX 1024

enum { BH_HANDLE_CALLABLE = 1, BH_HANDLE_OBJECT = 2 };

/* A growable output buffer.  Encoders append to it; the first failure
 * (allocation) is sticky in `err` so a caller checks once at the end. */
typedef struct bh_buf {
  uint8_t *data; /* owned; free with bh_buf_free */
  size_t len;
  size_t cap;
  int err;
} bh_buf;

BH_EXTERN void bh_buf_init(bh_buf *b);
BH_EXTERN void bh_buf_free(bh_buf *b);
/* Ensures room for `extra` more bytes.  Returns 0 or -ENOMEM (also stored
 * in b->err). */
BH_EXTERN int bh_buf_reserve(bh_buf *b, size_t extra);

/* Encoders: append one value (or a container header followed by the
 * caller's count of values).  Return 0 or the sticky error. */
BH_EXTERN int bh_enc_nil(bh_buf *b);
BH_EXTERN int bh_enc_bool(bh_buf *b, int v);
BH_EXTERN int bh_enc_int(bh_buf *b, int64_t v);
BH_EXTERN int bh_enc_float(bh_buf *b, double v);
BH_EXTERN int bh_enc_str(bh_buf *b, const char *s, size_t n);
BH_EXTERN int bh_enc_bytes(bh_buf *b, const void *p, size_t n);
BH_EXTERN int bh_enc_list(bh_buf *b, uint32_t count);
BH_EXTERN int bh_enc_tuple(bh_buf *b, uint32_t count);
BH_EXTERN int bh_enc_map(bh_buf *b, uint32_t count);
BH_EXTERN int bh_enc_set(bh_buf *b, uint32_t count);
BH_EXTERN int bh_enc_frozenset(bh_buf *b, uint32_t count);
BH_EXTERN int bh_enc_complex(bh_buf *b, double real, double imag);
/* Fails with -EINVAL for step 0 (no range has it). */
BH_EXTERN int bh_enc_range(bh_buf *b, int64_t start, int64_t stop, int64_t step);
/* An array of a dtype no BH_DT_* code names: `desc` (desc_len bytes,
 * 1..BH_ARRAY_DESC_MAX, UTF-8; the receiver's glue reads it, the core only
 * carries it) describes the dtype, and `t` is its bytes as a uint8 tensor
 * whose last dimension is the itemsize with stride 1 (shape (..., itemsize);
 * lib BH_TENSOR_NUMPY, or BH_TENSOR_NUMPY_SCALAR with shape (itemsize)).
 * Fails with -EINVAL where the description or the tensor is not that.
 * Both are copied. */
BH_EXTERN int bh_enc_array(bh_buf *b, const char *desc, size_t desc_len, const bh_tensor_ref *t);
/* Fails with -EINVAL for a ref bh_tensor_ref_check() rejects, or an inline
 * one without data. */
BH_EXTERN int bh_enc_tensor(bh_buf *b, const bh_tensor_ref *t);
/* Fails with -EINVAL for a type name over BH_TYPE_NAME_MAX bytes. */
BH_EXTERN int bh_enc_handle(bh_buf *b, const bh_handle_ref *h);

/* Validates a tensor ref on its own: known dtype, ndim, non-negative
 * shape and strides, nbytes == itemsize * product(shape), the strided
 * extent within nbytes, block NONE exactly when nbytes is 0, an INLINE one
 * at offset 0 with at most BH_TENSOR_INLINE_MAX bytes.  Returns 0 or
 * -BH_ETENSOR / -BH_EDTYPE. */
BH_EXTERN int bh_tensor_ref_check(const bh_tensor_ref *t);

/* One decoded item.  Strings, bytes and descriptions point into the
 * reader's buffer. */
typedef struct bh_item {
  uint8_t tag; /* enum bh_tag */
  union {
    int64_t i;
    double f;
    struct {
      const uint8_t *p;
      uint32_t n;
    } s;            /* STR, BYTES */
    uint32_t count; /* LIST, TUPLE, SET, FROZENSET, MAP (pairs) */
    struct {
      double real, imag;
    } c; /* COMPLEX */
    struct {
      int64_t start, stop, step;
    } r; /* RANGE */
    bh_tensor_ref t; /* TENSOR, and ARRAY's bytes */
    bh_handle_ref h;
  } u;
  /* ARRAY: its dtype description (UTF-8, desc_len bytes); NULL otherwise. */
  const char *desc;
  uint16_t desc_len;
} bh_item;

/* A bounds-checked reader over a borrowed buffer. */
typedef struct bh_reader {
  const uint8_t *p;
  size_t len;
  size_t pos;
} bh_reader;

BH_EXTERN void bh_reader_init(bh_reader *r, const void *p, size_t len);
/* Reads the next item.  Containers yield their header; the caller reads
 * their items next.  Total: any byte string yields an item or a negative
 * BH_E* code (EOVERRUN, EBADTAG, EUTF8, ECOUNT, ETENSOR, EDTYPE, EBODY), never an
 * over-read.  A container's count is checked against the bytes left (each
 * item takes at least one byte). */
BH_EXTERN int bh_dec_next(bh_reader *r, bh_item *it);
/* The values that follow a container's header item as its contents: count
 * for LIST, TUPLE, SET and FROZENSET, 2 x count for MAP, 0 for any other
 * item.  What every walk over a value steps by. */
BH_EXTERN uint64_t bh_item_children(const bh_item *it);
/* Walks one whole value from the reader's position, nesting at most
 * max_depth and holding at most BH_MAX_ITEMS items, and then requires the
 * buffer to end.  Returns 0 or a negative BH_E* code naming the first
 * problem. */
BH_EXTERN int bh_dec_validate(const void *p, size_t len, unsigned max_depth);

/* ------------------------------------------------------------------ frames */

/* 5: the block section lists the blocks a frame lends (see channel.c), and
 * tensor refs into them are checked against it (bh_channel_frame_block).
 * 6: a tensor ref may name a block of the receiver's own that it lent the
 * sender (BH_BLOCK_BACK): a value crosses back by reference.
 * 7: an introduced block may be sealed against writes (a third process's
 * that the sender forwards, or one it keeps to send again): the receiver
 * maps it copy-on-write, drops what it wrote there at each return, and
 * sends it back by reference only where it wrote nothing
 * (bh_channel_peer_find).
 * 8: values of five more tags: SET, FROZENSET, COMPLEX, RANGE, and ARRAY
 * (a numpy array of a dtype no BH_DT_* code names, by its description);
 * error BH_EBODY.
 * 9: a TENSOR's lib byte carries a torch tensor's flags in its high bits
 * (BH_TENSOR_REQUIRES_GRAD, BH_TENSOR_INFERENCE, BH_TENSOR_PARAMETER).
 * 10: a return note's id may carry the top bit (BH__RETURN_SPENT): the
 * block was forwarded, a third process holds its memfd, and its owner
 * destroys it at its last reference (a retire note) instead of reusing it
 * for bytes that process was never sent. */
#define BH_PROTOCOL_VERSION 10
#define BH_FRAME_MAGIC 0x4b484c42u /* "BLHK" little-endian */
#define BH_FRAME_INLINE_MAX (60u * 1024u) /* larger payloads spill to a memfd */
#define BH_FRAME_FDS_MAX 64u
#define BH_FRAME_PAYLOAD_MAX (1u << 30) /* 1 GiB, spilled or not */

enum bh_kind {
  BH_KIND_HELLO = 1,     /* worker -> host first, host -> worker ack */
  BH_KIND_CALL = 2,      /* host -> worker: run a function */
  BH_KIND_RESULT = 3,    /* reply to CALL/CALLBACK with a value */
  BH_KIND_ERROR = 4,     /* reply to CALL/CALLBACK with an exception */
  BH_KIND_PROGRESS = 5,  /* worker -> host, no reply */
  BH_KIND_CALLBACK = 6,  /* worker -> host: run a host callable, re-entrant */
  BH_KIND_INTERRUPT = 7, /* host -> worker, no reply */
  BH_KIND_RELEASE = 8,   /* host -> worker: free memory; replied with RESULT */
  BH_KIND_RESIDENCY = 9, /* worker -> host, no reply */
  BH_KIND_BYE = 10,      /* either side: orderly shutdown */
  BH_KIND_BLOCKS = 11,   /* block bookkeeping only (intros/returns/retires) */
  BH_KIND_MAX_ = 11
};

/* The fixed header in front of every frame (32 bytes, little-endian). */
typedef struct bh_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t request_id;
  uint32_t flags;         /* BH_FRAME_* */
  uint32_t payload_bytes; /* bytes after the header (or in the spill fd) */
  uint32_t fd_count;      /* fds in this message's SCM_RIGHTS */
  uint32_t cpu;           /* the CPU the sender ran on + 1 (0: unknown), at
                           * most BH_FRAME_CPU_MAX: a hint for how the
                           * receiver waits for the sender's next frame */
} bh_frame_header;

#define BH_FRAME_CPU_MAX 65536u

enum {
  BH_FRAME_SPILLED = 1u << 0, /* payload lives in the last fd (a sealed memfd) */
  BH_FRAME_FLAGS_KNOWN_ = BH_FRAME_SPILLED
};

/* Checks magic, version, kind, flags and the cpu hint's range.  Returns 0 or a
 * negative BH_E* code. */
BH_EXTERN int bh_frame_header_check(const bh_frame_header *h);
/* Name of a frame kind, or NULL. */
BH_EXTERN const char *bh_kind_name(unsigned kind);

/* ------------------------------------------------------------------ blocks */

/* A shared-memory block: a sealed memfd mapped in this process.  A block is
 * either our own (from our pool, possibly lent to the peer) or the peer's
 * (mapped here, returned to the peer when our last reference goes).
 * References are counted; bh_block_unref is safe from any thread. */
typedef struct bh_block bh_block;
typedef struct bh_pool bh_pool;

BH_EXTERN void *bh_block_addr(const bh_block *b);
BH_EXTERN size_t bh_block_size(const bh_block *b);
BH_EXTERN uint32_t bh_block_id(const bh_block *b);
BH_EXTERN int bh_block_is_own(const bh_block *b);
/* A peer block mapped copy-on-write here: one the peer forwards (another
 * process's, sealed against writes); a write here stays here. */
BH_EXTERN int bh_block_is_private(const bh_block *b);
BH_EXTERN void bh_block_ref(bh_block *b);
/* Drops one reference.  The last one puts an own block back into its pool's
 * free list, or queues a peer block's return to the peer. */
BH_EXTERN void bh_block_unref(bh_block *b);

typedef struct bh_pool_stats {
  uint64_t own_blocks, own_bytes;   /* blocks we created and still map */
  uint64_t free_blocks, free_bytes; /* own blocks ready for reuse */
  uint64_t lent_blocks;             /* own blocks the peer holds */
  uint64_t peer_blocks, peer_bytes; /* peer blocks mapped here */
  uint64_t created, reused;         /* own blocks: fresh memfds vs reuses */
  /* forwards: another channel's peer blocks this channel lends its peer
   * (bh_channel_peer_find), not counted in own_* (their owner counts
   * them); and the peer blocks here whose memfd is kept for that */
  uint64_t forward_blocks, forward_bytes, forwarded; /* forwarded: ever made */
  uint64_t peer_fds;
  uint64_t sealed_blocks; /* own blocks sealed against writes (counted in own_*) */
  /* own blocks the peer forwarded to a third process, destroyed at their
   * last reference instead of reused (protocol 10), ever */
  uint64_t spent;
  /* a fresh block prepared for the next output of a spent block's size,
   * off the call path (at most one per pool; not in own_*) */
  uint64_t spare_bytes;
  uint64_t spare_takes; /* own blocks that were such a spare, ever (in created) */
} bh_pool_stats;

BH_EXTERN int bh_pool_stats_get(bh_pool *p, bh_pool_stats *out);
/* Destroys free own blocks, least recently used first, until at most
 * keep_bytes of them remain (0: every one); a block the peer had mapped is
 * retired (a note on the next frame tells it to unmap).  Blocks in use or
 * lent stay.  Returns the bytes freed. */
BH_EXTERN size_t bh_pool_trim(bh_pool *p, size_t keep_bytes);

/* Copies nbytes from src to dst (not overlapping) on up to `threads`
 * threads: this one and threads-1 helpers of the process's (started at the
 * first such copy and kept asleep between copies; at most 16 threads in
 * all), which claim 1 MiB chunks until none is left, so a helper that gets
 * no CPU leaves its chunks to this thread.  One copy uses the helpers at a
 * time: a copy that finds them busy is done on this thread alone, as is a
 * copy of one chunk or threads 1.  4 MiB and more are written with stores
 * that bypass the cache where the CPU has them (src/core/copy.c says why).
 * Every byte is in place, and no helper touches dst or src, when it
 * returns.  Returns the number of threads that copied (>= 1), or -EINVAL
 * for NULL pointers with nbytes > 0 or threads 0.  Nothing is owned; a
 * forked child starts helpers of its own. */
BH_EXTERN int bh_copy(void *dst, const void *src, size_t nbytes, unsigned threads);

/* ----------------------------------------------------------------- channel */

typedef struct bh_channel bh_channel;

typedef struct bh_channel_opts {
  uid_t peer_uid;           /* frames from another uid are rejected */
  pid_t peer_pid;           /* 0: any pid; else frames must come from it,
                             * and its death ends a wait (see bh_channel_recv) */
  size_t pool_keep_bytes;   /* free own blocks kept for reuse (0: default) */
  int64_t spin_ns;          /* before blocking in recv, poll this long
                             * yielding the CPU (0: default 100 us, <0:
                             * never; never when only one CPU is usable, and
                             * cut short when a yield ran another task).
                             * Waking a sleeper on another CPU costs far
                             * more here. */
  int forward;              /* keep the memfd of each peer block of at least
                             * 1 MiB (within a process-wide bound, a quarter
                             * of the soft RLIMIT_NOFILE), so that a view of
                             * it can go to ANOTHER channel's peer by
                             * reference (bh_channel_peer_find): a host of
                             * several workers sets it, a worker does not */
} bh_channel_opts;

/* Takes over `fd` (one end of a SOCK_SEQPACKET socketpair) and creates the
 * channel and its block pool.  The fd is consumed even on failure.
 * *out is owned by the caller: bh_channel_close. */
BH_EXTERN int bh_channel_open(bh_channel **out, int fd, const bh_channel_opts *o);
/* Closes the socket and drops the pool; blocks still referenced stay mapped
 * until their last bh_block_unref. */
BH_EXTERN void bh_channel_close(bh_channel *c);
BH_EXTERN int bh_channel_fd(const bh_channel *c);
BH_EXTERN bh_pool *bh_channel_pool(bh_channel *c);
/* Sets the pid frames must come from (after a spawn). */
BH_EXTERN void bh_channel_set_peer_pid(bh_channel *c, pid_t pid);

/* Takes a free own block of at least nbytes from the channel's pool, or
 * creates one (memfd, sealed against shrinking/growing, prefaulted).
 * Returns it with one reference owned by the caller. */
BH_EXTERN int bh_channel_block_acquire(bh_channel *c, size_t nbytes, bh_block **out);

/* bh_channel_block_acquire for a block to send more than once unchanged
 * (a tensor kept for its next crossings): a free one sealed before, or
 * one the peer has never mapped (a new one if need be, at a fresh block's
 * cost), sealed against writes (F_SEAL_FUTURE_WRITE; this process's mapping
 * stays writable: copy the bytes in, then send it).  The peer maps it
 * copy-on-write: a write there stays there and is dropped when the peer
 * returns it, so each loan reads these bytes (and the peer sends it back
 * by reference only where it wrote nothing).  Its last reference puts it
 * back in the pool, a sealed block, taken first by the next call (and by
 * bh_channel_block_acquire as any free block).  A block goes out once
 * until the peer returns it: check bh_block_is_lent before sending it
 * again.  Returns as
 * bh_channel_block_acquire, or -ENOTSUP where the kernel refuses the seal
 * (send a copy instead). */
BH_EXTERN int bh_channel_block_acquire_sealed(bh_channel *c, size_t nbytes, bh_block **out);
/* Whether an own block is lent to the peer now (it may not be lent
 * again until returned). */
BH_EXTERN int bh_block_is_lent(const bh_block *b);

/* Tensors of at most BH_ARENA_ITEM_MAX bytes that go into one message share
 * blocks (an arena) instead of taking one each: each is a (block, offset,
 * nbytes) ref, its offset a multiple of BH_ARENA_ALIGN, so a message of a
 * thousand small arrays lends some twenty blocks, not a thousand (the pool
 * bounds the blocks that hold an fd at once; see shm.c).  The arena's
 * blocks grow from BH_ARENA_BLOCK_MIN, doubling, to BH_ARENA_BLOCK_MAX.
 * Larger tensors keep a block each: a receiver that keeps one view of an
 * arena keeps the whole block from the sender's pool, so packing is kept
 * to tensors whose copy costs little next to a block's bookkeeping. */
#define BH_ARENA_ITEM_MAX (256u << 10)
#define BH_ARENA_ALIGN 64u
#define BH_ARENA_BLOCK_MIN (256u << 10)
#define BH_ARENA_BLOCK_MAX (4u << 20)

/* One message's arena: zero it before the first take; bh_arena_close
 * when the message was sent (or given up). */
typedef struct bh_arena {
  bh_block *block;   /* the block being filled (one reference), or NULL */
  size_t used;       /* bytes of it taken, a multiple of BH_ARENA_ALIGN */
  size_t next_bytes; /* size of the next block to acquire (0: the minimum) */
} bh_arena;

/* Takes nbytes (1..BH_ARENA_ITEM_MAX) at a BH_ARENA_ALIGN-aligned offset
 * of the arena's current block, acquiring a new block from pool p (the
 * sending channel's: bh_channel_pool) when it is full.  The arena takes the
 * pool, not the channel, so shm.c needs nothing of channel.c (the channel
 * builds on the pool, never the other way).  Returns 0 with *out (one
 * reference owned by the caller) and *offset; -EINVAL for a size out of
 * range; what bh_channel_block_acquire returns (-BH_EPOOLFULL) when no
 * block can be had.  List the block in the message's bh_msg.blocks for each tensor (a
 * block listed twice is lent once).  Ranges taken never overlap and their
 * offsets grow, in the order taken: encode tensors in the order their
 * ranges were taken (the receiver checks both, bh_channel_frame_block). */
BH_EXTERN int bh_arena_take(bh_pool *p, bh_arena *a, size_t nbytes, bh_block **out, uint64_t *offset);
/* Drops the arena's reference on its current block (the tensors' own
 * references keep it) and zeroes it: it may be used again after, for the
 * next message, as a new one. */
BH_EXTERN void bh_arena_close(bh_arena *a);

/* An outgoing message.  `blocks` lists own blocks whose ids appear in
 * tensor-refs of `value`; sending lends each to the peer (taking a
 * reference until the peer returns it), introduces the ones the peer has
 * not mapped yet and names every one in the frame's lend list (a receiver
 * refuses a ref to a block not in it).  A block listed twice is lent once;
 * a block still lent from an earlier frame fails the send with -EBUSY
 * (acquire a new one: a block goes out once until the peer returns it).
 * Refs into one block must not overlap and must come in the value in the
 * order of their offsets, each aligned to BH_ARENA_ALIGN. */
typedef struct bh_msg {
  uint16_t kind;
  uint64_t request_id;
  const uint8_t *value;
  size_t value_len;
  bh_block *const *blocks;
  uint32_t n_blocks;
} bh_msg;

/* Sends one frame.  Never blocks for long: a seqpacket send of at most
 * BH_FRAME_INLINE_MAX bytes.  Returns 0, -EPIPE / -BH_EEOF when the peer is
 * gone, -BH_E2BIG, or another negative errno. */
BH_EXTERN int bh_channel_send(bh_channel *c, const bh_msg *m);

/* A received frame.  value points into memory the channel owns until
 * bh_channel_frame_done (or the next recv). */
typedef struct bh_frame {
  bh_frame_header h;
  const uint8_t *value;
  size_t value_len;
  pid_t sender_pid;
} bh_frame;

/* Receives one frame, waiting until deadline_ns (CLOCK_MONOTONIC; <0 waits
 * forever).  Block bookkeeping in the frame (intros, returns, retires) is
 * applied before returning, and its lend list checked: each block mapped
 * here with the size it says (-BH_EBLOCK), kept for bh_channel_frame_block.
 * BLOCKS frames are consumed here and never returned.  Returns 0, -ETIMEDOUT, -EINTR (a signal arrived: check and
 * call again), -BH_EEOF (peer gone: its end closed, or, when opts.peer_pid
 * was given, that process exited and nothing it sent is left to read, even
 * though a process it forked may still hold its end), or a BH_E* code
 * naming what was wrong with the frame; after such an error the channel
 * stays usable. */
BH_EXTERN int bh_channel_recv(bh_channel *c, bh_frame *f, int64_t deadline_ns);
BH_EXTERN void bh_channel_frame_done(bh_channel *c, bh_frame *f);

/* Looks up a block the peer introduced and takes a reference (the caller
 * owns it: bh_block_unref).  -BH_EBLOCK if unknown. */
BH_EXTERN int bh_channel_peer_block(bh_channel *c, uint32_t id, bh_block **out);

/* Checks a tensor ref (block other than NONE and INLINE) of the frame last
 * received, before bh_channel_frame_done, against the blocks that frame
 * lends: its block must be one of them (-BH_EBLOCK), its offset a multiple
 * of BH_ARENA_ALIGN and the range within the block (-BH_ETENSOR), and it
 * must start at or after the end of the frame's previous ref into the same
 * block (-BH_ETENSOR: overlapping or out of order; so call it once per ref,
 * in the value's order).  On success takes a reference on the block (the
 * caller owns it: bh_block_unref); the views over it keep the mapping, and
 * when the last reference goes the block is returned to the peer.  A lent
 * block no reference was taken on is not returned (a value that names it
 * nowhere, a decode that failed before reaching it): it stays lent to
 * this side until the channel closes.
 *
 * A back ref (block BH_BLOCK_BACK | id) names instead a block of this
 * side's own pool: it must be one this side lent the peer and the peer
 * has not returned (-BH_EBLOCK otherwise: unknown, never lent, returned,
 * or the peer's), the offset a multiple of BH_ARENA_ALIGN and the range
 * within the block (-BH_ETENSOR); refs into it may overlap (the same
 * tensor twice).  The reference taken keeps the block from reuse after
 * the peer returns it, until the caller's views of it go. */
BH_EXTERN int bh_channel_frame_block(bh_channel *c, const bh_tensor_ref *t, bh_block **out);

/* For sending a value by reference: finds the peer block, mapped here and
 * held (some view of it still lives), that holds [addr, addr + nbytes)
 * at an offset that is a multiple of BH_ARENA_ALIGN, and takes a reference
 * on it (the caller owns it: bh_block_unref) with the offset.  A tensor ref
 * to it, sent as BH_BLOCK_BACK | bh_block_id(*out) while the reference is
 * held, reaches the peer as a view of its own block, no copy.  A block
 * mapped copy-on-write here (a write-sealed one: forwarded, or kept by
 * the peer to send again) is found only if no page of the range was
 * written here (/proc/self/pagemap): else what is here differs from what
 * the peer has.
 *
 * Failing that, a forward (protocol 7): the held peer block of ANOTHER
 * channel of this process, one opened with opts.forward that kept the
 * block's memfd, holding those bytes at an aligned offset.  The memfd is
 * sealed against writes from now on (F_SEAL_FUTURE_WRITE: mappings made
 * before, its owner's and this process's, stay writable) and *out is an
 * OWN block of this channel (bh_block_is_own) that shows it: list it in
 * the message's blocks like any own block.  Sent, its fd goes to this
 * channel's peer, which maps it copy-on-write (a write there stays
 * there, and it is sent back by reference only where unwritten).  It
 * holds a reference on
 * the other channel's block (found as above: a copy-on-write one only if
 * unwritten here), so that block's owner does not reuse it,
 * until this one's last reference goes (the peer returned it and the
 * caller's views went); then it is destroyed, the peer told to unmap.
 * If the owner dies meanwhile, every mapping keeps its pages.  The bytes
 * cross one process to another without a copy here.
 *
 * Returns 0, -ENOENT (no such block, or its fd not kept, or the kernel
 * refused the seal: copy the bytes instead), -BH_EPOOLFULL or -EINVAL. */
BH_EXTERN int bh_channel_peer_find(bh_channel *c, const void *addr, uint64_t nbytes,
                                   bh_block **out, uint64_t *offset);

/* CLOCK_MONOTONIC in nanoseconds. */
BH_EXTERN int64_t bh_now_ns(void);

/* -------------------------------------------------------------- supervisor */

typedef struct bh_proc bh_proc;

/* What a sandboxed worker may touch (sandbox.c): paths beneath which it
 * may read, list and execute (read), do anything (write), or read, write
 * and ioctl a device (devices); each NULL-ended, or NULL for none.  A path
 * that does not exist grants nothing.  network 0 refuses TCP connect and
 * bind (where the kernel's Landlock has ABI 4). */
typedef struct bh_sandbox {
  const char *const *read;
  const char *const *write;
  const char *const *devices;
  int network;
} bh_sandbox;

/* The kernel's Landlock ABI version: 0 where it has none (or it is
 * disabled), else 1.. (7 on Linux 6.15). */
BH_EXTERN int bh_sandbox_abi(void);

/* Restricts the calling thread, and every thread and process it makes
 * after, to *s (and sets no_new_privs, which a sandbox needs).  It cannot
 * be undone.  Returns the ABI applied (>0), or -ENOSYS where the kernel
 * has no Landlock, or another -errno; why (why_n bytes, may be NULL)
 * names the step and the path that failed. */
BH_EXTERN int bh_sandbox_apply(const bh_sandbox *s, char *why, size_t why_n);

typedef struct bh_spawn_opts {
  const char *interpreter;       /* path to a python executable */
  const char *const *argv;       /* full argv, argv[0] included; NULL-ended */
  const char *const *envp;       /* the child's whole environment */
  const char *cwd;               /* NULL: inherit */
  int stderr_sink;               /* fd the child's output is copied to, or -1 */
  const char *stderr_prefix;     /* prefix for each copied line, or NULL */
  const struct bh_sandbox *sandbox; /* NULL: none; else the child execs inside it */
} bh_spawn_opts;

/* Creates the socketpair, spawns `interpreter` with the child end as fd 3
 * and its stdout/stderr on a pipe that a drain thread copies to
 * stderr_sink and keeps the tail of.  On success *proc and *chan_fd (the
 * host end, close-on-exec) are owned by the caller: bh_proc_close and
 * bh_channel_open.  Fails with -ENOENT / -EACCES when the interpreter
 * cannot be executed, before any child exists. */
BH_EXTERN int bh_proc_spawn(const bh_spawn_opts *o, bh_proc **proc, int *chan_fd);
typedef struct bh_fork_opts {
  int zygote_fd;                 /* the zygote's socket (SOCK_SEQPACKET) */
  const void *request;           /* what the zygote is asked (its format is the zygote's) */
  size_t request_len;
  int timeout_ms;                /* for the zygote's answer; <= 0: 10 s */
  int stderr_sink;
  const char *stderr_prefix;
} bh_fork_opts;

/* As bh_proc_spawn, the child forked by a zygote (a started interpreter
 * that sets up the same layout: worker/zygote.py).  The channel's ends,
 * the output pipe and a report socket go to the zygote with SCM_RIGHTS
 * beside the request; it answers the child's pid or -errno and a reason
 * (copied into why, NUL-terminated).  The caller asks one zygote one
 * request at a time.  The zygote reports the child's wait status on the
 * report socket and reaps it only when bh_proc_wait answers, so wait,
 * kill, stop and close hold as for a spawned child; if the zygote dies
 * first, the child's end is seen by its pidfd and its status is -1 (what
 * is left of its process group is killed member by member, each through
 * a pidfd: no zombie keeps the group's number then); if
 * the zygote is stopped or hung, so that it does not report an ended
 * child within 3 s, the status is BH_STATUS_UNREPORTED. */
#define BH_STATUS_UNREPORTED (-2)
BH_EXTERN int bh_proc_fork_via(const bh_fork_opts *o, bh_proc **proc, int *chan_fd, char *why,
                               size_t why_n);
BH_EXTERN pid_t bh_proc_pid(const bh_proc *p);
/* A pollable fd that becomes readable when the child exits (a pidfd). */
BH_EXTERN int bh_proc_pidfd(const bh_proc *p);
/* Waits for the child to exit for at most timeout_ms (<0: forever) and
 * reaps it.  Returns 0 with *status as from waitpid (-1: unknown, a
 * zygote's child whose zygote died; BH_STATUS_UNREPORTED: one whose
 * zygote did not report it), or -ETIMEDOUT.  Once
 * reaped, further calls return the same status at once. */
BH_EXTERN int bh_proc_wait(bh_proc *p, int timeout_ms, int *status);
/* The ladder after a BYE the caller sent: wait grace_ms, SIGTERM, wait
 * term_ms, SIGKILL, reap.  Returns 0 with the status, never leaves a
 * zombie. */
BH_EXTERN int bh_proc_stop(bh_proc *p, int grace_ms, int term_ms, int *status);
/* Sends sig to the child alone (SIGUSR1 interrupts it; what it forked is
 * not disturbed).  -ESRCH once reaped.  bh_proc_stop's SIGTERM and
 * SIGKILL and bh_proc_close's SIGKILL go to the child's whole process
 * group (its own, from the spawn), so a helper it forked goes too. */
BH_EXTERN int bh_proc_kill(bh_proc *p, int sig);
/* Copies the last bytes the child printed (at most n-1) into buf,
 * NUL-terminated; returns the length. */
BH_EXTERN size_t bh_proc_output_tail(bh_proc *p, char *buf, size_t n);
/* Kills (SIGKILL) and reaps the child if still running, stops the drain
 * thread and frees everything. */
BH_EXTERN void bh_proc_close(bh_proc *p);
/* What one step of an OpenMP runtime's spin-wait costs on this CPU, in
 * nanoseconds: the least of a few timed runs of x86's `pause` (libgomp's
 * cpu_relax there; elsewhere a compiler barrier, as libgomp's generic one).
 * The host turns a worker's spin time into GOMP_SPINCOUNT with it, since
 * `pause` costs from a few to over 100 cycles by CPU.  About 1 ms. */
BH_EXTERN double bh_relax_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* BULKHEAD_BULKHEAD_H */
