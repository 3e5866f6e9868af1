/*
 * ledger.c (binding) -- the Ledger type over bh_ledger: a handle on the
 * machine-wide ledger (see src/core/ledger.c for the layout and locking).
 *
 *   Ledger(path=None)   opens (creating if needed) the segment; None: the
 *                       default ($BULKHEAD_LEDGER, else
 *                       /dev/shm/bulkhead-<uid>/ledger: bh_ledger_default_path)
 *   .join(role, pack='', interpreter='', generation=0, host_pid=0) -> slot
 *   .leave(), .close() (idempotent; also `with Ledger(...) as l:`)
 *   .set_run(run), .set_device(...), .set_model(...), .drop_model(id),
 *   .note_release(bytes)               this process's own record
 *   .records(), .read(pid), .resident(pid, model_id), .reap()
 *   ._test_lock(), ._test_unlock()     BH_TESTING builds only: hold the
 *                                      segment's mutex (the kill matrix)
 *
 * Roles and run states cross as words ('host', 'worker', 'tool'; 'idle',
 * 'busy', 'releasing', 'working', and 'stale', which is only read); a
 * number this build does not know is passed through as the int.  Byte counts are ints in [0, 2**63): anything else
 * raises OverflowError (never wraps); a string too long for its fixed
 * field raises ValueError naming the field and its limit.
 *
 * Calls that may wait on another process (open: the segment's file lock;
 * join, leave, records, read, reap, close: the segment's mutex and /proc)
 * release the GIL.  The writers and resident() do not: they take
 * microseconds and no lock another process holds.  A handle counts the
 * calls running without the GIL so close() never frees it under one.
 */
#include "common.h"

#include "bulkhead/ledger.h"
#ifdef BH_TESTING
#include "src/core/internal.h" /* bh__ledger_lock / unlock: the test hooks */
#endif

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

typedef struct {
  PyObject_HEAD
  bh_ledger *ledger; /* owned; NULL once closed */
  PyObject *module;  /* strong: the state's exception classes */
  int busy;          /* calls running with the GIL released */
  int hint;          /* resident()'s slot hint, for hint_pid */
  pid_t hint_pid;
} bh_ledger_obj;

static const char *const role_names[] = {NULL, "host", "worker", "tool"};
/* Indexed by enum bh_ledger_run.  set_run takes all but "stale", which is
 * only read (a record its owner left mid-write, see bh_ledger_snapshot). */
static const char *const run_names[] = {"idle", "busy", "releasing", "stale", "working"};

#define BH_PY_BYTES_MAX ((uint64_t)INT64_MAX)

static bh_state *ledger_state(bh_ledger_obj *self) { return bh_py_state(self->module); }

/* The core handle of an open Ledger, or NULL with ValueError. */
static bh_ledger *ledger_live(bh_ledger_obj *self) {
  if (!self->ledger) PyErr_SetString(PyExc_ValueError, "ledger is closed");
  return self->ledger;
}

bh_ledger *bh_py_ledger_get(bh_state *st, PyObject *obj) {
  if (!st || !obj || !PyObject_TypeCheck(obj, st->Ledger)) {
    PyErr_SetString(PyExc_TypeError, "expected a bulkhead._native.Ledger");
    return NULL;
  }
  return ledger_live((bh_ledger_obj *)obj);
}

bh_ledger *bh_py_ledger_borrow(bh_state *st, PyObject *obj) {
  bh_ledger *l = bh_py_ledger_get(st, obj);
  if (l) ((bh_ledger_obj *)obj)->busy++;
  return l;
}

void bh_py_ledger_unborrow(PyObject *obj) { ((bh_ledger_obj *)obj)->busy--; }

