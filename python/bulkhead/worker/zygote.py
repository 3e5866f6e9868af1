"""A zygote: a started worker interpreter that forks workers.

A cold worker pays its interpreter's start, bulkhead's worker modules and,
once a tensor arrives, torch's import: about 1.2 s of CPU, so twenty
packs' first prompt on a small machine costs twenty of those one after the
other.  A zygote pays them once: the host starts it as it starts a worker
(``-S`` and host/zygote.py's WORKER_ARGS, BULKHEAD_AS_ZYGOTE=1, the first
pack's interpreter and environment, no site: no environment's ``.pth``
code runs in it), it imports the modules the host names
(BULKHEAD_ZYGOTE_PRELOAD), and then forks one worker per request; a fork
of a process with torch loaded costs a few ms, and the pages stay shared
until written.

The host asks on fd 3 (SOCK_SEQPACKET): a JSON request with three fds
(SCM_RIGHTS): the channel's end, the output pipe, the report socket (the
C side: bh_proc_fork_via).  The zygote answers the child's pid as an int32
(or -errno and why).  The child takes the layout a spawn gives: fd 0
/dev/null, 1 and 2 the pipe, 3 the channel, no other fd, its own process
group, default signals, an empty mask, the request's cwd and exactly its
environment; then it becomes that interpreter's process as far as Python
can tell (sys.executable, sys.prefix and sys.path, site run again for its
environment, so its ``.pth`` files and site-packages are its own) and
returns into the worker's main (one difference stays: sys.flags.no_site
is 1, from the zygote's ``-S``).  Where a module the zygote preloaded is
not the one that environment would import (the pack brings its own torch
or numpy, or anything the preload pulled in, or the file at that path was
replaced since: an environment rebuilt in place), the child execs the
interpreter instead: a fresh worker, as a spawn would start.

The zygote reports each child's wait status on that child's report socket
when it exits and reaps it only once the host answers, so the host's pid
and process-group signals cannot reach a reused pid.  It exits when the
host closes fd 3 (killing what it forked first), when asked to while it
has no child, or after LINGER_S without a child.
"""

import importlib
import importlib.machinery
import os
import select
import signal
import struct
import sys

from .. import _native
from ..channel.spec import AS_ZYGOTE, FD, LOG_LEVEL, PARENT_PID, ZYGOTE_LINGER_S, ZYGOTE_PRELOAD

LINGER_S = 30.0
_INT = struct.Struct("=i")


def _stdlib_dirs():
    """The interpreter's own directories: modules from them are the same
    in every environment of this interpreter."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    return tuple(os.path.join(r, "") for r in roots)


def _is_shared(mod, stdlib):
    f = getattr(mod, "__file__", None)
    return not f or os.path.realpath(f).startswith(stdlib)


def _import_preload(names):
    """Imports each name; returns {name: error} for those that failed."""
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # not in this environment: the children import it themselves
            failed[name] = f"{type(e).__name__}: {e}"
    return failed


def _status(si):
    """A waitid result as waitpid's status word."""
    if si.si_code == os.CLD_EXITED:
        return (si.si_status & 0xFF) << 8
    return si.si_status | (0x80 if si.si_code == os.CLD_DUMPED else 0)


class _Zygote:
    def __init__(self, ctl):
        self.ctl = ctl
        self.children = {}   # pid -> its report fd (running)
        self.reported = {}   # pid -> its report fd (exited, status sent, the host's answer awaited)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def loop(self, become):
        """Serves requests; returns (in a forked child) what become returns."""
        linger = float(os.environ.get(ZYGOTE_LINGER_S, LINGER_S) or LINGER_S)
        while True:
            busy = self.children or self.reported
            fds = [self.ctl.fileno(), self.wake_r, *self.reported.values()]
            ready = select.select(fds, [], [], None if busy else linger)[0]
            if not ready:
                return self._quit()
            if self.wake_r in ready:
                self._reap_check()
            for pid, fd in list(self.reported.items()):
                if fd in ready:   # the host answered (or went): reap
                    os.waitpid(pid, 0)
                    os.close(fd)
                    del self.reported[pid]
            if self.ctl.fileno() in ready:
                got = self._request(become)
                if got is not None:
                    return got

    def _reap_check(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        for pid, fd in list(self.children.items()):
            si = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if si is None:
                continue
            del self.children[pid]
            try:
                os.write(fd, _INT.pack(_status(si)))
                self.reported[pid] = fd
            except OSError:   # the host closed its end: no one to answer
                os.waitpid(pid, 0)
                os.close(fd)

    def _request(self, become):
        import json  # lazy: worker start
        import socket  # lazy: worker start
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.ctl, 1 << 20, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            for fd in fds:
                os.close(fd)
            return self._quit(kill=True)   # the host is gone
        try:
            req = json.loads(msg)
        except ValueError:
            req = None
        op = req.get("op") if isinstance(req, dict) else None
        if op == "quit_if_idle":
            for fd in fds:
                os.close(fd)
            if not self.children and not self.reported:
                self._answer(1)
                return self._quit()
            self._answer(0)
            return None
        if op != "fork" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            self._answer(-22, f"not a fork request with three fds: {msg[:80]!r}")
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            self._answer(-e.errno, f"fork: {e.strerror}")
            return None
        if pid == 0:
            self.ctl.detach()   # its fd goes with the others in become
            return become(req, fds)
        try:
            os.setpgid(pid, pid)   # as the child does: no window where its group is ours
        except OSError:
            pass                   # it did first, or is gone (its report says)
        os.close(fds[0])
        os.close(fds[1])
        self.children[pid] = fds[2]
        self._answer(pid)
        return None

    def _answer(self, value, why=""):
        try:
            self.ctl.send(_INT.pack(value) + why.encode("utf-8", "replace")[:500])
        except OSError:
            pass

    def _quit(self, kill=False):
        for pid in list(self.children):
            if kill:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in [*self.children, *self.reported]:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        raise SystemExit(0)


def _site_paths():
    """The zygote runs without site (``-S``): no environment's ``.pth``
    code runs in it, so nothing one pack's environment installs there (an
    editable install's import hook, a patched module) reaches a worker of
    another pack's that the zygote forks; each child runs its own site.
    The preload still needs the environment's directories: its
    site-packages and the directory lines of its ``.pth`` files (the
    host's shared packages), added here without their import lines."""
    import site  # lazy: worker start (a zygote runs without site)
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    venv = os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))
    for d in site.getsitepackages([prefix] if venv else None):
        if not os.path.isdir(d) or d in sys.path:
            continue
        sys.path.append(d)
        for name in sorted(n for n in os.listdir(d) if n.endswith(".pth")):
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.join(d, line)
                if os.path.isdir(path) and path not in sys.path:
                    sys.path.append(path)


