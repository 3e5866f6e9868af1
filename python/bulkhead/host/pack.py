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
install <pack dir>``, ``bulkhead doctor``), where ComfyUI's process is the
same as the pack's environment (``host_differs``: every requirement its
config declares is installed here at a version its pins accept) or the
user chose in-process (``[bulkhead] fallback``, BULKHEAD_FALLBACK);
otherwise its nodes are listed but refuse to run, with the reason and the
fix (host/states.py ``refuse``): fail closed.  An environment that is
missing (or stale because the host changed) is built: in ComfyUI's server,
in the background (``_build_in_background``, host/building.py: the pack is
"building" and its nodes join ComfyUI's when the build ends; ComfyUI's
start never waits), elsewhere there and then (``build_at_start``).  One
whose config changed since it was built (a Manager update) keeps serving
the pack from the environment built before while the new one builds in
the background (``_serve_while_rebuilding``): never in-process.
"""

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from importlib import metadata

from .. import _native, packimport
from ..channel import spec
from ..envs import config as packconfig, hostmatch, rootconfig
from ..envs.config import CONFIG_NAME, PackConfigError
from ..envs.hostmatch import InvalidRequirement, InvalidVersion, Requirement, Version, canonicalize_name
from . import building, nodes, states, zygote
from .building import LogProgress
from .metadata import MetadataCache
from .runtime import PackLoadError, PackRuntime

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
                import comfy.model_management as mm  # comfyui: comfy.model_management
            except Exception:
                return None
            from . import holder  # lazy: CLI start (ComfyUI's process only)
            from .memory import HostMemory  # lazy: CLI start (ComfyUI's process only)
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
        import comfy.model_management  # noqa: F401; comfyui: comfy.model_management
    except Exception:
        return None
    from . import contract  # lazy: CLI start (ComfyUI's process only)
    return contract.startup().refusal()


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
    try:
        paths = packconfig.find_configs(pack_dir)
    except OSError as e:
        return states.fallback(pack_dir, states.CONFIG_REFUSED, detail=str(e), module=module,
                               unlike=UNREADABLE_CONFIG)
    if not paths:
        return states.fallback(pack_dir, states.NO_CONFIG, module=module)
    classes, display = {}, {}
    refusal = contract_refusal() if gone is None else None
    hm = host_memory() if refusal is None and gone is None else None
    loaded = []
    for path in paths:
        directory = os.path.dirname(path)
        sub_module = module if directory == pack_dir else "auto"
        config = load_config(path, pack_dir)
        if gone is not None and not isinstance(config, packconfig.PackConfigError):
            c, d = states.fallback(config.directory, states.CUSTOM_NODE_GONE, detail=f" ({', '.join(gone)})",
                                   name=config.name, module=sub_module, policy=config.options.get("fallback"),
                                   unlike=host_differs(config))
        elif isinstance(config, packconfig.PackConfigError):
            # Only the directory this config governs runs in-process; the
            # pack's other configs are served as they are.
            if directory == pack_dir:
                return states.fallback(pack_dir, states.CONFIG_REFUSED, detail=str(config), module=module,
                                       unlike=UNREADABLE_CONFIG)
            c, d = states.fallback(directory, states.CONFIG_REFUSED, detail=str(config), module=sub_module,
                                   name=packconfig.pack_name(path, pack_dir), unlike=UNREADABLE_CONFIG)
        else:
            c, d = serve_config(config, config.directory, sub_module, refusal, hm)
        if not isinstance(config, packconfig.PackConfigError):
            loaded.append(config)
        classes.update(c)
        display.update(d)
    tell_local(pack_dir, loaded)
    return classes, display


def tell_local(pack_dir, configs):
    """One log line when the pack's ``[local]`` packages (comfy-env 0.0.x's,
    for ComfyUI's own Python) are missing from it, naming the command that
    installs them: only ``bulkhead install`` installs into ComfyUI's Python,
    never its start."""
    from ..envs import build as envs  # lazy: ComfyUI start
    if any(c.local for c in configs):
        line = envs.local_missing_line(pack_dir, configs)
        if line:
            log.warning("%s", line)


def load_config(path, pack_dir):
    """The PackConfig at ``path`` (its warnings logged), or the
    PackConfigError that refuses it: a refused config costs only the
    nodes it governs their isolation."""
    try:
        return packconfig.load(path, root=pack_dir)
    except packconfig.PackConfigError as e:
        return e


BUILD_AT_START = spec.BUILD_AT_START
# How long build_at_start waits for another install of the same
# environment (a `bulkhead install` running, or stuck) before the pack is
# reported not built: an import is never held by a lock for long.  A
# background build waits as long as it takes (its phase says it waits).
START_LOCK_WAIT_S = 30.0


def build_at_start(config, st):
    """A config whose environment is missing (a pack just installed by
    ComfyUI-Manager or ``git clone``: its install.py ran comfy-env, or
    nothing) is built now, as ``bulkhead install`` would, its progress in
    the log: where the pack's import is the only chance to serve it (a
    script; in ComfyUI's server ``_build_in_background`` builds it
    instead, and every other environment that is not ready too:
    ``_builds_at_start``).  So is one that
    is stale only because the host changed (ComfyUI upgraded, its torch
    or requirements moved: ``host_changed``), which nothing of the pack's
    would otherwise bring back; a worker of another ComfyUI running on the old one is told by
    its SUPERSEDED note and starts its next generation in the new one.
    Returns the EnvStatus after it, or ``st`` with the build's error in its
    reason.  ``BULKHEAD_BUILD_AT_START=0`` leaves it to ``bulkhead
    install``; an environment stale because its config changed
    (``_serve_while_rebuilding``), or refused, is never rebuilt here, nor is one whose build failed before while
    nothing it depends on changed (``envs.failed_before``): a failure costs
    one start, not every start."""
    rebuild = st.state == "stale" and st.host_changed
    if not (st.state == "missing" or rebuild) or \
            os.environ.get(BUILD_AT_START, "1").lower() in ("0", "off", "no", "false"):
        return st
    from ..envs import build as envs  # lazy: ComfyUI start
    before = envs.failed_before(config)
    if before is not None:
        # Not paid again at every start: only a change to the config, the
        # host's matched set or bulkhead, or `bulkhead install`, tries again.
        return dataclasses.replace(st, reason=(
            f"{st.reason}; its build failed at {before.get('created', '?')} ({before.get('error', '?')}) and "
            f"is not retried at start until its config, the host's packages or bulkhead change; "
            f"`bulkhead install {config.root}` retries it now"))
    # One short line (the paths are the next lines' and `bulkhead status`'s)
    if rebuild:
        log.info("bulkhead: pack %r: its environment is stale because the host changed (%s); rebuilding it "
                 "now, as `bulkhead install` would (%s=0 leaves it to that command)",
                 config.name, states.short(st.reason.split("; run `")[0], 60), BUILD_AT_START)
    else:
        log.info("bulkhead: pack %r: its environment is not built; building it now, as `bulkhead install` "
                 "would (%s=0 leaves it to that command)", config.name, BUILD_AT_START)
    t0 = time.monotonic()
    try:
        # one short line per phase, as a background build's; pip's output in the build's log file
        after = envs.build(config, progress=LogProgress(config.name), lock_timeout_s=START_LOCK_WAIT_S)
    except (envs.EnvBuildError, PackConfigError, OSError) as e:
        # one line (#36): the whole output is in the build's log file, which it names
        log.warning("bulkhead: pack %r: building its environment failed: %s", config.name,
                    envs.brief(e, limit=states.LINE_MAX - 53 - len(config.name)))
        return dataclasses.replace(st, reason=f"{st.reason}; building it at start failed: {envs.first_line(e)}")
    log.info("bulkhead: pack %r: environment built in %.1f s (%s)", config.name, time.monotonic() - t0,
             after.env_dir)
    return after


def _load(config, pack_dir, python, stamp, module, hm):
    """load_pack for one config's environment, with its [bulkhead] options
    and [env_vars]."""
    env, opts = _worker_args(config, python, stamp, module)
    return nodes.load_pack(pack_dir, python, name=config.name, env=env, options=opts, memory=hm)


def _worker_args(config, python, stamp, module):
    """(env, options) of load_pack for one config's environment."""
    o = config.options
    # One record of the pack's settings (channel/spec.py): what the pack
    # gave, 0 included, else each row's default (None where the reader
    # has its own rule: idle_exit_s's host-wide variable, Worker's own
    # call and release deadlines); PackRuntime takes it as it is, and the
    # HostMemory it stands in and is drained by (hm) beside it.
    opts = spec.settings(o)
    opts["module"] = module
    if stamp:
        opts["stamp"] = stamp
    from ..envs import conda  # lazy: ComfyUI start (only conda packages need it)
    env = conda.worker_env(os.path.dirname(os.path.dirname(python)))
    env.update(config.env_vars)
    ser = serializer_files(config.root)
    if ser:
        env[spec.SERIALIZERS] = spec.to_env(spec.SERIALIZERS, ser)
    # the pack's own value wins over a host-wide variable the worker would inherit, and over its
    # [env_vars]: a 0 ("never") too, which `if o.get(...)` dropped before
    env.update(spec.worker_env(opts))
    return env, opts