/* An int in [0, max] into *out; OverflowError names `what` otherwise. */
static int as_u64(PyObject *o, const char *what, uint64_t max, uint64_t *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, (PyObject *)Py_TYPE(o));
    return -1;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow < 0 || (!overflow && v < 0)) {
    PyErr_Format(PyExc_OverflowError, "%s must not be negative", what);
    return -1;
  }
  unsigned long long u = (unsigned long long)v;
  if (overflow) {
    u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_Format(PyExc_OverflowError, "%s must be at most %llu", what, (unsigned long long)max);
      return -1;
    }
  }
  if (u > max) {
    PyErr_Format(PyExc_OverflowError, "%s must be at most %llu", what, (unsigned long long)max);
    return -1;
  }
  *out = u;
  return 0;
}

static int as_pid(PyObject *o, const char *what, int allow_zero, pid_t *out) {
  uint64_t v;
  if (as_u64(o, what, INT_MAX, &v) < 0) return -1;
  if (v == 0 && !allow_zero) {
    PyErr_Format(PyExc_ValueError, "%s must be a positive pid", what);
    return -1;
  }
  *out = (pid_t)v;
  return 0;
}

/* Copies a str into a fixed field of `cap` bytes (NUL included). */
static int put_str(PyObject *o, const char *what, char *dst, size_t cap) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be a str, not %R", what, (PyObject *)Py_TYPE(o));
    return -1;
  }
  PyObject *b = PyUnicode_AsUTF8String(o);
  if (!b) return -1;
  char *s;
  Py_ssize_t n;
  int rc = -1;
  if (PyBytes_AsStringAndSize(b, &s, &n) < 0) goto out;
  if ((size_t)n >= cap) {
    PyErr_Format(PyExc_ValueError, "%s is %zd bytes in UTF-8; the ledger holds at most %zu", what,
                 n, cap - 1);
    goto out;
  }
  if (memchr(s, 0, (size_t)n)) {
    PyErr_Format(PyExc_ValueError, "%s must not contain NUL characters", what);
    goto out;
  }
  memcpy(dst, s, (size_t)n);
  memset(dst + n, 0, cap - (size_t)n);
  rc = 0;
out:
  Py_DECREF(b);
  return rc;
}

static int word_index(PyObject *o, const char *what, const char *const *names, int n) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be a str, not %R", what, (PyObject *)Py_TYPE(o));
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (names[i] && PyUnicode_CompareWithASCIIString(o, names[i]) == 0) return i;
  PyErr_Format(PyExc_ValueError, "unknown %s %R", what, o);
  return -1;
}

/* New reference: a word for a known code, else the int. */
static PyObject *word_of(int v, const char *const *names, int n) {
  if (v >= 0 && v < n && names[v]) return PyUnicode_FromString(names[v]);
  return PyLong_FromLong(v);
}

/* New reference: a str from a NUL-terminated field; bytes that are not
 * UTF-8 (a C writer's) are replaced, not an error. */