def serve():
    """The zygote's main (BULKHEAD_AS_ZYGOTE=1): imports the preload, says
    ready on fd 3, then forks a worker per request.  Returns only in a
    forked child, set up as its worker (see the module's doc), with the
    pid that is its parent (this zygote's)."""
    os.environ.pop(AS_ZYGOTE, None)
    preload = [n for n in os.environ.pop(ZYGOTE_PRELOAD, "").split(",") if n]
    fd = int(os.environ.pop(FD, "3"))
    stdlib = _stdlib_dirs()
    base_path = [p for p in sys.path if os.path.realpath(p).startswith(stdlib)
                 and "site-packages" not in p and "dist-packages" not in p]
    _site_paths()
    failed = _import_preload(preload)
    # What each child's environment must import from where this one did:
    # every top-level module here but the interpreter's own (no site ran,
    # so no .pth imported one): the preload, what it pulled in, and
    # bulkhead's (the same files, from the PYTHONPATH every worker gets).
    preloaded = {n: (m.__file__, _identity(m.__file__)) for n, m in sys.modules.items()
                 if "." not in n and not n.startswith("__")   # (__main__ and its alias __mp_main__: not imported)
                 and not _is_shared(m, stdlib)}
    # json and socket are imported here, in the zygote, not at the top:
    # every worker imports this module, and a spawned one needs neither
    # (socket, selectors, json and re cost its start several ms).
    import json  # lazy: worker start
    import socket  # lazy: worker start
    ctl = socket.socket(fileno=fd)
    zygote_pid = os.getpid()
    ctl.send(json.dumps({"ready": True, "failed": failed}).encode())

    def become(req, fds):
        _become(req, fds, base_path, preloaded, zygote_pid)
        return zygote_pid
    return _Zygote(ctl).loop(become)


def _become(req, fds, base_path, preloaded, zygote_pid):
    """In the forked child: the spawn's layout, then the request's
    interpreter and environment (or an exec of it where a preloaded module
    is not that environment's)."""
    chan, out, _report = fds
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # the rest is as Python starts (SIGPIPE ignored, SIGINT raising)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        null = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((null, 0), (out, 1), (out, 2), (chan, 3)):
            os.dup2(src, dst)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        python, argv, env = req["python"], req["argv"], req["env"]
        if req.get("cwd"):
            os.chdir(req["cwd"])
        env[PARENT_PID] = str(zygote_pid)
        os.environ.clear()
        os.environ.update(env)
        if req.get("sandbox"):
            # Before the environment's site runs (its .pth lines are its
            # code) or the pack is imported: a failure ends the child.
            _native.sandbox_apply(tuple(req["sandbox"]))
            if "tempfile" in sys.modules:
                sys.modules["tempfile"].tempdir = None   # the zygote's TMPDIR is not the pack's
        stale = _take_environment(python, env, base_path, preloaded)
        if stale:
            level = env.get(LOG_LEVEL, "20").strip()
            if level.isdigit() and int(level) <= 10:
                print(f"bulkhead zygote: this environment imports its own {', '.join(sorted(stale))}: "
                      f"started afresh", file=sys.stderr)
            os.execve(python, argv, os.environ)
    except BaseException as e:   # nothing to go back to: say why and end
        try:
            os.write(2, f"bulkhead zygote: child setup failed: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(127)


def _take_environment(python, env, base_path, preloaded):
    """sys.executable, sys.path and site as ``python -m`` would have them
    in env; returns the preloaded modules that env would import from
    elsewhere (then the caller execs)."""
    import site  # lazy: worker start (a zygote runs without site)
    sys.executable = python
    pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *pp, *base_path]
    sys.prefix, sys.exec_prefix = sys.base_prefix, sys.base_exec_prefix
    site.PREFIXES = [sys.prefix, sys.exec_prefix]
    site.ENABLE_USER_SITE = None
    site.main()
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    stale = []
    for name, (path, ident) in preloaded.items():
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        origin = spec.origin if spec is not None else None
        if origin is None or os.path.realpath(origin) != os.path.realpath(path) or _identity(origin) != ident:
            stale.append(name)      # another file, or the same path rewritten (an environment rebuilt in place)
    return stale


def _identity(path):
    """What tells a module's file from another at the same path (device,
    inode, mtime, size), or None."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
