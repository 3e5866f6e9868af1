"""Isolated node packs in ComfyUI: the host side.

A pack's ``__init__.py`` (in the host) makes one call::

    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = load_pack(pack_dir, python)

and gets proxy classes.  A V1 proxy carries the real node's INPUT_TYPES,
RETURN_TYPES, RETURN_NAMES, FUNCTION, CATEGORY, OUTPUT_NODE, INPUT_IS_LIST,
OUTPUT_IS_LIST, DESCRIPTION (every upper-case class attribute, in fact) and,
where the real node has them, IS_CHANGED, VALIDATE_INPUTS (with the real
signature, which ComfyUI inspects) and check_lazy_status.  A V3 node (a
``comfy_api.latest.io.ComfyNode``, in NODE_CLASS_MAPPINGS or from the pack's
``comfy_entrypoint()``) gets a ComfyNode subclass of the host's own
comfy_api whose schema is the real one's, rebuilt (``_v3_schema``: the same
/object_info), whose ``execute`` (async when the real one is, run in a
thread and awaited) calls the real one with the inputs and the hidden
values and answers an ``io.NodeOutput`` (ui, expand, block_execution), and
which forwards validate_inputs, fingerprint_inputs and check_lazy_status
where the real node has them; a schema the host cannot rebuild leaves that
node out, with a warning naming it.  The real nodes
live in the pack's worker (``bulkhead.worker.nodes``), one persistent
process under the pack's interpreter.

Start-up does not wait for workers: the metadata is cached on disk, keyed
by the environment's identity (interpreter path and a stamp), the hashes of
the pack's sources and the host ComfyUI's version; with a warm cache no
worker starts until a node first runs.  Lists INPUT_TYPES got from
``folder_paths.get_filename_list`` are re-read from the host's
``folder_paths`` every time ComfyUI asks, as they would be in-process.

A run: the proxy's FUNCTION sends the inputs to the worker, which runs the
real node on its own instance of the class (one per proxy instance, held by
handle) and answers with the outputs.  Objects the codec cannot carry (a
MODEL the pack made) stay in the worker and come back as
``bulkhead.RemoteObject`` handles; see ``bulkhead.channel.peer``.  While the call runs:

* PROGRESS frames from the worker's ComfyUI progress hook drive a
  ``comfy.utils.ProgressBar`` here, in the node's own thread and context,
  previews included (rebuilt as the (format, PIL.Image, max_size) tuple
  ComfyUI's hook takes);
* the host's interrupt watcher (one thread, reading ComfyUI's non-consuming
  ``processing_interrupted()`` every 20 ms while nodes run) interrupts the worker
  (``Worker.interrupt``: a frame and SIGUSR1); the worker's node stops on its
  own ComfyUI flag and the host raises its own InterruptProcessingException,
  leaving its flag set for ComfyUI's own check;
* an out-of-memory error in the worker is raised here as ComfyUI's
  ``OOM_EXCEPTION`` with the worker's message and traceback.

The worker mirrors the host's dtype and memory flags into its own
``comfy.cli_args.args`` (``MIRRORED_ARGS``; not the VRAM-state flags, which
the memory layer carries) and the host's ``folder_paths`` directories.

``fallback(pack_dir, reason)`` imports a pack in-process instead, with one
warning per pack naming the reason and the fix; load_pack uses it when it
finds no ComfyUI or no built environment, and the config layer calls it for
its own reasons (``REASONS``).

What the pack registered on ``server.PromptServer`` at import (routes,
prompt handlers) is installed on the host's server by
``host/serverproxy.py``; events its worker sends reach the host's
PromptServer there too.

This module only reads ComfyUI's state; it never assigns to a comfy module.
"""

import glob
import hashlib
import inspect
import json
import logging
import os
import sys
import threading
import time
import weakref

from .. import _native
from ..channel.formats import (FORMAT, NodeInterrupted, WorkerOutOfMemory, decode_meta, encode_arg, host_folders,
                               remote_name)
from ..channel.peer import BulkheadError, HandleError, HostObject, NodeValue, RemoteError, RemoteObject
from ..channel import targets
from ..packimport import default_module, import_nodes, in_worker
from ..envs import hostmatch
from .serverproxy import ServerProxy
from .workers import Worker, WorkerDied

log = logging.getLogger("bulkhead")

# Seconds a worker node may run on after the stop button before its worker
# is stopped (``interrupt_grace_s`` in a pack's [bulkhead] table).  A node
# that checks ComfyUI's flag stops within milliseconds; one that never
# checks (a long native call, a sleep) would otherwise run to its end.
INTERRUPT_GRACE_S = 3.0


# comfy.cli_args flags (argparse dests) that decide dtype and memory
# behaviour, mirrored into every pack worker.  Not mirrored: --gpu-only,
# --highvram, --normalvram, --lowvram, --novram (the VRAM state; the memory
# layer makes a worker follow the host's), cache and server flags.  --cpu is
# mirrored: it decides the device, and a worker cannot run on a device its
# host was told to leave alone (on a machine without CUDA, ComfyUI does not
# even import without it).
MIRRORED_ARGS = (
    # device and dtype
    "cpu", "cpu_vae", "directml", "deterministic", "force_fp32", "force_fp16",
    "fp32_unet", "fp64_unet", "bf16_unet", "fp16_unet", "fp8_e4m3fn_unet", "fp8_e5m2_unet",
    "fp8_e8m0fnu_unet", "fp16_vae", "fp32_vae", "bf16_vae", "fp8_e4m3fn_text_enc",
    "fp8_e5m2_text_enc", "fp16_text_enc", "fp32_text_enc", "bf16_text_enc",
    "supports_fp8_compute", "fast", "force_channels_last",
    # attention
    "use_split_cross_attention", "use_quad_cross_attention", "use_pytorch_cross_attention",
    "use_sage_attention", "use_flash_attention", "disable_xformers", "force_upcast_attention",
    "dont_upcast_attention", "disable_ipex_optimize",
    # memory
    "reserve_vram", "disable_smart_memory", "async_offload", "disable_async_offload",
    "disable_pinned_memory", "disable_mmap", "mmap_torch_files", "fast_disk", "high_ram",
    "cuda_malloc", "disable_cuda_malloc",
    # where things are
    "base_directory", "output_directory", "input_directory", "temp_directory", "user_directory",
)
NOT_MIRRORED = ("gpu_only", "highvram", "normalvram", "lowvram", "novram")