static PyObject *str_of(const char *s) {
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *ledger_raise(bh_ledger_obj *self, int rc, const char *call) {
  return bh_py_raise(ledger_state(self), rc, call);
}

/* ------------------------------------------------------------- lifetime */

static PyObject *Ledger_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", NULL};
  PyObject *path_o = Py_None, *path_b = NULL, *module = NULL;
  bh_ledger_obj *self = NULL;
  bh_ledger *l = NULL;
  const char *path = NULL;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Ledger", kwlist, &path_o)) return NULL;
  if (path_o != Py_None) {
    if (!PyUnicode_FSConverter(path_o, &path_b)) return NULL;
    path = PyBytes_AsString(path_b);
    if (!path) goto err;
  }
  /* The 3.9 limited API has no PyType_GetModule: find the module the way
   * a caller would. */
  module = PyImport_ImportModule("bulkhead._native");
  if (!module) goto err;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_ledger_open(&l, path);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    char def[PATH_MAX];
    if (!path) path = bh_ledger_default_path(def, sizeof def) >= 0 ? def : "(default path)";
    int code = -rc;
    if (code < BH_EMAGIC) {
      /* The default path's directory taken by another user: say whose. */
      char dir[PATH_MAX];
      struct stat dst;
      const char *slash = strrchr(path, '/');
      size_t dlen = slash ? (size_t)(slash - path) : 0;
      char dwhy[PATH_MAX + 512];
      int dir_taken = 0;
      if (dlen && dlen < sizeof dir && (code == EPERM || code == EACCES || code == ENOTDIR || code == ELOOP)) {
        memcpy(dir, path, dlen);
        dir[dlen] = 0;
        if (lstat(dir, &dst) == 0 && (dst.st_uid != geteuid() || S_ISLNK(dst.st_mode) || !S_ISDIR(dst.st_mode) ||
                                      (dst.st_mode & 077))) {
          snprintf(dwhy, sizeof dwhy,
                   "ledger directory %s is not a private directory of ours (owner uid %u, mode %o%s): another "
                   "user may have made it first; remove it (as root), or set XDG_RUNTIME_DIR to a private "
                   "directory or BULKHEAD_LEDGER to a path of ours",
                   dir, (unsigned)dst.st_uid, (unsigned)(dst.st_mode & 07777),
                   S_ISLNK(dst.st_mode) ? ", a symbolic link" : S_ISDIR(dst.st_mode) ? "" : ", not a directory");
          dir_taken = 1;
        }
      }
      const char *why = dir_taken        ? dwhy
                        : code == EPERM    ? "ledger file is owned by another user"
                        : code == EACCES ? "ledger file grants access to group or others "
                                           "(it must be mode 0600)"
                        : code == EINVAL ? "ledger path is not a regular file"
                        : code == ELOOP  ? "ledger path is a symbolic link"
                                         : strerror(code);
      PyObject *fn = PyUnicode_DecodeFSDefault(path);
      PyObject *e = fn ? Py_BuildValue("(isN)", code, why, fn) : NULL;
      if (e) {
        PyErr_SetObject(PyExc_OSError, e);
        Py_DECREF(e);
      }
      goto err;
    }
    char call[PATH_MAX + 32];
    snprintf(call, sizeof call, "ledger %s", path);
    bh_py_raise(bh_py_state(module), rc, call);
    goto err;
  }
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  self = (bh_ledger_obj *)alloc(type, 0);
  if (!self) goto err;
  self->ledger = l;
  self->module = module;
  self->busy = 0;
  self->hint = -1;
  self->hint_pid = 0;
  Py_XDECREF(path_b);
  return (PyObject *)self;
err:
  if (l) {
    Py_BEGIN_ALLOW_THREADS
    bh_ledger_close(l);
    Py_END_ALLOW_THREADS
  }
  Py_XDECREF(module);
  Py_XDECREF(path_b);
  return NULL;
}

static void ledger_free_core(bh_ledger_obj *self) {
  bh_ledger *l = self->ledger;
  self->ledger = NULL;
  if (l) {
    Py_BEGIN_ALLOW_THREADS
    bh_ledger_close(l);
    Py_END_ALLOW_THREADS
  }
}

static void Ledger_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  ledger_free_core((bh_ledger_obj *)self);
  Py_CLEAR(((bh_ledger_obj *)self)->module);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static int Ledger_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(((bh_ledger_obj *)self)->module);
  return 0;
}

/* Brackets a call that releases the GIL: NULL (exception set) when the
 * ledger is closed. */
static bh_ledger *ledger_enter(bh_ledger_obj *self) {
  bh_ledger *l = ledger_live(self);
  if (l) self->busy++;
  return l;
}

static void ledger_exit(bh_ledger_obj *self) { self->busy--; }

/* fn(l) without the GIL: None (or the count it returned, as_count), or
 * NULL with the exception naming `what`. */
