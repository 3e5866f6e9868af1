"""The host side: ``Worker``, one persistent process under another
interpreter, and the calls into it.

A worker is spawned by the C supervisor as ``<python> -c 'from
bulkhead.worker import run; run()'`` (``-m bulkhead.worker`` without
runpy: zygote.WORKER_ARGS) with the channel on fd 3 and an environment
built from an allow-list (host/workerenv.py: nothing of the host's Python setup leaks in, no
PYTHONHOME, no VIRTUAL_ENV, no host site-packages).  It says HELLO with its interpreter
and protocol version; the host answers with the generation number.  A
worker that dies is noticed at once (EOF), reaped, and reported with how it
ended and what it printed last; the next call starts the next generation.
One that dies while no call waits on it (killed while idle) is reaped by
``poll()`` -- at the host's next drain, or before the next call, which then
runs on the next generation instead of failing -- and logged.  A worker
that stops answering is killed at its deadline (``call_timeout_s``,
``start_timeout_s``; ``release_timeout_s`` for memory releases and a
stand-in's loads) and reported as hung, or as stopped when it was (SIGSTOP, a debugger).
What a failed worker raises is host/errors.py's.

Frames a worker sends unasked (a pack's own thread calling the host with
request id 0: a PromptServer event, say) are read while a call waits on
the worker; with ``serve_unasked`` set, a reader thread per generation
also reads them while none does (host/reader.py): it polls the channel
and, when a frame is there, takes the worker lock where it is free and
serves what is pending (``serve_idle``).  The object-handle releases the
host owes a worker go in batches from one thread (host/flusher.py) when
the worker is idle, else at the end of the call that keeps it busy.
"""

import atexit
import functools
import logging
import os
import signal
import sys
import threading
import weakref

from .. import _native
from ..channel.nodes import MARK, decode_comfy, typed_packs, encode_comfy
from ..channel.peer import Peer
from ..channel import targets
from . import flusher, reader, zygote
from .errors import CallTimeout, ProtocolError, WorkerBusy, WorkerDied, WorkerStartError, describe_status
from .workerenv import build_env


_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for w in list(_live):
        try:
            w.close()
        except Exception:
            pass
    zygote.close_all()


class _Holding:
    """Worker.holding's context manager (a class, not a generator: it is
    on every node call's path)."""
    __slots__ = ("_lock", "_wait_s", "_held")

    def __init__(self, lock, wait_s):
        self._lock, self._wait_s, self._held = lock, wait_s, False

    def __enter__(self):
        self._held = self._lock.acquire(timeout=self._wait_s)
        return self._held

    def __exit__(self, *exc):
        if self._held:
            self._held = False
            self._lock.release()


class _Held(_Holding):
    """A _Holding whose lock was already tried (Worker.holding_idle)."""
    __slots__ = ()

    def __init__(self, lock, held):
        self._lock, self._wait_s, self._held = lock, 0.0, held

    def __enter__(self):
        return self._held