# Why a pack runs in-process: reason -> (what, fix).  {pack} is the pack
# directory, {detail} what the caller adds.
NO_COMFYUI = "no-comfyui"
NO_CONFIG = "no-config"
STAMP_REFUSED = "stamp-refused"
ENV_NOT_BUILT = "env-not-built"
DIR_WITHOUT_CONFIG = "dir-without-config"
CONTRACT_REFUSED = "contract-refused"
WORKER_IMPORT_FAILED = "worker-import-failed"
CONFIG_REFUSED = "config-refused"
REASONS = {
    NO_COMFYUI: ("no ComfyUI base was found (folder_paths / comfy are not imported here, "
                 "options['comfyui'] and COMFYUI_PATH are unset){detail}",
                 "load it from ComfyUI (or set COMFYUI_PATH=<ComfyUI dir>), then "
                 "`bulkhead install {pack}`"),
    NO_CONFIG: ("it has no comfy-env.toml{detail}",
                "add a comfy-env.toml to the pack, then `bulkhead install {pack}`"),
    STAMP_REFUSED: ("its environment's stamp was refused{detail}",
                    "rebuild the environment: `bulkhead install {pack}`"),
    ENV_NOT_BUILT: ("its environment is not built{detail}",
                    "build it: `bulkhead install {pack}`"),
    DIR_WITHOUT_CONFIG: ("this directory has no comfy-env.toml of its own{detail}",
                         "to isolate it, add a comfy-env.toml to it and run `bulkhead install {pack}`"),
    WORKER_IMPORT_FAILED: ("it failed to import in its worker{detail}",
                           "give its environment what it lacks (its comfy-env.toml), then rebuild it with "
                           "`bulkhead install {pack}` (--force when nothing in the file changed); the worker's "
                           "whole traceback is in the log line before this one"),
    CONFIG_REFUSED: ("its comfy-env.toml is invalid{detail}",
                     "correct the file named above, then `bulkhead install {pack}`"),
    CONTRACT_REFUSED: ("bulkhead refuses isolation{detail}",
                       "run `bulkhead doctor` to see the contract; update bulkhead to a release that "
                       "fits this ComfyUI (or ComfyUI to one this bulkhead fits), then "
                       "`bulkhead install {pack}`"),
}


class PackLoadError(BulkheadError, ImportError):
    """A pack's nodes could not be described (its import failed in the
    worker, or the worker could not start)."""


# --- where things are ---

def find_comfyui(options=None):
    """The host's ComfyUI directory: options['comfyui'], else where the
    imported ``folder_paths`` or ``comfy`` came from, else $COMFYUI_PATH;
    None when there is none (envs.hostmatch matches environments to it)."""
    return hostmatch.find_comfyui(options)


def cache_dir():
    """$BULKHEAD_HOME/cache/nodes, else $XDG_CACHE_HOME/bulkhead/nodes, else
    ~/.cache/bulkhead/nodes."""
    home = os.environ.get("BULKHEAD_HOME")
    if home:
        return os.path.join(home, "cache", "nodes")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "bulkhead", "nodes")


# --- what the worker mirrors ---



def host_args():
    """The mirrored flags of this process's comfy.cli_args.args (JSON-able)."""
    cli = sys.modules.get("comfy.cli_args")
    args = getattr(cli, "args", None)
    out = {}
    if args is None:
        return out
    for name in MIRRORED_ARGS:
        if hasattr(args, name):
            try:
                out[name] = encode_arg(getattr(args, name))
            except TypeError:
                log.debug("bulkhead: --%s is not mirrored (a value of type %s)", name,
                          type(getattr(args, name)).__name__)
    return out


# --- the metadata cache ---

_SKIP_DIRS = {"__pycache__", "node_modules", "venv", ".venv", "env", "site-packages"}
_SOURCE_NAMES = {"comfy-env.toml", "pyproject.toml", "requirements.txt"}


def source_hash(pack_dir):
    """sha256 over the pack's Python sources and config files (relative
    path and contents)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(pack_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for f in sorted(files):
            if not (f.endswith(".py") or f in _SOURCE_NAMES):
                continue
            path = os.path.join(root, f)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            h.update(os.path.relpath(path, pack_dir).encode() + b"\0")
            h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def default_stamp(python):
    """The environment's identity when the caller gives none: the
    interpreter's mtime, and the mtimes of the venv's config and
    site-packages directories (which change when packages do)."""
    parts = []
    for path in [python] + [os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")] + \
            sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(python)), "lib*", "python*",
                                          "site-packages"))):
        try:
            parts.append(str(os.stat(path).st_mtime_ns))
        except OSError:
            parts.append("-")
    return ":".join(parts)


def _comfyui_version(base):
    h = hashlib.sha256()
    for rel in ("comfyui_version.py", os.path.join("comfy", "cli_args.py"), os.path.join("comfy", "samplers.py")):
        try:
            with open(os.path.join(base, rel), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"-")
    return h.hexdigest()[:32]


class MetadataCache:
    """One JSON file per pack under cache_dir(): the key it was made for
    and the worker's description.  A file whose key differs is a miss; a
    write replaces the pack's older files."""

    def __init__(self, directory=None):
        self.directory = directory or cache_dir()

    def _prefix(self, pack_dir):
        return hashlib.sha256(pack_dir.encode()).hexdigest()[:16]

    def path(self, pack_dir, key):
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return os.path.join(self.directory, f"{self._prefix(pack_dir)}-{digest}.json")

    def load(self, pack_dir, key):
        try:
            with open(self.path(pack_dir, key), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("meta"), str):
            return None
        return data["meta"]

    def store(self, pack_dir, key, meta):
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            path = self.path(pack_dir, key)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"key": key, "meta": meta}, f)
            os.replace(tmp, path)
            prefix = self._prefix(pack_dir) + "-"
            for old in os.listdir(self.directory):
                if old.startswith(prefix) and old.endswith(".json") and \
                        os.path.join(self.directory, old) != path:
                    try:
                        os.unlink(os.path.join(self.directory, old))
                    except OSError:
                        pass
        except OSError as e:
            log.warning("bulkhead: cannot write the node metadata cache %s: %s", self.directory, e)


# --- metadata -> the values ComfyUI gets ---



def _signature(spec):
    """An inspect.Signature presenting the real method's parameters as
    ComfyUI sees them on the class (first parameter: the bound class)."""
    P = inspect.Parameter
    args = list(spec.get("args") or [])
    if not spec.get("bound"):
        args.insert(0, "cls" if "cls" not in args else "_cls")
    defaults = [decode_meta(d) for d in spec.get("defaults") or []]
    first_default = len(args) - len(defaults)
    params = []
    for i, name in enumerate(args):
        if i >= first_default:
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=defaults[i - first_default]))
        else:
            params.append(P(name, P.POSITIONAL_OR_KEYWORD))
    if spec.get("varargs"):
        params.append(P(spec["varargs"], P.VAR_POSITIONAL))
    kwd = spec.get("kwonlydefaults") or {}
    for name in spec.get("kwonly") or []:
        params.append(P(name, P.KEYWORD_ONLY, default=decode_meta(kwd[name]) if name in kwd else P.empty))
    if spec.get("varkw"):
        params.append(P(spec["varkw"], P.VAR_KEYWORD))
    return inspect.Signature(params)


# --- the host's ComfyUI, read only ---

def _mm():
    return sys.modules.get("comfy.model_management")


def _comfy_utils():
    utils = sys.modules.get("comfy.utils")
    if utils is None and "comfy" in sys.modules:
        try:
            import comfy.utils as utils
        except Exception:
            return None
    return utils


