/*
 * supervisor.c (binding) -- spawn() and the Proc type over bh_proc.  Every
 * wait releases the GIL.  Python glue turns statuses into words.
 */
#include "common.h"

#include <errno.h>
#include <stdlib.h>

typedef struct {
  PyObject_HEAD
  bh_proc *proc;
  PyObject *module;
} bh_proc_obj;

static void Proc_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  bh_proc_obj *p = (bh_proc_obj *)self;
  PyObject_GC_UnTrack(self);
  if (p->proc) {
    Py_BEGIN_ALLOW_THREADS
    bh_proc_close(p->proc);
    Py_END_ALLOW_THREADS
    p->proc = NULL;
  }
  Py_CLEAR(p->module);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static int Proc_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((bh_proc_obj *)self)->module);
  return 0;
}

static bh_proc *proc_live(bh_proc_obj *p) {
  if (!p->proc) PyErr_SetString(PyExc_ValueError, "process handle is closed");
  return p->proc;
}

/* Converts seconds (None: forever) to ms. */
static int timeout_ms(PyObject *o, int *ms) {
  if (o == Py_None) {
    *ms = -1;
    return 0;
  }
  double s = PyFloat_AsDouble(o);
  if (s == -1.0 && PyErr_Occurred()) return -1;
  *ms = s <= 0 ? 0 : s > 2e6 ? 2000000000 : (int)(s * 1000.0 + 0.5);
  return 0;
}

