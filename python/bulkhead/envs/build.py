"""Per-pack environments: finding an interpreter, building a venv with a
pack's requirements, and telling whether a built one may be used.

Layout.  Everything lives in one per-user workspace, ``workspace()``:
``$BULKHEAD_HOME``, else ``$XDG_DATA_HOME/bulkhead``, else
``~/.local/share/bulkhead``::

    <workspace>/envs/<name>-<hash12>/            one environment per config
    <workspace>/envs/<name>-<hash12>/bin/python  the worker's interpreter
    <workspace>/envs/<name>-<hash12>/bulkhead-stamp.json
    <workspace>/envs/.<name>-<hash12>.lock       serialises installs of it
    <workspace>/envs/.<name>-<hash12>.tmp-XXXX   a build in progress

``<hash12>`` is the start of the config's ``config_hash`` (envs/config.py):
a config whose requirements or python change gets a new directory, and the
old one is then found as STALE by the config path its stamp records.

What an environment holds: the pack's requirements plus what an
in-process pack sees, matched to the host (envs/hostmatch.py: the host's
torch, comfy-aimdo, comfy-kitchen and every requirement of ComfyUI's
requirements.txt -- shared read-only under the host's Python minor,
installed at the host's versions under another, where what cannot be had
is left out with one warning: ``_install_host_versions``).  A build that
fails is remembered (``failed_before``): ComfyUI's start does not try it
again until something it depends on changes.  bulkhead itself is NOT installed there -- a worker imports it
from the host through PYTHONPATH (``host.workerenv.worker_pythonpath``), so the host
and its workers can never disagree about bulkhead's version.

Building (``build``, ``install``): under an fcntl lock on the lock file (a
second install of the same environment waits, then finds it built), in a
temporary directory next to the target: find the interpreter, ``python -m
venv`` (``uv venv`` where uv is found: on PATH or beside this Python, as
requirements.txt installs it; ``find_uv``), install the requirements with pip
(``uv pip``), rewrite the temporary path in ``bin/`` scripts to the final
one, write the stamp (tmp + rename), and rename the directory into place.
A config with conda packages gets them first, in a conda prefix
``<env>/conda`` inside the temporary directory (envs/conda.py), then its
PyPI packages, so the rename commits both.
The stamp is written last and the rename is the commit: a failed or killed
install leaves only a ``.tmp-`` directory, which no check mistakes for an
environment and the next install of that environment removes.  An
environment a rebuild replaces (the config changed: another directory)
while a worker runs on it is kept for that worker and marked with the new
one (``SUPERSEDED``); the worker's next generation starts in the new one
(``current_python``, which the host's workers resolve at each start), and
a later build removes the old one once nothing runs there.

Checking (``env_status``): ready, missing, stale (the config or the
host's matched set changed),
foreign (built for another bulkhead protocol, or its interpreter is gone or
changed minor version) or broken (no readable stamp, a python that does not
run).  Every state but ready carries the command that rebuilds it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from importlib import metadata
from typing import Optional

from .. import __version__, _native
from . import config as packconfig
from . import rootconfig
from . import hostmatch
from .hostmatch import InvalidRequirement, Requirement
from .errors import EnvBuildError, short
from .interpreters import PROBE_ENV, clean_env, find_interpreter, find_uv, probe
from .config import PackConfigError
from ..channel.spec import HOME, INSTALLER, PIP_ARGS
from ..envlock import STAMP, holders as _lock_holders   # STAMP: the name a worker looks for too

STAMP_FORMAT = 1
STATES = ("ready", "missing", "stale", "foreign", "broken")


@dataclasses.dataclass(frozen=True)
class EnvStatus:
    """Where a config's environment stands.

    ``state``   one of STATES.
    ``python``  the environment's interpreter (for ``Worker``) when it has
                one, else None.
    ``reason``  why it is in that state, in words.
    ``fix``     the command that (re)builds it; empty when ready.
    ``host_changed``  stale only because the host changed (its torch, its
                ComfyUI's requirements, bulkhead's host matching): nothing
                of the pack's own did, so a start may rebuild it.
    """

    state: str
    python: Optional[str]
    reason: str
    fix: str
    name: str = ""
    env_dir: str = ""
    config_path: str = ""
    version: str = ""
    host_changed: bool = False

    @property
    def ok(self):
        return self.state == "ready"

    def __str__(self):
        text = f"{self.name}: {self.state}: {self.reason}"
        return text + (f"\n  {self.fix}" if self.fix else "")


# --- places ---

def workspace():
    """The per-user workspace directory (it may not exist yet)."""
    home = os.environ.get(HOME)
    if home:
        return os.path.abspath(os.path.expanduser(home))
    data = os.environ.get("XDG_DATA_HOME")
    if not data or not os.path.isabs(data):     # XDG: a relative value is to be ignored
        data = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "bulkhead")


# Every entry bulkhead makes in the workspace, and nothing else:
# `bulkhead uninstall` removes these (cli/uninstall.py), never the
# workspace by its name ($BULKHEAD_HOME may be a folder the user keeps other
# things in).  tests/py/test_cli.py checks that each join(workspace(), name)
# in the sources is listed here.
WORKSPACE_ENTRIES = ("envs", "host", "failed", "conda-pkgs", "logs")


def _safe_name(name):
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "pack"
    return s[:80]


def env_dir(config):
    """The directory of ``config``'s environment (it may not exist)."""
    return os.path.join(workspace(), "envs", f"{_safe_name(config.name)}-{config.hash12}")


def env_python(directory):
    return os.path.join(directory, "bin", "python")


def rebuild_command(config_or_root):
    """The command line that builds a pack's environments, as text."""
    root = getattr(config_or_root, "root", config_or_root)
    return f"bulkhead install {shlex.quote(os.fspath(root))}"


def _fix_text(config, verb="rebuild"):
    q = shlex.quote(config.root)
    return (f"{verb} it with: bulkhead install {q}  (same as: python -m bulkhead install {q}; "
            f"from Python: bulkhead.install({config.root!r}))")





# --- environments in use ---

# A file in an environment that a rebuild replaced (its config changed, so
# the new one has another directory) while a worker still ran on it: the
# replacing environment's directory.  The old one is kept for that worker;
# the worker's next generation starts in the new one (current_python), and
# a later build removes the old one once nothing runs there.
SUPERSEDED = "bulkhead-superseded-by"


