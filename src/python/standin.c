/*
 * standin.c -- StandIn: the object bulkhead puts into ComfyUI's
 * current_loaded_models for each model a worker holds, and RemoteModel,
 * what its .model points at.
 *
 * ComfyUI's memory manager reads members off a ledger entry's patcher in
 * the middle of its eviction and load loops; nothing declares which.  The
 * stand-in answers exactly the 18 members of COMFY_SURFACE (seed 000) and
 * nothing else: any other name raises AttributeError naming the member and
 * COMFY_SURFACE, so upstream drift fails loudly on the member it reads
 * instead of working on a wrong answer.  bulkhead's own operations on a
 * stand-in are module functions (standin_info, standin_retire), so they do
 * not widen the surface.
 *
 * Residency is a live reading: loaded_size() reads the worker's record in
 * the shared ledger (a seqlock read, no IPC, no GIL release), so it is
 * right after the worker released on its own (idle sweep, another host's
 * ask) and not the last receipt.  Actions go to the owner, the host-side
 * runtime of the worker (python/bulkhead/host/memory.py):
 *     owner.standin_release(model_id, nbytes or None)   RELEASE partial/full
 *     owner.standin_load(model_id, nbytes) -> int       load more
 *     owner.standin_pressure(model_id, nbytes)          async ask to idle siblings
 * Arguments are obeyed exactly (policy.h: 0.1 is nothing, 1e32 is all,
 * floats accepted).  On an eviction path a failing or dead worker counts
 * as freed and never raises into upstream's loop: the error is reported
 * as unraisable and the stand-in answers as if the model were gone.
 */
#include "common.h"

#include "bulkhead/ledger.h"
#include "bulkhead/policy.h"
#include "src/core/internal.h" /* bh__proc_start_time, bh__alive */

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <structmember.h>
#include <sys/wait.h>
#include <time.h>

static const char *const surface[] = {
    "load_device", "offload_device", "parent", "model", "model_size", "loaded_size",
    "current_loaded_device", "model_dtype", "model_patches_to", "model_patches_models",
    "partially_load", "partially_unload", "detach", "lowvram_patch_counter", "is_dynamic",
    "is_clone", "clone_base_uuid", "get_nested_additional_models", NULL};

typedef struct {
  PyObject_HEAD
  PyObject *weakreflist;
  PyObject *owner;          /* host runtime of the worker; NULL once retired */
  PyObject *module;         /* bulkhead._native, for its state */
  PyObject *ledger;         /* the Ledger object (its core handle is looked
                               up on every read: it may have been closed) */
  pid_t pid;                /* worker whose record holds the model */
  uint64_t start_time;      /* its start time (/proc), 0 when unreadable */
  int64_t proc_checked_ns;  /* when start_time was last compared (coarse clock; 0: never) */
  int proc_alive;           /* what that comparison said */
  int not_child;            /* waitid said ECHILD: kill(pid, 0) from then on */
  uint64_t model_id;
  uint32_t generation;
  int slot_hint;
  int retired;              /* the worker's generation ended */
  uint64_t size_bytes;      /* last size seen, answered once retired */
  PyObject *name;
  PyObject *model;          /* RemoteModel (or subclass) */
  PyObject *load_device, *offload_device, *dtype, *clone_base_uuid;
} standin_obj;

/* ------------------------------------------------------------ RemoteModel */

typedef struct {
  PyObject_HEAD
  PyObject *weakreflist;
  PyObject *dict;
} remote_model_obj;

static int RemoteModel_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(((remote_model_obj *)self)->dict);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int RemoteModel_clear(PyObject *self) {
  Py_CLEAR(((remote_model_obj *)self)->dict);
  return 0;
}

static void RemoteModel_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (((remote_model_obj *)self)->weakreflist) PyObject_ClearWeakRefs(self);
  RemoteModel_clear(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static PyMemberDef RemoteModel_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(remote_model_obj, weakreflist), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(remote_model_obj, dict), READONLY, NULL},
    {NULL, 0, 0, 0, NULL}};

static PyType_Slot RemoteModel_slots[] = {
    {Py_tp_dealloc, RemoteModel_dealloc},
    {Py_tp_traverse, RemoteModel_traverse},
    {Py_tp_clear, RemoteModel_clear},
    {Py_tp_members, RemoteModel_members},
    {Py_tp_doc, "What a StandIn's .model is: a model that lives in a worker.  The glue\n"
                "subclasses it per real class name, so ComfyUI's 'Unloading <name>' log\n"
                "names the worker's model class."},
    {0, NULL}};

