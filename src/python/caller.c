/*
 * caller.c (binding) -- the Caller type: the base of host.Worker, whose
 * requests (call() and release()) run in C from the arguments to the
 * result.
 *
 * A trivial call is a few microseconds, and the Python glue around
 * Channel.request (a method frame, the lock as a context manager, the busy
 * count, try/finally) was a fifth of it.  Caller.request is the one
 * implementation of a request to the worker, on the state host.Worker
 * keeps in Caller's slots: take the worker lock (threading.RLock, so
 * Python code shares it unchanged), count the request as busy, send and
 * wait on the generation's Channel, undo.  Caller.call is request(CALL,
 * ...) with the call's payload built here; Worker.release and
 * Worker.post_release are request(RELEASE, ...), the latter with
 * wait=False (a frame with request id 0, sent only when the lock is free).
 *
 * What is not the plain path stays in Python, in the methods of the
 * subclass this file calls by name (bh_caller_hooks below; exported as
 * _native.CALLER_HOOKS, and host/workers.py refuses to define a Worker
 * that lacks one, so a rename fails at import):
 *   _start()            the worker is not running: start it (lock held);
 *   _request_failed(exc, verb, obj, timeout_s, attempt)
 *                       the channel failed (lock held, counted busy):
 *                       returns True to run the request again on the next
 *                       generation (it died idle and never got it), else
 *                       raises the error that names the worker;
 *   _after_request(chan, peer)
 *                       the outermost request left handles or releases to
 *                       tidy (checked here first: Peer.exports and
 *                       Peer.pending_releases, read by name too).
 */
#include "common.h"

#include <stddef.h>

typedef struct {
  PyObject_HEAD
  PyObject *chan;             /* the running generation's Channel, or NULL */
  PyObject *peer;             /* its Peer, or NULL */
  PyObject *lock;             /* threading.RLock, or NULL */
  PyObject *acquire, *release; /* the lock's bound methods */
  PyObject *timeout;          /* call_timeout_s: NULL for None, or seconds */
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
  if (refuse_delete(v, "call_timeout_s") < 0) return -1;
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

/* The hooks, in the order of the HOOK_* indices. */
static const char *const bh_caller_hooks[] = {"_start", "_request_failed", "_after_request"};
enum { HOOK_START, HOOK_FAILED, HOOK_AFTER, HOOK_COUNT };

PyObject *bh_py_caller_hooks(void) {
  PyObject *t = PyTuple_New(HOOK_COUNT);
  for (int i = 0; t && i < HOOK_COUNT; i++) {
    PyObject *s = PyUnicode_FromString(bh_caller_hooks[i]);
    if (!s) Py_CLEAR(t);
    else PyTuple_SetItem(t, i, s);
  }
  return t;
}

/* One attempt on a running generation: send, wait, and what a channel
 * failure becomes (_request_failed).  Sets *again when the hook asks for
 * a rerun.  New reference, or NULL with an exception (or NULL and no
 * exception with *again set). */
static PyObject *request_once(bh_caller_obj *self, PyObject *chan, int kind, PyObject *payload,
                              PyObject *timeout, const char *verb, PyObject *obj, int attempt,
                              int *again) {
  int err;
  *again = 0;
  int64_t deadline = bh_py_deadline_of(timeout, &err);
  if (err) return NULL;
  PyObject *out = bh_py_channel_request(chan, kind, payload, deadline);
  if (out || !PyErr_ExceptionMatches(bh_py_channel_state(chan)->Error)) return out;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  PyObject *r = PyObject_CallMethod((PyObject *)self, bh_caller_hooks[HOOK_FAILED], "OsOOi",
                                    value ? value : Py_None, verb, obj, timeout, attempt);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (!r) return NULL;
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  if (t > 0) *again = 1;
  else if (t == 0)
    PyErr_Format(PyExc_RuntimeError, "Worker.%s neither raised nor asked for a rerun",
                 bh_caller_hooks[HOOK_FAILED]);
  return NULL;
}

/* The request: lock, start when not running, count busy, send and wait,
 * rerun when _request_failed asks, tidy after the outermost request,
 * unlock.  New reference, or NULL with an exception. */
static PyObject *caller_request(bh_caller_obj *self, int kind, PyObject *payload, PyObject *timeout,
                                const char *verb, PyObject *obj) {
  PyObject *op = (PyObject *)self;
  if (!self->acquire) {
    PyErr_SetString(PyExc_RuntimeError, "Worker has no _lock yet (Worker.__init__ has not run)");
    return NULL;
  }
  PyObject *r = PyObject_CallObject(self->acquire, NULL);
  if (!r) return NULL;
  Py_DECREF(r);
  PyObject *release = bh_py_newref(self->release);
  timeout = bh_py_newref(timeout ? timeout : Py_None); /* call_timeout_s's slot: NULL for None */
  PyObject *out = NULL, *t = NULL, *v = NULL, *tb = NULL;
  for (int attempt = 0, again = 1; again; attempt++) {
    again = 0;
    if (!self->chan || !self->peer) {
      /* Not running, or torn down while this thread waited for the lock. */
      if (!(r = PyObject_CallMethod(op, bh_caller_hooks[HOOK_START], NULL))) break;
      Py_DECREF(r);
      if (!self->chan || !self->peer) {
        PyErr_Format(PyExc_RuntimeError, "Worker.%s left no channel", bh_caller_hooks[HOOK_START]);
        break;
      }
    }
    PyObject *chan = bh_py_newref(self->chan), *peer = bh_py_newref(self->peer);
    self->busy++;
    out = request_once(self, chan, kind, payload, timeout, verb, obj, attempt, &again);
    self->busy--;
    /* The outcome waits aside while Python runs the steps after it. */
    PyErr_Fetch(&t, &v, &tb);
    if (bh_py_channel_depth(chan) == 0) {
      int left = peer_has_leftovers(bh_py_channel_state(chan), peer);
      if (left > 0) {
        r = PyObject_CallMethod(op, bh_caller_hooks[HOOK_AFTER], "OO", chan, peer);
        left = r ? 0 : -1;
        Py_XDECREF(r);
      }
      if (left < 0) step_failed(&out, &t, &v, &tb, op);
    }
    PyErr_Restore(t, v, tb);
    Py_DECREF(chan);
    Py_DECREF(peer);
  }
  PyErr_Fetch(&t, &v, &tb);
  if (!(r = PyObject_CallObject(release, NULL))) step_failed(&out, &t, &v, &tb, release);
  Py_XDECREF(r);
  PyErr_Restore(t, v, tb);
  Py_DECREF(timeout);
  Py_DECREF(release);
  return out;
}

/* request(wait=False): the frame alone, request id 0 (no reply), sent only
 * when the lock is free and the worker runs.  True when sent. */
static PyObject *caller_post(bh_caller_obj *self, int kind, PyObject *payload) {
  if (!self->acquire) Py_RETURN_FALSE;
  PyObject *r = PyObject_CallFunctionObjArgs(self->acquire, Py_False, NULL);
  int got = r ? PyObject_IsTrue(r) : -1;
  Py_XDECREF(r);
  if (got <= 0) return got < 0 ? NULL : bh_py_newref(Py_False);
  PyObject *release = bh_py_newref(self->release), *out = NULL;
  if (!self->chan) {
    out = bh_py_newref(Py_False);
  } else {
    PyObject *chan = bh_py_newref(self->chan);
    r = PyObject_CallMethod(chan, "notify", "iOi", kind, payload, 0);
    if (r) {
      out = bh_py_newref(Py_True);
    } else if (PyErr_ExceptionMatches(bh_py_channel_state(chan)->Error)) {
      PyErr_Clear();
      out = bh_py_newref(Py_False);
    }
    Py_XDECREF(r);
    Py_DECREF(chan);
  }
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (!(r = PyObject_CallObject(release, NULL))) step_failed(&out, &t, &v, &tb, release);
  Py_XDECREF(r);
  PyErr_Restore(t, v, tb);
  Py_DECREF(release);
  return out;
}

static PyObject *Caller_request(PyObject *op, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"kind", "payload", "timeout_s", "verb", "obj", "wait", NULL};
  int kind, wait = 1;
  PyObject *payload, *timeout = Py_None, *obj = Py_None;
  const char *verb = "request";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iO|OsO$p:request", kwlist, &kind, &payload, &timeout,
                                   &verb, &obj, &wait))
    return NULL;
  if (!bh_kind_name((unsigned)kind)) {
    PyErr_Format(PyExc_ValueError, "unknown frame kind %d", kind);
    return NULL;
  }
  if (timeout != Py_None) {
    double s = PyFloat_AsDouble(timeout);
    if (s == -1.0 && PyErr_Occurred()) return NULL;
  }
  bh_caller_obj *self = (bh_caller_obj *)op;
  return wait ? caller_request(self, kind, payload, timeout, verb, obj) : caller_post(self, kind, payload);
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
  PyObject *out = payload ? caller_request(self, BH_KIND_CALL, payload, self->timeout, "call", target) : NULL;
  Py_XDECREF(payload);
  Py_XDECREF(rest);
  Py_XDECREF(kwargs);
  return out;
}

