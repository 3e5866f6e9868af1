/*
 * codec.c (binding) -- Python values to bulkhead's encoding and back.
 *
 * Plain values (None, bool, int64, float, str, bytes, bytearray, list,
 * tuple, dict; and of exactly their type: set, frozenset, complex, range)
 * are walked here in C, once per crossing, and come back as the same type
 * (a subclass of set, frozenset or complex, a numpy complex among them,
 * goes to the hook).  Anything else goes
 * to the channel's encode_other hook (Peer.encode_other), which answers
 * with a tuple whose first item names its shape (common.h's BH_PY_ENC_*,
 * exported as _native.ENCODE_TENSOR, ENCODE_HANDLE and ENCODE_VALUE; any
 * other is a TypeError naming them):
 * (lib: TENSOR_NUMPY, _TORCH or _NUMPY_SCALAR, a torch tensor's | its
 * TENSOR_REQUIRES_GRAD, _INFERENCE, _PARAMETER flags, as the decode hook
 * gets it)
 *   (ENCODE_TENSOR, lib, dtype, shape, lease-or-None)
 *                                          a C-contiguous tensor, copied
 *                                          into the shm block of the Lease
 *                                          (Channel.acquire: a small one's
 *                                          is a range of a block the
 *                                          value's small tensors share),
 *                                          or already in the PEER's block
 *                                          the Lease is over
 *                                          (Channel.peer_lease): sent back
 *                                          by reference, no copy;
 *   (ENCODE_TENSOR, lib, dtype, shape, bytes)
 *                                          a small one (at most
 *                                          TENSOR_INLINE_MAX bytes), its
 *                                          bytes inline in the value; the
 *                                          decode hook gets a bytearray of
 *                                          them (it owns its memory);
 *   (ENCODE_TENSOR, lib, dtype, shape, lease-or-bytes, desc)
 *                                          either of those, dtype uint8
 *                                          and shape (..., itemsize): the
 *                                          bytes of a numpy array whose
 *                                          dtype no code names, desc (str)
 *                                          describing it, sent as an
 *                                          ARRAY; the decode hook gets
 *                                          desc as a sixth argument;
 *   (ENCODE_HANDLE, space, id, type_name)  a handle (type_name: str, '' for
 *                                          none said);
 *   (ENCODE_VALUE, value)                  encode value in obj's place, as
 *                                          a node's value: inside it the
 *                                          hook is called encode_other(o,
 *                                          True), and an int over int64 goes
 *                                          to the hook too, so the peer's
 *                                          node policy decides what cannot
 *                                          cross (the worker holds it, the
 *                                          host refuses it);
 * or raises TypeError naming the type: nothing is ever pickled.  Decoding validates
 * as it goes (bh_dec_next is total; a decoded set's items must hash here,
 * else TypeError naming the item's type) and hands tensor refs and handles to
 * the decode hooks, which build numpy/torch objects or proxies, and a
 * tagged map (one with the channel's mark, a bytes key, among its keys:
 * Channel.set_tagged) to the tagged hook, which builds the object it
 * stands for (a pack's registered type, worker/typed.py) in the same pass.
 */
#include "common.h"

#include <stdlib.h>

/* The most one value may encode to: a frame's payload limit less room for
 * its block section. */
#define BH__VALUE_MAX ((size_t)BH_FRAME_PAYLOAD_MAX - 4096u)

void bh_py_enc_init(bh_enc_ctx *e, bh_state *st, PyObject *encode_other) {
  memset(e, 0, sizeof *e);
  e->st = st;
  e->encode_other = encode_other;
  bh_buf_init(&e->buf);
}

void bh_py_enc_free(bh_enc_ctx *e) {
  bh_arena_close(&e->arena);
  bh_buf_free(&e->buf);
  Py_CLEAR(e->keep);
  free(e->blocks);
  e->blocks = NULL;
  e->n_blocks = e->cap_blocks = 0;
}

static int enc_fail(bh_enc_ctx *e) {
  if (!PyErr_Occurred()) PyErr_NoMemory();
  (void)e;
  return -1;
}

static int enc_count(bh_enc_ctx *e, Py_ssize_t n, int (*hdr)(bh_buf *, uint32_t)) {
  if (n < 0) return -1;
  if ((size_t)n > UINT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "container too large for bulkhead (more than 2**32-1 items)");
    return -1;
  }
  return hdr(&e->buf, (uint32_t)n) ? enc_fail(e) : 0;
}