def describe_ahead(config):
    """What ``bulkhead install`` does once config's environment is built:
    the node metadata cache (host/metadata.py) filled as ComfyUI's next
    start reads it (the same key: the pack's directory and module, the
    environment and its stamp, the sources, the ComfyUI), its nodes
    described in a worker now, so that start registers them from the cache
    and starts no worker to describe them.  Returns one line for the
    user.  Only where the start's key can be told: a pack served by
    ``comfy_pack`` (its ``__init__.py`` calls it with no module) or by
    comfy-env's ``register_nodes()`` (``_served_as``), in a ComfyUI's
    custom_nodes/ (or $COMFYUI_PATH), and a description with no type
    strings of the pack's own (those are compared with the type names of
    the nodes ComfyUI has registered at start, which this process has
    not)."""
    from ..envs import build as envs  # lazy: ComfyUI start
    st = envs.env_status(config)
    root = os.path.realpath(config.root)
    comfyui = hostmatch.comfyui_for(config)
    if not st.ok or comfyui is None:
        return f"{config.name}: not described now (no ComfyUI found for it): ComfyUI's start describes its nodes"
    # the directory its folder_paths comes from, as the start's find_comfyui reads it
    fp = os.path.join(comfyui, "folder_paths.py")
    comfyui = os.path.dirname(os.path.realpath(fp)) if os.path.isfile(fp) else os.path.realpath(comfyui)
    try:
        with open(os.path.join(root, "__init__.py"), encoding="utf-8") as f:
            init = f.read()
    except OSError:
        init = ""
    served = _served_as(config, init)
    if served is None:
        return (f"{config.name}: not described now (neither a comfy_pack nor a register_nodes layout): ComfyUI's "
                "start describes its nodes")
    directory, module = served
    env, opts = _worker_args(config, st.python, f"{config.config_hash}:{st.version}", module)
    rt = PackRuntime(directory, st.python, config.name, env, opts, comfyui)
    cache = MetadataCache(opts.get("cache_dir"))
    key = rt.cache_key()
    if cache.load(directory, key) is not None:
        return f"{config.name}: its nodes were described before: ComfyUI's next start registers them from the cache"
    try:
        text = rt.describe()
    except Exception as e:
        return f"{config.name}: not described now ({_first_line(e)}): ComfyUI's start describes its nodes"
    finally:
        rt.close()
    meta = json.loads(text)
    if meta.get("types"):
        return (f"{config.name}: not described now (its own type strings are compared with ComfyUI's at start): "
                "ComfyUI's start describes its nodes")
    cache.store(directory, key, text)
    return (f"{config.name}: {len(meta.get('nodes') or {})} node(s) described: ComfyUI's next start registers them "
            "from the cache, without a worker")


