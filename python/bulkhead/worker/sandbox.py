"""In a sandboxed worker: the log line a refusal earns.

A pack that reaches past its sandbox (host/sandbox.py) gets the
PermissionError the OS raises, as it would anywhere.  Where that error
leaves the worker (a node's, an import's, a route's: every error crosses
through channel/peer.py's format_exception), this says once per path, on
the worker's stderr (the host's log, with the pack's prefix), which path
was refused and the config line that would allow it.  Whether it was a
read or a write is judged after the fact: a path that can be read now (or
does not exist: a file to create) was refused a write.
"""

import errno
import os
import sys

from ..channel.spec import PACK_DIR, PACK_NAME

_said = set()


def _refusals(exc):
    """The PermissionErrors with a path in exc's chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, PermissionError) and exc.errno in (errno.EACCES, errno.EPERM) and exc.filename:
            yield exc
        exc = exc.__cause__ or exc.__context__


def _was_write(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    os.close(fd)
    return True


def note(exc):
    """Says what the sandbox refused in exc, once per path."""
    try:
        for e in _refusals(exc):
            path = os.path.abspath(os.fsdecode(e.filename))
            if path in _said:
                continue
            _said.add(path)
            write = _was_write(path)
            key = "sandbox_write" if write else "sandbox_read"
            allow = os.path.dirname(path) if write else path
            name = os.environ.get(PACK_NAME, "?")
            config = os.path.join(os.environ.get(PACK_DIR, "."), "comfy-env.toml")
            print(f"bulkhead: pack {name!r} was refused {'writing' if write else 'reading'} {path} by its "
                  f"sandbox; if it needs that, add {key} = [\"{allow}\"] under [bulkhead] in {config} "
                  f"(BULKHEAD_SANDBOX_{'WRITE' if write else 'READ'} for every pack), or sandbox = \"off\" there",
                  file=sys.stderr, flush=True)
    except Exception:   # a report must never fail the error it reports
        pass
