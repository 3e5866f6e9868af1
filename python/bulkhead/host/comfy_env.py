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

``install()`` builds the calling pack's environments (envs.build.install),
``setup_env()`` reports them, ``copy_files`` copies as comfy-env's does,
``register_serializer`` validates and records a serializer: the typed-value
transport that will use the record is not built yet (until then a custom
object made in a worker stays a handle there).
"""

import glob
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import shlex
import shutil
import sys
import threading
import traceback

log = logging.getLogger("bulkhead")

SWITCH = "BULKHEAD_COMFY_ENV"
_OFF = ("off", "0", "false", "no", "comfy-env")
PUBLIC = ("register_nodes", "install", "setup_env", "copy_files", "register_serializer")

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
        for n in PUBLIC:
            setattr(module, n, globals()[n])
        module.__all__ = list(PUBLIC)
        module.__bulkhead__ = True
        try:
            from importlib.metadata import version
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
    def __init__(self, fullname):
        self.fullname = fullname

    def create_module(self, spec):
        raise ModuleNotFoundError(
            f"No module named {self.fullname!r}: bulkhead serves comfy_env's public entry points "
            f"({', '.join(PUBLIC)}) and the real comfy-env package, whose submodules these are, is not "
            f"installed; install it, or set {SWITCH}=off to hand comfy_env back to it", name=self.fullname)

    def exec_module(self, module):
        pass


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
        if fullname.startswith("comfy_env.") and getattr(sys.modules.get("comfy_env"), "__bulkhead__", False) \
                and not list(getattr(sys.modules["comfy_env"], "__path__", None) or ()):
            return importlib.machinery.ModuleSpec(fullname, _NoSubmodule(fullname))
        return None


def route():
    """Routes ``import comfy_env`` to bulkhead (ComfyUI's prestartup calls
    this).  Returns True when routed; False when the switch is off."""
    global real_module
    if not enabled():
        log.info("bulkhead: %s=%s: packs written for comfy-env run under the real comfy-env package",
                 SWITCH, os.environ.get(SWITCH))
        return False
    with _lock:
        if not any(isinstance(f, Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, Finder())
        cur = sys.modules.get("comfy_env")
        if cur is not None and not getattr(cur, "__bulkhead__", False):
            real_module = cur
            for k in [k for k in sys.modules if k == "comfy_env" or k.startswith("comfy_env.")]:
                if k == "comfy_env":
                    del sys.modules[k]
        if "comfy_env" not in sys.modules:
            importlib.import_module("comfy_env")
    return True


def _real_version():
    try:
        from importlib.metadata import version
        return version("comfy-env")
    except Exception:
        return None


def _announce(pack_dir, what):
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
    import re
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
        from importlib.metadata import version
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
        import subprocess
        v = subprocess.run([py, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                           timeout=30, check=True).stdout.strip()
    except Exception as e:
        return None, f"comfy-env's interpreter {py} does not run ({e}); {fix}"
    if config.python and not os.path.isabs(config.python) and \
            v != ".".join(config.python.split(".")[:2]):
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
    from ..envs.config import PackConfigError
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
    from . import states
    with states.serving():
        return _serve(pack_dir, pkg_name, nodes_package)


def _serve(pack_dir, pkg_name, nodes_package):
    from ..envs import config as packconfig, rootconfig
    from . import pack as hpack, states
    _announce(pack_dir, "register_nodes")
    root = rootconfig.load_root(pack_dir)
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
                                   name=packconfig.pack_name(config_path, pack_dir))
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


def _lost_subdir(pack_dir, name, module, error, others=True):
    from . import states
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    what = lines[-1] if len(lines) > 1 else f"{type(error).__name__}: {error}"
    log.error("bulkhead: pack %r: its nodes are NOT loaded: they could not run isolated (the line before says "
              "why) and importing them in ComfyUI's process failed too: %s; %s. Fix: what the line before "
              "names, so that its environment is built", name, what,
              "the pack's other nodes load" if others else "ComfyUI lists the pack as IMPORT FAILED")
    states.failed(pack_dir, name, f"not isolated, and in ComfyUI's process: {what}", module=module)


# --- install, setup_env, copy_files ---

def install(config=None, node_dir=None, log_callback=None, dry_run=False):
    """Builds the calling pack's environments with bulkhead (comfy-env's
    signature; ``config`` is not used: every config of the pack is built)."""
    from ..envs import build as envs, config as packconfig
    pack_dir = os.path.abspath(os.fspath(node_dir)) if node_dir else _caller()[0]
    _announce(pack_dir, "install")
    if dry_run:
        for c in packconfig.load_configs(pack_dir):
            (log_callback or print)(str(envs.env_status(c)))
        return True
    envs.install(pack_dir, progress=log_callback)
    return True


def setup_env(node_dir=None):
    """Prestartup: reports where each of the calling pack's environments
    stands (bulkhead's, or comfy-env's reused)."""
    from ..envs import build as envs, config as packconfig
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
            log.warning("bulkhead: %s: %s: %s%s", c.name, st.state, st.reason, f"; {why}" if why else f"; {st.fix}")


def copy_files(src, dst, pattern="*", overwrite=False):
    """Copies files matching pattern from src to dst (relative paths from
    the calling script's directory; a dst starting input/, output/, temp/
    or user/ in ComfyUI's directory of that kind).  Returns the count."""
    from pathlib import Path
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
                import folder_paths
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
