"""comfy-env's entry points, served by bulkhead, for the packs written for it.

Those packs say, unmodified::

    from comfy_env import register_nodes          # __init__.py
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
    from comfy_env import install; install()      # install.py
    from comfy_env import setup_env, copy_files   # prestartup_script.py

and pin the real comfy-env in their requirements.txt.  When bulkhead is in
ComfyUI, its prestartup step (the repository's ``prestartup_script.py``,
run before any pack loads) calls ``route()``: ``import comfy_env`` then
gives THIS module's surface (a meta-path finder, and any ``comfy_env``
already imported by an earlier prestartup script replaced), and each pack
that calls ``register_nodes`` logs one line saying bulkhead runs it.
``BULKHEAD_COMFY_ENV=off`` (also 0, false, no, comfy-env) hands every pack
back to the real package: route() does nothing and says so once.

``register_nodes(nodes_package="nodes")`` -- the calling pack is found from
the calling frame (its ``__file__`` and package), as comfy-env does:

* ``<pack>/nodes/comfy-env.toml``: the whole ``nodes`` package is one
  environment, run in one worker;
* else ``<pack>/comfy-env.toml`` (the old layout): the same, from that file;
* else the ``nodes`` package is imported here when it holds nodes itself,
  and otherwise each ``nodes/<subdir>/`` (with an ``__init__.py``, not
  ``_``/``.``-named) with a ``comfy-env.toml`` runs in a worker of its own,
  and each without one is imported in the host (``.nodes.<subdir>``).

An environment is bulkhead's (``bulkhead install <pack>``) or one comfy-env
built in ``~/.ce/envs/`` whose stamp fits this host (``ce_env``); neither:
the nodes are imported in the host with one warning naming the command, as
``comfy_pack`` does.  ``comfy-env-root.toml`` is read first: a malformed
one, or a ``[types]`` custom type whose ``<pack>/serialization.py`` is
missing or raises, fails the pack's import (as comfy-env) before any worker
starts.

``install()`` builds the calling pack's environments and describes their
nodes into the node metadata cache (host/pack.py ``install``, as
``bulkhead.install``), ``setup_env()`` reports them, ``copy_files`` copies as comfy-env's does,
``register_serializer`` validates and records a serializer: the host's
check of the ``serialization.py`` each worker of the pack registers from
itself (worker/typed.py), by which a custom object made in one worker
crosses to another as a value.

Every other name a comfy-env release exported (``wrap_isolated_nodes``,
``wrap_nodes``, ``load_config``, ``SubprocessWorker``, ...) is an attribute
too, served or refused by a callable that raises (host/comfy_env_legacy.py):
a pack's ``except ImportError`` around such an import must never swallow
its isolated nodes.  So are comfy-env's internal module paths packs import
from (``comfy_env.isolation.workers._ipc_shared``, ``comfy_env.workers``,
...: ``legacy.SUBMODULES``); ``comfy_env.isolation.*`` and
``comfy_env.workers.*`` are bulkhead's even where the real comfy-env is
installed, since their code would run comfy-env's isolation beside
bulkhead's.  The user's old switches (``COMFY_ENV_ISOLATE=0``,
``USE_COMFY_ENV=0``: the packs run in ComfyUI's process;
``COMFY_ENV_AUTO_INSTALL``) are read as those releases read them, and
said once.
"""

import glob
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import traceback
from importlib.metadata import version
from pathlib import Path

from ..channel.spec import COMFY_ENV
from ..envs import config as packconfig, rootconfig
from ..envs.config import PackConfigError
from . import comfy_env_legacy as legacy, states

log = logging.getLogger("bulkhead")

SWITCH = COMFY_ENV
_OFF = ("off", "0", "false", "no", "comfy-env")
PUBLIC = ("register_nodes", "install", "setup_env", "copy_files", "register_serializer")
OLDER = ("wrap_isolated_nodes", "wrap_nodes", "enable_isolation")     # served here too, not in __all__

_lock = threading.Lock()
_announced = set()
SERIALIZERS = {}       # wire tag -> {"type_name", "serialize", "deserialize", "pack", "where"}
real_module = None     # the real comfy_env route() displaced, if any


