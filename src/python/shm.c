/*
 * shm.c (binding) -- Lease: a Python object holding one reference to a
 * shared-memory block, over a byte range of it.  numpy wraps it without a
 * copy through __array_interface__ (the array keeps the lease as its base);
 * torch through a DLPack capsule whose deleter drops its own block
 * reference, on whatever thread torch frees the tensor, without the GIL.
 * When the last holder goes, the block returns to its pool (own) or is
 * handed back to the peer (peer's).
 */
#include "common.h"

#include <stdlib.h>

PyObject *bh_py_lease_new(bh_state *st, bh_block *b, uint64_t offset, uint64_t nbytes) {
  bh_lease_obj *l = PyObject_GC_New(bh_lease_obj, st->Lease);
  if (!l) return NULL;
  bh_block_ref(b);
  l->block = b;
  l->offset = offset;
  l->nbytes = nbytes;
  l->readonly = 0;
  PyObject_GC_Track((PyObject *)l);
  return (PyObject *)l;
}

static int Lease_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int Lease_clear(PyObject *self) {
  bh_lease_obj *l = (bh_lease_obj *)self;
  bh_block *b = l->block;
  l->block = NULL;
  if (b) bh_block_unref(b);
  return 0;
}

static void Lease_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Lease_clear(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static int lease_live(bh_lease_obj *l) {
  if (l->block) return 1;
  PyErr_SetString(PyExc_ValueError, "lease already released");
  return 0;
}

static PyObject *Lease_address(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  return PyLong_FromUnsignedLongLong((uintptr_t)bh_block_addr(l->block) + l->offset);
}

static PyObject *Lease_nbytes(PyObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(((bh_lease_obj *)self)->nbytes);
}

static PyObject *Lease_block_id(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  return PyLong_FromUnsignedLong(bh_block_id(l->block));
}

static PyObject *Lease_own(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  return PyBool_FromLong(bh_block_is_own(l->block));
}

static PyObject *Lease_copy_on_write(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  return PyBool_FromLong(bh_block_is_private(l->block));
}

static PyObject *Lease_lent(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  return PyBool_FromLong(bh_block_is_own(l->block) && bh_block_is_lent(l->block));
}

static PyObject *Lease_readonly(PyObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(((bh_lease_obj *)self)->readonly);
}

/* numpy's array interface: a 1-D uint8 view of the leased bytes, read-only
 * when the lease is (torch's DLPack view has no such flag: see
 * python/bulkhead/channel/tensors.py). */
static PyObject *Lease_array_interface(PyObject *self, void *c) {
  (void)c;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  uintptr_t addr = (uintptr_t)bh_block_addr(l->block) + l->offset;
  return Py_BuildValue("{s:(KO),s:(K),s:s,s:i}", "data", (unsigned long long)addr,
                       l->readonly ? Py_True : Py_False,
                       "shape", (unsigned long long)l->nbytes, "typestr", "|u1", "version", 3);
}

/* ---- DLPack (the ABI is public and stable; declared here, no header) ---- */

typedef struct {
  int32_t device_type;
  int32_t device_id;
} bh_dl_device;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} bh_dl_dtype;
typedef struct {
  void *data;
  bh_dl_device device;
  int32_t ndim;
  bh_dl_dtype dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} bh_dl_tensor;
typedef struct bh_dl_managed {
  bh_dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct bh_dl_managed *self);
} bh_dl_managed;

typedef struct {
  bh_dl_managed m;
  int64_t shape[1];
  bh_block *block;
} bh_dl_box;

static void bh_dl_deleter(bh_dl_managed *m) {
  bh_dl_box *box = (bh_dl_box *)m;
  bh_block_unref(box->block); /* no Python here: any thread, no GIL */
  free(box);
}