def _served_as(config, init):
    """(directory, module) that ComfyUI's start serves config's nodes
    from, the pack's worker's cache key, as the pack's ``__init__.py``
    (its text, init) says: ``comfy_pack(__file__)`` serves config's
    directory, module "auto"; comfy-env's ``register_nodes()``
    (host/comfy_env.py ``_serve``) the pack's directory, module "nodes"
    for the config that governs the whole nodes/ package (nodes/'s own,
    else the pack's), else "nodes.<subdir>" for a nodes/<subdir>/ config.
    None for any other layout."""
    if "comfy_pack(" in init and "module=" not in init:
        return os.path.realpath(config.directory), "auto"
    if "register_nodes()" not in init:
        return None
    root = os.path.realpath(config.root)
    nodes_dir = os.path.join(root, "nodes")
    here = os.path.realpath(config.path)
    whole = [p for p in (os.path.join(nodes_dir, CONFIG_NAME), os.path.join(root, CONFIG_NAME)) if os.path.isfile(p)]
    if whole:
        return (root, "nodes") if os.path.realpath(whole[0]) == here else None
    sub = os.path.dirname(here)
    if os.path.dirname(sub) == nodes_dir:
        return root, "nodes." + os.path.basename(sub)
    return None


def _first_line(error):
    """An error in one line, its type's name first: a worker's import error
    carries the remote traceback on the lines after its first."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def describe_pack(pack_dir):
    """describe_ahead for each config of the pack at ``pack_dir``: one line
    each, for the user.  Never raises: a config it cannot describe is its
    line (the pack is built all the same, and ComfyUI's start describes
    its nodes).  Outside ComfyUI's process (``bulkhead install``, a pack's
    ``install.py``) the zygotes its workers came from are ended after; in
    it they are the host's, which its exit ends."""
    lines = []
    try:
        for config in packconfig.load_configs(os.path.abspath(os.fspath(pack_dir)), warn=False):
            try:
                lines.append(describe_ahead(config))
            except Exception as e:     # built all the same: ComfyUI's start describes it
                lines.append(f"{config.name}: not described now ({_first_line(e)}): ComfyUI's start "
                             "describes its nodes")
    except Exception as e:             # the configs the build just read: the same, unless changed since
        lines.append(f"{os.path.basename(os.fspath(pack_dir))}: not described now ({_first_line(e)}): "
                     "ComfyUI's start describes its nodes")
    finally:
        if "comfy.model_management" not in sys.modules:
            zygote.close_all()
    return lines


