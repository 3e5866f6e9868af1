/*
 * probe.c (binding) -- the memory probes: the Gpu type over bh_gpu (NVML)
 * and ram() over bh_ram_read.  Plain numbers out; the glue names them.
 *
 * Gpu(library=None) opens NVML: `library` is a path to load exactly, else
 * the environment variable BULKHEAD_NVML_LIBRARY if set and not empty,
 * else dlopen's default search for libnvidia-ml.so.1 / libnvidia-ml.so.
 * No driver raises DriverUnavailable (errname "BH_ENODRIVER") whose
 * message carries dlerror()'s or nvmlInit's reason; every other probe
 * failure raises ProbeError with .code and .errname.
 *
 * Driver calls run without the GIL.  A Gpu counts the calls in flight so
 * that close() from another thread cannot free the probe under one of them
 * (it raises RuntimeError instead).
 *
 * The limited API of 3.9 has no PyType_GetModule, and Gpu is built by
 * calling its type, so the type keeps its module in the attribute
 * "_bh_module" (set by the module's exec; the cycle module -> state ->
 * type -> dict -> module is broken by the GC through both clears).
 */
#include "common.h"

#include "bulkhead/probe.h"

#include <errno.h>
#include <stdlib.h>

typedef struct {
  PyObject_HEAD
  bh_gpu *gpu;
  PyObject *module;
  int busy; /* calls running without the GIL (changed only under the GIL) */
} bh_gpu_obj;

/* Raises DriverUnavailable / ProbeError for `rc` from `call`, with the
 * core's explanation `detail` (may be NULL or empty).  Returns NULL. */
static PyObject *probe_raise(bh_state *st, int rc, const char *call, const char *detail) {
  int code = rc < 0 ? -rc : rc;
  if (code == ENOMEM) return PyErr_NoMemory();
  return bh_py_raise_as(code == BH_ENODRIVER ? st->DriverUnavailable : st->ProbeError, rc, call,
                        detail);
}

static bh_state *gpu_state(bh_gpu_obj *g) { return bh_py_state(g->module); }

/* The open probe, or NULL with ValueError. */
static bh_gpu *gpu_live(bh_gpu_obj *g) {
  if (!g->gpu) PyErr_SetString(PyExc_ValueError, "Gpu is closed");
  return g->gpu;
}

bh_gpu *bh_py_gpu_borrow(bh_state *st, PyObject *obj) {
  if (!st || !obj || !PyObject_TypeCheck(obj, st->Gpu)) {
    PyErr_SetString(PyExc_TypeError, "expected a bulkhead._native.Gpu");
    return NULL;
  }
  bh_gpu_obj *g = (bh_gpu_obj *)obj;
  bh_gpu *gpu = gpu_live(g);
  if (gpu) g->busy++;
  return gpu;
}

void bh_py_gpu_unborrow(PyObject *obj) { ((bh_gpu_obj *)obj)->busy--; }

static PyObject *Gpu_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"library", NULL};
  PyObject *lib_o = Py_None, *lib_b = NULL, *module = NULL;
  bh_gpu_obj *self = NULL;
  bh_gpu *gpu = NULL;
  char err[1024];
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Gpu", kwlist, &lib_o)) return NULL;
  if (lib_o != Py_None && !PyUnicode_FSConverter(lib_o, &lib_b)) return NULL;
  module = PyObject_GetAttrString((PyObject *)type, "_bh_module");
  if (!module) goto fail;
  const char *path = lib_b ? PyBytes_AsString(lib_b) : NULL;
  if (!path) {
    const char *env = getenv("BULKHEAD_NVML_LIBRARY");
    path = env && env[0] ? env : NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = bh_gpu_open_nvml(&gpu, path, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    probe_raise(bh_py_state(module), rc, "Gpu", err);
    goto fail;
  }
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  self = (bh_gpu_obj *)alloc(type, 0);
  if (!self) goto fail;
  self->gpu = gpu;
  gpu = NULL;
  self->module = module; /* takes the reference */
  module = NULL;
fail:
  if (gpu) bh_gpu_close(gpu);
  Py_XDECREF(module);
  Py_XDECREF(lib_b);
  return (PyObject *)self;
}

static int Gpu_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((bh_gpu_obj *)self)->module);
  return 0;
}