class _Progress:
    """PROGRESS frames -> a comfy.utils.ProgressBar of the node running here."""

    def __init__(self, mm):
        self.mm = mm
        self.utils = _comfy_utils()
        self.bar = None
        self.frames = 0

    def on_frame(self, v):
        self.frames += 1
        if self.utils is None or not isinstance(v, dict):
            return
        value, total = v.get("value"), v.get("total")
        if not isinstance(value, (int, float)) or not isinstance(total, (int, float)):
            return
        mm = self.mm
        if mm is not None and mm.processing_interrupted():
            return  # the interrupt is on its way to the worker; leave the flag to ComfyUI
        try:
            if self.bar is None:
                self.bar = self.utils.ProgressBar(total)
            self.bar.update_absolute(value, total, _preview(v.get("preview")))
        except BaseException as e:
            if mm is not None and isinstance(e, mm.InterruptProcessingException):
                # ComfyUI's hook consumed the click (a race with the check
                # above): give it back, for the watcher and ComfyUI's own check.
                mm.interrupt_current_processing(True)
            elif isinstance(e, Exception):
                log.debug("bulkhead: progress update failed: %r", e)
            else:
                raise


def _preview(p):
    """A PROGRESS frame's preview (worker/nodes.py _preview_pixels) as the
    (format, PIL.Image, max_size) tuple ComfyUI's progress hook takes."""
    if not isinstance(p, dict):
        return None
    try:
        from PIL import Image
        image = Image.frombytes(p["mode"], tuple(p["size"]), p["pixels"])
        return (p["format"], image, p.get("max_size"))
    except Exception as e:
        log.debug("bulkhead: a preview from a worker could not be rebuilt: %r", e)
        return None


# --- V3 nodes: the schema rebuilt in the host's comfy_api ---

def _v3_schema(io, node):
    """The io.Schema the worker captured (worker/nodes.py _describe_v3),
    made of the host's own classes: each input and output an instance of
    (a subclass of) the io class the real one is, answering exactly what
    the real one answered (as_dict, its type, a dynamic input's
    expansion); the schema's fields as they were (a field this ComfyUI's
    Schema lacks is an error naming it)."""
    import dataclasses
    known = {f.name for f in dataclasses.fields(io.Schema)}
    fields = {}
    for k, v in node["schema"].items():
        v = decode_meta(v)
        if k not in known:
            default = next((f.default for f in dataclasses.fields(io.Schema) if f.name == k), None)
            if v in (None, False, "", [], default):
                continue   # a newer flag, unset: nothing is lost
            raise TypeError(f"schema field {k}={v!r} has no place in this ComfyUI's io.Schema "
                            "(the worker's ComfyUI is newer?)")
        fields[k] = v
    fields["inputs"] = [_v3_io(io, d, False) for d in node["inputs"]]
    fields["outputs"] = [_v3_io(io, d, True) for d in node["outputs"]]
    fields["hidden"] = [io.Hidden(h) for h in node["hidden"]]
    return io.Schema(**fields)


def _io_lookup(io, qualname):
    found = io
    for part in (qualname or "").split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _v3_io(io, d, output):
    plain = io.Output if output else io.Input
    base = _io_lookup(io, d.get("class"))
    if base is None or not issubclass(base, plain):
        base = plain
    dynamic = None
    if "dynamic" in d:
        dyn_base = getattr(io, "DynamicOutput" if output else "DynamicInput", None)
        if dyn_base is None:
            raise TypeError(f"{'output' if output else 'input'} {d['attrs'].get('id')!r} is dynamic, and "
                            "this ComfyUI's io has no dynamic inputs")
        if not issubclass(base, dyn_base):
            base = dyn_base
        dynamic = [_v3_io(io, c, output) for c in d["dynamic"]]
    io_type = decode_meta(d["io_type"])
    if isinstance(io_type, str):
        io_type = _io_str(io)(io_type)
    as_dict = d["as_dict"]
    ns = {"__module__": __name__, "__qualname__": base.__qualname__,
          "as_dict": lambda self: decode_meta(as_dict),
          "get_io_type": lambda self: io_type,
          "io_type": property(lambda self: io_type)}
    if dynamic is not None:
        ns["get_dynamic"] = lambda self: list(dynamic)
    obj = object.__new__(type(base.__name__, (base,), ns))
    obj.__dict__.update(d["attrs"])
    return obj


def _io_str(io):
    """The host's own type-name string class (its "*" / comma matching)."""
    t = type(getattr(getattr(io, "Int", None), "io_type", ""))
    return t if issubclass(t, str) else str


def _hidden_values(clone):
    """{Hidden value: value} of a class clone's `hidden` (a HiddenHolder),
    DYNPROMPT as data (its nodes, original and added by expansions)."""
    from comfy_api.latest import io
    holder = getattr(clone, "hidden", None)
    out = {}
    if holder is None:
        return out
    for h in io.Hidden:
        v = getattr(holder, h.name, None)
        if v is None:
            continue
        if h.value == "DYNPROMPT":
            v = {"original": v.get_original_prompt(), "ephemeral": dict(getattr(v, "ephemeral_prompt", {}) or {}),
                 "parents": dict(getattr(v, "ephemeral_parents", {}) or {})}
        out[h.value] = v
    return out


async def _in_thread(fn, *args):
    """fn(*args) in a thread, awaited (its context copied: ComfyUI's
    progress reads the executing node from it)."""
    import asyncio
    import contextvars
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, lambda: ctx.run(fn, *args))


class _Watch:
    """One worker call under the interrupt watcher (see _InterruptWatcher)."""

    __slots__ = ("worker", "mm", "grace_s", "fired_at", "stopped_worker", "done", "lock", "next_at")

    def __init__(self, worker, mm, grace_s):
        self.worker, self.mm, self.grace_s = worker, mm, grace_s
        self.fired_at = None        # when the click was seen
        self.stopped_worker = False  # its worker was stopped past the grace
        self.done = False           # the call ended: nothing more is done for it
        self.lock = threading.Lock()
        self.next_at = None         # when to act next, once fired


