/*
 * channel.c (binding) -- the Channel type: one end of a host<->worker
 * channel and the request loop both ends run.
 *
 * Host and worker are symmetric peers.  request() sends a CALL (or
 * CALLBACK, RELEASE) and waits for the RESULT/ERROR with its id; while it
 * waits it serves whatever the peer asks (a CALLBACK from a worker, a
 * nested CALL from a host inside that callback), so calls nest to any
 * depth on one thread.  A reply that belongs to an outer wait is stashed
 * for it; a reply nobody waits for (an abandoned call) is dropped.
 * serve() is the worker's idle loop: serve requests until BYE or EOF.
 *
 * The hot path (encode, send, wait, decode, dispatch by a cached target)
 * is all C; Python hooks are called only for what C cannot decide: to
 * resolve a target the first time, to adapt tensors and handles, to build
 * a tagged value (set_tagged), to build or format an exception.  Every
 * wait releases the GIL.  A hook runs while the frame's bytes are still
 * the channel's: it may send, but a receive or call from it is refused
 * and a close waits for the decode to end.
 */
#include "common.h"

#include <errno.h>
#include <stdlib.h>

#define BH__NEST_MAX 64

typedef struct {
  PyObject_HEAD
  bh_channel *c;
  PyObject *module;
  bh_state *st;
  PyObject *hooks;
  PyObject *h_encode_other, *h_decode_tensor, *h_decode_handle, *h_resolve;
  PyObject *h_format_exc, *h_make_error, *h_on_frame, *h_on_request;
  PyObject *h_tagged, *tagged_mark; /* set_tagged's hook and its bytes key, or NULL */
  PyObject *resolved; /* target str -> callable */
  PyObject *stash;    /* request id -> (kind, value), for outer waits */
  uint64_t next_id;
  uint64_t waiters[BH__NEST_MAX];
  int n_waiters;
  unsigned long owner; /* thread receiving now, 0 if none */
  int owner_depth;
  bh_enc_ctx *enc;     /* the value being encoded now (its arena), or NULL */
  uint64_t enc_serial; /* values encoded so far (Channel.encode_serial) */
  unsigned long enc_thread; /* the thread encoding it: only its acquire() uses the arena */
  int decoding;        /* a received frame's value is being decoded (its bytes are the channel's) */
  int close_pending;   /* close() asked during the decode: done once it ends */
} bh_chan_obj;

/* The module's state, found once at open (self->module keeps it alive). */
static bh_state *chan_state(bh_chan_obj *self) { return self->st; }

static int Channel_traverse(PyObject *op, visitproc visit, void *arg) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  Py_VISIT(Py_TYPE(op));
  Py_VISIT(self->module);
  Py_VISIT(self->hooks);
  Py_VISIT(self->h_encode_other);
  Py_VISIT(self->h_decode_tensor);
  Py_VISIT(self->h_decode_handle);
  Py_VISIT(self->h_resolve);
  Py_VISIT(self->h_format_exc);
  Py_VISIT(self->h_make_error);
  Py_VISIT(self->h_on_frame);
  Py_VISIT(self->h_on_request);
  Py_VISIT(self->h_tagged);
  Py_VISIT(self->tagged_mark);
  Py_VISIT(self->resolved);
  Py_VISIT(self->stash);
  return 0;
}

static int Channel_clear(PyObject *op) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  Py_CLEAR(self->hooks);
  Py_CLEAR(self->h_encode_other);
  Py_CLEAR(self->h_decode_tensor);
  Py_CLEAR(self->h_decode_handle);
  Py_CLEAR(self->h_resolve);
  Py_CLEAR(self->h_format_exc);
  Py_CLEAR(self->h_make_error);
  Py_CLEAR(self->h_on_frame);
  Py_CLEAR(self->h_on_request);
  Py_CLEAR(self->h_tagged);
  Py_CLEAR(self->tagged_mark);
  Py_CLEAR(self->resolved);
  Py_CLEAR(self->stash);
  return 0;
}

static void chan_close(bh_chan_obj *self) {
  if (self->decoding) { /* a hook's close: the frame it decodes is the channel's memory */
    self->close_pending = 1;
    return;
  }
  bh_channel *c = self->c;
  self->c = NULL;
  if (c) bh_channel_close(c);
}

static void Channel_dealloc(PyObject *op) {
  PyTypeObject *tp = Py_TYPE(op);
  bh_chan_obj *self = (bh_chan_obj *)op;
  PyObject_GC_UnTrack(op);
  chan_close(self);
  Channel_clear(op);
  Py_CLEAR(self->module);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(op);
  Py_DECREF(tp);
}

static bh_channel *chan_live(bh_chan_obj *self) {
  if (!self->c) {
    PyObject *e = chan_state(self)->PeerClosed;
    PyErr_SetString(e, "channel is closed");
  }
  return self->c;
}

