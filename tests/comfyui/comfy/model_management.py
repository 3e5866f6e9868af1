"""A stand-in for ComfyUI's memory manager (`comfy.model_management`).

Written for bulkhead's tests from a reading of upstream's behaviour; it holds
no upstream code.  The functions below decide the same things upstream's do,
in the same order, reading the same members off the same objects: that is
the point of it, since bulkhead's stand-in models sit in this module's
ledger and are judged by what this module asks of them.  tests/comfyui/
README.md names the upstream revision followed.

The ledger
    `current_loaded_models` is a list of LoadedModel, newest first (a load
    inserts at index 0).  An entry holds its patcher (a ModelPatcher or
    anything answering the same members) only through a weak reference:
    the list observes models, it never keeps them alive.  Two finalizers
    keep it tidy: when a patcher that has a parent dies, its entry re-points
    at the parent; when the underlying torch module dies, `cleanup_models`
    drops every entry whose module is gone.  An entry whose module is alive
    but whose patcher is gone "is dead" (a leak): eviction skips it and
    `cleanup_models_gc` collects garbage and warns about it.  Equality of
    entries is identity of their patchers, so two dead entries are equal.

Eviction (free_memory)
    Candidates are the entries on the device, not in keep_loaded and not
    dead; each is marked not currently used.  They are visited in ascending
    (-offloaded bytes, sys.getrefcount(patcher), model bytes, ledger index):
    the most offloaded first, then the least referenced, the smallest, the
    newest.  Before each one the shortfall is measured again
    (memory_required - get_free_memory(device)) and the entry is asked to
    unload only while it is positive, so the walk frees the minimum.  An
    entry asked for less than it holds unloads partially and stays listed
    when that was enough; otherwise it is detached and leaves the ledger.
    With for_dynamic a dynamic (paged) entry is never unloaded for another
    dynamic load: its resident bytes are subtracted from the requirement.

Loading (load_models_gpu)
    Deduplicates the requested patchers (with the models their patches
    carry), re-registers entries that are clones of a requested model (pop,
    detach(unpatch_all=False), which keeps weights in place), frees
    1.1 x the bytes still to load plus the inference reserve on every device
    that is not the CPU, works out how much of each model may be resident
    (0.1 means "essentially nothing", 0 means "no limit" and becomes 1e32
    for partially_load) and inserts each entry at the head of the ledger.

Device cpu
    Under --cpu every model's load device is the CPU: load_models_gpu frees
    nothing there (the CPU is skipped) and loads every model whole
    (partially_load(cpu, 1e32)); the ledger is only emptied by an explicit
    free_memory(..., cpu) or unload_all_models(), which measure free RAM
    (psutil, clamped to the memory cgroup).  soft_empty_cache does nothing.

Only the CPU (and, untested, CUDA and MPS) back ends are modelled.
"""

import gc
import logging
import os
import platform
import sys
import threading
import weakref
from enum import Enum

import psutil
import torch

import comfy.memory_management
import comfy.system_memory
import comfy.utils
from comfy.cli_args import args, PerformanceFeature  # noqa: F401  (upstream exports both)
from comfy.internal_logging import detail


class VRAMState(Enum):
    DISABLED = 0     # no VRAM: models are never moved to a card
    NO_VRAM = 1      # very little: every saving on
    LOW_VRAM = 2
    NORMAL_VRAM = 3
    HIGH_VRAM = 4
    SHARED = 5       # unified memory (MPS)


class CPUState(Enum):
    GPU = 0
    CPU = 1
    MPS = 2


vram_state = VRAMState.NORMAL_VRAM
set_vram_to = VRAMState.NORMAL_VRAM
cpu_state = CPUState.GPU
total_vram = 0

lowvram_available = True
directml_enabled = False

try:
    if torch.backends.mps.is_available():
        cpu_state = CPUState.MPS
except Exception:
    pass

if args.cpu:
    cpu_state = CPUState.CPU


# -- devices -----------------------------------------------------------------

def is_intel_xpu():
    return False


def is_ascend_npu():
    return False


def is_mlu():
    return False


def is_nvidia():
    return cpu_state == CPUState.GPU and bool(torch.version.cuda)


def is_amd():
    return cpu_state == CPUState.GPU and bool(torch.version.hip)