class _InterruptWatcher:
    """Passes the host's interrupt (ComfyUI's stop button) to the workers
    whose calls are running: one thread for the whole host, asleep while
    no call runs, reading ComfyUI's non-consuming
    ``processing_interrupted()`` every POLL_S while calls run (a new call
    wakes it; it reads the flag at once).  Once a call's flag is seen, its
    worker is interrupted (a frame and SIGUSR1), then signalled every
    RESIGNAL_S until the call ends; a node still running ``grace_s`` after
    the click (one that never checks the flag) has its worker stopped
    (SIGKILL), ``stopped_worker`` says so, and the call fails with
    WorkerDied, which PackRuntime turns into ComfyUI's interrupt.  grace_s
    0: never.  (bulkhead writes nothing into ComfyUI but the reserve, so
    the flag is read, never hooked.)

    A call costs the thread no wake-up when it ends, and none when it
    begins while the thread is awake for another: a thread started and
    joined per call put two wake-ups of the host on each node's way back,
    behind the worker's spinning OpenMP threads on a small machine."""

    POLL_S = 0.02
    RESIGNAL_S = 0.025

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._calls = []
        self._thread = None
        self._asleep = False  # in the untimed wait: a new call must wake it

    def begin(self, worker, mm, grace_s):
        watch = _Watch(worker, mm, grace_s)
        with self._cond:
            self._calls.append(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bulkhead-interrupt", daemon=True)
                self._thread.start()
            elif self._asleep:
                self._cond.notify()
        return watch

    def end(self, watch):
        """The call ended: after this returns nothing is done for it."""
        with watch.lock:
            watch.done = True
        with self._cond:
            self._calls.remove(watch)

    def _run(self):
        while True:
            with self._cond:
                while not self._calls:
                    self._asleep = True
                    self._cond.wait()
                self._asleep = False
                calls = list(self._calls)
            wait_s = self.POLL_S
            for watch in calls:
                try:
                    due = self._act(watch)
                except Exception as e:  # a broken flag reader: never the watcher's end
                    log.debug("bulkhead: interrupt watcher: %r", e)
                    due = None
                if due is not None:
                    wait_s = min(wait_s, max(0.0, due - time.perf_counter()))
            with self._cond:
                if self._calls:
                    self._cond.wait(wait_s)

    def _act(self, watch):
        """What is due for one call now; returns when it next needs the
        thread (None: at the next read of the flag)."""
        with watch.lock:
            if watch.done or watch.stopped_worker:
                return None
            now = time.perf_counter()
            if watch.fired_at is None:
                if not watch.mm.processing_interrupted():
                    return None
                watch.fired_at = now
                watch.worker.interrupt(frame=True)
            elif watch.grace_s > 0 and now >= watch.fired_at + watch.grace_s:
                watch.stopped_worker = True
                watch.worker.kill()
                return None
            elif now >= watch.next_at:
                watch.worker.interrupt(frame=False)
            else:
                return watch.next_at
            watch.next_at = now + self.RESIGNAL_S
            if watch.grace_s > 0:
                watch.next_at = min(watch.next_at, watch.fired_at + watch.grace_s)
            return watch.next_at

    def _after_fork(self):
        self.__init__()  # the child has none of the parent's threads or calls


_watcher = _InterruptWatcher()
os.register_at_fork(after_in_child=_watcher._after_fork)


def _where(v, obj, where, depth=0):
    """Where obj sits in the input v (named `where`), or None: the path for
    HostObject's message, walked only once the codec refused obj."""
    if v is obj:
        return where
    if depth < 32:
        items = (enumerate(v) if isinstance(v, (list, tuple)) else
                 v.items() if isinstance(v, dict) else ())
        for k, x in items:
            found = _where(x, obj, f"{where}[{k!r}]" if isinstance(v, dict) else f"{where}[{k}]", depth + 1)
            if found is not None:
                return found
    return None


def _holds_handles(v, depth=0):
    """Whether a node's outputs hold worker handles (RemoteObjects), at
    any depth a value can nest (ui dicts, lists of results)."""
    if isinstance(v, RemoteObject):
        return True
    if depth < 32:
        if isinstance(v, (tuple, list)):
            return any(_holds_handles(x, depth + 1) for x in v)
        if isinstance(v, dict):
            return any(_holds_handles(x, depth + 1) for x in v.values())
    return False


def _host_object_error(e, kwargs, what):
    """HostObject (the host's node policy refused an input) -> the
    TypeError naming the input: 'input <where> is a <type> made in the
    host process; ...'.  what(k) names input k."""
    for k, v in kwargs.items():
        where = _where(v, e.obj, what(k))
        if where is not None:
            return TypeError(str(e).replace("input is a", f"input {where} is a", 1))
    return TypeError(str(e))


def on_server_loop():
    """Whether this thread is running ComfyUI's web server loop (where
    nothing bulkhead does may wait on a worker): the running loop is
    ``PromptServer.instance.loop``, or, with no PromptServer, a loop on the
    main thread.  ComfyUI's execution thread runs a loop of its own
    (``asyncio.run`` around each prompt): that one is not the server's."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    server = getattr(getattr(sys.modules.get("server"), "PromptServer", None), "instance", None)
    mine = getattr(server, "loop", None)
    if mine is not None:
        return loop is mine
    return threading.current_thread() is threading.main_thread()


# ComfyUI types whose values cross as plain data (tensors, numbers, text,
# dicts of tensors); an output of any other type may be an object of the
# pack's, which stays in the worker as a handle.
PLAIN_TYPES = frozenset(("IMAGE", "MASK", "LATENT", "INT", "FLOAT", "STRING", "BOOLEAN", "AUDIO"))


def _may_hold_handles(return_types):
    return any(not (isinstance(t, str) and t in PLAIN_TYPES) for t in return_types or ()
               if not isinstance(t, (list, tuple)))   # a list: a combo's values, plain


def _matches(checked, kwargs):
    """Whether the inputs a deferred VALIDATE_INPUTS got are those a run
    gets (input_types, which only VALIDATE_INPUTS gets, aside)."""
    for k, v in checked.items():
        if k == "input_types":
            continue
        if k not in kwargs:
            return False
        try:
            if not bool(kwargs[k] == v):
                return False
        except Exception:
            return False
    return True


# --- one pack ---

class PackRuntime:
    """One isolated pack: its worker, its metadata, its proxy classes."""

    def __init__(self, pack_dir, python, name, env, options, comfyui):
        # The worker generation that is warm (prewarmed, or a node ran
        # there); a worker alive from describing the pack is not.
        self.warm_generation = None
        self.pack_dir = pack_dir
        self.python = os.fspath(python)
        self.name = name
        self.options = options
        self.comfyui = comfyui
        module = options.get("module", "auto")
        if module == "auto":
            module = default_module(pack_dir)
        self.module = module
        self.worker = Worker(self.python, name=name, env=env, cwd=comfyui,
                             start_timeout=options.get("start_timeout", 120.0),
                             call_timeout=options.get("call_timeout"),
                             release_timeout=options.get("release_timeout"))
        self.worker.env_hooks.append(self._worker_env)
        from ..envs.build import current_python
        self.worker.resolve_python = current_python   # a rebuild while it runs: the next generation moves
        attach = options.get("attach")
        if attach is not None:
            attach(self.worker)
        self.meta = None
        self.last_interrupt_at = None
        self.from_cache = False
        self.classes = {}
        self.display = {}
        self.server = ServerProxy(self)
        self._handle_gen = {}       # key -> the generation the node's outputs first held handles in
        self._is_changed_fns = {}   # key -> the proxy's IS_CHANGED (see _proxy)
        self._deferred = {}         # key -> VALIDATE_INPUTS kwargs answered "later" (call_class)
        self._deferred_lock = threading.Lock()
        # The worker's node instances the proxies hold (one per proxy
        # instance): made again on a new generation, so they never keep an
        # idle worker alive (host/idle.py).
        self.instances = weakref.WeakSet()

    def _worker_env(self):
        env = {
            "BULKHEAD_COMFYUI": self.comfyui,
            "BULKHEAD_PACK_DIR": self.pack_dir,
            "BULKHEAD_PACK_MODULE": self.module or "",
            "BULKHEAD_PACK_NAME": self.name,
            "BULKHEAD_COMFY_ARGS": json.dumps(host_args()),
        }
        folders = host_folders()
        if folders is not None:
            env["BULKHEAD_COMFY_FOLDERS"] = json.dumps(folders)
        alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        if alloc:
            env["PYTORCH_CUDA_ALLOC_CONF"] = alloc
        return env

    # metadata

    def cache_key(self):
        return {
            "format": FORMAT,
            "protocol": _native.PROTOCOL_VERSION,
            "pack": self.pack_dir,
            "module": self.module,
            "python": self.python,
            "stamp": str(self.options.get("stamp") or default_stamp(self.python)),
            "sources": source_hash(self.pack_dir),
            "comfyui": [self.comfyui, _comfyui_version(self.comfyui)],
        }

    def load_metadata(self):
        cache = None if self.options.get("cache", True) is False else MetadataCache(self.options.get("cache_dir"))
        key = self.cache_key() if cache is not None else None
        text = cache.load(self.pack_dir, key) if cache is not None else None
        self.from_cache = text is not None
        if text is None:
            text = self.describe()
            if cache is not None:
                cache.store(self.pack_dir, key, text)
        self.meta = json.loads(text)
        for problem in self.meta.get("problems", []):
            log.warning("bulkhead: pack %r: %s", self.name, problem)
        return self.meta

    def describe(self):
        try:
            return self.worker.call(targets.DESCRIBE)
        except RemoteError as e:
            self.worker.close()
            raise PackLoadError(f"pack {self.name!r} ({self.pack_dir}) failed to import in its worker "
                                f"({self.python}): {e}") from None
        except BulkheadError as e:
            raise PackLoadError(f"pack {self.name!r} ({self.pack_dir}): {e}") from None

    def build(self):
        self.classes = {}
        for key, node in self.meta["nodes"].items():
            if not node.get("v3"):
                self.classes[key] = self._proxy(key, node)
                continue
            try:
                self.classes[key] = self._proxy_v3(key, node)
            except Exception as e:
                log.warning("bulkhead: pack %r: V3 node %r left out: its schema cannot be rebuilt in the "
                            "host's comfy_api (%s: %s)", self.name, key, type(e).__name__, e)
        self.display = {k: v for k, v in self.meta.get("display", {}).items() if k in self.classes}
        self.server.install(self.meta)
        return self.classes, self.display

    def _proxy(self, key, node):
        rt = self
        ns = {"__module__": f"bulkhead.nodes.{self.name}", "__doc__": f"{node['class_name']} "
              f"of pack {self.name!r}, run in its worker ({self.python})."}
        input_types = node["input_types"]

        def INPUT_TYPES(cls):
            return decode_meta(input_types)
        ns["INPUT_TYPES"] = classmethod(INPUT_TYPES)
        for attr, value in node["attrs"].items():
            ns[attr] = decode_meta(value)
        function = node["function"]
        ns["FUNCTION"] = function

        def run(self, **kwargs):
            return rt.run(self, key, kwargs)
        run.__name__ = run.__qualname__ = function
        ns[function] = run
        methods = node.get("methods", {})
        if "VALIDATE_INPUTS" in methods:
            ns["VALIDATE_INPUTS"] = classmethod(self._class_method(key, "VALIDATE_INPUTS",
                                                                   methods["VALIDATE_INPUTS"]))
        # IS_CHANGED: the real node's, combined with the worker generation
        # once the node's outputs held handles (_is_changed).  A node
        # without a real one has it too where an output type may be an
        # object of the pack's (not PLAIN_TYPES), and otherwise gets it
        # when its outputs first hold a handle (run; ComfyUI then runs it
        # once more, as a node whose IS_CHANGED appeared).
        real = None
        if "IS_CHANGED" in methods:
            real = self._class_method(key, "IS_CHANGED", methods["IS_CHANGED"])

        def IS_CHANGED(*_cls, **kwargs):
            return rt._is_changed(key, real, kwargs)
        IS_CHANGED.__name__ = IS_CHANGED.__qualname__ = "IS_CHANGED"
        if real is not None and hasattr(real, "__signature__"):
            IS_CHANGED.__signature__ = real.__signature__
        if real is not None or _may_hold_handles(ns.get("RETURN_TYPES")):
            ns["IS_CHANGED"] = classmethod(IS_CHANGED)
        self._is_changed_fns[key] = IS_CHANGED
        if "check_lazy_status" in methods:
            def check_lazy_status(self, **kwargs):
                return rt.run(self, key, kwargs, method="check_lazy_status")
            ns["check_lazy_status"] = check_lazy_status
        ns["_bulkhead_pack"] = self.name
        name = node["class_name"].rsplit(".", 1)[-1]
        cls = type(name if name.isidentifier() else "ProxyNode", (), ns)
        cls.__qualname__ = node["class_name"]
        return cls

    def _proxy_v3(self, key, node):
        """A V3 proxy: a ComfyNode subclass of the host's comfy_api whose
        define_schema rebuilds the real node's schema (_v3_schema), whose
        execute (async when the real one is) runs the real one in the
        worker with the hidden values, and which has the real node's
        validate_inputs / fingerprint_inputs / check_lazy_status (with
        their signatures) where it has its own."""
        from comfy_api.latest import io
        rt = self
        ns = {"__module__": f"bulkhead.nodes.{self.name}", "__doc__": f"{node['class_name']} "
              f"of pack {self.name!r} (a V3 node), run in its worker ({self.python}).",
              "_bulkhead_pack": self.name}

        def define_schema(cls):
            return _v3_schema(io, node)
        ns["define_schema"] = classmethod(define_schema)
        if node.get("execute_async"):
            async def execute(cls, **kwargs):
                return await _in_thread(rt.run_v3, cls, key, kwargs)
        else:
            def execute(cls, **kwargs):
                return rt.run_v3(cls, key, kwargs)
        ns["execute"] = classmethod(execute)
        for mname, spec in node.get("methods", {}).items():
            if mname in ("validate_inputs", "fingerprint_inputs", "check_lazy_status"):
                ns[mname] = classmethod(self._v3_method(key, mname, spec))
        name = node["class_name"].rsplit(".", 1)[-1]
        cls = type(name if name.isidentifier() else "ProxyNode", (io.ComfyNode,), ns)
        cls.__qualname__ = node["class_name"]
        cls.GET_NODE_INFO_V1()   # a schema this ComfyUI cannot take fails here, at load
        return cls

    def _v3_method(self, key, mname, spec):
        rt = self
        if spec.get("async_"):
            async def method(cls, **kwargs):
                return await _in_thread(rt.run_v3, cls, key, kwargs, mname)
        else:
            def method(cls, **kwargs):
                return rt.run_v3(cls, key, kwargs, mname)
        return self._named(method, key, mname, spec)

    def _named(self, method, key, mname, spec):
        """method, named mname and presenting the real method's signature
        (which ComfyUI inspects); a signature that cannot be rebuilt is a
        warning, and ComfyUI then passes every input."""
        method.__name__ = method.__qualname__ = mname
        try:
            method.__signature__ = _signature(spec)
        except (ValueError, TypeError) as e:
            log.warning("bulkhead: pack %r: the signature of %s.%s cannot be rebuilt (%s); ComfyUI "
                        "will pass it every input", self.name, key, mname, e)
        return method

    def _class_method(self, key, mname, spec):
        rt = self

        def method(*_cls, **kwargs):
            if mname == "VALIDATE_INPUTS" and on_server_loop():
                return rt.validate_on_loop(key, kwargs)
            return rt.call_class(key, mname, kwargs)
        return self._named(method, key, mname, spec)

    # calls

    def run(self, node, key, kwargs, method=None):
        mm = _mm()
        if mm is not None and mm.processing_interrupted():
            raise mm.InterruptProcessingException()
        deferred = self._take_deferred(key, kwargs) if method is None else []
        w = self.worker
        with w._lock:
            w.poll()  # a generation that died idle is noticed here, not half-way through the call
            w.start()
            for checked in deferred:
                self._validate_late(w, mm, key, checked)
            instance = node.__dict__.get("_bulkhead_instance")
            if instance is not None and instance._peer is not w.peer:
                instance = None  # the worker was restarted: a new instance there
            try:
                res = self._call(w, mm, targets.RUN, key, NodeValue(kwargs), instance, method)
            except HostObject as e:
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of node {key!r} (pack {self.name!r})") from None
            except HandleError:
                # The worker died between the checks above and the call,
                # which then ran on the next generation with the old
                # generation's instance and failed before anything ran
                # there: once more, with a new instance.  (A dead handle
                # among the inputs fails again, and that error stands.)
                if instance is None or instance._peer is w.peer:
                    raise
                node.__dict__.pop("_bulkhead_instance", None)
                res = self._call(w, mm, targets.RUN, key, NodeValue(kwargs), None, method)
            peer = w.peer
        if key not in self._handle_gen and _holds_handles(res["outputs"]):
            self._outputs_hold_handles(type(node), key, peer.generation)
        node._bulkhead_instance = res["instance"]
        if res["instance"] is not None:
            self.instances.add(res["instance"])
        return res["outputs"]

    def _outputs_hold_handles(self, cls, key, generation):
        """Node key's outputs hold worker handles (first seen on this
        generation): from now on its IS_CHANGED says when they died."""
        self._handle_gen[key] = generation
        if "IS_CHANGED" not in cls.__dict__:
            cls.IS_CHANGED = classmethod(self._is_changed_fns[key])

    def _is_changed(self, key, real, kwargs):
        """The proxy's IS_CHANGED: the real node's answer (False when it has
        none), and, for a node whose outputs held worker handles, from the
        first restart of the worker that made them on, that answer with
        the generation the node's next run would use.  ComfyUI caches a
        node's outputs by its inputs and this answer, so handles of a dead
        worker are never handed on: the node runs again, on the next
        generation, though its inputs did not change.  The answer never
        goes back to an earlier one (a cache keyed by it would hold dead
        handles), and while the worker lives it stays the same.  NaN (run
        every time) is passed on as it is."""
        answer = real(**kwargs) if real is not None else False
        first = self._handle_gen.get(key)
        if first is None or (isinstance(answer, float) and answer != answer):
            return answer
        gen = self.worker.generation
        if not self.worker.alive:
            gen += 1
        if gen == first:
            return answer
        if real is None:
            return f"bulkhead worker generation {gen}"
        return f"{answer!r} (bulkhead worker generation {gen})"

    # VALIDATE_INPUTS from ComfyUI's web server.  ComfyUI calls it inline
    # on the event loop when a prompt is queued.  The worker answers it
    # where it is running and idle, on a thread of its own, and the loop
    # waits for that answer at most VALIDATE_WAIT_S; where the worker is
    # busy with a node (the lock held, maybe for minutes), not started yet
    # (a spawn and the pack's import), or its validator is slow, stopped or
    # deadlocked, waiting would freeze the whole server, so the check is
    # deferred instead: the prompt is accepted, and the check runs in the
    # worker just before a node with those inputs runs, failing that node
    # with the validator's message, as a prompt refused at queue time would
    # have been.  Deferred checks are bounded per node (the oldest go).
    DEFERRED_MAX = 64
    VALIDATE_WAIT_S = 0.5

    def validate_on_loop(self, key, kwargs):
        """VALIDATE_INPUTS without waiting past VALIDATE_WAIT_S: the
        worker's answer when it is idle and running and answers in time,
        else True and the check deferred to the node's run (see above)."""
        w, box, done = self.worker, {}, threading.Event()

        def check():
            if not w._lock.acquire(blocking=False):
                box["why"] = "busy"
                return done.set()
            try:
                if not w.alive or w.busy:
                    box["why"] = "busy" if w.alive else "not started"
                    return
                box["answer"] = self._validate(w, _mm(), key, kwargs, drain=False)
            except BaseException as e:
                box["error"] = e
            finally:
                w._lock.release()
                done.set()

        threading.Thread(target=check, name=f"bulkhead-validate-{self.name}", daemon=True).start()
        if done.wait(self.VALIDATE_WAIT_S) and "why" not in box:
            if "error" in box:
                raise box["error"]
            return box["answer"]
        with self._deferred_lock:
            pending = self._deferred.setdefault(key, [])
            pending.append(dict(kwargs))
            del pending[:-self.DEFERRED_MAX]
        log.info("bulkhead: pack %r: %s.VALIDATE_INPUTS is checked when the node runs (%s)", self.name, key,
                 f"its worker is {box['why']}" if "why" in box
                 else f"it did not answer within {self.VALIDATE_WAIT_S:g} s")
        return True

    def _take_deferred(self, key, kwargs):
        """The deferred VALIDATE_INPUTS kwargs of node key that match the
        inputs it runs with (taken off the list)."""
        with self._deferred_lock:
            pending = self._deferred.get(key)
            if not pending:
                return []
            hits = [p for p in pending if _matches(p, kwargs)]
            pending[:] = [p for p in pending if all(p is not h for h in hits)]
            return hits

    def _validate(self, w, mm, key, kwargs, drain=True):
        """The worker's VALIDATE_INPUTS answer for these inputs (the caller
        holds the worker lock)."""
        try:
            return self._call(w, mm, targets.CALL_CLASS, key, "VALIDATE_INPUTS",
                              NodeValue(dict(kwargs)), drain=drain)
        except HostObject as e:
            raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {key}.VALIDATE_INPUTS (pack {self.name!r})") \
                from None

    def _validate_late(self, w, mm, key, checked):
        answer = self._validate(w, mm, key, checked)
        if answer is not True:
            raise ValueError(f"{key}: its VALIDATE_INPUTS refused these inputs: {answer} (pack {self.name!r}; "
                             "checked when the node ran, because its worker was busy or not started when the "
                             "prompt was queued)")

    def run_v3(self, clone, key, kwargs, method=None):
        """A V3 proxy's execute (method None) or its validate_inputs /
        fingerprint_inputs / check_lazy_status, on the class clone ComfyUI
        made (its `hidden` holds the hidden values), run in the worker.
        execute answers an io.NodeOutput of the host's comfy_api."""
        mm = _mm()
        if method is None and mm is not None and mm.processing_interrupted():
            raise mm.InterruptProcessingException()
        hidden = _hidden_values(clone)
        w = self.worker
        with w._lock:
            w.poll()  # a generation that died idle is noticed here, not half-way through the call
            w.start()
            try:
                res = self._call(w, mm, targets.RUN_V3, key, method, NodeValue(kwargs), hidden)
            except HostObject as e:
                where = f"{key}.{method}" if method else f"node {key!r}"
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {where} (pack {self.name!r})") from None
        if method is not None:
            return res
        from comfy_api.latest import io
        out = res["outputs"]
        return io.NodeOutput(*out["args"], ui=out["ui"], expand=out["expand"],
                             block_execution=out["block_execution"])

    def call_class(self, key, mname, kwargs):
        with self.worker._lock:
            try:
                return self._call(self.worker, _mm(), targets.CALL_CLASS, key, mname,
                                  NodeValue(kwargs))
            except HostObject as e:
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {key}.{mname} (pack {self.name!r})") from None

    def _call(self, w, mm, target, *args, drain=True):
        progress = _Progress(mm)
        w.frame_handlers[_native.PROGRESS] = progress.on_frame
        watch = None
        if mm is not None and hasattr(mm, "processing_interrupted"):
            watch = _watcher.begin(w, mm, self.options.get("interrupt_grace", INTERRUPT_GRACE_S))
        w.park_reader()
        try:
            out = w.call(target, *args)
            self.warm_generation = w.generation     # a node ran here: nothing left to prewarm
            return out
        except RemoteError as e:
            raise self._translate(e, mm) from None
        except WorkerDied:
            if watch is None or not watch.stopped_worker:
                raise
            log.warning("bulkhead: pack %r: a node was still running %.1f s after the interrupt, so its "
                        "worker was stopped (interrupt_grace_s in [bulkhead]; 0 turns this off); the pack's "
                        "models will load again on its next node", self.name, watch.grace_s)
            if hasattr(mm, "InterruptProcessingException"):
                raise mm.InterruptProcessingException() from None
            raise NodeInterrupted(f"a node of pack {self.name!r} was interrupted (its worker was stopped)") from None
        finally:
            if watch is not None:
                _watcher.end(watch)
                self.last_interrupt_at = watch.fired_at
            w.frame_handlers.pop(_native.PROGRESS, None)
            after = self.options.get("after_call") if drain else None
            if after is not None:
                after(w)  # the memory layer's drain: stand-ins made to match the ledger

    def _translate(self, e, mm):
        kind = e.remote_type
        if kind == remote_name(NodeInterrupted):
            if mm is not None and hasattr(mm, "InterruptProcessingException"):
                return mm.InterruptProcessingException()
            return NodeInterrupted(f"a node of pack {self.name!r} was interrupted")
        if kind == remote_name(WorkerOutOfMemory):
            text = (f"{e.remote_message} [in {e.worker}]\n--- worker traceback ---\n"
                    f"{e.remote_traceback.rstrip()}")
            cls = getattr(mm, "OOM_EXCEPTION", None) if mm is not None else None
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                cls = MemoryError
            try:
                return cls(text)
            except Exception:
                return MemoryError(text)
        return e

    def prewarm(self):
        """Starts the worker and imports the pack there: what the pack's
        first node would otherwise wait for; then rehearses a node call.  Blocks (the caller is a
        thread of host/prewarm.py); returns the number of node classes."""
        w = self.worker
        with w._lock:
            w.start()
            n = w.call(targets.WARM)
            # and a node call's round trip without a node (worker/nodes.py
            # rehearse), so that the first node does not run that code first
            self._call(w, _mm(), targets.REHEARSE,
                       NodeValue({"value": 1.0, "text": "", "list": [1, 2]}), drain=False)
            self.warm_generation = w.generation
            return n

    def close(self):
        self.worker.close()