static int enc_value(bh_enc_ctx *e, PyObject *o, int depth);

/* Encodes what encode_other answers for o: a (kind, ...) tuple, kind one
 * of BH_PY_ENC_* (see the opener). */
static int enc_other(bh_enc_ctx *e, PyObject *o, int depth) {
  if (!e->encode_other) {
    PyErr_Format(PyExc_TypeError, "cannot send an object of type %R", (PyObject *)Py_TYPE(o));
    return -1;
  }
  PyObject *r = PyObject_CallFunctionObjArgs(e->encode_other, o, e->node ? Py_True : NULL, NULL);
  if (!r) return -1;
  int rc = -1;
  long kind;
  if (!PyTuple_Check(r) || PyTuple_Size(r) < 1 ||
      ((kind = PyLong_AsLong(PyTuple_GetItem(r, 0))) == -1 && PyErr_Occurred())) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "encode_other must return a tuple");
    goto out;
  }
  if (kind != BH_PY_ENC_TENSOR && kind != BH_PY_ENC_HANDLE && kind != BH_PY_ENC_VALUE) {
    PyErr_Format(PyExc_TypeError,
                 "encode_other answered a tuple tagged %ld for an object of type %R; its first item "
                 "must be _native.ENCODE_TENSOR (%d), ENCODE_HANDLE (%d) or ENCODE_VALUE (%d)",
                 kind, (PyObject *)Py_TYPE(o), BH_PY_ENC_TENSOR, BH_PY_ENC_HANDLE, BH_PY_ENC_VALUE);
    goto out;
  }
  if (kind == BH_PY_ENC_HANDLE) { /* (ENCODE_HANDLE, space, id, type_name): a handle */
    bh_handle_ref h;
    unsigned char space;
    unsigned long long id;
    const char *tname;
    Py_ssize_t tlen;
    if (!PyArg_ParseTuple(r, "lbKs#", &kind, &space, &id, &tname, &tlen)) goto out;
    h.space = space;
    h.id = id;
    h.type = tname;
    h.type_len = (uint16_t)(tlen > BH_TYPE_NAME_MAX ? 0 : tlen); /* a name too long is not said */
    rc = bh_enc_handle(&e->buf, &h) ? enc_fail(e) : 0;
    goto out;
  }
  if (kind == BH_PY_ENC_VALUE) { /* (ENCODE_VALUE, value): value in o's place, as a node's */
    PyObject *k, *v;
    if (!PyArg_ParseTuple(r, "OO", &k, &v)) goto out;
    int was = e->node;
    e->node = 1;
    rc = enc_value(e, v, depth + 1);
    e->node = was;
    goto out;
  }
  /* (ENCODE_TENSOR, lib, dtype, shape, lease-or-None): a C-contiguous tensor */
  bh_tensor_ref t;
  memset(&t, 0, sizeof t);
  unsigned char lib, dtype;
  PyObject *shape, *lease;
  const char *desc = NULL; /* an ARRAY's description: borrowed from r */
  Py_ssize_t desc_len = 0;
  if (!PyArg_ParseTuple(r, "lbbOO|s#", &kind, &lib, &dtype, &shape, &lease, &desc, &desc_len)) goto out;
  if (desc && (desc_len == 0 || (size_t)desc_len > BH_ARRAY_DESC_MAX)) {
    PyErr_Format(PyExc_ValueError, "an array's dtype description is %zd bytes; bulkhead carries 1 to %u",
                 desc_len, (unsigned)BH_ARRAY_DESC_MAX);
    goto out;
  }
  Py_ssize_t nd = PySequence_Size(shape);
  if (nd < 0) goto out;
  if (nd > BH_MAX_DIMS) {
    PyErr_Format(PyExc_ValueError, "tensor has %zd dimensions; bulkhead carries at most %d", nd,
                 BH_MAX_DIMS);
    goto out;
  }
  t.lib = lib;
  t.dtype = dtype;
  t.ndim = (uint8_t)nd;
  unsigned isz = bh_dtype_itemsize(dtype);
  uint64_t count = 1;
  for (Py_ssize_t i = 0; i < nd; i++) {
    PyObject *d = PySequence_GetItem(shape, i);
    if (!d) goto out;
    t.shape[i] = PyLong_AsLongLong(d);
    Py_DECREF(d);
    if (t.shape[i] == -1 && PyErr_Occurred()) goto out;
  }
  int64_t stride = 1;
  for (Py_ssize_t i = nd; i-- > 0;) {
    t.strides[i] = stride;
    if (t.shape[i] > 0) stride *= t.shape[i];
  }
  for (Py_ssize_t i = 0; i < nd; i++) count *= (uint64_t)(t.shape[i] < 0 ? 0 : t.shape[i]);
  t.nbytes = count * isz;
  t.block = BH_BLOCK_NONE;
  if (PyBytes_Check(lease)) {
    if ((uint64_t)PyBytes_Size(lease) != t.nbytes || t.nbytes > BH_TENSOR_INLINE_MAX) {
      PyErr_Format(PyExc_ValueError, "inline tensor data is %zd bytes; its shape needs %llu (at most %u)",
                   PyBytes_Size(lease), (unsigned long long)t.nbytes, (unsigned)BH_TENSOR_INLINE_MAX);
      goto out;
    }
    if (t.nbytes) {
      t.block = BH_BLOCK_INLINE;
      t.data = (const uint8_t *)PyBytes_AsString(lease); /* copied by bh_enc_tensor below */
    }
  } else if (lease != Py_None) {
    if (!PyObject_TypeCheck(lease, e->st->Lease) || !((bh_lease_obj *)lease)->block) {
      PyErr_SetString(PyExc_TypeError, "encode_other must return a live Lease");
      goto out;
    }
    bh_lease_obj *l = (bh_lease_obj *)lease;
    int back = !bh_block_is_own(l->block); /* Channel.peer_lease: the peer's block, sent back */
    if (l->nbytes < t.nbytes || (back && l->offset % BH_ARENA_ALIGN)) {
      PyErr_SetString(PyExc_ValueError, "lease is not a block range that holds the tensor");
      goto out;
    }
    t.block = bh_block_id(l->block) | (back ? BH_BLOCK_BACK : 0);
    t.offset = l->offset;
    if (t.nbytes == 0) t.block = BH_BLOCK_NONE, t.offset = 0;
    if (t.block != BH_BLOCK_NONE) { /* held until sent */
      if (!e->keep && !(e->keep = PyList_New(0))) goto out;
      if (PyList_Append(e->keep, lease) < 0) goto out;
    }
    /* A back ref's block is the peer's: not lent, so not listed, and held
     * (above) no return of it can leave with this frame's notes. */
    if (t.block != BH_BLOCK_NONE && !back) {
      /* An arena's tensors come one after another: their block is listed
       * once (bh_channel_send lends a block once however often listed). */
      int listed = e->n_blocks && e->blocks[e->n_blocks - 1] == l->block;
      if (!listed && e->n_blocks == e->cap_blocks) {
        uint32_t nc = e->cap_blocks ? e->cap_blocks * 2 : 8;
        bh_block **nb = realloc(e->blocks, nc * sizeof *nb);
        if (!nb) {
          PyErr_NoMemory();
          goto out;
        }
        e->blocks = nb;
        e->cap_blocks = nc;
      }
      if (!listed) e->blocks[e->n_blocks++] = l->block;
    }
  }
  if (bh_tensor_ref_check(&t)) {
    PyErr_Format(PyExc_ValueError, "tensor (dtype code %d, %d dims) does not describe its bytes",
                 (int)dtype, (int)nd);
    goto out;
  }
  if (desc) {
    int erc = bh_enc_array(&e->buf, desc, (size_t)desc_len, &t);
    if (erc == -EINVAL) {
      PyErr_Format(PyExc_ValueError, "an array's bytes must be a uint8 numpy tensor of shape (..., itemsize), "
                   "not dtype code %d, lib %d, %d dims", (int)dtype, (int)lib, (int)nd);
      goto out;
    }
    rc = erc ? enc_fail(e) : 0;
    goto out;
  }
  rc = bh_enc_tensor(&e->buf, &t) ? enc_fail(e) : 0;
