/*
 * policy.c (binding) -- the memory rules of src/core/policy.c as module
 * functions, so the Python glue holds no arithmetic that decides memory.
 * Each is a thin conversion: Python ints in, the core function, an int
 * (or a plan) out.  Byte counts and times are checked ints in [0, 2**63):
 * a negative or huge one raises OverflowError, never wraps.  Byte counts are ints; ComfyUI's float arguments stay
 * floats until the core turns them into bytes.
 */
#include "common.h"

#include "bulkhead/policy.h"

#include <limits.h>

/* "O&" converter for a byte count or a time: an int in [0, 2**63).  "K"
 * would wrap -1 into 2**64 - 1 (a worker's admit(dev, -1) became an
 * EXTRA_RESERVED_VRAM of 16 EiB); this raises instead. */
static int u64_arg(PyObject *o, void *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "expected an int, not %R", (PyObject *)Py_TYPE(o));
    return 0;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return 0;
  if (overflow || v < 0) {
    PyErr_Format(PyExc_OverflowError, "byte counts and times are ints in [0, 2**63), not %R", o);
    return 0;
  }
  *(unsigned long long *)out = (unsigned long long)v;
  return 1;
}

/* policy_ask_target(need, upstream_free, host_cache, true_free, true_free_valid) -> int */
PyObject *bh_py_policy_ask_target(PyObject *m, PyObject *args) {
  (void)m;
  long long need, upstream, cache, truth;
  int valid;
  if (!PyArg_ParseTuple(args, "LLLLp:policy_ask_target", &need, &upstream, &cache, &truth, &valid))
    return NULL;
  if (need < 0) {
    PyErr_Format(PyExc_OverflowError, "policy_ask_target: need must not be negative, not %lld", need);
    return NULL;
  }
  return PyLong_FromLongLong(bh_policy_ask_target(need, upstream, cache, truth, valid));
}

/* policy_admission_need(weights, memory_required, minimum_inference, extra_reserved, cast_buffers) */
PyObject *bh_py_policy_admission_need(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long w, req, min_inf, extra, cast = 0;
  if (!PyArg_ParseTuple(args, "O&O&O&O&|O&:policy_admission_need", u64_arg, &w, u64_arg, &req,
                        u64_arg, &min_inf, u64_arg, &extra, u64_arg, &cast))
    return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_admission_need(w, req, min_inf, extra, cast));
}

/* policy_pending(admitted, held_at_admission, held_now) -> int */
PyObject *bh_py_policy_pending(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long a, at, now;
  if (!PyArg_ParseTuple(args, "O&O&O&:policy_pending", u64_arg, &a, u64_arg, &at, u64_arg, &now))
    return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_pending(a, at, now));
}

/* Converts a sequence of non-negative ints; new array or NULL. */
static uint64_t *u64_array(PyObject *seq, Py_ssize_t *n_out, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Size(fast);
  uint64_t *v = PyMem_Malloc(sizeof *v * (size_t)(n ? n : 1));
  for (Py_ssize_t i = 0; v && i < n; i++) {
    PyObject *item = PySequence_GetItem(fast, i);
    v[i] = item ? PyLong_AsUnsignedLongLong(item) : (uint64_t)-1;
    Py_XDECREF(item);
    if (v[i] == (uint64_t)-1 && PyErr_Occurred()) {
      PyMem_Free(v);
      v = NULL;
    }
  }
  if (!v && !PyErr_Occurred()) PyErr_NoMemory();
  Py_DECREF(fast);
  *n_out = n;
  return v;
}

/* policy_reserve(base, pendings) -> int */
PyObject *bh_py_policy_reserve(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long base;
  PyObject *seq;
  if (!PyArg_ParseTuple(args, "O&O:policy_reserve", u64_arg, &base, &seq)) return NULL;
  Py_ssize_t n;
  uint64_t *v = u64_array(seq, &n, "policy_reserve: pendings must be a sequence of ints");
  if (!v) return NULL;
  uint64_t r = bh_policy_reserve(base, v, (size_t)n);
  PyMem_Free(v);
  return PyLong_FromUnsignedLongLong(r);
}

