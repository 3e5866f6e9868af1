"""The host's interrupt watcher: ComfyUI's stop button, passed on to the workers.

One thread for the whole host (``watcher``, an ``_InterruptWatcher``)
reads ComfyUI's non-consuming ``processing_interrupted()`` while worker
calls run, and interrupts the worker of each call that is running when the
flag is set; a node still running ``INTERRUPT_GRACE_S`` (a pack's
``interrupt_grace_s``) after the click has its worker stopped.
host/runtime.py (``PackRuntime._call``) begins and ends one watch around each
worker call.  The flag is only read, never hooked.
"""

import logging
import os
import threading
import time

from ..channel import spec

log = logging.getLogger("bulkhead")

# Seconds a worker node may run on after the stop button before its worker
# is stopped (``interrupt_grace_s`` in a pack's [bulkhead] table).  A node
# that checks ComfyUI's flag stops within milliseconds; one that never
# checks (a long native call, a sleep) would otherwise run to its end.
# The default is its row's in channel/spec.py.
INTERRUPT_GRACE_S = spec.BY_NAME["interrupt_grace_s"].default


class _Watch:
    """One worker call under the interrupt watcher (see _InterruptWatcher)."""

    __slots__ = ("worker", "mm", "grace_s", "fired_at", "stopped_worker", "done", "lock", "next_at")

    def __init__(self, worker, mm, grace_s):
        self.worker, self.mm, self.grace_s = worker, mm, grace_s
        self.fired_at = None        # when the click was seen
        self.stopped_worker = False  # its worker was stopped past the grace
        self.done = False           # the call ended: nothing more is done for it
        self.lock = threading.Lock()
        self.next_at = None         # when to act next, once fired


class _InterruptWatcher:
    """Passes the host's interrupt (ComfyUI's stop button) to the workers
    whose calls are running: one thread for the whole host, asleep while
    no call runs, reading ComfyUI's non-consuming
    ``processing_interrupted()`` every POLL_S while calls run (a new call
    wakes it; it reads the flag at once).  Once a call's flag is seen, its
    worker is interrupted (a frame and SIGUSR1), then signalled every
    RESIGNAL_S until the call ends; a node still running ``grace_s`` after
    the click (one that never checks the flag) has its worker stopped
    (SIGKILL), ``stopped_worker`` says so, and the call fails with
    WorkerDied, which PackRuntime turns into ComfyUI's interrupt.  grace_s
    0: never.  (bulkhead writes nothing into ComfyUI but the reserve, so
    the flag is read, never hooked.)

    A call costs the thread no wake-up when it ends, and none when it
    begins while the thread is awake for another: a thread started and
    joined per call put two wake-ups of the host on each node's way back,
    behind the worker's spinning OpenMP threads on a small machine."""

    POLL_S = 0.02
    RESIGNAL_S = 0.025

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._calls = []
        self._thread = None
        self._asleep = False  # in the untimed wait: a new call must wake it

    def begin(self, worker, mm, grace_s):
        watch = _Watch(worker, mm, grace_s)
        with self._cond:
            self._calls.append(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bulkhead-interrupt", daemon=True)
                self._thread.start()
            elif self._asleep:
                self._cond.notify()
        return watch

    def end(self, watch):
        """The call ended: after this returns nothing is done for it."""
        with watch.lock:
            watch.done = True
        with self._cond:
            self._calls.remove(watch)

    def _run(self):
        while True:
            with self._cond:
                while not self._calls:
                    self._asleep = True
                    self._cond.wait()
                self._asleep = False
                calls = list(self._calls)
            wait_s = self.POLL_S
            for watch in calls:
                try:
                    due = self._act(watch)
                except Exception as e:  # a broken flag reader: never the watcher's end
                    log.debug("bulkhead: interrupt watcher: %r", e)
                    due = None
                if due is not None:
                    wait_s = min(wait_s, max(0.0, due - time.perf_counter()))
            with self._cond:
                if self._calls:
                    self._cond.wait(wait_s)

    def _act(self, watch):
        """What is due for one call now; returns when it next needs the
        thread (None: at the next read of the flag)."""
        with watch.lock:
            if watch.done or watch.stopped_worker:
                return None
            now = time.perf_counter()
            if watch.fired_at is None:
                if not watch.mm.processing_interrupted():
                    return None
                watch.fired_at = now
                watch.worker.interrupt(frame=True)
            elif watch.grace_s > 0 and now >= watch.fired_at + watch.grace_s:
                watch.stopped_worker = True
                watch.worker.kill()
                return None
            elif now >= watch.next_at:
                watch.worker.interrupt(frame=False)
            else:
                return watch.next_at
            watch.next_at = now + self.RESIGNAL_S
            if watch.grace_s > 0:
                watch.next_at = min(watch.next_at, watch.fired_at + watch.grace_s)
            return watch.next_at

    def _after_fork(self):
        self.__init__()  # the child has none of the parent's threads or calls


watcher = _InterruptWatcher()
os.register_at_fork(after_in_child=watcher._after_fork)
