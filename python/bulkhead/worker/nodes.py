"""The worker side of an isolated node pack: its nodes, described and run.

The host (``bulkhead.host.nodes``) starts ``<pack env>/python -m bulkhead.worker``
with the pack and ComfyUI named in the environment:

    BULKHEAD_COMFYUI        the host's ComfyUI directory (put first on sys.path,
                            as ComfyUI's main.py directory is in the host)
    BULKHEAD_PACK_DIR       the pack's directory
    BULKHEAD_PACK_MODULE    the submodule holding the real NODE_CLASS_MAPPINGS
                            ("nodes"), or empty: the package's __init__ itself
    BULKHEAD_PACK_NAME      the pack's name (log lines, handles)
    BULKHEAD_COMFY_ARGS     JSON: host flags mirrored into comfy.cli_args.args
    BULKHEAD_COMFY_FOLDERS  JSON: the host's folder_paths model directories

and then calls ``describe()`` (node metadata, as JSON) and ``run()`` /
``call_class()`` (a node's FUNCTION, check_lazy_status, IS_CHANGED,
VALIDATE_INPUTS) here.

The pack is imported once per worker as a package named after its
directory, so its relative imports work.  When the nodes live in a
submodule (``nodes.py`` or ``nodes/``), the package is made from the
directory without running its ``__init__.py``: that file is the host-side
glue (the one call into bulkhead), not the nodes.

ComfyUI is imported by the pack, not here.  Hooks wait for the modules to
appear (an import watcher on sys.meta_path): ``comfy.cli_args`` gets the
host's flags right after it executes, before ``comfy.model_management``
reads them; ``folder_paths`` gets the host's directories; ``comfy.utils``
gets the progress hook; ``comfy.model_management`` gets a pending interrupt.

Everything this module assigns in a comfy module is in this process only
(a worker, where bulkhead is every caller).
"""

import asyncio
import inspect
import json
import os
import re
import sys
import threading
import time

from .. import _native
from .. import worker as _worker
from .._importwatch import when_imported
from ..channel.formats import FORMAT, Meta, NodeInterrupted, WorkerOutOfMemory, apply_host_folders, decode_arg
from ..channel.peer import type_name
from ..packimport import import_nodes
from . import typed as _typed


_lock = threading.RLock()
_ready_done = False
_classes = {}            # mapping key -> class
_display = {}
_nodes_module = None
_in_call = False
_interrupt_pending = False
_last_progress = [0.0, None]


# --- what the host mirrors ---



def apply_host_args(cli, mirrored):
    """Sets each mirrored host flag on this process's comfy.cli_args.args.
    Returns the names set; a flag this ComfyUI does not have is skipped."""
    args = getattr(cli, "args", None)
    done = []
    if args is None:
        return done
    for name, value in mirrored.items():
        if not hasattr(args, name):
            continue
        try:
            setattr(args, name, decode_arg(value, cli))  # worker-side
            done.append(name)
        except Exception as e:
            print(f"bulkhead: cannot mirror --{name.replace('_', '-')} into this worker: {e}", file=sys.stderr)
    return done


def _env_json(name):
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        print(f"bulkhead: ignoring malformed {name}: {e}", file=sys.stderr)
        return None


# --- progress and interrupt ---