int64_t bh_py_deadline_of(PyObject *timeout, int *err) {
  *err = 0;
  if (!timeout || timeout == Py_None) return -1;
  double s = PyFloat_AsDouble(timeout);
  if (s == -1.0 && PyErr_Occurred()) return *err = -1, 0;
  if (s < 0) s = 0;
  if (s > 1e9) return -1;
  return bh_now_ns() + (int64_t)(s * 1e9);
}

/* Claims the channel for this thread (re-entrant). */
static int chan_enter(bh_chan_obj *self) {
  unsigned long me = PyThread_get_thread_ident();
  if (self->decoding && self->owner == me) {
    /* A decode hook: receiving now would reuse the memory of the frame
     * being decoded. */
    PyErr_SetString(PyExc_RuntimeError,
                    "a bulkhead decode hook cannot call or receive on the channel whose value it decodes");
    return -1;
  }
  if (self->owner && self->owner != me) {
    PyErr_SetString(PyExc_RuntimeError,
                    "bulkhead channel is in use by another thread; calls to one worker are serialized by its Worker lock");
    return -1;
  }
  self->owner = me;
  self->owner_depth++;
  return 0;
}

static void chan_leave(bh_chan_obj *self) {
  if (--self->owner_depth == 0) self->owner = 0;
}

/* What to do right after a send, in the same release of the GIL: receive
 * the next frame (the reply a request waits for, the next request a
 * server waits for).  One release instead of two is a good part of what a
 * trivial call costs.  deadline < 0 with idle_ns >= 0 means "idle_ns from
 * the moment the send is done". */
typedef struct {
  bh_frame *f;       /* where the frame goes; NULL: send only */
  int64_t deadline;  /* absolute, < 0: none */
  int64_t idle_ns;   /* relative to the send, < 0: use deadline */
  int rc;            /* out: 0 (f filled), or a negative code for chan_recv_rc */
  int got;           /* out: 1 when a recv was attempted (rc is meaningful) */
} bh_then_recv;

/* Encodes and sends one frame, then receives per `then` (may be NULL).
 * 0; -2 with an exception when the value could not be encoded (nothing was
 * sent: the channel is as it was, e.g. a reply past the block bound,
 * BH_EPOOLFULL); -1 with an exception about the send (nothing was
 * received).  Sending a request the peer never got raises NotDelivered. */
static int chan_send_then(bh_chan_obj *self, int kind, uint64_t req, PyObject *value,
                          bh_then_recv *then) {
  bh_channel *c = chan_live(self);
  if (!c) return -1;
  bh_enc_ctx e, *outer = self->enc;
  unsigned long outer_thread = self->enc_thread;
  bh_py_enc_init(&e, chan_state(self), self->h_encode_other);
  self->enc_serial++;
  /* While it encodes, acquire() on this thread (the encode_other hook)
   * packs small tensors into e's arena. */
  self->enc = &e;
  self->enc_thread = PyThread_get_thread_ident();
  int erc = bh_py_encode(&e, value ? value : Py_None);
  self->enc = outer;
  self->enc_thread = outer_thread;
  if (erc < 0) {
    bh_py_enc_free(&e);
    return -2;
  }
  bh_msg m = {.kind = (uint16_t)kind, .request_id = req, .value = e.buf.data,
              .value_len = e.buf.len, .blocks = e.blocks, .n_blocks = e.n_blocks};
  int rc, rrc = 0;
  /* Not when a nested wait stashed a reply: the wait must find it first. */
  int recv_too = then && then->f && PyDict_Size(self->stash) == 0;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_channel_send(c, &m);
  if (rc == 0 && recv_too) {
    int64_t deadline = then->idle_ns >= 0 ? bh_now_ns() + then->idle_ns : then->deadline;
    rrc = bh_channel_recv(c, then->f, deadline);
  }
  Py_END_ALLOW_THREADS
  bh_py_enc_free(&e);
  if (rc < 0) {
    int request = req && (kind == BH_KIND_CALL || kind == BH_KIND_CALLBACK || kind == BH_KIND_RELEASE);
    if (request && (rc == -BH_EEOF || rc == -EPIPE || rc == -ECONNRESET)) {
      PyErr_Format(chan_state(self)->NotDelivered,
                   "send: the peer closed the channel before request %llu reached it (none of it ran)",
                   (unsigned long long)req);
      return -1;
    }
    bh_py_raise(chan_state(self), rc, "send");
    return -1;
  }
  if (recv_too) then->rc = rrc, then->got = 1;
  return 0;
}

static int chan_send(bh_chan_obj *self, int kind, uint64_t req, PyObject *value) {
  return chan_send_then(self, kind, req, value, NULL);
}

/* The outcome of a bh_channel_recv: 0; 1 to receive again (a signal that
 * Python did not turn into an exception); -1 with an exception. */
