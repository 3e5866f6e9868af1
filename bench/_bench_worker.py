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
