"""The one call an isolated pack's ``__init__.py`` makes:

    import bulkhead
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)

It reads the pack's ``comfy-env.toml`` (packconfig), checks the pack's
environment (envs: built, stamp current), and returns proxy node classes
whose work runs in a worker under that environment's interpreter (nodes),
with the worker under the host's one memory budget (memory: its models
stand in ComfyUI's ledger, or answer ComfyUI's MemoryHolder registry where
it has one (holder), its loads are admitted, it is drained after every
node).  Before the first pack, bulkhead's contract with this ComfyUI is
checked once (contract): a feature it lacks is one warning; a name bulkhead
cannot work without refuses isolation.  Anything that keeps the pack from
running isolated — no config, an environment not built or refused, no
ComfyUI, a contract refused, bulkhead's custom node deleted from ComfyUI's
custom_nodes (``packimport.custom_node_missing``) — falls back to an in-process import with ONE
warning naming the reason and the command that fixes it (``bulkhead
install <pack dir>``, ``bulkhead doctor``).  An environment that is
missing is first built, there and then (``build_at_start``).
"""

import json
import logging
import os
import threading

from .. import packimport
from . import nodes, states

log = logging.getLogger("bulkhead")

_memory = None
_memory_failed = False
_memory_lock = threading.Lock()


def host_memory():
    """This process's HostMemory, made on first use once ComfyUI's memory
    manager is importable; None outside ComfyUI."""
    global _memory, _memory_failed
    with _memory_lock:
        if _memory is None and not _memory_failed:
            try:
                import comfy.model_management as mm
            except Exception:
                return None
            from .. import _native
            from . import holder
            from .memory import HostMemory
            try:
                _memory = HostMemory(mm)
            except (_native.Error, OSError) as e:
                # A shared ledger this process cannot use (another layout
                # version, another owner, a full ledger...): packs still run
                # isolated, outside the one budget, and the log says why.
                _memory_failed = True
                log.warning("bulkhead: isolated packs run OUTSIDE the shared memory budget: %s", e)
            else:
                holder.install(_memory)   # one MemoryHolder, where ComfyUI has the registry
        return _memory


def contract_refusal():
    """Why this ComfyUI cannot host isolated packs (the contract check,
    run once per process), or None.  None too outside ComfyUI: there is
    nothing to check, and load_pack falls back for that on its own."""
    try:
        import comfy.model_management  # noqa: F401
    except Exception:
        return None
    from . import contract
    return contract.startup().refusal()


def _attach(hm):
    def attach(worker):
        hm.attach(worker)
    return attach


def _drain(hm):
    def after_call(worker):
        # Only on ComfyUI's execution thread: reconcile edits
        # current_loaded_models, which that thread walks.  A call from the
        # web server's event loop (VALIDATE_INPUTS) leaves it to the next
        # node's drain.
        if not nodes.on_server_loop():
            hm.reconcile(called=worker)
    return after_call


def comfy_pack(init_file, *, module="auto"):
    """(NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS) for the pack whose
    ``__init__.py`` is init_file.  module: where the real node classes live
    ('auto': ``nodes.py`` / ``nodes/``).  A pack with several configs (in
    ``nodes/<subdir>/``) gets one worker per config, each serving the nodes
    of its directory."""
    init_file = os.fspath(init_file)
    with states.serving():
        # bulkhead's custom node deleted (the Manager's Uninstall): off, each
        # part in-process or failed by its own fallback setting
        gone = packimport.custom_node_missing(os.path.dirname(os.path.abspath(init_file)),
                                              os.path.dirname(os.path.realpath(init_file)))
        return _comfy_pack(os.path.dirname(os.path.realpath(init_file)), module, gone)


def _comfy_pack(pack_dir, module, gone=None):
    from ..envs import config as packconfig
    try:
        paths = packconfig.find_configs(pack_dir)
    except OSError as e:
        return states.fallback(pack_dir, states.CONFIG_REFUSED, detail=str(e), module=module)
    if not paths:
        return states.fallback(pack_dir, states.NO_CONFIG, module=module)
    classes, display = {}, {}
    refusal = contract_refusal() if gone is None else None
    hm = host_memory() if refusal is None and gone is None else None
    for path in paths:
        directory = os.path.dirname(path)
        sub_module = module if directory == pack_dir else "auto"
        config = load_config(path, pack_dir)
        if gone is not None and not isinstance(config, packconfig.PackConfigError):
            c, d = states.fallback(config.directory, states.CUSTOM_NODE_GONE, detail=f" ({', '.join(gone)})",
                                   name=config.name, module=sub_module, policy=config.options.get("fallback"))
        elif isinstance(config, packconfig.PackConfigError):
            # Only the directory this config governs runs in-process; the
            # pack's other configs are served as they are.
            if directory == pack_dir:
                return states.fallback(pack_dir, states.CONFIG_REFUSED, detail=str(config), module=module)
            c, d = states.fallback(directory, states.CONFIG_REFUSED, detail=str(config), module=sub_module,
                                   name=packconfig.pack_name(path, pack_dir))
        else:
            c, d = serve_config(config, config.directory, sub_module, refusal, hm)
        classes.update(c)
        display.update(d)
    return classes, display