_runtimes = {}
_runtimes_lock = threading.Lock()


def runtimes():
    """Every PackRuntime of this host, in load order."""
    with _runtimes_lock:
        return list(_runtimes.values())


def runtime(pack_dir):
    """The PackRuntime load_pack made for pack_dir, or None."""
    with _runtimes_lock:
        for (d, _py), rt in _runtimes.items():
            if d == os.path.realpath(pack_dir):
                return rt
    return None


def load_pack(pack_dir, python, *, name=None, env=None, options=None):
    """NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS of an isolated pack.

    pack_dir: the pack's directory (its node classes in ``nodes.py`` /
    ``nodes/``, or options['module'], or None for the package's own
    ``__init__``); python: the pack environment's interpreter; name: the
    pack's name in logs and handles (default: the directory's name); env:
    variables set in the worker only.  options: 'stamp' (the environment's
    identity for the metadata cache; default from the interpreter's and
    site-packages' mtimes), 'comfyui' (the ComfyUI directory; default
    found), 'module', 'cache' (False: no cache), 'cache_dir',
    'attach' (called with the Worker before it starts, e.g.
    HostMemory.attach), 'after_call' (called with the Worker after every
    proxied call, on ComfyUI's execution thread), 'start_timeout',
    'call_timeout', 'release_timeout' (seconds: Worker's), 'route_timeout',
    'prompt_handler_timeout' (seconds: the pack's routes and prompt
    handlers on the host's server, host/serverproxy.py),
    'interrupt_grace' (seconds a node may run on after the stop button
    before its worker is stopped; 0: never; default INTERRUPT_GRACE_S),
    'prewarm' ('prompt': start the worker when a queued prompt uses the
    pack, the default; 'startup': now, in the background; 'off').

    With a warm cache no worker starts here.  Falls back to ``fallback``
    (in-process) when no ComfyUI is found or the interpreter does not
    exist; raises PackLoadError when the pack fails to import in its
    worker.  Inside a worker (a pack importing another) the pack is
    imported in-process."""
    options = dict(options or {})
    pack_dir = os.path.realpath(os.fspath(pack_dir))
    name = name or os.path.basename(pack_dir)
    if in_worker():
        mod = import_nodes(pack_dir, options.get("module", "auto"))
        return (dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}),
                dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {}))
    comfyui = find_comfyui(options)
    if comfyui is None:
        return fallback(pack_dir, NO_COMFYUI, name=name, module=options.get("module", "auto"),
                        policy=options.get("fallback"))
    if python is None or not os.access(os.fspath(python), os.X_OK):
        return fallback(pack_dir, ENV_NOT_BUILT, name=name, module=options.get("module", "auto"),
                        detail=f" (no interpreter at {python})" if python else "", policy=options.get("fallback"))
    key = (pack_dir, os.fspath(python))
    with _runtimes_lock:
        rt = _runtimes.get(key)
        if rt is None:
            rt = PackRuntime(pack_dir, python, name, env, options, comfyui)
            _runtimes[key] = rt
    if rt.meta is None:
        rt.load_metadata()
        rt.build()
        from . import idle
        idle.watch(rt)
        log.info("bulkhead: pack %r: %d node%s, %s, metadata %s", name, len(rt.classes),
                 "" if len(rt.classes) == 1 else "s", rt.python,
                 "cached" if rt.from_cache else f"from worker pid {rt.worker.pid}")
        if options.get("prewarm") == "startup":
            from . import prewarm
            prewarm.start(rt)
    _set_state(pack_dir, options.get("module", "auto"), name=name, state="isolated", python=rt.python,
               env=os.path.dirname(os.path.dirname(rt.python)))
    return dict(rt.classes), dict(rt.display)