static void Gpu_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  PyObject_GC_UnTrack(self);
  if (g->gpu) {
    bh_gpu *gpu = g->gpu;
    g->gpu = NULL;
    Py_BEGIN_ALLOW_THREADS
    bh_gpu_close(gpu);
    Py_END_ALLOW_THREADS
  }
  Py_CLEAR(g->module);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static PyObject *Gpu_close(PyObject *self, PyObject *unused) {
  (void)unused;
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  if (g->busy) {
    PyErr_SetString(PyExc_RuntimeError, "Gpu.close() while another thread is reading it");
    return NULL;
  }
  bh_gpu *gpu = g->gpu;
  g->gpu = NULL;
  if (gpu) {
    Py_BEGIN_ALLOW_THREADS
    bh_gpu_close(gpu); /* nvmlShutdown may take a while */
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *Gpu_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  if (!gpu_live((bh_gpu_obj *)self)) return NULL;
  return bh_py_newref(self);
}

static PyObject *Gpu_exit(PyObject *self, PyObject *args) {
  (void)args;
  PyObject *r = Gpu_close(self, NULL);
  if (!r) return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static PyObject *Gpu_count(PyObject *self, PyObject *unused) {
  (void)unused;
  bh_gpu *gpu = gpu_live((bh_gpu_obj *)self);
  return gpu ? PyLong_FromLong(bh_gpu_count(gpu)) : NULL;
}

/* uuid(i) and name(i): the cached UUID or one short driver call. */
static PyObject *gpu_string(PyObject *self, PyObject *arg, int which) {
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  bh_gpu *gpu = gpu_live(g);
  if (!gpu) return NULL;
  long i = PyLong_AsLong(arg);
  if (i == -1 && PyErr_Occurred()) return NULL;
  if (i < INT32_MIN || i > INT32_MAX) i = -1;
  char buf[BH_GPU_UUID_MAX > BH_GPU_NAME_MAX ? BH_GPU_UUID_MAX : BH_GPU_NAME_MAX];
  int rc;
  g->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = which ? bh_gpu_name(gpu, (int)i, buf, sizeof buf) : bh_gpu_uuid(gpu, (int)i, buf, sizeof buf);
  Py_END_ALLOW_THREADS
  g->busy--;
  if (rc < 0) return probe_raise(gpu_state(g), rc, which ? "name" : "uuid", NULL);
  return PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
}

static PyObject *Gpu_uuid(PyObject *self, PyObject *arg) { return gpu_string(self, arg, 0); }
static PyObject *Gpu_name(PyObject *self, PyObject *arg) { return gpu_string(self, arg, 1); }

static PyObject *Gpu_find(PyObject *self, PyObject *args) {
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  const char *s;
  bh_gpu *gpu = gpu_live(g);
  if (!gpu || !PyArg_ParseTuple(args, "s:find", &s)) return NULL;
  int rc;
  g->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_gpu_find(gpu, s); /* a MIG UUID asks the driver */
  Py_END_ALLOW_THREADS
  g->busy--;
  if (rc < 0) return probe_raise(gpu_state(g), rc, "find", s);
  return PyLong_FromLong(rc);
}

static PyObject *Gpu_visible(PyObject *self, PyObject *args) {
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  const char *cvd;
  int ordinal, rc;
  bh_gpu *gpu = gpu_live(g);
  if (!gpu || !PyArg_ParseTuple(args, "zi:visible", &cvd, &ordinal)) return NULL;
  g->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_gpu_visible(gpu, cvd, ordinal);
  Py_END_ALLOW_THREADS
  g->busy--;
  if (rc < 0) {
    char what[160];
    snprintf(what, sizeof what, "CUDA_VISIBLE_DEVICES=%.100s%s, ordinal %d", cvd ? cvd : "(unset)",
             cvd && strlen(cvd) > 100 ? "..." : "", ordinal);
    return probe_raise(gpu_state(g), rc, "visible", what);
  }
  return PyLong_FromLong(rc);
}

static PyObject *Gpu_memory(PyObject *self, PyObject *args) {
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  int i, rc;
  bh_gpu_memory m;
  bh_gpu *gpu = gpu_live(g);
  if (!gpu || !PyArg_ParseTuple(args, "i:memory", &i)) return NULL;
  g->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_gpu_memory_read(gpu, i, &m);
  Py_END_ALLOW_THREADS
  g->busy--;
  if (rc < 0) return probe_raise(gpu_state(g), rc, "memory", NULL);
  return Py_BuildValue("(KKK)", (unsigned long long)m.total_bytes,
                       (unsigned long long)m.free_bytes, (unsigned long long)m.used_bytes);
}

static PyObject *Gpu_process_used(PyObject *self, PyObject *args) {
  bh_gpu_obj *g = (bh_gpu_obj *)self;
  int i, rc;
  long pid;
  uint64_t bytes = 0;
  bh_gpu *gpu = gpu_live(g);
  if (!gpu || !PyArg_ParseTuple(args, "il:process_used", &i, &pid)) return NULL;
  if (pid <= 0 || pid > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "pid must be a positive process id");
    return NULL;
  }
  g->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_gpu_process_used(gpu, i, (pid_t)pid, &bytes);
  Py_END_ALLOW_THREADS
  g->busy--;
  if (rc == -ENOTSUP || rc == -ENODATA) Py_RETURN_NONE;
  if (rc < 0) return probe_raise(gpu_state(g), rc, "process_used", NULL);
  return PyLong_FromUnsignedLongLong(bytes);
}

static PyObject *Gpu_backend(PyObject *self, void *c) {
  (void)c;
  bh_gpu *gpu = gpu_live((bh_gpu_obj *)self);
  return gpu ? PyUnicode_FromString(bh_gpu_backend_name(gpu)) : NULL;
}

static PyObject *Gpu_closed(PyObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(((bh_gpu_obj *)self)->gpu == NULL);
}

static PyMethodDef Gpu_methods[] = {
    {"count", Gpu_count, METH_NOARGS, "count() -> number of devices NVML enumerates"},
    {"uuid", Gpu_uuid, METH_O, "uuid(i) -> 'GPU-...'"},
    {"name", Gpu_name, METH_O, "name(i) -> 'NVIDIA H200'"},
    {"find", Gpu_find, METH_VARARGS,
     "find(uuid_or_prefix) -> index; a prefix must be unique; a full MIG UUID gets an index\n"
     "after the physical devices"},
    {"visible", Gpu_visible, METH_VARARGS,
     "visible(cuda_visible_devices: str | None, ordinal) -> index of CUDA device `ordinal`\n"
     "under CUDA's rules for CUDA_VISIBLE_DEVICES (None: unset).  Plain integers assume\n"
     "CUDA_DEVICE_ORDER=PCI_BUS_ID; prefer find(torch's UUID)."},
    {"memory", Gpu_memory, METH_VARARGS, "memory(i) -> (total, free, used) bytes, read now"},
    {"process_used", Gpu_process_used, METH_VARARGS,
     "process_used(i, pid) -> bytes pid holds on device i (0: none), or None when the\n"
     "driver cannot tell"},
    {"close", Gpu_close, METH_NOARGS, "nvmlShutdown and unload; idempotent"},
    {"__enter__", Gpu_enter, METH_NOARGS, NULL},
    {"__exit__", Gpu_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Gpu_getset[] = {
    {"backend", Gpu_backend, NULL, "the backend's name ('nvml')", NULL},
    {"closed", Gpu_closed, NULL, "True after close()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Gpu_slots[] = {
    {Py_tp_new, Gpu_new},
    {Py_tp_dealloc, Gpu_dealloc},
    {Py_tp_traverse, Gpu_traverse},
    {Py_tp_methods, Gpu_methods},
    {Py_tp_getset, Gpu_getset},
    {Py_tp_doc,
     "Gpu(library=None): NVML, loaded in this process.\n\n"
     "library: a path to load exactly; None: $BULKHEAD_NVML_LIBRARY if set, else the\n"
     "default search (libnvidia-ml.so.1, then libnvidia-ml.so).  Raises DriverUnavailable\n"
     "(errname 'BH_ENODRIVER') when there is no usable driver."},
    {0, NULL}};

PyType_Spec bh_gpu_spec = {"bulkhead._native.Gpu", sizeof(bh_gpu_obj), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Gpu_slots};

int bh_py_probe_exec(PyObject *module, bh_state *st) {
  return PyObject_SetAttrString((PyObject *)st->Gpu, "_bh_module", module);
}

PyObject *bh_py_ram(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"root", NULL};
  PyObject *root_o = Py_None, *root_b = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:ram", kwlist, &root_o)) return NULL;
  if (root_o != Py_None && !PyUnicode_FSConverter(root_o, &root_b)) return NULL;
  const char *root = root_b ? PyBytes_AsString(root_b) : NULL;
  bh_ram_reading r;
  char err[1024];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_ram_read(root, &r, err, sizeof err);
  Py_END_ALLOW_THREADS
  Py_XDECREF(root_b);
  if (rc < 0) return probe_raise(bh_py_state(module), rc, "ram", err);
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:i,s:N,s:K,s:K,s:K,s:K,s:N}",
      "total_bytes", (unsigned long long)r.total_bytes,
      "available_bytes", (unsigned long long)r.available_bytes,
      "meminfo_total_bytes", (unsigned long long)r.meminfo_total_bytes,
      "meminfo_available_bytes", (unsigned long long)r.meminfo_available_bytes,
      "cgroup_version", r.cgroup_version,
      "limited", PyBool_FromLong(r.limited),
      "cgroup_limit_bytes", (unsigned long long)r.cgroup_limit_bytes,
      "cgroup_current_bytes", (unsigned long long)r.cgroup_current_bytes,
      "cgroup_reclaimable_bytes", (unsigned long long)r.cgroup_reclaimable_bytes,
      "swap_total_bytes", (unsigned long long)r.swap_total_bytes,
      "pcp_free_bytes", r.pcp_valid ? PyLong_FromUnsignedLongLong(r.pcp_free_bytes) : bh_py_newref(Py_None));
}