def load_config(path, pack_dir):
    """The PackConfig at ``path`` (its warnings logged), or the
    PackConfigError that refuses it: a refused config costs only the
    nodes it governs their isolation."""
    from ..envs import config as packconfig
    try:
        return packconfig.load(path, root=pack_dir)
    except packconfig.PackConfigError as e:
        return e


BUILD_AT_START = "BULKHEAD_BUILD_AT_START"
# How long ComfyUI's start waits for another install of the same
# environment (a `bulkhead install` running, or stuck) before the pack is
# reported not built: a start is never held by a lock for long.
START_LOCK_WAIT_S = 30.0


def build_at_start(config, st):
    """A config whose environment is missing (a pack just installed by
    ComfyUI-Manager or ``git clone``: its install.py ran comfy-env, or
    nothing) is built now, while ComfyUI starts, as ``bulkhead install``
    would, its progress in the log.  So is one that is stale only because
    the host changed (ComfyUI upgraded, its torch or requirements moved:
    ``host_changed``), which nothing of the pack's would otherwise bring
    back; a worker of another ComfyUI running on the old one is told by
    its SUPERSEDED note and starts its next generation in the new one.
    Returns the EnvStatus after it, or ``st`` with the build's error in its
    reason.  ``BULKHEAD_BUILD_AT_START=0`` leaves it to ``bulkhead
    install``; an environment stale because its config changed, or refused,
    is never rebuilt here, nor is one whose build failed before while
    nothing it depends on changed (``envs.failed_before``): a failure costs
    one start, not every start."""
    rebuild = st.state == "stale" and st.host_changed
    if not (st.state == "missing" or rebuild) or \
            os.environ.get(BUILD_AT_START, "1").lower() in ("0", "off", "no", "false"):
        return st
    import dataclasses
    import time
    from ..envs import build as envs
    from ..envs.config import PackConfigError
    before = envs.failed_before(config)
    if before is not None:
        # Not paid again at every start: only a change to the config, the
        # host's matched set or bulkhead, or `bulkhead install`, tries again.
        return dataclasses.replace(st, reason=(
            f"{st.reason}; its build failed at {before.get('created', '?')} ({before.get('error', '?')}) and "
            f"is not retried at start until its config, the host's packages or bulkhead change; "
            f"`bulkhead install {config.root}` retries it now"))
    if rebuild:
        log.info("bulkhead: pack %r: its environment is stale because the host changed (%s); rebuilding it "
                 "now, as `bulkhead install %s` would (%s=0 leaves it to that command)",
                 config.name, st.reason.split("; run `")[0], config.root, BUILD_AT_START)
    else:
        log.info("bulkhead: pack %r: its environment is not built; building it now, as `bulkhead install %s` "
                 "would (%s=0 leaves it to that command)", config.name, config.root, BUILD_AT_START)
    t0 = time.monotonic()
    try:
        after = envs.build(config, progress=lambda line: log.info("[bulkhead install %s] %s", config.name, line),
                           lock_timeout_s=START_LOCK_WAIT_S)
    except (envs.EnvBuildError, PackConfigError, OSError) as e:
        log.warning("bulkhead: pack %r: building its environment failed: %s", config.name, e)
        # the whole output is in the warning above
        return dataclasses.replace(st, reason=f"{st.reason}; building it at start failed: {envs.first_line(e)}")
    log.info("bulkhead: pack %r: environment built in %.1f s (%s)", config.name, time.monotonic() - t0,
             after.env_dir)
    return after


def _load(config, pack_dir, python, stamp, module, hm):
    """load_pack for one config's environment, with its [bulkhead] options
    and [env_vars]."""
    opts = {"module": module}
    if stamp:
        opts["stamp"] = stamp
    o = config.options
    if o.get("call_timeout_s"):
        opts["call_timeout_s"] = float(o["call_timeout_s"])
    if o.get("start_timeout_s"):
        opts["start_timeout_s"] = float(o["start_timeout_s"])
    if o.get("release_timeout_s"):
        opts["release_timeout_s"] = float(o["release_timeout_s"])
    if "interrupt_grace_s" in o:
        opts["interrupt_grace_s"] = float(o["interrupt_grace_s"])
    if "prewarm" in o:
        opts["prewarm"] = o["prewarm"]
    if o.get("fallback"):
        opts["fallback"] = o["fallback"]
    if "idle_exit_s" in o:
        opts["idle_exit_s"] = float(o["idle_exit_s"])
    from ..envs import conda
    env = conda.worker_env(os.path.dirname(os.path.dirname(python)))
    env.update(config.env_vars)
    ser = serializer_files(config.root)
    if ser:
        env["BULKHEAD_SERIALIZERS"] = json.dumps(ser)
    if o.get("idle_release_s"):
        env.setdefault("BULKHEAD_IDLE_RELEASE_S", str(o["idle_release_s"]))
    if hm is not None:
        opts["attach"] = _attach(hm)
        opts["after_call"] = _drain(hm)
        opts["ledger"] = hm.ledger      # the idle exit reads the worker's idle stamp there (host/idle.py)
    return nodes.load_pack(pack_dir, python, name=config.name, env=env, options=opts)