def install(pack_dir, progress=None, force=False, *, pip_args=None):
    """``bulkhead.install``, what a pack's ``install.py`` calls (and what
    ComfyUI-Manager runs, with ComfyUI's Python, when it installs or
    updates the pack)::

        import bulkhead
        bulkhead.install(os.path.dirname(os.path.abspath(__file__)))

    Builds the pack's environments (envs/build.py ``install``: its
    arguments, its return value and its errors), then, as ``bulkhead
    install <pack>`` does, describes each one's nodes into the node
    metadata cache ComfyUI's next start reads (describe_pack), so that
    start registers them without a worker.  Each describing line goes to
    ``progress`` (default: stderr); a description that fails is one such
    line, never the install's failure."""
    from ..envs import build as envs  # lazy: ComfyUI start
    statuses = envs.install(pack_dir, progress, force, pip_args=pip_args)
    for line in describe_pack(pack_dir):
        if progress is not None:
            progress(line)
        else:
            print(line, file=sys.stderr, flush=True)
    return statuses


def _load_or_fall_back(config, pack_dir, python, stamp, module, hm):
    """_load, or -- when the pack fails to import in its worker (a module
    its environment lacks) -- the in-process import a failed build gets,
    with one warning carrying the worker's last traceback line.  Where it
    cannot import in the host either, the worker's error is raised (with
    the host's): ComfyUI lists the pack as IMPORT FAILED."""
    try:
        return _load(config, pack_dir, python, stamp, module, hm)
    except PackLoadError as e:
        if getattr(e, "sandbox_refused", False):   # sandbox = "required": never in ComfyUI's process instead
            states.failed(pack_dir, config.name, str(e), module=module)
            raise
        err = e
    text = str(err)
    last = ([l.strip() for l in text.splitlines() if l.strip()] or [text])[-1]
    log.info("bulkhead: pack %r: its worker's traceback: %s", config.name, text)
    try:
        return states.fallback(pack_dir, states.WORKER_IMPORT_FAILED, detail=f" ({python}): {last}",
                               name=config.name, module=module, policy=config.options.get("fallback"),
                               unlike=host_differs(config))
    except Exception as host:
        states.failed(pack_dir, config.name, f"{last}; in ComfyUI's process too: {type(host).__name__}: {host}",
                      module=module)
        raise PackLoadError(f"{text}\n(in ComfyUI's process it fails too: {type(host).__name__}: "
                                  f"{host})") from None