static int chan_recv_rc(bh_chan_obj *self, int rc) {
  if (rc == -EINTR) return PyErr_CheckSignals() < 0 ? -1 : 1;
  if (rc < 0) {
    bh_py_raise(chan_state(self), rc, "recv");
    return -1;
  }
  return 0;
}

/* Receives one frame; retries after signals Python does not turn into an
 * exception. */
static int chan_recv(bh_chan_obj *self, bh_frame *f, int64_t deadline) {
  for (;;) {
    bh_channel *c = chan_live(self);
    if (!c) return -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = bh_channel_recv(c, f, deadline);
    Py_END_ALLOW_THREADS
    rc = chan_recv_rc(self, rc);
    if (rc <= 0) return rc;
  }
}

/* The frame a chan_send_then received, or the next one: 0, or -1 with an
 * exception. */
static int chan_recv_after(bh_chan_obj *self, bh_then_recv *then) {
  if (then->got) {
    then->got = 0;
    int rc = chan_recv_rc(self, then->rc);
    if (rc <= 0) return rc;
  }
  return chan_recv(self, then->f, then->idle_ns >= 0 ? bh_now_ns() + then->idle_ns : then->deadline);
}

static PyObject *chan_decode(bh_chan_obj *self, bh_frame *f) {
  /* The tagged hook and its mark are held for the decode: a hook may set
   * others meanwhile. */
  PyObject *tagged = self->h_tagged, *mark = self->tagged_mark;
  Py_XINCREF(tagged);
  Py_XINCREF(mark);
  bh_dec_ctx d = {chan_state(self), self->c, self->h_decode_tensor, self->h_decode_handle};
  if (tagged && mark) {
    d.decode_tagged = tagged;
    d.mark = PyBytes_AsString(mark);
    d.mark_len = PyBytes_Size(mark);
  }
  self->decoding++;
  PyObject *v = bh_py_decode(&d, f->value, f->value_len);
  self->decoding--;
  bh_channel_frame_done(self->c, f);
  Py_XDECREF(tagged);
  Py_XDECREF(mark);
  if (!self->decoding && self->close_pending) {
    self->close_pending = 0;
    chan_close(self);
  }
  return v;
}

/* Turns the current exception into an ERROR reply for request `req`.
 * Returns 0 if the exception was an ordinary one (cleared and sent), -1 if
 * it must propagate here too (BaseException, or the send failed). */
static int chan_reply_error(bh_chan_obj *self, uint64_t req) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  int ordinary = PyErr_GivenExceptionMatches(type, PyExc_Exception);
  PyObject *payload = PyObject_CallFunctionObjArgs(self->h_format_exc, value ? value : Py_None, NULL);
  int rc = 0;
  if (!payload || chan_send(self, BH_KIND_ERROR, req, payload) < 0) {
    Py_XDECREF(payload);
    /* Reporting failed: let the formatting/sending error win. */
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
  }
  Py_DECREF(payload);
  if (ordinary) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  } else {
    PyErr_Restore(type, value, tb);
    rc = -1;
  }
  return rc;
}

/* Finds the callable for a CALL target: a cached str, or what a handle
 * decoded to.  New reference. */
static PyObject *chan_target(bh_chan_obj *self, PyObject *target) {
  if (PyUnicode_Check(target)) {
    PyObject *fn = PyDict_GetItem(self->resolved, target); /* borrowed */
    if (fn) return bh_py_newref(fn);
    fn = PyObject_CallFunctionObjArgs(self->h_resolve, target, NULL);
    if (fn && PyDict_SetItem(self->resolved, target, fn) < 0) Py_CLEAR(fn);
    return fn;
  }
  if (PyCallable_Check(target)) return bh_py_newref(target);
  PyErr_Format(PyExc_TypeError, "call target must be 'module:function' or a callable handle, not %R",
               (PyObject *)Py_TYPE(target));
  return NULL;
}

/* Serves one incoming request frame: runs it and sends the reply, then
 * receives per `then` (see chan_send_then; then->got says whether it did).
 * Returns 0, or -1 when an exception must propagate. */
