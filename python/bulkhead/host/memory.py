"""Host side of the one memory budget: stand-ins in ComfyUI's ledger,
admission for worker loads, the published reserve.

One ``HostMemory`` per ComfyUI process.  It joins the machine-wide shared
ledger (``_native.Ledger``) as a host; each worker attached to it joins
the same ledger from inside and publishes its models there.  The host
never asks a worker what it holds: it reads the ledger.

What this module writes into ComfyUI is exactly one value,
``EXTRA_RESERVED_VRAM`` (``_publish_reserve``); a test scans the host-side
sources for any other assignment to a ``comfy`` module.  Everything else
goes through upstream's own functions: ``LoadedModel`` entries in
``current_loaded_models`` (one per stand-in, reconciled on every drain),
``free_memory`` for the residual of an admission, ``get_free_memory``.

Arithmetic that decides memory lives in ``policy.c``; this file measures
and acts.
"""

import functools
import logging
import os
import sys
import threading
import time
import uuid
import weakref

from .. import _native, pager
from ..channel.peer import RemoteError, error_detail
from ..channel import spec, targets
from . import release as _release
from .control import ControlServer
from .errors import WorkerBusy
# The release deadline (RELEASE_TIMEOUT_S; a worker's own outranks it) and
# every release that waits or posts live in release.py.
from .release import DEAD as _DEAD, RELEASE_TIMEOUT_S, release_timeout_s  # noqa: F401

log = logging.getLogger("bulkhead")

# The drain after a node call looks at every worker (its lock, a waitpid:
# one that died idle is reaped and its stand-ins go) at most this often;
# in between, only at the worker called and those whose record moved.
SWEEP_S = 0.2


def standin_identity():
    """The identity fields of a new stand-in (one per worker model, made
    once): clone_base_uuid, its own, as ModelPatcher has one per base
    model.  Upstream compares it across patchers (newest upstream's
    unload_model_and_clones unloads every model that shares it), so None
    for all would match every worker's model.  The canary checks each
    name upstream compares against what this gives (cli/canary.py)."""
    return {"clone_base_uuid": uuid.uuid4()}


def _torch_device(name):
    import torch  # optional: torch
    return torch.device(name)


def _remote_class(name, _cache={}):
    """A RemoteModel subclass named after the worker's model class, so
    ComfyUI's 'Unloading <name>' log says what is being unloaded."""
    cls = _cache.get(name)
    if cls is None:
        safe = name if name.isidentifier() else "RemoteModel"
        cls = _cache[name] = type(safe, (_native.RemoteModel,), {"__module__": "bulkhead.remote"})
    return cls


