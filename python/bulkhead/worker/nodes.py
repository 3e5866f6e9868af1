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
VALIDATE_INPUTS) here; for a V3 node (a ``comfy_api`` ComfyNode, listed in
NODE_CLASS_MAPPINGS or returned by the pack's ``comfy_entrypoint()``
extension) ``describe()`` captures its finalised schema and ``run_v3()``
calls its classmethods on a class clone carrying the hidden values.

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

from .. import _native
from .. import worker as _worker
from .._importwatch import when_imported
from ..channel.formats import (FORMAT, Meta, NodeInterrupted, TypeTable, WorkerOutOfMemory, apply_host_folders,
                               decode_arg, own_type, own_type_name, types_from_host)
from ..channel.nodes import decode_hidden, encode_io, encode_preview, passed_through, plain_str, set_graph_prefix
from ..channel.peer import NodeValue, type_name
from ..channel.spec import COMFY_ARGS, COMFY_FOLDERS, COMFYUI, PACK_DIR, PACK_MODULE, PACK_NAME
from ..packimport import import_nodes
from . import server


_lock = threading.RLock()
_ready_done = False
_classes = {}            # mapping key -> class
_display = {}
_nodes_module = None
_in_call = False
_interrupt_pending = False


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
    check (as the host's hook does), then a PROGRESS frame to the host for
    every update, as ComfyUI's hook sends every one (none dropped: the
    websocket gets what it gets in-process), with the preview (a (format,
    PIL.Image, max_size) tuple) as raw pixels the host rebuilds into the
    same tuple for its own hook."""
    mm = sys.modules.get("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()
    elif _interrupt_pending and _in_call:   # a node using comfy.utils alone: ComfyUI's flag has no module yet
        raise NodeInterrupted("the node was interrupted")
    peer = _worker._peer
    ticket = _task_ticket.get() if _task_ticket is not None else None   # an async node's task
    if not (_in_call or ticket) or peer is None or peer.channel is None:
        return
    frame = {"value": value, "total": total}
    if ticket:
        frame["ticket"] = ticket
    if preview is not None:
        frame["preview"] = encode_preview(preview)
    try:
        peer.channel.notify(_native.PROGRESS, frame)
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
        base = os.environ.get(COMFYUI)
        if base and base not in sys.path:
            sys.path.insert(0, base)
        mirrored = _env_json(COMFY_ARGS)
        if mirrored:
            when_imported("comfy.cli_args", lambda m: apply_host_args(m, mirrored))
        folders = _env_json(COMFY_FOLDERS)
        if folders:
            when_imported("folder_paths", lambda m: apply_host_folders(m, folders))
        when_imported("comfy.utils", _install_progress)
        when_imported("comfy.model_management", _mm_imported)
        if _on_interrupt not in _worker.interrupt_handlers:
            _worker.interrupt_handlers.append(_on_interrupt)
        if "server" not in sys.modules:  # the pack's `from server import PromptServer`
            sys.modules["server"] = server
        _ready_done = True


def warm():
    """Imports the pack (host/prewarm.py, ahead of its first node);
    returns the number of node classes."""
    _load()
    return len(_classes)


class _Rehearsal:
    """What rehearse() holds as a node instance."""


def rehearse(kwargs):
    """A node call's round trip with no node in it (PackRuntime.prewarm,
    after warm): inputs received, the call's interrupt reset, an output
    value and a held instance sent back.  The first call of a process pays
    for running that path's code for the first time, in both processes;
    a prewarmed worker has paid it before the prompt's first node."""
    peer = _worker._peer
    peer.drop_unsent()
    out = _invoke(lambda **kw: (kw,), kwargs)
    _warm_torch()
    return {"outputs": NodeValue(out), "instance": peer.hold(_Rehearsal())}


