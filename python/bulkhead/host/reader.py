"""The reader of frames a worker sends unasked (a pack's own thread
calling the host with request id 0: a PromptServer event, say).

A call that waits on the worker reads them itself.  With
``Worker.serve_unasked`` set, a reader thread per generation
(``read_unasked``, started by the worker's start) also reads them while
none does: it polls the channel and, when a frame is there, has the
worker serve what is pending under the worker lock, taken only where it
is free (``Worker.serve_idle``)."""

import os
import select


# A parked reader tries the worker lock after this many ms, then twice as
# long each time up to PARK_MAX_MS, until it gets it (the call ended).
PARK_FIRST_MS, PARK_MAX_MS = 2, 20


def read_unasked(ref, chan, wake_r):
    """Reader of one generation's channel while no call waits on it (see
    the module doc); ref: a weak reference to the Worker.  Ends when its
    wake pipe closes (teardown), when the channel is no longer the
    worker's, or at EOF (the next call or poll() sees the death).  A byte
    on the wake pipe parks it (Worker.park_reader): it leaves the channel
    to the call, so the call's reply wakes only the thread that waits for
    it, and takes the worker lock back only when it finds it free, never
    queuing on it: a waiter got the lock as the call released it, and the
    next call of the same worker (a pack's next node) then waited for the
    reader (~50 us a call, measured)."""
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    parked = select.poll()
    parked.register(wake_r, select.POLLIN)
    try:
        while True:
            if any(fd == wake_r for fd, _ in poller.poll()) and not os.read(wake_r, 64):
                return
            wait_ms = PARK_FIRST_MS
            while True:
                w = ref()
                if w is None:
                    return
                served = w.serve_idle(chan)
                del w
                if served is not None:
                    break
                if parked.poll(wait_ms) and not os.read(wake_r, 64):
                    return
                wait_ms = min(2 * wait_ms, PARK_MAX_MS)
            if not served:
                return
    finally:
        os.close(wake_r)
