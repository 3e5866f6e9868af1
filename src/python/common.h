/*
 * common.h -- what the files of the bulkhead._native extension share: the
 * module state, the object layouts that cross files, and the one helper
 * that turns a core error code into a Python exception.
 *
 * The extension is built against the limited API of Python 3.9 so one
 * .abi3.so loads in every interpreter from 3.9 on.  That rules out
 * PyType_GetModule (3.10), so objects keep a strong reference to their
 * module and find the state through it.
 */
#ifndef BULKHEAD_PY_COMMON_H
#define BULKHEAD_PY_COMMON_H

#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bulkhead/bulkhead.h"
#include "bulkhead/ledger.h"

typedef struct bh_state {
  PyTypeObject *Channel;
  PyTypeObject *Caller;
  PyTypeObject *Lease;
  PyTypeObject *Proc;
  PyTypeObject *Gpu;
  PyTypeObject *Ledger;
  PyTypeObject *StandIn;
  PyTypeObject *RemoteModel;
  PyObject *Error;          /* base of everything below */
  PyObject *ProtocolError;  /* a malformed frame or value */
  PyObject *PeerClosed;     /* EOF, BYE, EPIPE */
  PyObject *NotDelivered;   /* PeerClosed before a request was sent: none of it ran */
  PyObject *Timeout;        /* a deadline passed */
  PyObject *ProbeError;     /* a memory probe failed (.code, .errname) */
  PyObject *DriverUnavailable; /* ProbeError: no GPU driver (BH_ENODRIVER) */
  PyObject *LedgerError;    /* BH_ELEDGER..BH_EMODELS: the ledger refused */
  PyObject *str_exports, *str_pending_releases; /* interned: Peer attributes caller.c reads per call */
} bh_state;

typedef struct {
  PyObject_HEAD
  bh_block *block; /* one reference, owned */
  uint64_t offset;
  uint64_t nbytes;
  int readonly; /* numpy's view is read-only: an own block the peer sent back */
} bh_lease_obj;

bh_state *bh_py_state(PyObject *module);

/* Raises the exception for core error `rc` from `call` and returns NULL.
 * Always returns NULL. */
PyObject *bh_py_raise(bh_state *st, int rc, const char *call);
/* The same with the exception class chosen by the caller, and the core's
 * own explanation `detail` appended when not NULL or empty.  Always
 * returns NULL. */
PyObject *bh_py_raise_as(PyObject *type, int rc, const char *call, const char *detail);

/* New references to small ints etc. without Py_NewRef (3.10+). */
static inline PyObject *bh_py_newref(PyObject *o) {
  Py_INCREF(o);
  return o;
}

/* ---- codec.c: Python values <-> bulkhead's encoding ---- */

/* The first item of the tuple the encode hook (Peer.encode_other) answers
 * with: what the rest of the tuple is (codec.c's opener has each shape).
 * _native exports them as ENCODE_TENSOR, ENCODE_HANDLE and ENCODE_VALUE,
 * the names the Python side returns (channel/peer.py, channel/tensors.py);
 * any other first item is a TypeError naming these. */
enum {
  BH_PY_ENC_TENSOR = 0, /* (ENCODE_TENSOR, lib, dtype, shape, lease-or-bytes[, desc]) */
  BH_PY_ENC_HANDLE = 1, /* (ENCODE_HANDLE, space, id, type_name) */
  BH_PY_ENC_VALUE = 2,  /* (ENCODE_VALUE, value): value in the object's place, as a node's */
};

typedef struct bh_enc_ctx {
  bh_state *st;
  PyObject *encode_other; /* hook for what is not a plain value (borrowed) */
  bh_buf buf;
  PyObject *keep;         /* leases referenced by the value, until sent */
  bh_block **blocks;      /* their blocks, for bh_msg.blocks */
  uint32_t n_blocks, cap_blocks;
  uint64_t items;         /* encoded so far, at most BH_MAX_ITEMS */
  int node;               /* inside a value the hook marked as a node's (see codec.c) */
  bh_arena arena;         /* this message's small tensors (Channel.acquire during the encode) */
} bh_enc_ctx;

void bh_py_enc_init(bh_enc_ctx *e, bh_state *st, PyObject *encode_other);
void bh_py_enc_free(bh_enc_ctx *e);
/* Appends obj.  Returns 0, or -1 with a Python exception set (TypeError
 * naming the type of anything that cannot cross). */
int bh_py_encode(bh_enc_ctx *e, PyObject *obj);

typedef struct bh_dec_ctx {
  bh_state *st;
  bh_channel *chan;
  PyObject *decode_tensor; /* hooks (borrowed) */
  PyObject *decode_handle;
  PyObject *decode_tagged; /* hook for a tagged map, or NULL (borrowed; see bh_py_decode) */
  const char *mark;        /* its tag: a bytes key (the bytes object's buffer, borrowed) */
  Py_ssize_t mark_len;
  uint64_t items_left;     /* BH_MAX_ITEMS less those decoded (bh_py_decode sets it) */
} bh_dec_ctx;

/* Decodes one whole value from p[0..n).  New reference, or NULL with
 * ProtocolError naming what was malformed (BH_ETOOMANY past BH_MAX_ITEMS
 * items: checked before a container's storage is allocated), or with the
 * exception a hook raised.  A map one of whose keys is the bytes `mark`
 * (a tagged map) is handed, once built, to decode_tagged when set, and
 * what that returns stands in its place: values are built innermost
 * first, so a tagged map inside another is the hook's value by the time
 * the outer one is handed over.  On failure the rest of the value is
 * walked for its block refs, so the blocks the frame lends go back to
 * the peer (none stays lent to a value that was never built). */