def _progress_hook(value, total, preview=None, prompt_id=None, node_id=None, **_kw):
    """comfy.utils' global progress hook in this worker: ComfyUI's own
    check (as the host's hook does), then a PROGRESS frame to the host.
    Previews are not sent."""
    mm = sys.modules.get("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()
    peer = _worker._peer
    if not _in_call or peer is None or peer.channel is None:
        return
    now = time.monotonic()
    done = total is not None and value is not None and value >= total
    if not done and total == _last_progress[1] and now - _last_progress[0] < 0.01:
        return
    _last_progress[0], _last_progress[1] = now, total
    try:
        peer.channel.notify(_native.PROGRESS, {"value": value, "total": total})
    except (_native.Error, TypeError, ValueError):
        pass


def _install_progress(utils):
    setter = getattr(utils, "set_progress_bar_global_hook", None)
    if setter is not None:
        setter(_progress_hook)
    else:
        utils.PROGRESS_BAR_HOOK = _progress_hook  # worker-side


def _on_interrupt():
    """INTERRUPT frame or SIGUSR1: set this worker's own ComfyUI flag."""
    global _interrupt_pending
    mm = sys.modules.get("comfy.model_management")
    setter = getattr(mm, "interrupt_current_processing", None)
    if setter is not None:
        setter(True)
    else:
        _interrupt_pending = True  # for a ComfyUI imported later in this call


def _mm_imported(mm):
    if _interrupt_pending and _in_call:
        mm.interrupt_current_processing(True)


def _begin_call():
    """Each call starts with no interrupt pending (an interrupt of the last
    call that arrived after it ended must not stop this one)."""
    global _in_call, _interrupt_pending
    _interrupt_pending = False
    mm = sys.modules.get("comfy.model_management")
    if mm is not None and hasattr(mm, "interrupt_current_processing"):
        mm.interrupt_current_processing(False)
    _last_progress[0], _last_progress[1] = 0.0, None
    _in_call = True


def _end_call():
    global _in_call
    _in_call = False


# --- set-up ---

def ready():
    """Puts ComfyUI on sys.path and the hooks in place (once)."""
    global _ready_done
    with _lock:
        if _ready_done:
            return
        base = os.environ.get("BULKHEAD_COMFYUI")
        if base and base not in sys.path:
            sys.path.insert(0, base)
        mirrored = _env_json("BULKHEAD_COMFY_ARGS")
        if mirrored:
            when_imported("comfy.cli_args", lambda m: apply_host_args(m, mirrored))
        folders = _env_json("BULKHEAD_COMFY_FOLDERS")
        if folders:
            when_imported("folder_paths", lambda m: apply_host_folders(m, folders))
        when_imported("comfy.utils", _install_progress)
        when_imported("comfy.model_management", _mm_imported)
        if _on_interrupt not in _worker.interrupt_handlers:
            _worker.interrupt_handlers.append(_on_interrupt)
        _ready_done = True


def warm():
    """Imports the pack (host/prewarm.py, ahead of its first node);
    returns the number of node classes."""
    _load()
    return len(_classes)


def _load():
    """The pack's node classes, imported once."""
    global _nodes_module
    with _lock:
        ready()
        if _nodes_module is not None:
            return _nodes_module
        pack_dir = os.environ.get("BULKHEAD_PACK_DIR")
        if not pack_dir:
            raise RuntimeError("this worker serves no node pack (BULKHEAD_PACK_DIR is not set)")
        module = os.environ.get("BULKHEAD_PACK_MODULE", "auto") or None
        mod = import_nodes(pack_dir, module)
        mappings = getattr(mod, "NODE_CLASS_MAPPINGS", None)
        if not isinstance(mappings, dict):
            raise ImportError(f"{mod.__name__} ({pack_dir}) defines no NODE_CLASS_MAPPINGS dict")
        _classes.clear()
        _classes.update(mappings)
        _display.clear()
        _display.update(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", None) or {})
        _nodes_module = mod
        return mod


def _class(key):
    _load()
    try:
        return _classes[key]
    except KeyError:
        raise LookupError(f"pack {os.environ.get('BULKHEAD_PACK_NAME', '?')!r} has no node {key!r} "
                          "(its metadata cache is stale? it is rebuilt when the sources change)") from None


# --- describe ---

_UPPER = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SKIP = {"INPUT_TYPES", "IS_CHANGED", "VALIDATE_INPUTS", "FUNCTION", "RELATIVE_PYTHON_MODULE"}
_METHODS = ("IS_CHANGED", "VALIDATE_INPUTS", "check_lazy_status")


class _FolderRecorder:
    """While INPUT_TYPES runs, remembers the lists folder_paths handed out,
    so the host can give ComfyUI its own live lists for them."""

    def __init__(self):
        self.lists = {}
        self._fp = None
        self._orig = None

    def __enter__(self):
        fp = sys.modules.get("folder_paths")
        orig = getattr(fp, "get_filename_list", None)
        if orig is None:
            return self
        lists = self.lists

        def get_filename_list(folder_name, *args, **kwargs):
            out = orig(folder_name, *args, **kwargs)
            if isinstance(out, list):
                lists[id(out)] = (folder_name, out)
            return out
        self._fp, self._orig = fp, orig
        fp.get_filename_list = get_filename_list  # worker-side, for this call only
        return self

    def __exit__(self, *exc):
        if self._fp is not None:
            self._fp.get_filename_list = self._orig


def _argspec(fn, meta, where):
    try:
        spec = inspect.getfullargspec(fn)
    except TypeError:
        return {"args": [], "varkw": "kwargs", "bound": True, "defaults": [],
                "kwonly": [], "kwonlydefaults": {}, "varargs": None}
    return {
        "args": list(spec.args),
        "varargs": spec.varargs,
        "varkw": spec.varkw,
        "defaults": [meta(d, f"{where} default") for d in (spec.defaults or ())],
        "kwonly": list(spec.kwonlyargs),
        "kwonlydefaults": {k: meta(d, f"{where} default") for k, d in (spec.kwonlydefaults or {}).items()},
        "bound": inspect.ismethod(fn),
    }


def _describe_class(key, cls, problems):
    if not isinstance(cls, type):
        raise TypeError(f"NODE_CLASS_MAPPINGS[{key!r}] is a {type_name(cls)}, not a class")
    function = getattr(cls, "FUNCTION", None)
    if not isinstance(function, str):
        raise TypeError(f"{cls.__qualname__} has no FUNCTION naming its method")
    with _FolderRecorder() as rec:
        input_types = cls.INPUT_TYPES()
    meta = Meta(key, problems, rec.lists)
    out = {
        "class_name": cls.__qualname__,
        "class_module": cls.__module__,
        "function": function,
        "input_types": meta(input_types, "INPUT_TYPES()"),
        "attrs": {},
        "methods": {},
    }
    for name in dir(cls):
        if not _UPPER.match(name) or name in _SKIP:
            continue
        try:
            value = getattr(cls, name)
        except Exception:
            continue
        if callable(value) or isinstance(value, (property, classmethod, staticmethod)):
            continue
        out["attrs"][name] = meta(value, name)
    for name in _METHODS:
        fn = getattr(cls, name, None)
        if callable(fn):
            out["methods"][name] = _argspec(fn, meta, name)
    return out


def describe():
    """The pack's node metadata, as a JSON string (the host caches it)."""
    ready()
    try:
        import folder_paths  # noqa: F401  (so INPUT_TYPES' file lists can be recognised)
    except Exception:
        pass
    mod = _load()
    problems, nodes = [], {}
    for key, cls in list(_classes.items()):
        try:
            nodes[str(key)] = _describe_class(key, cls, problems)
        except Exception as e:
            problems.append(f"node {key!r} left out: {type(e).__name__}: {e}")
    v = sys.version_info
    return json.dumps({
        "format": FORMAT,
        "module": mod.__name__,
        "python": f"{v[0]}.{v[1]}.{v[2]}",
        "nodes": nodes,
        "display": {str(k): str(v) for k, v in _display.items() if str(k) in nodes},
        "problems": problems,
    })


# --- run ---

def _is_interrupt(e):
    return any(c.__name__ == "InterruptProcessingException" for c in type(e).__mro__)


def is_oom(e):
    """Whether e is an out-of-memory error: MemoryError, torch's
    OutOfMemoryError, or what ComfyUI's own is_oom says."""
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None:
        for cls in (getattr(torch, "OutOfMemoryError", None),
                    getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)):
            if isinstance(cls, type) and isinstance(e, cls):
                return True
    mm = sys.modules.get("comfy.model_management")
    check = getattr(mm, "is_oom", None)
    if check is not None and getattr(mm, "OOM_EXCEPTION", Exception) is not Exception:
        try:
            return bool(check(e))
        except Exception:
            return False
    return False


def _translate(e):
    """Raises what the host should see for an exception from pack code."""
    if _is_interrupt(e):
        raise NodeInterrupted("the node was interrupted") from None
    if isinstance(e, Exception) and is_oom(e) or isinstance(e, MemoryError):
        raise WorkerOutOfMemory(f"{type_name(e)}: {e}") from e
    if isinstance(e, SystemExit):
        raise RuntimeError(f"the node called sys.exit({e.code!r})") from e
    raise e


def _sendable(v, peer, types, depth=0):
    """v with everything the codec cannot carry replaced by a handle (the
    object stays in this worker's table).  Tensors on a device are copied
    to the CPU; tuples stay tuples."""
    if v is None or isinstance(v, (bool, float, str, bytes, bytearray)):
        return v
    if isinstance(v, int):
        if -(1 << 63) <= v < (1 << 63):
            return v
    elif depth < 32 and isinstance(v, (list, tuple)):
        items = [_sendable(x, peer, types, depth + 1) for x in v]
        return tuple(items) if isinstance(v, tuple) else items
    elif depth < 32 and isinstance(v, dict):
        if all(isinstance(k, (str, int, float, bool)) or k is None for k in v):
            return {k: _sendable(x, peer, types, depth + 1) for k, x in v.items()}
    elif _tensor_ok(v):
        return v
    else:
        torch = sys.modules.get("torch")
        if torch is not None and type(v) in (torch.Tensor, torch.nn.Parameter) and v.device.type != "cpu":
            cpu = v.detach().cpu()
            if _tensor_ok(cpu):
                return cpu
    typed = _typed.serialize(v, lambda x: _sendable(x, peer, types, depth + 1))
    if typed is not None:       # a custom type a pack registered a serializer for
        return typed
    held = peer.hold(v)
    types[held.ident] = type_name(v)
    return held


def _tensor_ok(v):
    from ..channel import tensors as _tensors
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, (np.ndarray, np.generic)):
        if v.dtype.hasobject or v.dtype.fields is not None:
            return False
        try:
            _tensors._numpy_code(np, v.dtype)
            return True
        except TypeError:
            return False
    torch = sys.modules.get("torch")
    if torch is not None and type(v) in (torch.Tensor, torch.nn.Parameter):
        if v.device.type != "cpu" or v.layout != torch.strided:
            return False
        try:
            _tensors._torch_code(torch, v.dtype)
            return True
        except TypeError:
            return False
    return False


