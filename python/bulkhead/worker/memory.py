"""Worker side of the one memory budget: the census, the release ladders,
admission before a load.

A worker is a real ComfyUI process: the pack's models live in the
worker's own ``comfy.model_management.current_loaded_models`` and its own
upstream manager handles them.  This module (active when the host attached
the worker to its budget: ``BULKHEAD_MEMORY=1``, ``BULKHEAD_LEDGER``)
adds four things:

* the census: after every call and every release, each model's size and
  residency, and per device the bytes held, go into this worker's record
  in the shared ledger (instantaneous allocator bytes, never a high-water
  mark), which is what the host's stand-ins read;
* the release ladders, reached from the host by RELEASE frames: a model
  (n bytes of it, through upstream's own partial/full escalation), n bytes
  of the worker (upstream's own ``free_memory`` choosing the victims), the
  full ladder (models, cast buffers, pins, allocator cache), pins only;
  and their one opposite, a load (``load``, the host's ``Worker.load``: a
  stand-in's ``partially_load``), n bytes more of a model onto its device;
* the node boundary (soft cache release after each call) and the idle
  sweep (a full release after the configured idle time, from the serve
  loop's idle timeout, on the main thread);
* admission: the worker's ``load_models_gpu`` is wrapped (in the worker
  only: here bulkhead is every caller) to ask the host for the bytes first.

ComfyUI is imported by the pack, not by bulkhead: the hooks install
themselves once ``comfy.model_management`` appears in ``sys.modules``.
"""

import contextlib
import ctypes
import gc
import itertools
import os
import sys
import threading
import time
import weakref

from .. import _native, pager
from .. import worker as _worker
from .._importwatch import when_imported
from ..channel import spec, targets

_libc = None


def _channel():
    peer = _worker._peer
    return getattr(peer, "channel", None) if peer is not None else None


def load(model_id, nbytes):
    """targets.LOAD, the host's ``Worker.load``: nbytes more of model
    model_id onto its device (``WorkerMemory.load``); the receipt."""
    runtime = _worker.memory_runtime
    if runtime is None:
        raise RuntimeError("this worker is not under the host's memory budget: it has no model the host "
                           "can load")
    return runtime.load(model_id, nbytes)


def _shm_bytes():
    """RAM this worker holds in shared-memory blocks of its channel (RAM
    on the cpu device in its record): blocks lent to the host, which a
    tensor there keeps alive, and free ones kept for reuse."""
    chan = _channel()
    try:
        return int(chan.stats()["own_bytes"]) if chan is not None else 0
    except Exception:  # a closed channel: the worker is on its way out
        return 0


def _trim_shm():
    """The full ladder's step for the channel's free blocks (kept for
    reuse, up to the pool's keep_bytes) and the blocks kept for tensors
    this worker returns again unchanged (tensors.SendCache): every one
    goes (one the host still holds, when it returns it)."""
    chan = _channel()
    try:
        if chan is None:
            return 0
        before = int(chan.stats()["own_bytes"])
        _drop_sent()
        trimmed = chan.trim_pool(0)
        return trimmed + max(0, before - trimmed - int(chan.stats()["own_bytes"]))
    except Exception:
        return 0


def _drop_sent():
    sent = getattr(_worker._peer, "sent", None)
    if sent is not None:
        sent.clear()