def serializer_files(pack_root):
    """[[pack, serialization.py], ...] a worker of the pack at pack_root
    loads (worker/typed.py): its own when its comfy-env-root.toml declares
    custom [types], then those of the packs its [node_packs] / [node_reqs]
    name that are installed beside it and declare custom types."""
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
    from ..envs import build as envs  # lazy: ComfyUI start
    building.served(config, pack_dir, module, hm, refusal, serve_config, load_config)  # the panel's Build, Retry, Rebuild
    if refusal is not None:
        return states.fallback(pack_dir, states.CONTRACT_REFUSED, detail=refusal, name=config.name, module=module,
                               policy=config.options.get("fallback"), unlike=host_differs(config))
    st = envs.env_status(config)
    why = None
    if not st.ok and reuse is not None:
        python, why = reuse(config)
        if python:
            log.info("bulkhead: pack %r: using the environment comfy-env built (%s)", config.name, python)
            return _load_or_fall_back(config, pack_dir, python, None, module, hm)
    if not why:   # comfy-env's own environment, there but refused, is reported as it is
        if st.state == "stale" and not st.host_changed:
            old = envs.previous_env(config)
            if old is not None:
                return _serve_while_rebuilding(config, pack_dir, module, hm, st, old)
        if _builds_at_start(config, st, background=True) and in_comfyui_server():
            return _build_in_background(config, pack_dir, module, hm, st)
        st = build_at_start(config, st)
    if st.ok:
        return _load_or_fall_back(config, pack_dir, st.python, f"{config.config_hash}:{st.version}", module, hm)
    return _not_isolated(config, pack_dir, module, st, why)


def _not_isolated(config, pack_dir, module, st, why=None):
    """The fallback of a config whose environment is not usable (st):
    in-process or failed, by its policy, with the reason and the fix."""
    from ..envs import build as envs  # lazy: ComfyUI start
    reason = states.ENV_NOT_BUILT if st.state == "missing" and not why else states.STAMP_REFUSED
    detail = f"{st.state}: {st.reason}" + (f"; {why}" if why else "")
    if reason == states.ENV_NOT_BUILT and envs.failed_before(config) is not None:
        reason = states.BUILD_FAILED    # "build it" would fail the same way: the fix is what the error names
        detail = st.reason.split("; ", 1)[-1]   # the failure, not "no environment has been built for ..." first
    return states.fallback(pack_dir, reason, detail=detail, name=config.name, module=module,
                           policy=config.options.get("fallback"), unlike=host_differs(config))


# What a config refused (or not found) leaves unknown: its requirements,
# so ComfyUI's process cannot be shown to be the same as its environment.
UNREADABLE_CONFIG = "its comfy-env.toml could not be read, so what it requires is not known"