def cpu_mode():
    return cpu_state == CPUState.CPU


def mps_mode():
    return cpu_state == CPUState.MPS


def is_device_type(device, type):
    return hasattr(device, "type") and device.type == type


def is_device_cpu(device):
    return is_device_type(device, "cpu")


def is_device_mps(device):
    return is_device_type(device, "mps")


def is_device_cuda(device):
    return is_device_type(device, "cuda")


def is_directml_enabled():
    return directml_enabled


def get_torch_device():
    if cpu_state == CPUState.MPS:
        return torch.device("mps")
    if cpu_state == CPUState.CPU:
        return torch.device("cpu")
    return torch.device(torch.cuda.current_device())


def get_all_torch_devices(exclude_current=False):
    """Every device models may be loaded on: each CUDA device on an NVIDIA or
    AMD build, otherwise just the current device."""
    if cpu_state == CPUState.GPU and (is_nvidia() or is_amd()):
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    else:
        devices = [get_torch_device()]
    if exclude_current:
        current = get_torch_device()
        if current in devices:
            devices.remove(current)
    return devices


def _host_device(dev):
    return hasattr(dev, "type") and dev.type in ("cpu", "mps")


def get_total_memory(dev=None, torch_total_too=False):
    if dev is None:
        dev = get_torch_device()
    if _host_device(dev):
        total = comfy.system_memory.virtual_memory_total()
        torch_total = total
    else:
        torch_total = torch.cuda.memory_stats(dev)["reserved_bytes.all.current"]
        _, total = torch.cuda.mem_get_info(dev)
    return (total, torch_total) if torch_total_too else total


def get_free_memory(dev=None, torch_free_too=False):
    """Bytes free on `dev`.  On the CPU (and MPS) that is the system's
    available RAM, clamped to the memory cgroup, and both halves of the
    torch_free_too pair are that same figure.  On CUDA it is the driver's
    free figure plus what torch holds cached but unused."""
    if dev is None:
        dev = get_torch_device()
    if _host_device(dev):
        free_total = comfy.system_memory.virtual_memory_available()
        free_torch = free_total
    else:
        stats = torch.cuda.memory_stats(dev)
        free_torch = stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
        free_driver, _ = torch.cuda.mem_get_info(dev)
        free_total = free_driver + free_torch
    return (free_total, free_torch) if torch_free_too else free_total


total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)
total_ram = comfy.system_memory.virtual_memory_total() / (1024 * 1024)
logging.info("Total VRAM {:0.0f} MB, total RAM {:0.0f} MB".format(total_vram, total_ram))

try:
    OOM_EXCEPTION = torch.cuda.OutOfMemoryError
except AttributeError:
    OOM_EXCEPTION = Exception


def is_oom(e):
    """Whether `e` is an out-of-memory error (the class above, or an
    accelerator error whose message says so)."""
    if isinstance(e, OOM_EXCEPTION) and OOM_EXCEPTION is not Exception:
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()

MIN_WEIGHT_MEMORY_RATIO = 0.0 if is_nvidia() else 0.4

if args.lowvram:
    set_vram_to = VRAMState.LOW_VRAM
    lowvram_available = True
elif args.novram:
    set_vram_to = VRAMState.NO_VRAM
elif args.highvram or args.gpu_only:
    vram_state = VRAMState.HIGH_VRAM

if lowvram_available and set_vram_to in (VRAMState.LOW_VRAM, VRAMState.NO_VRAM):
    vram_state = set_vram_to
if cpu_state != CPUState.GPU:
    vram_state = VRAMState.DISABLED
if cpu_state == CPUState.MPS:
    vram_state = VRAMState.SHARED
logging.info(f"Set vram state to: {vram_state.name}")

DISABLE_SMART_MEMORY = args.disable_smart_memory
if DISABLE_SMART_MEMORY:
    logging.info("Disabling smart memory management")

NUM_STREAMS = 0
if args.async_offload is not None:
    NUM_STREAMS = args.async_offload
elif is_nvidia() or is_amd():
    NUM_STREAMS = 2
if args.disable_async_offload:
    NUM_STREAMS = 0

WINDOWS = any(platform.win32_ver())