static int chan_handle_request(bh_chan_obj *self, bh_frame *f, bh_then_recv *then) {
  uint64_t req = f->h.request_id;
  int kind = f->h.kind;
  PyObject *res = NULL;
  PyObject *v = chan_decode(self, f);
  if (!v) return chan_reply_error(self, req);
  if (kind == BH_KIND_CALL || kind == BH_KIND_CALLBACK) {
    PyObject *target, *args, *kwargs;
    if (!PyTuple_Check(v) || PyTuple_Size(v) != 3 ||
        !PyTuple_Check(args = PyTuple_GetItem(v, 1)) ||
        !PyDict_Check(kwargs = PyTuple_GetItem(v, 2))) {
      PyErr_SetString(PyExc_TypeError, "a call must be (target, args tuple, kwargs dict)");
    } else {
      target = PyTuple_GetItem(v, 0);
      PyObject *fn = chan_target(self, target);
      if (fn) {
        res = PyObject_Call(fn, args, PyDict_Size(kwargs) ? kwargs : NULL);
        Py_DECREF(fn);
      }
    }
  } else {
    res = PyObject_CallFunction(self->h_on_request, "iO", kind, v);
  }
  Py_DECREF(v);
  if (req == 0) {
    /* Request id 0 asks for no reply (an asynchronous ask, such as a
     * pressure RELEASE): the outcome stays here; only exceptions that are
     * not ordinary errors (KeyboardInterrupt, SystemExit) propagate. */
    if (res) {
      Py_DECREF(res);
      return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
      PyErr_WriteUnraisable(self->h_on_request);
      return 0;
    }
    return -1;
  }
  if (!res) return chan_reply_error(self, req);
  int rc = chan_send_then(self, BH_KIND_RESULT, req, res, then);
  Py_DECREF(res);
  if (rc == -2) {
    /* The result could not be encoded (a type that cannot cross, more
     * shared-memory blocks than the bound): nothing was sent, so the peer
     * gets that error for this call and the worker goes on serving. */
    return chan_reply_error(self, req);
  }
  if (rc < 0) {
    /* The send itself failed: a value it raised still goes back as the
     * reply, unless the channel failed. */
    if (PyErr_ExceptionMatches(chan_state(self)->Error)) return -1;
    return chan_reply_error(self, req);
  }
  return 0;
}

/* RESULT -> value; ERROR -> the exception make_error builds. */
static PyObject *chan_finish(bh_chan_obj *self, int kind, PyObject *value) {
  if (kind == BH_KIND_RESULT) return value;
  PyObject *exc = PyObject_CallFunctionObjArgs(self->h_make_error, value, NULL);
  Py_DECREF(value);
  if (!exc) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

static int chan_is_waiting(bh_chan_obj *self, uint64_t id) {
  for (int i = 0; i < self->n_waiters; i++)
    if (self->waiters[i] == id) return 1;
  return 0;
}

static int chan_dispatch_other(bh_chan_obj *self, bh_frame *f) {
  int kind = f->h.kind;
  PyObject *v = chan_decode(self, f);
  if (!v) return -1;
  PyObject *r = PyObject_CallFunction(self->h_on_frame, "iO", kind, v);
  Py_DECREF(v);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}

/* The wait for reply `id`, serving the peer meanwhile.  then->got: the
 * first frame was received already (by the send of the request). */
static PyObject *chan_wait(bh_chan_obj *self, uint64_t id, bh_then_recv *then) {
  PyObject *out = NULL;
  bh_frame *f = then->f;
  self->waiters[self->n_waiters++] = id;
  for (;;) {
    if (!then->got && PyDict_Size(self->stash) > 0) {
      /* A nested wait may have received this reply for us. */
      PyObject *key = PyLong_FromUnsignedLongLong(id);
      if (!key) break;
      PyObject *stashed = PyDict_GetItem(self->stash, key); /* borrowed */
      if (stashed) {
        int kind = (int)PyLong_AsLong(PyTuple_GetItem(stashed, 0));
        PyObject *value = bh_py_newref(PyTuple_GetItem(stashed, 1));
        PyDict_DelItem(self->stash, key);
        Py_DECREF(key);
        out = chan_finish(self, kind, value);
        break;
      }
      Py_DECREF(key);
    }
    if (chan_recv_after(self, then) < 0) break;
    int kind = f->h.kind;
    uint64_t req = f->h.request_id;
    if (kind == BH_KIND_RESULT || kind == BH_KIND_ERROR) {
      PyObject *value = chan_decode(self, f);
      if (req == id) {
        out = value ? chan_finish(self, kind, value) : NULL;
        break;
      }
      if (!value) break; /* a malformed reply: the peer is broken */
      if (chan_is_waiting(self, req)) {
        PyObject *k = PyLong_FromUnsignedLongLong(req);
        PyObject *t = Py_BuildValue("(iN)", kind, value);
        int bad = !k || !t || PyDict_SetItem(self->stash, k, t) < 0;
        Py_XDECREF(k);
        Py_XDECREF(t);
        if (bad) break;
      } else {
        Py_DECREF(value); /* the reply of an abandoned call */
      }
    } else if (kind == BH_KIND_CALL || kind == BH_KIND_CALLBACK || kind == BH_KIND_RELEASE) {
      if (chan_handle_request(self, f, then) < 0) break;
    } else if (kind == BH_KIND_BYE) {
      bh_channel_frame_done(self->c, f);
      PyErr_SetString(chan_state(self)->PeerClosed, "peer said BYE while a call was waiting");
      break;
    } else if (chan_dispatch_other(self, f) < 0) {
      break;
    }
  }
  self->n_waiters--;
  return out;
}

PyObject *bh_py_channel_request(PyObject *op, int kind, PyObject *payload, int64_t deadline) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  if (self->n_waiters >= BH__NEST_MAX) {
    PyErr_Format(PyExc_RecursionError, "bulkhead calls nest deeper than %d", BH__NEST_MAX);
    return NULL;
  }
  if (chan_enter(self) < 0) return NULL;
  uint64_t id = self->next_id;
  self->next_id += 2;
  PyObject *out = NULL;
  bh_frame f;
  bh_then_recv then = {.f = &f, .deadline = deadline, .idle_ns = -1};
  if (chan_send_then(self, kind, id, payload, &then) == 0) out = chan_wait(self, id, &then);
  chan_leave(self);
  return out;
}

