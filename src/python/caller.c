/*
 * caller.c (binding) -- the Caller type: the base of host.Worker, whose
 * call() runs in C from the argument tuple to the result.
 *
 * A trivial call is a few microseconds, and the Python glue around
 * Channel.request (a method frame, the lock as a context manager, the busy
 * count, try/finally) was a fifth of it.  Caller.call does the same steps
 * in C on the state host.Worker keeps in Caller's slots: take the worker
 * lock (threading.RLock, so Python code shares it unchanged), count the
 * request as busy, send and wait on the generation's Channel, undo.  What
 * is not the plain path stays in Python: a worker that is not running
 * (Worker._call_slow starts it), a channel that failed
 * (Worker._request_failed: a rerun on the next generation, or the error
 * that names the worker), handles to tidy after the outermost request
 * (Worker._after_request).
 */
#include "common.h"

#include <stddef.h>

typedef struct {
  PyObject_HEAD
  PyObject *chan;             /* the running generation's Channel, or NULL */
  PyObject *peer;             /* its Peer, or NULL */
  PyObject *lock;             /* threading.RLock, or NULL */
  PyObject *acquire, *release; /* the lock's bound methods */
  PyObject *timeout;          /* call_timeout: NULL for None, or seconds */
  Py_ssize_t busy;            /* requests in flight, nested ones counted */
} bh_caller_obj;

static int Caller_traverse(PyObject *op, visitproc visit, void *arg) {
  bh_caller_obj *self = (bh_caller_obj *)op;
  Py_VISIT(Py_TYPE(op));
  Py_VISIT(self->chan);
  Py_VISIT(self->peer);
  Py_VISIT(self->lock);
  Py_VISIT(self->acquire);
  Py_VISIT(self->release);
  Py_VISIT(self->timeout);
  return 0;
}

static int Caller_clear(PyObject *op) {
  bh_caller_obj *self = (bh_caller_obj *)op;
  Py_CLEAR(self->chan);
  Py_CLEAR(self->peer);
  Py_CLEAR(self->lock);
  Py_CLEAR(self->acquire);
  Py_CLEAR(self->release);
  Py_CLEAR(self->timeout);
  return 0;
}

static void Caller_dealloc(PyObject *op) {
  PyTypeObject *tp = Py_TYPE(op);
  PyObject_GC_UnTrack(op);
  Caller_clear(op);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(op);
  Py_DECREF(tp);
}

/* The getter of every object slot (closure: the slot's offset): None for
 * NULL.  New reference. */
static PyObject *Caller_get_slot(PyObject *op, void *offset) {
  PyObject *v = *(PyObject **)((char *)op + (size_t)offset);
  return bh_py_newref(v ? v : Py_None);
}

/* Stores v (None: NULL) in *slot. */
static void slot_set(PyObject **slot, PyObject *v) {
  PyObject *old = *slot;
  *slot = v && v != Py_None ? bh_py_newref(v) : NULL;
  Py_XDECREF(old);
}

static int refuse_delete(PyObject *v, const char *name) {
  if (v) return 0;
  PyErr_Format(PyExc_AttributeError, "Worker.%s cannot be deleted (set it to None)", name);
  return -1;
}

static int Caller_set_chan(PyObject *op, PyObject *v, void *c) {
  (void)c;
  if (refuse_delete(v, "_chan") < 0) return -1;
  if (v != Py_None && !bh_py_is_channel(v)) {
    PyErr_Format(PyExc_TypeError, "Worker._chan must be a bulkhead._native.Channel or None, not %R",
                 (PyObject *)Py_TYPE(v));
    return -1;
  }
  slot_set(&((bh_caller_obj *)op)->chan, v);
  return 0;
}

static int Caller_set_peer(PyObject *op, PyObject *v, void *c) {
  (void)c;
  if (refuse_delete(v, "_peer") < 0) return -1;
  slot_set(&((bh_caller_obj *)op)->peer, v);
  return 0;
}

/* The lock's acquire and release are looked up once, here. */
static int Caller_set_lock(PyObject *op, PyObject *v, void *c) {
  (void)c;
  bh_caller_obj *self = (bh_caller_obj *)op;
  if (refuse_delete(v, "_lock") < 0) return -1;
  PyObject *acquire = NULL, *release = NULL;
  if (v != Py_None && (!(acquire = PyObject_GetAttrString(v, "acquire")) ||
                       !(release = PyObject_GetAttrString(v, "release")))) {
    Py_XDECREF(acquire);
    return -1;
  }
  PyObject *old_acquire = self->acquire, *old_release = self->release;
  slot_set(&self->lock, v);
  self->acquire = acquire;
  self->release = release;
  Py_XDECREF(old_acquire);
  Py_XDECREF(old_release);
  return 0;
}

static int Caller_set_timeout(PyObject *op, PyObject *v, void *c) {
  (void)c;
  if (refuse_delete(v, "call_timeout") < 0) return -1;
  if (v != Py_None) {
    double s = PyFloat_AsDouble(v);
    if (s == -1.0 && PyErr_Occurred()) return -1;
  }
  slot_set(&((bh_caller_obj *)op)->timeout, v);
  return 0;
}

static PyObject *Caller_get_busy(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromSsize_t(((bh_caller_obj *)op)->busy);
}

static int Caller_set_busy(PyObject *op, PyObject *v, void *c) {
  (void)c;
  if (refuse_delete(v, "busy") < 0) return -1;
  Py_ssize_t n = PyLong_AsSsize_t(v);
  if (n == -1 && PyErr_Occurred()) return -1;
  ((bh_caller_obj *)op)->busy = n;
  return 0;
}

/* A step after the request failed (an exception is set): it becomes the
 * outcome when the request succeeded, else it is reported unraisable and
 * the request's own error stands. */
