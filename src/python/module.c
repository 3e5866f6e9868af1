/*
 * module.c -- the bulkhead._native module: its method table, its state
 * (types and exception classes) and its exec function.  The bindings live
 * beside what they wrap: channel.c, codec.c, ledger.c, policy.c, probe.c, shm.c,
 * standin.c, supervisor.c; the helpers every binding calls back (module
 * state, errors raised) are common.c's, so this file sits only on top.
 */
#include "common.h"


static PyObject *bh_py_strerror(PyObject *module, PyObject *arg) {
  (void)module;
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(bh_strerror((int)code));
}

static PyObject *bh_py_dtypes(PyObject *module, PyObject *unused) {
  (void)module, (void)unused;
  PyObject *d = PyDict_New();
  if (!d) return NULL;
#define BH__DT_ENTRY(name, code, size, str)                                   \
  {                                                                           \
    PyObject *v = Py_BuildValue("(ii)", code, size);                          \
    if (!v || PyDict_SetItemString(d, str, v) < 0) {                          \
      Py_XDECREF(v);                                                          \
      Py_DECREF(d);                                                           \
      return NULL;                                                            \
    }                                                                         \
    Py_DECREF(v);                                                             \
  }
  BH_DTYPE_MAP(BH__DT_ENTRY)
#undef BH__DT_ENTRY
  return d;
}

