"""Test patchers for ComfyUI's memory manager: objects to put in
`comfy.model_management.current_loaded_models` that answer exactly the
members upstream reads off a ledger entry, record every call, and flag
any other member read.

Used inside the scripts `comfyenv.run_comfy_script` runs (the same code
against tests/comfyui/ and against a real ComfyUI checkout):

    SpyPatcher(name, size)        bytes are numbers only
    RamPatcher(name, chunks)      bytes are real RAM on the CPU: loading
                                  allocates and touches 64 MiB chunks,
                                  unloading frees them, so psutil sees it
    ledger_resident(ledger, pid)  a process's resident model bytes in the ledger
    rss_bytes(pid)                a process's resident set, from /proc
    free_readings(mm)             a list that gets every free figure
                                  `mm.get_free_memory` returns from now on
    fake_device(mm, capacity)     make `mm.get_free_memory` report, for a
                                  fake CUDA device, capacity (64 GiB unless
                                  given) minus what the spies hold resident
                                  there.  Keep it well above the inference
                                  reserve (1.2 GiB): a load first frees
                                  1.1 x its size + that reserve

A spy's state lives on its `.model` object (an `Inner`), as a real
ModelPatcher's lives on its torch module, so a clone (spy.spy_clone())
shares it.  Test code reads spies only through names starting with `_`
or `spy_`, which are never recorded.

COMFY_SURFACE is the 18 members bulkhead's stand-in answers (seed 000).
DYNAMIC_ONLY are members upstream reads only off models whose
is_dynamic() is True; a spy answers them only when built dynamic.
"""

import math
import weakref

COMFY_SURFACE = frozenset({
    "load_device", "offload_device", "parent", "model", "model_size", "loaded_size",
    "current_loaded_device", "model_dtype", "model_patches_to", "model_patches_models",
    "partially_load", "partially_unload", "detach", "lowvram_patch_counter", "is_dynamic",
    "is_clone", "clone_base_uuid", "get_nested_additional_models",
})
DYNAMIC_ONLY = frozenset({"loaded_ram_size", "partially_unload_ram", "unregister_inactive_pins"})

MiB = 1024 * 1024
CHUNK = 64 * MiB          # above glibc's largest mmap threshold: every chunk is its own mapping

LOG = []                  # [name, call, argument] in call order, all spies
READS = set()             # public members read off any spy
STRAY = set()             # public members read that a spy does not answer
_INNERS = weakref.WeakSet()


def reset_log():
    del LOG[:]
    READS.clear()
    STRAY.clear()


class Inner:
    """What a spy's `.model` is (the torch module of a real patcher)."""

    def __init__(self, name, size, where):
        self.name = name
        self.size = size
        self.resident = 0
        self.where = where
        _INNERS.add(self)