PyType_Spec bh_remote_model_spec = {"bulkhead._native.RemoteModel", sizeof(remote_model_obj), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                                    RemoteModel_slots};

/* --------------------------------------------------------------- StandIn */

static int StandIn_traverse(PyObject *self, visitproc visit, void *arg) {
  standin_obj *s = (standin_obj *)self;
  Py_VISIT(s->owner);
  Py_VISIT(s->module);
  Py_VISIT(s->ledger);
  Py_VISIT(s->name);
  Py_VISIT(s->model);
  Py_VISIT(s->load_device);
  Py_VISIT(s->offload_device);
  Py_VISIT(s->dtype);
  Py_VISIT(s->clone_base_uuid);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int StandIn_clear(PyObject *self) {
  standin_obj *s = (standin_obj *)self;
  Py_CLEAR(s->owner);
  Py_CLEAR(s->module);
  Py_CLEAR(s->ledger);
  Py_CLEAR(s->name);
  Py_CLEAR(s->model);
  Py_CLEAR(s->load_device);
  Py_CLEAR(s->offload_device);
  Py_CLEAR(s->dtype);
  Py_CLEAR(s->clone_base_uuid);
  return 0;
}

static void StandIn_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (((standin_obj *)self)->weakreflist) PyObject_ClearWeakRefs(self);
  StandIn_clear(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

/* standin(owner, ledger, pid, model_id, *, generation, name, size_bytes,
 *         model, load_device, offload_device, dtype=None, clone_base_uuid=None)
 * A module function rather than tp_new: the limited API of 3.9 has no
 * PyType_GetModule, and the stand-in needs the module's state. */
PyObject *bh_py_standin_new(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"owner", "ledger", "pid", "model_id", "generation", "name",
                           "size_bytes", "model", "load_device", "offload_device", "dtype",
                           "clone_base_uuid", NULL};
  PyObject *owner, *ledger, *name, *model, *load_device, *offload_device;
  PyObject *dtype = Py_None, *uuid = Py_None;
  int pid;
  unsigned long long model_id, size_bytes;
  unsigned long generation;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiKkUKOOO|OO", kwlist, &owner, &ledger, &pid,
                                   &model_id, &generation, &name, &size_bytes, &model,
                                   &load_device, &offload_device, &dtype, &uuid))
    return NULL;
  bh_state *st = bh_py_state(module);
  PyTypeObject *tp = st->StandIn;
  if (!bh_py_ledger_get(st, ledger)) return NULL;
  if (!PyObject_TypeCheck(model, st->RemoteModel)) {
    PyErr_Format(PyExc_TypeError, "standin(model=...) must be a RemoteModel, not %R",
                 (PyObject *)Py_TYPE(model));
    return NULL;
  }
  if (pid <= 0) {
    PyErr_SetString(PyExc_ValueError, "standin(pid=...) must be a worker's pid (> 0)");
    return NULL;
  }
  allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
  standin_obj *s = (standin_obj *)alloc(tp, 0);
  if (!s) return NULL;
  s->owner = bh_py_newref(owner);
  s->ledger = bh_py_newref(ledger);
  s->module = bh_py_newref(module);
  s->pid = (pid_t)pid;
  if (bh__proc_start_time(s->pid, &s->start_time) < 0) s->start_time = 0;
  s->model_id = model_id;
  s->generation = (uint32_t)generation;
  s->slot_hint = -1;
  s->size_bytes = size_bytes;
  s->name = bh_py_newref(name);
  s->model = bh_py_newref(model);
  s->load_device = bh_py_newref(load_device);
  s->offload_device = bh_py_newref(offload_device);
  s->dtype = bh_py_newref(dtype);
  s->clone_base_uuid = bh_py_newref(uuid);
  return (PyObject *)s;
}

/* The live reading.  A retired stand-in, a record that is gone (worker
 * dead, reaped), a worker that has died (its record stays until the next
 * reap, but its memory is gone now: a zombie counts as dead) or a model
 * the worker dropped all read as 0 resident; *size keeps the last size
 * seen.  The liveness check (one /proc read) runs only while the record
 * says something is resident. */
