"""Releasing a worker's memory: the one host-side implementation that the
control socket, the routes, admission, pressure and the holder call.

Two shapes of release, both here:

- ``release(target, ...)``: a release that waits for its answer.  The
  target is ``find``'s: a worker of this host (``Local``) or one of
  another bulkhead host on the machine (``Remote``, asked through that
  host's control socket).  A local worker's lock is taken with a
  deadline (``wait_s``: a worker in a call raises ``WorkerBusy`` past it,
  nothing runs later), the release then runs under the worker's own
  release timeout (a pack's ``release_timeout_s``; else the caller's
  default, else ``RELEASE_TIMEOUT_S``), the worker's held bytes are read
  from the shared ledger before and after, and the event is recorded in
  the host's timeline.
- ``post(hm, device, nbytes, ...)``: releases posted without waiting (a
  frame, no reply), planned by policy from the ledger's figures; for
  ComfyUI's eviction loop (pressure, the MemoryHolder), which must never
  wait for a worker.
"""

import os
import time
from typing import Callable, NamedTuple, Optional

from .. import _native
from ..channel import targets
from ..channel.spec import RELEASE_TIMEOUT
from .controlclient import request as _ask_host
from .errors import CallTimeout, ProtocolError, WorkerDied

# How long a release may take before the worker is declared hung and
# killed (a hung worker must never block ComfyUI's eviction loop).  A
# worker's own ``release_timeout_s`` (a pack's ``release_timeout_s``)
# outranks it.
RELEASE_TIMEOUT_S = float(os.environ.get(RELEASE_TIMEOUT, "30"))
EVENTS_KEPT = 256   # HostMemory.events keeps as many

DEAD = (WorkerDied, CallTimeout, ProtocolError, _native.PeerClosed)

__all__ = ["RELEASE_TIMEOUT_S", "Local", "Remote", "Candidate", "NotFound", "Ambiguous",
           "release_timeout_s", "find", "release", "post", "note", "read", "records",
           "held"]


def release_timeout_s(worker, default=None):
    """The release deadline of one worker, in seconds: its own (a pack's
    release_timeout_s), else `default`, else RELEASE_TIMEOUT_S."""
    t = getattr(worker, "release_timeout_s", None)
    if t is not None:
        return t
    return RELEASE_TIMEOUT_S if default is None else default


class Local(NamedTuple):
    """A worker of this host."""
    worker: object


class Remote(NamedTuple):
    """A worker of another bulkhead host on the machine."""
    host_pid: int
    pid: int
    pack: str


class Candidate(NamedTuple):
    """A worker that may be asked to release on a device (HostMemory's
    candidates): a label for logs and the timeline, its last use
    (CLOCK_MONOTONIC ns), what it holds resident there and its floor there
    (from the ledger), release(nbytes) -> bytes freed, and the Worker
    itself (None for another host's: it cannot be posted to)."""
    label: str
    last_used_ns: int
    resident_bytes: int
    floor_bytes: int
    release: Callable[[int], int]
    worker: Optional[object]


class NotFound(LookupError):
    """No running worker answers to that pid or pack name."""


class Ambiguous(LookupError):
    """A pack name that matches several workers."""


# --------------------------------------------------------------- the ledger

def read(ledger, pid):
    """One process's record now, or None.  ledger: an open _native.Ledger,
    a path (opened for the read; a missing file is not created), or None
    (nothing to read)."""
    if ledger is None:
        return None
    if isinstance(ledger, (str, bytes, os.PathLike)):
        path = os.fsdecode(ledger)
        if not os.path.lexists(path):
            return None
        with _native.Ledger(path) as opened:
            return opened.read(pid)
    return ledger.read(pid)


def _snapshot(ledger):
    """Every live record; a writer that stayed mid-write past the ledger's
    retry budget (EAGAIN) is asked again a few times."""
    for attempt in range(5):
        try:
            return ledger.records()
        except BlockingIOError:
            if attempt == 4:
                raise
            time.sleep(0.001)


def records(ledger):
    """Every live record (ledger as for read(); None: none)."""
    if ledger is None:
        return []
    if isinstance(ledger, (str, bytes, os.PathLike)):
        path = os.fsdecode(ledger)
        if not os.path.lexists(path):
            return []
        with _native.Ledger(path) as opened:
            return _snapshot(opened)
    return _snapshot(ledger)


def held(rec):
    """The bytes a record holds over all its devices (0 for None)."""
    return sum(d["held_bytes"] for d in rec["devices"]) if rec else 0


def note(hm, kind, who, nbytes):
    """Records an event in the host's timeline (HostMemory.events)."""
    events = getattr(hm, "events", None) if hm is not None else None
    if events is not None:
        events.append((time.time(), kind, who, nbytes))
        del events[:-EVENTS_KEPT]


# --------------------------------------------------------------- finding

