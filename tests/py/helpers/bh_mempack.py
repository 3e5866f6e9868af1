"""A pack for the memory tests, run inside a bulkhead worker.

Its models hold real RAM: a ``RamPatcher`` is a model patcher (the members
ComfyUI's LoadedModel reads) whose weights are torch tensors in chunks;
"offloading" frees chunks, because on the cpu device there is nowhere to
offload to and the test must see RAM come back.  The worker's own
``comfy.model_management`` (the tests' ComfyUI-shaped package, or a real
checkout through COMFYUI_PATH) loads and unloads it; bulkhead's worker
runtime reports it to the host through the ledger.
"""

import os
import sys
import uuid

_mm = None


def _comfy():
    global _mm
    if _mm is None:
        sys.argv = ["main.py", "--cpu"]
        import comfy.options
        comfy.options.enable_args_parsing()
        import comfy.model_management as mm
        _mm = mm
    return _mm


# Weights are allocated in chunks of this many bytes (the benchmark uses
# small ones so a 1-byte partial release frees little).
CHUNK = int(os.environ.get("BH_MEMPACK_CHUNK", 8 * 1024 * 1024))


class RamModule:
    """What the patcher's .model is (ComfyUI logs its class name)."""


class RamPatcher:
    def __init__(self, name, size_bytes, stuck=False):
        import torch
        self.torch = torch
        mm = _comfy()
        self.name = name
        self.size = size_bytes
        self.chunks = []
        self.loaded = 0
        self.model = type(name, (RamModule,), {})()
        self.load_device = mm.get_torch_device()
        self.offload_device = self.load_device
        self.parent = None
        self.clone_base_uuid = uuid.uuid4()
        self.calls = []
        self.stuck = stuck  # a broken model: unloading it raises

    # accounting
    def model_size(self):
        return self.size

    def loaded_size(self):
        return self.loaded

    def current_loaded_device(self):
        return self.load_device

    def model_dtype(self):
        return self.torch.uint8

    def lowvram_patch_counter(self):
        return 0

    # actions
    def _grow(self, nbytes):
        added = 0
        while self.loaded_size() < self.size and added < nbytes:
            n = min(CHUNK, self.size - self.loaded_size())
            t = self.torch.empty(n, dtype=self.torch.uint8)
            t.fill_(1)  # touch every page: real RSS
            self.chunks.append(t)
            self.loaded += n
            added += n
        return added

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        self.calls.append(("partially_load", extra_memory))
        if extra_memory >= 1e30:
            return self._grow(self.size)
        return self._grow(int(extra_memory)) if extra_memory >= CHUNK else 0

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        self.calls.append(("partially_unload", memory_to_free))
        if self.stuck:
            raise RuntimeError(f"{self.name} cannot be unloaded")
        freed = 0
        while self.chunks and freed < memory_to_free:
            freed += self.chunks.pop().numel()
        self.loaded -= freed
        return freed

    def detach(self, unpatch_all=True):
        self.calls.append(("detach", unpatch_all))
        if unpatch_all and self.stuck:
            raise RuntimeError(f"{self.name} cannot be unloaded")
        if unpatch_all:
            self.chunks = []
            self.loaded = 0
        return self.model

    def model_patches_to(self, device):
        pass

    def model_patches_models(self):
        return []

    def get_nested_additional_models(self):
        return []

    def is_clone(self, other):
        return hasattr(other, "model") and self.model is other.model

    def is_dynamic(self):
        return False

    def clone(self):
        """A clone as ComfyUI makes them: another patcher over the same
        module (here: the same state)."""
        c = object.__new__(RamPatcher)
        c.__dict__ = self.__dict__
        return c


_models = {}


def load(name, size_bytes, stuck=False):
    """Creates a model and loads it through the worker's load_models_gpu
    (wrapped by bulkhead: admission first).  Returns its resident bytes."""
    mm = _comfy()
    p = _models.get(name)
    if p is None:
        p = _models[name] = RamPatcher(name, size_bytes, stuck)
    mm.load_models_gpu([p])
    return p.loaded_size()


def load_clone(name, clone_name):
    """Loads a clone of model `name` as `clone_name` (same module)."""
    mm = _comfy()
    c = _models[clone_name] = _models[name].clone()
    mm.load_models_gpu([c])
    return c.loaded_size()


def drop(name):
    """Forgets a model entirely (the pack released its last reference)."""
    mm = _comfy()
    p = _models.pop(name, None)
    mm.current_loaded_models[:] = [lm for lm in mm.current_loaded_models if lm.model is not p]


def resident():
    return {n: p.loaded_size() for n, p in _models.items()}


def calls(name):
    return _models[name].calls


def split_pins(ceiling):
    """As a worker on a GPU machine: ComfyUI computed `ceiling` as its pin
    ceiling; bulkhead's worker runtime takes this worker's share."""
    mm = _comfy()
    mm.MAX_PINNED_MEMORY = ceiling
    from bulkhead import worker
    return worker.memory_runtime.split_pins(), mm.MAX_PINNED_MEMORY


def pid():
    return os.getpid()


def crash():
    os._exit(9)


def sleep(seconds):
    """Keeps the worker in a call (busy) for a while."""
    import time
    time.sleep(seconds)
    return seconds
