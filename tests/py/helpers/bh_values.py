"""Worker-side helpers of tests/py/test_values.py: what a value is, as
plain data both processes compare (``describe``), values a worker makes
that only a worker can (a set whose item hashes there and not on the
host), and frames written by hand onto the channel."""

import hashlib
import os
import socket
import time


def describe(v, depth=0):
    """v as nested tuples of plain data: its exact type at every level,
    and its value (an array's dtype, alignment, shape and bytes; a float's
    repr, so -0.0 and nan are told apart)."""
    import sys
    np = sys.modules.get("numpy")
    name = type(v).__module__ + "." + type(v).__qualname__
    if depth > 40:
        return (name, "deep")
    if np is not None and isinstance(v, np.ndarray):
        return (name, str(v.dtype), v.dtype.str, v.dtype.isalignedstruct, v.shape,
                hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
    if np is not None and isinstance(v, np.generic):
        return (name, str(v.dtype), hashlib.sha256(v.tobytes()).hexdigest())  # repr: numpy's own, per version
    if isinstance(v, (set, frozenset)):
        return (name, sorted(repr(describe(x, depth + 1)) for x in v))
    if isinstance(v, (list, tuple)):
        return (name, [describe(x, depth + 1) for x in v])
    if isinstance(v, dict):
        return (name, sorted((repr(describe(k, depth + 1)), describe(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, range):
        return (name, v.start, v.stop, v.step)
    return (name, repr(v))


def describe_received(v):
    """What this process received, described here."""
    return describe(v)


def echo(v):
    return v


class HashableList(list):
    """A list that hashes here: it crosses as a plain list, which does not."""

    def __hash__(self):
        return 7


def set_of_hashable_list(then_big=False):
    """A set whose item crosses as a plain (unhashable) list; with then_big,
    inside a list after a large record array (a block the host maps)."""
    s = {HashableList([1, 2])}
    if not then_big:
        return s
    import numpy as np
    return [np.zeros(100_000, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1")]), s]


def send_raw_value(hex_value):
    """Writes a RESULT frame whose value is the given bytes straight onto
    the channel socket (fd 3, as bh_testmod.send_raw); the host should give
    up on this worker before the sleep ends."""
    from bh_testmod import _SECTION, _header
    body = _SECTION + bytes.fromhex(hex_value)
    s = socket.socket(fileno=os.dup(3))
    try:
        s.send(_header(payload=len(body)) + body)
    finally:
        s.close()
    time.sleep(5)
    return "sent"