class SpyPatcher:
    """Answers COMFY_SURFACE.  partially_load(dev, n) makes up to n more
    bytes resident (n >= what is left: all of it; 0.1 rounds to nothing);
    partially_unload(dev, n) frees `partial(n, resident)` bytes (default
    exactly n, at most what is resident); detach(True) frees everything,
    detach(False) nothing."""

    def __init__(self, name, size, device=None, offload=None, dynamic=False, partial=None, inner=None):
        import torch
        cpu = torch.device("cpu")
        self._name = name
        self._dynamic = dynamic
        self._partial = partial
        self.load_device = device if device is not None else cpu
        self.offload_device = offload if offload is not None else cpu
        self.parent = None
        self.model = inner if inner is not None else Inner(name, size, self.offload_device)
        import uuid
        self.clone_base_uuid = uuid.uuid4()

    def __getattribute__(self, name):
        if not name.startswith("_") and not name.startswith("spy_"):
            READS.add(name)
            if name not in COMFY_SURFACE and not (name in DYNAMIC_ONLY and object.__getattribute__(self, "_dynamic")):
                STRAY.add(name)
                raise AttributeError(f"{name!r} is not a member upstream may read (COMFY_SURFACE)")
        return object.__getattribute__(self, name)

    def __repr__(self):
        return f"<spy {self._name}>"

    def _log(self, call, arg=None):
        LOG.append([self._name, call, arg])

    # -- helpers for test code (never recorded) --------------------------------

    @property
    def _inner(self):
        return object.__getattribute__(self, "model")

    def spy_resident(self):
        return self._inner.resident

    def spy_set_resident(self, n):
        self._inner.resident = n

    def spy_clone(self):
        c = type(self).__new__(type(self))
        c.__dict__.update(self.__dict__)
        c._name = self._name + "'"
        c.parent = self
        return c

    # -- the surface -------------------------------------------------------------

    def model_size(self):
        return self._inner.size

    def loaded_size(self):
        return self._inner.resident

    def current_loaded_device(self):
        return self._inner.where

    def model_dtype(self):
        return None

    def lowvram_patch_counter(self):
        return 0

    def is_dynamic(self):
        return self._dynamic

    def is_clone(self, other):
        return hasattr(other, "model") and self._inner is other.model

    def get_nested_additional_models(self):
        return []

    def model_patches_models(self):
        return []

    def model_patches_to(self, device):
        self._log("model_patches_to", str(device))

    def partially_load(self, device, extra_memory=0, force_patch_weights=False):
        self._log("partially_load", extra_memory)
        inner = self._inner
        room = inner.size - inner.resident
        add = room if extra_memory >= room else max(0, int(extra_memory))
        self._grow(add)
        inner.where = device
        return add

    def partially_unload(self, device, memory_to_free=0, force_patch_weights=False):
        self._log("partially_unload", memory_to_free)
        inner = self._inner
        want = memory_to_free if self._partial is None else self._partial(memory_to_free, inner.resident)
        return self._shrink(min(inner.resident, max(0, int(math.ceil(want)))))

    def detach(self, unpatch_all=True):
        self._log("detach", unpatch_all)
        if unpatch_all:
            self._shrink(self._inner.resident)
            self._inner.where = object.__getattribute__(self, "offload_device")   # not a read by upstream
        return self._inner

    def loaded_ram_size(self):                 # DYNAMIC_ONLY
        return 0

    def partially_unload_ram(self, size, subsets=None):
        return 0

    def unregister_inactive_pins(self, size, subsets=None):
        return 0

    # -- byte bookkeeping (RamPatcher makes it real) -----------------------------

    def _grow(self, n):
        self._inner.resident += n

    def _shrink(self, n):
        self._inner.resident -= n
        return n


class RamPatcher(SpyPatcher):
    """A spy whose resident bytes are real RAM: `chunks` chunks of CHUNK
    bytes, allocated and written on load, freed on unload (whole chunks:
    a partial unload frees the fewest chunks covering the request)."""

    def __init__(self, name, chunks, **kw):
        super().__init__(name, chunks * CHUNK, **kw)
        self._inner.tensors = []

    def _grow(self, n):
        import torch
        inner = self._inner
        for _ in range(n // CHUNK):
            inner.tensors.append(torch.empty(CHUNK, dtype=torch.uint8).fill_(1))
        inner.resident = len(inner.tensors) * CHUNK

    def _shrink(self, n):
        inner = self._inner
        freed = 0
        while inner.tensors and freed < n:
            inner.tensors.pop()
            freed += CHUNK
        inner.resident = len(inner.tensors) * CHUNK
        return freed


def resident_on(device):
    return sum(i.resident for i in list(_INNERS) if str(i.where) == str(device))


def fake_device(mm, capacity=64 * 1024 ** 3, device=None):
    """Report `capacity - resident bytes` as free on a fake CUDA device
    (torch.device('cuda', 7) unless given); every other device goes to
    the real get_free_memory.  Returns the device."""
    import torch
    dev = device if device is not None else torch.device("cuda", 7)
    real = mm.get_free_memory

    def get_free_memory(d=None, torch_free_too=False):
        if d is not None and str(d) == str(dev):
            free = capacity - resident_on(dev)
            return (free, 0) if torch_free_too else free
        return real(d, torch_free_too)

    mm.get_free_memory = get_free_memory
    return dev


def free_readings(mm):
    """Records every figure `mm.get_free_memory` returns from now on (what
    upstream's own walk re-measured, in order) into the list it returns.
    Readings taken after the walk can differ: anything on the machine
    may allocate meanwhile."""
    seen = []
    real = mm.get_free_memory

    def get_free_memory(d=None, torch_free_too=False):
        r = real(d, torch_free_too)
        seen.append(r[0] if isinstance(r, tuple) else r)
        return r

    mm.get_free_memory = get_free_memory
    return seen


def ledger_resident(ledger, pid):
    """The resident bytes of every model pid's ledger record lists (0 when
    it has none)."""
    rec = ledger.read(pid)
    return sum(m["resident_bytes"] for m in rec["models"]) if rec else 0


def rss_bytes(pid):
    """The process's resident set (VmRSS), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024
