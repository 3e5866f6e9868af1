"""An isolated pack's runtime in the host: the proxy classes ComfyUI gets
and the call path to the pack's worker (``PackRuntime``; host/nodes.py's
``load_pack`` makes one per pack and environment).

A V1 proxy carries the real node's INPUT_TYPES,
RETURN_TYPES, RETURN_NAMES, FUNCTION, CATEGORY, OUTPUT_NODE, INPUT_IS_LIST,
OUTPUT_IS_LIST, DESCRIPTION (every upper-case class attribute, in fact) and,
where the real node has them, IS_CHANGED, VALIDATE_INPUTS (with the real
signature, which ComfyUI inspects) and check_lazy_status.  A V3 node (a
``comfy_api.latest.io.ComfyNode``, in NODE_CLASS_MAPPINGS or from the pack's
``comfy_entrypoint()``) gets a ComfyNode subclass of the host's own
comfy_api whose schema is the real one's, rebuilt (channel/nodes.py ``decode_schema``:
the same /object_info), whose ``execute`` (async when the real one is, run in a
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
The cache is host/metadata.py.

A run: the proxy's FUNCTION sends the inputs to the worker, which runs the
real node on its own instance of the class (one per proxy instance, held by
handle) and answers with the outputs.  Objects the codec cannot carry (a
MODEL the pack made) stay in the worker and come back as
``bulkhead.RemoteObject`` handles; see ``bulkhead.channel.peer``.  While the call runs:

* PROGRESS frames from the worker's ComfyUI progress hook drive a
  ``comfy.utils.ProgressBar`` here, in the node's own thread and context,
  previews included (rebuilt as the (format, PIL.Image, max_size) tuple
  ComfyUI's hook takes: host/progress.py);
* the host's interrupt watcher (one thread, reading ComfyUI's non-consuming
  ``processing_interrupted()`` every 20 ms while nodes run) interrupts the worker
  (``Worker.interrupt``: a frame and SIGUSR1); the worker's node stops on its
  own ComfyUI flag and the host raises its own InterruptProcessingException,
  leaving its flag set for ComfyUI's own check (host/interrupt.py);
* an out-of-memory error in the worker is raised here as ComfyUI's
  ``OOM_EXCEPTION`` with the worker's message and traceback.

The worker mirrors the host's dtype and memory flags into its own
``comfy.cli_args.args`` (``MIRRORED_ARGS``; not the VRAM-state flags, which
the memory layer carries) and the host's ``folder_paths`` directories.

What the pack registered on ``server.PromptServer`` at import (routes,
prompt handlers) is installed on the host's server by
``host/serverproxy.py``; events its worker sends reach the host's
PromptServer there too.

This module only reads ComfyUI's state; it never assigns to a comfy module.
"""

import asyncio
import collections
import contextvars
import inspect
import itertools
import json
import logging
import os
import sys
import threading
import time
import weakref

from .. import _native
from ..channel.formats import (FORMAT, NodeInterrupted, WorkerOutOfMemory, decode_meta, encode_arg, host_folders,
                               link_types, remote_name, types_to_worker)
from ..channel.nodes import decode_schema, graph_prefix, put_back
from ..channel.peer import BulkheadError, HandleError, HostObject, NodeValue, RemoteError, RemoteObject, renamed
from ..channel import spec, targets
from ..packimport import package_for, default_module, package_name
from ..envs import hostmatch
from . import sandbox, workerenv
from .errors import WorkerDied, WorkerStartError
from .interrupt import watcher
from .metadata import MetadataCache, comfyui_version_hash, default_stamp, source_hash
from .progress import Progress
from .serverproxy import ServerProxy
from .v3 import hidden_values
from .workers import Worker

log = logging.getLogger("bulkhead")


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


class PackLoadError(BulkheadError, ImportError):
    """A pack's nodes could not be described (its import failed in the
    worker, or the worker could not start)."""


# --- where things are ---

def find_comfyui(options=None):
    """The host's ComfyUI directory: options['comfyui'], else where the
    imported ``folder_paths`` or ``comfy`` came from, else $COMFYUI_PATH;
    None when there is none (envs.hostmatch matches environments to it)."""
    return hostmatch.find_comfyui(options)


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


def _host_type_names():
    """The type names the host's registered nodes return (the V1 ones'
    RETURN_TYPES: a class attribute, no schema built), which a pack's own
    type strings are compared with as it is described
    (formats.TypeTable)."""
    names = set()
    mappings = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", None)
    for cls in list(mappings.values()) if isinstance(mappings, dict) else ():
        try:
            returns = inspect.getattr_static(cls, "RETURN_TYPES", None)   # a V3 node's: a property, left out
        except Exception:
            continue
        if isinstance(returns, (tuple, list)):
            names.update(str.__str__(t) for t in returns if isinstance(t, str))
    return sorted(names)


# --- V3 nodes (their schema rebuilt in the host's comfy_api: host/v3.py) ---