class Worker(_native.Caller):
    """A persistent worker process running ``python`` (a path to an
    interpreter, typically a venv's ``bin/python``).

    ``call("module:function", *args, **kwargs)`` runs a function there and
    returns its result; callables among the arguments can be called back by
    the worker while the host waits (re-entrantly: the callback may call
    the worker again).  numpy arrays and torch CPU tensors cross through
    shared memory with at most one copy.  The process starts on first use
    (or ``start()``) and is restarted, as the next generation, after it
    dies.  Calls are serialized per worker.
    """

    def __init__(self, python, *, name=None, env=None, cwd=None, inherit_env=True,
                 start_timeout_s=60.0, call_timeout_s=None, release_timeout_s=None, stop_grace_s=2.0,
                 stop_term_s=1.0, output=True):
        self.python = os.fspath(python)
        self.name = name or os.path.basename(os.path.dirname(os.path.dirname(self.python))) or self.python
        self.env = dict(env or {})
        self.cwd = cwd
        self.inherit_env = inherit_env
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        # Deadline of a RELEASE asked from ComfyUI's eviction loop, an
        # admission or the control socket, and of a stand-in's load (None:
        # memory.RELEASE_TIMEOUT_S).
        self.release_timeout_s = release_timeout_s
        self.stop_grace_s = stop_grace_s
        self.stop_term_s = stop_term_s
        self.output = output
        self.generation = 0
        self.info = {}
        self._lock = threading.RLock()
        self._proc = None
        self._chan = None
        self._exposed = {}
        self._peer = None
        self._notify_lock = threading.Lock()  # interrupt() vs teardown
        self.frame_handlers = {}    # frame kind -> handler(value), shared with every generation's Peer
        self.env_hooks = []         # callables -> dict of variables, evaluated at each start
        self.resolve_python = None  # python -> the interpreter to start, at each start (a rebuilt env)
        # What a zygote imports before forking this worker (host/zygote.py):
        # a list of module names, or a callable returning one at each start;
        # None: the worker is spawned.
        self.zygote_preload = None
        # What the worker may touch (host/sandbox.py's Plan.spec()), or a
        # callable returning it at each start; None: unsandboxed.
        self.sandbox = None
        self.busy = 0               # requests in flight (nested ones count)
        self.last_exit = None       # how the last generation ended, when it died unasked
        self._death = None          # (generation, words, status, output) of the last death a call saw
        self.serve_unasked = False  # a reader thread serves what the worker sends while idle
        self._reader_wake = None    # its wake pipe's write end (closed to stop it)
        self._reader_parked = False  # a byte was written there since the reader last took the lock
        self._ref = weakref.ref(self)
        _live.add(self)

    # --- lifecycle ---

    @property
    def pid(self):
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self):
        """Whether the current generation is up (not ended, maybe not
        reaped yet).  Safe without the worker's lock: the channel and the
        process are read once."""
        chan, proc = self._chan, self._proc
        return chan is not None and proc is not None and proc.wait(0) is None

    def describe(self):
        return (f"worker {self.name!r} (pid {self.pid}, {self.python}, generation {self.generation})"
                if self._proc is not None else f"worker {self.name!r} ({self.python})")

    def start(self):
        """Starts the process if it is not running.  Returns self."""
        with self._lock:
            if self._chan is None:
                self._start()
        return self

    @property
    def peer(self):
        """This generation's channel hooks (None when not running)."""
        return self._peer

    def _start(self):
        """Hook (Caller.request, lock held): starts the next generation."""
        gen = self.generation + 1
        if self.resolve_python is not None:
            python = self.resolve_python(self.python)
            if python != self.python:
                logging.getLogger("bulkhead").warning(
                    "bulkhead: worker %r: its environment was rebuilt; generation %d runs %s (was %s)",
                    self.name, gen, python, self.python)
                self.python = python
        extra = dict(self.env)
        for hook in self.env_hooks:
            for k, v in hook().items():
                extra.setdefault(k, v)  # the caller's env= outranks a hook
        try:
            env = build_env(extra, self.inherit_env)
        except PermissionError as e:  # rundir.PrivateDirError: a directory not ours
            raise WorkerStartError(f"cannot start worker {self.name!r}: {e}") from None
        argv = [self.python, *zygote.WORKER_ARGS]
        sink = -1
        if self.output:
            try:
                sink = sys.stderr.fileno()
            except (AttributeError, ValueError, OSError):
                sink = 2
        try:
            preload = self.zygote_preload() if callable(self.zygote_preload) else self.zygote_preload
            sandbox = self.sandbox() if callable(self.sandbox) else self.sandbox
            proc, fd = zygote.spawn(self.python, argv, env, self.cwd, sink, f"[{self.name}] ", preload, sandbox)
        except OSError as e:
            what = "not found" if e.errno == 2 else e.strerror
            raise WorkerStartError(
                f"cannot start worker {self.name!r}: interpreter {self.python}: {what}"
                + (f" (cwd {self.cwd})" if self.cwd and e.errno == 2 else "")) from None
        peer = Peer(describe=self.describe, outgoing=_native.CALL, resolve=self._resolve_exposed,
                    cache_sends=True)
        peer.frame_handlers = self.frame_handlers
        peer.execution_values = encode_comfy  # ComfyUI's execution values in a node's value cross as data
        peer.name = self.name
        peer.generation = gen
        ref = self._ref
        peer.on_release_queued = lambda _peer: flusher.put(ref)
        try:
            chan = _native.channel_open(fd, peer, os.getuid(), proc.pid, first_id=1, forward=True)
        except BaseException:
            proc.close()
            raise
        # a node's ExecutionBlocker comes back as ComfyUI's own; a typed value only of a pack whose
        # serializer this worker runs (typed_packs)
        chan.set_tagged(MARK, functools.partial(decode_comfy, typed_packs=typed_packs(env), producer=self.name))
        peer.channel = chan
        where = f"worker {self.name!r} ({self.python}, pid {proc.pid})"
        try:
            kind, _, hello = chan.recv(self.start_timeout_s)
            if kind != _native.HELLO or not isinstance(hello, dict):
                raise WorkerStartError(f"{where} sent frame kind {kind} before HELLO")
            if hello.get("protocol") != _native.PROTOCOL_VERSION:
                raise WorkerStartError(
                    f"{where} speaks bulkhead protocol {hello.get('protocol')}, this host "
                    f"speaks {_native.PROTOCOL_VERSION}; reinstall bulkhead in one place")
            chan.notify(_native.HELLO, {"generation": gen, "name": self.name})
        except BaseException as e:
            chan.close()
            if isinstance(e, _native.PeerClosed):
                status = proc.wait(5.0)
                tail = proc.output_tail()
                proc.close()
                raise WorkerStartError(
                    f"{where} {describe_status(status)} during start-up"
                    + (f"\n--- worker output ---\n{tail.rstrip()}" if tail else " (it printed nothing)")) from None
            stopped = zygote.proc_state(proc.pid) in ("T", "t")
            proc.kill(signal.SIGKILL)
            proc.wait()
            tail = proc.output_tail()
            proc.close()
            if isinstance(e, _native.Timeout):
                raise WorkerStartError(
                    f"{where} did not say HELLO within {self.start_timeout_s:g} s"
                    + (" (it was stopped: SIGSTOP, or a debugger)" if stopped else "")
                    + "; killed (SIGKILL)"
                    + (f"\n--- worker output ---\n{tail.rstrip()}" if tail else "")) from None
            if isinstance(e, _native.ProtocolError):
                raise WorkerStartError(f"{where} broke the protocol during start-up: {e}") from None
            raise
        flusher.start()
        self._proc, self._chan, self._peer = proc, chan, peer
        peer.timeout = self.call_timeout_s
        self.generation = gen
        self.info = hello
        if self.serve_unasked:
            wake_r, self._reader_wake = os.pipe()
            os.set_blocking(self._reader_wake, False)
            threading.Thread(target=reader.read_unasked, args=(self._ref, chan, wake_r),
                             name=f"bulkhead-reader-{self.name}", daemon=True).start()

    def _teardown(self):
        with self._notify_lock:
            chan, proc = self._chan, self._proc
            self._chan = self._proc = self._peer = None
            wake, self._reader_wake = self._reader_wake, None
        if wake is not None:
            os.close(wake)  # the reader wakes, closes its end and ends
        if chan is not None:
            chan.close()
        if proc is not None:
            proc.close()

    def park_reader(self):
        """Before a call (the caller holds the lock): the reader thread
        leaves the channel to the call until it ends.  A reply that woke
        the reader too put a second host thread, and its GIL hand-off,
        on every call's way back."""
        wake = self._reader_wake
        if wake is not None and not self._reader_parked:
            self._reader_parked = True
            try:
                os.write(wake, b"p")
            except OSError:  # full (it is parked already) or closed (teardown)
                pass

    def serve_idle(self, chan):
        """The reader thread's turn (host/reader.py): where the worker lock
        is free, takes it and serves what the worker sent unasked on chan
        (``serve(0)``), then sends the releases the host owes it.  Returns
        None when the lock is held (a call runs: the reader tries again
        later), False when the reader is done (chan is no longer this
        worker's, or it ended), True when it served and reads on."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._reader_parked = False
            if self._chan is not chan:
                return False
            try:
                why = chan.serve(0)
            except Exception:  # a broken channel: the next call reports it
                why = "eof"
            if why != "idle":
                return False
            peer = self._peer
            if peer is not None and peer.pending_releases:
                self._flush_releases()
            return True
        finally:
            self._lock.release()

    def poll(self):
        """Notices a generation that ended while no call waited on it (a
        worker killed while idle, say): reaps it, logs how it ended and
        tears it down, so its fds go now and the next call starts the next
        generation instead of failing.  Returns those words (also kept in
        ``last_exit``), or None when it is running, not started, or in use
        by a call (which sees the death itself).  Cheap: one waitpid."""
        with self.holding(0) as held:
            if not held or self.busy:
                return None
            return self._reap_idle(0)

    def _reap_idle(self, wait_s):
        """poll() under the lock: waits up to wait_s for an ended generation."""
        proc = self._proc
        if proc is None or self._chan is None:
            return None
        status = proc.wait(wait_s)
        if status is None:
            return None
        tail = proc.output_tail()
        msg = (f"{self.describe()} {describe_status(status)} while idle; "
               f"the next call starts generation {self.generation + 1}")
        self._teardown()
        self.last_exit = msg
        logging.getLogger("bulkhead").warning(
            "bulkhead: %s%s", msg, "\n--- last worker output ---\n" + tail.rstrip() if tail else "")
        return msg

    def close(self):
        """BYE, then the ladder: wait stop_grace_s s, SIGTERM, wait stop_term_s
        s, SIGKILL.  Returns the exit status, or None if not running."""
        with self._lock:
            if self._chan is None:
                return None
            try:
                self._chan.notify(_native.BYE)
            except _native.Error:
                pass
            status = self._proc.stop(self.stop_grace_s, self.stop_term_s)
            self._teardown()
            return status

    def kill(self, sig=signal.SIGKILL):
        """Sends a signal to the worker process (tests, hung workers)."""
        if self._proc is not None:
            self._proc.kill(sig)

    def interrupt(self, frame=True):
        """Tells the worker to stop what it is running: an INTERRUPT frame
        (read when the worker next reads its channel) and SIGUSR1 (acted on
        at once by a worker busy in Python code).  Safe from any thread,
        while another thread waits on a call.  Returns False when the
        worker is not running."""
        with self._notify_lock:
            chan, proc = self._chan, self._proc
            if chan is None or proc is None:
                return False
            try:
                if frame:
                    chan.notify(_native.INTERRUPT, None)
                proc.kill(signal.SIGUSR1)
            except (_native.Error, OSError, ValueError):
                return False
            return True

    # --- the worker lock ---

    def holding(self, wait_s=None):
        """The worker lock, the one way to hold it outside this module: a
        context manager whose ``with`` value says whether it is held.
        wait_s: None waits as long as it takes (always held); 0 tries once;
        else waits up to that many seconds.  Re-entrant (a callback may
        call the worker again on the same thread).  While it is held no
        other thread calls, releases, starts or stops the worker; C's
        request path (_native.Caller) takes the same lock::

            with w.holding(0) as held:
                if not held:
                    return None     # a call is in progress: not idle
                ...
        """
        return _Holding(self._lock, -1 if wait_s is None else max(0.0, wait_s))

    # The longest holding_idle waits for a holder that is not in a call.
    SHORT_HOLD_WAIT_S = 0.05

    def holding_idle(self):
        """holding(0) for a worker not in a call: where the lock is held
        by no request (busy 0: the reader thread's turn after every call,
        a poll, a release flush, each microseconds), this waits up to
        SHORT_HOLD_WAIT_S for it; where a request is in flight (a node
        running, maybe for minutes), it answers at once, not held.  For
        checks that must not wait for a call but should not lose to those
        short holds (VALIDATE_INPUTS at queue time: host/runtime.py
        validate_on_loop, which lost some prompts' checks to the reader
        and deferred them to the node's run)."""
        lock = self._lock
        if lock.acquire(blocking=False):
            return _Held(lock, True)
        if self.busy:
            return _Held(lock, False)
        return _Held(lock, lock.acquire(timeout=self.SHORT_HOLD_WAIT_S))

    # --- object handles ---

    def try_flush(self):
        """Sends queued object-handle releases unless another thread is
        using the worker (its call sends them when it ends)."""
        with self.holding(0) as held:
            if held:
                self._flush_releases()
            return held

    def _flush_releases(self):
        peer, chan = self._peer, self._chan
        if peer is None or chan is None or not peer.pending_releases:
            return
        pairs = peer.take_releases()
        try:  # request id 0: served in order, no reply
            chan.notify(_native.CALL, (targets.RELEASE_OBJECTS, (pairs,), {}), 0)
        except _native.Error:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "running" if self._chan is not None else "stopped"
        return f"<bulkhead.Worker {self.name!r} {state} gen={self.generation} pid={self.pid}>"

    # --- calls ---

    def expose(self, name, fn):
        """Lets the worker call ``fn`` by name (``bulkhead.worker.call_host``)."""
        self._exposed[name] = fn

    def _resolve_exposed(self, target):
        try:
            return self._exposed[target]
        except KeyError:
            raise PermissionError(
                f"the host exposes no callable named {target!r} to {self.describe()} "
                f"(exposed: {sorted(self._exposed) or 'none'}; see Worker.expose)") from None

    # call(target, /, *args, **kwargs) and request(kind, payload, timeout,
    # verb, obj, *, wait=True) are _native.Caller's, in C: the one request
    # path (lock, busy count, send and wait, undo) on the state kept in
    # Caller's slots (_chan, _peer, _lock, call_timeout_s, busy).  What is not
    # the plain path comes back here, to the hooks C calls by name
    # (_native.CALLER_HOOKS; _check_hooks below refuses a Worker without
    # them at import): _start, _request_failed, _after_request.

    def release(self, op=targets.RELEASE_ALL, model_id=None, nbytes=None, timeout_s=None, wait_s=None):
        """Asks the worker to release memory and waits for its receipt (a
        dict with ``before_bytes``, ``after_bytes``, ``freed_bytes``).  op:
        'all' (the full ladder: models, cast buffers, pins, allocator
        cache), 'model' (model_id; nbytes of it, or all of it when None),
        'bytes' (nbytes of the worker's models) or 'pins'.  Starts nothing: a
        worker that is not running holds nothing and answers None.
        wait_s: how long to wait for a call the worker is in (None: until
        it ends); past it WorkerBusy, and nothing is sent."""
        with self.holding(wait_s) as held:
            if not held:
                raise WorkerBusy(f"worker {self.name!r} (pid {self.pid}) stayed busy in a call for "
                                 f"{wait_s:g} s; try again when it is idle")
            if self.busy == 0:
                self.poll()  # a generation that died idle held nothing: start none for it
            if self._chan is None:
                return None
            if op == targets.RELEASE_ALL and self._peer.sent is not None:
                self._peer.sent.clear()  # the host's blocks kept for tensors sent again
            return self.request(_native.RELEASE, {"op": op, "model_id": model_id, "bytes": nbytes},
                                timeout_s, "release", op)

    def load(self, model_id, nbytes, timeout_s=None):
        """Asks the worker to load nbytes more of its model model_id onto
        the model's device (a stand-in's ``partially_load``: upstream's
        ``model_use_more_vram`` in the worker, targets.LOAD) and waits for
        its receipt (a dict with ``before_bytes``, ``after_bytes``,
        ``loaded_bytes``).  Waits for a call the worker is in, as release()
        does.  Starts nothing: a worker that is not running holds no model
        and answers None.  A plain call, not a RELEASE frame: both are
        served alike in the worker (by its one thread, between calls or
        nested in one's callback)."""
        with self.holding():
            if self.busy == 0:
                self.poll()  # a generation that died idle held nothing: start none for it
            if self._chan is None:
                return None
            return self.request(_native.CALL, (targets.LOAD, (model_id, nbytes), {}), timeout_s, "load",
                                model_id)

    def post_release(self, op=targets.RELEASE_ALL, model_id=None, nbytes=None):
        """The same ask without waiting for it (request id 0: no reply), for
        pressure on an idle worker from inside ComfyUI's eviction loop.
        Returns False, sending nothing, when the worker is not running or
        another thread is using it (then it is not idle)."""
        return self.request(_native.RELEASE, {"op": op, "model_id": model_id, "bytes": nbytes},
                            None, "release", op, wait=False)

    def _request_failed(self, exc, verb, obj, timeout_s, attempt):
        """Hook (Caller.request): a request whose channel failed, under the
        lock, counted busy.  Returns True to have it run again on the next
        generation, when this was its first attempt and the worker died
        idle and never got it; else raises the error that names the worker
        and what it was doing (verb, obj)."""
        if (attempt == 0 and isinstance(exc, _native.NotDelivered) and self.busy == 1
                and self._reap_idle(2.0) is not None):
            # It died while idle, so nothing of this request ran: it runs on
            # the next generation instead of failing.  (Nested, or a socket
            # closed by a process that lives on, is the death path below.)
            return True
        if isinstance(exc, _native.PeerClosed):
            self._died(f"during {verb} {obj!r}")
        if isinstance(exc, _native.Timeout):
            self._hung(f"{verb} {obj!r}", timeout_s)
        if isinstance(exc, _native.ProtocolError):
            self._broken(f"{verb} {obj!r}", exc)
        raise exc

    def _after_request(self, chan, peer):
        """Hook (Caller.request): after the outermost request on chan left
        something (Caller checks chan.depth, peer.exports and
        peer.pending_releases first), the handles exported for it are
        dropped, and the releases the host owes the worker are sent."""
        if chan.depth:
            return
        if peer.exports:
            peer.exports.clear()
        if peer.pending_releases and self._peer is peer:
            self._flush_releases()

    def ended(self, peer, during):
        """The WorkerDied for a call that waited on generation `peer` (its
        Peer) without a request in flight (an async node's task), once that
        generation ended: reaped and torn down here when no one did yet,
        its exit and last output in the message.  The caller holds the lock."""
        if self._peer is peer and self._proc is not None:
            try:
                self._died(during)
            except WorkerDied as e:
                return e
        gen = getattr(peer, "generation", self.generation)
        death = self._death if self._death is not None and self._death[0] == gen else None
        nxt = (f"the next call starts generation {self.generation + 1}" if self._chan is None else
               f"generation {self.generation} runs now")
        if death is not None:    # another call saw it die: its words
            return WorkerDied(f"{death[1]}; {nxt} (this call: {during})", death[2], death[3])
        if self.last_exit and f"generation {gen})" in self.last_exit:   # reaped while no call waited
            return WorkerDied(f"{self.last_exit} (this call: {during})")
        return WorkerDied(f"worker {self.name!r} ({self.python}, generation {gen}) ended {during}; {nxt}")

    def _died(self, during):
        proc = self._proc
        status = proc.wait(2.0)
        if status is None:  # closed the socket but lingers: finish it
            proc.kill(signal.SIGKILL)
            status = proc.wait()
        tail = proc.output_tail()
        what = f"{self.describe()} {describe_status(status)} {during}"
        self._teardown()
        msg = f"{what}; the next call starts generation {self.generation + 1}"
        if tail:
            msg += "\n--- last worker output ---\n" + tail.rstrip()
        self._death = (self.generation, what, status, tail)
        raise WorkerDied(msg, status, tail) from None

    def _hung(self, target, timeout_s):
        what = self.describe()
        stopped = zygote.proc_state(self._proc.pid) in ("T", "t")
        self._proc.kill(signal.SIGKILL)
        self._proc.wait()
        self._teardown()
        how = " (it was stopped: SIGSTOP, or a debugger)" if stopped else ""
        raise CallTimeout(
            f"{what} did not answer {target} within {timeout_s:g} s{how}; "
            f"it was killed (SIGKILL) and the next call starts generation {self.generation + 1}",
            stopped) from None

    def _broken(self, target, err):
        what = self.describe()
        self._proc.kill(signal.SIGKILL)
        self._proc.wait()
        self._teardown()
        raise ProtocolError(f"{what} sent a malformed frame during {target}: {err}; "
                            f"it was killed and the next call starts generation {self.generation + 1}") from None

    def stats(self):
        """Block-pool statistics of this side of the channel."""
        return self._chan.stats() if self._chan is not None else {}


def _check_hooks(cls):
    """Refuses a Worker class without every method _native.Caller calls by
    name (caller.c's bh_caller_hooks), so a rename on either side fails at
    import, not at the first failed call."""
    missing = [n for n in _native.CALLER_HOOKS if not callable(getattr(cls, n, None))]
    if missing:
        raise ImportError(f"bulkhead: {cls.__qualname__} lacks {', '.join(missing)}, which "
                          "_native.Caller calls by name (src/python/caller.c)")


_check_hooks(Worker)