def _warm_torch():
    """Where the pack imported torch: what the first tensor operations of
    a process pay once -- torch's intra-op thread pool started (a parallel
    fill), the CPU allocator, and the first run of an elementwise op, a
    matmul (the BLAS's set-up) and a reduction -- paid here, at prewarm, so
    that the first node does not (in ComfyUI's own process a pack's first
    node runs after torch ran models there; #40: the first node, prewarmed,
    cost 1.12-1.17x in-process).  On the CPU, in float32 and under
    inference_mode whatever defaults the pack set (no CUDA context, no
    autograd record), and nothing random (the pack's random streams stay as
    they were).  Never here in a zygote: its pool's threads would not
    survive the fork."""
    torch = sys.modules.get("torch")
    full = getattr(torch, "full", None)
    if full is None:   # no torch, or one only partly imported: the node pays, as it would have
        return
    try:
        with torch.inference_mode():
            x = full((256, 256), 1.0 / 256, dtype=torch.float32, device="cpu")   # above the parallel grain
            float(torch.tanh(x @ x + 0.5).sum())
    except Exception:  # best effort: a torch that fails here fails the node, which says why
        pass


def _load():
    """The pack's node classes, imported once."""
    global _nodes_module
    with _lock:
        ready()
        if _nodes_module is not None:
            return _nodes_module
        pack_dir = os.environ.get(PACK_DIR)
        if not pack_dir:
            raise RuntimeError("this worker serves no node pack (BULKHEAD_PACK_DIR is not set)")
        module = os.environ.get(PACK_MODULE, "auto") or None
        mod = import_nodes(pack_dir, module)
        mappings = getattr(mod, "NODE_CLASS_MAPPINGS", None)
        display = getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", None) or {}
        if mappings is None and hasattr(mod, "comfy_entrypoint"):
            mappings, display = _entrypoint_nodes(mod, pack_dir)
        if not isinstance(mappings, dict):
            raise ImportError(f"{mod.__name__} ({pack_dir}) defines no NODE_CLASS_MAPPINGS dict "
                              "(nor a comfy_entrypoint())")
        _classes.clear()
        _classes.update(mappings)
        _display.clear()
        _display.update(display)
        _nodes_module = mod
        return mod


def _entrypoint_nodes(mod, pack_dir):
    """A V3 pack's (mappings, display names) from its comfy_entrypoint():
    the ComfyExtension it returns is loaded (on_load awaited) and each
    class of get_node_list() keyed by its schema's node_id, as ComfyUI's
    load_custom_node does."""
    where = f"{mod.__name__}.comfy_entrypoint ({pack_dir})"
    entrypoint = mod.comfy_entrypoint
    if not callable(entrypoint):
        raise ImportError(f"{where} is not callable")
    extension = _run_maybe_async(entrypoint())
    if not callable(getattr(extension, "get_node_list", None)):
        raise ImportError(f"{where} returned a {type_name(extension)}, not a ComfyExtension")
    on_load = getattr(extension, "on_load", None)
    if callable(on_load):
        _run_maybe_async(on_load())
    node_list = _run_maybe_async(extension.get_node_list())
    if not isinstance(node_list, list):
        raise ImportError(f"{where}: get_node_list() returned a {type_name(node_list)}, not a list of nodes")
    mappings, display = {}, {}
    for cls in node_list:
        schema = cls.GET_SCHEMA()
        mappings[schema.node_id] = cls
        if schema.display_name is not None:
            display[schema.node_id] = schema.display_name
    return mappings, display


def _run_maybe_async(value):
    return asyncio.run(_await(value)) if inspect.isawaitable(value) else value


def route_modules(mod):
    """The pack's modules whose ROUTES lists count: the nodes module and
    the package above it, when imported."""
    out = [mod]
    pkg = sys.modules.get(mod.__name__.rpartition(".")[0]) if "." in mod.__name__ else None
    if pkg is not None and pkg is not mod:
        out.append(pkg)
    return out


