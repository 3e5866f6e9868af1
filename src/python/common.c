/*
 * common.c -- the helpers every binding calls (common.h): the module's
 * state, and turning a core error code into a Python exception that names
 * the failing call (the one raise helper STYLE.md asks for; it always
 * returns NULL).  module.c, the module's top, only registers the bindings.
 */
#include "common.h"

#include <errno.h>

bh_state *bh_py_state(PyObject *module) { return (bh_state *)PyModule_GetState(module); }

PyObject *bh_py_raise_as(PyObject *type, int rc, const char *call, const char *detail) {
  const char *name = bh_errname(rc);
  int code = rc < 0 ? -rc : rc;
  PyObject *text = detail && detail[0]
                       ? PyUnicode_FromFormat("%s: %s (%s): %s", call, bh_strerror(rc),
                                              name ? name : "?", detail)
                       : PyUnicode_FromFormat("%s: %s (%s)", call, bh_strerror(rc), name ? name : "?");
  PyObject *exc = text ? PyObject_CallFunctionObjArgs(type, text, NULL) : NULL;
  Py_XDECREF(text);
  if (!exc) return NULL;
  PyObject *pycode = PyLong_FromLong(code);
  PyObject *pyname = PyUnicode_FromString(name ? name : "");
  if (pycode && pyname && PyObject_SetAttrString(exc, "code", pycode) == 0 &&
      PyObject_SetAttrString(exc, "errname", pyname) == 0)
    PyErr_SetObject(type, exc);
  Py_XDECREF(pycode);
  Py_XDECREF(pyname);
  Py_DECREF(exc);
  return NULL;
}

PyObject *bh_py_raise(bh_state *st, int rc, const char *call) {
  int code = rc < 0 ? -rc : rc;
  PyObject *type;
  if (code == ETIMEDOUT) type = st->Timeout;
  else if (code == BH_EEOF || code == EPIPE || code == ECONNRESET) type = st->PeerClosed;
  else if (code >= BH_ELEDGER && code <= BH_EMODELS) type = st->LedgerError;
  else if (code == BH_EPOOLFULL) type = st->Error; /* our own limit: the peer did nothing wrong */
  else if (code >= BH_EMAGIC) type = st->ProtocolError;
  else {
    /* OSError(errno, "call: reason"): the errno subclass (ConnectionRefusedError,
     * ...) is chosen by OSError itself; the message names the failing call. */
    PyObject *msg = PyUnicode_FromFormat("%s: %s", call ? call : "bulkhead", bh_strerror(rc));
    PyObject *e = msg ? Py_BuildValue("(iN)", code, msg) : NULL; /* N: takes msg */
    if (e) {
      PyErr_SetObject(PyExc_OSError, e);
      Py_DECREF(e);
    }
    return NULL;
  }
  return bh_py_raise_as(type, rc, call, NULL);
}
