"""Functions the tests call inside workers."""

import os
import signal
import struct
import sys
import time

_cache = {}


def echo(*args, **kwargs):
    return args, kwargs


def version():
    return "%d.%d.%d" % sys.version_info[:3]


def numpy_version():
    import numpy
    return numpy.__version__


def pid():
    return os.getpid()


def boom(message):
    raise KeyError(message)


class PackError(RuntimeError):
    pass


def custom_boom():
    def inner():
        raise PackError("the pack failed in inner()")
    inner()


def raise_builtin(name, *args):
    """Raises the builtin exception type `name` made with `args`."""
    import builtins
    raise getattr(builtins, name)(*args)


class Outer:
    class NestedError(ValueError):
        """A pack's exception class nested in a class: a dotted qualname."""


def raise_pack(*args):
    raise Outer.NestedError(*args)


def call_back(fn, *args):
    return fn(*args)


def call_back_twice_nested(fn, depth):
    """fn is a host callable that calls this worker again."""
    return fn(depth)


def host_named(name, *args):
    from bulkhead.worker import call_host
    return call_host(name, *args)


def sleep(seconds):
    time.sleep(seconds)
    return seconds


def spin_in_thread(seconds):
    """Starts a thread of the worker's own that computes for `seconds`
    (a pack's job outliving its call: host/idle.py's "at work of its
    own"), and answers at once."""
    import threading

    def spin():
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
    threading.Thread(target=spin, daemon=True).start()


def die(sig):
    os.kill(os.getpid(), sig)
    time.sleep(10)


def exit_now(code, message=""):
    if message:
        print(message, file=sys.stderr, flush=True)
    os._exit(code)


def exit_leaving_a_helper(code):
    """Forks a helper that inherits the channel (fd 3, as a pack's
    subprocess would) and outlives this worker, then exits: the host sees
    no EOF while the helper lives."""
    helper = os.fork()
    if helper == 0:
        time.sleep(60)
        os._exit(0)
    print(f"helper={helper}", file=sys.stderr, flush=True)
    os._exit(code)


def helper_then_sleep(path, seconds):
    """Starts a helper process (a pack's subprocess, in the worker's
    process group) that would outlive this worker, writes its pid to path,
    then sleeps."""
    import subprocess
    helper = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    with open(path, "w") as f:
        f.write(str(helper.pid))
    time.sleep(seconds)
    return helper.pid


def unsendable():
    return object()


def make_array(n, dtype="float32"):
    import numpy as np
    return np.arange(n, dtype=dtype)


def many_arrays(n, nbytes):
    """n distinct numpy arrays of nbytes each (past ARENA_ITEM_MAX, each a
    shared-memory block of its own; past the inline size but smaller, they
    share blocks)."""
    import numpy as np
    return [np.full(nbytes, i % 251, dtype=np.uint8) for i in range(n)]


def small_arrays(n, nbytes, keep=False):
    """n numpy arrays of nbytes each, each filled with its index mod 251
    (past the inline size but small: they share arena blocks); keep=True
    keeps them here too, so a later call can see they are unchanged."""
    import numpy as np
    out = [np.full(nbytes, i % 251, dtype=np.uint8) for i in range(n)]
    if keep:
        _cache["small_arrays"] = out
    return out


def check_arrays(arrays, nbytes):
    """What the worker received: each array's first and last byte its index
    mod 251, its size nbytes, its data 64-byte aligned and zero-copy (a view
    of a shared-memory Lease).  Returns the number that were right."""
    good = 0
    for i, a in enumerate(arrays):
        base = a
        while getattr(base, "base", None) is not None:
            base = base.base
        good += (a.nbytes == nbytes and int(a[0]) == i % 251 and int(a[-1]) == i % 251
                 and a.__array_interface__["data"][0] % 64 == 0 and type(base).__name__ == "Lease")
    return good


def pool_stats():
    """The block-pool statistics of this worker's end of the channel."""
    from bulkhead import worker
    return worker._peer.channel.stats()