/* policy_load_bytes(extra_memory, size, resident), policy_unload_bytes(memory_to_free, resident) */
PyObject *bh_py_policy_load_bytes(PyObject *m, PyObject *args) {
  (void)m;
  double x;
  unsigned long long size, resident;
  if (!PyArg_ParseTuple(args, "dO&O&:policy_load_bytes", &x, u64_arg, &size, u64_arg, &resident))
    return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_load_bytes(x, size, resident));
}

PyObject *bh_py_policy_unload_bytes(PyObject *m, PyObject *args) {
  (void)m;
  double x;
  unsigned long long resident;
  if (!PyArg_ParseTuple(args, "dO&:policy_unload_bytes", &x, u64_arg, &resident)) return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_unload_bytes(x, resident));
}

/* A zeroed array of n elements of size bytes, from PyMem_Malloc: new
 * memory, the caller frees it with PyMem_Free.  NULL on overflow or no
 * memory (no exception set).  PyMem_Calloc would do, but 3.9's headers
 * declare it outside the limited API (3.10's on: inside), and the cp39-abi3
 * wheel is built against 3.9's. */
static void *zeroed_array(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = PyMem_Malloc(n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

/* Rows of (idle, last_used_ns, resident_bytes, floor_bytes). */
static bh_policy_worker *worker_rows(PyObject *seq, Py_ssize_t *n_out) {
  PyObject *fast = PySequence_Fast(seq, "workers must be a sequence of (idle, last_used_ns, resident_bytes, floor_bytes)");
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Size(fast);
  bh_policy_worker *w = zeroed_array((size_t)(n ? n : 1), sizeof *w);
  if (!w) PyErr_NoMemory();
  for (Py_ssize_t i = 0; w && i < n; i++) {
    PyObject *row = PySequence_GetItem(fast, i);
    int idle = 0;
    unsigned long long last, res, fl;
    int ok = row && PyArg_ParseTuple(row, "pO&O&O&", &idle, u64_arg, &last, u64_arg, &res,
                                     u64_arg, &fl);
    Py_XDECREF(row);
    if (!ok) {
      PyMem_Free(w);
      w = NULL;
      break;
    }
    w[i] = (bh_policy_worker){idle, last, res, fl};
  }
  Py_DECREF(fast);
  *n_out = n;
  return w;
}

/* policy_release_plan(workers, shortfall) -> ([(index, bytes)...], uncovered) */
PyObject *bh_py_policy_release_plan(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *seq;
  unsigned long long shortfall;
  if (!PyArg_ParseTuple(args, "OO&:policy_release_plan", &seq, u64_arg, &shortfall)) return NULL;
  Py_ssize_t n;
  bh_policy_worker *w = worker_rows(seq, &n);
  if (!w) return NULL;
  bh_policy_ask *asks = zeroed_array((size_t)(n ? n : 1), sizeof *asks);
  uint64_t uncovered = 0;
  int k = asks ? bh_policy_release_plan(w, (size_t)n, shortfall, asks, (size_t)n, &uncovered) : 0;
  PyObject *out = NULL, *list = NULL;
  if (!asks) PyErr_NoMemory();
  else if (k < 0) PyErr_SetString(PyExc_ValueError, "policy_release_plan: too many workers");
  else if ((list = PyList_New(k)) != NULL) {
    for (int i = 0; i < k; i++) {
      PyObject *t = Py_BuildValue("(nK)", (Py_ssize_t)asks[i].index, (unsigned long long)asks[i].bytes);
      if (!t) {
        Py_CLEAR(list);
        break;
      }
      PyList_SetItem(list, i, t);
    }
    if (list) out = Py_BuildValue("(NK)", list, (unsigned long long)uncovered);
  }
  PyMem_Free(asks);
  PyMem_Free(w);
  return out;
}

/* policy_pin_ceiling(ram, swap, windows=False), policy_share(total, n) */
PyObject *bh_py_policy_pin_ceiling(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long ram, swap;
  int windows = 0;
  if (!PyArg_ParseTuple(args, "O&O&|p:policy_pin_ceiling", u64_arg, &ram, u64_arg, &swap, &windows))
    return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_pin_ceiling(ram, swap, windows));
}

PyObject *bh_py_policy_share(PyObject *m, PyObject *args) {
  (void)m;
  unsigned long long total;
  unsigned int n;
  if (!PyArg_ParseTuple(args, "O&I:policy_share", u64_arg, &total, &n)) return NULL;
  return PyLong_FromUnsignedLongLong(bh_policy_share(total, n));
}
