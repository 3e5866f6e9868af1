"""Every public name a comfy-env release exported, under bulkhead's routed
``comfy_env``: served where its meaning maps onto bulkhead, refused by a
callable that raises where it does not.

Packs in the field pin comfy-env releases from 0.0.x to 0.4.46, and each
era exported another surface: 0.0.x a decorator and worker classes
(``isolated``, ``WorkerBridge``, ``VenvWorker``, ...), 0.1.x-0.2.18
``wrap_isolated_nodes`` / ``wrap_nodes``, 0.1.x-0.4.22 a config, detection
and worker layer (``load_config``, ``detect_cuda_version``,
``SubprocessWorker``, ``CUDA_WHEELS_INDEX``, ...), 0.4.23+ five names.
A pack guards its import (``try: from comfy_env import wrap_isolated_nodes
except ImportError: print("comfy-env not installed")``), so a name that is
missing is no error at all: the pack's isolated nodes silently disappear.
Hence every name is an attribute of the routed module, and a refused one
is a function (or a class whose construction) raising ``NameRefused``, a
RuntimeError that names the releases that had it, why bulkhead does not
serve it and what to do -- never an ImportError, which such an ``except``
would swallow.

The older ways to isolate a pack's nodes (``wrap_isolated_nodes``,
``wrap_nodes``, ``enable_isolation``) are host/comfy_env.py's, beside
``register_nodes``, which they share their serving with.  ``NAMES`` is the table (name -> the releases that exported it, read from
each release's ``__init__.py``: the wheels PyPI serves, 0.3.0-0.4.46, the
tags of comfy-env's repository, 0.1.82-0.4.22, and the older sources
published on PyPI mirrors); ``SUBMODULES`` the internal module paths packs
and comfy-env's own tests import from (``comfy_env.isolation.workers.
_ipc_shared`` for ``register_serializer``, ``comfy_env.workers``, ...),
each served with the names that lived there.  docs/comfy-env.md lists
both.

The user's old switches are read here too (``off_switch``,
``switch_notes``): ``COMFY_ENV_ISOLATE=0`` (0.2.31-0.4.24) and
``USE_COMFY_ENV=0`` (0.1.x-0.2.30) ran a comfy-env pack's nodes in
ComfyUI's process, and so does bulkhead, said once; ``COMFY_ENV_AUTO_INSTALL``
(0.4.1-0.4.24: build a missing environment at start) is what bulkhead does
anyway, and one line says so and which switch of bulkhead's decides.
"""

import importlib
import logging
import os
import sys
import threading
import types

from ..channel.spec import BUILD_AT_START, COMFY_ENV
from ..envs import config as packconfig, rootconfig
from ..envs.errors import EnvBuildError
from . import states

log = logging.getLogger("bulkhead")

SWITCH = COMFY_ENV


class NameRefused(RuntimeError):
    """A comfy-env name bulkhead does not serve, used: names the releases
    that had it and what to do instead."""


# --- the names ---