/* Whether the stand-in's worker is still there, cheaply enough for
 * ComfyUI's loops (they read loaded_size per model, pass after pass) and
 * at once: one syscall per read.  A child of ours (a worker is the host's)
 * that exited, a zombie not reaped yet, is seen by waitid without reaping
 * it; another process's end by kill(pid, 0).  A pid reused by another
 * process is seen by its start time in /proc (a read that costs ~10 us)
 * at most once a second. */
#define BH__PROC_CHECK_NS 1000000000LL

static int worker_alive(standin_obj *s) {
  if (!s->not_child) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)s->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0) {
      if (si.si_pid != 0) return 0;
    } else if (errno == ECHILD) {
      s->not_child = 1;
    }
  }
  if (s->not_child && kill(s->pid, 0) < 0 && errno == ESRCH) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
  if (s->proc_checked_ns == 0 || now - s->proc_checked_ns >= BH__PROC_CHECK_NS) {
    s->proc_checked_ns = now ? now : 1;
    s->proc_alive = bh__alive(s->pid, s->start_time);
  }
  return s->proc_alive;
}

static void read_residency(standin_obj *s, uint64_t *size, uint64_t *resident) {
  *size = s->size_bytes;
  *resident = 0;
  if (s->retired || s->ledger == NULL) return;
  bh_ledger *led = bh_py_ledger_get(bh_py_state(s->module), s->ledger);
  if (led == NULL) { /* closed: nothing can be read any more */
    PyErr_Clear();
    return;
  }
  uint64_t sz, res;
  if (bh_ledger_model_read(led, s->pid, s->model_id, &s->slot_hint, &sz, &res) == 0) {
    s->size_bytes = sz;
    *size = sz;
    if (res > 0 && s->start_time != 0 && !worker_alive(s)) res = 0;
    *resident = res;
  }
}

static PyObject *surface_error(PyObject *name) {
  PyErr_Format(PyExc_AttributeError,
               "StandIn has no member %R: a bulkhead stand-in answers only the %d members of "
               "COMFY_SURFACE (bulkhead._native.COMFY_SURFACE).  ComfyUI read something new "
               "off a ledger entry; run `bulkhead canary <ComfyUI dir>` to see what changed.",
               name, (int)(sizeof surface / sizeof surface[0] - 1));
  return NULL;
}

