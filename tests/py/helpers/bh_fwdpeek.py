"""Worker-side helpers for test_forward_refs.py's test of a kept forward
(#40 against #37): a worker notes the mapping an array it got lies in,
and later reads whatever that mapping, if it still has it, shows."""

import ctypes

_noted = {}


def note(a):
    """Notes the mapping that holds a's bytes; returns its size."""
    addr = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                _noted["range"] = (lo, hi)
                return hi - lo
    raise LookupError(f"no mapping holds {addr:#x}")


def peek():
    """The byte values (sorted) the noted mapping shows now, or None when
    this process no longer has it mapped."""
    lo, hi = _noted["range"]
    with open("/proc/self/maps") as f:
        if not any(line.startswith(f"{lo:x}-{hi:x} ") for line in f):
            return None
    return sorted(set(ctypes.string_at(lo, hi - lo)))