# name -> releases that exported it from ``comfy_env`` (first-last as read;
# "0.0.x" where only undated 0.0.x/0.1.x sources were found).
NAMES = {
    # served
    "register_nodes": "0.1.82-0.4.46",
    "install": "0.0.6-0.4.46",
    "setup_env": "0.0.x-0.4.46",
    "copy_files": "0.1.x-0.4.46",
    "register_serializer": "0.4.23-0.4.46",
    "wrap_isolated_nodes": "0.1.x-0.2.18",
    "wrap_nodes": "0.1.x-0.2.18",
    "enable_isolation": "0.0.x",
    "load_config": "0.0.6-0.4.22",
    "discover_config": "0.0.6-0.4.22",
    "ComfyEnvConfig": "0.1.x-0.4.22",
    "CONFIG_FILE_NAME": "0.1.x-0.4.22",
    "ROOT_CONFIG_FILE_NAME": "0.1.x-0.4.22",
    "CONFIG_FILE_NAMES": "0.0.6-0.0.x",
    "detect_cuda_version": "0.0.6-0.4.22",
    "has_nvidia_gpu": "0.3.52-0.4.22",
    "get_bootstrap_python_version": "0.3.52-0.4.22",
    "get_bootstrap_torch_version": "0.3.52-0.4.22",
    "get_bootstrap_torch_cuda": "0.3.52-0.4.22",
    "get_pixi_platform": "0.3.52-0.4.22",
    "is_linux": "0.3.52-0.4.22",
    "is_windows": "0.3.52-0.4.22",
    "is_macos": "0.3.52-0.4.22",
    "cuda_wheels_index": "0.4.26-0.4.46 (a signpost to its internal module)",
    "get_wheel_url": "0.1.x-0.4.22",
    "CUDA_WHEELS_INDEX": "0.1.x-0.4.22",
    "get_cuda_torch_mapping": "0.1.x-0.4.22",
    "verify_installation": "0.0.6-0.4.22",
    "USE_COMFY_ENV_VAR": "0.1.x-0.4.22",
    "get_comfyui_dir": "0.2.11-0.4.22",
    "find_comfyui_dir_from_node": "0.3.54-0.4.22",
    "WorkerError": "0.1.x-0.4.22",
    "EnvManagerError": "0.0.6-0.1.x",
    "ConfigError": "0.0.6-0.1.x",
    "WheelNotFoundError": "0.0.6-0.1.x",
    "DependencyError": "0.0.6-0.1.x",
    "CUDANotFoundError": "0.0.6-0.1.x",
    "InstallError": "0.0.6-0.1.x",
    # refused: comfy-env's own workers, pixi, caches and GPU probes
    "isolated": "0.0.6-0.0.x",
    "shutdown_all_processes": "0.0.6-0.0.x",
    "WorkerBridge": "0.0.6-0.0.x",
    "BaseWorker": "0.0.6-0.0.x",
    "register": "0.0.6-0.0.x",
    "TorchBridge": "0.0.6-0.0.x",
    "TorchWorker": "0.0.6-0.0.x",
    "PersistentVenvWorker": "0.0.6-0.0.x",
    "TorchMPWorker": "0.0.6-0.0.x",
    "VenvWorker": "0.0.6-0.0.x",
    "WorkerPool": "0.0.6-0.0.x",
    "get_worker": "0.0.6-0.0.x",
    "register_worker": "0.0.6-0.0.x",
    "shutdown_workers": "0.0.6-0.0.x",
    "Worker": "0.0.6-0.4.22",
    "MPWorker": "0.0.66-0.1.x",
    "SubprocessWorker": "0.0.66-0.4.22",
    "TensorKeeper": "0.1.x-0.4.22",
    "release_tensor": "0.1.89-0.4.22",
    "release_tensors_recursive": "0.1.89-0.4.22",
    "IsolatedEnv": "0.0.6-0.0.x",
    "IsolatedEnvManager": "0.0.6-0.0.x",
    "EnvManagerConfig": "0.0.6-0.0.x",
    "LocalConfig": "0.0.6-0.0.x",
    "CondaConfig": "0.0.14-0.0.x",
    "NodeReq": "0.0.6-0.2.18",
    "NodeDependency": "0.1.x-0.3.53",
    "load_env_from_file": "0.0.6-0.0.x",
    "discover_env_config": "0.0.6-0.0.x",
    "normalize_env_name": "0.0.6-0.0.x",
    "validate_dependency": "0.0.6-0.0.x",
    "validate_dependencies": "0.0.6-0.0.x",
    "validate_path_within_root": "0.0.6-0.0.x",
    "validate_wheel_url": "0.0.6-0.0.x",
    "RuntimeEnv": "0.0.6-0.3.53",
    "WheelResolver": "0.0.6-0.0.x",
    "detect_runtime": "0.1.x-0.3.53",
    "detect_platform": "0.1.x-0.3.53",
    "get_platform_tag": "0.1.x-0.3.53",
    "detect_gpu_info": "0.0.6-0.0.x",
    "detect_gpus": "0.0.14-0.0.x",
    "detect_gpu": "0.1.x-0.4.22",
    "detect_cuda_environment": "0.0.14-0.4.22",
    "get_gpu_summary": "0.0.6-0.4.22",
    "get_recommended_cuda_version": "0.0.14-0.4.22",
    "GPUInfo": "0.0.14-0.4.22",
    "CUDAEnvironment": "0.0.14-0.4.22",
    "PIXI": "0.3.54-0.4.22",
    "ensure_pixi": "0.0.14-0.4.22",
    "get_pixi_path": "0.0.14-0.3.53",
    "get_pixi_python": "0.0.14-0.3.53",
    "pixi_run": "0.0.14-0.3.53",
    "pixi_install": "0.0.14-0.1.x",
    "pixi_clean": "0.1.x-0.3.53",
    "create_pixi_toml": "0.0.14-0.0.x",
    "get_cache_dir": "0.1.x-0.3.53",
    "cleanup_orphaned_envs": "0.1.x",
    "resolve_env_path": "0.1.x-0.3.53",
    "CACHE_DIR": "0.1.x-0.3.53",
    "MARKER_FILE": "0.1.x",
    "get_env_name": "0.3.54-0.4.22",
    "get_workspace_dir": "0.3.54-0.4.22",
    "input_files": "0.4.34-0.4.42",
    "setup_isolated_imports": "0.0.50-0.0.65",
    "cleanup_stubs": "0.0.50-0.0.65",
    "PACKAGE_REGISTRY": "0.0.66",
}