def users(directory):
    """Pids of the processes using the environment at ``directory``: those
    running one of its interpreters (argv[0] under it) and the workers
    holding its in-use lock (envlock: a worker a zygote forked runs the
    zygote's interpreter)."""
    prefixes = tuple({os.path.join(os.path.abspath(directory), ""), os.path.join(os.path.realpath(directory), "")})
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if argv0.startswith(prefixes):
            out.append(int(pid))
    return sorted(set(out) | set(_lock_holders(directory)))


def current_python(python):
    """The interpreter a new worker should run for ``python``: itself, or,
    where its environment was replaced by a rebuild while a worker ran on
    it, the replacing environment's interpreter (followed to the newest)."""
    seen = set()
    while True:
        d = os.path.dirname(os.path.dirname(python))
        try:
            with open(os.path.join(d, SUPERSEDED), encoding="utf-8") as f:
                newer = f.read().strip()
        except OSError:
            return python
        cand = env_python(newer) if newer else ""
        if not newer or newer in seen or not os.access(cand, os.X_OK):
            return python
        seen.add(newer)
        python = os.path.join(newer, "bin", os.path.basename(python))
        if not os.access(python, os.X_OK):
            python = cand


def _retire(old, final, progress):
    """An environment replaced by ``final``: removed, or, while workers run
    on it, kept for them and marked as replaced."""
    live = users(old)
    if not live:
        progress(f"removing the environment this config was built into before: {old}")
        _remove(old)
        return
    tmp = os.path.join(old, SUPERSEDED + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(final + "\n")
    os.replace(tmp, os.path.join(old, SUPERSEDED))
    progress(f"keeping {old}: worker pid(s) {', '.join(map(str, live))} run on it; they keep it until they "
             f"restart, and a restart picks up {final} (a later install removes the old one)")


# --- stamps and status ---

def read_stamp(directory):
    """The stamp of an environment directory as a dict, or None when it
    has none or it cannot be read."""
    try:
        with open(os.path.join(directory, STAMP), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


# user:password@ (or token@) in a URL: what pip masks in its own log.
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(value):
    """``value`` (a stamp: dicts, lists, strings) with the credentials of
    every URL in it replaced by ``****`` (``https://****@host/simple``):
    an index URL in BULKHEAD_PIP_ARGS or a config may carry a token."""
    if isinstance(value, str):
        return _USERINFO.sub("****@", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def _write_stamp(directory, stamp):
    """The stamp, credentials redacted, readable by this user only."""
    path = os.path.join(directory, STAMP)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(redact(stamp), f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _siblings(config):
    """Other environment directories built from the same config file."""
    envs = os.path.join(workspace(), "envs")
    pat = re.compile(re.escape(_safe_name(config.name)) + r"-[0-9a-f]{12}\Z")
    mine = os.path.basename(env_dir(config))
    out = []
    try:
        names = sorted(os.listdir(envs))
    except OSError:
        return out
    for n in names:
        if n != mine and pat.match(n):
            d = os.path.join(envs, n)
            s = read_stamp(d)
            if s is not None and s.get("config") == config.path:
                out.append((d, s))
    return out


def env_status(config):
    """Where ``config``'s environment stands, as an ``EnvStatus``.  Runs
    the environment's python once (to see that it runs and which version
    it is); builds nothing."""
    d = env_dir(config)
    py = env_python(d)
    P = _native.PROTOCOL_VERSION

    def status(state, reason, python=None, version=""):
        fix = "" if state == "ready" else _fix_text(config, "build" if state == "missing" else "rebuild")
        return EnvStatus(state, python, reason, fix, config.name, d, config.path, version)

    if not os.path.isdir(d):
        for sib, s in _siblings(config):
            if s.get("protocol") != P:
                return status("foreign", f"the environment {sib} was built for bulkhead protocol "
                                         f"{s.get('protocol')}; this bulkhead speaks protocol {P}")
            return status("stale", f"{config.path} changed since {sib} was built "
                                   f"(config hash {str(s.get('config_hash'))[:12]}, now {config.hash12})")
        return status("missing", f"no environment has been built for {config.path} (it would be {d})")
    s = read_stamp(d)
    if s is None:
        return status("broken", f"{d} has no readable {STAMP} (an install was interrupted or the "
                                "directory was changed by hand)")
    if s.get("protocol") != P:
        return status("foreign", f"{d} was built for bulkhead protocol {s.get('protocol')}; this "
                                 f"bulkhead speaks protocol {P}")
    interp = s.get("interpreter") or {}
    ipath, iver = str(interp.get("path", "")), str(interp.get("version", ""))
    if not ipath or not os.path.exists(ipath):
        return status("foreign", f"the interpreter {d} was built with ({ipath or 'unrecorded'}, "
                                 f"Python {iver or '?'}) is gone")
    try:
        now = probe(py, PROBE_ENV)[0].strip()
    except (OSError, subprocess.SubprocessError) as e:
        err = (getattr(e, "stderr", None) or str(e)).strip()
        return status("broken", f"{py} does not run: {err.splitlines()[-1] if err else e}")
    if now.split(".")[:2] != iver.split(".")[:2]:
        return status("foreign", f"the interpreter {d} was built with ({ipath}) changed version: "
                                 f"built with Python {iver}, now {now}", py, now)
    if s.get("config_hash") != config.config_hash:
        return status("stale", f"{config.path} changed since {d} was built "
                               f"(config hash {str(s.get('config_hash'))[:12]}, now {config.hash12})", py, now)
    host = hostmatch.stale_reason(s.get("host"), config, rebuild_command(config))
    if host:
        return dataclasses.replace(status("stale", host, py, now), host_changed=True)
    return status("ready", f"built {s.get('created', '?')} with Python {now} ({ipath})", py, now)


def previous_env(config):
    """The environment an earlier version of ``config`` (the same file,
    another config hash: its comfy-env.toml changed since) was built into,
    where this bulkhead can still run it (its protocol, its interpreter
    there) and no newer one replaced it: an ``EnvStatus`` whose state is
    "stale", with its ``python``, ``env_dir`` and ``version`` (the stamp's
    interpreter version); the newest such, or None.  What keeps serving a
    pack while its changed config is rebuilt into a new directory
    (host/pack.py); running nothing, it does not prove the python runs."""
    P = _native.PROTOCOL_VERSION
    best = None
    for d, s in _siblings(config):
        interp = s.get("interpreter") or {}
        if s.get("protocol") != P or os.path.exists(os.path.join(d, SUPERSEDED)) or \
                not os.access(env_python(d), os.X_OK) or not os.path.exists(str(interp.get("path", ""))):
            continue
        created = s.get("created_unix")
        key = float(created) if isinstance(created, (int, float)) else 0.0
        if best is None or key > best[0]:
            best = (key, d, s, str(interp.get("version", "")))
    if best is None:
        return None
    _, d, s, version = best
    return EnvStatus("stale", env_python(d), f"{config.path} changed since {d} was built (config hash "
                     f"{str(s.get('config_hash'))[:12]}, now {config.hash12})", _fix_text(config), config.name, d,
                     config.path, version)


# --- building ---

def _default_progress(name):
    def progress(line):
        print(f"[bulkhead install {name}] {line}", file=sys.stderr, flush=True)
    return progress


def _pip_args(pip_args):
    if pip_args is None:
        return shlex.split(os.environ.get(PIP_ARGS, ""))
    if isinstance(pip_args, str):
        return shlex.split(pip_args)
    return [os.fspath(a) for a in pip_args]


def _without_index_args(args):
    """pip arguments less those choosing where packages come from
    (--no-index, --index-url, --extra-index-url, --find-links): for an
    install from one named index."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--no-index",):
            continue
        if a in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links"):
            skip = True
            continue
        if a.startswith(("--index-url=", "--extra-index-url=", "--find-links=")):
            continue
        out.append(a)
    return out


# --- builds side by side: what each command waits for ---
#
# A process that builds several environments at once (ComfyUI's
# background builds, host/building.py) bounds them by what each command
# uses: one that downloads from an index (a pip or uv install that may
# reach one: ``indexes_of``) takes that index's one download stream,
# every other one a CPU slot.  ``gate``, set by that pool, is what
# ``_stream`` holds around each command it runs; None (`bulkhead
# install`, a script's build) runs every command at once.  A download's
# stream is let go as soon as the installer says its downloads are done
# (``DOWNLOADS_DONE``: uv's "Prepared N packages", pip's "Installing
# collected packages"), so that the next build downloads while this one
# installs.

DEFAULT_INDEX = "the default index"     # indexes_of's name for the index an installer uses unless told one
gate = None     # gate(indexes, say) -> a context manager held while the command runs; say(line): the build's stream
DOWNLOADS_DONE = ("Prepared ", "Installing collected packages")   # the installer's line after its last download

_MAIN_INDEX_ARGS = ("-i", "--index-url", "--default-index")
_MORE_INDEX_ARGS = ("--extra-index-url", "--index", "-f", "--find-links")


def indexes_of(cmd, env=None):
    """The indexes (URLs, redacted; ``DEFAULT_INDEX`` for the one an
    installer uses unless told one) that ``cmd`` may download from: a
    ``pip install`` or ``uv pip install`` without --no-index or
    --offline, reading its index arguments, then the environment's
    (``env``, default ``clean_env()``) PIP_/UV_ index variables; [] for
    any other command.  A --find-links folder is not an index."""
    cmd = [os.fspath(c) for c in cmd]
    at = next((i for i in range(len(cmd) - 1) if cmd[i] == "pip" and cmd[i + 1] == "install"), None)
    if at is None or "--no-index" in cmd or "--offline" in cmd:
        return []
    env = clean_env() if env is None else env
    uv = at > 0 and os.path.basename(cmd[0]).startswith("uv")
    main, more = None, []
    args = cmd[at + 2:]
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name in _MAIN_INDEX_ARGS:
            main = value
        elif name in _MORE_INDEX_ARGS:
            more.append(value)
    if main is None:
        main = (env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL")) if uv else None
        main = main or env.get("PIP_INDEX_URL") or DEFAULT_INDEX
    for var in (("UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS") if uv else ()) + \
            ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        more += env.get(var, "").split()
    urls = [main] + [u for u in more if "://" in u and not u.startswith("file:")]
    return sorted({redact(u.rstrip("/")) for u in urls})


def _stream(cmd, progress, what, tail_lines=40, env=None):
    """Runs ``cmd``, handing each output line (stdout and stderr merged) to
    ``progress``.  Raises EnvBuildError with the output's tail when it
    fails.  On any exception (KeyboardInterrupt included) the command is
    killed and reaped before the exception goes on."""
    tail = collections.deque(maxlen=tail_lines)
    # The command's own lines (pip's stream) go to progress.stream where
    # it has one: the build's log file and a panel's "what is known", not
    # ComfyUI's log (build's _Teed, host/building.py).
    out = getattr(progress, "stream", progress)
    held = gate(indexes_of(cmd, env), out) if gate is not None else contextlib.nullcontext()
    with held as g:
        return _run_streamed(cmd, out, what, tail, env, getattr(g, "downloaded", None))


def _run_streamed(cmd, out, what, tail, env, downloaded=None):
    """_stream's command, run once what it waits for (``gate``) is held;
    downloaded(), where given, is called at the installer's line that says
    its downloads are done (``DOWNLOADS_DONE``)."""
    if _stopping.is_set():
        raise BuildStopped(f"{what}: not started: this process is stopping (the build is not remembered as "
                           "failed; the next start or `bulkhead install` builds it)")
    try:
        # Its own process group: stop_builds ends the command and what it
        # started (uv's build backends) together.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env or clean_env(), universal_newlines=True,
                                errors="replace", bufsize=1, start_new_session=True)
    except OSError as e:
        raise EnvBuildError(f"{what}: cannot run {cmd[0]}: {e.strerror}") from None
    with _running_lock:
        _running.add(proc)
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            out(line)
            if downloaded is not None and line.lstrip().startswith(DOWNLOADS_DONE):
                downloaded()
                downloaded = None
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        with _running_lock:
            _running.discard(proc)
        proc.stdout.close()
    if _stopping.is_set():
        raise BuildStopped(f"{what} was stopped: this process is stopping (the build is not remembered as "
                           "failed; the next start or `bulkhead install` builds it)")
    if rc != 0:
        text = "\n".join(tail)
        raise EnvBuildError(f"{what} failed (exit status {rc})" +
                            (f"\n--- last lines of its output ---\n{text}" if text else ""), text, rc)


# The commands _stream runs now (stop_builds ends them), and whether this
# process is stopping (then no command starts, and one ended is not a
# failure of the build).
_running = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def stop_builds():
    """Ends every build command of this process, with what each started,
    and keeps new ones from starting: for a ComfyUI that stops while
    environments build in its background (host/building.py).  The
    builds end with ``BuildStopped``, which is not remembered as a
    failure; each leaves only its ``.tmp-`` directory."""
    _stopping.set()
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        if proc.poll() is None:
            _kill_group(proc)


class BuildStopped(EnvBuildError):
    """The build was stopped because its process is stopping
    (``stop_builds``): nothing is remembered as failed."""


def _relocate(tmp, final):
    """Rewrites the temporary directory's path to the final one where a
    venv records its own location: script shebangs and activate scripts in
    bin/, and pyvenv.cfg."""
    pairs = [(tmp.encode(), final.encode()),
             (os.path.basename(tmp).encode(), os.path.basename(final).encode())]
    files = [os.path.join(tmp, "pyvenv.cfg")]
    bindir = os.path.join(tmp, "bin")
    if os.path.isdir(bindir):
        files += [os.path.join(bindir, n) for n in os.listdir(bindir)]
    for p in files:
        if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) > (1 << 20):
            continue
        with open(p, "rb") as f:
            data = f.read()
        if b"\0" in data and not data.startswith(b"#!"):
            continue
        fixed = data
        for old, new in pairs:
            fixed = fixed.replace(old, new)
        if fixed != data:
            mode = os.stat(p).st_mode
            with open(p, "wb") as f:
                f.write(fixed)
            os.chmod(p, mode)


class EnvBusy(EnvBuildError):
    """Another install of the environment held its lock past the wait
    allowed (``build(lock_timeout_s=...)``): nothing was tried, and nothing
    is remembered as failed."""


class _Lock:
    """An exclusive fcntl lock on a file, held while in the ``with``;
    waited for up to timeout_s (None: as long as it takes), then EnvBusy."""

    def __init__(self, path, progress, name, timeout_s=None):
        self.path, self.progress, self.name, self.fd = path, progress, name, -1
        self.timeout_s = timeout_s

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.progress(f"waiting for another install of {self.name} (lock {self.path})")
                if self.timeout_s is None:
                    fcntl.flock(self.fd, fcntl.LOCK_EX)
                else:
                    deadline = time.monotonic() + self.timeout_s
                    while True:
                        try:
                            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                            break
                        except BlockingIOError:
                            if time.monotonic() >= deadline:
                                raise EnvBusy(f"another install of {self.name} has held its lock ({self.path}) "
                                              f"for over {self.timeout_s:g} s; let it finish, or run "
                                              "`bulkhead install` once it has") from None
                            time.sleep(0.2)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        self.fd = -1


def _remove(path):
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):       # a file, or what rmtree could not take
        try:
            os.unlink(path)
        except OSError:
            pass


def _last_error(output_tail):
    """What pip's (uv's) output says made it fail: its first error line
    (pip's first ``ERROR:`` names the requirement; a later one only points
    at the docs), with uv's reason (``╰─▶`` and what continues it) or its
    innermost ``Caused by``."""
    lines = [l.strip() for l in (output_tail or "").splitlines() if l.strip()]
    for i, l in enumerate(lines):
        if l.startswith(("ERROR:", "error:", "\u00d7")):
            after = lines[i + 1:]
            if after and after[0].startswith("\u2570\u2500\u25b6"):
                why = [after[0][3:].strip()]
                for c in after[1:]:
                    if c.startswith(("hint:", "\u2570", "Caused by")):
                        break
                    why.append(c)
                return " ".join(why)
            cause = [c for c in after if c.startswith("Caused by:")]
            return l + (f" ({cause[-1]})" if cause else "")
    return lines[-1] if lines else "no output"


def first_line(error):
    """An error's first line: what a one-line report of it says (the
    whole text goes to the log); for a failed pip (uv), with what its
    output says made it fail (the requirement it could not resolve, and
    why), which the first line only points at."""
    line = (str(error).splitlines() or [""])[0]
    tail = getattr(error, "output_tail", "")
    if tail and getattr(error, "returncode", None) is not None:
        why = redact(_last_error(tail)).rstrip(".")
        if why and why not in line:
            line = f"{line}: {why}"
    return line


def _pip_or_reason(pip, extra, what):
    """None when ``pip(extra, what)`` installed; else what pip's output
    says made it fail (pip itself not running is raised)."""
    try:
        pip(extra, what)
        return None
    except EnvBuildError as e:
        if e.returncode is None:
            raise
        return _last_error(e.output_tail)


def _install_host_versions(match, args, pip, progress):
    """Installs ``match.install`` (the host's versions, under another
    minor): each of the host's local builds from where it may be
    (``match.sources``, in order), the rest in one pip call, then one at a
    time if that fails.  A pin pip cannot install alone is resolved for
    this minor where it may be (``match.relaxed``: its bare name, added to
    ``match.resolve``).  What cannot be installed is left out with one
    warning (a pack that never imports it keeps its isolation).  Returns
    {pin: pip's reason} of what is left out."""
    lacking = {}
    for p, sources in match.sources.items():
        tried = []
        for src, where in sources:
            progress(f"installing the host's build {p} (looking in {where})")
            why = _pip_or_reason(pip, args + list(src) + [p], f"the host's build {p}")
            if why is None:
                break
            tried.append(f"{where}: {why}")
        else:
            lacking[p] = "no build for this Python in " + "; ".join(tried)
    rest = [p for p in match.install if p not in match.sources]
    if lacking:
        skipped = [p for p in match.needing([hostmatch.pin_name(p) for p in lacking]) if p in rest]
        lacking.update((p, f"it requires {', '.join(lacking)}") for p in skipped)
        rest = [p for p in rest if p not in skipped]
    if rest:
        progress(f"installing the host's versions: {' '.join(rest)}")
        if _pip_or_reason(pip, args + rest, "the host's versions") is not None:
            progress("installing the host's versions one at a time, to find which ones pip cannot install")
            for p in rest:
                why = _pip_or_reason(pip, args + [p], f"the host's {p}")
                bare = match.relaxed(p) if why is not None else None
                if bare is not None:
                    progress(f"the host's {p.replace('==', ' ')} cannot be installed under this Python ({why}): "
                             f"resolving {bare} for it")
                    if _pip_or_reason(pip, args + [bare], f"{bare}, resolved for this Python") is None:
                        match.resolve[bare] = f"pip could not install the host's {p[len(bare):].lstrip('=')} here"
                        why = None
                if why is not None:
                    lacking[p] = why
    if lacking:
        names = ", ".join(p.replace("==", " ") for p in lacking)
        progress(f"warning: this environment lacks the host's {names}, which an in-process pack has "
                 f"({'; '.join(f'{p}: {why}' for p, why in lacking.items())}). The "
                 "pack's worker cannot import them (`import torch` and ComfyUI's own modules that need "
                 "them fail there); a pack that never imports them runs isolated as it is. Fix: put "
                 f"builds for this Python where pip looks ({hostmatch.TORCH_INDEX}, BULKHEAD_PIP_ARGS), "
                 f"or give the pack the host's Python minor ({sys.version_info[0]}.{sys.version_info[1]})")
    return lacking


# A script printing the installed versions of the names put in for %r (of
# those installed) as one JSON line.
_VERSIONS_OF = ("import importlib.metadata as m, json\nout = {}\nfor n in %r:\n    try:\n"
                "        out[n] = m.version(n)\n    except m.PackageNotFoundError:\n        pass\n"
                "print(json.dumps(out))")


def _match_host(match, config, tmp, py, args, pip, progress, uv=None):
    """Gives the environment being built at ``tmp`` what ``match`` (a
    hostmatch.Plan) says it gets from the host: the shared farm on its path,
    the host's versions installed; returns the pip arguments that keep the
    pack's requirements to the host's torch.  uv: the uv binary when it
    is the installer (it gets the shared distributions' markers)."""
    for line in match.notes:
        progress(line)
    if match.share:
        site, seeded = probe(py, "import sysconfig, json, importlib.metadata as m; "
                                  "print(sysconfig.get_path('purelib')); "
                                  "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")[:2]
        site = site.strip()
        # What venv seeded (setuptools on 3.11) would shadow the host's
        # copy (pip would then replace it for torch's requirement): the
        # host's is the one.
        shadow = [n for n, v in json.loads(seeded).items()
                  if hostmatch.canonical(n) in match.stamp["shared"] and match.stamp["shared"][hostmatch.canonical(n)] != v]
        if shadow:
            progress(f"removing the venv's own {', '.join(shadow)}: the host's are shared")
            _stream(([uv, "pip", "uninstall", "--python", py] if uv else [py, "-m", "pip", "uninstall", "-y", "-q"])
                    + shadow, progress, "pip uninstall")
        farm = hostmatch.build_farm(match.share, os.path.join(workspace(), "host"))
        hostmatch.write_pth(site, farm)
        if uv:   # uv reads only site-packages itself, not what a .pth adds: it must see them installed
            hostmatch.write_markers(site, match.share)
        match.stamp["farm"] = farm
        progress(f"sharing the host's {', '.join(f'{n} {v}' for n, v in match.stamp['shared'].items())} "
                 f"read-only ({farm})")
    if match.install:
        match.stamp["lacking"] = _install_host_versions(match, args, pip, progress)
        if match.resolve:
            # What the resolver picked, said once: the host's versions these stand for are in the notes.
            got = json.loads(probe(py, _VERSIONS_OF % sorted(match.resolve))[0])
            match.stamp["resolved"] = got
            progress("resolved for this Python: " + "; ".join(
                f"{n} {got.get(n, 'not installed')} ({why})" for n, why in sorted(match.resolve.items())))
    if not match.constraints:
        return []
    cfile = os.path.join(tmp, "bulkhead-host-constraints.txt")
    with open(cfile, "w", encoding="utf-8") as f:
        f.write("\n".join(match.constraints) + "\n")
    return ["-c", cfile]


# --- failed builds, remembered ---

def _failure_path(config):
    return os.path.join(workspace(), "failed", os.path.basename(env_dir(config)) + ".json")


def _failure_key(config):
    """What a failed build is remembered against: the config, the host's
    matched set and bulkhead; any change is worth another try."""
    mode = config.options.get("host_packages", "match")
    return {"config_hash": config.config_hash, "bulkhead_version": __version__,
            "host": hostmatch.fingerprint(hostmatch.comfyui_for(config), mode)}


def failed_before(config):
    """The record of this config's last build, when it failed and nothing
    it depends on changed since ({"error": first line, "created": time,
    ...}), else None.  ComfyUI's start does not retry such a build
    (host/pack.py); ``bulkhead install`` does."""
    try:
        with open(_failure_path(config), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != json.loads(json.dumps(_failure_key(config))):
        return None
    return rec


def _remember_failure(config, error):
    path = _failure_path(config)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": _failure_key(config), "config": config.path,
                       "error": first_line(error), "log": getattr(error, "log_path", None),
                       "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}, f)
        os.replace(tmp, path)
    except OSError:
        pass        # a failure not remembered is only tried again


def _forget_failure(config):
    try:
        os.unlink(_failure_path(config))
    except OSError:
        pass


# --- each build's log ---

KEEP_LOGS = 5       # the log files kept per environment (the newest)


def logs_dir(config):
    """Where the log files of config's builds are: one per build, named by
    its start time, the newest ``KEEP_LOGS`` kept."""
    return os.path.join(workspace(), "logs", os.path.basename(env_dir(config)))


def last_log(config):
    """The path of the log of config's newest build (any process's: a
    ComfyUI's background build, ``bulkhead install``), or None."""
    d = logs_dir(config)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".log"))
    except OSError:
        return None
    return os.path.join(d, names[-1]) if names else None


class _Teed:
    """A build's progress: every line (bulkhead's own and, through
    ``stream``, the output of the commands it runs) written to the build's
    log file, and handed on: bulkhead's lines to ``progress``, the
    commands' to ``progress.stream`` where it has one, else to progress
    too.  The file is made when the build begins (``begin``: an
    environment found ready makes none, so the newest log is a build's);
    the lines before are kept for it.  ``progress.log_path``, where it has
    one, is set to the file's then."""

    def __init__(self, progress, path):
        self.progress, self.path = progress, path
        self.file = None
        self.before = []
        self.stream_to = getattr(progress, "stream", progress)

    def begin(self):
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8", errors="replace")
        except OSError as e:
            self.progress(f"warning: the build's log cannot be written ({self.path}: {e.strerror}); "
                          "its output is not kept")
        if hasattr(self.progress, "log_path"):
            self.progress.log_path = self.path if self.file is not None else None
        if self.file is not None:
            self.progress(f"the whole output goes to {self.path}")
        for line in self.before:
            self._write(line)
        self.before = None

    def _write(self, line):
        if self.before is not None:
            self.before.append(line)
        elif self.file is not None:
            try:
                self.file.write(redact(line) + "\n")
                self.file.flush()
            except (OSError, ValueError):
                pass

    def __call__(self, line):
        self._write(line)
        self.progress(line)

    def stream(self, line):
        self._write(line)
        self.stream_to(line)

    def close(self):
        if self.file is None:
            return
        self.file.close()
        d = os.path.dirname(self.path)
        try:
            old = sorted(n for n in os.listdir(d) if n.endswith(".log"))[:-KEEP_LOGS]
        except OSError:
            old = []
        for n in old:
            try:
                os.unlink(os.path.join(d, n))
            except OSError:
                pass


def brief(error, log_path=None, limit=200):
    """One line for a failed build in a log a person reads, at most
    ``limit`` characters where its log's path leaves room: what made it
    fail (pip's or uv's first error line, else the error's first line),
    cut to fit, and where the whole output is (its log file, whole: a
    path is copied, never cut)."""
    where = log_path or getattr(error, "log_path", None)
    tail = f" (log: {where})" if where else ""
    out = getattr(error, "output_tail", "")
    line = (redact(_last_error(out)) if out and getattr(error, "returncode", None) is not None else "") or \
        (str(error).splitlines() or [""])[0]
    return short(line, max(40, limit - len(tail))) + tail


def build(config, progress=None, force=False, *, pip_args=None, lock_timeout_s=None):
    """Builds ``config``'s environment unless it is ready (or rebuilds it
    when ``force``).  ``progress(line)`` gets every line of progress
    (default: stderr, prefixed ``[bulkhead install <name>]``); ``pip_args``
    (a list or a shell-quoted string) go to pip/uv before the
    requirements, default ``$BULKHEAD_PIP_ARGS``.  Returns the
    ``EnvStatus`` afterwards (ready).  Raises ``InterpreterNotFound``,
    ``EnvBuildError``, ``PackConfigError``; leaves nothing behind when it
    fails but the failure's record (``failed_before``).  lock_timeout_s:
    how long to wait for another install of the same environment (None:
    as long as it takes), then ``EnvBusy``.  Every line of it, the
    commands' output included, goes to a log file of its own
    (``logs_dir``, ``last_log``); an error raised carries its path
    (``log_path``)."""
    # To the microsecond: two builds of one environment within a second (a
    # Retry then a Rebuild from the panel, each under a second now) got
    # one log name, so the second's log was the first's file and "Show
    # log" could not tell them apart.  Names sort by time as before.
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S.%f")
    teed = _Teed(progress or _default_progress(config.name),
                 os.path.join(logs_dir(config), f"{stamp}-{os.getpid()}.log"))
    try:
        st = _build(config, teed, force, pip_args, lock_timeout_s)
    except (EnvBusy, BuildStopped):
        raise           # nothing was tried, or it was stopped: not a failure of the config
    except (EnvBuildError, PackConfigError) as e:
        if teed.file is not None:
            e.log_path = teed.path
        teed._write(f"FAILED: {e}")      # the file's last word; the caller reports it
        _remember_failure(config, e)
        raise
    finally:
        teed.close()
    _forget_failure(config)
    return st


def _build(config, progress, force, pip_args, lock_timeout_s=None):
    progress = progress or _default_progress(config.name)
    envs = os.path.join(workspace(), "envs")
    os.makedirs(envs, exist_ok=True)
    final = env_dir(config)
    base = os.path.basename(final)
    with _Lock(os.path.join(envs, f".{base}.lock"), progress, config.name, lock_timeout_s):
        st = env_status(config)
        if st.ok and not force:
            progress(f"{config.name}: ready: {st.python} ({st.reason})")
            return st
        # Under the lock nothing else builds this environment: whatever
        # temporary directories it has are left from a killed install.
        for n in os.listdir(envs):
            if n.startswith((f".{base}.tmp-", f".{base}.old-")):
                _remove(os.path.join(envs, n))
        getattr(progress, "begin", lambda: None)()     # the build's log file (_Teed)
        progress(f"{config.name}: building {final} ({st.state}: {st.reason})")
        uv = find_uv()
        if os.environ.get(INSTALLER) == "uv" and not uv:
            raise EnvBuildError(f"{INSTALLER}=uv but no uv was found, neither on PATH nor beside this "
                                "Python: pip install uv into it (bulkhead's requirements.txt does), or unset "
                                f"{INSTALLER} to build with pip")
        interp = find_interpreter(config.python, installer_uv=uv,
                                  where=packconfig.key_where(config.path, "python") if config.python else None)
        progress(f"interpreter: {interp.path} (Python {interp.version}): {interp.why}")
        match = hostmatch.plan(config, interp.version, hostmatch.comfyui_for(config))
        args = _pip_args(pip_args)
        tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=envs)
        old = None
        try:
            os.chmod(tmp, 0o755)
            stamp = _install(config, tmp, final, interp, uv, match, args, progress)
            _relocate(tmp, final)
            _write_stamp(tmp, stamp)
            old = _set_aside(final, envs, progress)
            os.rename(tmp, final)
            tmp = None
        finally:
            if tmp is not None:
                _remove(tmp)
            if old is not None:
                _remove(old)
        for sib, _ in _siblings(config):
            _retire(sib, final, progress)
        st = env_status(config)
        progress(f"{config.name}: built {final} ({st.state})")
        if not st.ok:
            raise EnvBuildError(f"the environment just built for {config.name} is {st.state}: {st.reason}")
        return st


def _install(config, tmp, final, interp, uv, match, args, progress):
    """Makes the environment in ``tmp`` (to live at ``final``): the venv
    on ``interp``, its conda packages, the host's matched packages, the
    index-pinned entries, the requirements, then the no_deps ones
    without their dependencies.  Returns its stamp (what
    ``_write_stamp`` writes); an ``EnvBuildError`` names the step that
    failed."""
    if uv:
        _stream([uv, "venv", "--prompt", config.name, "--python", interp.path, tmp], progress, "uv venv")
    else:
        _stream([interp.path, "-m", "venv", "--prompt", config.name, tmp], progress,
                f"{interp.path} -m venv")
    py = env_python(tmp)
    conda_records = []
    if config.conda:
        from . import conda  # lazy: ComfyUI start (only conda packages need it)
        conda_records = conda.install(config, tmp, final, interp.version, progress, stream=_stream,
                                      env=clean_env(), cache=os.path.join(workspace(), "conda-pkgs"))
    # comfy-env 0.0.x's no_deps: installed after the others, without
    # their dependencies (PackConfig no_deps), in a run of their own.
    no_deps = list(getattr(config, "no_deps", ()))
    reqs = [q for q in config.requirements if q not in no_deps]
    cuda_reqs = []
    if config.cuda:
        from . import cudawheels  # lazy: ComfyUI start (urllib.request; only [cuda] packages)
        cuda_reqs = cudawheels.resolve(config, interp.version, progress, rebuild=rebuild_command(config))
        reqs += cuda_reqs
    tool = "uv pip" if uv else "pip"

    def pip(extra, what):
        if uv:
            cmd = [uv, "pip", "install", "--python", py] + extra
        else:
            cmd = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off"] + extra
        try:
            _stream(cmd, progress, f"{tool} install for {config.name}")
        except EnvBuildError as e:
            if e.returncode is None:
                raise
            raise EnvBuildError(
                f"{tool} install for {config.name} ({config.path}) failed with exit status "
                f"{e.returncode} ({what}); no environment was made\n--- last lines of {tool}'s "
                f"output ---\n{e.output_tail}", e.output_tail, e.returncode) from None

    keep_torch = _match_host(match, config, tmp, py, args, pip, progress, uv)
    # An entry pinned to an index comes from that index alone (no
    # dependencies: they come from the default indexes next).
    for index, pinned in config.indexes:
        progress(f"installing {' '.join(pinned)} from its index {index}")
        pip(["--no-deps", "--index-url", index] + _without_index_args(args) + list(pinned),
            f"from the index {index}")
    if reqs:
        progress(f"installing {len(reqs)} requirement(s): {' '.join(reqs)}")
        lacking = match.stamp.get("lacking") or {}
        pip(args + keep_torch + reqs, "the requirements" + (
            f"; if one of them needs {', '.join(lacking)}, which this Python has no build of here "
            "(the warning above), give the pack the host's Python minor" if lacking else ""))
    if no_deps:
        progress(f"installing {len(no_deps)} no_deps requirement(s) without their dependencies (--no-deps, as "
                 f"comfy-env 0.0.x installed them): {' '.join(no_deps)}")
        pip(args + keep_torch + ["--no-deps"] + no_deps, "the no_deps requirements, without their dependencies")
    if config.conda:
        conda.finish(tmp, final, interp.version)
    now = time.time()
    return {
        "format": STAMP_FORMAT,
        "pack": config.name,
        "config": config.path,
        "root": config.root,
        "config_hash": config.config_hash,
        "protocol": _native.PROTOCOL_VERSION,
        "bulkhead_version": __version__,
        "interpreter": {"path": interp.path, "version": interp.version,
                        "source": interp.source, "why": interp.why},
        "installer": "uv" if uv else "pip",
        "host": match.stamp,
        "requirements": reqs,
        **({"no_deps": no_deps} if no_deps else {}),
        "indexes": [[i, list(rs)] for i, rs in config.indexes],
        "pip_args": args,
        **({"cuda": {"wheels": cuda_reqs, "torch": list(cudawheels.host_torch())}} if config.cuda else {}),
        **({"conda": {"channels": conda.channels_for(config), "specs": list(config.conda),
                      "installed": [list(r) for r in conda_records]}} if config.conda else {}),
        "created": datetime.datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
        "created_unix": now,
    }


def _set_aside(final, envs, progress):
    """Moves the environment at ``final``, which a new build replaces, into
    a directory of ``envs`` returned for the caller to remove (None when
    there is none); a worker still running on it keeps what it loaded."""
    if not os.path.lexists(final):
        return None
    live = users(final)
    if live:
        progress(f"worker pid(s) {', '.join(map(str, live))} run on {final}: they keep what they "
                 "loaded until they restart, and a restart picks up the new build")
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.old-", dir=envs)
    os.rename(final, os.path.join(old, "env"))
    return old


def install(pack_dir, progress=None, force=False, *, pip_args=None, host_python=None):
    """Builds the environment of every ``comfy-env.toml`` in a pack (see
    packconfig.find_configs) that is not ready -- or every one, when
    ``force``.  What ``bulkhead.install`` (host/pack.py ``install``, which
    a pack's ``install.py`` calls) and ``bulkhead install`` build with,
    before they describe the pack's nodes.

    ``progress(line)`` receives progress and the configs' warnings
    (default: stderr, prefixed ``[bulkhead install <name>]``).  Returns one
    ``EnvStatus`` per config.  A config whose build fails does not stop
    the others; after them, one verdict line per failed one, and the first
    failure is raised.  The configs' ``[local]`` requirements go into
    ``host_python`` (default this process's: ``install_local``).  Raises ``PackConfigError`` (including for a
    pack without a config), ``InterpreterNotFound``, ``EnvBuildError``."""
    pack_dir = os.path.abspath(os.fspath(pack_dir))
    try:
        configs = packconfig.load_configs(pack_dir, warn=False)
    except OSError as e:
        raise PackConfigError(pack_dir, e.strerror or str(e)) from None
    if not configs:
        raise PackConfigError(pack_dir, f"no {packconfig.CONFIG_NAME} in the pack's root, nodes/ or "
                                        "nodes/<subdir>/: it does not ask for isolation")
    root = rootconfig.load_root(pack_dir, warn=False)
    if root is not None:
        p = progress or _default_progress(os.path.basename(pack_dir))
        for w in root.warnings:
            p(f"warning: {w}")
        for w in rootconfig.check_system_packages(root.system_packages, root.path):
            p(f"warning: {w}")
        if root.node_packs:
            custom = os.path.dirname(pack_dir)
            missing = [f"{n} ({src})" for n, src in root.node_packs if not os.path.isdir(os.path.join(custom, n))]
            if missing:
                p(f"warning: {root.path}: [node_packs] names packs not installed beside this one (in "
                  f"{custom}): {', '.join(missing)}; bulkhead does not install node packs: install them "
                  "with ComfyUI-Manager or git clone")
    out, failed = [], []
    for c in configs:
        p = progress or _default_progress(c.name)
        for w in c.warnings:
            p(f"warning: {w}")
        for w in rootconfig.check_system_packages(c.system_packages, c.path):
            p(f"warning: {w}")
        try:
            out.append(build(c, p, force, pip_args=pip_args))
        except (EnvBuildError, PackConfigError) as e:
            # One config's failure is its own: the pack's other configs are built all the same.
            failed.append((c, e))
    p = progress or _default_progress(os.path.basename(pack_dir))
    local_failed = None
    try:
        install_local(configs, p, pip_args=pip_args, python=host_python)
    except EnvBuildError as e:      # the environments' verdicts first: a failed build is the error raised
        local_failed = e
        p(f"[local]: FAILED: {first_line(e)} (the whole output is above)")
    for c, e in failed:
        p = progress or _default_progress(c.name)
        p(f"{c.name}: FAILED, no environment was made: {first_line(e)} (the whole "
          f"output is above; `{rebuild_command(c)}` tries again)")
    if failed:
        raise failed[0][1]
    if local_failed is not None:
        raise local_failed
    return out


def _local_requirements(configs):
    """The ``[local]`` requirements (PackConfig ``local``) of ``configs``,
    each once, in the files' order."""
    out = []
    for c in configs:
        out += [q for q in c.local if q not in out]
    return out


def install_local(configs, progress, *, pip_args=None, python=None):
    """Installs the ``[local]`` requirements of ``configs`` (a comfy-env
    0.0.x table: that release installed them into ComfyUI's own Python)
    into the host's Python -- ``python``, default this process's, which is
    ComfyUI's when ``bulkhead.install`` runs from a pack's install.py --
    with uv where builds use it, else pip, with ``pip_args`` (default
    ``$BULKHEAD_PIP_ARGS``); each run said in one line first.  The
    ``[local.cuda]`` ones (PackConfig ``local_cuda``) first, as that
    release did: CUDA wheels from the CUDA wheel index for this process's
    torch and that Python (``cudawheels.resolve``), installed without
    their dependencies (a wheel's torch requirement never replaces
    ComfyUI's torch).  Only an install does this: ComfyUI's start names
    the command instead (``local_missing_line``).  Raises EnvBuildError
    when it fails."""
    reqs = _local_requirements(configs)
    if not reqs:
        return
    python = python or sys.executable
    uv = find_uv()
    tool = "uv pip" if uv else "pip"
    args = _pip_args(pip_args)
    base = [uv, "pip", "install", "--python", python] if uv else \
        [python, "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    cuda = [q for c in configs for q in getattr(c, "local_cuda", ())]
    wheels = []
    if cuda:
        from . import cudawheels  # lazy: ComfyUI start (urllib.request; only [local.cuda])
        version = _python_version(python)
        for c in configs:
            if getattr(c, "local_cuda", ()):
                wheels += cudawheels.resolve(types.SimpleNamespace(path=c.path, cuda=c.local_cuda), version,
                                             progress, rebuild=f"bulkhead install {c.root}", table="[local.cuda]")
    plain = [q for q in reqs if q not in cuda]
    for what, run, extra in (("[local.cuda] wheels", wheels, ["--no-deps"]), ("[local]", plain, [])):
        if not run:
            continue
        progress(f"{what.split()[0]}: installing {' '.join(run)} into the host's Python ({python}) with {tool}, "
                 + ("without their dependencies, from the CUDA wheel index, " if extra else "")
                 + "as comfy-env 0.0.x installed them into ComfyUI's")
        try:
            _stream(base + args + extra + run, progress, f"{tool} install of {what} into {python}")
        except EnvBuildError as e:
            if e.returncode is None:
                raise
            raise EnvBuildError(f"{tool} install of {what} ({' '.join(run)}) into {python} failed with exit "
                                f"status {e.returncode}\n--- last lines of {tool}'s output ---\n{e.output_tail}",
                                e.output_tail, e.returncode) from None


def _python_version(python):
    """The full version of the interpreter ``python`` (this process's
    without asking it)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return "%d.%d.%d" % sys.version_info[:3]
    try:
        out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                             env=clean_env(), timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvBuildError(f"the host's Python {python} cannot be run to read its version: {e}") from None
    if out.returncode != 0:
        raise EnvBuildError(f"the host's Python {python} cannot be run to read its version (exit status "
                            f"{out.returncode}): {out.stdout.strip()[-500:]}")
    return out.stdout.strip()


def local_missing(requirements):
    """Those of ``requirements`` this process's Python (the host's) does
    not satisfy: not installed, or at a version outside the specifier;
    one whose marker excludes this platform is never missing."""
    missing = []
    for q in requirements:
        try:
            req = Requirement(q)
        except InvalidRequirement:
            missing.append(q)       # a URL or path: pip knows, this cannot tell
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(q)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(q)
    return missing


def local_missing_line(pack_dir, configs):
    """One line for ComfyUI's start when the ``[local]`` requirements of a
    pack's ``configs`` are missing from the host's Python (this process's):
    which, and the exact commands that install them; None when none is
    missing.  The start installs nothing into ComfyUI's Python."""
    missing = local_missing(_local_requirements(configs))
    if not missing:
        return None
    quoted = " ".join(shlex.quote(q) if "'" in q else f"'{q}'" for q in missing)
    return (f"bulkhead: {os.path.basename(os.fspath(pack_dir))}: its [local] packages (comfy-env 0.0.x: for "
            f"ComfyUI's own Python) are missing from {sys.executable}: {', '.join(missing)}; install them "
            f"with `{sys.executable} -m pip install {quoted}` or `bulkhead install {os.fspath(pack_dir)}`, "
            "and restart ComfyUI")