static PyObject *Channel_request(PyObject *op, PyObject *args) {
  int kind, err;
  PyObject *payload, *timeout = Py_None;
  if (!PyArg_ParseTuple(args, "iO|O:request", &kind, &payload, &timeout)) return NULL;
  int64_t deadline = bh_py_deadline_of(timeout, &err);
  if (err) return NULL;
  return bh_py_channel_request(op, kind, payload, deadline);
}

static PyObject *Channel_notify(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  int kind;
  PyObject *payload = Py_None;
  unsigned long long req = 0;
  if (!PyArg_ParseTuple(args, "i|OK:notify", &kind, &payload, &req)) return NULL;
  if (!bh_kind_name((unsigned)kind)) {
    PyErr_Format(PyExc_ValueError, "unknown frame kind %d", kind);
    return NULL;
  }
  if (chan_send(self, kind, req, payload) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *Channel_recv(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  PyObject *timeout = Py_None;
  int err;
  if (!PyArg_ParseTuple(args, "|O:recv", &timeout)) return NULL;
  int64_t deadline = bh_py_deadline_of(timeout, &err);
  if (err || chan_enter(self) < 0) return NULL;
  bh_frame f;
  PyObject *out = NULL;
  if (chan_recv(self, &f, deadline) == 0) {
    int kind = f.h.kind;
    unsigned long long req = f.h.request_id;
    PyObject *v = chan_decode(self, &f);
    if (v) out = Py_BuildValue("(iKN)", kind, req, v);
  }
  chan_leave(self);
  return out;
}

/* serve()'s timeout argument: None -> -1 (none), else seconds >= 0 in ns. */
static int serve_seconds(PyObject *v, const char *what, int64_t *ns) {
  *ns = -1;
  if (v == Py_None) return 0;
  double s = PyFloat_AsDouble(v);
  if (s == -1.0 && PyErr_Occurred()) return -1;
  if (!(s >= 0)) {
    PyErr_Format(PyExc_ValueError, "serve(%s): it must be >= 0 seconds", what);
    return -1;
  }
  *ns = s > 1e9 ? -1 : (int64_t)(s * 1e9);
  return 0;
}

static PyObject *Channel_serve(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  PyObject *timeout = Py_None, *quiet = Py_None;
  if (!PyArg_ParseTuple(args, "|OO:serve", &timeout, &quiet)) return NULL;
  int64_t idle_ns, quiet_ns;
  if (serve_seconds(timeout, "timeout", &idle_ns) < 0 || serve_seconds(quiet, "quiet", &quiet_ns) < 0)
    return NULL;
  /* After a request, the wait for the next frame is the quiet one, when
   * that is shorter: its end is 'quiet', not 'idle'. */
  int64_t after_ns = quiet_ns >= 0 && (idle_ns < 0 || quiet_ns < idle_ns) ? quiet_ns : idle_ns;
  if (chan_enter(self) < 0) return NULL;
  PyObject *out = NULL;
  bh_frame f;
  /* The idle deadline restarts after every frame served. */
  bh_then_recv then = {.f = &f, .deadline = -1, .idle_ns = idle_ns};
  for (;;) {
    if (chan_recv_after(self, &then) < 0) {
      if (PyErr_ExceptionMatches(chan_state(self)->PeerClosed)) {
        PyErr_Clear();
        out = PyUnicode_FromString("eof");
      } else if (then.idle_ns >= 0 && PyErr_ExceptionMatches(chan_state(self)->Timeout)) {
        PyErr_Clear();
        out = PyUnicode_FromString(then.idle_ns == idle_ns ? "idle" : "quiet");
      }
      break;
    }
    int kind = f.h.kind;
    if (kind == BH_KIND_CALL || kind == BH_KIND_CALLBACK || kind == BH_KIND_RELEASE) {
      then.idle_ns = after_ns;
      if (chan_handle_request(self, &f, &then) < 0) break;
    } else if (kind == BH_KIND_BYE) {
      bh_channel_frame_done(self->c, &f);
      out = PyUnicode_FromString("bye");
      break;
    } else if (kind == BH_KIND_RESULT || kind == BH_KIND_ERROR) {
      PyObject *v = chan_decode(self, &f); /* stale reply: drop it */
      if (!v) PyErr_Clear();
      Py_XDECREF(v);
    } else if (chan_dispatch_other(self, &f) < 0) {
      break;
    }
  }
  chan_leave(self);
  return out;
}

/* The byte count an acquire takes: a positive int; 0 on error (raised). */
static unsigned long long acquire_nbytes(PyObject *arg, const char *what) {
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (n == (unsigned long long)-1 && PyErr_Occurred()) return 0;
  if (n == 0) PyErr_Format(PyExc_ValueError, "%s(0): empty tensors need no block", what);
  return n;
}

static PyObject *Channel_acquire(PyObject *op, PyObject *arg) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  bh_channel *c = chan_live(self);
  if (!c) return NULL;
  unsigned long long n = acquire_nbytes(arg, "acquire");
  if (n == 0) return NULL;
  bh_block *b;
  uint64_t offset = 0;
  int rc;
  bh_arena *arena = self->enc && self->enc_thread == PyThread_get_thread_ident() && n <= BH_ARENA_ITEM_MAX
                        ? &self->enc->arena : NULL;
  Py_BEGIN_ALLOW_THREADS
  if (arena) rc = bh_arena_take(bh_channel_pool(c), arena, (size_t)n, &b, &offset);
  else rc = bh_channel_block_acquire(c, (size_t)n, &b);
  Py_END_ALLOW_THREADS
  if (rc < 0) return bh_py_raise(chan_state(self), rc, "acquire");
  PyObject *l = bh_py_lease_new(chan_state(self), b, offset, n);
  bh_block_unref(b);
  return l;
}

/* acquire_sealed(nbytes): a Lease over a whole own block the peer has
 * never mapped, sealed against writes (bh_channel_block_acquire_sealed),
 * for a tensor kept to be sent again unchanged (tensors.SendCache); None
 * where the kernel refuses the seal. */
static PyObject *Channel_acquire_sealed(PyObject *op, PyObject *arg) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  bh_channel *c = chan_live(self);
  if (!c) return NULL;
  unsigned long long n = acquire_nbytes(arg, "acquire_sealed");
  if (n == 0) return NULL;
  bh_block *b;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_channel_block_acquire_sealed(c, (size_t)n, &b);
  Py_END_ALLOW_THREADS
  if (rc == -ENOTSUP) Py_RETURN_NONE;
  if (rc < 0) return bh_py_raise(chan_state(self), rc, "acquire_sealed");
  PyObject *l = bh_py_lease_new(chan_state(self), b, 0, n);
  bh_block_unref(b);
  return l;
}