# Why each refused name is not served, by kind, and what to do.
_USE_NODES = ("bulkhead runs a pack's nodes in its own worker processes, not through comfy-env's workers, "
              "so there is no comfy-env worker to hand. Fix: let bulkhead isolate the nodes "
              "(`NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = comfy_env.register_nodes()` with a "
              "comfy-env.toml beside them; wrap_isolated_nodes / wrap_nodes work too)")
_NO_PIXI = ("bulkhead builds environments itself (`bulkhead install <pack>`), without pixi or comfy-env's "
            "env cache. Fix: build the pack's environments with `bulkhead install <pack>`; read them with "
            "`bulkhead env <pack>`")
_NO_PROBE = ("bulkhead matches an environment to the host's torch and CUDA itself. Fix: read "
             "torch.cuda in your node, or comfy_env.detect_cuda_version() / has_nvidia_gpu(), which "
             "bulkhead serves")
_NO_CONFIG_CLASS = ("bulkhead reads comfy-env.toml itself. Fix: comfy_env.load_config(path) / "
                    "discover_config(dir), which bulkhead serves, give the file as a ComfyEnvConfig")
_NO_STUBS = ("comfy-env 0.0.50-0.0.65 put stand-in modules into ComfyUI's process for the packages only the "
             "pack's environment has, so that the pack's nodes module imported there; bulkhead imports a pack's "
             "nodes in its worker, where those packages are. Fix: let bulkhead isolate the nodes "
             "(`NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = comfy_env.register_nodes()` with a "
             "comfy-env.toml beside them) and drop the call")
_WHY = {n: _USE_NODES for n in (
    "isolated", "shutdown_all_processes", "WorkerBridge", "BaseWorker", "register", "TorchBridge", "TorchWorker",
    "PersistentVenvWorker", "TorchMPWorker", "VenvWorker", "WorkerPool", "get_worker", "register_worker",
    "shutdown_workers", "Worker", "MPWorker", "SubprocessWorker", "TensorKeeper", "release_tensor",
    "release_tensors_recursive", "input_files")}
_WHY.update({n: _NO_PIXI for n in (
    "PIXI", "ensure_pixi", "get_pixi_path", "get_pixi_python", "pixi_run", "pixi_install", "pixi_clean",
    "create_pixi_toml", "get_cache_dir", "cleanup_orphaned_envs", "resolve_env_path", "CACHE_DIR", "MARKER_FILE",
    "get_env_name", "get_workspace_dir", "IsolatedEnvManager", "RuntimeEnv", "WheelResolver", "detect_runtime",
    "PACKAGE_REGISTRY")})