async def _in_thread(fn, *args):
    """fn(*args) in a thread, awaited (its context copied: ComfyUI's
    progress reads the executing node from it)."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, lambda: ctx.run(fn, *args))


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


def _live_combos(types, described, fresh):
    """INPUT_TYPES' decoded types with each dropdown the worker gave
    again (fresh: {category: {input: [options]}}) in place of the
    described one; a folder_paths list (read here live) and an input the
    description has no list for keep theirs."""
    for category, inputs in (fresh or {}).items():
        have, raw = types.get(category), described.get(category)
        if not isinstance(have, dict) or not isinstance(raw, dict):
            continue
        for name, options in inputs.items():
            spec, spec_raw = have.get(name), raw.get(name)
            if not (isinstance(spec, tuple) and spec and isinstance(spec[0], list) and isinstance(spec_raw, dict)):
                continue
            first = (spec_raw.get("items") or [None])[0]
            if isinstance(first, dict) and first.get("__bh__") == "folder":
                continue
            have[name] = (list(options),) + spec[1:]


def _live_v3_combos(schema, node, fresh):
    """A V3 proxy's rebuilt schema with each dropdown the worker gave
    again (fresh: {category: {input id: [options]}}) in place of the
    described one, in the input's options and in what its as_dict
    answers (GET_NODE_INFO_V1 reads that); a folder_paths list (read
    here live), a dynamic input and an input the description has no list
    for keep theirs."""
    options = {name: opts for inputs in (fresh or {}).values() for name, opts in inputs.items()}
    for x, d in zip(schema.inputs or (), node["inputs"]):
        opts, described = options.get(getattr(x, "id", None)), d.get("as_dict")
        if opts is None or "dynamic" in d or not isinstance(described, dict) \
                or not isinstance(described.get("options"), list):
            continue
        x.options = list(opts)
        x.as_dict = _with_options(x.as_dict, opts)


def _with_options(as_dict, options):
    """as_dict (a rebuilt input's) answering these options."""
    return lambda: {**as_dict(), "options": list(options)}


def _memo_key(key, kwargs, v3_hidden):
    """What identifies one validation (node key, inputs, hidden values) for
    remembering that it passed, or None where its inputs are not plain
    values (their repr is no identity)."""
    if v3_hidden is not None or not all(_plain_value(v) for v in kwargs.values()):
        return None
    try:
        return key, repr(sorted(kwargs.items()))
    except Exception:
        return None


def _plain_value(v, depth=0):
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if depth < 8 and isinstance(v, (list, tuple)):
        return all(_plain_value(x, depth + 1) for x in v)
    if depth < 8 and isinstance(v, dict):
        return all(isinstance(k, str) and _plain_value(x, depth + 1) for k, x in v.items())
    return False


def _executor_awaits_tasks():
    """Whether ComfyUI's executor awaits an asyncio task a node's validator
    returns (upstream's does since its async nodes:
    execution.resolve_map_node_over_list_results)."""
    return callable(getattr(sys.modules.get("execution"), "resolve_map_node_over_list_results", None))


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


# ComfyUI's types whose values are or hold torch tensors: a pack whose
# nodes take or return one of these gets a worker forked from a zygote that
# has imported torch (worker/zygote.py).  Any other pack's zygote imports
# no torch -- numbers, text, its own types (a numpy mesh) -- as a worker
# imports what its pack needs; one that imports torch itself pays that
# import in its worker, as a spawned worker does.
TENSOR_TYPES = frozenset(("IMAGE", "MASK", "LATENT", "AUDIO", "VIDEO", "MODEL", "CLIP", "VAE", "CONDITIONING",
                          "CONTROL_NET", "CLIP_VISION", "CLIP_VISION_OUTPUT", "STYLE_MODEL", "GLIGEN",
                          "UPSCALE_MODEL", "SIGMAS", "NOISE", "SAMPLER", "GUIDER", "HOOKS", "WAN_CAMERA_EMBEDDING"))
# What every pack's zygote imports: the worker's own modules.
ZYGOTE_PRELOAD = ("bulkhead.worker.nodes", "bulkhead.worker.memory")


def _io_types(cls):
    """Every input and output type a proxy class names (a combo's list
    aside)."""
    spec = cls.INPUT_TYPES()
    types = [t for section in spec.values() if isinstance(section, dict)
             for t in (v[0] if isinstance(v, (list, tuple)) and v else v for v in section.values())]
    types.extend(getattr(cls, "RETURN_TYPES", ()) or ())
    return [t for t in types if not isinstance(t, (list, tuple))]


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


# What the worker's describe() says beyond channel.formats.FORMAT, in the
# metadata cache key: 1, whether a V1 node's FUNCTION is a coroutine function.
DESCRIBED = 1

# How often a wait for an async node's task looks whether its worker still
# lives (its end is a frame, which a dead worker never sends).
ASYNC_POLL_S = 0.05


class _AsyncCall:
    """An async node's task in the worker, as its waiter here sees it: the
    event loop the proxy's coroutine awaits on, the future the task's end
    resolves, and the node's progress, shown in the node's own context."""
    __slots__ = ("loop", "done", "progress", "context")

    def __init__(self, loop, done, progress, context):
        self.loop, self.done, self.progress, self.context = loop, done, progress, context

    def on_frame(self, v):
        """A PROGRESS frame of the task (any host thread that reads the
        worker's channel): handed to the node's loop."""
        try:
            if v.get("done"):
                self.loop.call_soon_threadsafe(_resolve, self.done)
            else:
                self.loop.call_soon_threadsafe(self.progress.on_frame, v, context=self.context)
        except RuntimeError:   # the loop is closed: the prompt ended, nothing waits
            pass


def _resolve(future):
    if not future.done():
        future.set_result(None)


# --- one pack ---

class PackRuntime:
    """One isolated pack: its worker, its metadata, its proxy classes."""

    def __init__(self, pack_dir, python, name, env, options, comfyui, memory=None):
        # The worker generation that is warm (prewarmed, or a node ran
        # there); a worker alive from describing the pack is not.
        self.warm_generation = None
        self.pack_dir = pack_dir
        self.python = os.fspath(python)
        self.name = name
        # The pack's settings (channel/spec.py's record: every option,
        # the pack's value or the row's default) and what load_pack adds.
        self.options = options if isinstance(options, spec.Settings) else spec.settings(options)
        options = self.options
        self.comfyui = comfyui
        # The HostMemory the worker stands in and is drained by after every
        # node (host/memory.py), or None: outside the one budget.
        self.memory = memory
        module = options.get("module", "auto")
        if module == "auto":
            module = default_module(pack_dir)
        self.module = module
        self.worker = Worker(self.python, name=name, env=env, cwd=comfyui,
                             start_timeout_s=options["start_timeout_s"],
                             call_timeout_s=options.get("call_timeout_s"),
                             release_timeout_s=options.get("release_timeout_s"))
        self.worker.env_hooks.append(self._worker_env)
        self.worker.zygote_preload = self._zygote_preload
        self.sandbox = None         # this start's sandbox.Plan (_worker_env makes it)
        self.worker.sandbox = lambda: self.sandbox.spec() if self.sandbox is not None else None
        from ..envs.build import current_python  # lazy: ComfyUI start
        self.worker.resolve_python = current_python   # a rebuild while it runs: the next generation moves
        if memory is not None:
            memory.attach(self.worker)
        self.meta = None
        self.last_interrupt_at = None
        self.from_cache = False
        self.classes = {}
        self.display = {}
        self.server = ServerProxy(self)
        self._handle_gen = {}       # key -> the generation the node's outputs first held handles in
        self._is_changed_fns = {}   # key -> the proxy's IS_CHANGED (see _proxy)
        self._deferred = {}         # key -> VALIDATE_INPUTS kwargs answered "later" (call_class)
        self._validated = collections.OrderedDict()   # _memo_key -> True: inputs the worker passed (validate_on_loop)
        self._combos = None         # (time.monotonic(), live_combos' answer) of the last refresh
        self._deferred_lock = threading.Lock()
        # The worker's node instances the proxies hold (one per proxy
        # instance): made again on a new generation, so they never keep an
        # idle worker alive (host/idle.py).
        self.instances = weakref.WeakSet()
        # PROGRESS frames: those of the node call in progress (_call), and
        # those of async nodes' tasks, which carry their ticket (run_async).
        self._progress = None
        self._async = {}            # ticket -> _AsyncCall
        self._tickets = itertools.count(1)
        self.worker.frame_handlers[_native.PROGRESS] = self._on_progress

    def drain(self, worker):
        """The memory layer's drain after a call of worker's (stand-ins
        made to match the ledger), only on ComfyUI's execution thread:
        reconcile edits current_loaded_models, which that thread walks.
        A call from the server's event loop (VALIDATE_INPUTS) leaves it to
        the next node's drain."""
        if self.memory is not None and not on_server_loop():
            self.memory.reconcile(called=worker)

    @property
    def ledger(self):
        """The shared ledger the worker stamps its idle time in (the idle
        exit reads it: host/idle.py), or None outside the one budget."""
        return getattr(self.memory, "ledger", None)

    def tensor_nodes(self):
        """The keys of the nodes that take or return one of TENSOR_TYPES
        (one whose types cannot be read counts as one)."""
        out = []
        for key, cls in self.classes.items():
            try:
                if any(t in TENSOR_TYPES for t in _io_types(cls)):
                    out.append(key)
            except Exception:
                out.append(key)
        return out

    def _zygote_preload(self):
        """What the zygote forking this pack's worker imports first: the
        worker's modules, and torch where a node takes or returns one of
        TENSOR_TYPES (before the pack is described: the worker's modules
        alone)."""
        preload = list(ZYGOTE_PRELOAD)
        try:
            tensors = any(t in TENSOR_TYPES for cls in self.classes.values() for t in _io_types(cls))
        except Exception:   # a type this cannot read: as a tensor
            tensors = True
        if tensors:
            preload.append("torch")
        return preload

    def _worker_env(self):
        env = {
            spec.COMFYUI: self.comfyui,
            spec.PACK_DIR: self.pack_dir,
            spec.PACK_MODULE: self.module or "",
            spec.PACK_NAME: self.name,
            spec.COMFY_ARGS: spec.to_env(spec.COMFY_ARGS, host_args()),
        }
        folders = host_folders()
        if folders is not None:
            env[spec.COMFY_FOLDERS] = spec.to_env(spec.COMFY_FOLDERS, folders)
        plan = self._sandbox_plan(folders)
        if plan.active:
            env["TMPDIR"] = plan.tmp
            env[spec.SANDBOXED] = "1"
        alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        if alloc:
            env["PYTORCH_CUDA_ALLOC_CONF"] = alloc
        return env

    def _sandbox_plan(self, folders):
        """This start's sandbox (host/sandbox.py), made at each start: the
        options and ComfyUI's folders may have changed.  Raises
        WorkerStartError where it is required and the kernel cannot."""
        pp = [workerenv.worker_pythonpath()] + [p for p in str(self.worker.env.get("PYTHONPATH", "")).split(os.pathsep)
                                              if p]
        plan = sandbox.plan(self.name, self.pack_dir, self.worker.python, self.options, self.comfyui, folders, pp,
                            self.worker.env)
        self.sandbox = plan
        if plan.state == "refused":
            let = (f"set {spec.SANDBOX}=on" if spec.SANDBOX in plan.why
                   else 'set [bulkhead] sandbox = "on" in its comfy-env.toml')
            raise WorkerStartError(
                f"cannot start worker {self.name!r}: {plan.why}, so it is not started: run it on a kernel with "
                f"Landlock (Linux 5.13+), or {let} to let it run unsandboxed where the kernel cannot")
        return plan

    # metadata

    def cache_key(self):
        return {
            "format": FORMAT,
            "described": DESCRIBED,
            "protocol": _native.PROTOCOL_VERSION,
            "pack": self.pack_dir,
            "module": self.module,
            "python": self.python,
            "stamp": str(self.options.get("stamp") or default_stamp(self.python)),
            "sources": source_hash(self.pack_dir),
            "comfyui": [self.comfyui, comfyui_version_hash(self.comfyui)],
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
        link_types(self.meta, self.pack_dir)   # the pack's own type strings answer from their tables
        for problem in self.meta.get("problems", []):
            log.warning("bulkhead: pack %r: %s", self.name, problem)
        return self.meta

    def describe(self):
        try:
            return self.worker.call(targets.DESCRIBE, _host_type_names())
        except RemoteError as e:
            self.worker.close()
            raise PackLoadError(f"pack {self.name!r} ({self.pack_dir}) failed to import in its worker "
                                f"({self.python}): {e.detail}") from None
        except BulkheadError as e:
            err = PackLoadError(f"pack {self.name!r} ({self.pack_dir}): {e}")
            # Its sandbox is required and the kernel cannot: no fallback runs it unsandboxed (host/pack.py).
            err.sandbox_refused = self.sandbox is not None and self.sandbox.state == "refused"
            raise err from None

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
            types = decode_meta(input_types)
            if on_server_loop():    # the frontend's node definitions, a prompt's validation: as now
                _live_combos(types, input_types, rt.live_combos().get(key))
            return types
        ns["INPUT_TYPES"] = classmethod(INPUT_TYPES)
        for attr, value in node["attrs"].items():
            ns[attr] = decode_meta(value)
        function = node["function"]
        ns["FUNCTION"] = function

        if node.get("function_async"):
            # As in ComfyUI's process, where the executor runs it as a task
            # and goes on with other nodes while it waits (run_async).
            async def run(self, **kwargs):
                return await rt.run_async(self, key, kwargs)
        else:
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
        define_schema rebuilds the real node's schema (decode_schema), whose
        execute (async when the real one is) runs the real one in the
        worker with the hidden values, and which has the real node's
        validate_inputs / fingerprint_inputs / check_lazy_status (with
        their signatures) where it has its own."""
        from comfy_api.latest import io  # comfyui: comfy_api
        rt = self
        ns = {"__module__": f"bulkhead.nodes.{self.name}", "__doc__": f"{node['class_name']} "
              f"of pack {self.name!r} (a V3 node), run in its worker ({self.python}).",
              "_bulkhead_pack": self.name}

        def define_schema(cls):
            schema = decode_schema(io, node)
            if on_server_loop():    # the frontend's node definitions, a prompt's validation: as now
                _live_v3_combos(schema, node, rt.live_combos().get(key))
            return schema
        ns["define_schema"] = classmethod(define_schema)
        if node.get("execute_async"):   # a task, as run_async runs a V1 node's (the prefix read first)
            async def execute(cls, **kwargs):
                return await rt.run_v3_async(cls, key, kwargs, graph_prefix())
        else:
            def execute(cls, **kwargs):
                return rt.run_v3(cls, key, kwargs, None, graph_prefix())
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
                if mname == "validate_inputs" and on_server_loop():    # as VALIDATE_INPUTS (validate_on_loop)
                    return rt.validate_on_loop(key, kwargs, hidden_values(cls))
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
            if mname == "VALIDATE_INPUTS" and "input_types" in kwargs:   # the pack's own types as its objects
                kwargs = dict(kwargs, input_types=types_to_worker(kwargs["input_types"], rt.pack_dir))
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
        with w.holding():
            self._begin(w, mm, key, deferred)
            instance = node.__dict__.get("_bulkhead_instance")
            if instance is not None and instance._peer is not w.peer:
                instance = None  # the worker was restarted: a new instance there
            prefix = graph_prefix()   # what ComfyUI's executor set for this call of the node
            try:
                res = self._call(w, mm, targets.RUN, key, NodeValue(kwargs), instance, method, prefix)
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
                res = self._call(w, mm, targets.RUN, key, NodeValue(kwargs), None, method, prefix)
            peer = w.peer
        if key not in self._handle_gen and _holds_handles(res["outputs"]):
            self._outputs_hold_handles(type(node), key, peer.generation)
        node._bulkhead_instance = res["instance"]
        if res["instance"] is not None:
            self.instances.add(res["instance"])
        if res.get("same"):  # inputs the node passed through: the host's own objects
            return put_back(res["outputs"], res["same"], kwargs)
        return res["outputs"]

    async def run_async(self, node, key, kwargs):
        """An async V1 node's FUNCTION: as in ComfyUI's process, a task that
        the executor's loop awaits while other nodes run (several in flight
        in one worker; _run_task)."""
        prefix = graph_prefix()   # as run's, read before the first wait

        def start(w, mm, ticket):
            instance = node.__dict__.get("_bulkhead_instance")
            if instance is not None and instance._peer is not w.peer:
                instance = None  # the worker was restarted: a new instance there
            try:
                res = self._call(w, mm, targets.RUN_ASYNC, ticket, key, NodeValue(kwargs), instance, prefix)
            except HostObject as e:
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of node {key!r} (pack {self.name!r})") \
                    from None
            except HandleError:
                if instance is None or instance._peer is w.peer:   # as in run
                    raise
                node.__dict__.pop("_bulkhead_instance", None)
                res = self._call(w, mm, targets.RUN_ASYNC, ticket, key, NodeValue(kwargs), None, prefix)
            node._bulkhead_instance = res["instance"]
            if res["instance"] is not None:
                self.instances.add(res["instance"])
        res, peer = await self._run_task(key, self._take_deferred(key, kwargs), None, start)
        if key not in self._handle_gen and _holds_handles(res["outputs"]):
            self._outputs_hold_handles(type(node), key, peer.generation)
        if res.get("same"):  # inputs the node passed through: the host's own objects
            return put_back(res["outputs"], res["same"], kwargs)
        return res["outputs"]

    async def run_v3_async(self, clone, key, kwargs, prefix=None):
        """An async V3 node's execute, on the class clone ComfyUI made, as
        run_async runs a V1 node's FUNCTION; answers run_v3's io.NodeOutput."""
        hidden = hidden_values(clone)

        def start(w, mm, ticket):
            try:
                self._call(w, mm, targets.RUN_V3_ASYNC, ticket, key, NodeValue(kwargs), NodeValue(hidden), prefix)
            except HostObject as e:
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of node {key!r} (pack {self.name!r})") \
                    from None
        res, _peer = await self._run_task(key, self._take_deferred(key, kwargs), hidden, start)
        return self._node_output(res, kwargs)

    async def _run_task(self, key, deferred, v3_hidden, start):
        """An async node call: start(w, mm, ticket) starts its task in the
        worker, under the worker lock, and this awaits its end and fetches
        its outcome; returns (the worker's answer, the generation's Peer).
        The lock is held only for the exchanges that start the task and
        fetch its outcome, never while it runs: the worker serves other
        calls meanwhile, and says when the task ended (a PROGRESS frame
        with its ticket, read by whichever host thread reads its channel
        then).  Its progress reaches this node; the interrupt watcher
        covers the whole wait; a worker that dies meanwhile fails the call
        with WorkerDied, and a prompt that ends first (the coroutine
        cancelled) cancels the task there."""
        mm = _mm()
        if mm is not None and mm.processing_interrupted():
            raise mm.InterruptProcessingException()
        w = self.worker
        loop = asyncio.get_running_loop()
        ticket = next(self._tickets)
        call = self._async[ticket] = _AsyncCall(loop, loop.create_future(), Progress(mm),
                                                contextvars.copy_context())
        started = None   # the generation the task runs in, until its outcome is asked for
        try:
            with w.holding():
                self._begin(w, mm, key, deferred, v3_hidden)
                start(w, mm, ticket)
                peer = started = w.peer
            await self._await_task(w, peer, call, key, mm)
            started = None   # ended there: its outcome is taken (or lost with the worker)
            with w.holding():
                if w.peer is not peer:
                    raise w.ended(peer, f"after node {key!r} ran (async)")
                return self._call(w, mm, targets.ASYNC_RESULT, ticket), peer
        finally:
            self._async.pop(ticket, None)
            if started is not None:   # cancelled, or failed while the task ran: it ends there too
                self._cancel_task(w, started, ticket)

    def async_calls(self):
        """How many async node calls of this pack are in flight: their
        tasks run in the worker between its calls, so it is not idle
        (host/idle.py)."""
        return len(self._async)

    async def _await_task(self, w, peer, call, key, mm):
        """Waits for the task's end, under the interrupt watcher, looking
        every ASYNC_POLL_S whether its worker still lives."""
        watch = None
        if mm is not None and hasattr(mm, "processing_interrupted"):
            watch = watcher.begin(w, mm, self.options["interrupt_grace_s"])
        try:
            while True:
                done, _ = await asyncio.wait((call.done,), timeout=ASYNC_POLL_S)
                if done:
                    return
                if w.peer is peer and w.alive:
                    continue
                if watch is not None and watch.stopped_worker:
                    log.warning("bulkhead: pack %r: node %r was still running %.1f s after the interrupt, so its "
                                "worker was stopped (interrupt_grace_s in [bulkhead]; 0 turns this off)",
                                self.name, key, watch.grace_s)
                    if hasattr(mm, "InterruptProcessingException"):
                        raise mm.InterruptProcessingException()
                    raise NodeInterrupted(f"a node of pack {self.name!r} was interrupted (its worker was stopped)")
                with w.holding():
                    raise w.ended(peer, f"while node {key!r} ran (async)")
        finally:
            if watch is not None:
                watcher.end(watch)
                self.last_interrupt_at = watch.fired_at

    def _cancel_task(self, w, peer, ticket):
        """Cancels an async node's task in its worker (the prompt ended
        while it ran, or its wait failed): nothing is left running there
        for a node nobody waits for."""
        with w.holding():
            if w.peer is not peer or not w.alive:
                return
            try:
                w.call(targets.ASYNC_CANCEL, ticket)
            except BulkheadError as e:
                log.debug("bulkhead: pack %r: cancelling async call #%d: %s", self.name, ticket, e)

    def _on_progress(self, v):
        """PROGRESS frames from the worker (any host thread reading its
        channel): an async node's task's (its ticket: progress, its end, or
        0 with "pump", the task's requests to the host waiting), or the
        node call's in progress."""
        ticket = v.get("ticket") if isinstance(v, dict) else None
        if ticket is None:
            sync = self._progress
            if sync is not None:
                sync(v)
        elif v.get("pump"):
            try:   # this thread holds the worker lock: it reads the channel
                self.worker.call(targets.ASYNC_PUMP)
            except BulkheadError as e:
                log.warning("bulkhead: pack %r: an async node's call to the host failed: %s", self.name, e)
        else:
            call = self._async.get(ticket)
            if call is not None:
                call.on_frame(v)

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

    # Dropdowns as INPUT_TYPES (a V3 node's define_schema) gives them now.
    # ComfyUI's own process runs a node's INPUT_TYPES or define_schema
    # again each time the frontend asks for the node definitions (and when
    # a prompt is validated), so a list a pack builds with os.listdir shows
    # a file added since.  On the server's loop the proxies ask the worker
    # for every node's dropdowns at once (targets.COMBOS), at most every
    # COMBOS_FRESH_S, where it runs, idle, with the pack imported, and
    # answers within COMBOS_WAIT_S; otherwise (and for folder_paths lists,
    # read here live) the described lists stand, which the next refresh
    # after the worker ran corrects.  A cold worker is never started for
    # it.
    COMBOS_FRESH_S = 1.0
    COMBOS_WAIT_S = 0.25

    def live_combos(self):
        """{key: {category: {input: [options]}}} from the worker (see
        above), or {}."""
        now = time.monotonic()
        with self._deferred_lock:
            cached = self._combos
            if cached is not None and now - cached[0] < self.COMBOS_FRESH_S:
                return cached[1]
            self._combos = (now, cached[1] if cached is not None else {})    # one asker at a time
        w, done = self.worker, threading.Event()
        if not w.alive or w.busy:
            return self._combos[1]

        def ask():
            try:
                with w.holding_idle() as held:
                    if held and w.alive and not w.busy:
                        combos = w.call(targets.COMBOS)
                        if isinstance(combos, dict):
                            with self._deferred_lock:
                                self._combos = (time.monotonic(), combos)
            except BaseException as e:
                log.debug("bulkhead: pack %r: its dropdowns could not be read again: %s", self.name, e)
            finally:
                done.set()
        threading.Thread(target=ask, name=f"bulkhead-combos-{self.name}", daemon=True).start()
        done.wait(self.COMBOS_WAIT_S)   # later, its answer serves the next ask
        return self._combos[1]

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

    def validate_on_loop(self, key, kwargs, v3_hidden=None):
        """VALIDATE_INPUTS (a V3 node's validate_inputs: v3_hidden, the
        hidden values of ComfyUI's class clone) without waiting on the
        loop past VALIDATE_WAIT_S: the worker's answer when it is idle and
        running and answers in time.  Where it is not started, or answers
        later, and ComfyUI's executor awaits a task a validator returns
        (upstream's since its async nodes: _executor_awaits_tasks), a task
        that answers off the loop (the worker started on a thread of its
        own, as a prompt's first node would start it), so the prompt is
        refused at queue time as in-process; else, and where the worker
        runs a node, True and the check deferred to the node's run (see
        above)."""
        w, box, done = self.worker, {}, threading.Event()
        memo = _memo_key(key, kwargs, v3_hidden)

        def check(start=False):
            try:
                with w.holding_idle() as held:
                    if not held or w.busy or not (w.alive or start):
                        box["why"] = "busy" if not held or w.busy else "not started"
                        return
                    if start:
                        w.poll()
                        w.start()
                    box["answer"] = self._validate(w, _mm(), key, kwargs, drain=False, v3_hidden=v3_hidden)
                    if box["answer"] is True and memo is not None:
                        with self._deferred_lock:
                            self._validated[memo] = True
                            while len(self._validated) > self.VALIDATED_MAX:
                                self._validated.popitem(last=False)
            except BaseException as e:
                box["error"] = e
            finally:
                done.set()

        def answer():
            if "error" in box:
                raise box["error"]
            return box.get("answer", True)

        threading.Thread(target=check, name=f"bulkhead-validate-{self.name}", daemon=True).start()
        if done.wait(self.VALIDATE_WAIT_S) and "why" not in box:
            return answer()
        if box.get("why") == "not started" and memo is not None and memo in self._validated:
            return True     # these inputs passed before: a prompt ComfyUI may serve from its cache starts no worker
        if box.get("why") != "busy" and _executor_awaits_tasks():
            def started():
                if box.get("why") == "not started":
                    box.clear()
                    done.clear()
                    check(start=True)
                done.wait()
                if box.get("why"):      # a node took the worker meanwhile
                    self._defer(key, kwargs, v3_hidden, f"its worker is {box['why']}")
                return answer()
            return asyncio.get_running_loop().create_task(_in_thread(started))
        self._defer(key, kwargs, v3_hidden, f"its worker is {box['why']}" if "why" in box
                    else f"it did not answer within {self.VALIDATE_WAIT_S:g} s")
        return True

    VALIDATED_MAX = 256

    def _defer(self, key, kwargs, v3_hidden, why):
        with self._deferred_lock:
            pending = self._deferred.setdefault(key, [])
            pending.append(dict(kwargs))
            del pending[:-self.DEFERRED_MAX]
        log.info("bulkhead: pack %r: %s.%s is checked when the node runs (%s)", self.name, key,
                 "VALIDATE_INPUTS" if v3_hidden is None else "validate_inputs", why)

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

    def _validate(self, w, mm, key, kwargs, drain=True, v3_hidden=None):
        """The worker's VALIDATE_INPUTS answer for these inputs (a V3 node's
        validate_inputs where v3_hidden is given; the caller holds the
        worker lock)."""
        try:
            if v3_hidden is not None:
                return self._call(w, mm, targets.RUN_V3, key, "validate_inputs", NodeValue(dict(kwargs)),
                                  NodeValue(v3_hidden), drain=drain)
            return self._call(w, mm, targets.CALL_CLASS, key, "VALIDATE_INPUTS",
                              NodeValue(dict(kwargs)), drain=drain)
        except HostObject as e:
            raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {key}.VALIDATE_INPUTS (pack {self.name!r})") \
                from None

    def _begin(self, w, mm, key, deferred, v3_hidden=None):
        """A node call's start, under the worker lock: a generation that
        died idle is noticed here, not half-way through the call; the
        worker started; the node's deferred VALIDATE_INPUTS checked."""
        w.poll()
        w.start()
        for checked in deferred:
            self._validate_late(w, mm, key, checked, v3_hidden)

    def _validate_late(self, w, mm, key, checked, v3_hidden=None):
        answer = self._validate(w, mm, key, checked, v3_hidden=v3_hidden)
        if answer is not True:
            raise ValueError(f"{key}: its VALIDATE_INPUTS refused these inputs: {answer} (pack {self.name!r}; "
                             "checked when the node ran, because its worker was busy or not started when the "
                             "prompt was queued)")

    def run_v3(self, clone, key, kwargs, method=None, prefix=None):
        """A V3 proxy's execute (method None) or its validate_inputs /
        fingerprint_inputs / check_lazy_status, on the class clone ComfyUI
        made (its `hidden` holds the hidden values), run in the worker
        (with execute, prefix: the GraphBuilder prefix ComfyUI's executor
        set for the call, channel/nodes.py graph_prefix).  execute answers
        an io.NodeOutput of the host's comfy_api."""
        mm = _mm()
        if method is None and mm is not None and mm.processing_interrupted():
            raise mm.InterruptProcessingException()
        hidden = hidden_values(clone)
        deferred = self._take_deferred(key, kwargs) if method is None else []
        w = self.worker
        with w.holding():
            self._begin(w, mm, key, deferred, hidden)
            try:
                res = self._call(w, mm, targets.RUN_V3, key, method, NodeValue(kwargs), NodeValue(hidden), prefix)
            except HostObject as e:
                where = f"{key}.{method}" if method else f"node {key!r}"
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {where} (pack {self.name!r})") from None
        if method is not None:
            return res
        return self._node_output(res, kwargs)

    @staticmethod
    def _node_output(res, kwargs):
        """The worker's answer for a V3 node's execute as an io.NodeOutput
        of the host's comfy_api."""
        from comfy_api.latest import io  # comfyui: comfy_api
        out = res["outputs"]
        args = out["args"]
        if res.get("same"):  # inputs the node passed through: the host's own objects
            args = put_back(args, res["same"], kwargs)
        return io.NodeOutput(*args, ui=out["ui"], expand=out["expand"],
                             block_execution=out["block_execution"])

    def call_class(self, key, mname, kwargs):
        with self.worker.holding():
            try:
                return self._call(self.worker, _mm(), targets.CALL_CLASS, key, mname,
                                  NodeValue(kwargs))
            except HostObject as e:
                raise _host_object_error(e, kwargs, lambda k: f"{k!r} of {key}.{mname} (pack {self.name!r})") from None

    def _call(self, w, mm, target, *args, drain=True):
        outer, self._progress = self._progress, Progress(mm).on_frame
        watch = None
        if mm is not None and hasattr(mm, "processing_interrupted"):
            watch = watcher.begin(w, mm, self.options["interrupt_grace_s"])
        w.park_reader()
        try:
            out = w.call(target, *args)
            self.warm_generation = w.generation     # a node ran here: nothing left to prewarm
            return out
        except RemoteError as e:
            # Raised with the worker's traceback as its cause (peer.make_error),
            # not this frame's context: ComfyUI's log shows the worker's frames.
            err = self._translate(e, mm)
            raise err from err.__cause__
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
                watcher.end(watch)
                self.last_interrupt_at = watch.fired_at
            self._progress = outer
            if drain:
                self.drain(w)

    def _translate(self, e, mm):
        kind = e.remote_type
        if kind == remote_name(NodeInterrupted):
            if mm is not None and hasattr(mm, "InterruptProcessingException"):
                return mm.InterruptProcessingException()
            return NodeInterrupted(f"a node of pack {self.name!r} was interrupted")
        if kind == remote_name(WorkerOutOfMemory):
            cls = getattr(mm, "OOM_EXCEPTION", None) if mm is not None else None
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                cls = MemoryError
            # The worker's message is "<type>: <message>" of what ran out
            # (worker/nodes.py).  Where that type is ComfyUI's OOM class the
            # message is the original's, as in-process; another (a RAM
            # MemoryError raised as ComfyUI's OOM) keeps its type's name.
            text = e.remote_message
            raised, sep, message = text.partition(": ")
            if sep and raised.rpartition(".")[2] == cls.__qualname__:   # torch.cuda. or torch.: by version
                text = message
            try:
                err = cls(text)
            except Exception:
                err = MemoryError(text)
            err.__cause__ = e.__cause__
            return err
        return self._as_in_process(e)

    def _as_in_process(self, e):
        """e, its class named as in ComfyUI's process where it is the
        pack's own: the worker imports the pack under its folder's name,
        ComfyUI under its path (the package ComfyUI imported, found by its
        folder), so a pack's exception class is
        <the name ComfyUI gave the pack>.<module>.<qualname> in ComfyUI's
        error, as in-process."""
        module = type(e).__module__
        worker_pkg = None
        nodes_module = (self.meta or {}).get("module") or ""
        for name in (package_name(self.pack_dir), self.pack_dir.replace(".", "_x_")):
            if nodes_module == name or nodes_module.startswith(name + "."):
                worker_pkg = name
        if worker_pkg is None or not (module == worker_pkg or module.startswith(worker_pkg + ".")):
            return e
        host_pkg = package_for(os.path.realpath(self.pack_dir))
        host_name = getattr(host_pkg, "__name__", None)
        if not isinstance(host_name, str) or host_name == worker_pkg:
            return e
        err = renamed(e, host_name + module[len(worker_pkg):])
        err.__cause__ = e.__cause__
        return err

    def prewarm(self):
        """Starts the worker and imports the pack there: what the pack's
        first node would otherwise wait for; then rehearses a node call.  Blocks (the caller is a
        thread of host/prewarm.py); returns the number of node classes."""
        w = self.worker
        with w.holding():
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
