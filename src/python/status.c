/*
 * status.c (binding) -- _native.status_json(ledger=None): the document
 * `bulkhead status --json` prints (schema in tools/status.c), built by the
 * same C code, so ComfyUI's GET /bulkhead/status and the command can never
 * disagree.  The snapshot reads files and NVML without the GIL.
 */
#include "common.h"

#include "cli.h" /* tools/: the status snapshot and its renderings */

PyObject *bh_py_status_json(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"ledger", NULL};
  PyObject *path_o = Py_None, *path_b = NULL, *out = NULL;
  const char *path = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:status_json", kwlist, &path_o)) return NULL;
  if (path_o != Py_None) {
    if (!PyUnicode_FSConverter(path_o, &path_b)) return NULL;
    path = PyBytes_AsString(path_b);
    if (!path) goto done;
  }
  bh_cli_probes probes;
  bh_cli_snap snap;
  bh_buf buf;
  int rc;
  bh_buf_init(&buf);
  Py_BEGIN_ALLOW_THREADS
  bh_cli_probes_open(&probes);
  rc = bh_cli_snap_take(&snap, path, &probes);
  if (rc == 0) rc = bh_cli_status_json(&buf, &snap);
  bh_cli_snap_free(&snap);
  bh_cli_probes_close(&probes);
  Py_END_ALLOW_THREADS
  if (rc < 0) bh_py_raise(bh_py_state(module), rc, "status_json");
  else out = PyUnicode_DecodeUTF8((const char *)buf.data, (Py_ssize_t)buf.len, "replace");
  bh_buf_free(&buf);
done:
  Py_XDECREF(path_b);
  return out;
}