async def _await(aw):
    return await aw


def _invoke(fn, kwargs):
    _begin_call()
    try:
        out = fn(**kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        return out
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        _translate(e)
    finally:
        _end_call()


def run(key, kwargs, instance=None, method=None):
    """Runs node `key`'s FUNCTION (or `method`) on `instance` (a handle
    the host got from an earlier run; None makes a new instance) with
    kwargs.  Returns {"outputs", "instance", "types"}: the result, with
    objects that cannot cross held here as handles, the instance's handle,
    and the type name of every handle."""
    cls = _class(key)
    peer = _worker._peer
    peer.drop_unsent()
    if instance is None:
        instance = cls()
    fn = getattr(instance, method or cls.FUNCTION)
    kwargs = _typed.restore(kwargs)
    out = _invoke(fn, kwargs)
    types = {}
    outputs = _sendable(out, peer, types)
    inst = peer.hold(instance)
    types[inst.ident] = type_name(instance)
    return {"outputs": outputs, "instance": inst, "types": types}


def call_class(key, method, kwargs):
    """IS_CHANGED / VALIDATE_INPUTS of node `key`, called on the class as
    ComfyUI does.  A result that cannot cross becomes its repr."""
    cls = _class(key)
    out = _invoke(getattr(cls, method), kwargs)
    if not _plain(out):
        return repr(out)
    return out


def _plain(v, depth=0):
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return not isinstance(v, int) or -(1 << 63) <= v < (1 << 63)
    if depth < 16 and isinstance(v, (list, tuple)):
        return all(_plain(x, depth + 1) for x in v)
    if depth < 16 and isinstance(v, dict):
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def held_count():
    """How many objects this worker holds for the host (tests)."""
    peer = _worker._peer
    return len(peer.objects) if peer is not None else 0


def comfy_state():
    """What the mirroring did, for tests and `bulkhead doctor`."""
    out = {"sys_path0": sys.path[0] if sys.path else None}
    cli = sys.modules.get("comfy.cli_args")
    if cli is not None:
        out["args"] = {k: (sorted(str(getattr(x, "value", x)) for x in v) if isinstance(v, set) else v)
                       for k, v in vars(cli.args).items()
                       if isinstance(v, (type(None), bool, int, float, str, list, set))}
    fp = sys.modules.get("folder_paths")
    if fp is not None:
        out["folders"] = {k: list(v[0]) for k, v in getattr(fp, "folder_names_and_paths", {}).items()}
        out["output_directory"] = fp.get_output_directory() if hasattr(fp, "get_output_directory") else None
    return out
