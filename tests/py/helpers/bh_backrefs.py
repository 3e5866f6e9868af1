"""Worker-side helpers for tests/py/test_back_refs.py (#26): arrays and
tensors made here, and what the worker sees of one sent back to it."""

_kept = {}


def make(n, lib="numpy", fill=1.0):
    """n float32 values, each `fill` (a block of this worker's, lent to the
    host by the reply)."""
    if lib == "torch":
        import torch
        return torch.full((n,), fill, dtype=torch.float32)
    import numpy as np
    return np.full(n, fill, dtype=np.float32)


def _lease(a):
    base = a
    while getattr(base, "base", None) is not None:
        base = base.base
    return base if type(base).__name__ == "Lease" else None


def _address(a):
    if type(a).__module__.split(".")[0] == "torch":
        return a.data_ptr()
    return a.__array_interface__["data"][0]


def inspect(*arrays):
    """For each array: whether it is a view of a block of this worker's own
    (numpy: its Lease, and whether it is read-only), its sum, its address;
    and this end's pool statistics."""
    out = []
    for a in arrays:
        lease = _lease(a)
        row = {"sum": float(a.sum()), "address": _address(a), "n": int(a.numel() if hasattr(a, "numel") else a.size)}
        if lease is not None:
            row.update(own=lease.own, readonly=lease.readonly, writeable=bool(a.flags.writeable))
        out.append(row)
    return out, stats()


def stats():
    from bulkhead import worker
    return worker._peer.channel.stats()


def copy_on_write(a):
    """Whether the block a numpy array came in is mapped copy-on-write
    here (sealed against writes by the peer)."""
    return _lease(a).copy_on_write


def keep(a):
    """Keeps a (the host may drop its own view of the block meanwhile)."""
    _kept["a"] = a
    return _address(a)


def kept_sum():
    a = _kept["a"]
    return float(a.sum()), _address(a)


def drop():
    _kept.clear()
    return stats()


def write(a, value):
    """Writes value into a received torch tensor in place (torch has no
    read-only tensors) and returns its sum."""
    a.fill_(value)
    return float(a.sum())


def fill(a, value):
    """Writes value into a received array or tensor in place and returns
    its sum (a forwarded block is copy-on-write here: the write stays
    here)."""
    if hasattr(a, "fill_"):
        a.fill_(value)
    else:
        a.fill(value)
    return float(a.sum())


def first(a):
    """The first element: reads one page of a view, not all of it."""
    return float(a[0])


def first_two(a, b):
    """The first elements of two arrays or tensors."""
    return float(a[0]), float(b[0])


def cached(n, fill=1.0):
    """The same torch tensor on every call (a worker's cached output)."""
    import torch
    t = _kept.get(("cached", n))
    if t is None:
        t = _kept[("cached", n)] = torch.full((n,), fill, dtype=torch.float32)
    return t


def forget_cached(n):
    """Lets the cached tensor of n go (the block kept for it with it)."""
    _kept.pop(("cached", n), None)


def cached_add(n, value):
    """Changes the cached tensor in place."""
    cached(n).add_(value)


def trim():
    """Destroys this end's free blocks (each the peer mapped is retired
    there with the next frame)."""
    from bulkhead import worker
    return worker._peer.channel.trim_pool(0)


def sum_faults(a):
    """(sum, page faults this process took computing it): what reading
    every page of a costs here."""
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    s = float(a.sum())
    return s, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def own_sum_faults(n):
    """sum_faults of an array of n float32 made and read here once before:
    what reading pages already mapped costs."""
    import numpy as np
    a = np.full(n, 1.0, dtype=np.float32)
    float(a.sum())
    return sum_faults(a)