_WHY.update({n: _NO_STUBS for n in ("setup_isolated_imports", "cleanup_stubs")})
_WHY.update({n: _NO_PROBE for n in (
    "detect_platform", "get_platform_tag", "detect_gpu_info", "detect_gpus", "detect_gpu", "detect_cuda_environment",
    "get_gpu_summary", "get_recommended_cuda_version", "GPUInfo", "CUDAEnvironment")})
_WHY.update({n: _NO_CONFIG_CLASS for n in (
    "IsolatedEnv", "EnvManagerConfig", "LocalConfig", "CondaConfig", "NodeReq", "NodeDependency",
    "load_env_from_file", "discover_env_config", "normalize_env_name", "validate_dependency",
    "validate_dependencies", "validate_path_within_root", "validate_wheel_url")})


def refusal(name):
    """The message a refused name raises."""
    return (f"comfy_env.{name} (exported by comfy-env {NAMES.get(name, '?')}) is not served by bulkhead, which "
            f"answers `import comfy_env` inside ComfyUI: {_WHY.get(name, _USE_NODES)}. Or set {SWITCH}=off to "
            "hand every pack back to the real comfy-env package (a release that has the name: "
            f"`pip install \"comfy-env=={NAMES.get(name, '?').split('-')[-1].replace('x', '*')}\"`)")


def _refused_function(name):
    def refused(*args, **kwargs):
        raise NameRefused(refusal(name))
    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Refused under bulkhead (comfy-env {NAMES[name]}); calling it raises NameRefused."
    return refused


class _RefusedClass:
    """A comfy-env class bulkhead does not serve: it can be named, subclassed
    and used in isinstance checks (nothing is one), and constructing it
    raises NameRefused naming the release and the fix."""

    _bulkhead_name = "?"

    def __new__(cls, *args, **kwargs):
        raise NameRefused(refusal(cls._bulkhead_name))


def _refused_class(name):
    return type(name, (_RefusedClass,), {"_bulkhead_name": name, "__module__": "comfy_env",
                                          "__doc__": f"Refused under bulkhead (comfy-env {NAMES[name]})."})


class _RefusedPath:
    """A refused path constant (``PIXI``, ``CACHE_DIR``, ``MARKER_FILE``):
    it prints as what it is, and every use of it as a path (``os.fspath``,
    ``/``, ``+``, a method of Path's) raises NameRefused."""

    def __init__(self, name):
        self._name = name

    def _refuse(self, *args, **kwargs):
        raise NameRefused(refusal(self._name))

    __fspath__ = __truediv__ = __rtruediv__ = __add__ = __radd__ = _refuse

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __repr__(self):
        return f"<comfy_env.{self._name}: not served by bulkhead>"

    __str__ = __repr__


# --- served: exceptions and constants ---

class WorkerError(Exception):
    """comfy-env's worker error (0.1.x-0.4.22): a pack's ``except
    WorkerError`` stays valid; bulkhead's workers raise their own errors
    (the node's exception, OOM as ComfyUI's own)."""


class EnvManagerError(Exception):
    """comfy-env 0.0.x-0.1.x's base error, kept for a pack's ``except``."""


class ConfigError(EnvManagerError):
    pass


class WheelNotFoundError(EnvManagerError):
    pass


class DependencyError(EnvManagerError):
    pass


class CUDANotFoundError(EnvManagerError):
    pass


class InstallError(EnvManagerError):
    pass


CONFIG_FILE_NAME = "comfy-env.toml"
ROOT_CONFIG_FILE_NAME = "comfy-env-root.toml"
CONFIG_FILE_NAMES = [CONFIG_FILE_NAME]
USE_COMFY_ENV_VAR = "USE_COMFY_ENV"


def cuda_wheels_index():
    """The first CUDA wheel index bulkhead resolves ``[cuda] packages`` from
    (``BULKHEAD_CUDA_INDEX``, comfy-env's ``COMFY_ENV_CUDA_WHEELS_INDEX``, or
    the default): comfy-env's ``CUDA_WHEELS_INDEX`` meant the index it used."""
    from ..envs import cudawheels  # lazy: ComfyUI start (urllib.request)
    return cudawheels.indexes()[0]