static PyObject *StandIn_getattro(PyObject *self, PyObject *name) {
  PyObject *r = PyObject_GenericGetAttr(self, name);
  if (r || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
  PyErr_Clear();
  return surface_error(name);
}

static int StandIn_setattro(PyObject *self, PyObject *name, PyObject *value) {
  (void)self, (void)value;
  PyErr_Format(PyExc_AttributeError,
               "StandIn is read-only: cannot set %R (a stand-in's state lives in its worker "
               "and the shared ledger; see COMFY_SURFACE)",
               name);
  return -1;
}

/* Reports an exception from the owner on an eviction path without letting
 * it into upstream's loop.  (The owner itself treats a dead worker as
 * freed and returns normally; what reaches here is a bug worth seeing.) */
static void swallow(standin_obj *s, const char *what) {
  if (!PyErr_Occurred()) return;
  PyObject *ctx = PyUnicode_FromFormat("bulkhead stand-in %U %s", s->name, what);
  PyErr_WriteUnraisable(ctx ? ctx : (PyObject *)s);
  Py_XDECREF(ctx);
}

static PyObject *StandIn_model_size(PyObject *self, PyObject *unused) {
  (void)unused;
  uint64_t size, resident;
  read_residency((standin_obj *)self, &size, &resident);
  return PyLong_FromUnsignedLongLong(size);
}

static PyObject *StandIn_loaded_size(PyObject *self, PyObject *unused) {
  (void)unused;
  uint64_t size, resident;
  read_residency((standin_obj *)self, &size, &resident);
  return PyLong_FromUnsignedLongLong(resident);
}

static PyObject *StandIn_current_loaded_device(PyObject *self, PyObject *unused) {
  (void)unused;
  standin_obj *s = (standin_obj *)self;
  uint64_t size, resident;
  read_residency(s, &size, &resident);
  return bh_py_newref(resident > 0 ? s->load_device : s->offload_device);
}

static PyObject *StandIn_model_dtype(PyObject *self, PyObject *unused) {
  (void)unused;
  return bh_py_newref(((standin_obj *)self)->dtype);
}

/* model_patches_to(device): nothing to move, the patches live in the worker. */
static PyObject *StandIn_model_patches_to(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device", NULL};
  PyObject *device;
  (void)self;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:model_patches_to", kwlist, &device)) return NULL;
  Py_RETURN_NONE;
}

static PyObject *return_empty_list(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyList_New(0);
}

static PyObject *StandIn_lowvram_patch_counter(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyLong_FromLong(0);
}

static PyObject *StandIn_is_dynamic(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  Py_RETURN_FALSE;
}

/* is_clone(other): True for itself (upstream's load_models_gpu re-registers
 * entries that are clones of the incoming model; a stand-in that is not
 * its own clone gets inserted twice) and for anything sharing its .model. */
static PyObject *StandIn_is_clone(PyObject *self, PyObject *other) {
  if (other == self) Py_RETURN_TRUE;
  standin_obj *s = (standin_obj *)self;
  PyObject *m = PyObject_GetAttrString(other, "model");
  if (!m) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  int same = m == s->model;
  Py_DECREF(m);
  return PyBool_FromLong(same);
}

/* A float argument as ComfyUI passes them: int, float, anything with
 * __float__; an int too large for a double is "everything". */
static int float_arg(PyObject *o, double *out) {
  *out = PyFloat_AsDouble(o);
  if (*out != -1.0 || !PyErr_Occurred()) return 0;
  if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
  PyErr_Clear();
  PyObject *zero = PyLong_FromLong(0);
  int negative = zero ? PyObject_RichCompareBool(o, zero, Py_LT) : -1;
  Py_XDECREF(zero);
  if (negative < 0) return -1;
  *out = negative ? -HUGE_VAL : HUGE_VAL;
  return 0;
}

/* owner.method(model_id, nbytes or None): new reference, NULL with an
 * exception; None without calling anything once retired (no owner). */
static PyObject *call_owner(standin_obj *s, const char *method, uint64_t nbytes, int full) {
  if (!s->owner) return bh_py_newref(Py_None);
  PyObject *n = full ? bh_py_newref(Py_None) : PyLong_FromUnsignedLongLong(nbytes);
  if (!n) return NULL;
  PyObject *id = PyLong_FromUnsignedLongLong(s->model_id);
  PyObject *r = id ? PyObject_CallMethod(s->owner, method, "OO", id, n) : NULL;
  Py_XDECREF(id);
  Py_DECREF(n);
  return r;
}

/* partially_load(device_to, extra_memory=0, force_patch_weights=False) ->
 * bytes loaded.  0.1 ("essentially nothing") sends nothing. */
static PyObject *StandIn_partially_load(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device_to", "extra_memory", "force_patch_weights", NULL};
  PyObject *device, *extra = NULL, *force = Py_False;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO", kwlist, &device, &extra, &force)) return NULL;
  standin_obj *s = (standin_obj *)self;
  double x = 0;
  if (extra && float_arg(extra, &x) < 0) return NULL;
  uint64_t size, before;
  read_residency(s, &size, &before);
  uint64_t want = bh_policy_load_bytes(x, size, before);
  if (want == 0 || s->retired) return PyLong_FromLong(0);
  PyObject *r = call_owner(s, "standin_load", want, 0);
  if (!r) return NULL; /* loading is not an eviction path: errors surface */
  Py_DECREF(r);
  uint64_t after;
  read_residency(s, &size, &after);
  return PyLong_FromUnsignedLongLong(after > before ? after - before : 0);
}

/* partially_unload(device_to, memory_to_free=0, force_patch_weights=False)
 * -> bytes actually freed (residency before minus after).  Asks for
 * exactly memory_to_free bytes; what its worker could not free is handed
 * to the owner's pressure hook, which posts it to idle siblings without
 * waiting (upstream's next re-measure sees what they freed).  Posting the
 * whole ask up front would free it twice. */
static PyObject *StandIn_partially_unload(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device_to", "memory_to_free", "force_patch_weights", NULL};
  PyObject *device, *amount = NULL, *force = Py_False;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO", kwlist, &device, &amount, &force)) return NULL;
  standin_obj *s = (standin_obj *)self;
  double x = 0;
  if (amount && float_arg(amount, &x) < 0) return NULL;
  uint64_t size, before;
  read_residency(s, &size, &before);
  uint64_t want = bh_policy_unload_bytes(x, before);
  if (want == 0) return PyLong_FromLong(0);
  PyObject *r = call_owner(s, "standin_release", want, 0);
  if (r) Py_DECREF(r);
  else swallow(s, "partial release");
  uint64_t after;
  read_residency(s, &size, &after);
  uint64_t freed = bh_policy_freed(before, after);
  uint64_t asked = bh_policy_unload_bytes(x, UINT64_MAX);
  if (freed < asked) {
    r = call_owner(s, "standin_pressure", asked - freed, 0);
    if (r) Py_DECREF(r);
    else swallow(s, "pressure hook");
  }
  return PyLong_FromUnsignedLongLong(freed);
}

/* detach(unpatch_all=True): a full release of the model; with
 * unpatch_all=False it is upstream's bookkeeping (load_models_gpu
 * re-registering clones) and sends nothing.  Returns .model, as upstream. */
static PyObject *StandIn_detach(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"unpatch_all", NULL};
  PyObject *unpatch_all = Py_True;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &unpatch_all)) return NULL;
  standin_obj *s = (standin_obj *)self;
  int full = PyObject_IsTrue(unpatch_all);
  if (full < 0) return NULL;
  if (full && !s->retired) {
    PyObject *r = call_owner(s, "standin_release", 0, 1);
    if (r) Py_DECREF(r);
    else swallow(s, "full release");
  }
  return bh_py_newref(s->model);
}