EXTRA_RESERVED_VRAM = 400 * 1024 * 1024
if WINDOWS:
    EXTRA_RESERVED_VRAM = 600 * 1024 * 1024      # shared-VRAM trouble on Windows
    if total_vram > 15 * 1024:                  # and a little more on 16 GB+ cards
        EXTRA_RESERVED_VRAM += 100 * 1024 * 1024
if args.reserve_vram is not None:
    EXTRA_RESERVED_VRAM = args.reserve_vram * 1024 * 1024 * 1024
    logging.debug("Reserving {}MB vram for other applications.".format(EXTRA_RESERVED_VRAM / (1024 * 1024)))


def extra_reserved_memory():
    return EXTRA_RESERVED_VRAM


def minimum_inference_memory():
    return (1024 * 1024 * 1024) * 0.8 + extra_reserved_memory()


def unet_offload_device():
    return get_torch_device() if vram_state == VRAMState.HIGH_VRAM else torch.device("cpu")


def intermediate_device():
    return get_torch_device() if args.gpu_only else torch.device("cpu")


def text_encoder_offload_device():
    return get_torch_device() if args.gpu_only else torch.device("cpu")


def vae_offload_device():
    return get_torch_device() if args.gpu_only else torch.device("cpu")


def module_size(module):
    """Bytes of a module's state dict."""
    return sum(t.nbytes for t in module.state_dict().values())