# --- where each pack stands: what /bulkhead/status and the panel show ---

_states = {}            # (pack_dir, module) -> {"name", "state", ...}; under _states_lock
_states_lock = threading.Lock()


def _set_state(pack_dir, module, **state):
    with _states_lock:
        _states[(pack_dir, module)] = dict(state, directory=pack_dir)


def pack_states():
    """[{"name", "state", "directory", ...}] of every pack (or part of one)
    bulkhead served in this process, those not isolated first, then by
    name.  state: "isolated" (with "python", "env" and the worker's
    "pid", None while none runs), "in-process" (with "reason" and
    "fix": it runs in ComfyUI's process, not in its environment) or
    "failed" (with "reason": it runs nowhere)."""
    with _states_lock:
        rows = [dict(v) for v in _states.values()]
    with _runtimes_lock:
        by_key = dict(_runtimes)
    for r in rows:
        if r["state"] == "isolated":
            rt = by_key.get((r["directory"], r["python"]))      # one pack directory, one runtime per environment
            w = getattr(rt, "worker", None)
            r["pid"] = w.pid if w is not None else None
    order = {"failed": 0, "in-process": 1, "isolated": 2}
    return sorted(rows, key=lambda r: (order.get(r["state"], 3), r["name"]))


_serving_s = [0.0]      # seconds spent serving packs (builds at start included); under _states_lock