/* peer_lease(address, nbytes): a Lease over the peer's block that holds
 * those bytes (a view received from the peer, still alive), for sending
 * them back by reference (codec.c: a back ref); or, failing that, over a
 * forward (an own block of this channel showing another channel's peer
 * block that holds them: lent like any own block, no copy); None when
 * neither is had (bh_channel_peer_find).  tensors.encode calls it. */
static PyObject *Channel_peer_lease(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  unsigned long long addr, n;
  if (!PyArg_ParseTuple(args, "KK:peer_lease", &addr, &n)) return NULL;
  bh_channel *c = chan_live(self);
  if (!c) return NULL;
  if (addr == 0 || n == 0) Py_RETURN_NONE;
  bh_block *b;
  uint64_t offset;
  int rc = bh_channel_peer_find(c, (const void *)(uintptr_t)addr, n, &b, &offset);
  if (rc == -ENOENT) Py_RETURN_NONE;
  if (rc < 0) return bh_py_raise(chan_state(self), rc, "peer_lease");
  PyObject *l = bh_py_lease_new(chan_state(self), b, offset, n);
  bh_block_unref(b);
  return l;
}

static PyObject *Channel_stats(PyObject *op, PyObject *unused) {
  (void)unused;
  bh_chan_obj *self = (bh_chan_obj *)op;
  bh_channel *c = chan_live(self);
  bh_pool_stats s;
  if (!c) return NULL;
  bh_pool_stats_get(bh_channel_pool(c), &s);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "own_blocks",
                       s.own_blocks, "own_bytes", s.own_bytes, "free_blocks", s.free_blocks,
                       "free_bytes", s.free_bytes, "lent_blocks", s.lent_blocks, "peer_blocks",
                       s.peer_blocks, "peer_bytes", s.peer_bytes, "created", s.created, "reused",
                       s.reused, "forward_blocks", s.forward_blocks, "forward_bytes",
                       s.forward_bytes, "forwarded", s.forwarded, "peer_fds", s.peer_fds, "sealed_blocks",
                       s.sealed_blocks, "spent", s.spent, "spare_bytes", s.spare_bytes, "spare_takes", s.spare_takes);
}