static PyObject *ledger_call(bh_ledger_obj *self, int (*fn)(bh_ledger *), const char *what,
                             int as_count) {
  int rc;
  bh_ledger *l = ledger_enter(self);
  if (!l) return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = fn(l);
  Py_END_ALLOW_THREADS
  ledger_exit(self);
  if (rc < 0) return ledger_raise(self, rc, what);
  if (as_count) return PyLong_FromLong(rc);
  Py_RETURN_NONE;
}

static PyObject *Ledger_close(PyObject *self_o, PyObject *unused) {
  (void)unused;
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  if (self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "ledger is in use by another thread");
    return NULL;
  }
  ledger_free_core(self);
  Py_RETURN_NONE;
}

static PyObject *Ledger_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  if (!ledger_live((bh_ledger_obj *)self)) return NULL;
  return bh_py_newref(self);
}

static PyObject *Ledger_exit(PyObject *self, PyObject *args) {
  (void)args;
  return Ledger_close(self, NULL);
}

/* ------------------------------------------------------------- joining */

static PyObject *Ledger_join(PyObject *self_o, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"role", "pack", "interpreter", "generation", "host_pid", NULL};
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  PyObject *role_o, *pack_o = NULL, *interp_o = NULL, *gen_o = NULL, *host_o = NULL;
  char pack[BH_LEDGER_PACK_MAX] = "", interp[BH_LEDGER_INTERP_MAX] = "";
  uint64_t gen = 0;
  pid_t host_pid = 0;
  int rc;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOO:join", kwlist, &role_o, &pack_o, &interp_o,
                                   &gen_o, &host_o))
    return NULL;
  int role = word_index(role_o, "role", role_names, 4);
  if (role < 0 || (pack_o && put_str(pack_o, "pack", pack, sizeof pack) < 0) ||
      (interp_o && put_str(interp_o, "interpreter", interp, sizeof interp) < 0) ||
      (gen_o && as_u64(gen_o, "generation", UINT32_MAX, &gen) < 0) ||
      (host_o && as_pid(host_o, "host_pid", 1, &host_pid) < 0))
    return NULL;
  bh_ledger *l = ledger_enter(self);
  if (!l) return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_ledger_join(l, role, pack, interp, (uint32_t)gen, host_pid);
  Py_END_ALLOW_THREADS
  ledger_exit(self);
  if (rc < 0) return ledger_raise(self, rc, "ledger join");
  return PyLong_FromLong(rc);
}

static PyObject *Ledger_leave(PyObject *self_o, PyObject *unused) {
  (void)unused;
  return ledger_call((bh_ledger_obj *)self_o, bh_ledger_leave, "ledger leave", 0);
}

/* ------------------------------------------------------------- writers */

static PyObject *Ledger_set_run(PyObject *self_o, PyObject *arg) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  bh_ledger *l = ledger_live(self);
  if (!l) return NULL;
  int run = word_index(arg, "run state", run_names, 5);
  if (run < 0) return NULL;
  if (run == BH_RUN_STALE) return PyErr_Format(PyExc_ValueError, "run state 'stale' is only read, never set");
  int rc = bh_ledger_set_run(l, run);
  if (rc < 0) return ledger_raise(self, rc, "ledger set_run");
  Py_RETURN_NONE;
}

static PyObject *Ledger_set_device(PyObject *self_o, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"device", "held_bytes", "pinned_bytes", "pin_ceiling_bytes",
                           "pager_bytes", "floor_bytes", "reserve_bytes", NULL};
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  PyObject *dev_o, *v[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  bh_ledger_device d;
  memset(&d, 0, sizeof d);
  bh_ledger *l = ledger_live(self);
  if (!l) return NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOOO:set_device", kwlist, &dev_o, &v[0], &v[1],
                                   &v[2], &v[3], &v[4], &v[5]))
    return NULL;
  if (put_str(dev_o, "device", d.device, sizeof d.device) < 0) return NULL;
  if (!d.device[0]) {
    PyErr_SetString(PyExc_ValueError, "device must not be empty");
    return NULL;
  }
  uint64_t *dst[6] = {&d.held_bytes, &d.pinned_bytes, &d.pin_ceiling_bytes,
                      &d.pager_bytes, &d.floor_bytes, &d.reserve_bytes};
  for (int i = 0; i < 6; i++)
    if (v[i] && as_u64(v[i], kwlist[i + 1], BH_PY_BYTES_MAX, dst[i]) < 0) return NULL;
  int rc = bh_ledger_set_device(l, &d);
  if (rc < 0) return ledger_raise(self, rc, "ledger set_device");
  Py_RETURN_NONE;
}