def host_differs(config):
    """None where ComfyUI's process is the same as config's environment
    would be: every requirement its config declares (its pip requirements,
    with their extras' own, its [cuda] packages, its Python) is installed
    in this process (importlib.metadata, on this sys.path) at a version
    its pins accept (packaging's specifiers, pre-releases allowed); else
    one line naming each that differs (a missing one, one at a version the
    pins refuse, a conda package, which this process cannot hold, or a
    URL requirement, whose version cannot be told).  Requirements whose
    markers do not apply here are skipped; the host's own packages (torch,
    ComfyUI's requirements: ``host_packages = "match"``) are the host's by
    definition."""
    differs = []
    want, here = config.python, "%d.%d.%d" % sys.version_info[:3]
    if want and os.path.isabs(want):
        if os.path.realpath(want) != os.path.realpath(sys.executable):
            differs.append(f"python {want} (ComfyUI runs {sys.executable}, {here})")
    elif want:
        try:
            ok = packconfig.python_admits(want, here)
        except ValueError:
            ok = False
        if not ok:
            differs.append(f"python {want} (ComfyUI runs {here})")
    seen = set()

    def check(text, extra=None):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            differs.append(f"{text} (not a requirement this check reads)")
            return
        if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
            return
        key = (canonicalize_name(req.name), str(req.specifier), tuple(sorted(req.extras)))
        if key in seen:
            return
        seen.add(key)
        if extra is not None:     # one an extra brings: without its marker, naming the extra
            text = f"{req.name}{req.specifier} (of the extra [{extra}])"
        if req.url:
            differs.append(f"{text} (from a URL: its version here cannot be told)")
            return
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            differs.append(f"{text} (not installed in ComfyUI's Python)")
            return
        try:
            ok = req.specifier.contains(Version(dist.version), prereleases=True)
        except InvalidVersion:
            ok = not str(req.specifier)
        if not ok:
            differs.append(f"{text} (ComfyUI's Python has {dist.metadata['Name'] or req.name} {dist.version})")
            return
        for e in sorted(req.extras):
            for sub in dist.requires or ():
                try:
                    r = Requirement(sub)
                except InvalidRequirement:
                    continue
                if r.marker is not None and r.marker.evaluate({"extra": e}) and \
                        not r.marker.evaluate({"extra": ""}):
                    check(sub, e)

    for text in config.requirements:
        check(text)
    for name in config.cuda:
        check(name)
    differs.extend(f"conda package {spec} (ComfyUI's process has no conda environment of the pack's)"
                   for spec in config.conda)
    return "; ".join(differs) or None


def in_comfyui_server():
    """Whether this is a ComfyUI process whose server exists (custom
    nodes load after it is made), outside a worker: there a build runs in
    the background and its nodes join ComfyUI's mappings when it ends
    (host/building.py).  Elsewhere (a script, a test) the pack's import
    is the only chance to serve it: a missing environment is built there
    and then."""
    server = getattr(getattr(sys.modules.get("server"), "PromptServer", None), "instance", None)
    return server is not None and hasattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS") and \
        not packimport.in_worker()


def _build_off():
    return os.environ.get(BUILD_AT_START, "1").lower() in ("0", "off", "no", "false")


def _builds_at_start(config, st, background=False):
    """Whether ComfyUI's start builds config's environment (st its
    status), while BULKHEAD_BUILD_AT_START is not 0 and no earlier build
    of it failed with nothing changed since (``envs.failed_before``):
    missing, or stale because the host changed; in the background (in
    ComfyUI's server, where nothing waits for it) any that is not ready
    -- also one built for another bulkhead protocol (a bulkhead update),
    one whose interpreter is gone, a broken one, or one whose config
    changed with no environment built before to serve it meanwhile --
    rather than run the pack in ComfyUI's process."""
    from ..envs import build as envs  # lazy: ComfyUI start
    if _build_off() or envs.failed_before(config) is not None:
        return False
    return not st.ok if background else st.state == "missing" or (st.state == "stale" and st.host_changed)