static PyMethodDef bh_methods[] = {
    {"channel_open", (PyCFunction)(void (*)(void))bh_py_channel_open, METH_VARARGS | METH_KEYWORDS,
     "channel_open(fd, hooks, peer_uid, peer_pid=0, pool_keep_bytes=0, first_id=1, spin_ns=0,\n"
     "             forward=False) -> Channel\n"
     "Takes over fd (one end of a SOCK_SEQPACKET socketpair), also when it raises: only a\n"
     "TypeError from the arguments themselves leaves fd to the caller.  forward: keep the\n"
     "peer's large blocks' fds, so a view of one goes to another channel's peer by reference."},
    {"spawn", (PyCFunction)(void (*)(void))bh_py_spawn, METH_VARARGS | METH_KEYWORDS,
     "spawn(interpreter, argv, env, cwd=None, sink=-1, prefix=None, sandbox=None) -> (Proc, fd)\n"
     "Starts a worker with the channel's child end as fd 3; sandbox (read, write, devices,\n"
     "network): the child execs inside that Landlock sandbox (see sandbox_apply)."},
    {"sandbox_abi", bh_py_sandbox_abi, METH_NOARGS,
     "sandbox_abi() -> int: the kernel's Landlock ABI version, 0 where it has none"},
    {"sandbox_apply", bh_py_sandbox_apply, METH_O,
     "sandbox_apply((read, write, devices, network)) -> int: the ABI applied\n"
     "Restricts this process's calling thread, and what it starts after, for good: read,\n"
     "list and execute beneath `read`, anything beneath `write`, read/write/ioctl the\n"
     "devices; no TCP unless network; signals and abstract sockets only inside.  OSError\n"
     "(ENOSYS: no Landlock) names the step that failed."},
    {"spawn_via", (PyCFunction)(void (*)(void))bh_py_spawn_via, METH_VARARGS | METH_KEYWORDS,
     "spawn_via(zygote_fd, request, sink=-1, prefix=None, timeout_ms=0) -> (Proc, fd)\n"
     "As spawn, the worker forked by a zygote (worker/zygote.py) asked on zygote_fd; an\n"
     "OSError carries the zygote's reason.  One request at a time per zygote."},
    {"relax_ns", bh_py_relax_ns, METH_NOARGS,
     "relax_ns() -> float: what one OpenMP spin-wait step (x86 `pause`) costs here, in ns\n"
     "(the least of a few timed runs; about 1 ms)"},
    {"ram", (PyCFunction)(void (*)(void))bh_py_ram, METH_VARARGS | METH_KEYWORDS,
     "ram(root=None) -> dict of byte counts: total_bytes, available_bytes (MemTotal and\n"
     "MemAvailable clamped by the cgroup), meminfo_total_bytes, meminfo_available_bytes,\n"
     "cgroup_version (0, 1, 2), limited, cgroup_limit_bytes, cgroup_current_bytes,\n"
     "cgroup_reclaimable_bytes (of the tightest level), swap_total_bytes.  root: read\n"
     "proc/ and sys/fs/cgroup/ below this directory instead of /."},
    {"ledger_default_path", bh_py_ledger_default_path, METH_NOARGS,
     "ledger_default_path() -> $BULKHEAD_LEDGER, else /dev/shm/bulkhead-<uid>/ledger (or\n"
     "$XDG_RUNTIME_DIR/bulkhead-ledger where another user took that directory)"},
    {"private_dir", bh_py_private_dir, METH_VARARGS,
     "private_dir(path, create=True): makes path 0700 if missing, then raises OSError unless\n"
     "it is a directory (not a link) owned by our euid with no group/other bits"},
    {"standin", (PyCFunction)(void (*)(void))bh_py_standin_new, METH_VARARGS | METH_KEYWORDS,
     "standin(owner, ledger, pid, model_id, *, generation, name, size_bytes, model,\n"
     "        load_device, offload_device, dtype=None, clone_base_uuid=None) -> StandIn"},
    {"standin_info", bh_py_standin_info, METH_O, "standin_info(s) -> dict (bulkhead's own view)"},
    {"standin_retire", bh_py_standin_retire, METH_O,
     "standin_retire(s): its worker's generation ended; reads 0, sends nothing."},
    {"policy_ask_target", bh_py_policy_ask_target, METH_VARARGS, "policy_ask_target(need, upstream_free, host_cache, true_free, true_free_valid) -> memory_required for free_memory"},
    {"policy_admission_need", bh_py_policy_admission_need, METH_VARARGS, "policy_admission_need(weights, memory_required, minimum_inference, extra_reserved, cast_buffers=0) -> bytes"},
    {"policy_pending", bh_py_policy_pending, METH_VARARGS, "policy_pending(admitted, held_at_admission, held_now) -> bytes no reading shows yet"},
    {"policy_reserve", bh_py_policy_reserve, METH_VARARGS, "policy_reserve(base, pendings) -> EXTRA_RESERVED_VRAM to publish"},
    {"policy_load_bytes", bh_py_policy_load_bytes, METH_VARARGS, "policy_load_bytes(extra_memory, size, resident) -> bytes to load"},
    {"policy_unload_bytes", bh_py_policy_unload_bytes, METH_VARARGS, "policy_unload_bytes(memory_to_free, resident) -> bytes to release"},
    {"policy_ask_bytes", bh_py_policy_ask_bytes, METH_O, "policy_ask_bytes(size) -> bytes a MemoryHolder ask plans for (int or float; NaN, 0, negative: 0)"},
    {"policy_release_plan", bh_py_policy_release_plan, METH_VARARGS, "policy_release_plan([(idle, last_used_ns, resident, floor)...], shortfall) -> ([(index, bytes)...], uncovered)"},
    {"policy_pin_ceiling", bh_py_policy_pin_ceiling, METH_VARARGS, "policy_pin_ceiling(ram, swap, windows=False) -> upstream pinned-memory ceiling"},
    {"policy_share", bh_py_policy_share, METH_VARARGS, "policy_share(total, n_processes) -> one process's share"},
    {"status_json", (PyCFunction)(void (*)(void))bh_py_status_json, METH_VARARGS | METH_KEYWORDS,
     "status_json(ledger=None, gpu=None) -> str: the document `bulkhead status --json` prints;\n"
     "ledger: an open Ledger, a path or None (the default); gpu: an open Gpu or None (NVML opened for the call)"},
    {"strerror", bh_py_strerror, METH_O, "strerror(code) -> str"},
    {"dtypes", bh_py_dtypes, METH_NOARGS, "dtypes() -> {name: (code, itemsize)}"},
    {NULL, NULL, 0, NULL}};

static int bh_add_type(PyObject *m, PyTypeObject **slot, PyType_Spec *spec) {
  *slot = (PyTypeObject *)PyType_FromSpec(spec);
  if (!*slot) return -1;
  const char *dot = strrchr(spec->name, '.');
  Py_INCREF(*slot);
  if (PyModule_AddObject(m, dot ? dot + 1 : spec->name, (PyObject *)*slot) < 0) {
    Py_DECREF(*slot);
    return -1;
  }
  return 0;
}

static int bh_add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *base, const char *doc) {
  char full[96];
  snprintf(full, sizeof full, "bulkhead._native.%s", name);
  *slot = PyErr_NewExceptionWithDoc(full, doc, base, NULL);
  if (!*slot) return -1;
  Py_INCREF(*slot);
  if (PyModule_AddObject(m, name, *slot) < 0) {
    Py_DECREF(*slot);
    return -1;
  }
  return 0;
}