class _Owner:
    """The host-side runtime of one worker: its stand-ins, and the three
    actions a stand-in forwards (StandIn calls these)."""

    def __init__(self, host, worker):
        self.host = host
        self.worker = worker
        self.generation = None
        self.pid = None
        self.standins = {}   # model_id -> StandIn (strong: the ledger entry holds a weakref)
        self._read_at = None  # ((pid, the record's version), the record) of the last read

    # --- StandIn -> worker ---

    def standin_release(self, model_id, nbytes):
        receipt = None
        s = self.standins.get(model_id)
        peer = self.worker.peer
        if s is not None and str(s.load_device) == "cpu" and peer is not None and peer.sent is not None:
            # RAM asked for (upstream's free_memory on the cpu device): the
            # host's blocks kept for tensors sent to this worker again go, as
            # on the full ladder (Worker.release); the worker drops its own.
            peer.sent.clear()
        try:
            receipt = self.worker.release(targets.RELEASE_MODEL, model_id, nbytes,
                                          timeout_s=release_timeout_s(self.worker))
        except _DEAD as e:
            # A dead (or hung, now killed) worker's memory is gone: its
            # stand-ins read 0 from now on, so upstream counts it freed.
            # They leave ComfyUI's list at the next reconcile, not now:
            # upstream is iterating that list by index.  Nothing raises
            # into upstream's loop; the log says what happened.
            log.warning("bulkhead: releasing model %s: %s", model_id, e)
            for s in self.standins.values():
                _native.standin_retire(s)
        except RemoteError as e:
            # The pack's model failed to unload; upstream's loop must go on
            # (the stand-in reports what was actually freed, and the rest is
            # posted to idle siblings).
            log.warning("bulkhead: %s could not release model %s: %s",
                        self.worker.describe(), model_id, e.detail)
        self.host.note_release(self.worker, (receipt or {}).get("freed_bytes", 0))

    def standin_load(self, model_id, nbytes):
        receipt = self.worker.load(model_id, nbytes, timeout_s=release_timeout_s(self.worker))
        return (receipt or {}).get("loaded_bytes", 0)

    def standin_pressure(self, model_id, nbytes):
        self.host.pressure(self.worker, nbytes)

    # --- reconciliation ---

    def _retire_all(self, mm):
        if not self.standins:
            return
        for s in self.standins.values():
            _native.standin_retire(s)
        gone = set(id(s) for s in self.standins.values())
        mm.current_loaded_models[:] = [lm for lm in mm.current_loaded_models if id(lm.model) not in gone]
        self.standins.clear()

    def _record(self, ledger):
        """The worker's record (None: it has none), read again only where
        its version moved since the last read: the drain runs after every
        node call, and a read checks the process in /proc.  The version is
        taken before the read, so a change during it shows next time."""
        version = ledger.version(self.pid)
        if self._read_at is None or self._read_at[0] != (self.pid, version):
            self._read_at = ((self.pid, version), None if version is None else ledger.read(self.pid))
        return self._read_at[1]

    def moved(self, ledger):
        """Whether the running worker's record changed since it was last
        read here (or was never read)."""
        at = self._read_at
        return self.pid is not None and (at is None or at[0] != (self.pid, ledger.version(self.pid)))

    def reconcile(self, mm, ledger):
        """Makes ComfyUI's ledger match the worker's record: stand-ins for
        new models, a LoadedModel re-inserted for any resident model that
        upstream popped, stand-ins of models the worker dropped (or of a
        generation that ended) removed."""
        w = self.worker
        w.poll()  # a worker that died idle: reaped and torn down now, not at its next call
        if not w.alive or w.generation != self.generation or w.pid != self.pid:
            self._retire_all(mm)
            self.generation, self.pid = (w.generation, w.pid) if w.alive else (None, None)
        if self.pid is None:
            return
        record = self._record(ledger)
        if record is None or not (record["models"] or self.standins):
            return  # no record, or no model in it nor stand-in here: nothing to match
        listed = {id(lm.model): lm for lm in mm.current_loaded_models if lm.model is not None}
        seen = set()
        for m in record["models"]:
            mid = m["id"]
            seen.add(mid)
            s = self.standins.get(mid)
            if s is None:
                dev = _torch_device(m["device"])
                s = _native.standin(
                    self, ledger, self.pid, mid, generation=self.generation, name=m["name"],
                    size_bytes=m["size_bytes"], model=_remote_class(m["name"])(),
                    load_device=dev, offload_device=_torch_device("cpu"), **standin_identity())
                self.standins[mid] = s
            if self.host.register_standins and m["resident_bytes"] > 0 and id(s) not in listed:
                self.host.register(mm, s)
        for mid in [k for k in self.standins if k not in seen]:
            s = self.standins.pop(mid)
            _native.standin_retire(s)
            mm.current_loaded_models[:] = [lm for lm in mm.current_loaded_models if lm.model is not s]