out:
  Py_DECREF(r);
  return rc;
}

/* One str/bytes alone over what a message carries: ValueError, before
 * anything is copied. */
static int enc_too_big(const char *what, size_t n, const char *unit) {
  PyErr_Format(PyExc_ValueError,
               "a %s of %zu %s is larger than one message carries (%u bytes; send large data as arrays)",
               what, n, unit, (unsigned)BH__VALUE_MAX);
  return -1;
}

static int enc_seq(bh_enc_ctx *e, PyObject *o, int depth, int (*hdr)(bh_buf *, uint32_t)) {
  Py_ssize_t n = PySequence_Size(o);
  if (enc_count(e, n, hdr) < 0) return -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(o, i);
    if (!item) return -1;
    int rc = enc_value(e, item, depth + 1);
    Py_DECREF(item);
    if (rc < 0) return -1;
  }
  return 0;
}

/* A set or frozenset (exactly): its items in its own order.  One changed
 * meanwhile by another thread is refused rather than sent with a count
 * that lies. */
static int enc_set(bh_enc_ctx *e, PyObject *o, int depth, int (*hdr)(bh_buf *, uint32_t)) {
  Py_ssize_t n = PySet_Size(o), k = 0;
  if (enc_count(e, n, hdr) < 0) return -1;
  PyObject *it = PyObject_GetIter(o), *item;
  if (!it) return -1;
  while ((item = PyIter_Next(it))) {
    int rc = ++k > n ? -1 : enc_value(e, item, depth + 1);
    Py_DECREF(item);
    if (rc < 0) break;
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) return -1;
  if (k != n) {
    PyErr_Format(PyExc_RuntimeError, "a %s changed size while bulkhead encoded it (%zd items, then %zd)",
                 Py_IS_TYPE(o, &PySet_Type) ? "set" : "frozenset", n, k);
    return -1;
  }
  return 0;
}