static PyObject *Ledger_set_model(PyObject *self_o, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"model_id", "name", "device", "size_bytes", "resident_bytes", NULL};
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  PyObject *id_o, *name_o, *dev_o, *size_o, *res_o;
  bh_ledger_model m;
  memset(&m, 0, sizeof m);
  bh_ledger *l = ledger_live(self);
  if (!l) return NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO:set_model", kwlist, &id_o, &name_o, &dev_o,
                                   &size_o, &res_o))
    return NULL;
  if (as_u64(id_o, "model_id", UINT64_MAX, &m.id) < 0 ||
      put_str(name_o, "name", m.name, sizeof m.name) < 0 ||
      put_str(dev_o, "device", m.device, sizeof m.device) < 0 ||
      as_u64(size_o, "size_bytes", BH_PY_BYTES_MAX, &m.size_bytes) < 0 ||
      as_u64(res_o, "resident_bytes", BH_PY_BYTES_MAX, &m.resident_bytes) < 0)
    return NULL;
  int rc = bh_ledger_set_model(l, &m);
  if (rc < 0) return ledger_raise(self, rc, "ledger set_model");
  Py_RETURN_NONE;
}

static PyObject *Ledger_drop_model(PyObject *self_o, PyObject *arg) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  uint64_t id;
  bh_ledger *l = ledger_live(self);
  if (!l || as_u64(arg, "model_id", UINT64_MAX, &id) < 0) return NULL;
  int rc = bh_ledger_drop_model(l, id);
  if (rc == -ENOENT) {
    PyErr_SetObject(PyExc_KeyError, arg);
    return NULL;
  }
  if (rc < 0) return ledger_raise(self, rc, "ledger drop_model");
  Py_RETURN_NONE;
}

static PyObject *Ledger_note_release(PyObject *self_o, PyObject *arg) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  uint64_t bytes;
  bh_ledger *l = ledger_live(self);
  if (!l || as_u64(arg, "bytes", BH_PY_BYTES_MAX, &bytes) < 0) return NULL;
  int rc = bh_ledger_note_release(l, bytes);
  if (rc < 0) return ledger_raise(self, rc, "ledger note_release");
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------- readers */