def _build_in_background(config, pack_dir, module, hm, st):
    """No nodes now: the pack is recorded "building" and its environment
    is built on host/building.py's pool; when the build ends the pack is
    served (described in its worker, or its fallback where the build
    failed) and its nodes are added to ComfyUI's mappings."""
    from ..envs import build as envs  # lazy: ComfyUI start
    pack_dir = os.path.realpath(pack_dir)
    what = ("not built" if st.state == "missing" else
            f"stale because the host changed ({st.reason.split('; run `')[0]})" if st.host_changed else
            f"{st.state} ({st.reason.split('; run `')[0]})")
    # One short line (the path and the command are the panel's and `bulkhead status`'s)
    log.info("bulkhead: pack %r: its environment is %s; building it in the background",
             config.name, building.short(what, 120))
    states.building(pack_dir, module, config.name, f"its environment is {what}; it builds in the background",
                    phase=f"queued (up to {building.pool_size()} builds side by side, {building.cpu_slots()} at work on the CPU, one download per index)")
    building.install_wait()

    def work(b):
        t0 = time.monotonic()
        try:
            # Not bounded by START_LOCK_WAIT_S: nothing waits on this but
            # the pack; another install of the environment is waited for.
            after = envs.build(config, progress=b.progress)
        except envs.BuildStopped:
            return      # ComfyUI is stopping
        except (envs.EnvBuildError, PackConfigError, OSError) as e:
            log.warning("bulkhead: pack %r: building its environment failed: %s", config.name,
                        envs.brief(e, limit=building.LINE_MAX - 53 - len(config.name)))
            b.error, b.fix = envs.first_line(e), states.REASONS[states.BUILD_FAILED][1].format(pack=config.root)
            failed = dataclasses.replace(st, reason=f"{st.reason}; building it at start failed: {b.error}")
            serve = lambda: _not_isolated(config, pack_dir, module, failed)  # noqa: E731
        else:
            log.info("bulkhead: pack %r: environment built in %.1f s (%s)", config.name, time.monotonic() - t0,
                     after.env_dir)
            serve = lambda: _load_or_fall_back(config, pack_dir, after.python,  # noqa: E731
                                               f"{config.config_hash}:{after.version}", module, hm)
        try:
            with states.serving():
                classes, display = serve()
        except Exception as e:
            # Neither isolated nor in ComfyUI's process (its build failed,
            # and what its nodes import is only in that environment): it
            # runs nowhere.  ComfyUI loaded the pack at start already: no
            # IMPORT FAILED of its own says so, this line does.
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            what = lines[-1] if len(lines) > 1 else f"{type(e).__name__}: {e}"
            log.error("bulkhead: pack %r: its nodes are NOT loaded, its other parts served as they are; in "
                      "ComfyUI's process: %s", config.name,
                      building.short(what, max(30, building.LINE_MAX - 110 - len(config.name))))
            states.failed(pack_dir, config.name, f"not isolated, and in ComfyUI's process: {what}", module=module)
            b.error = b.error or what
            return
        b.node_types = tuple(classes)
        added = building.register(config, classes, display)
        log.info("bulkhead: pack %r is ready: %d node type(s) added to ComfyUI's (%s)", config.name, len(added),
                 states.state_of(pack_dir, module))

    b = building.submit(config, "new", envs.env_dir(config), pack_dir, module, work)
    return building.early_nodes(b, config, pack_dir, module)  # its nodes from an earlier description, if any


