"""The sandbox an isolated pack's worker runs in: what it may touch.

On Linux with Landlock (5.13+; this is ABI 1-7) every isolated pack's
worker is sandboxed by default, before any of the pack's code runs: a
spawned worker execs inside it (the C core's bh_proc_spawn restricts the
spawning thread first), a zygote's child restricts itself right after the
fork (worker/zygote.py), and every thread and process the pack starts
stays inside.  No root, helper binary or user namespace is needed.

``plan`` derives what one pack may touch from what the host knows:

- read (and execute): the system (/usr, /etc, /proc, ...), the worker's
  interpreter and environment, the host's own packages (its sys.path),
  bulkhead's package, ComfyUI's tree;
- read and write: the pack's own folder, ComfyUI's models (every
  folder_paths folder but custom_nodes, with the extra model paths),
  input, output, temp and user folders, the Hugging Face and torch hub
  caches, a private temporary directory (its TMPDIR), /dev/shm (bulkhead's
  shared memory and ledger);
- devices: /dev/null and its kin, /dev/nvidia*, /dev/dri, /dev/kfd (ioctl
  included);
- everything else is refused: the rest of the home directory (~/.ssh,
  ~/.bashrc, browser profiles), other packs' folders and environments,
  ComfyUI's code and bulkhead's installation for writing, signals and
  ptrace to any process outside the worker's own sandbox (ComfyUI, other
  workers), abstract Unix sockets outside it; TCP too where the network
  is off.

A computed read or write path that is ``/``, the home directory or one of
its ancestors is dropped (a host started from ``~`` has it on sys.path):
it would open everything.  What the user adds is taken as said.

Steering: ``[bulkhead] sandbox = "on" | "off" | "required"``, ``network =
false``, ``sandbox_read = [...]``, ``sandbox_write = [...]`` per pack (in
its comfy-env.toml); ``BULKHEAD_SANDBOX`` (on/off/required),
``BULKHEAD_NETWORK=0`` and ``BULKHEAD_SANDBOX_READ`` /
``BULKHEAD_SANDBOX_WRITE`` (paths separated by ``:``) for every pack.
Where the kernel has no Landlock the pack runs unsandboxed with one line
saying so, and ``required`` refuses to start it.  The test suite
simulates such a kernel with ``BULKHEAD_SANDBOX_NO_LANDLOCK=1``.
"""

import atexit
import glob
import json
import logging
import os
import shutil
import sys
import tempfile
import threading

from .. import _native, envlock
from ..channel.spec import LEDGER, NETWORK, SANDBOX, SANDBOX_NO_LANDLOCK, SANDBOX_READ, SANDBOX_WRITE, SERIALIZERS
from . import rundir

log = logging.getLogger("bulkhead")

MODES = ("on", "off", "required")
SYSTEM_READ = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc",
               "/sys", "/dev", "/run", "/var/lib", "/var/cache", "/nix/store", "/snap", "/gnu/store")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
           "/dev/pts", "/dev/dri", "/dev/kfd", "/dev/nvidia-caps")
# folder_paths entries that are ComfyUI's code, not its data.
NOT_DATA = frozenset({"custom_nodes"})
NO_LANDLOCK = ("this kernel has no Landlock (Linux 5.13+, with landlock in its lsm= boot list or "
               "CONFIG_LSM): isolated packs run unsandboxed, as the ComfyUI user; upgrade the kernel or "
               "enable Landlock to sandbox them, or set [bulkhead] sandbox = \"off\" in a pack's comfy-env.toml "
               "(BULKHEAD_SANDBOX=off for every pack) to silence this")

_said = set()
_said_lock = threading.Lock()
_tmp = {}          # pack name -> its private temporary directory (this host's)
_tmp_lock = threading.Lock()


def say_once(key, level, msg, *args):
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.log(level, msg, *args)


def abi():
    """The kernel's Landlock ABI (0: none, or the test suite's switch
    says so)."""
    if os.environ.get(SANDBOX_NO_LANDLOCK) == "1":
        return 0
    return _native.sandbox_abi()