/* New reference: one record as a dict. */
static PyObject *record_dict(const bh_ledger_record *r) {
  PyObject *devices = PyList_New(0), *models = PyList_New(0), *d = NULL;
  if (!devices || !models) goto err;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const bh_ledger_device *e = &r->devices[i];
    PyObject *o = Py_BuildValue(
        "{s:N,s:K,s:K,s:K,s:K,s:K,s:K}", "device", str_of(e->device), "held_bytes",
        (unsigned long long)e->held_bytes, "pinned_bytes", (unsigned long long)e->pinned_bytes,
        "pin_ceiling_bytes", (unsigned long long)e->pin_ceiling_bytes, "pager_bytes",
        (unsigned long long)e->pager_bytes, "floor_bytes", (unsigned long long)e->floor_bytes,
        "reserve_bytes", (unsigned long long)e->reserve_bytes);
    if (!o || PyList_Append(devices, o) < 0) {
      Py_XDECREF(o);
      goto err;
    }
    Py_DECREF(o);
  }
  for (uint32_t i = 0; i < r->n_models; i++) {
    const bh_ledger_model *e = &r->models[i];
    PyObject *o = Py_BuildValue("{s:K,s:N,s:N,s:K,s:K}", "id", (unsigned long long)e->id, "name",
                                str_of(e->name), "device", str_of(e->device), "size_bytes",
                                (unsigned long long)e->size_bytes, "resident_bytes",
                                (unsigned long long)e->resident_bytes);
    if (!o || PyList_Append(models, o) < 0) {
      Py_XDECREF(o);
      goto err;
    }
    Py_DECREF(o);
  }
  d = Py_BuildValue("{s:i,s:i,s:K,s:N,s:k,s:i,s:N,s:N,s:N,s:K,s:K,s:K,s:O,s:O}",
                    "slot", r->slot, "pid", (int)r->pid,
                    "start_time", (unsigned long long)r->start_time,
                    "role", word_of(r->role, role_names, 4),
                    "generation", (unsigned long)r->generation,
                    "host_pid", (int)r->host_pid,
                    "pack", str_of(r->pack),
                    "interpreter", str_of(r->interpreter),
                    "run", word_of(r->run, run_names, 5),
                    "last_used_ns", (unsigned long long)r->last_used_ns,
                    "release_count", (unsigned long long)r->release_count,
                    "released_bytes", (unsigned long long)r->released_bytes,
                    "devices", devices, "models", models);
err:
  Py_XDECREF(devices);
  Py_XDECREF(models);
  return d;
}

static PyObject *Ledger_records(PyObject *self_o, PyObject *unused) {
  (void)unused;
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  PyObject *list = NULL;
  int n;
  bh_ledger_record *recs = PyMem_Malloc(sizeof *recs * BH_LEDGER_SLOTS);
  if (!recs) return PyErr_NoMemory();
  bh_ledger *l = ledger_enter(self);
  if (!l) goto out;
  Py_BEGIN_ALLOW_THREADS
  n = bh_ledger_snapshot(l, recs, BH_LEDGER_SLOTS);
  Py_END_ALLOW_THREADS
  ledger_exit(self);
  if (n < 0) {
    ledger_raise(self, n, "ledger records");
    goto out;
  }
  list = PyList_New(0);
  for (int i = 0; list && i < n; i++) {
    PyObject *d = record_dict(&recs[i]);
    if (!d || PyList_Append(list, d) < 0) Py_CLEAR(list);
    Py_XDECREF(d);
  }
out:
  PyMem_Free(recs);
  return list;
}

static PyObject *Ledger_read(PyObject *self_o, PyObject *arg) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  pid_t pid;
  int rc;
  if (as_pid(arg, "pid", 0, &pid) < 0) return NULL;
  bh_ledger_record *r = PyMem_Malloc(sizeof *r);
  if (!r) return PyErr_NoMemory();
  PyObject *res = NULL;
  bh_ledger *l = ledger_enter(self);
  if (!l) goto out;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_ledger_read(l, pid, r);
  Py_END_ALLOW_THREADS
  ledger_exit(self);
  if (rc == -ESRCH) res = bh_py_newref(Py_None);
  else if (rc < 0) ledger_raise(self, rc, "ledger read");
  else res = record_dict(r);
out:
  PyMem_Free(r);
  return res;
}

static PyObject *Ledger_resident(PyObject *self_o, PyObject *args) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  PyObject *pid_o, *id_o;
  pid_t pid;
  uint64_t id, size, resident;
  bh_ledger *l = ledger_live(self);
  if (!l || !PyArg_ParseTuple(args, "OO:resident", &pid_o, &id_o) ||
      as_pid(pid_o, "pid", 0, &pid) < 0 || as_u64(id_o, "model_id", UINT64_MAX, &id) < 0)
    return NULL;
  if (self->hint_pid != pid) self->hint = -1, self->hint_pid = pid;
  int rc = bh_ledger_model_read(l, pid, id, &self->hint, &size, &resident);
  if (rc == -ESRCH || rc == -ENOENT) Py_RETURN_NONE;
  if (rc < 0) return ledger_raise(self, rc, "ledger resident");
  return Py_BuildValue("(KK)", (unsigned long long)size, (unsigned long long)resident);
}