static void step_failed(PyObject **out, PyObject **t, PyObject **v, PyObject **tb, PyObject *where) {
  if (*out) {
    Py_CLEAR(*out);
    PyErr_Fetch(t, v, tb);
  } else {
    PyErr_WriteUnraisable(where);
  }
}

/* Whether the outermost request left anything for _after_request: handles
 * the peer exported for it, releases to tell the worker.  -1 on error. */
static int peer_has_leftovers(bh_state *st, PyObject *peer) {
  PyObject *names[] = {st->str_exports, st->str_pending_releases};
  for (int i = 0; i < 2; i++) {
    PyObject *v = PyObject_GetAttr(peer, names[i]);
    int t = v ? PyObject_IsTrue(v) : -1;
    Py_XDECREF(v);
    if (t != 0) return t;
  }
  return 0;
}

/* The request on a locked, running worker: send, wait, and what a channel
 * failure becomes.  New reference, or NULL with an exception. */
static PyObject *caller_request(bh_caller_obj *self, PyObject *chan, PyObject *target, PyObject *payload) {
  int err;
  int64_t deadline = bh_py_deadline_of(self->timeout, &err);
  if (err) return NULL;
  PyObject *out = bh_py_channel_request(chan, BH_KIND_CALL, payload, deadline);
  if (out || !PyErr_ExceptionMatches(bh_py_channel_state(chan)->Error)) return out;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  out = PyObject_CallMethod((PyObject *)self, "_request_failed", "OiOOsO", value ? value : Py_None,
                            BH_KIND_CALL, payload, self->timeout ? self->timeout : Py_None, "call",
                            target);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return out;
}

static PyObject *Caller_call(PyObject *op, PyObject *args, PyObject *kw) {
  bh_caller_obj *self = (bh_caller_obj *)op;
  Py_ssize_t n = PyTuple_Size(args);
  if (n < 1) {
    PyErr_SetString(PyExc_TypeError, "Worker.call() needs a target: 'module:function' or 'module.function'");
    return NULL;
  }
  PyObject *target = PyTuple_GetItem(args, 0);
  PyObject *rest = PyTuple_GetSlice(args, 1, n);
  PyObject *kwargs = kw ? bh_py_newref(kw) : PyDict_New();
  PyObject *payload = rest && kwargs ? PyTuple_Pack(3, target, rest, kwargs) : NULL;
  PyObject *out = NULL;
  if (!payload) goto done;
  if (!self->chan || !self->acquire) {
    /* Not running (or still being built): the Python path starts it. */
    out = PyObject_CallMethod(op, "_call_slow", "(O)", payload);
    goto done;
  }
  PyObject *r = PyObject_CallObject(self->acquire, NULL);
  if (!r) goto done;
  Py_DECREF(r);
  PyObject *release = bh_py_newref(self->release);
  PyObject *chan = self->chan, *peer = self->peer;
  if (!chan || !peer) {
    /* Torn down while this thread waited for the lock. */
    chan = peer = NULL;
    out = PyObject_CallMethod(op, "_call_slow", "(O)", payload);
  } else {
    Py_INCREF(chan);
    Py_INCREF(peer);
    self->busy++;
    out = caller_request(self, chan, target, payload);
    self->busy--;
  }
  /* The outcome waits aside while Python runs the steps after it. */
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (chan && bh_py_channel_depth(chan) == 0) {
    int left = peer_has_leftovers(bh_py_channel_state(chan), peer);
    if (left > 0) {
      r = PyObject_CallMethod(op, "_after_request", "OO", chan, peer);
      left = r ? 0 : -1;
      Py_XDECREF(r);
    }
    if (left < 0) step_failed(&out, &t, &v, &tb, op);
  }
  if (!(r = PyObject_CallObject(release, NULL))) step_failed(&out, &t, &v, &tb, release);
  Py_XDECREF(r);
  PyErr_Restore(t, v, tb);
  Py_XDECREF(chan);
  Py_XDECREF(peer);
  Py_DECREF(release);
done:
  Py_XDECREF(payload);
  Py_XDECREF(rest);
  Py_XDECREF(kwargs);
  return out;
}

static PyMethodDef Caller_methods[] = {
    {"call", (PyCFunction)(void (*)(void))Caller_call, METH_VARARGS | METH_KEYWORDS,
     "call(target, /, *args, **kwargs) -> result\n"
     "Runs target ('module:function' or 'module.function') in the worker with the\n"
     "arguments and returns its result; starts the worker first if it is not running."},
    {NULL, NULL, 0, NULL}};

#define SLOT(name) ((void *)offsetof(bh_caller_obj, name))

static PyGetSetDef Caller_getset[] = {
    {"_chan", Caller_get_slot, Caller_set_chan, "the running generation's Channel, or None", SLOT(chan)},
    {"_peer", Caller_get_slot, Caller_set_peer, "the running generation's Peer, or None", SLOT(peer)},
    {"_lock", Caller_get_slot, Caller_set_lock, "the worker lock (threading.RLock)", SLOT(lock)},
    {"call_timeout", Caller_get_slot, Caller_set_timeout, "seconds a call may take, or None", SLOT(timeout)},
    {"busy", Caller_get_busy, Caller_set_busy, "requests in flight (nested ones count)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Caller_slots[] = {
    {Py_tp_dealloc, Caller_dealloc},
    {Py_tp_traverse, Caller_traverse},
    {Py_tp_clear, Caller_clear},
    {Py_tp_methods, Caller_methods},
    {Py_tp_getset, Caller_getset},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "The base of bulkhead.Worker: the state call() needs, and call() in C."},
    {0, NULL}};

PyType_Spec bh_caller_spec = {"bulkhead._native.Caller", sizeof(bh_caller_obj), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, Caller_slots};