static void bh_dl_capsule_destructor(PyObject *cap) {
  /* An unconsumed capsule still owns its tensor; a consumer renames it. */
  if (PyCapsule_IsValid(cap, "dltensor")) {
    bh_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

static PyObject *Lease_dlpack(PyObject *self, PyObject *unused) {
  (void)unused;
  bh_lease_obj *l = (bh_lease_obj *)self;
  if (!lease_live(l)) return NULL;
  bh_dl_box *box = calloc(1, sizeof *box);
  if (!box) return PyErr_NoMemory();
  box->shape[0] = (int64_t)l->nbytes;
  box->block = l->block;
  bh_block_ref(l->block);
  box->m.dl_tensor.data = (char *)bh_block_addr(l->block) + l->offset;
  box->m.dl_tensor.device.device_type = 1; /* kDLCPU */
  box->m.dl_tensor.ndim = 1;
  box->m.dl_tensor.dtype.code = 1; /* kDLUInt */
  box->m.dl_tensor.dtype.bits = 8;
  box->m.dl_tensor.dtype.lanes = 1;
  box->m.dl_tensor.shape = box->shape;
  box->m.manager_ctx = box;
  box->m.deleter = bh_dl_deleter;
  PyObject *cap = PyCapsule_New(&box->m, "dltensor", bh_dl_capsule_destructor);
  if (!cap) bh_dl_deleter(&box->m);
  return cap;
}

/* fill(src_address, nbytes, threads): copies nbytes from src_address into
 * the leased bytes on that many threads (bh_copy), the GIL released.  The
 * caller keeps the source alive and says how many threads (the choice is
 * channel/tensors.py's).  Returns the threads that copied. */
static PyObject *Lease_fill(PyObject *self, PyObject *args) {
  bh_lease_obj *l = (bh_lease_obj *)self;
  unsigned long long src, n;
  unsigned int threads;
  if (!PyArg_ParseTuple(args, "KKI:fill", &src, &n, &threads)) return NULL;
  if (!lease_live(l)) return NULL;
  if (l->readonly || !bh_block_is_own(l->block)) {
    PyErr_SetString(PyExc_ValueError, "Lease.fill: only a writable lease of this process's own block is filled");
    return NULL;
  }
  if (n > l->nbytes || (n && !src) || threads == 0) {
    PyErr_Format(PyExc_ValueError, "Lease.fill: %llu bytes into a lease of %llu (from a non-null address, "
                 "on one thread or more)", n, (unsigned long long)l->nbytes);
    return NULL;
  }
  char *dst = (char *)bh_block_addr(l->block) + l->offset;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_copy(dst, (const void *)(uintptr_t)src, (size_t)n, threads);
  Py_END_ALLOW_THREADS
  if (rc < 0) return bh_py_raise_as(PyExc_ValueError, rc, "bh_copy", NULL);
  return PyLong_FromLong(rc);
}

static PyObject *Lease_release(PyObject *self, PyObject *unused) {
  (void)unused;
  Lease_clear(self);
  Py_RETURN_NONE;
}

static PyGetSetDef Lease_getset[] = {
    {"address", Lease_address, NULL, "address of the first leased byte", NULL},
    {"nbytes", Lease_nbytes, NULL, "leased bytes", NULL},
    {"block_id", Lease_block_id, NULL, "id of the block in its owner's pool", NULL},
    {"own", Lease_own, NULL, "True for a block of this process's pool", NULL},
    {"readonly", Lease_readonly, NULL, "True when the peer sent this own block back by reference", NULL},
    {"copy_on_write", Lease_copy_on_write, NULL,
     "True for a peer block forwarded from another process, mapped copy-on-write here", NULL},
    {"lent", Lease_lent, NULL, "True while this own block is lent to the peer (not to be sent again)", NULL},
    {"__array_interface__", Lease_array_interface, NULL, "numpy array interface (uint8)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Lease_methods[] = {
    {"dlpack", Lease_dlpack, METH_NOARGS, "a DLPack capsule (uint8, 1-D) over the leased bytes"},
    {"release", Lease_release, METH_NOARGS, "drop the block reference now"},
    {"fill", Lease_fill, METH_VARARGS,
     "fill(src_address, nbytes, threads) -> threads that copied nbytes from src_address into the lease"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Lease_slots[] = {
    {Py_tp_dealloc, Lease_dealloc},
    {Py_tp_traverse, Lease_traverse},
    {Py_tp_clear, Lease_clear},
    {Py_tp_getset, Lease_getset},
    {Py_tp_methods, Lease_methods},
    {Py_tp_doc, "A reference to bytes of a shared-memory block."},
    {0, NULL}};

PyType_Spec bh_lease_spec = {
    "bulkhead._native.Lease", sizeof(bh_lease_obj), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Lease_slots};