/* A range: start, stop and step, each an int64.  Past that: the node
 * policy's (enc_other), or OverflowError naming it. */
static int enc_range(bh_enc_ctx *e, PyObject *o, int depth) {
  static const char *const names[3] = {"start", "stop", "step"};
  long long v[3];
  for (int i = 0; i < 3; i++) {
    PyObject *a = PyObject_GetAttrString(o, names[i]);
    if (!a) return -1;
    int overflow = 0;
    v[i] = PyLong_AsLongLongAndOverflow(a, &overflow);
    Py_DECREF(a);
    if (overflow && e->node) return enc_other(e, o, depth);
    if (overflow) {
      PyErr_Format(PyExc_OverflowError, "%R does not fit bulkhead's int64 range bounds", o);
      return -1;
    }
    if (v[i] == -1 && PyErr_Occurred()) return -1;
  }
  return bh_enc_range(&e->buf, v[0], v[1], v[2]) ? enc_fail(e) : 0;
}

static int enc_value(bh_enc_ctx *e, PyObject *o, int depth) {
  if (depth > BH_MAX_DEPTH) {
    PyErr_Format(PyExc_ValueError, "value nests deeper than %d levels (a cycle?)", BH_MAX_DEPTH);
    return -1;
  }
  if (++e->items > BH_MAX_ITEMS) {
    PyErr_Format(PyExc_ValueError,
                 "value holds more than %u items; one message carries at most that many "
                 "(send large data as arrays)", (unsigned)BH_MAX_ITEMS);
    return -1;
  }
  bh_buf *b = &e->buf;
  if (o == Py_None) return bh_enc_nil(b) ? enc_fail(e) : 0;
  if (o == Py_True || o == Py_False) return bh_enc_bool(b, o == Py_True) ? enc_fail(e) : 0;
  if (PyLong_Check(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow && e->node) return enc_other(e, o, depth);
    if (overflow) {
      PyErr_Format(PyExc_OverflowError, "int %R does not fit bulkhead's int64", o);
      return -1;
    }
    if (v == -1 && PyErr_Occurred()) return -1;
    return bh_enc_int(b, v) ? enc_fail(e) : 0;
  }
  if (PyFloat_Check(o)) {
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    return bh_enc_float(b, v) ? enc_fail(e) : 0;
  }
  if (PyUnicode_Check(o)) {
    /* Over the frame limit in code points already: refused before a
     * gigabyte-sized UTF-8 copy is made (bh_py_encode checks the total). */
    Py_ssize_t chars = PyUnicode_GetLength(o);
    if (chars < 0) return -1;
    if ((size_t)chars > BH__VALUE_MAX) return enc_too_big("str", (size_t)chars, "characters");
    PyObject *u = PyUnicode_AsUTF8String(o);
    char *s;
    Py_ssize_t n;
    if (!u) return -1;
    int rc = PyBytes_AsStringAndSize(u, &s, &n) < 0 ? -1 : bh_enc_str(b, s, (size_t)n) ? enc_fail(e) : 0;
    Py_DECREF(u);
    return rc;
  }
  if (PyBytes_Check(o)) {
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(o, &s, &n) < 0) return -1;
    if ((size_t)n > BH__VALUE_MAX) return enc_too_big("bytes", (size_t)n, "bytes");
    return bh_enc_bytes(b, s, (size_t)n) ? enc_fail(e) : 0;
  }
  if (PyByteArray_Check(o)) {
    size_t n = (size_t)PyByteArray_Size(o);
    if (n > BH__VALUE_MAX) return enc_too_big("bytearray", n, "bytes");
    return bh_enc_bytes(b, PyByteArray_AsString(o), n) ? enc_fail(e) : 0;
  }
  if (PyComplex_CheckExact(o)) {
    double re = PyComplex_RealAsDouble(o), im = PyComplex_ImagAsDouble(o);
    if ((re == -1.0 || im == -1.0) && PyErr_Occurred()) return -1;
    return bh_enc_complex(b, re, im) ? enc_fail(e) : 0;
  }
  if (Py_IS_TYPE(o, &PySet_Type)) return enc_set(e, o, depth, bh_enc_set);
  if (PyFrozenSet_CheckExact(o)) return enc_set(e, o, depth, bh_enc_frozenset);
  if (PyRange_Check(o)) return enc_range(e, o, depth);
  if (PyList_Check(o)) return enc_seq(e, o, depth, bh_enc_list);
  if (PyTuple_Check(o)) return enc_seq(e, o, depth, bh_enc_tuple);
  if (PyDict_Check(o)) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    if (enc_count(e, PyDict_Size(o), bh_enc_map) < 0) return -1;
    while (PyDict_Next(o, &pos, &k, &v))
      if (enc_value(e, k, depth + 1) < 0 || enc_value(e, v, depth + 1) < 0) return -1;
    return 0;
  }
  return enc_other(e, o, depth);
}