static PyObject *StandIn_repr(PyObject *self) {
  standin_obj *s = (standin_obj *)self;
  uint64_t size, resident;
  read_residency(s, &size, &resident);
  return PyUnicode_FromFormat("<bulkhead StandIn %U (model %llu of worker pid %d, gen %lu%s): "
                              "%llu of %llu bytes resident>",
                              s->name, (unsigned long long)s->model_id, (int)s->pid,
                              (unsigned long)s->generation, s->retired ? ", retired" : "",
                              (unsigned long long)resident, (unsigned long long)size);
}

static PyObject *get_field(PyObject *self, void *offset) {
  PyObject *v = *(PyObject **)((char *)self + (size_t)offset);
  return bh_py_newref(v ? v : Py_None);
}

static PyObject *get_none(PyObject *self, void *c) {
  (void)self, (void)c;
  Py_RETURN_NONE;
}

#define FIELD(f) ((void *)offsetof(standin_obj, f))

static PyGetSetDef StandIn_getset[] = {
    {"load_device", get_field, NULL, "Device the worker's model loads to.", FIELD(load_device)},
    {"offload_device", get_field, NULL, "Device it goes to when released.", FIELD(offload_device)},
    {"model", get_field, NULL, "The RemoteModel (weakref-able; ComfyUI logs its class name).",
     FIELD(model)},
    {"clone_base_uuid", get_field, NULL, "Clone family id.", FIELD(clone_base_uuid)},
    {"parent", get_none, NULL, "Always None: a stand-in is nobody's clone.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

/* Each docstring opens with its __text_signature__ ("name($self, ...)\n--\n\n"):
 * inspect.signature reads it, and so does the canary (python/bulkhead/
 * cli/canary.py), which checks upstream's calls against exactly these
 * parameters.  Keep each in step with the method's argument parsing
 * (tests/py/test_standin.py calls every method as its signature says). */
#define SIG(name, params, doc) name "($self" params ")\n--\n\n" doc

static PyMethodDef StandIn_methods[] = {
    {"model_size", StandIn_model_size, METH_NOARGS, SIG("model_size", ", /", "Bytes of the whole model.")},
    {"loaded_size", StandIn_loaded_size, METH_NOARGS,
     SIG("loaded_size", ", /", "Bytes resident on the load device now (read from the shared ledger).")},
    {"current_loaded_device", StandIn_current_loaded_device, METH_NOARGS,
     SIG("current_loaded_device", ", /", "load_device while anything is resident, else offload_device.")},
    {"model_dtype", StandIn_model_dtype, METH_NOARGS, SIG("model_dtype", ", /", "The dtype given at creation.")},
    {"model_patches_to", (PyCFunction)(void (*)(void))StandIn_model_patches_to, METH_VARARGS | METH_KEYWORDS,
     SIG("model_patches_to", ", /, device", "Nothing to move: the patches live in the worker.")},
    {"model_patches_models", return_empty_list, METH_NOARGS,
     SIG("model_patches_models", ", /", "[]: a worker's model patches stay in the worker.")},
    {"get_nested_additional_models", return_empty_list, METH_NOARGS,
     SIG("get_nested_additional_models", ", /", "[]: nothing nested.")},
    {"partially_load", (PyCFunction)(void (*)(void))StandIn_partially_load, METH_VARARGS | METH_KEYWORDS,
     SIG("partially_load", ", /, device_to, extra_memory=0, force_patch_weights=False",
         "Loads extra_memory more bytes in the worker; returns the bytes loaded.")},
    {"partially_unload", (PyCFunction)(void (*)(void))StandIn_partially_unload, METH_VARARGS | METH_KEYWORDS,
     SIG("partially_unload", ", /, device_to, memory_to_free=0, force_patch_weights=False",
         "Frees memory_to_free bytes in the worker; returns the bytes freed.")},
    {"detach", (PyCFunction)(void (*)(void))StandIn_detach, METH_VARARGS | METH_KEYWORDS,
     SIG("detach", ", /, unpatch_all=True", "A full release (unpatch_all=False: nothing); returns .model.")},
    {"lowvram_patch_counter", StandIn_lowvram_patch_counter, METH_NOARGS,
     SIG("lowvram_patch_counter", ", /", "0: no lowvram patches on this side.")},
    {"is_dynamic", StandIn_is_dynamic, METH_NOARGS,
     SIG("is_dynamic", ", /", "False: keeps it evictable and out of pin paths.")},
    {"is_clone", StandIn_is_clone, METH_O,
     SIG("is_clone", ", other, /", "True for itself and for anything sharing its .model.")},
    {NULL, NULL, 0, NULL}};

static PyMemberDef StandIn_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(standin_obj, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL}};

static PyType_Slot StandIn_slots[] = {
    {Py_tp_dealloc, StandIn_dealloc},
    {Py_tp_traverse, StandIn_traverse},
    {Py_tp_clear, StandIn_clear},
    {Py_tp_getattro, StandIn_getattro},
    {Py_tp_setattro, StandIn_setattro},
    {Py_tp_repr, StandIn_repr},
    {Py_tp_getset, StandIn_getset},
    {Py_tp_methods, StandIn_methods},
    {Py_tp_members, StandIn_members},
    {Py_tp_doc, "A model held by a bulkhead worker, as ComfyUI's memory manager sees it."},
    {0, NULL}};

PyType_Spec bh_standin_spec = {"bulkhead._native.StandIn", sizeof(standin_obj), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, StandIn_slots};

/* ------------------------------------------------- bulkhead's own access */

static standin_obj *as_standin(PyObject *module, PyObject *o) {
  bh_state *st = bh_py_state(module);
  if (!PyObject_TypeCheck(o, st->StandIn)) {
    PyErr_Format(PyExc_TypeError, "expected a StandIn, not %R", (PyObject *)Py_TYPE(o));
    return NULL;
  }
  return (standin_obj *)o;
}

/* standin_info(s) -> dict: what bulkhead itself needs to know. */
PyObject *bh_py_standin_info(PyObject *module, PyObject *o) {
  standin_obj *s = as_standin(module, o);
  if (!s) return NULL;
  uint64_t size, resident;
  read_residency(s, &size, &resident);
  return Py_BuildValue("{s:i,s:K,s:k,s:O,s:K,s:K,s:O,s:O}", "pid", (int)s->pid, "model_id",
                       (unsigned long long)s->model_id, "generation", (unsigned long)s->generation,
                       "name", s->name, "size_bytes", (unsigned long long)size, "resident_bytes",
                       (unsigned long long)resident, "retired", s->retired ? Py_True : Py_False,
                       "owner", s->owner ? s->owner : Py_None);
}

/* standin_retire(s): its worker's generation ended.  From now on it reads
 * 0 resident, sends nothing, and drops its owner (no cycle to the pool: a
 * retired stand-in that upstream still lists keeps no worker alive). */
PyObject *bh_py_standin_retire(PyObject *module, PyObject *o) {
  standin_obj *s = as_standin(module, o);
  if (!s) return NULL;
  s->retired = 1;
  Py_CLEAR(s->owner);
  Py_RETURN_NONE;
}

/* COMFY_SURFACE as a tuple of str. */
PyObject *bh_py_comfy_surface(void) {
  Py_ssize_t n = 0;
  while (surface[n]) n++;
  PyObject *t = PyTuple_New(n);
  for (Py_ssize_t i = 0; t && i < n; i++) {
    PyObject *s = PyUnicode_FromString(surface[i]);
    if (!s) {
      Py_CLEAR(t);
      break;
    }
    PyTuple_SetItem(t, i, s);
  }
  return t;
}