class serving:
    """``with nodes.serving():`` around one pack's load: its time counts in
    the start-up line (``startup_line``)."""

    def __enter__(self):
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        with _states_lock:
            _serving_s[0] += time.monotonic() - self.t0


def startup_line():
    """The one line bulkhead logs when ComfyUI's server starts: its
    version, how many packs run isolated, which do not and why, and the
    time spent on them."""
    from .. import __version__
    rows = pack_states()
    iso = [r for r in rows if r["state"] == "isolated"]
    lost = [r for r in rows if r["state"] != "isolated"]
    with _states_lock:
        spent = _serving_s[0]
    text = f"bulkhead {__version__}: {len(iso)} pack{'' if len(iso) == 1 else 's'} isolated"
    if lost:
        text += (f", {len(lost)} NOT isolated ("
                 + "; ".join(f"{r['name']}: {r['state']}: {r['reason'].split('. ')[0]}" for r in lost)
                 + "; the fix for each is in its line above)")
    return text + f"; {spent:.1f} s loading them. GET /bulkhead/status and the panel's Packs section list each"


def failed(pack_dir, name, reason, *, module="auto"):
    """Records a pack (its ``module``, as fallback names it) that could be
    served neither isolated nor in-process."""
    _set_state(os.path.realpath(os.fspath(pack_dir)), module, name=name, state="failed", reason=reason)


