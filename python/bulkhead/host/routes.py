"""bulkhead inside ComfyUI's web server: the status document, the routes
the sidebar panel and scripts use, an honest ``/free``, and the prompt
boundary.

Reading needs nothing but the shared ledger: ``status_document(ledger)``
builds the same JSON document ``bulkhead status --json`` prints (schema 1,
below), from the ledger's records and the device probes.  Acting needs the
host that holds a worker's channel: a worker of this process is released
through its ``Worker``; a worker of another ComfyUI instance on the machine
through that host's control socket (``control.request``).  Every release
answered here is measured twice from the ledger, before and after, so a
response never claims bytes that did not move.

Routes (``install`` puts them on ``PromptServer.instance.routes`` while
custom nodes load, so upstream's ``add_routes`` also serves each under
``/api``):

    GET  /bulkhead/status   the status document, plus "host_pid" (this
                            process) and "timeline" (recent releases and
                            evictions from HostMemory.events, oldest first)
    POST /bulkhead/release  {"pid": int} or {"pack": str} (this host's
                            worker of that pack when it has one), optional
                            "bytes": int|null (null: the full ladder) ->
                            {"worker_pid", "pack", "host_pid", "before_bytes",
                            "after_bytes", "freed_bytes", "receipt"}; errors
                            are {"error": message} with 400 (bad body, or a
                            pack name that matches several workers), 403 (a
                            worker of another host, asked from off the
                            machine), 404 (no such worker), 409 (the worker
                            stayed busy), 429 (ACT_ADMITTED releases in
                            progress already), 502 (its host is unreachable
                            or failed), 504 (timeout)
    POST /bulkhead/free     {"all_hosts": bool, "wait_s": float <= 60}: the
                            full ladder on every worker of this host (waiting
                            up to wait_s for one in a call), and with
                            all_hosts (403 from off the machine) on every
                            idle worker of the other hosts ->
                            {"host_pid", "all_hosts", "processes": [{"pid",
                            "pack", "host_pid", "state", "before_bytes",
                            "after_bytes", "freed_bytes", "error"}...],
                            "before_bytes", "after_bytes", "freed_bytes"};
                            sent only after the bytes moved; errors as above

What a web client may do (ComfyUI often listens on 0.0.0.0, with no
authentication): read the status, release and free this instance's
workers.  Reaching other instances' workers (all_hosts, a release of
another host's worker) needs a loopback client or
$BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1.  Every wait is bounded (wait_s at most
MAX_WAIT_S, a release by the worker's release timeout), releases run on
ACT_THREADS threads of their own with at most ACT_ADMITTED admitted, and
the status snapshot runs off the loop, one at a time.

ComfyUI's own ``POST /free`` ({"unload_models", "free_memory"}) only sets
two flags for the prompt worker, which then calls ``unload_all_models()``
(that reaches worker models through the stand-ins) and, for free_memory,
resets the executor's caches -- which a worker's caches are not part of.
Upstream offers no hook at that point, and host code assigns nothing in
``comfy`` except EXTRA_RESERVED_VRAM (DESIGN.md 5), so nothing is wrapped:
an aiohttp middleware observes the request, lets upstream's handler set its
flags, then runs the full ladder on this host's workers and answers with
the per-process figures (``{"bulkhead": <the /bulkhead/free answer>}`` as
the body, where upstream's body is empty).  Both flags do this: a worker's
allocator cache, cast buffers and pins exist only for its models.  Upstream's
own half still runs on the prompt thread as before.

Prompt boundary: newer upstream (the CacheProvider API, 2026) calls every
registered cache provider's ``on_prompt_end(prompt_id)`` on the execution
thread, in the ``finally`` of each prompt.  ``install`` registers a provider
that caches nothing (``should_cache`` is False, so upstream never looks up
or stores through it) and at each prompt's end asks every idle worker of
this host for its soft release (``Worker.release('pins')``: pinned host
memory, the allocator cache and the heap; models stay loaded, they are the
cache the next prompt wants), then reconciles the stand-ins on that same
thread.  Upstream without the API (e.g. the 2025 releases) gets no prompt
hook: a worker still returns its allocator cache after every call (its node
boundary) and runs the full ladder after its idle time.

The status document (schema 1; fields are only ever added):

    {"schema": 1, "ledger": path, "ledger_present": bool,
     "gpu_error": str|null, "ram_error": str|null,
     "devices": [{"device": "cpu"|"cuda:<NVML index>", "total_bytes",
                  "free_bytes", "source": "meminfo+cgroup"|"nvml",
                  "index": int|null, "uuid": str|null, "name": str|null}...],
     "processes": [{"pid", "role", "pack", "interpreter", "generation",
                    "host_pid": int|null, "state": "idle"|"busy"|"releasing",
                    "idle_s": float|null, "held_bytes",
                    "devices": [{"device", "held_bytes", "pinned_bytes",
                                 "pin_ceiling_bytes", "pager_bytes",
                                 "floor_bytes", "reserve_bytes"}...],
                    "models": [{"id", "name", "device", "size_bytes",
                                "resident_bytes"}...],
                    "release_count", "released_bytes"}...]}

To a client off the machine (not loopback, no BULKHEAD_ALLOW_REMOTE_ALL_HOSTS)
GET /bulkhead/status lists only this host's records and its workers'
("other_hosts_hidden": true).

GET /bulkhead/status adds this host's "host_pid", "timeline" and "packs":
[{"name", "directory", "state": "isolated"|"in-process"|"failed", and
for isolated "python", "env", "pid" (null while no worker runs), else
"reason" and, in-process, "fix"}...], those not isolated first
(host.states.pack_states).

Processes come host by host (by pid), each followed by its workers (by
pid); a worker whose host has no live record stands on its own.  idle_s is
(now - last_used_ns) on CLOCK_MONOTONIC, null before a first use.
"""