PyObject *bh_py_decode(bh_dec_ctx *d, const uint8_t *p, size_t n);

/* Per-file type specs and module-level functions. */
extern PyType_Spec bh_channel_spec;
extern PyType_Spec bh_caller_spec;
/* caller.c: the names of the Worker methods Caller calls (a new tuple of
 * str), exported as _native.CALLER_HOOKS. */
PyObject *bh_py_caller_hooks(void);
extern PyType_Spec bh_lease_spec;
extern PyType_Spec bh_proc_spec;
extern PyType_Spec bh_gpu_spec;
extern PyType_Spec bh_standin_spec;
extern PyType_Spec bh_remote_model_spec;
PyObject *bh_py_standin_new(PyObject *module, PyObject *args, PyObject *kw);
PyObject *bh_py_standin_info(PyObject *module, PyObject *o);
PyObject *bh_py_standin_retire(PyObject *module, PyObject *o);
/* policy.c: the memory rules, one module function each. */
PyObject *bh_py_policy_ask_target(PyObject *m, PyObject *args);
PyObject *bh_py_policy_admission_need(PyObject *m, PyObject *args);
PyObject *bh_py_policy_pending(PyObject *m, PyObject *args);
PyObject *bh_py_policy_reserve(PyObject *m, PyObject *args);
PyObject *bh_py_policy_load_bytes(PyObject *m, PyObject *args);
PyObject *bh_py_policy_unload_bytes(PyObject *m, PyObject *args);
PyObject *bh_py_policy_ask_bytes(PyObject *m, PyObject *size);
PyObject *bh_py_policy_release_plan(PyObject *m, PyObject *args);
PyObject *bh_py_policy_pin_ceiling(PyObject *m, PyObject *args);
PyObject *bh_py_policy_share(PyObject *m, PyObject *args);
/* status.c: the `bulkhead status --json` document, from the same C code. */
PyObject *bh_py_status_json(PyObject *module, PyObject *args, PyObject *kw);
/* New reference: COMFY_SURFACE, the 18 member names, as a tuple. */
PyObject *bh_py_comfy_surface(void);
PyObject *bh_py_channel_open(PyObject *module, PyObject *args, PyObject *kw);
/* channel.c, for caller.c: whether o is a Channel; Channel.request with
 * an absolute deadline (ns, < 0: none); requests waiting now; the state. */
int bh_py_is_channel(PyObject *o);
PyObject *bh_py_channel_request(PyObject *chan, int kind, PyObject *payload, int64_t deadline);
int bh_py_channel_depth(PyObject *chan);
bh_state *bh_py_channel_state(PyObject *chan);
/* None -> -1 (no deadline); seconds -> now + seconds in ns; *err = -1
 * with an exception when timeout is not a number. */
int64_t bh_py_deadline_of(PyObject *timeout, int *err);
PyObject *bh_py_spawn(PyObject *module, PyObject *args, PyObject *kw);
PyObject *bh_py_spawn_via(PyObject *module, PyObject *args, PyObject *kw);
PyObject *bh_py_relax_ns(PyObject *module, PyObject *unused);
PyObject *bh_py_sandbox_abi(PyObject *module, PyObject *unused);
PyObject *bh_py_sandbox_apply(PyObject *module, PyObject *arg);
PyObject *bh_py_ram(PyObject *module, PyObject *args, PyObject *kw);
/* probe.c's part of the module's exec, after the types exist. */
int bh_py_probe_exec(PyObject *module, bh_state *st);
extern PyType_Spec bh_ledger_spec;
PyObject *bh_py_ledger_default_path(PyObject *module, PyObject *unused);
PyObject *bh_py_private_dir(PyObject *module, PyObject *args);

/* ---- ledger.c: for other bindings (a StandIn reading residency) ---- */

/* The core handle behind a Ledger object: borrowed, valid only while obj
 * is open and referenced, so call this on every use rather than keeping
 * the pointer (it is a type check and a load).  NULL with TypeError when
 * obj is not a Ledger, ValueError when it is closed.  Typical use, with
 * the GIL held and a per-(stand-in) int hint initialised to -1:
 *
 *   bh_ledger *l = bh_py_ledger_get(st, self->ledger_obj);
 *   if (!l) return NULL;
 *   rc = bh_ledger_model_read(l, pid, id, &self->hint, &size, &resident);
 */
bh_ledger *bh_py_ledger_get(bh_state *st, PyObject *obj);
/* The same for a call that releases the GIL: the Ledger counts the
 * borrow, so close() from another thread raises instead of freeing the
 * handle under it; pair every non-NULL return with bh_py_ledger_unborrow
 * (under the GIL). */
bh_ledger *bh_py_ledger_borrow(bh_state *st, PyObject *obj);
void bh_py_ledger_unborrow(PyObject *obj);
/* probe.c: the same pair for a Gpu (TypeError when obj is not a Gpu,
 * ValueError when it is closed). */
struct bh_gpu;
struct bh_gpu *bh_py_gpu_borrow(bh_state *st, PyObject *obj);
void bh_py_gpu_unborrow(PyObject *obj);
/* New Lease over [offset, offset+nbytes) of b; takes its own reference. */
PyObject *bh_py_lease_new(bh_state *st, bh_block *b, uint64_t offset, uint64_t nbytes);

#endif