# BULKHEAD_FALLBACK=error: every pack that cannot run isolated is an
# error instead of running in ComfyUI's process (as a pack's own
# ``[bulkhead] fallback = "error"`` makes it for that pack).
FALLBACK_SWITCH = "BULKHEAD_FALLBACK"


def fallback_is_error(policy=None):
    """Whether a pack that cannot run isolated is an error rather than run
    in-process: its own ``[bulkhead] fallback`` (policy), or the machine's
    BULKHEAD_FALLBACK, says "error"."""
    return policy == "error" or os.environ.get(FALLBACK_SWITCH, "").strip().lower() == "error"


def fallback(pack_dir, reason, *, detail=None, name=None, module="auto", policy=None):
    """Imports the pack in this process and returns its own
    (NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS), after ONE warning
    per pack naming the reason (a key of REASONS, or any text) and the
    fix.  detail is added to the reason (e.g. what the stamp check said).
    Where the pack's ``[bulkhead] fallback`` (policy) or BULKHEAD_FALLBACK
    says "error", nothing is imported: one error line, the pack (its part)
    recorded failed, and no nodes, so a prompt using them fails instead of
    running in the wrong environment."""
    pack_dir = os.path.realpath(os.fspath(pack_dir))
    name = name or os.path.basename(pack_dir)
    what, fix = REASONS.get(reason, (str(reason) + "{detail}", "`bulkhead install {pack}`"))
    detail = f": {detail}" if detail and not detail.startswith((" ", ":")) else (detail or "")
    why, how = what.format(detail=detail, pack=pack_dir), fix.format(pack=pack_dir, detail=detail)
    if fallback_is_error(policy):
        source = ('its [bulkhead] fallback = "error"' if policy == "error" else f'{FALLBACK_SWITCH}=error')
        log.error("bulkhead: pack %r (%s) is NOT loaded: it cannot run isolated (%s), and %s makes that an "
                  "error instead of running it in ComfyUI's process. Fix: %s", name, pack_dir, why, source, how)
        _set_state(pack_dir, module, name=name, state="failed", reason=f"{why} (not run in-process: {source})",
                   fix=how)
        return {}, {}
    with _states_lock:     # once per pack and module: a pack's subdirectories fall back one by one
        first = _states.get((pack_dir, module), {}).get("state") != "in-process"
    if first:
        log.warning("bulkhead: pack %r (%s) runs in-process, NOT isolated: %s. Fix: %s", name, pack_dir, why, how)
    mod = import_nodes(pack_dir, module, unique_name=True)
    # in-process once imported: one that fails here too is the caller's to record (``failed``)
    _set_state(pack_dir, module, name=name, state="in-process", reason=why, fix=how)
    return (dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}),
            dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {}))


def close_all():
    """Stops every pack worker (their metadata stays)."""
    for rt in runtimes():
        rt.close()


def _forget_all():
    """Tests: forget every runtime (as a fresh ComfyUI start would)."""
    close_all()
    with _runtimes_lock:
        _runtimes.clear()
    with _states_lock:
        _states.clear()