def enabled():
    return os.environ.get(SWITCH, "on").strip().lower() not in _OFF


# --- routing `import comfy_env` ---

class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "comfy-env's public entry points, served by bulkhead (bulkhead.host.comfy_env)."
        for n in legacy.NAMES:      # every release's names: served, or refused when called
            setattr(module, n, _value(n))
        module.__all__ = list(PUBLIC)
        legacy.switch_notes()
        module.__bulkhead__ = True
        try:
            module.__version__ = version("comfy-env")
        except Exception:
            module.__version__ = "0.4.46"


def _real_locations():
    """Where the real comfy-env package's submodules are, when it is
    installed ([] when not)."""
    others = [f for f in sys.meta_path if not isinstance(f, Finder) and
              getattr(f, "__name__", "") != "BulkheadComfyEnvFinder"]
    for f in others:
        find = getattr(f, "find_spec", None)
        try:
            spec = find("comfy_env", None) if find is not None else None
        except Exception:
            spec = None
        if spec is not None and spec.submodule_search_locations:
            return list(spec.submodule_search_locations)
    return []


class _NoSubmodule(importlib.abc.Loader):
    def __init__(self, fullname, ours=False):
        self.fullname = fullname
        self.ours = ours

    def create_module(self, spec):
        if self.ours:
            raise ModuleNotFoundError(
                f"No module named {self.fullname!r} under bulkhead: it is comfy-env's own isolation machinery, "
                f"which bulkhead replaces (it runs the pack's nodes in its own workers); of comfy_env's "
                f"internal modules it serves {', '.join(sorted(legacy.SUBMODULES))}. Import the public names "
                f"(`from comfy_env import register_nodes, register_serializer`), or set {SWITCH}=off to hand "
                "comfy_env back to the real package", name=self.fullname)
        raise ModuleNotFoundError(
            f"No module named {self.fullname!r}: bulkhead serves comfy_env's public entry points "
            f"({', '.join(PUBLIC)}, and every older release's names) and the internal modules "
            f"{', '.join(sorted(legacy.SUBMODULES))}; the real comfy-env package, whose submodule this is, "
            f"is not installed; install it, or set {SWITCH}=off to hand comfy_env back to it", name=self.fullname)

    def exec_module(self, module):
        pass


def _value(name):
    """What ``comfy_env.<name>`` is under bulkhead."""
    return globals()[name] if name in PUBLIC or name in OLDER else legacy.value(name)