static PyObject *Ledger_version(PyObject *self_o, PyObject *arg) {
  bh_ledger_obj *self = (bh_ledger_obj *)self_o;
  pid_t pid;
  uint32_t version;
  bh_ledger *l = ledger_live(self);
  if (!l || as_pid(arg, "pid", 0, &pid) < 0) return NULL;
  int rc = bh_ledger_version(l, pid, NULL, &version);
  if (rc == -ESRCH) Py_RETURN_NONE;
  if (rc < 0) return ledger_raise(self, rc, "ledger version");
  return PyLong_FromUnsignedLong(version);
}

static PyObject *Ledger_reap(PyObject *self_o, PyObject *unused) {
  (void)unused;
  return ledger_call((bh_ledger_obj *)self_o, bh_ledger_reap, "ledger reap", 1);
}

#ifdef BH_TESTING
/* Test hooks, in BH_TESTING builds only: take and drop the segment's robust
 * mutex, so a test can kill or stop a process while it holds it (the kill
 * matrix).  _test_lock() waits as long as any locker does (a bounded
 * wait: Timeout past it). */
static PyObject *Ledger_test_lock(PyObject *self_o, PyObject *unused) {
  (void)unused;
  return ledger_call((bh_ledger_obj *)self_o, bh__ledger_lock, "ledger lock", 0);
}

static PyObject *Ledger_test_unlock(PyObject *self_o, PyObject *unused) {
  (void)unused;
  bh_ledger *l = ledger_live((bh_ledger_obj *)self_o);
  if (!l) return NULL;
  bh__ledger_unlock(l);
  Py_RETURN_NONE;
}
#endif

/* ------------------------------------------------------------- attributes */

static PyObject *Ledger_path(PyObject *self_o, void *c) {
  (void)c;
  bh_ledger *l = ledger_live((bh_ledger_obj *)self_o);
  return l ? PyUnicode_DecodeFSDefault(bh_ledger_path(l)) : NULL;
}

static PyObject *Ledger_slot(PyObject *self_o, void *c) {
  (void)c;
  bh_ledger *l = ((bh_ledger_obj *)self_o)->ledger;
  int slot = l ? bh_ledger_slot(l) : -1;
  return PyLong_FromLong(slot < 0 ? -1 : slot);
}

static PyObject *Ledger_joined(PyObject *self_o, void *c) {
  (void)c;
  bh_ledger *l = ((bh_ledger_obj *)self_o)->ledger;
  return PyBool_FromLong(l && bh_ledger_slot(l) >= 0);
}

static PyObject *Ledger_closed(PyObject *self_o, void *c) {
  (void)c;
  return PyBool_FromLong(((bh_ledger_obj *)self_o)->ledger == NULL);
}

PyObject *bh_py_ledger_default_path(PyObject *module, PyObject *unused) {
  (void)module, (void)unused;
  char buf[PATH_MAX];
  int rc = bh_ledger_default_path(buf, sizeof buf);
  if (rc < 0) {
    PyErr_SetString(PyExc_ValueError, "BULKHEAD_LEDGER is longer than PATH_MAX");
    return NULL;
  }
  return PyUnicode_DecodeFSDefault(buf);
}

PyObject *bh_py_private_dir(PyObject *module, PyObject *args) {
  (void)module;
  PyObject *path_o, *path_b = NULL;
  int create = 1, rc;
  if (!PyArg_ParseTuple(args, "O|p:private_dir", &path_o, &create)) return NULL;
  if (!PyUnicode_FSConverter(path_o, &path_b)) return NULL;
  const char *path = PyBytes_AsString(path_b);
  if (!path) goto err;
  Py_BEGIN_ALLOW_THREADS
  rc = bh_private_dir(path, create);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    PyObject *e = Py_BuildValue("(isO)", -rc, strerror(-rc), path_o);
    if (e) {
      PyErr_SetObject(PyExc_OSError, e);
      Py_DECREF(e);
    }
    goto err;
  }
  Py_DECREF(path_b);
  Py_RETURN_NONE;