def _paths(value):
    return [p for p in (value or "").split(os.pathsep) if p]


def _home():
    home = os.path.expanduser("~")
    return os.path.realpath(home) if home and home != "~" else None


def _too_wide(path, home):
    """Whether a computed path would open everything: ``/``, the home
    directory or an ancestor of it."""
    path = os.path.realpath(path)
    if path == "/":
        return True
    return bool(home) and (home == path or home.startswith(os.path.join(path, "")))


def _user_path(p, base):
    p = os.path.expanduser(str(p))
    return os.path.normpath(os.path.join(base, p)) if base and not os.path.isabs(p) else os.path.normpath(p)


def _interpreter_dirs(python):
    """The worker's interpreter, its environment and the base
    installation a venv points at."""
    out = []
    python = os.path.abspath(python)
    env = os.path.dirname(os.path.dirname(python))
    out.append(env)
    real = os.path.realpath(python)
    out.append(os.path.dirname(os.path.dirname(real)))
    try:
        with open(os.path.join(env, "pyvenv.cfg"), encoding="utf-8") as f:
            for line in f:
                k, _, v = line.partition("=")
                if k.strip() == "home" and v.strip():
                    home = v.strip()
                    out.append(os.path.dirname(home))
                    out.append(os.path.dirname(os.path.dirname(os.path.realpath(os.path.join(home, "python3")))))
    except OSError:
        pass
    out += _pth_dirs(env)
    return out


