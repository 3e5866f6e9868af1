"""Helpers bench/ipc.py calls inside a worker (importable there because
ipc.py puts this directory on the worker's PYTHONPATH)."""

import numpy as np

_cache = {}


def big(nbytes):
    """A float32 array of nbytes, made once and returned from then on, so a
    call measures the transfer and not the allocation."""
    a = _cache.get(nbytes)
    if a is None:
        a = np.ones(nbytes // 4, dtype=np.float32)
        _cache[nbytes] = a
    return a


def small(count, nbytes):
    """count uint8 arrays of nbytes each, array i filled with i % 251, made
    once (see big)."""
    key = ("small", count, nbytes)
    a = _cache.get(key)
    if a is None:
        a = _cache[key] = [np.full(nbytes, i % 251, dtype=np.uint8) for i in range(count)]
    return a


def keep(a):
    """Keeps a (an array or torch tensor the host sent: a view of the
    host's block) to return it on every kept() call."""
    _cache["kept"] = a
    return a.nbytes


def kept():
    """The array or tensor keep() kept: the host's own block, sent back by
    reference."""
    return _cache["kept"]


def drop():
    _cache.pop("kept", None)


def big_torch(nbytes):
    """big() as a torch tensor (made once; None where torch is missing)."""
    t = _cache.get(("torch", nbytes))
    if t is None:
        try:
            import torch
        except ImportError:
            return None
        t = _cache[("torch", nbytes)] = torch.ones(nbytes // 4, dtype=torch.float32)
    return t


def first(a):
    """The first element of an array or tensor (reads one page of it)."""
    return float(a[0])


def sum_torch(t):
    """The sum of a tensor the host sent (reads every page of it): the
    worker's own work in the new-tensor crossing's figure, and in those of
    a tensor sent again or handed back (set against sum_own_torch)."""
    return float(t.sum())


def sum_own_torch(nbytes):
    """The sum of this worker's own big_torch tensor: a node's work on a
    tensor of its own, the limit a forwarded tensor's sum is set against
    in a worker (a call's round trip and the worker's intra-op threads
    woken, as for a forward)."""
    return float(big_torch(nbytes).sum())


def touch_torch(nbytes):
    """Changes big_torch's tensor in place (one element, through a view:
    torch bumps the whole tensor's version), so its next return is a new
    tensor's crossing, copied, not one sent again unchanged."""
    t = big_torch(nbytes)
    t[:1].add_(0.0)
    return None