def _trim_heap():
    """Returns freed heap pages to the OS (glibc keeps them otherwise, and
    RAM the worker freed must show as available)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def ledger_name(name):
    """A pack name cut to what the ledger's pack field holds (UTF-8, on a
    character boundary).  A long pack directory name must not keep its
    worker out of the memory budget: the ledger would refuse the join."""
    b = name.encode("utf-8")
    limit = _native.LEDGER_PACK_MAX - 1
    if len(b) <= limit:
        return name
    return b[:limit - 3].decode("utf-8", "ignore") + "..."


class WorkerMemory:
    RECOUNT_S = 0.05  # quiet after a request: recount() (worker/__init__.py)

    def __init__(self, ledger_path, pack, generation, host_pid, call_host, idle_release_s=0.0):
        v = sys.version_info
        self.ledger = _native.Ledger(ledger_path)
        self.ledger.join("worker", pack=ledger_name(pack), interpreter=f"{v[0]}.{v[1]}.{v[2]}",
                         generation=generation, host_pid=host_pid)
        self.call_host = call_host
        self.idle_release_s = idle_release_s
        self.mm = None
        # A model is the module its patchers wrap: ComfyUI clones patchers
        # freely (a LoRA, a sampler option) and clones share the module, so
        # they are one model here, counted once.
        self._ids = weakref.WeakKeyDictionary()   # inner module -> model id (stable for its life)
        self._patcher = {}                        # model id -> weakref to its latest patcher
        self._next_id = itertools.count(1)
        self._full_warned = False
        self._published = {}                      # model id -> tuple published
        self._devices = set()
        self.pager = None          # comfy_aimdo.control when the pager is up
        self.pager_reason = ""
        self._floor = {}           # device -> bytes held with no model resident
        self._depth = 0            # calls from the host in progress (nested through callbacks)
        self._working = 0          # the pack's own work in progress (working(): a job a route started)
        self._working_lock = threading.Lock()
        self.host_pid = host_pid
        self._pin_split = None     # this worker's share of the pin budget, once split
        self._split_at = 0.0
        if not self._hook():
            when_imported("comfy.model_management", self._hook)

    # --- ComfyUI hooks ---

    def _hook(self, mm=None):
        if self.mm is not None:
            return True
        if mm is None:      # looked up (the watcher hands over a module that has executed)
            mm = sys.modules.get("comfy.model_management")
            if mm is None or getattr(getattr(mm, "__spec__", None), "_initializing", False):
                return False   # not imported, or still importing on another thread (an async node's task)
        self.mm = mm
        original = mm.load_models_gpu
        wm = self

        def load_models_gpu(models, memory_required=0, force_patch_weights=False,
                            minimum_memory_required=None, force_full_load=False):
            wm.admit(models, memory_required)
            try:
                return original(models, memory_required=memory_required,
                                force_patch_weights=force_patch_weights,
                                minimum_memory_required=minimum_memory_required,
                                force_full_load=force_full_load)
            finally:
                wm.census()
                wm.call_host(targets.LOADS_DONE, os.getpid())

        load_models_gpu.__wrapped__ = original
        mm.load_models_gpu = load_models_gpu  # worker-side patch (never in the host)
        self._follow_host()
        return True

    def _follow_host(self):
        """vram_state and the pager follow the host's (seed 004)."""
        mm = self.mm
        state = os.environ.get(spec.VRAM_STATE)
        if state and hasattr(mm, "VRAMState") and state in mm.VRAMState.__members__:
            if mm.vram_state != mm.VRAMState.DISABLED:  # a cpu worker stays on cpu
                mm.vram_state = mm.VRAMState[state]  # worker-side
        env = os.environ.get(spec.WORKER_PAGER)
        device = mm.get_torch_device()
        control = pager.import_control() if env == "1" else None
        enabled, reason = pager.decide(env, device.type, control)
        if enabled:
            try:
                pager.bring_up(control, int(os.environ.get(spec.PAGER_HEADROOM, "0") or 0),
                               [device.index or 0])
                self.pager = control
            except Exception as e:  # the host's choice could not be followed: say so, go on
                enabled, reason = False, f"comfy-aimdo failed to start: {e}"
        if env == "1" and not enabled:
            print(f"bulkhead: WARNING: this worker runs the legacy ledger while its host pages: {reason}",
                  file=sys.stderr)
        self.pager_reason = reason
        self.split_pins()

    def split_pins(self):
        """One RAM budget for pinned memory (seed 001 row 8, seed 004 "Pinned
        memory is per process"): every process that imports ComfyUI's memory
        manager computes its own MAX_PINNED_MEMORY from the machine's RAM,
        so N processes would promise N times most of it.  A worker takes
        its share: upstream's ceiling for this machine (RAM clamped to the
        cgroup, swap) split across its host and the host's live workers,
        which share the host's cgroup.  The host keeps upstream's own figure
        (bulkhead writes nothing else there), so the promise is at most
        ceiling * (2 - 1/N), not N * ceiling.  Pinning disabled
        (MAX_PINNED_MEMORY <= 0, --disable-pinned-memory) stays disabled."""
        mm = self.mm
        current = getattr(mm, "MAX_PINNED_MEMORY", None)
        if not isinstance(current, (int, float)) or current <= 0:
            return None
        ram = _native.ram(os.environ.get(spec.RAM_ROOT) or None)
        windows = sys.platform == "win32"
        ceiling = _native.policy_pin_ceiling(ram["total_bytes"], ram["swap_total_bytes"], windows)
        host = self.host_pid
        n = sum(1 for r in self.ledger.records()
                if r["pid"] == host or (r["role"] == "worker" and r["host_pid"] == host))
        share = _native.policy_share(ceiling, max(n, 1))
        mm.MAX_PINNED_MEMORY = min(int(current), share) if self._pin_split is None else share  # worker-side
        self._pin_split = share
        return share

    def _model_id(self, patcher):
        inner = getattr(patcher, "model", None)
        key = inner if inner is not None else patcher
        try:
            mid = self._ids.get(key)
            if mid is None:
                mid = self._ids[key] = next(self._next_id)
        except TypeError:  # an inner object that cannot be weakly referenced
            key = patcher
            mid = self._ids.get(key)
            if mid is None:
                mid = self._ids[key] = next(self._next_id)
        self._patcher[mid] = weakref.ref(patcher)
        return mid

    def _entries(self):
        """(id, LoadedModel) of every live entry of this worker's ledger."""
        out = []
        for lm in list(self.mm.current_loaded_models):
            p = lm.model
            if p is not None:
                out.append((self._model_id(p), lm))
        return out

    # --- census ---

    def census(self):
        """Publishes every live model this worker has loaded, resident or
        not: a model upstream unloaded (popped from its list) keeps its
        entry at 0 resident while the pack still holds it, so the host's
        stand-in survives and is re-listed when it loads again.  A model
        leaves the ledger when its patcher is collected.  Before ComfyUI is
        imported here (a pack whose nodes never touch comfy), only the
        shared-memory blocks are: the RAM its results hold in the host."""
        if not self._hook():
            self._publish_shm()
            return
        for _mid, lm in self._entries():   # assigns ids to new entries
            self._devices.add(str(lm.device))
        held = {}
        seen = set()
        for mid, ref in list(self._patcher.items()):
            p = ref()
            if p is None:
                del self._patcher[mid]
                continue
            try:
                size, resident = int(p.model_size()), int(p.loaded_size())
                dev = str(p.load_device)
            except Exception:
                continue
            inner = getattr(p, "model", None)
            name = type(inner).__name__ if inner is not None else type(p).__name__
            row = (name[:47], dev, size, resident)
            seen.add(mid)
            held[dev] = held.get(dev, 0) + resident
            if self._published.get(mid) != row:
                try:
                    self.ledger.set_model(mid, row[0], dev, size, resident)
                except _native.LedgerError as e:  # a record holds so many models; the rest go unseen
                    if not self._full_warned:
                        self._full_warned = True
                        print(f"bulkhead.worker: WARNING: {e}; models beyond it are not published",
                              file=sys.stderr)
                    continue
                self._published[mid] = row
        for mid in [m for m in self._published if m not in seen]:
            self.ledger.drop_model(mid)
            del self._published[mid]
        pinned = int(getattr(self.mm, "TOTAL_PINNED_MEMORY", 0) or 0)
        ceiling = max(0, int(getattr(self.mm, "MAX_PINNED_MEMORY", 0) or 0))
        shm = _shm_bytes()
        if shm:
            self._devices.add("cpu")
        for dev in self._devices | set(held):
            total = self._allocator_bytes(dev, held.get(dev, 0)) + (shm if dev == "cpu" else 0)
            if held.get(dev, 0) == 0:
                # The floor: what this process holds with no model resident
                # (CUDA context, allocator slack), the lowest seen after the
                # first call (warm-up), never the first reading.
                self._floor[dev] = min(self._floor.get(dev, total), total)
            pager_held = pager.pager_bytes(self.pager) if self.pager and dev.startswith("cuda") else 0
            try:
                self.ledger.set_device(dev, held_bytes=max(total, pager_held), pinned_bytes=pinned,
                                       pin_ceiling_bytes=ceiling, pager_bytes=pager_held,
                                       floor_bytes=self._floor.get(dev, 0))
            except _native.LedgerError as e:  # more devices than a record holds: never fails a node
                if not self._full_warned:
                    self._full_warned = True
                    print(f"bulkhead.worker: WARNING: {e}; device {dev} is not published",
                          file=sys.stderr)
        self._devices |= set(held)

    def _publish_shm(self):
        """The cpu device's record with the channel's block bytes alone (a
        worker without ComfyUI's memory manager holds no model)."""
        shm = _shm_bytes()
        if not shm and "cpu" not in self._devices:
            return
        self._devices.add("cpu")
        try:
            self.ledger.set_device("cpu", held_bytes=shm, pinned_bytes=0, pin_ceiling_bytes=0, pager_bytes=0,
                                   floor_bytes=0)
        except _native.LedgerError:
            pass

    def _allocator_bytes(self, dev, weights):
        """Instantaneous bytes held on dev: torch's reserved bytes on CUDA
        (never the peak), the models' resident bytes elsewhere."""
        if dev.startswith("cuda"):
            torch = sys.modules.get("torch")
            try:
                return int(torch.cuda.memory_reserved(torch.device(dev)))
            except Exception:
                pass
        return weights

    # --- admission ---

    def admit(self, models, memory_required):
        mm = self.mm
        device = mm.get_torch_device()
        weights = 0
        for m in models:
            try:
                size, loaded = int(m.model_size()), int(m.loaded_size())
            except Exception:
                continue
            on_device = str(getattr(m, "current_loaded_device", lambda: None)()) == str(device)
            weights += size - loaded if on_device else size
        need = _native.policy_admission_need(weights, int(memory_required), int(mm.minimum_inference_memory()),
                                             int(mm.extra_reserved_memory()),
                                             self._cast_buffer_bytes(models, device))
        return self.call_host(targets.ADMIT, str(device), need, os.getpid())

    def _cast_buffer_bytes(self, models, device):
        """What the incoming load's cast buffers will take (seed 004: one per
        offload stream, sized to the largest weight cast): booked into the
        ask, since no reading shows them at admission.  None off CUDA."""
        streams = int(getattr(self.mm, "NUM_STREAMS", 0) or 0)
        if device.type != "cuda" or streams <= 0:
            return 0
        largest = 0
        for m in models:
            module = getattr(m, "model", None)
            params = getattr(module, "parameters", None)
            if not callable(params):
                continue
            for t in params():
                largest = max(largest, t.numel() * t.element_size())
        return streams * largest

    # --- the release ladders ---

    def _find(self, model_id):
        for mid, lm in self._entries():
            if mid == model_id:
                return lm
        return None

    def _drop_entries(self, doomed):
        ids = set(id(lm) for lm in doomed)
        self.mm.current_loaded_models[:] = [lm for lm in self.mm.current_loaded_models if id(lm) not in ids]

    def _resident(self):
        return sum(int(lm.model.loaded_size()) for _, lm in self._entries())

    def release(self, req):
        """RELEASE frame: {op, model_id, bytes}.  Returns the receipt."""
        op, model_id, nbytes = req.get("op"), req.get("model_id"), req.get("bytes")
        if not self._hook():
            # No model here; the full ladder still gives back the blocks the
            # host returned (ComfyUI's cache dropping a result) and the heap.
            shm_freed = 0
            if op == targets.RELEASE_ALL:
                gc.collect()
                shm_freed = _trim_shm()
                _trim_heap()
            self._publish_shm()
            return {"before_bytes": 0, "after_bytes": 0, "freed_bytes": 0,
                    "shm_freed_bytes": shm_freed, "note": "ComfyUI not loaded"}
        self.ledger.set_run("releasing")
        before = self._resident()
        shm_freed = 0
        try:
            if op == targets.RELEASE_MODEL:
                lm = self._find(model_id)
                if lm is not None:
                    if nbytes is None:
                        lm.model_unload()
                        self._drop_entries([lm])
                    elif lm.model_unload(memory_to_free=nbytes):
                        self._drop_entries([lm])
                    # RAM asked for (upstream's free_memory on the cpu device,
                    # through the stand-in): the blocks kept for outputs sent
                    # again go too, as on the full ladder; the host drops its
                    # own (host/memory.py standin_release).
                    if str(lm.device) == "cpu":
                        shm_freed = _trim_shm()
            elif op == targets.RELEASE_BYTES:
                self._release_bytes(int(nbytes or 0))
            elif op == targets.RELEASE_ALL:
                shm_freed = self._full_release()
            elif op == targets.RELEASE_PINS:
                self._release_pins()
            else:
                raise ValueError(f"unknown release op {op!r} ({', '.join(targets.RELEASE_OPS)})")
            if op != targets.RELEASE_ALL:
                self.mm.soft_empty_cache()
                _trim_heap()
        finally:
            self.census()
            self.ledger.set_run(self._rest())
        after = self._resident()
        freed = max(0, before - after)
        if freed:
            self.ledger.note_release(freed)
        return {"before_bytes": before, "after_bytes": after, "freed_bytes": freed, "shm_freed_bytes": shm_freed}

    def load(self, model_id, nbytes):
        """A stand-in's load (module ``load``, targets.LOAD): nbytes more of
        model model_id onto its device, through upstream's own
        ``model_use_more_vram``.  Returns the receipt: ``before_bytes``,
        ``after_bytes`` (resident), ``loaded_bytes`` (what the model
        grew by).  Not a release: no release counted, no cache emptied;
        the census follows, as after a release."""
        if not self._hook():
            self._publish_shm()
            return {"before_bytes": 0, "after_bytes": 0, "loaded_bytes": 0, "note": "ComfyUI not loaded"}
        self.ledger.set_run("busy")
        before = self._resident()
        loaded = 0
        try:
            lm = self._find(model_id)
            if lm is not None and nbytes:
                was = int(lm.model.loaded_size())
                lm.model_use_more_vram(nbytes)
                loaded = max(0, int(lm.model.loaded_size()) - was)
        finally:
            self.census()
            self.ledger.set_run(self._rest())
        return {"before_bytes": before, "after_bytes": self._resident(), "loaded_bytes": loaded}

    def _release_bytes(self, nbytes):
        """n bytes of this worker, its models taken in upstream's eviction
        order (most already offloaded first, then smallest, then newest),
        each through upstream's own partial/full escalation, counting what
        each actually freed by its residency: not by re-measuring the
        device's free figure, which on the cpu device moves with every
        other process on the machine (and lags frees by whole MiB)."""
        entries = []
        for i, (_mid, lm) in enumerate(self._entries()):
            try:
                size, loaded = int(lm.model_memory()), int(lm.model_loaded_memory())
            except Exception:
                continue
            if loaded > 0:
                entries.append(((-(size - loaded), size, i), lm))  # index 0: the newest
        remaining = nbytes
        for _key, lm in sorted(entries, key=lambda e: e[0]):
            if remaining <= 0:
                break
            before = int(lm.model_loaded_memory())
            if lm.model_unload(memory_to_free=remaining):
                self._drop_entries([lm])
            after = int(lm.model.loaded_size()) if lm.model is not None else 0
            remaining -= max(0, before - after)

    def _full_release(self):
        """The full ladder, in dependency order: models off the device, then
        a collection (cycles still holding blocks hand them back), then the
        channel's free shared-memory blocks, the cast buffers, pins, the
        device allocator cache, and torch's pinned host cache last (it
        would miss buffers the collection returned), then the heap.
        Returns the shared-memory bytes freed."""
        mm = self.mm
        entries = [lm for _, lm in self._entries()]
        for lm in entries:
            lm.model_unload()
        self._drop_entries(entries)
        gc.collect()  # ~40 ms with torch loaded: only on this ladder
        shm_freed = _trim_shm()  # after the collection: tensors it freed gave their blocks back
        reset = getattr(mm, "reset_cast_buffers", None)
        if callable(reset):
            reset()
        self._release_pins()
        mm.soft_empty_cache()
        torch = sys.modules.get("torch")
        host_empty = getattr(getattr(torch, "_C", None), "_host_emptyCache", None)
        if callable(host_empty):
            try:
                host_empty()
            except RuntimeError:
                pass  # no CUDA in this build: nothing pinned
        _trim_heap()
        return shm_freed

    def _release_pins(self):
        free_pins = getattr(self.mm, "free_pins", None)
        if callable(free_pins):
            try:
                free_pins(1 << 62)
            except TypeError:
                pass

    # --- node boundary and idle ---

    def call_started(self):
        """A call from the host begins (calls nest through callbacks)."""
        self._depth += 1
        if self._depth == 1:
            self.ledger.set_run("busy")

    def after_call(self):
        """The node boundary: the allocator cache goes back, the census is
        published, the worker is idle again (and its last use stamped)."""
        self._depth -= 1
        if self._depth > 0:
            return
        if self._hook():
            self.mm.soft_empty_cache()
            now = time.monotonic()
            if self._pin_split is not None and now - self._split_at > 2.0:
                self._split_at = now
                self.split_pins()  # the host may have started or lost workers since
            self.census()
        else:
            self._publish_shm()
        self.ledger.set_run(self._rest())

    def _rest(self):
        """The run state between a host's requests: busy inside one,
        working while the pack's own work goes on, else idle."""
        return "busy" if self._depth else "working" if self._working else "idle"

    @contextlib.contextmanager
    def working(self):
        """bulkhead.working(): while it is held, this worker is never idle
        (no idle exit, no exit under memory pressure or /free; an idle
        release does not ask it) though no node runs."""
        with self._working_lock:
            self._working += 1
            if self._working == 1 and not self._depth:
                self.ledger.set_run("working")
        try:
            yield
        finally:
            with self._working_lock:
                self._working -= 1
                if not self._working and not self._depth:
                    self.ledger.set_run("idle")

    def recount(self):
        """The census once more, after a call's result went (its blocks
        were taken while it was encoded, after the call's own census)."""
        self.census()

    def on_idle(self):
        if self.mm is not None and self._entries():
            self.release({"op": targets.RELEASE_ALL})