import asyncio
import concurrent.futures
import ipaddress
import json
import logging
import os
import threading
import time
import weakref

from .. import _native
from ..channel.peer import RemoteError
from . import release as _release
from . import serverproxy
from .controlclient import ControlUnreachable
from .release import DEAD as _DEAD, RELEASE_TIMEOUT_S, WorkerBusy, held as _held

log = logging.getLogger("bulkhead")

SCHEMA = 1
TIMELINE_LEN = 40                 # events the status route returns
# How long /free and /bulkhead/free wait for a worker that is in a call.
FREE_WAIT_S = float(os.environ.get("BULKHEAD_FREE_WAIT", "10"))
# How long ComfyUI's /free waits for ComfyUI's prompt thread to drop its
# output cache before the workers release (comfyui_settled).
FREE_SETTLE_S = 5.0
MAX_WAIT_S = 60.0                 # the most a request's "wait_s" may ask
MAX_BYTES = (1 << 63) - 1         # the most a request's "bytes" may ask (the codec's int64)
# Releases and frees (POST /bulkhead/release, /bulkhead/free, ComfyUI's
# /free) run on ACT_THREADS threads of their own, never the default
# executor's; at most ACT_ADMITTED are admitted at once (running or
# waiting for a thread), more are answered 429.
ACT_THREADS = 2
ACT_ADMITTED = 4
# A web client off this machine may reach other ComfyUI instances' workers
# ({"all_hosts": true}, a release of another host's worker) only with this
# set to 1; a loopback client always may.
ALLOW_REMOTE_ENV = "BULKHEAD_ALLOW_REMOTE_ALL_HOSTS"


# --------------------------------------------------------------- reading

def status_document(ledger=None, gpu=None):
    """The status document (module doc) as a dict: exactly what
    `bulkhead status --json` prints, built by the same C code
    (``_native.status_json``).  ledger: an open ``_native.Ledger`` (read
    through, left open), a path, or None for the default; a path with no
    file is not created (nobody ever joined: no processes).  gpu: an open
    ``_native.Gpu`` (a host's: no NVML open per request), or None for the
    NVML library named by $BULKHEAD_NVML_LIBRARY or the default search."""
    if isinstance(ledger, (str, bytes, os.PathLike)):
        ledger = os.fsdecode(ledger)
    return json.loads(_native.status_json(ledger, gpu))


def timeline(host_memory, limit=TIMELINE_LEN):
    """The last `limit` releases and evictions this host saw, oldest first:
    [{"time": unix seconds, "kind", "process", "bytes"}...].  Kinds:
    evict (ComfyUI evicted a worker's model through its stand-in),
    pressure, admission (from memory.py), release, free, prompt_end (here)."""
    if host_memory is None:
        return []
    return [{"time": t, "kind": kind, "process": who, "bytes": n}
            for t, kind, who, n in list(host_memory.events)[-limit:]]