class HostMemory:
    """The host's half of bulkhead's memory management (see module doc)."""

    def __init__(self, mm=None, ledger_path=None, pack="host", control=True, register_standins=True):
        if mm is None:
            import comfy.model_management as mm  # comfyui: comfy.model_management
        self.mm = mm
        # False on a ComfyUI with the MemoryHolder registry (bulkhead.holder):
        # upstream asks the holder, so reconcile lists no stand-in there.
        self.register_standins = register_standins
        self.ledger = _native.Ledger(ledger_path)
        v = sys.version_info
        self.ledger.join("host", pack=pack, interpreter=f"{v[0]}.{v[1]}.{v[2]}")
        self.base_reserve = int(getattr(mm, "EXTRA_RESERVED_VRAM", 0))
        self._published = None
        self.owners = {}          # Worker -> _Owner
        self.pending = {}         # Worker -> (device, admitted, held_at_admission)
        self.events = []          # (time, kind, worker name, bytes): releases and evictions
        self._gpu = None
        self._gpu_tried = False
        self._lock = threading.RLock()
        self._swept = 0.0         # monotonic time of the last drain over every worker
        self._host_ids = {}       # id(inner module) -> model id in this host's record
        self._host_rows = {}      # model id -> row published
        self._host_devices = set()
        self.control = None
        if control:
            try:
                self.control = ControlServer(self, RELEASE_TIMEOUT_S)
            except OSError as e:  # a control directory not ours (rundir): stay in the budget
                log.warning("bulkhead: no control socket for this host (`bulkhead release` cannot "
                            "reach it): %s", e)

    # --- workers ---

    def attach(self, worker):
        """Puts a worker under this budget: it publishes into this ledger
        and asks for admission before it loads.  Call before it starts."""
        worker.env[spec.LEDGER] = self.ledger.path
        worker.env[spec.MEMORY] = "1"
        # The worker follows the host's pager and VRAM state; a pack's own
        # env_vars (already in worker.env) outrank these.
        worker.env.setdefault(spec.WORKER_PAGER, "1" if pager.host_pager_enabled() else "0")
        worker.env.setdefault(spec.PAGER_HEADROOM, str(self.base_reserve))
        state = getattr(getattr(self.mm, "vram_state", None), "name", None)
        if state:
            worker.env.setdefault(spec.VRAM_STATE, state)
        worker.expose(targets.ADMIT, functools.partial(self._worker_admit, worker))
        worker.expose(targets.LOADS_DONE, functools.partial(self._worker_loads_done, worker))
        self.owners[worker] = _Owner(self, worker)
        return worker

    def detach_worker(self, worker):
        owner = self.owners.pop(worker, None)
        if owner is not None:
            owner._retire_all(self.mm)
        self.pending.pop(worker, None)
        self._publish_reserve()

    def close(self):
        if self.control is not None:
            self.control.close()
        for w in list(self.owners):
            self.detach_worker(w)
        self.ledger.close()
        if self._gpu is not None:
            self._gpu.close()

    # --- ComfyUI's ledger ---

    def register(self, mm, standin):
        """Inserts a LoadedModel for a stand-in the way load_models_gpu
        would have, but with currently_used False: it is a worker's model,
        not part of the prompt running here."""
        lm = mm.LoadedModel(standin)
        real = standin.model
        lm.real_model = weakref.ref(real)
        lm.model_finalizer = weakref.finalize(real, mm.cleanup_models)
        lm.currently_used = False
        mm.current_loaded_models.insert(0, lm)
        return lm

    def reconcile(self, called=None):
        """The drain: every worker's stand-ins made to match the ledger, and
        the reserve re-published.  Runs on ComfyUI's execution thread (after
        each proxied call, at admission, at a prompt's end), never
        concurrently with its eviction loop.  called: the worker whose call
        just ended (the drain after a node): that one is reconciled in full,
        the others only where their record moved (its version: no lock, no
        system call), and all of them at least every SWEEP_S, which is when
        one that died idle is seen (also at the prompt's end).  A full sweep
        after every call cost ~10 us a worker (its lock, two waitpid): a
        quarter of a millisecond a node with 20 packs."""
        with self._lock:
            now = time.monotonic()
            full = called is None or now - self._swept >= SWEEP_S
            if full:
                self._swept = now
            for w, owner in list(self.owners.items()):
                if full or w is called or owner.moved(self.ledger):
                    owner.reconcile(self.mm, self.ledger)
            self._publish_reserve()
            self._census()

    def _census(self):
        """The host's own record: ComfyUI's own models (not the stand-ins),
        so `bulkhead status`, the panel and other instances on the machine
        see what this process holds.  A model is its inner module, counted
        once however many patchers (clones) wrap it."""
        held, seen = {}, set()
        for lm in list(self.mm.current_loaded_models):
            p = lm.model
            if p is None or isinstance(p, _native.StandIn):
                continue
            inner = getattr(p, "model", None)
            key = id(inner if inner is not None else p)
            if key in seen:
                continue
            seen.add(key)
            try:
                size, resident = int(lm.model_memory()), int(lm.model_loaded_memory())
            except Exception:
                continue
            dev = str(lm.device)
            held[dev] = held.get(dev, 0) + resident
            mid = self._host_ids.setdefault(key, len(self._host_ids) + 1)
            name = type(inner if inner is not None else p).__name__[:47]
            row = (name, dev, size, resident)
            if self._host_rows.get(mid) != row:
                try:
                    self.ledger.set_model(mid, name, dev, size, resident)
                except _native.LedgerError:
                    continue
                self._host_rows[mid] = row
        live = {self._host_ids[k] for k in seen}
        for mid in [m for m in self._host_rows if m not in live]:
            self.ledger.drop_model(mid)
            del self._host_rows[mid]
        for dev in set(held) | self._host_devices:
            try:
                self.ledger.set_device(dev, held_bytes=held.get(dev, 0))
            except _native.LedgerError as e:  # more devices than a record holds: never fails a node
                log.warning("bulkhead: %s; device %s is not published", e, dev)
        self._host_devices |= set(held)

    def standins(self, worker=None):
        owners = [self.owners[worker]] if worker is not None else self.owners.values()
        return [s for o in owners for s in o.standins.values()]

    def worker_entries(self):
        mine = set(id(s) for s in self.standins())
        return [lm for lm in self.mm.current_loaded_models if id(lm.model) in mine]

    # --- measuring ---

    def gpu_probe(self):
        """The NVML probe (a _native.Gpu), made on first use; None where
        there is no NVIDIA driver."""
        if not self._gpu_tried:
            self._gpu_tried = True
            try:
                self._gpu = _native.Gpu()
            except _native.Error:
                self._gpu = None  # no driver: upstream's own semantics
        return self._gpu

    def true_free(self, device):
        """(valid, bytes): the device-wide truth.  cpu: available RAM
        clamped to the cgroup; cuda: NVML by UUID.  Invalid when there is
        no way to know (then upstream's own figure stands)."""
        if device.type == "cpu":
            return True, _native.ram()["available_bytes"]
        if device.type == "cuda":
            gpu = self.gpu_probe()
            if gpu is None:
                return False, 0
            try:
                import torch  # optional: torch
                uuid = str(torch.cuda.get_device_properties(device).uuid)
                index = gpu.find(uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
            except Exception:
                index = gpu.visible(os.environ.get("CUDA_VISIBLE_DEVICES"), device.index or 0)
            return True, gpu.memory(index)[1]
        return False, 0

    def upstream_free(self, device):
        """(upstream's free figure, this process's allocator cache).  On cpu
        upstream reports its free figure as its torch figure too; there is
        no cache there."""
        total, torch_free = self.mm.get_free_memory(device, torch_free_too=True)
        return total, (0 if device.type == "cpu" else torch_free)

    # --- pressure and admission ---

    def candidates(self, device_name, exclude=None, foreign=True):
        """Workers that may be asked to release on device_name, as
        release.Candidate rows: this host's running workers that are not
        the asker and not in a call, and (foreign=True) idle workers of
        other bulkhead hosts on the machine, asked through their host's
        control socket.  Each one's release(n) is release.release: the
        worker's lock within its release timeout, then its own release
        timeout, the bytes freed measured from the ledger."""
        out = []
        records = {r["pid"]: r for r in self.ledger.records()}

        def on_device(rec):
            resident = sum(m["resident_bytes"] for m in rec["models"] if m["device"] == device_name)
            floor = sum(d["floor_bytes"] for d in rec["devices"] if d["device"] == device_name)
            return resident, floor

        def release(target, wait_s):
            def ask(n):
                r = _release.release(target, n, wait_s=wait_s, hm=self, ledger=self.ledger,
                                     kind="admission", remote_timeout_s=RELEASE_TIMEOUT_S,
                                     raise_dead=True)
                return r["freed_bytes"]
            return ask

        for w in self.owners:
            if w is exclude or not w.alive or w.busy or w.pid not in records:
                continue
            rec = records[w.pid]
            resident, floor = on_device(rec)
            out.append(_release.Candidate(w.name, rec["last_used_ns"], resident, floor,
                                          release(_release.Local(w), release_timeout_s(w)), w))
        if not foreign:
            return out
        me = os.getpid()
        for rec in records.values():
            if rec["role"] != "worker" or rec["host_pid"] in (0, me) or rec["run"] != "idle":
                continue
            if records.get(rec["host_pid"], {}).get("role") != "host":
                continue  # its host is gone or never joined: nobody to ask
            resident, floor = on_device(rec)
            # Idle in the ledger: its host does not wait for it if a call
            # started meanwhile.
            target = _release.Remote(rec["host_pid"], rec["pid"], rec["pack"])
            out.append(_release.Candidate(f"{rec['pack']} (pid {rec['pid']}, host {rec['host_pid']})",
                                          rec["last_used_ns"], resident, floor, release(target, 0.0), None))
        return out

    def _plan(self, device_name, shortfall, exclude=None, foreign=True):
        cands = self.candidates(device_name, exclude, foreign)
        rows = [(True, c.last_used_ns, c.resident_bytes, c.floor_bytes) for c in cands]
        asks, uncovered = _native.policy_release_plan(rows, shortfall)
        return [(cands[i], n) for i, n in asks], uncovered

    def pressure(self, asker, nbytes):
        """A stand-in of `asker` was asked for nbytes inside ComfyUI's
        eviction loop: post the same shortfall to idle siblings, least
        recently used first, without waiting for them (release.post)."""
        for owner in self.owners.values():
            if owner.worker is asker:
                dev = next(iter(s.load_device for s in owner.standins.values()), None)
                break
        else:
            return
        if dev is None:
            return
        _release.post(self, str(dev), nbytes, exclude=asker, kind="pressure")

    def note_release(self, worker, nbytes=0):
        """An eviction through a stand-in, with the bytes the worker's
        receipt says it freed, in the timeline."""
        _release.note(self, "evict", worker.name, nbytes)

    # What a worker sends is checked before anything acts on it: a byte
    # count in [0, 2**63) (the policy bindings refuse the rest in C too),
    # and worker_pid the calling worker's own, not a sibling's.
    @staticmethod
    def _check_caller(worker, worker_pid):
        if worker_pid is not None and worker_pid != worker.pid:
            raise PermissionError(f"{worker.describe()} asked for worker_pid {worker_pid!r}; "
                                  f"a worker may only speak for itself (pid {worker.pid})")

    def _worker_admit(self, worker, device, need_bytes, worker_pid=None):
        self._check_caller(worker, worker_pid)
        if not isinstance(device, str):
            raise TypeError(f"admit: device must be a str, not {type(device).__name__}")
        if type(need_bytes) is not int or not 0 <= need_bytes < 1 << 63:
            raise ValueError(f"admit: need_bytes must be an int in [0, 2**63), not {need_bytes!r}")
        return self.admit(device, need_bytes, worker_pid)

    def _worker_loads_done(self, worker, worker_pid=None):
        self._check_caller(worker, worker_pid)
        return self.loads_done(worker_pid)

    def admit(self, device, need_bytes, worker_pid=None):
        """CALLBACK from a worker about to load need_bytes onto device.
        Phase one: idle sibling workers release, least recently used first,
        re-measuring true free after each.  Phase two: the residual goes to
        upstream's free_memory with the change-of-variables target and the
        workers' entries kept loaded, so every victim there is the host's
        own.  Then the load is published in the reserve until the worker's
        census shows it."""
        with self._lock:
            dev = _torch_device(device)
            asker = next((w for w in self.owners if w.pid == worker_pid), None)
            self.reconcile()
            valid, true_free = self.true_free(dev)
            released = 0
            if valid and need_bytes > true_free:
                plan, _ = self._plan(str(dev), need_bytes - true_free, exclude=asker)
                for cand, n in plan:
                    try:
                        freed = cand.release(n)   # records the admission event
                    except (_DEAD + (WorkerBusy, RemoteError, ConnectionError, _native.Error)) as e:
                        log.warning("bulkhead: %s could not release for an admission: %s", cand.label,
                                    error_detail(e))
                        _release.note(self, "admission", cand.label, 0)
                        freed = 0
                    released += freed
                    valid, true_free = self.true_free(dev)
                    if true_free >= need_bytes:
                        break
                self.reconcile()
            upstream_free, cache = self.upstream_free(dev)
            target = _native.policy_ask_target(need_bytes, upstream_free, cache, true_free, valid)
            evicted = self.mm.free_memory(target, dev, keep_loaded=self.worker_entries())
            if asker is not None:
                rec = self.ledger.read(asker.pid) or {"devices": []}
                held = sum(d["held_bytes"] for d in rec["devices"] if d["device"] == str(dev))
                self.pending[asker] = (str(dev), need_bytes, held)
            self._publish_reserve()
            valid, free_after = self.true_free(dev)
            return {"granted": True, "free_bytes": free_after, "released_bytes": released,
                    "host_evicted": len(evicted or ())}

    def loads_done(self, worker_pid=None):
        """CALLBACK: the worker's load finished and its census is published;
        what was admitted now shows in a reading."""
        with self._lock:
            for w in [w for w in self.pending if w.pid == worker_pid]:
                del self.pending[w]
            self._publish_reserve()

    def _publish_reserve(self):
        pendings = []
        for w, (dev, admitted, held_at) in list(self.pending.items()):
            if not w.alive:
                del self.pending[w]
                continue
            rec = self.ledger.read(w.pid) or {"devices": []}
            held = sum(d["held_bytes"] for d in rec["devices"] if d["device"] == dev)
            p = _native.policy_pending(admitted, held_at, held)
            if p == 0:
                del self.pending[w]
            else:
                pendings.append(p)
        value = _native.policy_reserve(self.base_reserve, pendings)
        if value != self._published:
            # The one value bulkhead writes into ComfyUI.
            self.mm.EXTRA_RESERVED_VRAM = value
            self._published = value