static PyMethodDef Caller_methods[] = {
    {"call", (PyCFunction)(void (*)(void))Caller_call, METH_VARARGS | METH_KEYWORDS,
     "call(target, /, *args, **kwargs) -> result\n"
     "Runs target ('module:function' or 'module.function') in the worker with the\n"
     "arguments and returns its result; starts the worker first if it is not running.\n"
     "request(CALL, (target, args, kwargs), call_timeout_s, 'call', target)."},
    {"request", (PyCFunction)(void (*)(void))Caller_request, METH_VARARGS | METH_KEYWORDS,
     "request(kind, payload, timeout_s=None, verb='request', obj=None, *, wait=True) -> reply\n"
     "Sends a request of frame kind `kind` to the worker and returns its reply, under\n"
     "the worker lock, counted in busy; starts the worker when it is not running.\n"
     "timeout_s: seconds to wait for the reply (None: as long as it takes).\n"
     "verb and obj name it in errors ('call', target).  A failed channel goes to\n"
     "_request_failed (rerun on the next generation, or the error naming the worker).\n"
     "wait=False: sends the frame with request id 0 (no reply) when the lock is free\n"
     "and the worker runs, starting nothing; returns whether it was sent."},
    {NULL, NULL, 0, NULL}};

#define SLOT(name) ((void *)offsetof(bh_caller_obj, name))

static PyGetSetDef Caller_getset[] = {
    {"_chan", Caller_get_slot, Caller_set_chan, "the running generation's Channel, or None", SLOT(chan)},
    {"_peer", Caller_get_slot, Caller_set_peer, "the running generation's Peer, or None", SLOT(peer)},
    {"_lock", Caller_get_slot, Caller_set_lock, "the worker lock (threading.RLock)", SLOT(lock)},
    {"call_timeout_s", Caller_get_slot, Caller_set_timeout, "seconds a call may take, or None", SLOT(timeout)},
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