def _class(key):
    _load()
    try:
        return _classes[key]
    except KeyError:
        raise LookupError(f"pack {os.environ.get(PACK_NAME, '?')!r} has no node {key!r} "
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


def is_v3(cls):
    """Whether cls is a V3 node (a comfy_api ComfyNode)."""
    internal = sys.modules.get("comfy_api.internal")
    base = getattr(internal, "_ComfyNodeInternal", None)
    return isinstance(cls, type) and base is not None and issubclass(cls, base)


_V3_METHODS = ("validate_inputs", "fingerprint_inputs", "check_lazy_status")
_V3_SCHEMA_PARTS = ("inputs", "outputs", "hidden")


def _own_override(cls, name):
    """cls's own override of a ComfyNode placeholder, or None."""
    base = cls.GET_BASE_CLASS() if hasattr(cls, "GET_BASE_CLASS") else None
    for c in cls.__mro__:
        if c is base:
            return None
        if name in c.__dict__:
            return getattr(cls, name)
    return None


class _Strict(Meta):
    """Meta for a V3 schema: anything that would cross changed (a string
    for an object) is an error naming where it is, not a warning."""

    def problem(self, where, what):
        raise TypeError(f"{where} {what}")


def _describe_v3(key, cls, problems, types):
    """A V3 node: its finalised schema (what GET_NODE_INFO_V1 is made
    from), whether execute is async, and the optional methods it has."""
    import dataclasses  # lazy: worker start (only a V3 pack's)
    io = sys.modules["comfy_api.latest"].io
    with _FolderRecorder() as rec:
        schema = cls.GET_SCHEMA()
    meta = _Strict(key, problems, rec.lists, types)
    fields = {}
    for f in dataclasses.fields(schema):
        if f.name not in _V3_SCHEMA_PARTS:
            fields[f.name] = meta(getattr(schema, f.name), f"schema.{f.name}")
    out = {
        "v3": True,
        "class_name": cls.__qualname__,
        "class_module": cls.__module__,
        "schema": fields,
        "inputs": [encode_io(x, meta, f"input {getattr(x, 'id', i)!r}", io, False)
                   for i, x in enumerate(schema.inputs or ())],
        "outputs": [encode_io(x, meta, f"output {getattr(x, 'id', i)!r}", io, True)
                    for i, x in enumerate(schema.outputs or ())],
        "hidden": [plain_str(getattr(h, "value", h)) for h in schema.hidden or ()],
        "execute_async": inspect.iscoroutinefunction(cls.execute),
        "methods": {},
    }
    for name in _V3_METHODS:
        fn = _own_override(cls, name)
        if fn is not None:
            out["methods"][name] = dict(_argspec(fn, meta, name), async_=inspect.iscoroutinefunction(fn))
    return out


def _describe_class(key, cls, problems, types):
    if not isinstance(cls, type):
        raise TypeError(f"NODE_CLASS_MAPPINGS[{key!r}] is a {type_name(cls)}, not a class")
    if is_v3(cls):
        return _describe_v3(key, cls, problems, types)
    function = getattr(cls, "FUNCTION", None)
    if not isinstance(function, str):
        raise TypeError(f"{cls.__qualname__} has no FUNCTION naming its method")
    with _FolderRecorder() as rec:
        input_types = cls.INPUT_TYPES()
    meta = Meta(key, problems, rec.lists, types)
    out = {
        "class_name": cls.__qualname__,
        "class_module": cls.__module__,
        "function": function,
        "function_async": inspect.iscoroutinefunction(getattr(cls, function, None)),
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


def _plain_options(options):
    """A dropdown's options as they cross (plain strings and numbers), or
    None where they are not such a list."""
    if isinstance(options, list) and all(
            isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in options):
        return [str.__str__(x) if isinstance(x, str) else x for x in options]
    return None


def _v3_combos(cls):
    """A V3 node's dropdowns, {category: {input id: [options]}}: each
    input's options as its define_schema gives them now (ComfyUI's own
    process runs it again for each node definition asked, as INPUT_TYPES);
    a dynamic input's are left out (the host keeps its described ones)."""
    io = sys.modules["comfy_api.latest"].io
    dynamic = getattr(io, "DynamicInput", None)
    node = {}
    for x in cls.GET_SCHEMA().inputs or ():
        options = _plain_options(getattr(x, "options", None))
        if options is not None and not (dynamic is not None and isinstance(x, dynamic)):
            node.setdefault("optional" if getattr(x, "optional", False) else "required", {})[str(x.id)] = options
    return node


def combos():
    """targets.COMBOS: {key: {category: {input: [options]}}}: every node's
    dropdowns (a V1 input whose type is a list of plain values, a V3
    input with such options) as its INPUT_TYPES or define_schema gives
    them now, as ComfyUI's own process gets them each time the frontend
    asks for the node definitions (a list a pack builds with os.listdir
    shows a file added since).  A node whose INPUT_TYPES or
    define_schema raises is left out (the host keeps its described
    lists), and so is every node where the pack is not imported yet
    (this asks nothing that imports it)."""
    if _nodes_module is None:
        return {}
    out = {}
    for key, cls in list(_classes.items()):
        try:
            if is_v3(cls):
                node = _v3_combos(cls)
            else:
                spec, node = cls.INPUT_TYPES(), {}
                for category in ("required", "optional"):
                    for name, s in (spec.get(category) or {}).items() if isinstance(spec, dict) else ():
                        options = _plain_options(s[0]) if isinstance(s, (tuple, list)) and s else None
                        if options is not None:
                            node.setdefault(category, {})[str(name)] = options
        except Exception:
            continue
        if node:
            out[str(key)] = node
    return out


# --- what the host's server asks of the pack (worker/server.py serves it) ---

def handle_route(index, method, path, request, timeout_s):
    """targets.HANDLE_ROUTE: the pack's route #index (method, path as
    described) for the host, the pack imported first (a worker just
    restarted has not imported it yet)."""
    entries = server.collect_routes(route_modules(_load()))[0]
    return server.serve_route(entries, index, method, path, request, timeout_s)


def on_prompt(json_data, timeout_s):
    """targets.ON_PROMPT: the pack's prompt handlers on the host's prompt.
    Refused while the pack is not imported in this worker (a worker just
    restarted): its handlers are not registered yet, and an empty answer
    would skip them silently."""
    if _nodes_module is None:
        raise RuntimeError(f"pack {os.environ.get(PACK_NAME, '?')!r} is not imported in this worker "
                           "yet: its prompt handlers are not registered")
    return server.run_prompt_handlers(json_data, timeout_s)


def _type_names(node):
    """The plain type names a described node's inputs and outputs have (its
    own type strings are in the TypeTable)."""
    def items(v):   # Meta's tuple tag or a list
        if isinstance(v, dict) and v.get("__bh__") == "tuple":
            return v["items"]
        return v if isinstance(v, list) else [v]
    names = []
    if node.get("v3"):
        names = [d.get("io_type") for part in ("inputs", "outputs") for d in node.get(part) or ()]
    else:
        sections = node.get("input_types")
        for section in (sections.values() if isinstance(sections, dict) else ()):
            if isinstance(section, dict):
                names.extend(items(v)[0] for v in section.values() if items(v))
        names.extend(items((node.get("attrs") or {}).get("RETURN_TYPES")))
    return [n for n in names if isinstance(n, str)]


def describe(host_type_names=()):
    """The pack's node metadata, as a JSON string (the host caches it).
    host_type_names: the type names the host's registered nodes return,
    which the pack's own type strings are compared with too (TypeTable)."""
    ready()
    try:
        import folder_paths  # noqa: F401; comfyui: folder_paths (so INPUT_TYPES' file lists can be recognised)
    except Exception:
        pass
    mod = _load()
    problems, nodes, types = [], {}, TypeTable()
    for key, cls in list(_classes.items()):
        try:
            nodes[str(key)] = _describe_class(key, cls, problems, types)
        except Exception as e:
            problems.append(f"node {key!r} left out: {type(e).__name__}: {e}")
    names = [n for node in nodes.values() for n in _type_names(node)]
    names.extend(n for n in host_type_names or () if isinstance(n, str))
    type_entries = types.entries(names, problems)
    routes, prompt_handlers = [], 0
    shim = sys.modules.get("server")
    if getattr(shim, "collect_routes", None) is not None:  # ours, not a real server.py
        entries, route_problems = shim.collect_routes(route_modules(mod))
        routes = shim.describe_routes(entries)
        problems.extend(route_problems)
        prompt_handlers = len(shim.PromptServer.instance.on_prompt_handlers)
    v = sys.version_info
    return json.dumps({
        "format": FORMAT,
        "module": mod.__name__,
        "python": f"{v[0]}.{v[1]}.{v[2]}",
        "nodes": nodes,
        "types": type_entries,
        "routes": routes,
        "prompt_handlers": prompt_handlers,
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


async def _await(aw):
    return await aw


def _invoke(fn, kwargs):
    """fn(**kwargs) as ComfyUI's executor calls node code: under
    ``torch.inference_mode()`` where the pack has imported torch (upstream's
    PromptExecutor runs every node inside it; a pack without torch does not
    get it imported here), an awaitable answer run to its end."""
    _begin_call()
    try:
        torch = sys.modules.get("torch")
        if torch is None:
            out = fn(**kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_await(out))
            return out
        with torch.inference_mode():
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


# --- async V1 nodes: several in flight, as tasks of one event loop ---
#
# In ComfyUI's own process a node whose FUNCTION is a coroutine function runs
# as a task of the executor's event loop, and the executor goes on with other
# nodes while it waits (execution.py's pending async nodes): three such nodes
# sleeping a second each take a second together.  Here a pack's coroutines run
# as tasks of one event loop, on a thread of its own that lives as long as the
# worker (so asyncio objects a pack keeps between calls, a Semaphore in a class
# attribute, stay on one loop, as in-process).  run_async starts one and
# answers at once; when the task ends, the loop thread tells the host (a
# PROGRESS frame with the host's ticket and "done") and the host fetches the
# outcome with async_result.  Between the two the worker serves other calls.
# Progress the task reports carries its ticket, so the host shows it on the
# node that started it.  An interrupt sets ComfyUI's flag, which the task's
# progress hook checks, as a node on the main thread does.

_aloop = None            # the event loop of the pack's tasks, on its own thread
_tasks = {}              # ticket -> _Task
_task_ticket = None      # a ContextVar: the ticket of the task this code runs in
_host_asks = None        # what the loop thread asked of the host (call_host), for async_pump


class _Task:
    """One async node call in flight: its future (concurrent), and what its
    result needs to cross as run's (or, v3, run_v3's) does."""
    __slots__ = ("future", "kwargs", "received", "v3")

    def __init__(self, future, kwargs, received, v3):
        self.future, self.kwargs, self.received, self.v3 = future, kwargs, received, v3


def _task_loop():
    """The event loop of the pack's tasks, started on first use."""
    global _aloop, _task_ticket, _host_asks
    with _lock:
        if _aloop is None:
            import contextvars  # lazy: worker start (only async nodes)
            from _queue import SimpleQueue  # lazy: worker start
            _task_ticket = contextvars.ContextVar("bulkhead_task_ticket", default=None)
            _host_asks = SimpleQueue()
            loop = asyncio.new_event_loop()
            threading.Thread(target=_run_task_loop, args=(loop,), name="bulkhead-async", daemon=True).start()
            _aloop = loop
        return _aloop


def _run_task_loop(loop):
    asyncio.set_event_loop(loop)
    _worker.task_thread = threading.current_thread()
    loop.run_forever()


_loop_grad = None   # the inference_mode the loop thread entered once, for good


def _loop_inference_mode():
    """The loop thread under torch.inference_mode() for good, once the pack
    has imported torch: upstream runs its tasks on the executor's thread,
    inside the inference_mode around the whole prompt.  (Per task it could
    not be: tasks interleave, and one task's exit would end another's.)"""
    global _loop_grad
    if _loop_grad is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            mode = torch.inference_mode()
            mode.__enter__()
            _loop_grad = mode


def _notify_task(ticket, frame):
    peer = _worker._peer
    if peer is None or peer.channel is None:
        return
    frame["ticket"] = ticket
    try:
        peer.channel.notify(_native.PROGRESS, frame)
    except (_native.Error, TypeError, ValueError):
        pass


async def _task(ticket, coro):
    _loop_inference_mode()
    _task_ticket.set(ticket)
    try:
        return await coro
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, asyncio.CancelledError)):
            raise
        _translate(e)


def run_async(ticket, key, kwargs, instance=None, prefix=None):
    """Starts node `key`'s FUNCTION, a coroutine function, on `instance`
    (as run, the host's GraphBuilder prefix set as run sets it) as a task
    of the pack's event loop, under the host's `ticket`; answers
    {"instance"} at once.  When the task ends the host gets a
    PROGRESS frame {"ticket", "done"} and fetches the outcome
    (async_result)."""
    cls = _class(key)
    peer = _worker._peer
    peer.drop_unsent()
    if instance is None:
        instance = cls()
    set_graph_prefix(prefix)
    _start_task(ticket, getattr(instance, cls.FUNCTION), kwargs, False)
    return {"instance": peer.hold(instance)}


def run_v3_async(ticket, key, kwargs, hidden, prefix=None):
    """Starts V3 node `key`'s FUNCTION, a coroutine function, as run_async
    starts a V1 node's, on the class clone run_v3 makes; the outcome
    (async_result) is run_v3's answer.  Answers {} at once."""
    cls = _class(key)
    peer = _worker._peer
    peer.drop_unsent()
    try:
        values = decode_hidden(dict(hidden or {}), sys.modules["comfy_api.latest"].io)
        cls.VALIDATE_CLASS()
        clone = cls.PREPARE_CLASS_CLONE(values)
        fn = getattr(cls, cls.FUNCTION).__func__
        set_graph_prefix(prefix)
    except BaseException:
        if peer.received:
            peer.received.clear()
        raise
    _start_task(ticket, lambda **kw: fn(clone, **kw), kwargs, True)
    return {}


def _start_task(ticket, fn, kwargs, v3):
    """fn(**kwargs)'s coroutine as a task of the pack's loop, kept under
    ticket; the host told when it ends."""
    peer = _worker._peer
    loop = _task_loop()
    received = dict(peer.received) if peer.received else None   # for passed_through, at the end
    if peer.received:
        peer.received.clear()
    coro = _invoke(lambda **kw: _Coroutine(fn(**kw)), kwargs).coro
    if inspect.isawaitable(coro):
        future = asyncio.run_coroutine_threadsafe(_task(ticket, coro), loop)
    else:   # not a coroutine after all: its answer is the outcome
        import concurrent.futures  # lazy: worker start (only async nodes)
        future = concurrent.futures.Future()
        future.set_result(coro)
    _tasks[ticket] = _Task(future, kwargs, received, v3)
    future.add_done_callback(lambda f: f.cancelled() or _notify_task(ticket, {"done": True}))


class _Coroutine:
    """What _invoke hands back unawaited: the coroutine a FUNCTION made."""
    __slots__ = ("coro",)

    def __init__(self, coro):
        self.coro = coro


def async_result(ticket):
    """The outcome of the task run_async (run_v3_async) started: its
    outputs as run (run_v3) answers them ({"outputs", "same"}), or its
    error raised (translated as theirs)."""
    task = _tasks.pop(ticket, None)
    if task is None:
        raise LookupError(f"no async node call #{ticket} in this worker (it was fetched or cancelled)")
    out = task.future.result(0)
    peer = _worker._peer
    if task.received:
        peer.received.update(task.received)
    try:
        if task.v3:
            return _v3_answer(peer, task.kwargs, out)
        out, same = passed_through(peer, task.kwargs, out)
    finally:
        if peer.received:
            peer.received.clear()
    return {"outputs": NodeValue(out), "same": same}


def async_cancel(ticket):
    """The host gave up on the task (its prompt ended): cancelled, and its
    outcome dropped."""
    task = _tasks.pop(ticket, None)
    if task is not None:
        task.future.cancel()


def task_ask_host(target, args, kwargs):
    """call_host from the loop thread: the channel is the main thread's, so
    the request waits in a queue, the host is told (a PROGRESS frame
    {"pump"}), and it calls async_pump, which makes the request from the
    main thread.  Blocks the loop thread until the answer is back, as the
    same call blocks the loop in ComfyUI's process."""
    import concurrent.futures  # lazy: worker start (only async nodes)
    answer = concurrent.futures.Future()
    _host_asks.put((target, args, kwargs, answer))
    _notify_task(0, {"pump": True})
    return answer.result()


def async_pump():
    """Makes the loop thread's pending requests to the host (task_ask_host),
    from the main thread."""
    from _queue import Empty  # lazy: worker start (only async nodes)
    asks = _host_asks
    while asks is not None:
        try:
            target, args, kwargs, answer = asks.get_nowait()
        except Empty:
            return
        try:
            answer.set_result(_worker.call_host(target, *args, **kwargs))
        except BaseException as e:
            answer.set_exception(e)


def run(key, kwargs, instance=None, method=None, prefix=None):
    """Runs node `key`'s FUNCTION (or `method`) on `instance` (a handle
    the host got from an earlier run; None makes a new instance) with
    kwargs, this process's GraphBuilder prefix set to the host's (prefix:
    channel/nodes.py graph_prefix).  Returns {"outputs", "instance",
    "same"}: the result as a NodeValue (the codec holds here, as handles
    carrying their type names, the objects in it that cannot cross; see
    Peer.encode_other), the instance's handle, and the outputs that are
    inputs passed through, left out (channel/nodes.py passed_through)."""
    cls = _class(key)
    peer = _worker._peer
    peer.drop_unsent()
    if instance is None:
        instance = cls()
    fn = getattr(instance, method or cls.FUNCTION)
    set_graph_prefix(prefix)
    try:
        out, same = passed_through(peer, kwargs, _invoke(fn, kwargs))
    finally:
        if peer.received:
            peer.received.clear()
    return {"outputs": NodeValue(out), "instance": peer.hold(instance), "same": same}


def run_v3(key, method, kwargs, hidden, prefix=None):
    """Runs V3 node `key`'s classmethod `method` (None: its FUNCTION, or
    validate_inputs / fingerprint_inputs / check_lazy_status) as ComfyUI
    does: on a clone of the class whose `hidden` holds the host's hidden
    values ({Hidden value: value}; DYNPROMPT as DynPrompt data), with the
    host's GraphBuilder prefix (as run's).  FUNCTION's
    answer is {"outputs": NodeValue({"args", "ui", "expand",
    "block_execution"}), "same"} (a UI object as its as_dict(); "same": the
    args that are inputs passed through, left out, as run's); another
    method's is its value (a result that cannot cross becomes its repr)."""
    cls = _class(key)
    method = method or cls.FUNCTION
    hidden = dict(hidden or {})
    io = sys.modules["comfy_api.latest"].io
    values = decode_hidden(hidden, io)
    peer = _worker._peer
    peer.drop_unsent()
    try:
        cls.VALIDATE_CLASS()
        clone = cls.PREPARE_CLASS_CLONE(values)
        fn = getattr(cls, method).__func__
        set_graph_prefix(prefix)
        out = _invoke(lambda **kw: fn(clone, **kw), kwargs)
        if method != cls.FUNCTION:
            return out if _plain(out) else repr(out)
        return _v3_answer(peer, kwargs, out)
    finally:
        if peer.received:
            peer.received.clear()


def _v3_answer(peer, kwargs, out):
    """run_v3's answer for FUNCTION's io.NodeOutput `out` (the caller
    clears peer.received after)."""
    args, same = passed_through(peer, kwargs, tuple(out.args))
    ui = out.ui
    if ui is not None and not isinstance(ui, dict):
        ui = ui.as_dict()
    return {"outputs": NodeValue({"args": args, "ui": ui, "expand": out.expand,
                                  "block_execution": out.block_execution}), "same": same}


def call_class(key, method, kwargs):
    """IS_CHANGED / VALIDATE_INPUTS of node `key`, called on the class as
    ComfyUI does.  A result that cannot cross becomes its repr."""
    cls = _class(key)
    if method == "VALIDATE_INPUTS" and "input_types" in kwargs:
        kwargs = dict(kwargs, input_types=types_from_host(kwargs["input_types"], _own_types()))
    out = _invoke(getattr(cls, method), kwargs)
    if not _plain(out):
        return repr(out)
    return out


_own_type_objects = None


def _own_types():
    """{(class, value): object} of the pack's own type strings its V1
    nodes return (RETURN_TYPES): what a VALIDATE_INPUTS's input_types name
    (formats.types_from_host)."""
    global _own_type_objects
    if _own_type_objects is None:
        found = {}
        for cls in list(_classes.values()):
            if is_v3(cls):
                continue
            try:
                returns = tuple(getattr(cls, "RETURN_TYPES", ()) or ())
            except Exception:
                continue
            for t in returns:
                if own_type(t):
                    found.setdefault((own_type_name(t), str.__str__(t)), t)
        _own_type_objects = found
    return _own_type_objects


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