# --------------------------------------------------------------- acting

class RouteError(Exception):
    """A request that cannot be served; .status is the HTTP status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _shown(value):
    """A request's value as JSON, shortened for an error message."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_release(body):
    if not isinstance(body, dict):
        raise RouteError(400, 'the body must be a JSON object: {"pid": <int>} or {"pack": <str>}, '
                              'optionally "bytes": <int> or null')
    pid, pack, nbytes = body.get("pid"), body.get("pack"), body.get("bytes")
    if (pid is None) == (pack is None):
        raise RouteError(400, 'name exactly one worker: "pid" (an int) or "pack" (a string)')
    if pid is not None and (type(pid) is not int or not 0 < pid < 1 << 31):
        raise RouteError(400, f'"pid" must be a positive integer, not {_shown(pid)}')
    if pack is not None and (not isinstance(pack, str) or not pack):
        raise RouteError(400, f'"pack" must be a non-empty string, not {_shown(pack)}')
    if nbytes is not None and (type(nbytes) is not int or not 0 < nbytes <= MAX_BYTES):
        raise RouteError(400, f'"bytes" must be a positive integer or null (the full release), '
                              f'at most {MAX_BYTES}, not {_shown(nbytes)}')
    return (pid if pid is not None else pack), nbytes


def _parse_free(body):
    """(all_hosts, wait_s) of a /bulkhead/free body; wait_s None: the
    route's default."""
    if not isinstance(body, dict):
        raise RouteError(400, 'the body must be a JSON object: {"all_hosts": <bool>, "wait_s": <seconds>}')
    all_hosts, wait_s = body.get("all_hosts", False), body.get("wait_s")
    if not isinstance(all_hosts, bool):
        raise RouteError(400, f'"all_hosts" must be a boolean, not {_shown(all_hosts)}')
    # (NaN and infinities fail the comparison, as a huge int does)
    if wait_s is not None and (isinstance(wait_s, bool) or not isinstance(wait_s, (int, float))
                               or not 0 <= wait_s <= MAX_WAIT_S):
        raise RouteError(400, f'"wait_s" must be a number of seconds from 0 to {MAX_WAIT_S:g}, '
                              f'not {_shown(wait_s)}')
    return all_hosts, (None if wait_s is None else float(wait_s))


# Headers a reverse proxy adds for the client it forwards: a request that
# carries one came from somewhere else, whatever its loopback peer says.
FORWARDED_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def from_loopback(request):
    """True when the request's client is on this machine (a loopback
    address; IPv4-mapped IPv6 included) and no proxy forwarded it (no
    Forwarded / X-Forwarded-For / X-Real-IP header: behind a local reverse
    proxy every peer is loopback).  A request without an IP peer (a Unix
    socket, an unknown transport) is not."""
    headers = getattr(request, "headers", None) or {}
    if any(h in headers for h in FORWARDED_HEADERS):
        return False
    try:
        addr = ipaddress.ip_address(request.remote or "")
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def only_this_host(doc):
    """The status document as a client off the machine sees it: this
    host's records and its workers' only (the other ComfyUI instances of
    the user -- their pids, interpreters, packs, models -- are not its
    business, as acting on them is not)."""
    me = os.getpid()
    doc = dict(doc)
    doc["processes"] = [p for p in doc.get("processes", []) if p.get("pid") == me or p.get("host_pid") == me]
    doc["other_hosts_hidden"] = True
    return doc


def may_reach_other_hosts(request):
    """Whether this request may act on other ComfyUI instances' workers:
    from loopback, or anywhere with $BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1."""
    return from_loopback(request) or os.environ.get(ALLOW_REMOTE_ENV) == "1"


def _refuse_other_hosts(client, what):
    """The 403 for `what` (a release that reaches another instance's
    workers) asked by `client` (its address) from off the machine."""
    return RouteError(403, f"{what}: only a client on this machine (loopback) may act on another "
                           f"ComfyUI instance's workers, not {client or 'this client'}; set "
                           f"{ALLOW_REMOTE_ENV}=1 where ComfyUI runs to allow it from anywhere")