# --- served: config ---

class ComfyEnvConfig(dict):
    """A config as comfy-env 0.3-0.4.22 returned it: a dict whose keys are
    also attributes (python, cuda_packages, env_vars, node_reqs, options,
    settings, types, pixi_passthrough), filled from bulkhead's reader; the
    keys bulkhead adds say what it builds from the file (requirements,
    conda, channels, apt_packages, brew_packages, warnings)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"ComfyEnvConfig has no key {key!r} (keys: {', '.join(sorted(self))})") from None

    def __setattr__(self, key, value):
        self[key] = value

    @property
    def has_cuda(self):
        return bool(self.get("cuda_packages"))

    @property
    def has_dependencies(self):
        p = self.get("pixi_passthrough") or {}
        return bool(self.get("cuda_packages") or self.get("node_reqs") or p.get("dependencies")
                    or p.get("pypi-dependencies"))


def load_config(path):
    """The comfy-env file at path (``comfy-env.toml`` or
    ``comfy-env-root.toml``) read by bulkhead's reader, as a
    ComfyEnvConfig.  A file bulkhead refuses raises its PackConfigError (a
    ValueError, as comfy-env raised) naming the file, line and fix."""
    path = os.path.abspath(os.fspath(path))
    if os.path.basename(path) == ROOT_CONFIG_FILE_NAME:
        root = rootconfig.load_root(os.path.dirname(path), warn=False)
        return ComfyEnvConfig(
            python=None, cuda_packages=[], env_vars={},
            node_reqs=[{"name": n, "github": s} for n, s in root.node_packs],
            options={}, settings={}, types=dict(root.types), pixi_passthrough={},
            apt_packages=list(root.system_packages.get("apt", ())),
            brew_packages=list(root.system_packages.get("brew", ())), warnings=list(root.warnings))
    root_dir = _pack_root(os.path.dirname(path))
    c = packconfig.load(path, root=root_dir, warn=False)
    pypi = {}
    for r in c.requirements:
        name = r.split("@")[0].split(";")[0]
        for sep in ("==", ">=", "<=", "~=", "!=", ">", "<", "["):
            name = name.split(sep)[0]
        pypi[name.strip()] = r[len(name.strip()):].strip() or "*"
    passthrough = {}
    if pypi:
        passthrough["pypi-dependencies"] = pypi
    if c.conda:
        passthrough["dependencies"] = list(c.conda)
        passthrough["workspace"] = {"channels": list(c.channels)}
    return ComfyEnvConfig(
        python=c.python, cuda_packages=list(c.cuda), env_vars=dict(c.env_vars), node_reqs=[],
        options=dict(c.options), settings={}, types={}, pixi_passthrough=passthrough,
        requirements=list(c.requirements), conda=list(c.conda), channels=list(c.channels),
        apt_packages=list(c.system_packages.get("apt", ())), brew_packages=list(c.system_packages.get("brew", ())),
        warnings=list(c.warnings))


def discover_config(node_dir, root=True):
    """comfy-env's lookup in node_dir: ``comfy-env-root.toml`` first (when
    root), else ``comfy-env.toml``; None when neither is there."""
    node_dir = os.fspath(node_dir)
    if root and os.path.isfile(os.path.join(node_dir, ROOT_CONFIG_FILE_NAME)):
        return load_config(os.path.join(node_dir, ROOT_CONFIG_FILE_NAME))
    p = os.path.join(node_dir, CONFIG_FILE_NAME)
    return load_config(p) if os.path.isfile(p) else None


def _pack_root(d):
    """The pack a config directory belongs to: the highest directory above
    it that is still a package (holds an ``__init__.py``), as comfy-env
    found it; d itself when it is none."""
    d = os.path.abspath(d)
    while os.path.isfile(os.path.join(os.path.dirname(d), "__init__.py")) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    return d


# --- served: detection, wheels, paths ---

def detect_cuda_version():
    """The host torch's CUDA version ("12.8"), None without CUDA or torch:
    the build bulkhead matches environments and CUDA wheels to (read from
    torch's version file, no import)."""
    from ..envs import cudawheels  # lazy: ComfyUI start (urllib.request)
    tv, cv = cudawheels.host_torch()
    return ".".join(str(cv).split(".")[:2]) if tv and cv else None


def get_bootstrap_python_version():
    """This interpreter's major.minor ("3.11")."""
    return "%d.%d" % sys.version_info[:2]


def get_bootstrap_torch_version():
    """The host torch's version without its local label ("2.8.0"), or None."""
    from ..envs import cudawheels  # lazy: ComfyUI start (urllib.request)
    tv, _ = cudawheels.host_torch()
    return tv.split("+", 1)[0] if tv else None


def get_bootstrap_torch_cuda():
    """The CUDA version the host torch was built against, or None."""
    return detect_cuda_version()


def get_pixi_platform():
    """This machine's pixi platform ("linux-64", "osx-arm64", ...), the one
    bulkhead applies ``[target.*]`` tables for."""
    return packconfig.current_platform()


def is_linux():
    return sys.platform.startswith("linux")


def is_windows():
    return sys.platform == "win32"


def is_macos():
    return sys.platform == "darwin"


def has_nvidia_gpu():
    """Whether the host's torch is a CUDA build (comfy-env: a CUDA version
    was detected)."""
    return detect_cuda_version() is not None


def get_cuda_torch_mapping():
    """{cuda: torch} for the host's build ({} without CUDA): what comfy-env's
    table paired, here the one pair bulkhead builds for."""
    from ..envs import cudawheels  # lazy: ComfyUI start (urllib.request)
    tv, cv = cudawheels.host_torch()
    if not tv or not cv:
        return {}
    return {".".join(str(cv).split(".")[:2]): ".".join(tv.split("+")[0].split(".")[:2])}


def get_wheel_url(package, torch_version, cuda_version, python_version, log=None):
    """The URL of the wheel of package built for that torch, CUDA and
    Python from bulkhead's CUDA wheel indexes, chosen as bulkhead chooses
    for ``[cuda] packages``; None when none fits (comfy-env's answer)."""
    from ..envs import cudawheels  # lazy: ComfyUI start (urllib.request)
    lines = []
    where = types.SimpleNamespace(path=f"get_wheel_url({package!r})", cuda=(str(package),))
    try:
        [req] = cudawheels.resolve(where, str(python_version), lines.append,
                                   torch=(str(torch_version), str(cuda_version) if cuda_version else None))
    except (EnvBuildError, ValueError) as e:
        lines.append(str(e))
        req = None
    for line in lines:
        (log or logging.getLogger("bulkhead").info)(line)
    return req.split(" @ ", 1)[1] if req else None


def verify_installation(packages, log=print):
    """True when every package imports here (comfy-env's check), each
    failure passed to log."""
    ok = True
    for p in packages:
        name = str(p).replace("-", "_").split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
        try:
            importlib.import_module(name)
        except Exception as e:
            log(f"{p}: {type(e).__name__}: {e}")
            ok = False
    return ok


def get_comfyui_dir(node_dir=None):
    """ComfyUI's base directory (``folder_paths.base_path``), or None
    outside ComfyUI."""
    fp = sys.modules.get("folder_paths")
    base = getattr(fp, "base_path", None) if fp is not None else None
    return __import__("pathlib").Path(base) if base else None


find_comfyui_dir_from_node = get_comfyui_dir


# --- the user's old switches ---

_OFF = ("0", "false", "no", "off")
# variable -> what the releases that read it did with an "off" value
OFF_SWITCHES = {
    "COMFY_ENV_ISOLATE": "comfy-env 0.2.31-0.4.24 ran the pack's nodes in ComfyUI's process "
                         "(0.4.25+ refuses to start with it)",
    "USE_COMFY_ENV": "comfy-env 0.1.x-0.2.30 ran the pack's nodes in ComfyUI's process",
}
AUTO_INSTALL = "COMFY_ENV_AUTO_INSTALL"
_noted = set()
_noted_lock = threading.Lock()


def off_switch():
    """(variable, value) of the user's comfy-env off-switch that is set to
    off, or None."""
    for var in OFF_SWITCHES:
        v = os.environ.get(var)
        if v is not None and v.strip().lower() in _OFF:
            return var, v
    return None


def _once(key):
    with _noted_lock:
        if key in _noted:
            return False
        _noted.add(key)
        return True


def switch_notes():
    """One log line for each comfy-env switch of the user's that is set,
    once a process: what bulkhead does with it and why."""
    off = off_switch()
    if off is not None and _once("off"):
        var, v = off
        log.warning("bulkhead: %s=%s: packs written for comfy-env (comfy_env.register_nodes, wrap_isolated_nodes, "
                    "wrap_nodes) run in ComfyUI's process, NOT isolated, as that switch asks (%s). Unset %s to "
                    "run them isolated", var, v, OFF_SWITCHES[var], var)
    v = os.environ.get(AUTO_INSTALL)
    if v is not None and _once("auto"):
        own = os.environ.get(BUILD_AT_START, "1").strip().lower() not in _OFF
        if v.strip().lower() in _OFF:
            log.info("bulkhead: %s=%s is not read: comfy-env 0.4.1-0.4.24 then left a missing environment "
                     "unbuilt; bulkhead builds a pack's missing environment as ComfyUI starts unless "
                     "%s=0, its own switch%s", AUTO_INSTALL, v, BUILD_AT_START,
                     " (set: it does not)" if not own else "")
        else:
            log.info("bulkhead: %s=%s (comfy-env 0.4.1-0.4.24: build a missing environment at start): %s",
                     AUTO_INSTALL, v,
                     "bulkhead does that anyway (BULKHEAD_BUILD_AT_START, on)" if own else
                     "not done: bulkhead's own switch BULKHEAD_BUILD_AT_START=0 is set and wins; unset it to build "
                     "missing environments at start")


def pack_in_process(pack_dir, root):
    """Whether register_nodes runs the pack's nodes in ComfyUI's process:
    its root file's ``[settings] isolate`` (root: a RootConfig or None)
    where it sets one -- comfy-env 0.2.40-0.4.24 let that per-pack setting
    win over the user's COMFY_ENV_ISOLATE, both ways -- else the user's
    off-switch.  A pack the setting isolates under a set off-switch is
    said once."""
    isolate = getattr(root, "isolate", None)
    if isolate is None:
        return off_switch() is not None
    off = off_switch()
    if isolate and off is not None and _once(("isolated despite", os.path.realpath(pack_dir))):
        log.warning("bulkhead: pack %r runs isolated although %s=%s is set: its [settings] isolate = true (%s) "
                    "wins, as in comfy-env 0.2.40-0.4.24", os.path.basename(pack_dir), off[0], off[1],
                    root.isolate_where)
    return not isolate


def in_process(mapping, pack_dir, module, root=None):
    """The pack's own classes, as the off-switch or the pack's
    ``[settings] isolate = false`` (root) asks: said once, and its state
    says so."""
    pack_dir = os.path.realpath(pack_dir)
    name = os.path.basename(pack_dir)
    if getattr(root, "isolate", None) is False:
        if _once(("setting", pack_dir)):
            log.warning("bulkhead: pack %r runs in ComfyUI's process, NOT isolated, as its %s asks ([settings] "
                        "isolate = false: comfy-env 0.2.40-0.4.24 ran it so). Remove that line to run it isolated",
                        name, root.isolate_where)
        states.set_state(pack_dir, module, name=name, state="in-process",
                         reason=f"[settings] isolate = false ({root.isolate_where}) asks for it",
                         fix=f"remove isolate = false from [settings] in {root.path}")
        return mapping
    var, v = off_switch()
    switch_notes()
    states.set_state(pack_dir, module, name=name, state="in-process",
                     reason=f"{var}={v} (comfy-env's off-switch) asks for it", fix=f"unset {var}")
    return mapping


# --- the module and its internal submodules ---

def value(name):
    """What ``comfy_env.<name>`` is under bulkhead (NAMES), the names
    host/comfy_env.py serves aside (the five current ones, and the older
    ways to isolate a pack's nodes: ``wrap_isolated_nodes``, ``wrap_nodes``,
    ``enable_isolation``)."""
    if name == "cuda_wheels_index":
        return cuda_wheels_index
    if name == "CUDA_WHEELS_INDEX":
        try:
            return cuda_wheels_index()
        except Exception:
            return "https://comfy-forge.github.io/cuda-wheels/"
    g = globals()
    if name in g and name not in _WHY:
        return g[name]
    if name in ("PIXI", "CACHE_DIR", "MARKER_FILE"):
        return _RefusedPath(name)
    if name[:1].isupper() and not name.isupper():
        return _refused_class(name)
    return _refused_function(name)


# Internal module paths packs and comfy-env's own tests import from, with
# the names each held.  Not comfy_env.install: a submodule of that name
# would shadow the install() function on the module once imported.  comfy_env.isolation.* and comfy_env.workers.* are
# always bulkhead's (their code would run comfy-env's own isolation beside
# bulkhead's); the others are the real package's where it is installed.
SUBMODULES = {
    "comfy_env.isolation": ("wrap_isolated_nodes", "wrap_nodes", "register_nodes", "register_serializer",
                            "enable_isolation", "Worker", "WorkerError", "SubprocessWorker", "MPWorker",
                            "TensorKeeper", "release_tensor", "release_tensors_recursive"),
    "comfy_env.isolation.wrap": ("wrap_isolated_nodes", "wrap_nodes", "register_nodes"),
    "comfy_env.isolation.workers": ("Worker", "WorkerError", "SubprocessWorker", "MPWorker", "register_serializer"),
    "comfy_env.isolation.workers._ipc_shared": ("register_serializer",),
    "comfy_env.isolation.workers.base": ("Worker", "WorkerError"),
    "comfy_env.isolation.workers.subprocess": ("SubprocessWorker",),
    "comfy_env.isolation.tensor_utils": ("TensorKeeper", "release_tensor", "release_tensors_recursive"),
    "comfy_env.workers": ("Worker", "WorkerError", "MPWorker", "SubprocessWorker", "TorchMPWorker", "VenvWorker",
                          "PersistentVenvWorker", "WorkerPool", "get_worker", "register_worker", "shutdown_workers"),
    "comfy_env.workers.base": ("Worker", "WorkerError"),
    "comfy_env.workers.subprocess": ("SubprocessWorker",),
    "comfy_env.workers.venv": ("VenvWorker", "PersistentVenvWorker"),
    "comfy_env.decorator": ("isolated", "shutdown_all_processes"),
    "comfy_env.config": ("ComfyEnvConfig", "load_config", "discover_config", "CONFIG_FILE_NAME",
                         "ROOT_CONFIG_FILE_NAME"),
    "comfy_env.detection": ("detect_cuda_version", "has_nvidia_gpu", "get_bootstrap_python_version",
                            "get_bootstrap_torch_version", "get_bootstrap_torch_cuda", "get_pixi_platform",
                            "is_linux", "is_windows", "is_macos", "detect_gpu", "detect_cuda_environment",
                            "get_gpu_summary", "get_recommended_cuda_version", "GPUInfo", "CUDAEnvironment"),
    "comfy_env.packages": ("CUDA_WHEELS_INDEX", "get_wheel_url", "get_cuda_torch_mapping"),
    "comfy_env.packages.cuda_wheels": ("CUDA_WHEELS_INDEX", "cuda_wheels_index", "get_wheel_url",
                                       "get_cuda_torch_mapping"),
    "comfy_env.prestartup": ("setup_env", "copy_files"),
    "comfy_env.environment": ("copy_files",),
    "comfy_env.environment.setup": ("setup_env",),
    "comfy_env.environment.paths": ("copy_files",),
    "comfy_env.environment.cache": ("copy_files",),
}
ALWAYS_OURS = ("comfy_env.isolation", "comfy_env.workers", "comfy_env.decorator")


def always_ours(fullname):
    """Whether bulkhead serves the submodule even where the real comfy-env
    is installed."""
    return any(fullname == p or fullname.startswith(p + ".") for p in ALWAYS_OURS)