int bh_py_encode(bh_enc_ctx *e, PyObject *obj) {
  if (Py_EnterRecursiveCall(" while encoding a bulkhead value")) return -1;
  int rc = enc_value(e, obj, 0);
  Py_LeaveRecursiveCall();
  if (rc == 0 && e->buf.len > BH__VALUE_MAX) {
    PyErr_Format(PyExc_ValueError,
                 "value encodes to %zu bytes; one message carries at most %u (send large data as arrays)",
                 e->buf.len, (unsigned)BH__VALUE_MAX);
    return -1;
  }
  return rc;
}

/* ---- decode ---- */

static PyObject *dec_error(bh_dec_ctx *d, int rc) { return bh_py_raise(d->st, rc, "decode"); }

static PyObject *dec_value(bh_dec_ctx *d, bh_reader *r, int depth);

/* A TENSOR, or an ARRAY's bytes with its description (desc not NULL):
 * the decode hook's object for it. */
static PyObject *dec_tensor(bh_dec_ctx *d, const bh_tensor_ref *t, const char *desc, uint16_t desc_len) {
  PyObject *lease = Py_None, *res = NULL;
  bh_block *blk = NULL;
  Py_INCREF(lease);
  if (t->block == BH_BLOCK_INLINE) { /* a copy the decoded object owns */
    Py_DECREF(lease);
    lease = PyByteArray_FromStringAndSize((const char *)t->data, (Py_ssize_t)t->nbytes);
    if (!lease) return NULL;
  } else if (t->block != BH_BLOCK_NONE) {
    /* In a block the frame lends, within it, aligned, after the frame's
     * previous ref into it: checked by the channel, which takes the
     * reference the lease keeps (the block goes back with the last one). */
    int rc = bh_channel_frame_block(d->chan, t, &blk);
    if (rc) {
      Py_DECREF(lease);
      return dec_error(d, rc);
    }
    /* Our own block, sent back: the peer may still read it (numpy's view
     * of it is read-only; torch has no such flag). */
    int own = bh_block_is_own(blk);
    Py_DECREF(lease);
    lease = bh_py_lease_new(d->st, blk, t->offset, t->nbytes);
    bh_block_unref(blk); /* the lease holds its own */
    if (!lease) return NULL;
    ((bh_lease_obj *)lease)->readonly = own;
  }
  PyObject *shape = PyTuple_New(t->ndim), *strides = PyTuple_New(t->ndim);
  if (!shape || !strides) goto out;
  for (unsigned i = 0; i < t->ndim; i++) {
    PyObject *a = PyLong_FromLongLong(t->shape[i]), *s = PyLong_FromLongLong(t->strides[i]);
    if (!a || !s) {
      Py_XDECREF(a);
      Py_XDECREF(s);
      goto out;
    }
    PyTuple_SetItem(shape, i, a);
    PyTuple_SetItem(strides, i, s);
  }
  if (desc)
    res = PyObject_CallFunction(d->decode_tensor, "iiOOOs#", (int)t->lib, (int)t->dtype, shape,
                                strides, lease, desc, (Py_ssize_t)desc_len);
  else
    res = PyObject_CallFunction(d->decode_tensor, "iiOOO", (int)t->lib, (int)t->dtype, shape,
                                strides, lease);
out:
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  Py_DECREF(lease);
  return res;
}