class BulkheadRoutes:
    """The routes, the /free observer and the prompt boundary of one
    ComfyUI process.  host_memory: this process's HostMemory, a callable
    returning it (or None), or None for the one given to
    ``use_host_memory``; without one, reading still works and releases go
    only to other hosts."""

    def __init__(self, host_memory=None, *, ledger_path=None, free_wait_s=None,
                 release_timeout_s=None):
        self._host_memory = host_memory
        self.ledger_path = ledger_path
        self.free_wait_s = FREE_WAIT_S if free_wait_s is None else free_wait_s
        self.release_timeout_s = RELEASE_TIMEOUT_S if release_timeout_s is None else release_timeout_s
        self.prompt_hook = None        # what prompt_end is registered with, or None
        self._provider = None
        # GET /bulkhead/status: the snapshot in flight (an asyncio future on
        # the server's loop, shared by every request that comes meanwhile)
        # and the one thread that takes snapshots, off the loop and apart
        # from the default executor's (a snapshot may wait 2 s on the
        # ledger's mutex; aiohttp's FileResponse needs those threads).
        self._snapshot = None
        self._status_pool = None
        self._act_pool = None          # the threads releases and frees run on
        self._acting = 0               # releases and frees admitted (on the loop only)

    # --- the host ---

    @property
    def hm(self):
        hm = self._host_memory
        if hm is None:
            return _default_host_memory
        return hm() if callable(hm) else hm

    def _ledger(self):
        hm = self.hm
        if hm is not None:
            return hm.ledger
        return self.ledger_path  # a path or None: opened per read

    def _ledger_or_path(self):
        """The open ledger, or the path to open for a read."""
        ledger = self._ledger()
        return _native.ledger_default_path() if ledger is None else ledger

    def _read(self, pid):
        """One process's record now, or None."""
        return _release.read(self._ledger_or_path(), pid)

    def _records(self):
        return _release.records(self._ledger_or_path())

    def _note(self, kind, who, nbytes):
        _release.note(self.hm, kind, who, nbytes)

    # --- status ---

    def snapshot(self):
        """The status document from the ledger and the probes (a blocking
        read: the ledger's mutex, /proc; never call it on the loop)."""
        hm = self.hm
        return status_document(self._ledger(), hm.gpu_probe() if hm is not None else None)

    def status(self):
        """The GET /bulkhead/status answer, synchronously."""
        return self._answer(self.snapshot())

    def _answer(self, doc):
        doc = dict(doc)
        doc["host_pid"] = os.getpid()
        doc["timeline"] = timeline(self.hm)
        from . import states
        doc["packs"] = states.pack_states()
        doc["prompt_hook"] = self.prompt_hook     # None: workers release at their node boundary and when idle
        return doc

    async def status_async(self):
        """The GET /bulkhead/status answer, on the server's loop: the
        snapshot runs on this object's own thread, one at a time; a request
        that comes while one is in flight shares its document (taken at
        most one snapshot's time before), so neither a held ledger mutex
        nor a client polling in a loop ever waits on the loop or queues
        snapshots."""
        fut = self._snapshot
        if fut is None or fut.done():
            if self._status_pool is None:
                self._status_pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="bulkhead-status")
            fut = asyncio.get_running_loop().run_in_executor(self._status_pool, self.snapshot)
            self._snapshot = fut
        # shield: a client that goes away cancels its wait, not the others'
        return self._answer(await asyncio.shield(fut))

    # --- releasing one worker ---

    def _local_workers(self):
        hm = self.hm
        return [w for w in hm.owners if w.alive] if hm is not None else []

    def locate(self, who):
        """release.Local(worker) for a worker of this host, or
        release.Remote(host_pid, pid, pack) for one of another host on the
        machine.  Raises RouteError 404 / 400 (a pack with several workers)."""
        try:
            return _release.find(who, self._local_workers(), self._ledger_or_path())
        except _release.Ambiguous as e:
            raise RouteError(400, str(e)) from None
        except _release.NotFound as e:
            raise RouteError(404, str(e)) from None

    def release_local(self, w, nbytes=None, wait_s=None, before_bytes=None):
        """Releases a worker of this host (nbytes None: the full ladder),
        waiting up to wait_s for a call it is in to finish (then 409), under
        the worker's own release timeout.  Returns the answer dict (before/
        after from the ledger; before_bytes: a reading taken earlier, by a
        caller that started something else first)."""
        wait_s = self.free_wait_s if wait_s is None else wait_s
        try:
            return _release.release(_release.Local(w), nbytes, wait_s=wait_s, hm=self.hm,
                                     ledger=self._ledger_or_path(), timeout_s=self.release_timeout_s,
                                     before_bytes=before_bytes)
        except WorkerBusy as e:
            raise RouteError(409, str(e)) from None

    def release_remote(self, target, nbytes=None):
        """Asks another host, through its control socket, to release its
        worker (target: release.Remote).  Raises RouteError 404/409/502/504."""
        host_pid, pid, pack = target
        limit = self.release_timeout_s + 5.0
        try:
            return _release.release(target, nbytes, wait_s=self.free_wait_s, hm=self.hm,
                                     ledger=self._ledger_or_path(), remote_timeout_s=limit)
        except ControlUnreachable as e:
            raise RouteError(502, f"the host of worker {pack!r} (pid {pid}), pid {host_pid}, is "
                                  f"unreachable: {e}") from None
        except _native.Timeout:
            raise RouteError(504, f"host {host_pid} did not answer the release of {pack!r} (pid {pid}) "
                                  f"within {limit:g} s") from None
        except LookupError as e:  # the remote's own "no running worker"
            raise RouteError(404, getattr(e, "remote_message", str(e))) from None
        except RemoteError as e:
            if e.remote_type.endswith("WorkerBusy"):
                raise RouteError(409, e.remote_message) from None
            raise RouteError(502, f"host {host_pid} failed to release {pack!r} (pid {pid}): "
                                  f"{str(e).splitlines()[0]}") from None
        except (ConnectionError, OSError, _native.Error) as e:
            raise RouteError(502, f"host {host_pid} failed to release {pack!r} (pid {pid}): "
                                  f"{str(e).splitlines()[0]}") from None

    def release(self, who, nbytes=None, refused_client=None):
        """POST /bulkhead/release, synchronously.  refused_client: None, or
        the address of a client that may not reach other hosts (then a
        worker of another host is refused with 403, not released)."""
        where = self.locate(who)
        if isinstance(where, _release.Local):
            return self.release_local(where.worker, nbytes)
        if refused_client is not None:
            raise _refuse_other_hosts(refused_client, f"worker {where.pack!r} (pid {where.pid}) belongs "
                                                      f"to another ComfyUI instance (pid {where.host_pid})")
        return self.release_remote(where, nbytes)

    # --- freeing everything ---

    def held_now(self):
        """{pid: ledger bytes} of this host's running workers."""
        return {w.pid: _held(self._read(w.pid)) for w in self._local_workers()}

    def free(self, all_hosts=False, wait_s=None, kind="free", before=None, exit_idle=False):
        """The full ladder on every worker of this host (idle ones first,
        then those in a call, each waited for up to wait_s), and with
        all_hosts on every idle worker of the other hosts.  Returns the
        /bulkhead/free answer; per-process failures are rows, not raises.
        before: held_now() taken earlier, when something else (upstream's
        own unload) may have freed bytes in between.  exit_idle (ComfyUI's
        "Free model and node cache"): then every idle worker that holds no
        handle of the host's exits (host/idle.py), its row "exited"."""
        before = before or {}
        rows = []
        local = sorted(self._local_workers(), key=lambda w: bool(w.busy))
        for w in local:
            row = {"pid": w.pid, "pack": w.name, "host_pid": os.getpid()}
            try:
                r = self.release_local(w, None, wait_s, before.get(w.pid))
                row.update(state="died" if "error" in r else "released", before_bytes=r["before_bytes"],
                           after_bytes=r["after_bytes"], freed_bytes=r["freed_bytes"], error=r.get("error"))
            except Exception as e:  # one worker's failure is its row, not the answer's
                held = _held(self._read(row["pid"]))
                was = before.get(row["pid"], held)
                row.update(state="busy" if isinstance(e, RouteError) else "error", before_bytes=was,
                           after_bytes=held, freed_bytes=max(0, was - held),
                           error=(str(e).splitlines() or [type(e).__name__])[0])
            rows.append(row)
        if exit_idle:
            from . import idle
            gone = {e["pid"] for e in idle.exit_idle(0.0) if e["exited"]}
            for row in rows:
                if row["pid"] in gone:
                    row.update(state="exited", after_bytes=0, freed_bytes=row["before_bytes"])
        if all_hosts:
            me = os.getpid()
            records = self._records()
            hosts = {r["pid"] for r in records if r["role"] == "host"}
            for rec in records:
                if rec["role"] != "worker" or rec["host_pid"] in (0, me):
                    continue
                row = {"pid": rec["pid"], "pack": rec["pack"], "host_pid": rec["host_pid"]}
                held = _held(rec)
                if rec["host_pid"] not in hosts:
                    row.update(state="orphan", before_bytes=held, after_bytes=held, freed_bytes=0,
                               error=f"its host (pid {rec['host_pid']}) has no live record: nobody to ask")
                elif rec["run"] != "idle":
                    row.update(state="busy", before_bytes=held, after_bytes=held, freed_bytes=0,
                               error=f"{rec['run']} in host {rec['host_pid']}: only idle workers of "
                                     "other hosts are released")
                else:
                    try:
                        r = self.release_remote(_release.Remote(rec["host_pid"], rec["pid"], rec["pack"]))
                        row.update(state="released", before_bytes=r["before_bytes"],
                                   after_bytes=r["after_bytes"], freed_bytes=r["freed_bytes"], error=None)
                    except RouteError as e:
                        now = _held(self._read(rec["pid"]))
                        row.update(state="unreachable" if e.status == 502 else "error",
                                   before_bytes=held, after_bytes=now, freed_bytes=max(0, held - now),
                                   error=str(e))
                rows.append(row)
        for row in rows:
            row.setdefault("error", None)
        total = {k: sum(r[k] for r in rows) for k in ("before_bytes", "after_bytes", "freed_bytes")}
        if kind and total["freed_bytes"]:
            n = sum(1 for r in rows if r['freed_bytes'])
            self._note(kind, f"{n} worker{'' if n == 1 else 's'}", total["freed_bytes"])
        return {"host_pid": os.getpid(), "all_hosts": bool(all_hosts), "processes": rows, **total}

    def free_after_comfyui(self, before, exit_idle):
        """ComfyUI's own /free, on an acting thread (admitted as any
        release is): once ComfyUI's prompt thread has dropped its cache
        (comfyui_settled, at most FREE_SETTLE_S), the full ladder on every
        worker of this host; the answer says whether ComfyUI settled."""
        settled = comfyui_settled(FREE_SETTLE_S)
        report = self.free(False, None, "free", before, exit_idle)
        report["comfyui_settled"] = settled
        return report

    # --- the prompt boundary ---

    def prompt_end(self, prompt_id=None):
        """At the end of a prompt, on ComfyUI's execution thread: every idle
        worker of this host returns its pins, allocator cache and heap
        (models stay), then the stand-ins are reconciled.  A worker in use
        by another thread is skipped: it is not at a boundary.  Each worker
        releases under its own deadline (a pack's release_timeout_s), else
        the route's (release.release)."""
        hm = self.hm
        if hm is None:
            return 0
        freed = 0
        for w in list(hm.owners):
            if not w.alive or w.busy:
                continue
            try:
                r = _release.release(_release.Local(w), op="pins", wait_s=0, ledger=self._ledger_or_path(),
                                     timeout_s=self.release_timeout_s, raise_dead=True)
                freed += r["freed_bytes"]
            except WorkerBusy:
                continue    # a call began: it is not at a boundary
            except _DEAD + (RemoteError,) as e:
                log.warning("bulkhead: %s: soft release at the end of prompt %s failed: %s",
                            w.describe(), prompt_id, str(e).splitlines()[0])
        hm.reconcile()
        if freed:
            self._note("prompt_end", f"prompt {prompt_id}", freed)
        return freed

    def hook_prompt_boundary(self):
        """Registers prompt_end where upstream offers a prompt hook (its
        CacheProvider API).  Returns the hook's name, or None when this
        ComfyUI has none (module doc)."""
        if self._provider is not None:
            return self.prompt_hook
        try:
            from comfy_execution import cache_provider as cp
            register = cp.register_cache_provider
        except (ImportError, AttributeError):
            # /bulkhead/status says so ("prompt_hook": null); not a start-up line (#25)
            log.debug("bulkhead: this ComfyUI has no prompt hook (comfy_execution.cache_provider); "
                      "workers release at their node boundary and after their idle time")
            return None
        self._provider = _prompt_boundary_provider(getattr(cp, "CacheProvider", object), self)
        register(self._provider)
        self.prompt_hook = "comfy_execution.cache_provider"
        return self.prompt_hook

    def unhook_prompt_boundary(self):
        if self._provider is None:
            return
        from comfy_execution import cache_provider as cp
        cp.unregister_cache_provider(self._provider)
        self._provider = None
        self.prompt_hook = None

    # --- aiohttp ---

    async def _run(self, fn, *args):
        """fn(*args) on this object's acting threads (not the default
        executor: aiohttp's FileResponse needs those)."""
        if self._act_pool is None:
            self._act_pool = concurrent.futures.ThreadPoolExecutor(
                ACT_THREADS, thread_name_prefix="bulkhead-act")
        return await asyncio.get_running_loop().run_in_executor(self._act_pool, fn, *args)

    async def _act(self, fn, *args):
        """fn(*args) on the acting threads, if fewer than ACT_ADMITTED are
        admitted already; else RouteError 429 (nothing runs)."""
        if self._acting >= ACT_ADMITTED:
            raise RouteError(429, f"{self._acting} releases and frees are in progress already; "
                                  "try again when they have answered")
        self._acting += 1
        try:
            return await self._run(fn, *args)
        finally:
            self._acting -= 1

    async def _json_body(self, request, default=None):
        if default is not None and not request.can_read_body:
            return default
        try:
            return await request.json()
        except ValueError as e:
            raise RouteError(400, f"the body is not JSON: {e}") from None

    async def get_status(self, request):
        from aiohttp import web
        doc = await self.status_async()
        if not may_reach_other_hosts(request):
            doc = only_this_host(doc)
        return web.json_response(doc)

    async def post_release(self, request):
        from aiohttp import web
        try:
            who, nbytes = _parse_release(await self._json_body(request))
            refused = None if may_reach_other_hosts(request) else (request.remote or "")
            return web.json_response(await self._act(self.release, who, nbytes, refused))
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    async def post_free(self, request):
        from aiohttp import web
        try:
            all_hosts, wait_s = _parse_free(await self._json_body(request, {}))
            if all_hosts and not may_reach_other_hosts(request):
                raise _refuse_other_hosts(request.remote,
                                          '"all_hosts" reaches every instance on this machine')
            return web.json_response(await self._act(self.free, all_hosts, wait_s, "free"))
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    def free_observer(self):
        """The aiohttp middleware that follows ComfyUI's POST /free (and
        /api/free): upstream's handler runs first and sets its flags; then,
        if either flag was asked for, this host's workers run the full
        ladder, and the answer carries their before/after bytes."""
        from aiohttp import web

        @web.middleware
        async def bulkhead_free_observer(request, handler):
            if request.method != "POST" or request.path not in ("/free", "/api/free"):
                return await handler(request)
            try:
                body = await request.json()   # aiohttp keeps the body: upstream reads it again
            except ValueError:
                body = None
            asked = isinstance(body, dict) and bool(body.get("free_memory") or body.get("unload_models"))
            # Read before upstream's handler: its prompt worker may start
            # unloading (through the stand-ins) as soon as the flags are set.
            before = await self._run(self.held_now) if asked else None
            response = await handler(request)
            if not asked or response.status != 200 or not isinstance(response, web.Response):
                return response
            try:
                report = await self._act(self.free_after_comfyui, before, bool(body.get("free_memory")))
            except RouteError as e:  # too many at once: upstream's answer alone
                log.warning("bulkhead: ComfyUI's /free: %s (the workers release after their idle time)", e)
                return response
            if response.body is None or response.body == b"":
                return web.json_response({"bulkhead": report}, status=response.status)
            if response.content_type == "application/json":
                try:
                    doc = json.loads(response.body)
                except ValueError:
                    return response
                if isinstance(doc, dict):
                    doc["bulkhead"] = report
                    return web.json_response(doc, status=response.status)
            return response  # a body of upstream's own: left as it is (the timeline has the figures)

        return bulkhead_free_observer

    def add_to(self, routes):
        """Adds the three routes to an aiohttp RouteTableDef (ComfyUI's
        ``PromptServer.instance.routes``) or a router (``app.router``)."""
        table = [("GET", "/bulkhead/status", self.get_status),
                 ("POST", "/bulkhead/release", self.post_release),
                 ("POST", "/bulkhead/free", self.post_free)]
        for method, path, handler in table:
            if hasattr(routes, "add_route"):
                routes.add_route(method, path, handler)
            else:
                routes.route(method, path)(handler)