class _SubLoader(importlib.abc.Loader):
    """One of comfy-env's internal modules (legacy.SUBMODULES), holding
    bulkhead's values of the names that lived there."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        names = legacy.SUBMODULES[module.__name__]
        module.__doc__ = f"comfy-env's {module.__name__}, served by bulkhead: {', '.join(names)}."
        module.__bulkhead__ = True
        for n in names:
            setattr(module, n, _value(n))
        module.__all__ = list(names)


class Finder(importlib.abc.MetaPathFinder):
    """Answers ``import comfy_env`` with bulkhead's surface while enabled().
    Its submodules (``comfy_env.config``, ...) are the real package's where
    it is installed (the routed module's ``__path__`` is the real one's),
    and an error naming the switch where it is not."""

    def find_spec(self, fullname, path=None, target=None):
        if not enabled():
            return None
        if fullname == "comfy_env":
            spec = importlib.machinery.ModuleSpec("comfy_env", _Loader(), origin=__file__, is_package=True)
            spec.submodule_search_locations = _real_locations()
            return spec
        if not fullname.startswith("comfy_env.") or not getattr(sys.modules.get("comfy_env"), "__bulkhead__", False):
            return None
        real = bool(list(getattr(sys.modules["comfy_env"], "__path__", None) or ()))
        ours = legacy.always_ours(fullname)
        if fullname in legacy.SUBMODULES and (ours or not real):
            spec = importlib.machinery.ModuleSpec(fullname, _SubLoader(), origin=legacy.__file__, is_package=True)
            spec.submodule_search_locations = []     # its children: this finder's, or none
            return spec
        if ours or not real:
            return importlib.machinery.ModuleSpec(fullname, _NoSubmodule(fullname, ours))
        return None


def route():
    """Routes ``import comfy_env`` to bulkhead (ComfyUI's prestartup calls
    this).  Returns True when routed; False when the switch is off."""
    global real_module
    if not enabled():
        log.info("bulkhead: %s=%s: packs written for comfy-env run under the real comfy-env package",
                 SWITCH, os.environ.get(SWITCH))
        return False
    legacy.switch_notes()
    with _lock:
        if not any(isinstance(f, Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, Finder())
        cur = sys.modules.get("comfy_env")
        if cur is not None and not getattr(cur, "__bulkhead__", False):
            real_module = cur
            for k in [k for k in sys.modules if k == "comfy_env" or k.startswith("comfy_env.")]:
                if k == "comfy_env" or legacy.always_ours(k):     # its isolation modules: bulkhead's from now
                    del sys.modules[k]
        if "comfy_env" not in sys.modules:
            importlib.import_module("comfy_env")
    return True


def _real_version():
    try:
        return version("comfy-env")
    except Exception:
        return None


def announce(pack_dir, what):
    """Logs once per pack that bulkhead serves its comfy_env call."""
    with _lock:
        if pack_dir in _announced:
            return
        _announced.add(pack_dir)
    real = _real_version()
    log.warning("bulkhead: pack %r: comfy_env.%s is served by bulkhead%s (%s=off hands it back)",
                os.path.basename(pack_dir), what,
                f", not the installed comfy-env {real}" if real else "", SWITCH)


def _caller(depth=2):
    f = sys._getframe(depth)
    file = f.f_globals.get("__file__")
    if not file:
        raise RuntimeError("comfy_env entry point called from code with no __file__: cannot find the pack")
    return os.path.dirname(os.path.abspath(file)), f.f_globals.get("__name__")


# --- comfy-env's own environments: ~/.ce/envs/<name>_<abi tag>/ ---

def ce_root():
    o = os.environ.get("COMFY_ENV_ROOT")
    return os.path.abspath(os.path.expanduser(o)) if o else os.path.join(os.path.expanduser("~"), ".ce")


def _sanitize(s):
    s = re.sub(r"[^a-z0-9-]+", "-", s.lower())
    return re.sub(r"-+", "-", s).strip("-")


def ce_env_name(pack_dir, config_path):
    """comfy-env's logical env name: the pack folder less a ComfyUI- prefix,
    then -<subdir> for a config below the pack, sanitised to [a-z0-9-]."""
    part = os.path.basename(os.path.normpath(pack_dir))
    for p in ("ComfyUI-", "ComfyUI_", "comfyui-", "comfyui_"):
        if part.startswith(p):
            part = part[len(p):]
            break
    name = _sanitize(part)
    d = os.path.dirname(os.path.abspath(config_path))
    if os.path.realpath(d) != os.path.realpath(pack_dir):
        suffix = _sanitize(os.path.basename(d))
        if suffix:
            name = f"{name}-{suffix}" if name else suffix
    return name


def ce_abi_tag():
    """The ABI tag comfy-env names an env directory with, for this host:
    py<XY>-torch<major.minor>-<cuXYZ|rocmX|cpu|...> (notorch without torch)."""
    parts = ["py%d%d" % sys.version_info[:2]]
    try:
        tv = str(version("torch"))
    except Exception:
        tv = None
    if not tv:
        return parts[0] + "-notorch"
    base, _, local = tv.partition("+")
    parts.append("torch" + ".".join(base.split(".")[:2]))
    if local.startswith("cu") and len(local) >= 4:
        d = local[2:]
        parts.append("cu" + d[:-1] + d[-1])
    elif local.startswith("rocm"):
        parts.append("rocm" + local[4:].replace(".", ""))
    elif local.startswith("xpu"):
        parts.append("xpu")
    else:
        parts.append("mps" if sys.platform == "darwin" else "cpu")
    return "-".join(parts)


def ce_env(config):
    """(python, None) for an environment comfy-env built for config that
    this host may use as is; (None, why + the rebuild commands) for one
    that is there but stale; (None, None) when there is none."""
    name = ce_env_name(config.root, config.path)
    tag = ce_abi_tag()
    envs_dir = os.path.join(ce_root(), "envs")
    cands = [f"{name}_{tag}", f"{name}-{tag}", f"{name}-{_sanitize(tag)}"]
    found = [os.path.join(envs_dir, c) for c in cands if os.path.isdir(os.path.join(envs_dir, c))]
    others = sorted(glob.glob(os.path.join(envs_dir, f"{name}[_-]py*")))
    fix = (f"rebuild it: `comfy-env install --dir {shlex.quote(config.root)}`, or build bulkhead's own: "
           f"`bulkhead install {shlex.quote(config.root)}`")
    if not found:
        if others:
            return None, (f"comfy-env's environment {others[0]} was built for another stack "
                          f"(this host is {tag}); {fix}")
        return None, None
    d = found[0]
    stamp_path = os.path.join(d, "env.stamp.json")
    py = os.path.join(d, ".pixi", "envs", "default", "bin", "python")
    try:
        with open(stamp_path, encoding="utf-8") as f:
            stamp = json.load(f)
        if not isinstance(stamp, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        return None, f"comfy-env's environment {d} has no readable env.stamp.json ({e}); {fix}"
    if stamp.get("abi_tag") != tag:
        return None, (f"comfy-env's environment {d} was built for {stamp.get('abi_tag')}, this host is "
                      f"{tag}; {fix}")
    rel = os.path.relpath(config.path, config.root).replace(os.sep, "/")
    src = stamp.get("source")
    if src and src != f"{os.path.basename(os.path.normpath(config.root))}/{rel}":
        return None, f"comfy-env's environment {d} was built from {src}, not this pack's {rel}; {fix}"
    try:
        if os.path.getmtime(config.path) > os.path.getmtime(stamp_path):
            return None, f"{config.path} changed after comfy-env built {d}; {fix}"
    except OSError:
        pass
    if not os.access(py, os.X_OK):
        return None, f"comfy-env's environment {d} has no interpreter at {py}; {fix}"
    try:
        v = subprocess.run([py, "-I", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                           timeout=30, check=True).stdout.strip()
    except Exception as e:
        return None, f"comfy-env's interpreter {py} does not run ({e}); {fix}"
    if config.python and not packconfig.python_admits(config.python if packconfig.is_specifier(config.python)
                                                      else ".".join(config.python.split(".")[:2]), v):
        return None, f"comfy-env's environment {d} runs Python {v}, the config asks for {config.python}; {fix}"
    return py, None


# --- register_serializer and [types] ---

def register_serializer(type_name, serialize, deserialize=None, tag=None):
    """Records a serializer for a custom type (comfy-env's signature).  The
    values cross between workers by the copy each worker registers from the
    same serialization.py (worker/typed.py); this record is the host's
    check of the file."""
    if not isinstance(type_name, str) or not type_name:
        raise TypeError(f"register_serializer: type_name must be a class name (a str), not {type_name!r}")
    if not callable(serialize):
        raise TypeError(f"register_serializer({type_name!r}): serialize must be callable, not {serialize!r}")
    if deserialize is not None and not callable(deserialize):
        raise TypeError(f"register_serializer({type_name!r}): deserialize must be callable or None")
    f = sys._getframe(1)
    SERIALIZERS[tag or type_name] = {"type_name": type_name, "serialize": serialize,
                                     "deserialize": deserialize,
                                     "where": f"{f.f_code.co_filename}:{f.f_lineno}"}


def _load_serializers(pack_dir, root):
    custom = sorted(k for k, v in root.types.items() if v == "custom")
    if not custom:
        return
    path = os.path.join(pack_dir, "serialization.py")
    if not os.path.isfile(path):
        raise PackConfigError(root.path, f"[types] declares custom type(s) {', '.join(custom)} but {path} "
                                         "does not exist", key="types")
    name = "_bulkhead_serialization_" + os.path.basename(pack_dir).replace(".", "_").replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    before = len(SERIALIZERS)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        tb = [t for t in traceback.extract_tb(e.__traceback__) if t.filename == path]
        raise PackConfigError(path, f"failed while registering its serializers: {type(e).__name__}: {e}",
                              tb[-1].lineno if tb else None) from e
    if len(SERIALIZERS) == before and not any(v["where"].startswith(path + ":") for v in SERIALIZERS.values()):
        raise PackConfigError(path, f"[types] declares custom type(s) {', '.join(custom)} but serialization.py "
                                    "never calls register_serializer()")


# --- register_nodes ---

def _host_import(pkg_name, module):
    mod = importlib.import_module(f".{module}", package=pkg_name) if pkg_name else importlib.import_module(module)
    return dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}), \
        dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {})


def register_nodes(nodes_package="nodes"):
    """(NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS) for the calling
    pack, its isolated nodes proxied through bulkhead workers."""
    pack_dir, pkg_name = _caller()
    return serve(pack_dir, pkg_name, nodes_package)


def serve(pack_dir, pkg_name, nodes_package="nodes"):
    """register_nodes for an explicit pack directory and package name."""
    with states.serving():
        return _serve(pack_dir, pkg_name, nodes_package)


def _serve(pack_dir, pkg_name, nodes_package):
    from . import pack as hpack  # lazy: prestartup (host.pack, its nodes and runtime: loaded with the first pack)
    announce(pack_dir, "register_nodes")
    try:
        root = rootconfig.load_root(pack_dir)
    except packconfig.PackConfigError:
        if legacy.off_switch() is None:
            raise
        root = None         # the user's switch runs the pack in-process: its root file is not needed
    # [settings] isolate in the root file (comfy-env 0.2.40-0.4.24) decides
    # for this pack, before the user's switch, as comfy-env's resolve_bool did.
    if legacy.pack_in_process(pack_dir, root):
        return _serve_in_process(pack_dir, pkg_name, nodes_package, root)
    if root is not None:
        _load_serializers(pack_dir, root)
    nodes_dir = os.path.join(pack_dir, nodes_package)
    if not os.path.isdir(nodes_dir):
        log.warning("bulkhead: pack %r has no %s/ directory: no nodes", os.path.basename(pack_dir), nodes_package)
        return {}, {}
    whole = [p for p in (os.path.join(nodes_dir, packconfig.CONFIG_NAME), os.path.join(pack_dir, packconfig.CONFIG_NAME))
             if os.path.isfile(p)]
    refusal = hpack.contract_refusal()
    hm = hpack.host_memory() if refusal is None else None
    classes, display = {}, {}

    def isolated(config_path, module):
        config = hpack.load_config(config_path, pack_dir)
        if isinstance(config, packconfig.PackConfigError):     # only the nodes it governs run in-process
            c, d = states.fallback(pack_dir, states.CONFIG_REFUSED, detail=str(config), module=module,
                                   name=packconfig.pack_name(config_path, pack_dir), unlike=hpack.UNREADABLE_CONFIG)
        else:
            c, d = hpack.serve_config(config, pack_dir, module, refusal, hm, reuse=ce_env)
        classes.update(c)
        display.update(d)

    if whole:
        try:
            isolated(whole[0], nodes_package)
        except Exception as e:      # nothing else of the pack to load: ComfyUI's IMPORT FAILED, and its state
            _lost_subdir(pack_dir, packconfig.pack_name(whole[0], pack_dir), nodes_package, e, others=False)
            raise
        return classes, display
    if os.path.isfile(os.path.join(nodes_dir, "__init__.py")):
        c, d = _host_import(pkg_name, nodes_package)
        if c:
            return c, d
    lost = []
    for sub in sorted(os.listdir(nodes_dir)):
        sd = os.path.join(nodes_dir, sub)
        if sub.startswith((".", "_")) or not os.path.isfile(os.path.join(sd, "__init__.py")):
            continue
        cfg = os.path.join(sd, packconfig.CONFIG_NAME)
        if os.path.isfile(cfg):
            try:
                isolated(cfg, f"{nodes_package}.{sub}")
            except Exception as e:
                # Neither isolated nor in ComfyUI's process (a blender/
                # subdirectory whose environment could not be built, and
                # `bpy` is only there): its own nodes are lost, not the pack.
                lost.append((sub, e))
                _lost_subdir(pack_dir, packconfig.pack_name(cfg, pack_dir), f"{nodes_package}.{sub}", e)
        else:
            c, d = _host_import(pkg_name, f"{nodes_package}.{sub}")
            classes.update(c)
            display.update(d)
    if lost and not classes:
        raise lost[0][1]        # nothing of the pack loads: ComfyUI's IMPORT FAILED, with the first error
    return classes, display


def _serve_in_process(pack_dir, pkg_name, nodes_package, root=None):
    """register_nodes under the user's comfy-env off-switch
    (legacy.off_switch) or the pack's ``[settings] isolate = false``
    (root): as comfy-env then did, ``nodes/`` imported here when it holds
    nodes, else each ``nodes/<subdir>/``, configs or not."""
    nodes_dir = os.path.join(pack_dir, nodes_package)
    classes, display = {}, {}
    if os.path.isdir(nodes_dir):
        if os.path.isfile(os.path.join(nodes_dir, "__init__.py")):
            classes, display = _host_import(pkg_name, nodes_package)
        if not classes:
            for sub in sorted(os.listdir(nodes_dir)):
                sd = os.path.join(nodes_dir, sub)
                if sub.startswith((".", "_")) or not os.path.isfile(os.path.join(sd, "__init__.py")):
                    continue
                c, d = _host_import(pkg_name, f"{nodes_package}.{sub}")
                classes.update(c)
                display.update(d)
    legacy.in_process(classes, pack_dir, nodes_package, root)
    return classes, display


def _lost_subdir(pack_dir, name, module, error, others=True):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    what = lines[-1] if len(lines) > 1 else f"{type(error).__name__}: {error}"
    log.error("%s", states.pack_line(name, "is NOT loaded, in ComfyUI's process neither", what))
    states.failed(pack_dir, name, f"not isolated (why: the line before), and in ComfyUI's process: {what}; " +
                  ("the pack's other nodes load" if others else "ComfyUI lists the pack as IMPORT FAILED"),
                  module=module)


# --- the older ways to isolate a pack's nodes (comfy-env 0.0.x-0.2.18) ---

def _caller_dir(depth):
    f = sys._getframe(depth + 1)
    file = f.f_globals.get("__file__")
    if not file:
        raise RuntimeError("comfy_env entry point called from code with no __file__: cannot find the pack")
    return os.path.dirname(os.path.abspath(file)), f.f_globals


def _module_for(directory, pack_dir):
    """The dotted module of directory below pack_dir ("nodes.isolated"),
    'auto' for the pack directory itself."""
    rel = os.path.relpath(directory, pack_dir)
    if rel in (".", ""):
        return "auto"
    return rel.replace(os.sep, ".")


def _replace(mapping, served):
    """Puts the served proxies in place of mapping's classes, by key (then
    by class name): what comfy-env did to the classes in place, here to
    the mapping the pack hands ComfyUI.  Returns how many were replaced."""
    # Only bulkhead's proxies (they carry the pack's name): where the
    # environment could not run, serve_config's fallback returns the
    # pack's own classes, already imported.
    served = {k: v for k, v in served.items() if "_bulkhead_pack" in vars(v)}
    by_name = {}
    for k, v in served.items():
        by_name.setdefault(v.__name__, v)
    n = 0
    for key, cls in list(mapping.items()):
        proxy = served.get(key) or by_name.get(getattr(cls, "__name__", None))
        if proxy is not None and proxy is not cls:
            mapping[key] = proxy
            n += 1
    return n


def _serve_dir(mapping, directory, pack_dir, what):
    """Serves the comfy-env.toml in directory for the classes of mapping
    (imported by the pack from that directory's package) and puts the
    proxies in mapping's place.  In-process (the pack's own classes kept)
    with one warning where the environment cannot run, as register_nodes;
    mapping emptied while the environment builds in the background."""
    from . import pack as hpack  # lazy: prestartup (host.pack, its nodes and runtime: loaded with the first pack)
    pack_dir = os.path.realpath(pack_dir)
    directory = os.path.realpath(directory)
    module = _module_for(directory, pack_dir)
    config_path = os.path.join(directory, legacy.CONFIG_FILE_NAME)
    if not os.path.isfile(config_path):
        log.warning("bulkhead: pack %r: %d node(s) run in ComfyUI's process, as comfy-env ran them: no "
                    "comfy-env.toml in %s. Fix: put theirs there, then `bulkhead install`", os.path.basename(pack_dir),
                    len(mapping), os.path.relpath(directory, pack_dir))
        return 0
    config = hpack.load_config(config_path, pack_dir)
    if isinstance(config, packconfig.PackConfigError):
        log.warning("%s", states.pack_line(packconfig.pack_name(config_path, pack_dir), "runs in-process, NOT isolated",
                                           f"its comfy-env.toml is invalid: {config}"))
        states.set_state(pack_dir, module, name=packconfig.pack_name(config_path, pack_dir), state="in-process",
                         reason=f"its comfy-env.toml is invalid: {config}", fix=f"`bulkhead install {pack_dir}`")
        return 0
    refusal = hpack.contract_refusal()
    hm = hpack.host_memory() if refusal is None else None
    with states.serving():
        classes, _display = hpack.serve_config(config, pack_dir, module, refusal, hm, reuse=ce_env)
    if not classes:
        # No nodes now: the environment builds in the background (ComfyUI's
        # server) and the nodes join ComfyUI's mappings when it ends,
        # isolated or by their fallback; the pack's own classes, left under
        # the same names, would keep them out.
        mapping.clear()
        return 0
    return _replace(mapping, classes)


def wrap_isolated_nodes(node_class_mappings, nodes_dir):
    """comfy-env 0.1.x-0.2.18: the nodes of node_class_mappings, imported
    from nodes_dir (which holds their comfy-env.toml), run isolated.  The
    mapping is returned with bulkhead's proxies in place of those classes
    (changed in place too, as comfy-env changed the classes in place)."""
    pack_dir, _ = _caller_dir(1)
    announce(pack_dir, "wrap_isolated_nodes")
    if legacy.off_switch() is not None:
        module = _module_for(os.path.realpath(os.fspath(nodes_dir)), os.path.realpath(pack_dir))
        return legacy.in_process(node_class_mappings, pack_dir, module)
    _serve_dir(node_class_mappings, os.fspath(nodes_dir), pack_dir, "wrap_isolated_nodes")
    return node_class_mappings


def _by_source(mapping, pack_dir, what):
    """Each comfy-env.toml below pack_dir serves the classes of mapping
    whose source file lies under its directory (comfy-env's rule)."""
    pack_dir = os.path.realpath(pack_dir)
    dirs = []
    for d, subdirs, files in os.walk(pack_dir):
        subdirs[:] = sorted(s for s in subdirs if not s.startswith((".", "_env", "__pycache__")))
        if legacy.CONFIG_FILE_NAME in files:
            dirs.append(d)
    dirs.sort(key=len, reverse=True)    # the deepest config governs its files
    groups = {}
    for key, cls in mapping.items():
        if not hasattr(cls, "FUNCTION"):
            continue
        try:
            src = os.path.realpath(inspect.getfile(cls))
        except (TypeError, OSError):
            continue
        for d in dirs:
            if src.startswith(d + os.sep):
                groups.setdefault(d, {})[key] = cls
                break
    if not dirs:
        log.warning("bulkhead: pack %r: its nodes run in ComfyUI's process, as comfy-env ran them: comfy_env.%s() "
                    "found no comfy-env.toml. Fix: add theirs, then `bulkhead install`", os.path.basename(pack_dir),
                    what)
    for d, group in groups.items():
        keys = set(group)
        _serve_dir(group, d, pack_dir, what)
        for key in keys - set(group):       # building: they come when it ends
            del mapping[key]
        mapping.update(group)


def wrap_nodes():
    """comfy-env 0.1.x-0.2.18: the calling module's NODE_CLASS_MAPPINGS,
    changed in place: each class defined under a directory with a
    comfy-env.toml runs isolated in that environment.  Returns None."""
    pack_dir, g = _caller_dir(1)
    mapping = g.get("NODE_CLASS_MAPPINGS")
    announce(pack_dir, "wrap_nodes")
    if not isinstance(mapping, dict) or not mapping:
        log.warning("bulkhead: pack %r: comfy_env.wrap_nodes() found no NODE_CLASS_MAPPINGS in %s: call it after "
                    "NODE_CLASS_MAPPINGS is defined", os.path.basename(pack_dir), g.get("__file__"))
        return None
    if legacy.off_switch() is not None:
        legacy.in_process(mapping, pack_dir, "auto")
        return None
    _by_source(mapping, pack_dir, "wrap_nodes")
    return None


def enable_isolation(node_class_mappings):
    """comfy-env 0.0.x: every node of node_class_mappings runs isolated in
    the environment of the calling pack's comfy-env.toml (changed in
    place).  Returns None."""
    pack_dir, _ = _caller_dir(1)
    announce(pack_dir, "enable_isolation")
    if legacy.off_switch() is not None:
        legacy.in_process(node_class_mappings, pack_dir, "auto")
        return None
    _by_source(node_class_mappings, pack_dir, "enable_isolation")
    return None


# --- install, setup_env, copy_files ---

def install(config=None, node_dir=None, log_callback=None, dry_run=False):
    """Builds the calling pack's environments with bulkhead (comfy-env's
    signature; ``config`` is not used: every config of the pack is built),
    then describes their nodes into the node metadata cache ComfyUI's next
    start reads, as ``bulkhead.install`` does (host/pack.py ``install``)."""
    from ..envs import build as envs  # lazy: ComfyUI start
    from . import pack as hpack  # lazy: prestartup (host.pack, its nodes and runtime: loaded with the first pack)
    pack_dir = os.path.abspath(os.fspath(node_dir)) if node_dir else _caller()[0]
    announce(pack_dir, "install")
    if dry_run:
        for c in packconfig.load_configs(pack_dir):
            (log_callback or print)(str(envs.env_status(c)))
        return True
    hpack.install(pack_dir, progress=log_callback)
    return True


def setup_env(node_dir=None):
    """Prestartup: reports where each of the calling pack's environments
    stands (bulkhead's, or comfy-env's reused)."""
    from ..envs import build as envs  # lazy: ComfyUI start
    pack_dir = os.path.abspath(os.fspath(node_dir)) if node_dir else _caller()[0]
    try:
        configs = packconfig.load_configs(pack_dir, warn=False)
    except packconfig.PackConfigError as e:
        log.warning("bulkhead: %s", e)
        return
    for c in configs:
        st = envs.env_status(c)
        if st.ok:
            log.info("bulkhead: %s: ready (%s)", c.name, st.python)
            continue
        py, why = ce_env(c)
        if py:
            log.info("bulkhead: %s: comfy-env's environment, reused (%s)", c.name, py)
        else:
            log.warning("%s", states.pack_line(c.name, f"environment {st.state}",
                                               f"{st.reason}; {why}" if why else st.reason))


def copy_files(src, dst, pattern="*", overwrite=False):
    """Copies files matching pattern from src to dst (relative paths from
    the calling script's directory; a dst starting input/, output/, temp/
    or user/ in ComfyUI's directory of that kind).  Returns the count."""
    caller = Path(_caller()[0])

    def rel(p):
        p = Path(p)
        return p if p.is_absolute() else caller / p

    dst_path = None
    if isinstance(dst, str) and not os.path.isabs(dst):
        head, _, rest = dst.replace("\\", "/").partition("/")
        getter = {"input": "get_input_directory", "output": "get_output_directory",
                  "temp": "get_temp_directory", "user": "get_user_directory"}.get(head)
        if getter:
            try:
                import folder_paths  # comfyui: folder_paths
                base = Path(getattr(folder_paths, getter)())
                dst_path = base / rest if rest else base
            except Exception:
                dst_path = None
    dst_path = dst_path if dst_path is not None else rel(dst)
    src_path = rel(src)
    if not src_path.exists():
        return 0
    dst_path.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in src_path.glob(pattern):
        if f.is_file():
            t = dst_path / f.relative_to(src_path)
            t.parent.mkdir(parents=True, exist_ok=True)
            if overwrite or not t.exists():
                shutil.copy2(f, t)
                n += 1
    return n
