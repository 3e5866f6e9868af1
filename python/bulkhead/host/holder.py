"""The holder side of the MemoryHolder hook proposed upstream (seed 001,
"The ask"; the patch is docs/upstream/memory-holder.patch).

On a ComfyUI with the registry, ``comfy.model_management`` offers

    register_memory_holder(holder) / unregister_memory_holder(holder)

and ``free_memory`` asks every registered holder, after its own walk over
``current_loaded_models`` leaves it short, for the shortfall:
``holder.release_memory(device, size) -> int``, the bytes freed.
``unload_all_models`` reaches the holders through ``free_memory(1e30, ...)``:
everything.

bulkhead registers ONE holder per host process (``install``), and on such
a ComfyUI lists no stand-ins in ComfyUI's ledger: upstream asks the holder
instead of walking eighteen duck-typed members (``HostMemory``'s
``register_standins`` flag, set False here).

The answer is synchronous and never blocks: ComfyUI calls it on its own
thread, inside free_memory, inside a node.  It is computed from what the
shared ledger already says (each worker's resident bytes and floor on the
device, its last use) by the same plan as an admission and as pressure
(``release.post``: ``HostMemory.candidates`` are the idle workers, and
``policy_release_plan`` takes them least recently used first, each for at
most what it holds above its floor, until ``size`` is covered), and the
releases are posted (``Worker.post_release``: a frame, no reply awaited).  It returns the bytes it asked for: what will be freed
right after the call.  A worker that is busy (in a call, or being asked
by another thread) is not asked, and what it holds is not promised.
Workers of other bulkhead hosts on the machine are not asked here (that
would mean a blocking round trip through their host's control socket);
their own host's holder answers for them in their ComfyUI.
"""

import logging
import threading

from .. import _native
from . import contract, release

log = logging.getLogger("bulkhead")

REGISTER = "register_memory_holder"
UNREGISTER = "unregister_memory_holder"

def registry(mm):
    """(register, unregister) when ComfyUI's memory manager offers the
    MemoryHolder registry with the shape bulkhead calls (one argument
    each), else None."""
    register = getattr(mm, REGISTER, None)
    unregister = getattr(mm, UNREGISTER, None)
    if not (callable(register) and callable(unregister)):
        return None
    for fn in (register, unregister):
        ok, _why = contract.accepts(fn, "holder")
        if not ok:
            return None
    return register, unregister


def _ask_bytes(size):
    """size as upstream passes it (an int, or a float such as 1e30) ->
    the bytes to plan for (policy: bh_policy_ask_bytes), 0 for anything
    that is not a number."""
    try:
        return _native.policy_ask_bytes(size)
    except (TypeError, ValueError):
        return 0


def device_name(device):
    """The ledger's name of a device upstream passes (a torch.device or a
    string): 'cpu', 'cuda:0'.  A CUDA device without an index is the
    current one.  None for no device."""
    if device is None:
        return None
    name = str(device)
    if name == "cuda":
        index = 0
        try:
            import torch  # optional: torch
            index = torch.cuda.current_device()
        except Exception:
            pass
        name = f"cuda:{index}"
    return name


class BulkheadHolder:
    """bulkhead's MemoryHolder: the host's workers, as ComfyUI's memory
    manager sees them on a ComfyUI with the registry."""

    def __init__(self, hm):
        self.hm = hm
        self.asked_bytes = 0      # totals, for status and tests
        self.promised_bytes = 0
        self.calls = 0

    def release_memory(self, device, size):
        """Frees up to `size` bytes on `device` behind the call; returns
        the bytes it will free (0 when no idle worker holds any there).
        Never raises and never waits for a worker."""
        n = _ask_bytes(size)
        name = device_name(device)
        self.calls += 1
        if n == 0 or name is None:
            return 0
        self.asked_bytes += n
        promised = 0
        try:
            promised = self._post(name, n)
        except Exception as e:  # upstream's loop must go on: say what went wrong, promise nothing more
            log.warning("bulkhead: the memory holder could not plan a release of %d bytes on %s: %r",
                        n, name, e)
        self.promised_bytes += promised
        return promised

    def _post(self, name, n):
        """Posts releases for n bytes on device `name` (release.post: the
        admission's plan over this host's idle workers, a busy one left
        out and the rest planned again).  Returns the bytes posted."""
        return release.post(self.hm, name, n, kind="holder")

    def __repr__(self):
        return f"<bulkhead.holder.BulkheadHolder: {len(self.hm.owners)} workers>"


_installed = None          # (holder, unregister, hm)
_lock = threading.Lock()


def install(hm, mm=None):
    """Registers this process's one BulkheadHolder for `hm` when ComfyUI
    offers the registry, and retires the stand-ins (no LoadedModel is
    listed for a worker's model from now on).  Returns the holder, or
    None on a ComfyUI without the registry (stand-ins stay).  Call it
    before the first worker is attached.  A second call returns the
    holder already registered."""
    global _installed
    mm = mm if mm is not None else hm.mm
    with _lock:
        if _installed is not None:
            return _installed[0]
        reg = registry(mm)
        if reg is None:
            return None
        register, unregister = reg
        holder = BulkheadHolder(hm)
        register(holder)
        hm.register_standins = False
        _installed = (holder, unregister, hm)
        log.info("bulkhead: ComfyUI asks bulkhead's memory holder for workers' memory (no stand-ins)")
        return holder


def installed():
    """The registered holder, or None."""
    return _installed[0] if _installed is not None else None


def uninstall():
    """Unregisters the holder (stand-ins come back at the next reconcile)."""
    global _installed
    with _lock:
        if _installed is None:
            return
        holder, unregister, hm = _installed
        _installed = None
        try:
            unregister(holder)
        finally:
            hm.register_standins = True