def comfyui_settled(timeout_s):
    """After upstream's /free handler set its flags: waits, at most
    timeout_s, until ComfyUI's prompt thread has acted on them, so that what
    its output cache held in the workers (results mapped from their blocks,
    handles to their objects) is let go before the workers release, and one
    press reports what a second would have freed.  Upstream's prompt
    thread takes the flags (``get_flags``), unloads, drops its cache
    (``e.reset()``) and then runs ``gc.collect()`` (main.prompt_worker); so
    this waits for the flags to be taken and for a full collection to end
    after the last time they were seen set.  True when seen; False at the
    bound (a prompt is running: ComfyUI acts on the flags after it) or
    where this ComfyUI's queue has no flags to watch."""
    import gc
    srv = serverproxy.prompt_server()
    q = getattr(srv, "prompt_queue", None)
    get_flags = getattr(q, "get_flags", None)
    if get_flags is None:
        return False
    collections = [0]
    done = threading.Event()
    mark = [None]       # the collection count when the flags were last seen set

    def on_gc(phase, info):
        if phase == "stop" and info.get("generation") == 2:
            collections[0] += 1
            if mark[0] is not None and collections[0] > mark[0]:
                done.set()

    gc.callbacks.append(on_gc)
    try:
        deadline = time.monotonic() + timeout_s
        seen = collections[0]
        while True:
            try:
                flags = get_flags(reset=False)
            except TypeError:   # an older queue without reset=: nothing to watch without taking them
                return False
            if not any(k in flags for k in ("free_memory", "unload_models")):
                break
            seen = collections[0]
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        mark[0] = seen
        if collections[0] > seen:
            return True
        return done.wait(max(0.0, deadline - time.monotonic()))
    finally:
        gc.callbacks.remove(on_gc)