static int bh_exec(PyObject *m) {
  bh_state *st = bh_py_state(m);
  if (bh_add_type(m, &st->Channel, &bh_channel_spec) < 0 ||
      bh_add_type(m, &st->Caller, &bh_caller_spec) < 0 ||
      bh_add_type(m, &st->Lease, &bh_lease_spec) < 0 ||
      bh_add_type(m, &st->Proc, &bh_proc_spec) < 0 ||
      bh_add_type(m, &st->Gpu, &bh_gpu_spec) < 0 ||
      bh_add_type(m, &st->Ledger, &bh_ledger_spec) < 0 ||
      bh_add_type(m, &st->StandIn, &bh_standin_spec) < 0 ||
      bh_add_type(m, &st->RemoteModel, &bh_remote_model_spec) < 0)
    return -1;
  if (!(st->str_exports = PyUnicode_InternFromString("exports")) ||
      !(st->str_pending_releases = PyUnicode_InternFromString("pending_releases")))
    return -1;
  PyObject *hooks = bh_py_caller_hooks();
  if (!hooks || PyModule_AddObject(m, "CALLER_HOOKS", hooks) < 0) {
    Py_XDECREF(hooks);
    return -1;
  }
  PyObject *surface = bh_py_comfy_surface();
  if (!surface || PyModule_AddObject(m, "COMFY_SURFACE", surface) < 0) {
    Py_XDECREF(surface);
    return -1;
  }
  if (bh_add_exc(m, &st->Error, "Error", PyExc_Exception, "Base of bulkhead's channel errors.") < 0 ||
      bh_add_exc(m, &st->ProtocolError, "ProtocolError", st->Error,
                 "A frame or value broke the protocol; .code and .errname name how.") < 0 ||
      bh_add_exc(m, &st->PeerClosed, "PeerClosed", st->Error, "The other end is gone.") < 0 ||
      bh_add_exc(m, &st->NotDelivered, "NotDelivered", st->PeerClosed,
                 "The other end was gone before a request reached it: none of the request ran.") < 0 ||
      bh_add_exc(m, &st->Timeout, "Timeout", st->Error, "A deadline passed.") < 0 ||
      bh_add_exc(m, &st->ProbeError, "ProbeError", st->Error,
                 "A memory probe failed; .code and .errname name how.") < 0 ||
      bh_add_exc(m, &st->DriverUnavailable, "DriverUnavailable", st->ProbeError,
                 "No usable GPU driver (BH_ENODRIVER): keep upstream's own semantics.") < 0 ||
      bh_add_exc(m, &st->LedgerError, "LedgerError", st->Error,
                 "The ledger refused: not a ledger, another layout version, full, not joined, "
                 "no room for another model; .code and .errname name which.") < 0)
    return -1;
  if (bh_py_probe_exec(m, st) < 0) return -1;
  if (PyModule_AddIntConstant(m, "PROTOCOL_VERSION", BH_PROTOCOL_VERSION) < 0 ||
      PyModule_AddIntConstant(m, "INLINE_MAX", BH_FRAME_INLINE_MAX) < 0 ||
      PyModule_AddIntConstant(m, "MAX_DEPTH", BH_MAX_DEPTH) < 0 ||
      PyModule_AddIntConstant(m, "STATUS_UNREPORTED", BH_STATUS_UNREPORTED) < 0 ||
      PyModule_AddIntConstant(m, "HELLO", BH_KIND_HELLO) < 0 ||
      PyModule_AddIntConstant(m, "CALL", BH_KIND_CALL) < 0 ||
      PyModule_AddIntConstant(m, "RESULT", BH_KIND_RESULT) < 0 ||
      PyModule_AddIntConstant(m, "ERROR", BH_KIND_ERROR) < 0 ||
      PyModule_AddIntConstant(m, "PROGRESS", BH_KIND_PROGRESS) < 0 ||
      PyModule_AddIntConstant(m, "CALLBACK", BH_KIND_CALLBACK) < 0 ||
      PyModule_AddIntConstant(m, "INTERRUPT", BH_KIND_INTERRUPT) < 0 ||
      PyModule_AddIntConstant(m, "RELEASE", BH_KIND_RELEASE) < 0 ||
      PyModule_AddIntConstant(m, "RESIDENCY", BH_KIND_RESIDENCY) < 0 ||
      PyModule_AddIntConstant(m, "BYE", BH_KIND_BYE) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_NUMPY", BH_TENSOR_NUMPY) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_TORCH", BH_TENSOR_TORCH) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_NUMPY_SCALAR", BH_TENSOR_NUMPY_SCALAR) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_LIB_MASK", BH_TENSOR_LIB_MASK) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_REQUIRES_GRAD", BH_TENSOR_REQUIRES_GRAD) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_INFERENCE", BH_TENSOR_INFERENCE) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_PARAMETER", BH_TENSOR_PARAMETER) < 0 ||
      PyModule_AddIntConstant(m, "TENSOR_INLINE_MAX", BH_TENSOR_INLINE_MAX) < 0 ||
      PyModule_AddIntConstant(m, "ARENA_ITEM_MAX", BH_ARENA_ITEM_MAX) < 0 ||
      PyModule_AddIntConstant(m, "ARENA_ALIGN", BH_ARENA_ALIGN) < 0 ||
      PyModule_AddIntConstant(m, "ENCODE_TENSOR", BH_PY_ENC_TENSOR) < 0 ||
      PyModule_AddIntConstant(m, "ENCODE_HANDLE", BH_PY_ENC_HANDLE) < 0 ||
      PyModule_AddIntConstant(m, "ENCODE_VALUE", BH_PY_ENC_VALUE) < 0 ||
      PyModule_AddIntConstant(m, "HANDLE_CALLABLE", BH_HANDLE_CALLABLE) < 0 ||
      PyModule_AddIntConstant(m, "HANDLE_OBJECT", BH_HANDLE_OBJECT) < 0 ||
      PyModule_AddIntConstant(m, "TYPE_NAME_MAX", BH_TYPE_NAME_MAX) < 0 ||
      PyModule_AddIntConstant(m, "ARRAY_DESC_MAX", BH_ARRAY_DESC_MAX) < 0 ||
      PyModule_AddIntConstant(m, "LEDGER_VERSION", BH_LEDGER_VERSION) < 0 ||
      PyModule_AddIntConstant(m, "LEDGER_SLOTS", BH_LEDGER_SLOTS) < 0 ||
      PyModule_AddIntConstant(m, "LEDGER_DEVICES", BH_LEDGER_DEVICES) < 0 ||
      PyModule_AddIntConstant(m, "LEDGER_MODELS", BH_LEDGER_MODELS) < 0 ||
      PyModule_AddIntConstant(m, "LEDGER_PACK_MAX", BH_LEDGER_PACK_MAX) < 0 ||
      PyModule_AddIntConstant(m, "PAYLOAD_MAX", BH_FRAME_PAYLOAD_MAX) < 0)
    return -1;
  return 0;
}