/* A tagged map's key: bytes equal to the mark (a key written by a web
 * client through JSON is a str, never this). */
static int dec_is_mark(const bh_dec_ctx *d, PyObject *k) {
  if (!PyBytes_Check(k) || PyBytes_Size(k) != d->mark_len) return 0;
  return memcmp(PyBytes_AsString(k), d->mark, (size_t)d->mark_len) == 0;
}

/* A set's item that does not hash here (TypeError set): TypeError naming
 * its type and what to send instead.  An item the sender could hash may
 * not hash here: a hashable subclass of list or dict, a registered type's
 * object, crosses as its plain data. */
static void dec_unhashable(uint8_t tag, PyObject *v) {
  PyErr_Clear(); /* the hash's own TypeError: replaced by one that names the fix */
  PyObject *type = PyObject_GetAttrString((PyObject *)Py_TYPE(v), "__qualname__");
  if (!type) PyErr_Clear();
  PyErr_Format(PyExc_TypeError,
               "decode: a %s received holds an item of type %S, which is unhashable in this process "
               "(an object that crossed as its plain data, a list or dict, does not hash); send those "
               "items in a list or tuple instead",
               tag == BH_TAG_SET ? "set" : "frozenset", type ? type : (PyObject *)Py_TYPE(v));
  Py_XDECREF(type);
}

static PyObject *dec_items(bh_dec_ctx *d, bh_reader *r, int depth, const bh_item *it) {
  if (depth + 1 > BH_MAX_DEPTH) return dec_error(d, -BH_EDEPTH);
  uint32_t n = it->u.count;
  /* Before PyList_New(n): a count within the frame's bytes may still be
   * more than the items left to this value. */
  if ((it->tag == BH_TAG_MAP ? 2 * (uint64_t)n : n) > d->items_left)
    return dec_error(d, -BH_ETOOMANY);
  if (it->tag == BH_TAG_MAP) {
    PyObject *m = PyDict_New();
    int tagged = 0;
    for (uint32_t i = 0; m && i < n; i++) {
      PyObject *k = dec_value(d, r, depth + 1);
      PyObject *v = k ? dec_value(d, r, depth + 1) : NULL;
      if (!v || PyDict_SetItem(m, k, v) < 0) Py_CLEAR(m);
      else if (!tagged && d->decode_tagged) tagged = dec_is_mark(d, k);
      Py_XDECREF(k);
      Py_XDECREF(v);
    }
    if (m && tagged) { /* the hook's value in the map's place */
      PyObject *v = PyObject_CallFunctionObjArgs(d->decode_tagged, m, NULL);
      Py_DECREF(m);
      m = v;
    }
    return m;
  }
  if (it->tag == BH_TAG_SET || it->tag == BH_TAG_FROZENSET) {
    PyObject *set = PySet_New(NULL);
    for (uint32_t i = 0; set && i < n; i++) {
      PyObject *v = dec_value(d, r, depth + 1);
      if (!v || PySet_Add(set, v) < 0) {
        if (v && PyErr_ExceptionMatches(PyExc_TypeError)) dec_unhashable(it->tag, v);
        Py_CLEAR(set);
      }
      Py_XDECREF(v);
    }
    if (set && it->tag == BH_TAG_FROZENSET) {
      PyObject *f = PyFrozenSet_New(set);
      Py_DECREF(set);
      set = f;
    }
    return set;
  }
  PyObject *s = it->tag == BH_TAG_LIST ? PyList_New(n) : PyTuple_New(n);
  for (uint32_t i = 0; s && i < n; i++) {
    PyObject *v = dec_value(d, r, depth + 1);
    if (!v) Py_CLEAR(s);
    else if (it->tag == BH_TAG_LIST) PyList_SetItem(s, i, v);
    else PyTuple_SetItem(s, i, v);
  }
  return s;
}

