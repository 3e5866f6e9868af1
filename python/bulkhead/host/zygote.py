"""The host's zygotes: workers forked from a started interpreter.

A zygote (worker/zygote.py) is a worker interpreter that has imported
bulkhead's worker modules and what the host asked it to preload (torch,
for a pack whose nodes pass tensors) and forks one worker per request, in
a few ms where a spawn costs the interpreter's start and every import
again.  One zygote serves every worker with the same interpreter binary,
the same environment (bulkhead's own BULKHEAD_* variables and PYTHONPATH
aside: a worker reads those after the fork) and the same preload; a
worker whose environment would import a preloaded module from elsewhere
is exec'd by its zygote into a fresh interpreter, as a spawn would start.

A zygote starts with the first worker that needs it and ends after
worker/zygote.py's LINGER_S with no worker, or at ``stop_idle`` (the
host's ``/free``), or with the host.  Where a zygote cannot start or
answer, the worker is spawned as before, and the reason is logged; a
zygote that could not start is tried again for a later worker only
RETRY_S after (``BULKHEAD_ZYGOTE_RETRY_S``), its workers spawned
meanwhile.
``BULKHEAD_ZYGOTE=0`` turns zygotes off (every worker spawned).  A host
that exits closes its end of each zygote's socket, and the zygote kills
what it forked and ends.
"""

import json
import logging
import os
import select
import threading
import time

from .. import _native
from ..channel import spec


def _log():
    return logging.getLogger("bulkhead")


# A worker's (and a zygote's) interpreter arguments: worker/__init__.py's
# run, which starts as ``-m bulkhead.worker`` would, without runpy (about
# 1.5 ms of every worker's start: #40).
WORKER_ARGS = ("-c", "from bulkhead.worker import run; run()")
START_TIMEOUT_S = 120.0   # the preload (torch: about 1.5 s here; far longer on a cold disk)
# What made a start fail may pass (a start timeout on a loaded machine, an
# environment being rebuilt): seconds before a later worker tries again.
RETRY_S = 300.0
FORK_TIMEOUT_MS = 10_000
ANSWER_TIMEOUT_S = 2.0    # a zygote's answer to quit_if_idle (microseconds when it runs)


def proc_state(pid):
    """The one-letter state of /proc/<pid>/stat ('R', 'S', 'T' stopped,
    't' traced, 'Z'...), or None (a zygote's and a worker's: workers.py)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _retry_s():
    try:
        return float(os.environ.get(spec.ZYGOTE_RETRY_S, RETRY_S))
    except ValueError:
        return RETRY_S


def enabled():
    return os.environ.get(spec.ZYGOTE, "1") != "0"


def _key(python, env, preload):
    """What a zygote must share with the worker it forks."""
    shared = tuple(sorted((k, v) for k, v in env.items()
                          if k not in ("PYTHONPATH", "TMPDIR") and not k.startswith(spec.PREFIX)))
    return os.path.realpath(python), shared, tuple(preload)


class ZygoteError(Exception):
    pass


class Zygote:
    """One zygote process and its socket; forks are asked one at a time."""

    def __init__(self, python, env, preload, sink):
        zenv = dict(env, **{spec.AS_ZYGOTE: "1", spec.ZYGOTE_PRELOAD: ",".join(preload)})
        self._lock = threading.Lock()
        self.proc, self.fd = _native.spawn(python, [python, "-S", *WORKER_ARGS],
                                           [f"{k}={v}" for k, v in zenv.items()], "/", sink, "[bulkhead zygote] ")
        try:
            ready = self._read_ready()
        except BaseException:
            self.close()
            raise
        self.pid = self.proc.pid
        if ready.get("failed"):
            _log().debug("bulkhead: zygote %s could not preload %s", python, ready["failed"])

    def _read_ready(self):
        if not select.select([self.fd], [], [], START_TIMEOUT_S)[0]:
            raise ZygoteError(f"it did not say ready within {START_TIMEOUT_S:g} s")
        msg = os.read(self.fd, 1 << 16)
        try:
            ready = json.loads(msg) if msg else None
        except ValueError:
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            status = self.proc.wait(2.0) if not msg else None
            tail = self.proc.output_tail().strip()
            raise ZygoteError(("it ended during start-up" if status is not None else f"it said {msg[:80]!r}")
                              + (f": {tail.splitlines()[-1]}" if tail else ""))
        return ready

    def fork(self, python, argv, env, cwd, sink, prefix, sandbox=None):
        req = json.dumps({"op": "fork", "python": python, "argv": list(argv), "env": env,
                          "cwd": cwd or os.getcwd(),   # None: the host's, as a spawn inherits
                          "sandbox": sandbox}).encode()   # the child restricts itself first (host/sandbox.py)
        with self._lock:
            return _native.spawn_via(self.fd, req, sink, prefix, FORK_TIMEOUT_MS)

    def quit_if_idle(self):
        """Ends the zygote if it has no worker; True if it ended (or does
        not answer within ANSWER_TIMEOUT_S: stopped or hung, it is of no
        use, and the caller closes it)."""
        with self._lock:
            try:
                os.write(self.fd, json.dumps({"op": "quit_if_idle"}).encode())
                if not select.select([self.fd], [], [], ANSWER_TIMEOUT_S)[0]:
                    return True
                answer = os.read(self.fd, 512)
            except OSError:
                return True
        return answer[:4] != b"\0\0\0\0"

    def shutdown(self):
        """Ends the zygote and, first, what it still forked (it sees EOF)."""
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.proc.wait(2.0)
        self.proc.close()   # reaps it, SIGKILL first where it did not end

    @property
    def alive(self):
        """Running and not stopped (SIGSTOP, a debugger): a stopped zygote
        forks nothing and reports no child's end, so it is replaced."""
        try:
            if self.proc.wait(0) is not None:
                return False
        except Exception:
            return False
        return proc_state(self.pid) not in ("T", "t")

    def close(self):
        """Ends the zygote alone: what it forked serves on (its workers
        see its end as their zygote's; bh_proc_fork_via)."""
        self.proc.close()   # SIGKILL to its own group: each worker leads its own
        try:
            os.close(self.fd)
        except OSError:
            pass


