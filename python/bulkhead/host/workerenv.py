"""A worker's environment and the package root it imports bulkhead from.

A worker starts with an environment built here from an allow-list
(``build_env``: nothing of the host's Python setup leaks in, no
PYTHONHOME, no VIRTUAL_ENV, no host site-packages, no pip options), its
PYTHONPATH led by a directory that holds only the ``bulkhead`` package
(``worker_pythonpath``), and its idle threads' spin bounded
(host/spin.py)."""

import atexit
import logging
import os
import shutil
import tempfile
import threading

from ..channel import spec
from . import rundir
from .spin import spin_untuned


# Variables a worker inherits from the host's environment; everything else
# must be passed explicitly in env=.
_PASS = frozenset("""
PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR TERM SHELL
CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER NVIDIA_VISIBLE_DEVICES HIP_VISIBLE_DEVICES
OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OPENBLAS_THREAD_TIMEOUT
LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
HF_HOME HF_HUB_OFFLINE TORCH_HOME SSL_CERT_FILE
XDG_CACHE_HOME XDG_DATA_HOME XDG_CONFIG_HOME XDG_RUNTIME_DIR
""".split())
_PASS_PREFIXES = ("LC_", spec.PREFIX, "OMP_", "GOMP_", "KMP_")
# ...except these: the environment builder's pip options may hold an index's
# credentials (--index-url https://user:token@...), and a worker never
# builds an environment.
_NEVER_PASS = frozenset({spec.PIP_ARGS, spec.AS_ZYGOTE})


_root_lock = threading.Lock()
_root = None
_ROOT_NAME = "pkgroot-"


def worker_pythonpath():
    """A directory holding only the ``bulkhead`` package, for a worker's
    PYTHONPATH.  The package's own parent when it holds nothing else (a
    build tree); otherwise a directory of this host process alone, made
    with mkdtemp in the checked private directory (rundir) and holding a
    copy of the package's tree made of links (_link_tree): no other user
    can swap it, another install's host (another version) never repoints
    it, and a worker never writes into the installed package.  Removed at
    exit; those of hosts that died without exiting go at the next host's
    first worker.  Raises rundir.PrivateDirError when the private directory
    is not ours."""
    global _root
    with _root_lock:
        if _root is not None:
            return _root
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # host/ -> bulkhead/
        parent = os.path.dirname(pkg)
        others = [e for e in os.listdir(parent) if e != "bulkhead" and not e.startswith(".")]
        if not others:
            _root = parent
            return _root
        base = rundir.runtime_dir()
        _sweep_roots(base)
        root = tempfile.mkdtemp(prefix=f"{_ROOT_NAME}{os.getpid()}-", dir=base)
        atexit.register(_remove_root, root, os.getpid())
        _link_tree(pkg, os.path.join(root, "bulkhead"))
        _root = root
        return _root


def _link_tree(src, dst):
    """dst: src's directories made anew, every file in them a symbolic link
    to src's (the bytecode pip compiled included, so a worker under the
    host's Python reads it as from the package).  A worker under another
    minor then writes its own bytecode into dst's __pycache__, never into
    the installed package: pip uninstall leaves what it did not install,
    and the folder left then imported as an empty namespace package, on
    which every pack failed ("module 'bulkhead' has no attribute
    'comfy_pack'")."""
    for dirpath, _dirs, files in os.walk(src):
        out = os.path.normpath(os.path.join(dst, os.path.relpath(dirpath, src)))
        os.mkdir(out, 0o700)
        for name in files:
            os.symlink(os.path.join(dirpath, name), os.path.join(out, name))


def _remove_root(root, pid=None):
    if pid is not None and pid != os.getpid():
        return  # a forked child exiting: the root is its parent's
    shutil.rmtree(root, ignore_errors=True)   # directories and links: no link is followed


def _sweep_roots(base):
    """Removes the package roots of host processes that are gone."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if rundir.owner_gone(name, _ROOT_NAME):
            _remove_root(os.path.join(base, name))


def build_env(extra=None, inherit=True):
    """The worker's whole environment as a dict."""
    env = {}
    if inherit:
        for k, v in os.environ.items():
            if (k in _PASS or k.startswith(_PASS_PREFIXES)) and k not in _NEVER_PASS:
                env[k] = v
    extra = dict(extra or {})
    path = worker_pythonpath()
    user_pp = extra.pop("PYTHONPATH", "")
    env.update(extra)
    env["PYTHONPATH"] = path + (os.pathsep + user_pp if user_pp else "")
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env[spec.FD] = "3"
    env[spec.HOST_PID] = str(os.getpid())
    env.update(spin_untuned(env))
    env.setdefault(spec.LOG_LEVEL, str(logging.getLogger().getEffectiveLevel()))
    return env