def _pth_dirs(env):
    """The directories an environment's ``.pth`` files add to its path
    (the host's shared packages, envs/hostmatch.py's farm): its site
    reads them as the worker starts, so they are its own to read."""
    out = []
    for sp in glob.glob(os.path.join(env, "lib", "python*", "site-packages")):
        for pth in glob.glob(os.path.join(sp, "*.pth")):
            try:
                with open(pth, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                line = line.strip()
                if line and not line.startswith(("#", "import ", "import\t")):
                    d = os.path.join(sp, line)
                    if os.path.isdir(d):
                        out.append(d)
    return out


def _caches():
    """The model caches packs use, made if missing (a rule needs a path
    that exists): Hugging Face's and torch hub's, and the compiled kernels
    of torch extensions, triton and CUDA's JIT (which, refused, would
    compile again at every start)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out = [os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface"),
           os.environ.get("TORCH_HOME") or os.path.join(xdg, "torch"),
           os.path.join(xdg, "torch_extensions"), os.path.join(os.path.expanduser("~"), ".triton")]
    out.append(os.environ.get("CUDA_CACHE_PATH") or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache"))
    out += [os.environ[k] for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")
            if os.environ.get(k)]
    for d in out:
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            pass
    return out


def private_tmp(name):
    """The pack's private temporary directory (its worker's TMPDIR), made
    once per host (``/tmp/bulkhead-<uid>-<pid>-sandbox-<pack>-*``: a
    later host's rundir.sweep_tmp removes it where this one died without
    exiting) and removed at exit."""
    with _tmp_lock:
        path = _tmp.get(name)
        if path and os.path.isdir(path):
            return path
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
        path = tempfile.mkdtemp(prefix=f"{rundir.tmp_prefix(os.getpid())}{rundir.SANDBOX_TMP}{safe}-", dir=rundir.TMP)
        atexit.register(_remove_tmp, path, os.getpid())
        _tmp[name] = path
        return path


def _remove_tmp(path, pid):
    if pid == os.getpid():
        shutil.rmtree(path, ignore_errors=True)


class Plan:
    """One pack's sandbox: its state for people (``state``: "sandboxed",
    "off", "unavailable" or "refused"; ``why``), and what the worker may
    touch (``spec()``: what _native.spawn and sandbox_apply take)."""

    def __init__(self, name, mode, state, why, network, read=(), write=(), devices=(), tmp=None, abi=0):
        self.name, self.mode, self.state, self.why, self.network = name, mode, state, why, network
        self.read, self.write, self.devices, self.tmp, self.abi = list(read), list(write), list(devices), tmp, abi

    @property
    def active(self):
        return self.state == "sandboxed"

    def spec(self):
        return (self.read, self.write, self.devices, self.network) if self.active else None

    def describe(self):
        """What the status, panel and start summary show."""
        return {"state": self.state, "words": self.words(), "mode": self.mode, "network": self.network, "why": self.why,
                "abi": self.abi, "tmp": self.tmp, "write": self.write if self.active else []}

    def words(self):
        if self.active:
            return "sandboxed" + ("" if self.network else ", no network")
        return f"not sandboxed ({self.why})"


def mode_for(options):
    """(mode, where it was said): the pack's ``[bulkhead] sandbox``, else
    BULKHEAD_SANDBOX, else on."""
    env = os.environ.get(SANDBOX, "").strip().lower()
    pack = (options or {}).get("sandbox")
    if env == "off":
        return "off", f"{SANDBOX}=off"
    if pack in MODES:
        if env == "required" and pack == "on":
            return "required", f"{SANDBOX}=required"
        return pack, f'[bulkhead] sandbox = "{pack}"'
    if env in MODES:
        return env, f"{SANDBOX}={env}"
    return "on", "the default"


def network_for(options):
    if os.environ.get(NETWORK, "").strip().lower() in ("0", "off", "false", "no"):
        return False
    return (options or {}).get("network", True) is not False


def outline(name, options):
    """Pack `name`'s sandbox as far as its options and the kernel decide
    it (no paths): a Plan whose state is "sandboxed" where it will be.
    What status and the start line show before a worker started."""
    mode, said = mode_for(options)
    network = network_for(options)
    if mode == "off":
        return Plan(name, mode, "off", said, network)
    level = abi()
    if level <= 0:
        if mode == "required":
            return Plan(name, mode, "refused", f"{said} and this kernel has no Landlock", network)
        return Plan(name, mode, "unavailable", "this kernel has no Landlock", network)
    return Plan(name, mode, "sandboxed", f"Landlock ABI {level}" + ("" if network else ", network off"), network,
                abi=level)


def state_of(rt):
    """The sandbox of a PackRuntime's worker: its last start's plan, else
    its outline."""
    got = getattr(rt, "sandbox", None)
    return got if got is not None else outline(rt.name, rt.options)


def plan(name, pack_dir, python, options, comfyui, folders=None, pythonpath=(), worker_env=None):
    """The sandbox of pack `name` (its folder, its worker's interpreter,
    its [bulkhead] options, ComfyUI's base, folder_paths as
    channel.formats.host_folders() gives it, the worker's PYTHONPATH and
    the environment the host gives it: its ledger, the other packs'
    serializers it loads)."""
    first = outline(name, options)
    mode, network, level = first.mode, first.network, first.abi
    if first.state == "off":
        say_once(("off", name), logging.INFO, "bulkhead: pack %r runs unsandboxed: %s", name, first.why)
    if first.state == "unavailable":
        say_once("no-landlock", logging.WARNING, "bulkhead: %s", NO_LANDLOCK)
    if not first.active:
        return first
    home = _home()
    pack_dir = os.path.abspath(pack_dir)

    def computed(paths):
        return [p for p in paths if p and not _too_wide(p, home)]

    read = list(SYSTEM_READ)
    read += computed(_interpreter_dirs(python))
    read += computed([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix])
    read += computed([p for p in sys.path if p and os.path.isdir(p)])
    read += computed(list(pythonpath))
    try:   # [[pack, serialization.py], ...]: another pack's serializer is read (worker/typed.py)
        read += [str(f) for _, f in json.loads((worker_env or {}).get(SERIALIZERS) or "[]")]
    except (ValueError, TypeError):
        pass
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # host/ -> bulkhead/
    read += computed([pkg, os.path.realpath(pkg)])
    if comfyui:
        read += computed([comfyui])
        # A base directory whose entries link elsewhere (ComfyUI's code
        # shared between bases, its models on another disk): a rule holds
        # on the file a path resolves to, so the targets are named too.
        try:
            entries = [os.path.join(comfyui, e) for e in os.listdir(comfyui)]
        except OSError:
            entries = []
        read += computed([os.path.realpath(e) for e in entries if os.path.islink(e)])

    write = [pack_dir]
    data = []
    folders = folders or {}
    # A part of a pack (a sub-folder with its own config) writes into the
    # pack's whole folder, as the pack does: the folder custom_nodes holds.
    for nodes_dir in ((folders.get("folders") or {}).get("custom_nodes") or [[]])[0]:
        rel = os.path.relpath(os.path.realpath(pack_dir), os.path.realpath(str(nodes_dir)))
        if rel != "." and not rel.startswith(".."):
            write.append(os.path.join(os.path.realpath(str(nodes_dir)), rel.split(os.sep)[0]))
    for key, entry in (folders.get("folders") or {}).items():
        if key in NOT_DATA:
            continue
        try:
            data += [str(p) for p in entry[0]]
        except (TypeError, IndexError):
            continue
    for d in (folders.get("dirs") or {}).values():
        try:   # ComfyUI makes them as it needs them; a rule needs them now
            os.makedirs(str(d), exist_ok=True)
        except OSError:
            pass
        data.append(str(d))
    if folders.get("models_dir"):
        data.append(str(folders["models_dir"]))
    code = os.path.realpath(comfyui) if comfyui else None
    write += [p for p in computed(data)
              if not code or not os.path.join(code, "").startswith(os.path.join(os.path.realpath(p), ""))]
    write += computed(_caches())
    tmp = private_tmp(name)
    write.append(tmp)
    write.append("/dev/shm")
    ledger = (worker_env or {}).get(LEDGER) or os.environ.get(LEDGER)
    if ledger:   # the file itself (it exists: the host made it), and its folder where not too wide
        ledger = os.path.abspath(ledger)
        write += [ledger] + computed([os.path.dirname(ledger)])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        write.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "bulkhead-ledger"))

    o = options or {}
    read += [_user_path(p, None) for p in _paths(os.environ.get(SANDBOX_READ))]
    write += [_user_path(p, None) for p in _paths(os.environ.get(SANDBOX_WRITE))]
    read += [_user_path(p, pack_dir) for p in o.get("sandbox_read", ())]
    write += [_user_path(p, pack_dir) for p in o.get("sandbox_write", ())]

    devices = list(DEVICES) + sorted(glob.glob("/dev/nvidia*"))
    read += computed([os.path.realpath(p) for p in read])
    write += computed([os.path.realpath(p) for p in write])
    _touch_in_use(python)
    return Plan(name, mode, "sandboxed", first.why, network, _dedup(read), _dedup(write), devices, tmp, level)


def _touch_in_use(python):
    """The environment's in-use lock file, made here where missing: the
    worker opens it read-only to hold its shared lock (envlock.hold), and
    its sandbox would refuse making it."""
    env = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.exists(os.path.join(env, envlock.STAMP)):
        try:
            os.close(os.open(os.path.join(env, envlock.IN_USE), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError:
            pass


def _dedup(paths):
    seen, out = set(), []
    for p in paths:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def refusal_hint(name, config, path, write):
    """The line for the log where pack `name`'s worker was refused `path`:
    the config line that would allow it."""
    key = "sandbox_write" if write else "sandbox_read"
    where = config or "its comfy-env.toml"
    return (f"bulkhead: pack {name!r} was refused {'writing' if write else 'reading'} {path} by its sandbox; "
            f"if it needs it, add {key} = [\"{os.path.dirname(path) if write else path}\"] under [bulkhead] in "
            f"{where} (BULKHEAD_SANDBOX_{'WRITE' if write else 'READ'} for every pack), or sandbox = \"off\" there")