static PyObject *Channel_trim_pool(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  unsigned long long keep = 0;
  if (!PyArg_ParseTuple(args, "|K:trim_pool", &keep)) return NULL;
  bh_channel *c = chan_live(self);
  if (!c) return NULL;
  size_t freed;
  Py_BEGIN_ALLOW_THREADS
  freed = bh_pool_trim(bh_channel_pool(c), (size_t)keep);
  Py_END_ALLOW_THREADS
  return PyLong_FromSize_t(freed);
}

/* set_tagged(mark, hook): hook(map) -> value for every map decoded here
 * with the bytes key `mark` among its keys (codec.c); None: no hook. */
static PyObject *Channel_set_tagged(PyObject *op, PyObject *args) {
  bh_chan_obj *self = (bh_chan_obj *)op;
  PyObject *mark, *hook;
  if (!PyArg_ParseTuple(args, "OO:set_tagged", &mark, &hook)) return NULL;
  if (hook != Py_None && (!PyBytes_Check(mark) || PyBytes_Size(mark) == 0)) {
    PyErr_SetString(PyExc_TypeError, "set_tagged: the mark must be a non-empty bytes key");
    return NULL;
  }
  if (hook != Py_None && !PyCallable_Check(hook)) {
    PyErr_SetString(PyExc_TypeError, "set_tagged: the hook must be callable (or None)");
    return NULL;
  }
  PyObject *old_hook = self->h_tagged, *old_mark = self->tagged_mark;
  self->h_tagged = hook == Py_None ? NULL : bh_py_newref(hook);
  self->tagged_mark = hook == Py_None ? NULL : bh_py_newref(mark);
  Py_XDECREF(old_hook);
  Py_XDECREF(old_mark);
  Py_RETURN_NONE;
}

static PyObject *Channel_close(PyObject *op, PyObject *unused) {
  (void)unused;
  chan_close((bh_chan_obj *)op);
  Py_RETURN_NONE;
}

static PyObject *Channel_fileno(PyObject *op, PyObject *unused) {
  (void)unused;
  bh_channel *c = chan_live((bh_chan_obj *)op);
  return c ? PyLong_FromLong(bh_channel_fd(c)) : NULL;
}

static PyObject *Channel_set_peer_pid(PyObject *op, PyObject *arg) {
  bh_channel *c = chan_live((bh_chan_obj *)op);
  long pid = PyLong_AsLong(arg);
  if (!c || (pid == -1 && PyErr_Occurred())) return NULL;
  bh_channel_set_peer_pid(c, (pid_t)pid);
  Py_RETURN_NONE;
}

static PyObject *Channel_forget(PyObject *op, PyObject *unused) {
  (void)unused;
  bh_chan_obj *self = (bh_chan_obj *)op;
  PyDict_Clear(self->resolved);
  Py_RETURN_NONE;
}

static PyObject *Channel_closed(PyObject *op, void *c) {
  (void)c;
  return PyBool_FromLong(((bh_chan_obj *)op)->c == NULL);
}

int bh_py_channel_depth(PyObject *op) { return ((bh_chan_obj *)op)->n_waiters; }

bh_state *bh_py_channel_state(PyObject *op) { return chan_state((bh_chan_obj *)op); }

/* Python 3.9 reads slots of heap types only, so those are asked first. */
int bh_py_is_channel(PyObject *o) {
  PyTypeObject *tp = Py_TYPE(o);
  return (PyType_GetFlags(tp) & Py_TPFLAGS_HEAPTYPE) && PyType_GetSlot(tp, Py_tp_dealloc) == (void *)Channel_dealloc;
}

static PyObject *Channel_encode_serial(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(((bh_chan_obj *)op)->enc_serial);
}

static PyObject *Channel_depth(PyObject *op, void *c) {
  (void)c;
  return PyLong_FromLong(bh_py_channel_depth(op));
}