def dtype_size(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return 2
    if dtype == torch.float32:
        return 4
    return getattr(dtype, "itemsize", 4)


# -- pinned host memory ------------------------------------------------------
# A ceiling with a running total, only on NVIDIA/AMD builds: -1 (off) under
# --cpu.  On Linux swap that is not zram counts toward it unless a memory
# cgroup limits us.

PINNED_MEMORY = {}
TOTAL_PINNED_MEMORY = 0
MAX_PINNED_MEMORY = -1

PIN_PRESSURE_HYSTERESIS = 256 * 1024 * 1024
REGISTERABLE_PIN_HYSTERESIS = 2048 * 1024 * 1024
WINDOWS_PIN_EVICTION_SWAP_PERCENT = 5.0
WINDOWS_PIN_EVICTION_EMERGENCY_AVAILABLE = 512 * 1024 ** 2
PIN_SUBSETS = ["weights", "patches"]
LOADED_PIN_SUBSETS = ["weights-loaded", "patches-loaded"]


def get_disk_swap_total():
    """Bytes of swap listed in /proc/swaps, zram devices excluded; 0 where
    there is no /proc/swaps."""
    if not os.path.exists("/proc/swaps"):
        return 0
    total = 0
    try:
        with open("/proc/swaps", encoding="utf-8") as f:
            next(f, None)                      # the header line
            for line in f:
                name, _kind, size_kb, _used, _prio = line.rsplit(maxsplit=4)
                if os.path.basename(os.path.realpath(name)).startswith("zram"):
                    continue
                total += int(size_kb) * 1024
    except Exception:
        logging.warning("Could not get amount of swap memory on system.")
    return total


def _linux_pin_ceiling(ram, swap):
    gib = 1024 ** 3
    return max(ram * 0.40, min(ram * 0.90, ram - 4 * gib, ram + swap - 16 * gib))


if not args.disable_pinned_memory and (is_nvidia() or is_amd()):
    _ram = get_total_memory(torch.device("cpu"))
    if WINDOWS:
        MAX_PINNED_MEMORY = _ram * 0.40
    else:
        _swap = 0 if comfy.system_memory.cgroup_memory_limit() is not None else get_disk_swap_total()
        MAX_PINNED_MEMORY = _linux_pin_ceiling(_ram, _swap)
    logging.info("Enabled pinned memory {}".format(MAX_PINNED_MEMORY // (1024 * 1024)))


def discard_cuda_async_error():
    try:
        one = torch.tensor([1], dtype=torch.uint8, device=get_torch_device())
        _ = one + one
        synchronize()
    except RuntimeError:
        pass


def pin_memory(tensor):
    """Page-lock a CPU tensor within MAX_PINNED_MEMORY; False when pinning is
    off or the tensor does not qualify."""
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0 or not is_device_cpu(tensor.device):
        return False
    if type(tensor).__name__ not in ("Tensor", "Parameter") or tensor.is_pinned() or not tensor.is_contiguous():
        return False
    size = tensor.nbytes
    comfy.memory_management.extra_ram_release(comfy.memory_management.RAM_CACHE_HEADROOM)
    ensure_pin_registerable(size)
    ptr = tensor.data_ptr()
    if ptr == 0:
        return False
    if torch.cuda.cudart().cudaHostRegister(ptr, size, 1) == 0:
        PINNED_MEMORY[ptr] = size
        TOTAL_PINNED_MEMORY += size
        return True
    logging.warning("Pin error.")
    discard_cuda_async_error()
    return False


def unpin_memory(tensor):
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0 or not is_device_cpu(tensor.device):
        return False
    ptr = tensor.data_ptr()
    if PINNED_MEMORY.get(ptr) != tensor.nbytes:
        logging.warning("Tried to unpin tensor not pinned by ComfyUI")
        return False
    if torch.cuda.cudart().cudaHostUnregister(ptr) == 0:
        TOTAL_PINNED_MEMORY -= PINNED_MEMORY.pop(ptr)
        return True
    logging.warning("Unpin error.")
    discard_cuda_async_error()
    return False


def models_for_pin_eviction(active, current_prompt=None):
    """Dynamic patchers whose pin state matches (None matches anything)."""
    for entry in current_loaded_models:
        patcher = entry.model
        if patcher is None or not patcher.is_dynamic():
            continue
        state = patcher.model.dynamic_pins[patcher.load_device]
        if active is not None and state["active"] != active:
            continue
        if current_prompt is not None and state["current_prompt"] != current_prompt:
            continue
        yield patcher


def free_model_pins(size, subsets, current_prompt, active, registrations=False):
    freed_total = 0
    for patcher in models_for_pin_eviction(active, current_prompt=current_prompt):
        if size <= 0:
            break
        if registrations:
            freed = patcher.unregister_inactive_pins(size, subsets=subsets)
        else:
            freed = patcher.partially_unload_ram(size, subsets=subsets)
        freed_total += freed
        size -= freed
    return freed_total


def pin_eviction_tiers(loaded, evict_active):
    tiers = [(PIN_SUBSETS, False, None), (LOADED_PIN_SUBSETS, False, None), (LOADED_PIN_SUBSETS, True, None)]
    if not loaded:
        tiers.append((PIN_SUBSETS, True, False))
        if evict_active:
            tiers.append((PIN_SUBSETS, True, True))
    return tiers


def registration_eviction_tiers(evict_active):
    every = PIN_SUBSETS + LOADED_PIN_SUBSETS
    tiers = [(every, False, False), (every, True, False)]
    if evict_active:
        tiers += [(every, False, True), (every, True, True)]
    return tiers


def free_pins(size, evict_active=False, loaded=False):
    freed = 0
    for subsets, current_prompt, active in pin_eviction_tiers(loaded, evict_active):
        freed += free_model_pins(size - freed, subsets, current_prompt, active)
    return freed


def should_free_pins_for_ram_pressure(shortfall):
    if shortfall <= 0:
        return False
    if not WINDOWS:
        return True
    if comfy.system_memory.virtual_memory_available() < WINDOWS_PIN_EVICTION_EMERGENCY_AVAILABLE:
        return True
    try:
        return psutil.swap_memory().percent >= WINDOWS_PIN_EVICTION_SWAP_PERCENT
    except RuntimeError:
        return True


def ensure_pin_budget(size, evict_active=False, loaded=False):
    """Make room in host RAM for `size` more pinned bytes by dropping pins
    of dynamic models; True when the room is there."""
    if args.high_ram:
        return True
    if args.fast_disk:
        shortfall = TOTAL_PINNED_MEMORY + size - MAX_PINNED_MEMORY
    else:
        headroom = max(comfy.memory_management.RAM_CACHE_HEADROOM / 2, 2048 * 1024 ** 2)
        shortfall = size + headroom - comfy.system_memory.virtual_memory_available()
    if shortfall <= 0:
        return True
    return free_pins(shortfall + PIN_PRESSURE_HYSTERESIS, evict_active=evict_active, loaded=loaded) >= shortfall


def free_registrations(shortfall, evict_active=True):
    if MAX_PINNED_MEMORY <= 0:
        return False
    if shortfall <= 0:
        return True
    shortfall += REGISTERABLE_PIN_HYSTERESIS
    for subsets, current_prompt, active in registration_eviction_tiers(evict_active):
        shortfall -= free_model_pins(shortfall, subsets, current_prompt, active, registrations=True)
    return shortfall <= REGISTERABLE_PIN_HYSTERESIS


def ensure_pin_registerable(size, evict_active=True):
    return free_registrations(TOTAL_PINNED_MEMORY + size - MAX_PINNED_MEMORY, evict_active=evict_active)


# -- the ledger --------------------------------------------------------------

current_loaded_models = []


class LoadedModel:
    """One ledger entry: a weak reference to a patcher, the device it loads
    to, and (once loaded) a weak reference to its torch module."""

    def __init__(self, model):
        self._set_model(model)
        self.device = model.load_device
        self.real_model = None
        self.currently_used = True
        self.model_finalizer = None
        # As upstream: this forgets the parent-switch finalizer _set_model may
        # just have registered; it still fires when the patcher dies.
        self._patcher_finalizer = None

    def _set_model(self, model):
        self._model = weakref.ref(model)
        if model.parent is not None:
            self._parent_model = weakref.ref(model.parent)
            self._patcher_finalizer = weakref.finalize(model, self._switch_parent)
            self._patcher_finalizer.atexit = False

    def _switch_parent(self):
        parent = self._parent_model()
        if parent is not None:
            self._set_model(parent)
            self.device = parent.load_device

    @property
    def model(self):
        return self._model()

    def model_memory(self):
        return self.model.model_size()

    def model_loaded_memory(self):
        return self.model.loaded_size()

    def model_offloaded_memory(self):
        return self.model.model_size() - self.model.loaded_size()

    def model_memory_required(self, device):
        """What loading onto `device` still costs: only the offloaded part
        when the model already lives there."""
        if device == self.model.current_loaded_device():
            return self.model_offloaded_memory()
        return self.model_memory()

    def model_load(self, lowvram_model_memory=0, force_patch_weights=False):
        self.model.model_patches_to(self.device)
        self.model.model_patches_to(self.model.model_dtype())
        budget = lowvram_model_memory
        if budget == 0:
            budget = 1e32                      # 0 means no limit
        self.model_use_more_vram(budget, force_patch_weights=force_patch_weights)
        real_model = self.model.model
        self.real_model = weakref.ref(real_model)
        self.model_finalizer = weakref.finalize(real_model, cleanup_models)
        self.model_finalizer.atexit = False
        return real_model

    def should_reload_model(self, force_patch_weights=False):
        return bool(force_patch_weights and self.model.lowvram_patch_counter() > 0)

    def model_unload(self, memory_to_free=None, unpatch_weights=True):
        """Free `memory_to_free` bytes (None: everything).  Asked for less
        than it holds, the model first unloads partially, and if that freed
        enough it stays in the ledger: False.  Otherwise it is detached:
        True, and the caller drops the entry."""
        if memory_to_free is not None and memory_to_free < self.model.loaded_size():
            freed = self.model.partially_unload(self.model.offload_device, memory_to_free)
            if freed >= memory_to_free:
                return False
        self.model.detach(unpatch_weights)
        self.model_finalizer.detach()
        self.model_finalizer = None
        self.real_model = None
        return True

    def model_use_more_vram(self, extra_memory, force_patch_weights=False):
        return self.model.partially_load(self.device, extra_memory, force_patch_weights=force_patch_weights)

    def __eq__(self, other):
        return self.model is other.model

    def __del__(self):
        if self._patcher_finalizer is not None:
            self._patcher_finalizer.detach()

    def is_dead(self):
        return self.real_model() is not None and self.model is None


def use_more_memory(extra_memory, loaded_models, device):
    for entry in loaded_models:
        if entry.device == device:
            extra_memory -= entry.model_use_more_vram(extra_memory)
            if extra_memory <= 0:
                break


def offloaded_memory(loaded_models, device):
    return sum(entry.model_offloaded_memory() for entry in loaded_models if entry.device == device)


def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False, pins_required=0, ram_required=0):
    """Unload ledger entries on `device` until `memory_required` bytes are
    free there (see the file comment for the order and the stopping rule).
    device None visits every entry but frees nothing (memory_to_free 0).
    Returns the entries removed from the ledger."""
    cleanup_models_gc()
    if not for_dynamic:
        detail("Non dynamic memory free called! memory_required=%s pins_required=%s ram_required=%s",
               memory_required, pins_required, ram_required)

    candidates = []
    for i in range(len(current_loaded_models) - 1, -1, -1):
        entry = current_loaded_models[i]
        if device is not None and entry.device != device:
            continue
        if entry in keep_loaded or entry.is_dead():
            continue
        candidates.append((-entry.model_offloaded_memory(), sys.getrefcount(entry.model), entry.model_memory(), i))
        entry.currently_used = False

    popped = []
    for key in sorted(candidates):
        i = key[-1]
        to_free = 1e32
        if not DISABLE_SMART_MEMORY or device is None:
            to_free = 0 if device is None else memory_required - get_free_memory(device)
            if current_loaded_models[i].model.is_dynamic() and for_dynamic:
                # A paged model makes room on demand: count what it holds as
                # already available instead of unloading it.
                memory_required -= current_loaded_models[i].model.loaded_size()
                to_free = 0
        if to_free > 0 and current_loaded_models[i].model_unload(to_free):
            logging.debug(f"Unloading {current_loaded_models[i].model.model.__class__.__name__}")
            popped.append(i)

    unloaded = [current_loaded_models.pop(i) for i in sorted(popped, reverse=True)]

    if not for_dynamic and pins_required > 0:
        ensure_pin_budget(pins_required)
        ensure_pin_registerable(pins_required)

    if unloaded:
        soft_empty_cache()
    elif device is not None and vram_state != VRAMState.HIGH_VRAM:
        free_total, free_torch = get_free_memory(device, torch_free_too=True)
        if free_torch > free_total * 0.25:
            soft_empty_cache()
    return unloaded


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None, force_full_load=False):
    cleanup_models_gc()
    global vram_state

    inference_memory = minimum_inference_memory()
    extra_mem = max(inference_memory, memory_required + extra_reserved_memory())
    if minimum_memory_required is None:
        minimum_memory_required = extra_mem
    else:
        minimum_memory_required = max(inference_memory, minimum_memory_required + extra_reserved_memory())

    # Deduplicate, keeping first-seen order, then walk it backwards.
    wanted = {}
    for m in models:
        wanted[m] = None
        for extra in m.model_patches_models():
            wanted[extra] = None
    wanted = list(wanted)
    wanted.reverse()

    to_load = []
    all_dynamic = True
    for patcher in wanted:
        if not patcher.is_dynamic():
            all_dynamic = False
        fresh = LoadedModel(patcher)
        try:
            found = current_loaded_models.index(fresh)
        except Exception:
            found = None
        if found is not None:
            existing = current_loaded_models[found]
            existing.currently_used = True
            to_load.append(existing)
        else:
            if hasattr(patcher, "model"):
                logging.info(f"Requested to load {patcher.model.__class__.__name__}")
            to_load.append(fresh)

    # Entries that are clones of what is being loaded (the model itself
    # included) leave the ledger with their weights left in place.
    for entry in to_load:
        clones = []
        for i in range(len(current_loaded_models)):
            if entry.model.is_clone(current_loaded_models[i].model):
                clones.insert(0, i)
        for i in clones:
            old = current_loaded_models.pop(i)
            old.model.detach(unpatch_all=False)
            old.model_finalizer.detach()

    need = {}
    pins = {}
    for entry in to_load:
        dev = entry.device
        need[dev] = need.get(dev, 0) + entry.model_memory_required(dev)
        if not entry.model.is_dynamic():
            pins[dev] = pins.get(dev, 0) + entry.model_memory()

    cpu = torch.device("cpu")
    for dev in need:
        if dev != cpu:
            free_memory(need[dev] * 1.1 + extra_mem, dev, for_dynamic=all_dynamic, pins_required=pins.get(dev, 0))
    for dev in need:
        if dev != cpu and get_free_memory(dev) < minimum_memory_required:
            dropped = free_memory(minimum_memory_required, dev, for_dynamic=all_dynamic)
            logging.info("{} models unloaded.".format(len(dropped)))

    for entry in to_load:
        patcher = entry.model
        load_dev = patcher.load_device
        state = VRAMState.DISABLED if is_device_cpu(load_dev) else vram_state
        budget = 0
        if lowvram_available and state in (VRAMState.LOW_VRAM, VRAMState.NORMAL_VRAM) and not force_full_load:
            resident = entry.model_loaded_memory()
            free_now = get_free_memory(load_dev) + resident
            budget = max(0, free_now - minimum_memory_required,
                         min(free_now * MIN_WEIGHT_MEMORY_RATIO, free_now - minimum_inference_memory()))
            budget = budget - resident
            if budget == 0:
                budget = 0.1                   # load essentially nothing
        if state == VRAMState.NO_VRAM:
            budget = 0.1
        entry.model_load(budget, force_patch_weights=force_patch_weights)
        vram_used = 0 if is_device_cpu(load_dev) else entry.model_loaded_memory()
        ram_used = patcher.loaded_ram_size() if patcher.is_dynamic() else entry.model_memory() - vram_used
        detail("Model loaded: patcher=%s model=%s ram_mb=%.1f vram_mb=%.1f", patcher.__class__.__name__,
               patcher.model.__class__.__name__, ram_used / (1024 ** 2), vram_used / (1024 ** 2))
        current_loaded_models.insert(0, entry)


def load_model_gpu(model):
    return load_models_gpu([model])


def loaded_models(only_currently_used=False):
    return [entry.model for entry in current_loaded_models
            if not only_currently_used or entry.currently_used]


def cleanup_models_gc():
    """When an entry is dead (module alive, patcher gone), collect garbage
    once and warn about every entry still dead afterwards."""
    leaked = next((e for e in current_loaded_models if e.is_dead()), None)
    if leaked is None:
        return
    logging.info("Potential memory leak detected with model {}, doing a full garbage collect, for maximum "
                 "performance avoid circular references in the model code.".format(leaked.real_model().__class__.__name__))
    gc.collect()
    soft_empty_cache()
    for entry in current_loaded_models:
        if entry.is_dead():
            logging.warning("WARNING, memory leak with model {}. Please make sure it is not being referenced "
                            "from somewhere.".format(entry.real_model().__class__.__name__))


def cleanup_models():
    """Drop every entry whose torch module has been freed."""
    gone = [i for i in range(len(current_loaded_models)) if current_loaded_models[i].real_model() is None]
    for i in reversed(gone):
        current_loaded_models.pop(i)


def synchronize():
    if cpu_mode():
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_cast_buffers():
    """Release the per-stream weight-cast staging buffers.  The stub casts
    nothing through staging buffers, so there is nothing to release."""


def soft_empty_cache(force=False):
    """Hand cached device memory back to the driver; nothing to do on the CPU."""
    if cpu_mode():
        return
    if cpu_state == CPUState.MPS:
        torch.mps.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.ipc_collect()


def unload_all_models():
    for device in get_all_torch_devices():
        free_memory(1e30, device)


def unload_model_and_clones(model, unload_additional_models=True, all_devices=False):
    """Unload `model`, its clones and (optionally) its nested additional
    models: everything sharing a clone_base_uuid with them."""
    extras = model.get_nested_additional_models() if unload_additional_models else []
    targets = [model.clone_base_uuid] + [m.clone_base_uuid for m in extras]
    keep_loaded = []
    for entry in current_loaded_models.copy():
        if entry.model is not None and entry.model.clone_base_uuid in targets:
            continue
        keep_loaded.append(entry)
    devices = get_all_torch_devices() if all_devices else [get_torch_device()]
    for device in devices:
        free_memory(1e30, device, keep_loaded)


# -- interruption --------------------------------------------------------------

class InterruptProcessingException(BaseException):
    pass


interrupt_processing_mutex = threading.RLock()
interrupt_processing = False


def interrupt_current_processing(value=True):
    global interrupt_processing
    with interrupt_processing_mutex:
        interrupt_processing = value


def processing_interrupted():
    """Whether an interrupt is pending; reading it does not clear it."""
    with interrupt_processing_mutex:
        return interrupt_processing


def throw_exception_if_processing_interrupted():
    """Raise InterruptProcessingException if an interrupt is pending, and clear it."""
    global interrupt_processing
    with interrupt_processing_mutex:
        if interrupt_processing:
            interrupt_processing = False
            raise InterruptProcessingException()