static PyObject *dec_value(bh_dec_ctx *d, bh_reader *r, int depth) {
  bh_item it;
  int rc = bh_dec_next(r, &it);
  if (rc) return dec_error(d, rc);
  if (d->items_left == 0) return dec_error(d, -BH_ETOOMANY);
  d->items_left--;
  switch (it.tag) {
  case BH_TAG_NIL: Py_RETURN_NONE;
  case BH_TAG_FALSE: Py_RETURN_FALSE;
  case BH_TAG_TRUE: Py_RETURN_TRUE;
  case BH_TAG_INT: return PyLong_FromLongLong(it.u.i);
  case BH_TAG_FLOAT: return PyFloat_FromDouble(it.u.f);
  case BH_TAG_STR: return PyUnicode_DecodeUTF8((const char *)it.u.s.p, it.u.s.n, "strict");
  case BH_TAG_BYTES: return PyBytes_FromStringAndSize((const char *)it.u.s.p, it.u.s.n);
  case BH_TAG_LIST:
  case BH_TAG_TUPLE:
  case BH_TAG_SET:
  case BH_TAG_FROZENSET:
  case BH_TAG_MAP: return dec_items(d, r, depth, &it);
  case BH_TAG_TENSOR: return dec_tensor(d, &it.u.t, NULL, 0);
  case BH_TAG_ARRAY: return dec_tensor(d, &it.u.t, it.desc, it.desc_len);
  case BH_TAG_COMPLEX: return PyComplex_FromDoubles(it.u.c.real, it.u.c.imag);
  case BH_TAG_RANGE:
    return PyObject_CallFunction((PyObject *)&PyRange_Type, "LLL", (long long)it.u.r.start,
                                 (long long)it.u.r.stop, (long long)it.u.r.step);
  case BH_TAG_HANDLE:
    return PyObject_CallFunction(d->decode_handle, "iKs#", (int)it.u.h.space,
                                 (unsigned long long)it.u.h.id, it.u.h.type ? it.u.h.type : "",
                                 (Py_ssize_t)it.u.h.type_len);
  }
  return dec_error(d, -BH_EBADTAG);
}

/* After a failed decode: the tensor refs left in the value into blocks
 * the frame lends are claimed and dropped at once, so each such block goes
 * back to the peer with its last reference instead of staying lent to a
 * value that was never built (a hook that raised leaves a well-formed
 * rest).  Stops at the first malformed item; back refs (this side's own
 * blocks) are left alone. */
static void dec_drain(bh_dec_ctx *d, bh_reader *r) {
  bh_item it;
  while (r->pos < r->len && bh_dec_next(r, &it) == 0) {
    const bh_tensor_ref *t = &it.u.t;
    if ((it.tag != BH_TAG_TENSOR && it.tag != BH_TAG_ARRAY) || t->block == BH_BLOCK_NONE ||
        t->block == BH_BLOCK_INLINE ||
        (t->block & BH_BLOCK_BACK))
      continue;
    bh_block *blk;
    if (bh_channel_frame_block(d->chan, t, &blk) == 0) bh_block_unref(blk);
  }
}

PyObject *bh_py_decode(bh_dec_ctx *d, const uint8_t *p, size_t n) {
  bh_reader r;
  bh_reader_init(&r, p, n);
  d->items_left = BH_MAX_ITEMS;
  if (!d->mark) d->decode_tagged = NULL;
  if (Py_EnterRecursiveCall(" while decoding a bulkhead value")) return NULL;
  PyObject *v = dec_value(d, &r, 0);
  Py_LeaveRecursiveCall();
  if (v && r.pos != r.len) {
    Py_DECREF(v);
    v = dec_error(d, -BH_ETRAILING);
  }
  if (!v && d->chan) dec_drain(d, &r);
  return v;
}
