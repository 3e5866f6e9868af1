"""Worker-side helpers for test_forward_refs.py's scope tests (#37): what a
worker can read of the mapping an array it got lies in."""

import ctypes


def several(sizes, fills):
    """uint8 arrays of the given sizes, each filled with its byte (one
    message: the small ones share arena blocks)."""
    import numpy as np
    return [np.full(n, f, dtype=np.uint8) for n, f in zip(sizes, fills)]


def one(n, fill):
    import numpy as np
    return np.full(n, fill, dtype=np.uint8)


_kept = {}


def kept(n, fill):
    """A torch uint8 tensor of n bytes `fill`, the same object on every
    call (a cached output): its second crossing on goes in a block kept
    for it, sealed against writes (tensors.SendCache), the only kind the
    host forwards."""
    import torch
    t = _kept.get((n, fill))
    if t is None:
        t = _kept[(n, fill)] = torch.full((n,), fill, dtype=torch.uint8)
    return t


def drop_kept():
    """Lets the cached tensors go (their kept blocks with them)."""
    _kept.clear()


def around(a):
    """The byte values this process can read in the mapping that holds a's
    bytes, outside a's own bytes (sorted), and that mapping's size."""
    addr = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                break
        else:
            raise LookupError(f"no mapping holds {addr:#x}")
    data = ctypes.string_at(lo, hi - lo)
    start = addr - lo
    outside = data[:start] + data[start + a.nbytes:]
    return sorted(set(outside)), hi - lo


def trim():
    """Destroys this worker's free blocks: the next array takes a new one,
    or the one block freed after this."""
    from bulkhead import worker
    return worker._peer.channel.trim_pool(0)