def big(nbytes):
    import numpy as np
    a = _cache.get(nbytes)
    if a is None:
        a = _cache[nbytes] = np.ones(nbytes // 4, dtype=np.float32)
    return a


def torch_flags(t):
    """What the worker received of a torch tensor's flags, and the tensor
    made here as the sender's kind: a leaf that requires grad where it
    did (made outside inference mode), an inference tensor where it was
    one, a Parameter where it was one."""
    import torch
    flags = {"requires_grad": t.requires_grad, "inference": t.is_inference(), "leaf": t.is_leaf}
    with torch.inference_mode(t.is_inference()):
        back = t.detach().clone().requires_grad_(t.requires_grad)
        if isinstance(t, torch.nn.Parameter):
            flags["parameter"], back = True, torch.nn.Parameter(back.detach(), requires_grad=t.requires_grad)
        else:
            flags["parameter"] = False
    return flags, back


def describe(a):
    """What the worker received: type, dtype, shape, sum, and whether it
    was wrapped without a copy (its memory is a bulkhead Lease)."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        return {"lib": "torch", "dtype": str(a.dtype).replace("torch.", ""), "shape": list(a.shape)}
    base = a
    while getattr(base, "base", None) is not None:
        base = base.base
    return {"lib": mod, "dtype": str(a.dtype), "shape": list(a.shape),
            "zero_copy": type(base).__name__ == "Lease"}


def _header(version=None, kind=3, req=0, flags=0, payload=0, fds=0, cpu=0, magic=0x4B484C42):
    if version is None:
        from bulkhead._native import PROTOCOL_VERSION as version
    return struct.pack("<IHHQIIII", magic, version, kind, req, flags, payload, fds, cpu)


# An empty block section: u32 n_intro, n_return, n_retire, n_lend (channel.c).
_SECTION = struct.pack("<IIII", 0, 0, 0, 0)

# Values that break the codec, each in an otherwise well-formed frame.
_VALUES = {
    "trailing": b"\x00\x00",                                          # nil, then a stray byte
    "utf8": b"\x05" + struct.pack("<I", 2) + b"\xff\xfe",              # a str that is not UTF-8
    "overrun": b"\x05" + struct.pack("<I", 100) + b"abc",              # a str past the frame
    "count": b"\x07" + struct.pack("<I", 1_000_000),                   # a list of a million, empty
    "depth": (b"\x07" + struct.pack("<I", 1)) * 80 + b"\x00",          # 80 lists deep
}


def send_raw(what):
    """Writes a malformed frame straight onto the channel socket (fd 3 is
    where the supervisor put it; the worker's channel owns it)."""
    import socket
    s = socket.socket(fileno=os.dup(3))
    try:
        if what == "garbage":
            s.send(b"this is not a frame at all, not even close")
        elif what == "version":
            body = _SECTION + b"\x00"
            s.send(_header(version=99, payload=len(body)) + body)
        elif what == "kind":
            body = _SECTION + b"\x00"
            s.send(_header(kind=77, payload=len(body)) + body)
        elif what == "short":
            s.send(_header(payload=1000) + b"\x00" * 10)
        elif what == "oversized":
            s.send(_header(payload=(1 << 30) + 1))
        elif what == "badvalue":
            body = _SECTION + b"\xee"
            s.send(_header(payload=len(body)) + body)
        elif what == "toomany":
            # A list of 2**20 nones: 1 MiB on the wire, one item past
            # BH_MAX_ITEMS; too big to go inline, so spilled to a sealed
            # memfd as a real sender does.
            import fcntl
            body = _SECTION + b"\x07" + struct.pack("<I", 1 << 20) + b"\x00" * (1 << 20)
            mfd = os.memfd_create("toomany", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.write(mfd, body)
                fcntl.fcntl(mfd, fcntl.F_ADD_SEALS,
                            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
                socket.send_fds(s, [_header(flags=1, payload=len(body), fds=1)], [mfd])
            finally:
                os.close(mfd)
        elif what in _VALUES:
            body = _SECTION + _VALUES[what]
            s.send(_header(payload=len(body)) + body)
        elif what == "cpu":  # the cpu hint past BH_FRAME_CPU_MAX
            body = _SECTION + b"\x00"
            s.send(_header(payload=len(body), cpu=65537) + body)
        elif what == "fdcount":
            body = _SECTION + b"\x00"
            s.send(_header(payload=len(body), fds=2) + body)
        elif what == "uid":
            pid = os.fork()
            if pid == 0:
                try:
                    os.setuid(65534)
                    body = _SECTION + b"\x00"
                    s.send(_header(payload=len(body)) + body)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
    finally:
        s.close()
    time.sleep(5)  # the host should give up on us before this returns
    return "sent"


def stop_self():
    os.kill(os.getpid(), signal.SIGSTOP)


# --- the ledger, from inside a worker (BULKHEAD_LEDGER names the file) ---

_ledger = None


def ledger_join(role, pack, generation):
    """Opens the ledger at $BULKHEAD_LEDGER and joins; returns (slot, path)."""
    global _ledger
    from bulkhead import _native
    _ledger = _native.Ledger()
    slot = _ledger.join(role, pack=pack, interpreter=version(), generation=generation,
                        host_pid=os.getppid())
    return slot, _ledger.path


def ledger_set_model(model_id, name, device, size_bytes, resident_bytes):
    _ledger.set_model(model_id, name, device, size_bytes, resident_bytes)
    return True


def ledger_set_run(run):
    _ledger.set_run(run)
    return True


def ledger_close():
    global _ledger
    _ledger.close()
    _ledger = None
    return True


_releases = []


def serve_release_via(name):
    """From now on this worker answers a RELEASE request by calling the
    host function `name` with its payload (a stand-in for the memory
    runtime's ladder, to watch the host's side of a release); name None:
    by noting the payload (see released())."""
    import bulkhead.worker as w
    from bulkhead import _native

    def handler(payload):
        if name is None:
            _releases.append(payload)
            return None
        return w.call_host(name, payload)
    w._peer.request_handlers[_native.RELEASE] = handler
    return True


def released():
    return _releases