static PyMethodDef Channel_methods[] = {
    {"request", Channel_request, METH_VARARGS,
     "request(kind, payload, timeout=None) -> value\n"
     "Sends a request and waits for its reply, serving the peer meanwhile."},
    {"notify", Channel_notify, METH_VARARGS, "notify(kind, payload=None, request_id=0): send, no reply"},
    {"recv", Channel_recv, METH_VARARGS, "recv(timeout=None) -> (kind, request_id, value)"},
    {"serve", Channel_serve, METH_VARARGS,
     "serve(timeout=None, quiet=None) -> 'bye' | 'eof' | 'idle' | 'quiet': answer requests\n"
     "until the peer goes, until nothing arrived for timeout seconds ('idle'), or, when quiet\n"
     "is shorter, for quiet seconds after a request ('quiet')"},
    {"acquire", Channel_acquire, METH_O,
     "acquire(nbytes) -> Lease over a free own block; while this channel encodes a value\n"
     "(from its encode_other hook), one of at most ARENA_ITEM_MAX bytes is an aligned range\n"
     "of a block that value's other small tensors share (one block lent, not one each)"},
    {"acquire_sealed", Channel_acquire_sealed, METH_O,
     "acquire_sealed(nbytes) -> Lease over an own block sealed against writes before the peer\n"
     "maps it (copy-on-write there, never reused here), or None where the kernel refuses"},
    {"peer_lease", Channel_peer_lease, METH_VARARGS,
     "peer_lease(address, nbytes) -> Lease over the held peer block holding those bytes, or None"},
    {"stats", Channel_stats, METH_NOARGS, "block pool statistics"},
    {"trim_pool", Channel_trim_pool, METH_VARARGS,
     "trim_pool(keep_bytes=0): destroys free own blocks beyond keep_bytes; returns the bytes freed"},
    {"set_tagged", Channel_set_tagged, METH_VARARGS,
     "set_tagged(mark, hook)\n"
     "Every map decoded on this channel that has the bytes key `mark` among its keys is\n"
     "passed, once built, to hook(map), and what hook returns stands in its place (a\n"
     "tagged map inside another is the hook's value by then).  What hook raises is the\n"
     "decode's error.  hook must not call or receive on this channel.  None: no hook."},
    {"close", Channel_close, METH_NOARGS, "close the socket; blocks stay while referenced"},
    {"fileno", Channel_fileno, METH_NOARGS, "the socket fd"},
    {"set_peer_pid", Channel_set_peer_pid, METH_O, "frames must come from this pid from now on"},
    {"forget_targets", Channel_forget, METH_NOARGS, "drop the cache of resolved call targets"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Channel_getset[] = {
    {"closed", Channel_closed, NULL, "True once closed", NULL},
    {"depth", Channel_depth, NULL, "requests waiting on this channel now (nesting)", NULL},
    {"encode_serial", Channel_encode_serial, NULL,
     "values this channel has begun to encode: the one being encoded now, inside encode_other", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Channel_slots[] = {
    {Py_tp_dealloc, Channel_dealloc},
    {Py_tp_traverse, Channel_traverse},
    {Py_tp_clear, Channel_clear},
    {Py_tp_methods, Channel_methods},
    {Py_tp_getset, Channel_getset},
    {Py_tp_doc, "One end of a bulkhead channel (see channel_open)."},
    {0, NULL}};

PyType_Spec bh_channel_spec = {"bulkhead._native.Channel", sizeof(bh_chan_obj), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Channel_slots};

static int hook(PyObject *hooks, const char *name, PyObject **slot) {
  *slot = PyObject_GetAttrString(hooks, name);
  return *slot ? 0 : -1;
}

PyObject *bh_py_channel_open(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"fd", "hooks", "peer_uid", "peer_pid", "pool_keep_bytes", "first_id",
                           "spin_ns", "forward", NULL};
  int fd;
  PyObject *hooks;
  unsigned long uid;
  long pid = 0;
  unsigned long long keep = 0, first_id = 1;
  long long spin_ns = 0;
  int forward = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iOk|lKKLp:channel_open", kwlist, &fd, &hooks, &uid, &pid,
                                   &keep, &first_id, &spin_ns, &forward))
    return NULL;
  bh_state *st = bh_py_state(module);
  bh_chan_obj *self = PyObject_GC_New(bh_chan_obj, st->Channel);
  if (!self) {
    close(fd); /* consumed on every failure past the argument check */
    return NULL;
  }
  memset((char *)self + sizeof(PyObject), 0, sizeof *self - sizeof(PyObject));
  self->module = bh_py_newref(module);
  self->st = st;
  self->hooks = bh_py_newref(hooks);
  self->next_id = first_id ? first_id : 1;
  PyObject_GC_Track((PyObject *)self);
  if (hook(hooks, "encode_other", &self->h_encode_other) < 0 ||
      hook(hooks, "decode_tensor", &self->h_decode_tensor) < 0 ||
      hook(hooks, "decode_handle", &self->h_decode_handle) < 0 ||
      hook(hooks, "resolve", &self->h_resolve) < 0 ||
      hook(hooks, "format_exc", &self->h_format_exc) < 0 ||
      hook(hooks, "make_error", &self->h_make_error) < 0 ||
      hook(hooks, "on_frame", &self->h_on_frame) < 0 ||
      hook(hooks, "on_request", &self->h_on_request) < 0 ||
      !(self->resolved = PyDict_New()) || !(self->stash = PyDict_New())) {
    close(fd);
    Py_DECREF(self);
    return NULL;
  }
  bh_channel_opts o = {.peer_uid = (uid_t)uid, .peer_pid = (pid_t)pid, .pool_keep_bytes = keep,
                       .spin_ns = spin_ns, .forward = forward};
  int rc = bh_channel_open(&self->c, fd, &o);
  if (rc < 0) {
    Py_DECREF(self);
    return bh_py_raise(st, rc, "channel_open");
  }
  return (PyObject *)self;
}