def _prompt_boundary_provider(base, routes):
    """A cache provider (subclass of upstream's CacheProvider) that caches
    nothing and calls routes.prompt_end at each prompt's end."""

    class BulkheadPromptBoundary(base):
        async def on_lookup(self, context):
            return None

        async def on_store(self, context, value):
            return None

        def should_cache(self, context, value=None):
            return False

        def on_prompt_start(self, prompt_id):
            pass

        def on_prompt_end(self, prompt_id):
            routes.prompt_end(prompt_id)

    return BulkheadPromptBoundary()


# ----------------------------------------------------------- installing

_default_host_memory = None
_installed = weakref.WeakKeyDictionary()   # PromptServer -> BulkheadRoutes


def use_host_memory(host_memory):
    """Names this process's HostMemory for routes installed without one."""
    global _default_host_memory
    _default_host_memory = host_memory


def install(server=None, host_memory=None, **options):
    """Puts bulkhead on ComfyUI's server (default ``PromptServer.instance``):
    the routes, the /free observer, the prompt boundary.  Call while custom
    nodes load (before the server starts: aiohttp freezes its middleware
    list then).  Idempotent per server; returns its BulkheadRoutes, whose
    ``prompt_hook`` says which prompt hook was found (None: none)."""
    if server is None:
        import server as comfy_server
        server = comfy_server.PromptServer.instance
    routes = _installed.get(server)
    if routes is not None:
        if host_memory is not None:
            routes._host_memory = host_memory
        return routes
    routes = BulkheadRoutes(host_memory, **options)
    if getattr(server.app, "frozen", False):
        log.warning("bulkhead: ComfyUI's server already runs; its routes can no longer be added "
                    "(install bulkhead's while custom nodes load)")
    routes.add_to(server.routes)
    try:
        server.app.middlewares.append(routes.free_observer())
    except RuntimeError as e:  # the app already runs: its middleware list is frozen
        log.warning("bulkhead: ComfyUI's /free is not observed (%s); POST /bulkhead/free still "
                    "releases the workers", e)
    routes.hook_prompt_boundary()
    from . import prewarm
    prewarm.install(server)
    try:
        server.app.on_startup.append(_log_startup_line)
    except (AttributeError, RuntimeError):       # no aiohttp signal, or the app already runs
        pass
    _installed[server] = routes
    return routes


async def _log_startup_line(app):
    from . import states
    log.info("%s", states.startup_line())


def installed(server=None):
    """The BulkheadRoutes installed on server (default: any), or None."""
    if server is not None:
        return _installed.get(server)
    return next(iter(_installed.values()), None)