def _load_or_fall_back(config, pack_dir, python, stamp, module, hm):
    """_load, or -- when the pack fails to import in its worker (a module
    its environment lacks) -- the in-process import a failed build gets,
    with one warning carrying the worker's last traceback line.  Where it
    cannot import in the host either, the worker's error is raised (with
    the host's): ComfyUI lists the pack as IMPORT FAILED."""
    try:
        return _load(config, pack_dir, python, stamp, module, hm)
    except nodes.PackLoadError as e:
        err = e
    text = str(err)
    last = ([l.strip() for l in text.splitlines() if l.strip()] or [text])[-1]
    log.info("bulkhead: pack %r: its worker's traceback: %s", config.name, text)
    try:
        return states.fallback(pack_dir, states.WORKER_IMPORT_FAILED, detail=f" ({python}): {last}",
                               name=config.name, module=module, policy=config.options.get("fallback"))
    except Exception as host:
        states.failed(pack_dir, config.name, f"{last}; in ComfyUI's process too: {type(host).__name__}: {host}",
                      module=module)
        raise nodes.PackLoadError(f"{text}\n(in ComfyUI's process it fails too: {type(host).__name__}: "
                                  f"{host})") from None


def serializer_files(pack_root):
    """[[pack, serialization.py], ...] a worker of the pack at pack_root
    loads (worker/typed.py): its own when its comfy-env-root.toml declares
    custom [types], then those of the packs its [node_packs] / [node_reqs]
    name that are installed beside it and declare custom types."""
    from ..envs import config as packconfig, rootconfig
    out = []
    try:
        root = rootconfig.load_root(pack_root, warn=False)
    except packconfig.PackConfigError:
        return out
    if root is None:
        return out
    roots = [(os.path.basename(pack_root), pack_root, root)]
    for name, _ in root.node_packs:
        d = os.path.join(os.path.dirname(pack_root), name)
        try:
            r = rootconfig.load_root(d, warn=False) if os.path.isdir(d) else None
        except packconfig.PackConfigError:
            r = None
        if r is not None:
            roots.append((name, d, r))
    for name, d, r in roots:
        path = os.path.join(d, "serialization.py")
        if any(v == "custom" for v in r.types.values()) and os.path.isfile(path):
            out.append([name, path])
    return out


def serve_config(config, pack_dir, module, refusal, hm, reuse=None):
    """One config's nodes for a pack laid out as comfy-env's: module (e.g.
    "nodes" or "nodes.<subdir>") of the package at pack_dir, in a worker
    under the config's environment -- bulkhead's when ready, else what
    ``reuse(config)`` offers ((python, None), or (None, why)), else
    bulkhead's built now when there is none (build_at_start) -- or
    imported in-process with one warning saying why.  comfy_pack serves
    each of its configs through it too."""
    from ..envs import build as envs
    if refusal is not None:
        return states.fallback(pack_dir, states.CONTRACT_REFUSED, detail=refusal, name=config.name, module=module,
                               policy=config.options.get("fallback"))
    st = envs.env_status(config)
    why = None
    if not st.ok and reuse is not None:
        python, why = reuse(config)
        if python:
            log.info("bulkhead: pack %r: using the environment comfy-env built (%s)", config.name, python)
            return _load_or_fall_back(config, pack_dir, python, None, module, hm)
    if not why:   # comfy-env's own environment, there but refused, is reported as it is
        st = build_at_start(config, st)
    if st.ok:
        return _load_or_fall_back(config, pack_dir, st.python, f"{config.config_hash}:{st.version}", module, hm)
    reason = states.ENV_NOT_BUILT if st.state == "missing" and not why else states.STAMP_REFUSED
    detail = f"{st.state}: {st.reason}" + (f"; {why}" if why else "")
    if reason == states.ENV_NOT_BUILT and envs.failed_before(config) is not None:
        reason = states.BUILD_FAILED    # "build it" would fail the same way: the fix is what the error names
        detail = st.reason.split("; ", 1)[-1]   # the failure, not "no environment has been built for ..." first
    return states.fallback(pack_dir, reason, detail=detail, name=config.name, module=module,
                           policy=config.options.get("fallback"))
