"""Kill points for the kill matrix (tests/py/test_kill_matrix.py), armed
inside a worker: the worker sends itself a signal at one phase of the
protocol, so the phase is hit exactly, not raced for with a timer.

``sig`` is a signal name ("SIGKILL", "SIGSTOP") or "loop" (a Python
infinite loop: hung, but running).  A SIGSTOP'd worker never resumes; its
host's deadline has to find it and kill it.
"""

import os
import signal
import threading

MiB = 1 << 20
BIG = 32 * MiB   # what counts as "the 64 MiB array" at a transfer point


def hit(sig):
    """Sends sig to this worker now (never returns for SIGKILL)."""
    if sig == "loop":
        while True:
            pass
    os.kill(os.getpid(), getattr(signal, sig))
    return sig


def arm(phase, sig):
    """Makes the next `phase` in this worker hit `sig`:

    transfer-in   while the worker maps a large array the host sent (the
                  block is mapped, the call has not started);
    transfer-out  after the worker copied a large result into its block,
                  before the frame carrying it is sent;
    release       in a RELEASE from the host, after the pack's model was
                  partly unloaded, before the receipt is sent.
    """
    from bulkhead import _native, worker
    from bulkhead.channel import tensors as _tensors

    if phase == "transfer-in":
        decode = _tensors.decode

        def on_decode(lib, code, shape, strides, lease, *args, **kw):
            if lease is not None and lease.nbytes >= BIG:
                _tensors.decode = decode
                hit(sig)
            return decode(lib, code, shape, strides, lease, *args, **kw)
        _tensors.decode = on_decode
    elif phase == "transfer-out":
        encode = _tensors.encode

        def on_encode(chan, obj, *args, **kw):
            t = encode(chan, obj, *args, **kw)
            if getattr(obj, "nbytes", 0) >= BIG:
                _tensors.encode = encode
                hit(sig)
            return t
        _tensors.encode = on_encode
    elif phase == "release":
        handlers = worker._peer.request_handlers
        release = handlers[_native.RELEASE]

        def on_release(req):
            handlers[_native.RELEASE] = release
            receipt = release(req)
            hit(sig)
            return receipt
        handlers[_native.RELEASE] = on_release
    else:
        raise ValueError(f"no kill point {phase!r}")
    return True


def consume(a):
    return int(a.nbytes)


def produce(nbytes):
    import numpy as np
    return np.ones(nbytes, dtype=np.uint8)


_held = None


def hold_ledger_lock(sig, delay=0.0):
    """Takes the ledger's robust mutex (the test hook of BH_TESTING builds)
    through a handle of its own on $BULKHEAD_LEDGER, then hits sig: at once
    (the call never returns), or `delay` seconds after returning (the
    worker is idle, holding the lock)."""
    global _held
    from bulkhead import _native
    _held = _native.Ledger(os.environ["BULKHEAD_LEDGER"])
    _held._test_lock()
    if delay:
        threading.Timer(delay, hit, (sig,)).start()
        return True
    return hit(sig)


def helper():
    """Starts a helper process (in this worker's group, as a pack's
    subprocess is); returns its pid."""
    import subprocess
    return subprocess.Popen(["sleep", "60"]).pid
