"""The release flusher: the object-handle releases the host owes its
workers, sent in batches from one thread.

A RemoteObject's finalizer (any thread, any time, even inside an encode)
only queues its worker (``put``); this thread sends the batch to each
worker that is idle (``Worker.try_flush``), and a worker that is busy
sends its own at the end of the call that keeps it busy."""

import threading
import time

from queue import Empty, SimpleQueue

_flush_queue = SimpleQueue()
_flusher = None
_flusher_lock = threading.Lock()
FLUSH_DELAY_S = 0.05


def _flush_loop():
    while True:
        pending = {}
        item = _flush_queue.get()
        time.sleep(FLUSH_DELAY_S)  # gather a batch
        while True:
            if item is not None:
                w = item()
                if w is not None:
                    pending[id(w)] = w
            try:
                item = _flush_queue.get_nowait()
            except Empty:
                break
        for w in pending.values():
            w.try_flush()
        del pending, item


def put(ref):
    """Queues a worker (a weak reference to it) whose peer holds releases
    to send: a Peer's on_release_queued, from any thread."""
    _flush_queue.put(ref)


def start():
    """Starts the flusher thread, once in a process (at a worker's start)."""
    global _flusher
    with _flusher_lock:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_loop, name="bulkhead-release", daemon=True)
            _flusher.start()
