/*
 * status.c (binding) -- _native.status_json(ledger=None, gpu=None): the
 * document `bulkhead status --json` prints (schema in src/status/status.c),
 * built by the same C code (the status library), so ComfyUI's GET
 * /bulkhead/status and the command can never disagree.
 *
 * ledger: an open Ledger (read through; joined or not, it stays open), a
 * path (opened for this call and closed again; a path with no file is not
 * created), or None for the default path.  gpu: an open Gpu to read the
 * devices through, or None to open NVML for this call (dlopen + nvmlInit)
 * and close it again.  A host passes the handles it already holds, so a
 * request costs neither.  The snapshot reads without the GIL; both objects
 * count the borrow, so closing either from another thread meanwhile
 * raises there instead of freeing it here.
 */
#include "common.h"

#include <string.h>

#include "src/status/status.h"

PyObject *bh_py_status_json(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"ledger", "gpu", NULL};
  bh_state *st = bh_py_state(module);
  PyObject *ledger_o = Py_None, *gpu_o = Py_None, *path_b = NULL, *out = NULL;
  PyObject *ledger_held = NULL, *gpu_held = NULL; /* borrowed: the args, while counted */
  bh_ledger *ledger = NULL;
  bh_gpu *gpu = NULL;
  const char *path = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:status_json", kwlist, &ledger_o, &gpu_o))
    return NULL;
  if (ledger_o != Py_None && PyObject_TypeCheck(ledger_o, st->Ledger)) {
    if (!(ledger = bh_py_ledger_borrow(st, ledger_o))) goto done;
    ledger_held = ledger_o;
  } else if (ledger_o != Py_None) {
    if (!PyUnicode_FSConverter(ledger_o, &path_b)) goto done;
    path = PyBytes_AsString(path_b);
    if (!path) goto done;
  }
  if (gpu_o != Py_None) {
    if (!(gpu = bh_py_gpu_borrow(st, gpu_o))) goto done;
    gpu_held = gpu_o;
  }
  bh_status_probes probes;
  bh_status_snap snap;
  bh_buf buf;
  int rc;
  bh_buf_init(&buf);
  memset(&probes, 0, sizeof probes);
  Py_BEGIN_ALLOW_THREADS
  if (gpu) probes.gpu = gpu; /* the caller's: not closed here */
  else bh_status_probes_open(&probes);
  rc = bh_status_snap_take(&snap, path, ledger, &probes);
  if (rc == 0) rc = bh_status_json(&buf, &snap);
  bh_status_snap_free(&snap);
  if (!gpu) bh_status_probes_close(&probes);
  Py_END_ALLOW_THREADS
  if (rc < 0) bh_py_raise(st, rc, "status_json");
  else out = PyUnicode_DecodeUTF8((const char *)buf.data, (Py_ssize_t)buf.len, "replace");
  bh_buf_free(&buf);
done:
  if (ledger_held) bh_py_ledger_unborrow(ledger_held);
  if (gpu_held) bh_py_gpu_unborrow(gpu_held);
  Py_XDECREF(path_b);
  return out;
}