def find(who, workers, ledger=None, remote=True):
    """The worker `who` (a pid or a pack name) names: Local(worker) for one
    of `workers` (this host's running workers), else, with remote, a
    Remote for a worker of another host found in the ledger.  Raises
    NotFound, or Ambiguous for a pack with several workers."""
    me = os.getpid()
    workers = list(workers)
    match = [w for w in workers if (w.pid == who if isinstance(who, int) else w.name == who)]
    if len(match) == 1:
        return Local(match[0])
    if not remote:
        if not match:
            known = ", ".join(f"{w.name} (pid {w.pid})" for w in workers) or "none running"
            raise NotFound(f"no running worker {who!r} in host {me} (workers: {known})")
        raise Ambiguous(f"pack {who!r} has {len(match)} workers here; name one by pid: "
                        + ", ".join(str(w.pid) for w in match))
    recs = [r for r in records(ledger) if r["role"] == "worker"]
    if isinstance(who, int):
        rec = next((r for r in recs if r["pid"] == who), None)
        if rec is not None and rec["host_pid"] not in (0, me):
            return Remote(rec["host_pid"], rec["pid"], rec["pack"])
        known = ", ".join(f"{r['pack']} (pid {r['pid']})" for r in recs) or "none"
        raise NotFound(f"no running bulkhead worker has pid {who} (workers: {known})")
    others = [r for r in recs if r["pack"] == who and r["host_pid"] not in (0, me)]
    if len(match) + len(others) > 1:
        pids = [w.pid for w in match] + [r["pid"] for r in others]
        raise Ambiguous(f"pack {who!r} has {len(pids)} workers; name one by pid: "
                        + ", ".join(str(p) for p in pids))
    if others:
        r = others[0]
        return Remote(r["host_pid"], r["pid"], r["pack"])
    known = ", ".join(sorted({r["pack"] for r in recs})) or "none running"
    raise NotFound(f"no running bulkhead worker of pack {who!r} (packs: {known})")


# --------------------------------------------------------------- releasing

_RECEIPT = ("before_bytes", "after_bytes", "freed_bytes")


def release(target, nbytes=None, *, wait_s, hm=None, ledger=None, kind="release", timeout_s=None,
            before_bytes=None, remote_timeout_s=None, raise_dead=False, op=None):
    """Releases `target` (find's Local or Remote; nbytes None: the full
    ladder, else that many bytes; op "pins", a local worker only: the soft
    release at a prompt's end, pins and caches, models stay) and returns
    {"worker_pid", "pack", "host_pid", "before_bytes", "after_bytes",
     "freed_bytes", "receipt": the worker's own figures} -- before/after
    read from `ledger` (as for read()), plus "error" when the worker died
    or hung during it (then it holds nothing: after is 0).

    wait_s: how long to wait for a call a local worker is in; past it
    WorkerBusy, and nothing runs afterwards.  timeout_s: the release
    deadline of a worker without its own.  before_bytes: a reading taken
    earlier by a caller that started something else first.  A remote
    target is asked through its host's control socket (which waits for
    its worker up to min(wait_s, that worker's release timeout)), with
    `remote_timeout_s` for the answer; what that raises (ControlUnreachable,
    Timeout, RemoteError...) is the caller's.  raise_dead: re-raise a
    local worker's death instead of reporting it.  The event (kind, the
    worker, the bytes freed) goes to hm's timeline."""
    if isinstance(target, Remote):
        if op is not None:
            raise ValueError(f"release: op {op!r} is for a worker of this host, not {target}")
        host_pid, pid, pack = target
        label = f"{pack} (pid {pid}, host {host_pid})"
        before = held(read(ledger, pid)) if before_bytes is None else before_bytes
        limit = RELEASE_TIMEOUT_S + 5.0 if remote_timeout_s is None else remote_timeout_s
        receipt = _ask_host(host_pid, "release", pid, nbytes, wait_s, timeout_s=limit) or {}
        error = None
    else:
        w = target.worker if isinstance(target, Local) else target
        host_pid, pid, pack = os.getpid(), w.pid, w.name
        label = pack
        before = held(read(ledger, pid)) if before_bytes is None else before_bytes
        error = None
        try:
            op = op or (targets.RELEASE_ALL if nbytes is None else targets.RELEASE_BYTES)
            receipt = w.release(op, None, nbytes, timeout_s=release_timeout_s(w, timeout_s), wait_s=wait_s) or {}
        except DEAD as e:
            if raise_dead:
                raise
            # It died (or hung and was killed): what it held is gone.
            receipt, error = {}, str(e).splitlines()[0]
    after = held(read(ledger, pid)) if error is None else 0
    freed = max(0, before - after)
    note(hm, kind, label, freed)
    out = {"worker_pid": pid, "pack": pack, "host_pid": host_pid, "before_bytes": before,
           "after_bytes": after, "freed_bytes": freed,
           "receipt": {k: receipt.get(k, 0) for k in _RECEIPT}}
    if error:
        out["error"] = error
    return out


def post(hm, device_name, nbytes, *, exclude=None, kind):
    """Posts releases for nbytes on device `device_name` to this host's
    idle workers, by the admission's plan (policy_release_plan over
    hm.candidates: least recently used first, above each floor), without
    waiting for any.  A worker that turns its post down (busy) is left out
    and the rest planned again, what was posted already counted.  Each
    post is an event of `kind`.  Returns the bytes posted."""
    cands = hm.candidates(device_name, exclude=exclude, foreign=False)
    posted = {}
    refused = set()
    promised = 0
    while promised < nbytes:
        rows = [(i not in refused and c.worker is not None, c.last_used_ns,
                 max(0, c.resident_bytes - posted.get(i, 0)), c.floor_bytes)
                for i, c in enumerate(cands)]
        asks, _uncovered = _native.policy_release_plan(rows, nbytes - promised)
        if not asks:
            break
        for i, n in asks:
            worker = cands[i].worker
            if not worker.post_release(targets.RELEASE_BYTES, None, int(n)):
                refused.add(i)
                break   # plan the rest again without it
            posted[i] = posted.get(i, 0) + int(n)
            promised += int(n)
            note(hm, kind, worker.name, int(n))
    return promised
