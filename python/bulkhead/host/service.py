"""The work behind bulkhead's routes in ComfyUI's server (host/routes.py
maps HTTP to it, as ComfyUI's own api_server/routes call its services):
the status document, releases and frees measured from the ledger, the
wait for ComfyUI's own /free, and the prompt boundary.

Reading needs nothing but the shared ledger: ``status_document(ledger)``
builds the same JSON document ``bulkhead status --json`` prints (schema 1,
below), from the ledger's records and the device probes.  Acting needs the
host that holds a worker's channel: a worker of this process is released
through its ``Worker``; a worker of another ComfyUI instance on the machine
through that host's control socket (``controlclient.request``).  Every release
answered here is measured twice from the ledger, before and after, so a
response never claims bytes that did not move.

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
[{"name", "directory", "state": "isolated"|"building"|"in-process"|"failed",
and for isolated "python", "env", "pid" (null while no worker runs) and,
where its changed config is rebuilt, "rebuild"; for building "phase" and
"reason"; else "reason" and, in-process, "fix"}...], those not isolated
first (host.states.pack_states); each pack bulkhead serves from a config
also has "actions" (what POST /bulkhead/build may ask for it: "build",
"retry", "rebuild"), "log" (its newest build's log file, or null) and,
while a build of it runs, "phase", "progress" (the last line of the
command it runs) and "building" (host.building.annotate).

Processes come host by host (by pid), each followed by its workers (by
pid); a worker whose host has no live record stands on its own.  idle_s is
(now - last_used_ns) on CLOCK_MONOTONIC, null before a first use.
"""

import gc
import json
import logging
import os
import threading
import time
import weakref

from .. import _native
from ..channel import spec, targets
from ..channel.peer import RemoteError, error_detail
from . import building
from . import idle
from . import release as _release
from . import serverproxy
from . import states
from .controlclient import ControlUnreachable
from .errors import WorkerBusy
from .release import DEAD as _DEAD, RELEASE_TIMEOUT_S, held as _held

log = logging.getLogger("bulkhead")

SCHEMA = 1
TIMELINE_LEN = 40                 # events the status route returns
# How long /free and /bulkhead/free wait for a worker that is in a call.
FREE_WAIT_S = float(os.environ.get(spec.FREE_WAIT, "10"))
# How long ComfyUI's /free waits for ComfyUI's prompt thread to drop its
# output cache before the workers release (comfyui_settled).
FREE_SETTLE_S = 5.0
# A web client off this machine may reach other ComfyUI instances' workers
# ({"all_hosts": true}, a release of another host's worker) only with this
# set to 1; a loopback client always may.
ALLOW_REMOTE_ENV = spec.ALLOW_REMOTE_ALL_HOSTS
# The HostMemory of services made without one (routes.use_host_memory).
default_host_memory = [None]


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


def refuse_other_hosts(client, what):
    """The 403 for `what` (a release that reaches another instance's
    workers) asked by `client` (its address) from off the machine."""
    return RouteError(403, f"{what}: only a client on this machine (loopback) may act on another "
                           f"ComfyUI instance's workers, not {client or 'this client'}; set "
                           f"{ALLOW_REMOTE_ENV}=1 where ComfyUI runs to allow it from anywhere")


class BulkheadService:
    """The work behind the routes, the /free observer and the prompt
    boundary of one ComfyUI process (host/routes.py's BulkheadRoutes puts
    it on ComfyUI's server).  host_memory: this process's HostMemory, a
    callable returning it (or None), or None for the one given to
    ``routes.use_host_memory``; without one, reading still works and
    releases go only to other hosts."""

    def __init__(self, host_memory=None, *, ledger_path=None, free_wait_s=None,
                 release_timeout_s=None):
        self._host_memory = host_memory
        self.ledger_path = ledger_path
        self.free_wait_s = FREE_WAIT_S if free_wait_s is None else free_wait_s
        self.release_timeout_s = RELEASE_TIMEOUT_S if release_timeout_s is None else release_timeout_s
        self.prompt_hook = None        # what prompt_end is registered with, or None
        self._provider = None
        # Worker -> (pid, its ledger record's version) after its last release
        # at a prompt's end: unchanged, it has run nothing since.
        self._released_at = weakref.WeakKeyDictionary()

    # --- the host ---

    @property
    def hm(self):
        hm = self._host_memory
        if hm is None:
            return default_host_memory[0]
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
        doc["packs"] = building.annotate(states.pack_states())
        doc["prompt_hook"] = self.prompt_hook     # None: workers release at their node boundary and when idle
        return doc

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
                                  f"{e.detail.splitlines()[0]}") from None
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
            raise refuse_other_hosts(refused_client, f"worker {where.pack!r} (pid {where.pid}) belongs "
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
        handle of the host's exits (host/idle.py), its row "exited", before
        the ladder runs on the others."""
        before = before or {}
        rows = []
        local = [(w, w.pid) for w in sorted(self._local_workers(), key=lambda w: bool(w.busy))]
        gone = set()
        if exit_idle:
            # Idle workers stop first: the ladder on a worker about to exit
            # is CPU spent for nothing (a collection with torch loaded), and
            # it ran just before the worker's check for work of its own.
            held_before = {pid: before.get(pid, _held(self._read(pid))) for _, pid in local}
            gone = {e["pid"] for e in idle.exit_idle(0.0) if e["exited"]}
        for w, pid in local:
            row = {"pid": pid, "pack": w.name, "host_pid": os.getpid()}
            if pid in gone:
                row.update(state="exited", before_bytes=held_before[pid], after_bytes=0,
                           freed_bytes=held_before[pid])
                rows.append(row)
                continue
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
        worker of this host that ran anything since its last such release
        returns its pins, allocator cache and heap (models stay), then the
        stand-ins are reconciled.  A worker in use by another thread is
        skipped: it is not at a boundary; so is one whose ledger record has
        not changed since (every call writes it): with many packs a prompt
        uses a few, and the rest are neither woken nor waited on.  Each
        worker releases under its own deadline (a pack's
        release_timeout_s), else the route's (release.release)."""
        hm = self.hm
        if hm is None:
            return 0
        freed = 0
        for w in list(hm.owners):
            if not w.alive or w.busy:
                continue
            pid = w.pid
            if self._released_at.get(w) == (pid, hm.ledger.version(pid)):
                continue
            try:
                r = _release.release(_release.Local(w), op=targets.RELEASE_PINS, wait_s=0,
                                     ledger=self._ledger_or_path(), timeout_s=self.release_timeout_s, raise_dead=True)
                freed += r["freed_bytes"]
                self._released_at[w] = (pid, hm.ledger.version(pid))
            except WorkerBusy:
                continue    # a call began: it is not at a boundary
            except _DEAD + (RemoteError,) as e:
                log.warning("bulkhead: %s: soft release at the end of prompt %s failed: %s",
                            w.describe(), prompt_id, error_detail(e).splitlines()[0])
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
            from comfy_execution import cache_provider as cp  # comfyui: comfy_execution
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
        from comfy_execution import cache_provider as cp  # comfyui: comfy_execution
        cp.unregister_cache_provider(self._provider)
        self._provider = None
        self.prompt_hook = None

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