def _serve_while_rebuilding(config, pack_dir, module, hm, st, old):
    """A config that changed since its environment was built (a
    ComfyUI-Manager update that bumped a pin): the environment built
    before (old, envs.previous_env) serves the pack now, isolated with its
    old requirements, while the new one is built in the background into
    its own directory; once built, the pack's worker runs there from its
    next start (a worker running on the old one meanwhile keeps it:
    envs.build's SUPERSEDED).  A failed rebuild leaves the old one
    serving, and says so in the log and the pack's state
    (``rebuild``).  Outside ComfyUI's server, where
    BULKHEAD_BUILD_AT_START=0, or where the rebuild failed before with
    nothing changed since, the old one serves and ``bulkhead install``
    builds the new one."""
    from ..envs import build as envs  # lazy: ComfyUI start
    pack_dir = os.path.realpath(pack_dir)
    before = envs.failed_before(config)
    background = not _build_off() and before is None and in_comfyui_server()
    changed = st.reason.split("; run `")[0]
    if background:
        # one short line: the paths are the panel's and `bulkhead status`'s
        log.info("bulkhead: pack %r: %s; rebuilding it in the background, the environment built before serving it "
                 "meanwhile", config.name, building.short(changed, 80))
        note = f"rebuilding into {st.env_dir} in the background; {old.env_dir} serves meanwhile"
    else:
        if before is not None:
            why = (f"its rebuild failed at {before.get('created', '?')} ({before.get('error', '?')}) and is not "
                   "retried at start until its config, the host's packages or bulkhead change")
        elif _build_off():
            why = f"{BUILD_AT_START}=0 leaves building to that command"
        else:
            why = "only ComfyUI's server rebuilds it by itself"
        log.warning("%s", states.pack_line(config.name, "is isolated with its old requirements, NOT rebuilt",
                                           f"{changed.replace(config.root + os.sep, '')}; {why}",
                                           whole="the fix: the panel's Packs, /bulkhead/status"))
        note = f"not rebuilt: {why}; {old.env_dir} serves with the old requirements; fix: `bulkhead install " \
               f"{config.root}`"
    stamp = f"{os.path.basename(old.env_dir)}:{old.version}"
    classes, display = _load_or_fall_back(config, pack_dir, old.python, stamp, module, hm)
    states.update(pack_dir, module, rebuild=note)
    rt = states.runtime_of(pack_dir, old.python)
    moved = follow_rebuild(rt.worker, config, old.python) if rt is not None else {}
    if not background:
        return classes, display

    def work(b):
        t0 = time.monotonic()
        try:
            after = envs.build(config, progress=b.progress)
        except envs.BuildStopped:
            return      # ComfyUI is stopping
        except (envs.EnvBuildError, PackConfigError, OSError) as e:
            b.error = envs.first_line(e)
            log.warning("bulkhead: pack %r: its rebuild failed: %s; the environment built before keeps serving it, "
                        "isolated with its old requirements",
                        config.name, envs.brief(e, limit=building.LINE_MAX - 130 - len(config.name)))
            states.update(pack_dir, module, rebuild=f"failed: {b.error}; {old.env_dir} keeps serving with the old "
                                                    f"requirements; fix: what the error names, then `bulkhead "
                                                    f"install {config.root}`")
            return
        moved["python"] = after.python
        log.info("bulkhead: pack %r: its new environment was built in %.1f s (%s); its worker runs there from "
                 "its next start", config.name, time.monotonic() - t0, after.env_dir)
        states.update(pack_dir, module, rebuild=f"built {after.env_dir}; the worker runs there from its next start")

    building.submit(config, "update", envs.env_dir(config), pack_dir, module, work)
    return classes, display


def follow_rebuild(worker, config, old_python):
    """Makes worker, serving config from the environment built before
    (old_python) while the new one is built, start in the new one from
    its next start once it is: where this host's background build made
    it (the caller puts its python in the returned dict, "python"), or,
    where the old one is gone (another ``bulkhead install`` built the new
    one and removed it: no process ran there), where ``env_status`` finds
    config's environment ready.  The start cannot follow the old one's
    SUPERSEDED note there, which a removed environment does not have;
    from the new one on it does (``envs.build.current_python``, the
    worker's ``resolve_python``)."""
    from ..envs import build as envs  # lazy: ComfyUI start
    moved = {}

    def resolve(python):
        if python == old_python:
            new = moved.get("python")
            if new is None and not os.access(old_python, os.X_OK):
                st = envs.env_status(config)
                new = st.python if st.ok else None
            if new:
                python = new
        return envs.current_python(python)
    worker.resolve_python = resolve
    return moved