static PyObject *Proc_wait(PyObject *self, PyObject *args) {
  PyObject *to = Py_None;
  int ms, status = 0, rc;
  bh_proc *p = proc_live((bh_proc_obj *)self);
  if (!p || !PyArg_ParseTuple(args, "|O:wait", &to) || timeout_ms(to, &ms) < 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_proc_wait(p, ms, &status);
  Py_END_ALLOW_THREADS
  if (rc == -ETIMEDOUT) Py_RETURN_NONE;
  if (rc < 0) return bh_py_raise(bh_py_state(((bh_proc_obj *)self)->module), rc, "waitpid");
  return PyLong_FromLong(status);
}

static PyObject *Proc_stop(PyObject *self, PyObject *args) {
  double grace = 2.0, term = 1.0;
  int status = 0, rc;
  bh_proc *p = proc_live((bh_proc_obj *)self);
  if (!p || !PyArg_ParseTuple(args, "|dd:stop", &grace, &term)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_proc_stop(p, (int)(grace * 1000), (int)(term * 1000), &status);
  Py_END_ALLOW_THREADS
  if (rc < 0) return bh_py_raise(bh_py_state(((bh_proc_obj *)self)->module), rc, "stop");
  return PyLong_FromLong(status);
}

static PyObject *Proc_kill(PyObject *self, PyObject *arg) {
  bh_proc *p = proc_live((bh_proc_obj *)self);
  if (!p) return NULL;
  long sig = PyLong_AsLong(arg);
  if (sig == -1 && PyErr_Occurred()) return NULL;
  int rc = bh_proc_kill(p, (int)sig);
  return PyBool_FromLong(rc == 0);
}

static PyObject *Proc_output_tail(PyObject *self, PyObject *unused) {
  (void)unused;
  char buf[8192];
  size_t n;
  bh_proc *p = proc_live((bh_proc_obj *)self);
  if (!p) return NULL;
  Py_BEGIN_ALLOW_THREADS
  n = bh_proc_output_tail(p, buf, sizeof buf);
  Py_END_ALLOW_THREADS
  return PyUnicode_DecodeUTF8(buf, (Py_ssize_t)n, "replace");
}

static PyObject *Proc_close(PyObject *self, PyObject *unused) {
  (void)unused;
  bh_proc_obj *p = (bh_proc_obj *)self;
  bh_proc *proc = p->proc;
  p->proc = NULL;
  if (proc) {
    Py_BEGIN_ALLOW_THREADS
    bh_proc_close(proc);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *Proc_pid(PyObject *self, void *c) {
  (void)c;
  bh_proc *p = proc_live((bh_proc_obj *)self);
  return p ? PyLong_FromLong(bh_proc_pid(p)) : NULL;
}

static PyMethodDef Proc_methods[] = {
    {"wait", Proc_wait, METH_VARARGS, "wait(timeout=None) -> status or None; reaps"},
    {"stop", Proc_stop, METH_VARARGS, "stop(grace=2.0, term=1.0) -> status: wait, SIGTERM, SIGKILL"},
    {"kill", Proc_kill, METH_O, "kill(sig) -> bool"},
    {"output_tail", Proc_output_tail, METH_NOARGS, "the last output of the child"},
    {"close", Proc_close, METH_NOARGS, "kill if running, reap, free"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Proc_getset[] = {{"pid", Proc_pid, NULL, "process id", NULL},
                                    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Proc_slots[] = {
    {Py_tp_dealloc, Proc_dealloc},
    {Py_tp_traverse, Proc_traverse},
    {Py_tp_methods, Proc_methods},
    {Py_tp_getset, Proc_getset},
    {Py_tp_doc, "A spawned worker process."},
    {0, NULL}};

PyType_Spec bh_proc_spec = {"bulkhead._native.Proc", sizeof(bh_proc_obj), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Proc_slots};

/* Converts a sequence of str to a NULL-ended array of UTF-8 copies. */
static char **str_array(PyObject *seq, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return NULL;
  Py_ssize_t n = PySequence_Size(fast);
  char **arr = n >= 0 ? calloc((size_t)n + 1, sizeof *arr) : NULL;
  if (!arr) {
    Py_DECREF(fast);
    return (char **)PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(fast, i);
    PyObject *b = item ? PyUnicode_AsUTF8String(item) : NULL;
    Py_XDECREF(item);
    char *s;
    Py_ssize_t len;
    if (!b || PyBytes_AsStringAndSize(b, &s, &len) < 0 || !(arr[i] = strdup(s))) {
      Py_XDECREF(b);
      for (Py_ssize_t k = 0; k < i; k++) free(arr[k]);
      free(arr);
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_NoMemory();
      return NULL;
    }
    Py_DECREF(b);
  }
  Py_DECREF(fast);
  return arr;
}

static void str_array_free(char **arr) {
  if (!arr) return;
  for (char **p = arr; *p; p++) free(*p);
  free(arr);
}

/* (Proc, channel fd) for a started child; both closed on failure. */
static PyObject *proc_result(PyObject *module, bh_proc *proc, int fd) {
  bh_state *st = bh_py_state(module);
  bh_proc_obj *po = PyObject_GC_New(bh_proc_obj, st->Proc);
  if (!po) {
    bh_proc_close(proc);
    close(fd);
    return NULL;
  }
  po->proc = proc;
  po->module = bh_py_newref(module);
  PyObject_GC_Track((PyObject *)po);
  PyObject *res = Py_BuildValue("(Ni)", (PyObject *)po, fd);
  if (!res) close(fd);
  return res;
}

/* A bh_sandbox from (read, write, devices, network): three sequences of
 * str and a truth value; its arrays are freed by sandbox_free. */
static int sandbox_from(PyObject *o, bh_sandbox *sb) {
  PyObject *r, *w, *d, *net;
  memset(sb, 0, sizeof *sb);
  if (!PyArg_ParseTuple(o, "OOOO:sandbox", &r, &w, &d, &net)) return -1;
  int network = PyObject_IsTrue(net);
  if (network < 0) return -1;
  sb->network = network;
  if (!(sb->read = (const char *const *)str_array(r, "sandbox read paths must be a sequence of str")) ||
      !(sb->write = (const char *const *)str_array(w, "sandbox write paths must be a sequence of str")) ||
      !(sb->devices = (const char *const *)str_array(d, "sandbox device paths must be a sequence of str")))
    return -1;
  return 0;
}

static void sandbox_free(bh_sandbox *sb) {
  str_array_free((char **)sb->read);
  str_array_free((char **)sb->write);
  str_array_free((char **)sb->devices);
}

PyObject *bh_py_spawn(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"interpreter", "argv", "env", "cwd", "sink", "prefix", "sandbox", NULL};
  const char *interp, *cwd = NULL, *prefix = NULL;
  PyObject *argv_o, *env_o, *sandbox_o = Py_None, *res = NULL;
  int sink = -1, rc, fd = -1;
  char **argv = NULL, **envp = NULL;
  bh_proc *proc = NULL;
  bh_sandbox sb;
  memset(&sb, 0, sizeof sb);
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sOO|zizO:spawn", kwlist, &interp, &argv_o, &env_o,
                                   &cwd, &sink, &prefix, &sandbox_o))
    return NULL;
  if (!(argv = str_array(argv_o, "argv must be a sequence of str")) ||
      !(envp = str_array(env_o, "env must be a sequence of 'KEY=value' str")) ||
      (sandbox_o != Py_None && sandbox_from(sandbox_o, &sb) < 0))
    goto out;
  bh_spawn_opts o = {.interpreter = interp, .argv = (const char *const *)argv,
                     .envp = (const char *const *)envp, .cwd = cwd, .stderr_sink = sink,
                     .stderr_prefix = prefix, .sandbox = sandbox_o != Py_None ? &sb : NULL};
  Py_BEGIN_ALLOW_THREADS
  rc = bh_proc_spawn(&o, &proc, &fd);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    PyObject *e = Py_BuildValue("(iss)", -rc, bh_strerror(rc), interp);
    if (e) PyErr_SetObject(PyExc_OSError, e);
    Py_XDECREF(e);
    goto out;
  }
  res = proc_result(module, proc, fd);
out:
  str_array_free(argv);
  str_array_free(envp);
  sandbox_free(&sb);
  return res;
}

PyObject *bh_py_sandbox_abi(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  int abi = bh_sandbox_abi();
  return PyLong_FromLong(abi < 0 ? 0 : abi);
}

PyObject *bh_py_sandbox_apply(PyObject *module, PyObject *arg) {
  (void)module;
  bh_sandbox sb;
  char why[512];
  int rc;
  if (sandbox_from(arg, &sb) < 0) {
    sandbox_free(&sb);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = bh_sandbox_apply(&sb, why, sizeof why);
  Py_END_ALLOW_THREADS
  sandbox_free(&sb);
  if (rc < 0) {
    PyObject *e = Py_BuildValue("(is)", -rc, why[0] ? why : bh_strerror(rc));
    if (e) PyErr_SetObject(PyExc_OSError, e);
    Py_XDECREF(e);
    return NULL;
  }
  return PyLong_FromLong(rc);
}

PyObject *bh_py_spawn_via(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"zygote_fd", "request", "sink", "prefix", "timeout_ms", NULL};
  int zfd, sink = -1, timeout_ms = 0, rc, fd = -1;
  const char *req, *prefix = NULL;
  Py_ssize_t req_len;
  char why[512];
  bh_proc *proc = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iy#|izi:spawn_via", kwlist, &zfd, &req, &req_len, &sink, &prefix,
                                   &timeout_ms))
    return NULL;
  bh_fork_opts o = {.zygote_fd = zfd, .request = req, .request_len = (size_t)req_len,
                    .timeout_ms = timeout_ms, .stderr_sink = sink, .stderr_prefix = prefix};
  Py_BEGIN_ALLOW_THREADS
  rc = bh_proc_fork_via(&o, &proc, &fd, why, sizeof why);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    PyObject *e = Py_BuildValue("(is)", -rc, why[0] ? why : bh_strerror(rc));
    if (e) PyErr_SetObject(PyExc_OSError, e);
    Py_XDECREF(e);
    return NULL;
  }
  return proc_result(module, proc, fd);
}

PyObject *bh_py_relax_ns(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  double ns;
  Py_BEGIN_ALLOW_THREADS
  ns = bh_relax_ns();
  Py_END_ALLOW_THREADS
  return PyFloat_FromDouble(ns);
}
