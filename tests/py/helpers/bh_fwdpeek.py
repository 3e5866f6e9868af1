"""Worker-side helpers for test_forward_refs.py's tests of a kept forward
(#40 against #37): a worker notes the mapping an array it got lies in,
and later reads whatever that mapping, if it still has it, shows; or it
keeps that mapping's file open (as a pack's code holding the fd it was
sent could) and later reads whatever the file holds."""

import ctypes
import os

_noted = {}


def note(a):
    """Notes the mapping that holds a's bytes (an array or a torch
    tensor); returns its size."""
    addr = a.data_ptr() if hasattr(a, "data_ptr") else a.__array_interface__["data"][0]
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


def keep_fd(a):
    """Opens, and keeps, the file that holds a's bytes (through
    /proc/self/map_files: the memfd the block came in, as the fd a pack's
    code could have kept); returns its size, or None where this process
    may not open its map_files (CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN)."""
    note(a)
    lo, hi = _noted["range"]
    try:
        fd = os.open(f"/proc/self/map_files/{lo:x}-{hi:x}", os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError:
        return None
    _noted["fd"] = fd
    return os.fstat(fd).st_size


def read_kept():
    """The byte values (sorted) the kept file holds now; closes it."""
    fd = _noted.pop("fd")
    try:
        return sorted(set(os.pread(fd, os.fstat(fd).st_size, 0)))
    finally:
        os.close(fd)