static int bh_traverse(PyObject *m, visitproc visit, void *arg) {
  bh_state *st = bh_py_state(m);
  Py_VISIT(st->Channel);
  Py_VISIT(st->Caller);
  Py_VISIT(st->Lease);
  Py_VISIT(st->Proc);
  Py_VISIT(st->Gpu);
  Py_VISIT(st->Ledger);
  Py_VISIT(st->StandIn);
  Py_VISIT(st->RemoteModel);
  Py_VISIT(st->Error);
  Py_VISIT(st->ProtocolError);
  Py_VISIT(st->PeerClosed);
  Py_VISIT(st->NotDelivered);
  Py_VISIT(st->Timeout);
  Py_VISIT(st->ProbeError);
  Py_VISIT(st->DriverUnavailable);
  Py_VISIT(st->LedgerError);
  Py_VISIT(st->str_exports);
  Py_VISIT(st->str_pending_releases);
  return 0;
}

static int bh_clear(PyObject *m) {
  bh_state *st = bh_py_state(m);
  Py_CLEAR(st->Channel);
  Py_CLEAR(st->Caller);
  Py_CLEAR(st->Lease);
  Py_CLEAR(st->Proc);
  Py_CLEAR(st->Gpu);
  Py_CLEAR(st->Ledger);
  Py_CLEAR(st->StandIn);
  Py_CLEAR(st->RemoteModel);
  Py_CLEAR(st->Error);
  Py_CLEAR(st->ProtocolError);
  Py_CLEAR(st->PeerClosed);
  Py_CLEAR(st->NotDelivered);
  Py_CLEAR(st->Timeout);
  Py_CLEAR(st->ProbeError);
  Py_CLEAR(st->DriverUnavailable);
  Py_CLEAR(st->LedgerError);
  Py_CLEAR(st->str_exports);
  Py_CLEAR(st->str_pending_releases);
  return 0;
}

static void bh_free(void *m) { bh_clear((PyObject *)m); }

static PyModuleDef_Slot bh_slots[] = {{Py_mod_exec, (void *)bh_exec}, {0, NULL}};

static struct PyModuleDef bh_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "bulkhead._native",
    .m_doc = "bulkhead's C core: channels, shared-memory blocks, worker processes, the ledger.",
    .m_size = sizeof(bh_state),
    .m_methods = bh_methods,
    .m_slots = bh_slots,
    .m_traverse = bh_traverse,
    .m_clear = bh_clear,
    .m_free = bh_free,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&bh_module); }