_lock = threading.Lock()
_zygotes = {}         # key -> Zygote
_starting = {}        # key -> threading.Lock (one start per key at once)
_refused = {}         # key -> (time.monotonic(), why) of its zygote's last failed start


def _get(key, python, env, preload, sink):
    with _lock:
        z = _zygotes.get(key)
        if z is not None and z.alive:
            return z
        start = _starting.setdefault(key, threading.Lock())
    with start:
        with _lock:
            z = _zygotes.get(key)
            if z is not None and z.alive:
                return z
            refused = _refused.get(key)
            if refused is not None and time.monotonic() - refused[0] < _retry_s():
                return None
        if z is not None:
            z.close()
        try:
            z = Zygote(python, env, preload, sink)
        except (OSError, ZygoteError) as e:
            with _lock:
                _refused[key] = (time.monotonic(), str(e))
            _log().warning("bulkhead: no zygote for %s (%s); its workers are started one by one, and a "
                           "zygote is tried again in %g s", python, e, _retry_s())
            return None
        with _lock:
            _refused.pop(key, None)
            _zygotes[key] = z
        return z


def spawn(python, argv, env, cwd, sink, prefix, preload=None, sandbox=None):
    """(Proc, channel fd) as ``_native.spawn``: the worker forked by the
    zygote for (python, env, preload) where zygotes are on and it serves,
    else spawned (always where preload is None).  env: the worker's whole
    environment (a dict); sandbox: what the worker may touch
    (host/sandbox.py's Plan.spec()), or None."""
    envlist = [f"{k}={v}" for k, v in env.items()]
    if preload is None or not enabled():
        return _native.spawn(python, argv, envlist, cwd, sink, prefix, sandbox)
    key = _key(python, env, preload)
    for _attempt in range(2):
        z = _get(key, python, env, preload, sink)
        if z is None:
            break
        try:
            return z.fork(python, argv, env, cwd, sink, prefix, sandbox)
        except OSError as e:
            with _lock:
                if _zygotes.get(key) is z:
                    del _zygotes[key]
            z.close()
            _log().info("bulkhead: zygote for %s did not fork (%s); %s", python, e.strerror or e,
                     "starting another" if _attempt == 0 else "the worker is spawned")
    return _native.spawn(python, argv, envlist, cwd, sink, prefix, sandbox)


def stop_idle():
    """Ends every zygote with no worker (``/free``); returns how many."""
    with _lock:
        items = list(_zygotes.items())
    n = 0
    for key, z in items:
        if z.quit_if_idle():
            with _lock:
                if _zygotes.get(key) is z:
                    del _zygotes[key]
            z.close()
            n += 1
    return n


def close_all():
    """Ends every zygote (the host's exit, after its workers; tests)."""
    with _lock:
        zs = list(_zygotes.values())
        _zygotes.clear()
        _refused.clear()
    for z in zs:
        z.shutdown()