err:
  Py_XDECREF(path_b);
  return NULL;
}

static PyMethodDef Ledger_methods[] = {
    {"join", (PyCFunction)(void (*)(void))Ledger_join, METH_VARARGS | METH_KEYWORDS,
     "join(role, pack='', interpreter='', generation=0, host_pid=0) -> slot\n"
     "Claims (or refills) this process's record; role is 'host', 'worker' or 'tool'."},
    {"leave", Ledger_leave, METH_NOARGS, "leave(): frees this process's record"},
    {"close", Ledger_close, METH_NOARGS,
     "close(): leaves, unmaps; the last handle anywhere removes the file (idempotent)"},
    {"__enter__", Ledger_enter, METH_NOARGS, NULL},
    {"__exit__", Ledger_exit, METH_VARARGS, NULL},
    {"set_run", Ledger_set_run, METH_O,
     "set_run('idle'|'busy'|'releasing'|'working'): also stamps last_used_ns"},
    {"set_device", (PyCFunction)(void (*)(void))Ledger_set_device, METH_VARARGS | METH_KEYWORDS,
     "set_device(device, held_bytes=0, pinned_bytes=0, pin_ceiling_bytes=0, pager_bytes=0,\n"
     "           floor_bytes=0, reserve_bytes=0): insert or replace by name"},
    {"set_model", (PyCFunction)(void (*)(void))Ledger_set_model, METH_VARARGS | METH_KEYWORDS,
     "set_model(model_id, name, device, size_bytes, resident_bytes): insert or replace by id"},
    {"drop_model", Ledger_drop_model, METH_O, "drop_model(model_id); KeyError if absent"},
    {"note_release", Ledger_note_release, METH_O, "note_release(bytes): count one release"},
    {"records", Ledger_records, METH_NOARGS, "records() -> [dict]: every live record (reaps first)"},
    {"read", Ledger_read, METH_O, "read(pid) -> dict or None"},
    {"resident", Ledger_resident, METH_VARARGS,
     "resident(pid, model_id) -> (size_bytes, resident_bytes) or None; no locks, no syscalls"},
    {"version", Ledger_version, METH_O,
     "version(pid) -> the write counter of pid's record (it moves with every change), or None; "
     "no locks, no syscalls"},
    {"reap", Ledger_reap, METH_NOARGS, "reap() -> number of dead processes' records freed"},
#ifdef BH_TESTING
    {"_test_lock", Ledger_test_lock, METH_NOARGS,
     "_test_lock(): takes the segment's mutex (tests only: kill or stop the holder)"},
    {"_test_unlock", Ledger_test_unlock, METH_NOARGS, "_test_unlock(): drops it"},
#endif
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Ledger_getset[] = {
    {"path", Ledger_path, NULL, "the segment file", NULL},
    {"slot", Ledger_slot, NULL, "this process's record, or -1", NULL},
    {"joined", Ledger_joined, NULL, "whether this process has a record through this handle", NULL},
    {"closed", Ledger_closed, NULL, "whether close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot Ledger_slots[] = {
    {Py_tp_new, Ledger_new},
    {Py_tp_dealloc, Ledger_dealloc},
    {Py_tp_traverse, Ledger_traverse},
    {Py_tp_methods, Ledger_methods},
    {Py_tp_getset, Ledger_getset},
    {Py_tp_doc, "Ledger(path=None): a handle on the machine-wide ledger of every bulkhead process."},
    {0, NULL}};

PyType_Spec bh_ledger_spec = {"bulkhead._native.Ledger", sizeof(bh_ledger_obj), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Ledger_slots};
