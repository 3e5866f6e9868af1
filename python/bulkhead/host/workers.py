"""The host side: ``Worker``, one persistent process under another
interpreter, and the calls into it.

A worker is spawned by the C supervisor as ``<python> -m bulkhead.worker``
with the channel on fd 3 and an environment built here from an allow-list
(nothing of the host's Python setup leaks in: no PYTHONHOME, no
VIRTUAL_ENV, no host site-packages).  It says HELLO with its interpreter
and protocol version; the host answers with the generation number.  A
worker that dies is noticed at once (EOF), reaped, and reported with how it
ended and what it printed last; the next call starts the next generation.
One that dies while no call waits on it (killed while idle) is reaped by
``poll()`` -- at the host's next drain, or before the next call, which then
runs on the next generation instead of failing -- and logged.  A worker
that stops answering is killed at its deadline (``call_timeout_s``,
``start_timeout_s``; ``release_timeout_s`` for memory releases and a
stand-in's loads) and reported as hung, or as stopped when it was (SIGSTOP, a debugger).

Frames a worker sends unasked (a pack's own thread calling the host with
request id 0: a PromptServer event, say) are read while a call waits on
the worker; with ``serve_unasked`` set, a reader thread per generation
also reads them while none does: it polls the channel and, when a frame
is there, takes the worker lock and serves what is pending (``serve(0)``).
"""

import atexit
import functools
import logging
import math
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref

from queue import Empty, SimpleQueue

from .. import _native
from ..channel.nodes import MARK, decode_comfy, typed_packs, encode_comfy
from ..channel.peer import BulkheadError, Peer
from ..channel import spec, targets
from . import zygote

ProtocolError = _native.ProtocolError


class WorkerStartError(BulkheadError):
    """The worker could not be started, or died before its HELLO."""


class WorkerDied(BulkheadError):
    """The worker died while a call waited on it."""

    def __init__(self, message, status=None, output=""):
        super().__init__(message)
        self.status = status
        self.output = output

    @property
    def signal(self):
        return os.WTERMSIG(self.status) if self.status is not None and os.WIFSIGNALED(self.status) else None

    @property
    def exit_code(self):
        return os.WEXITSTATUS(self.status) if self.status is not None and os.WIFEXITED(self.status) else None


class CallTimeout(BulkheadError):
    """A call did not finish in time; the worker was killed.  ``stopped``
    says whether it was stopped (SIGSTOP, a debugger) rather than busy."""

    def __init__(self, message, stopped=False):
        super().__init__(message)
        self.stopped = stopped


class WorkerBusy(BulkheadError):
    """A release asked with a deadline found the worker in a call past it;
    nothing was sent (the release does not run later)."""


# Variables a worker inherits from the host's environment; everything else
# must be passed explicitly in env=.
_PASS = frozenset("""
PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR TERM SHELL
CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER NVIDIA_VISIBLE_DEVICES HIP_VISIBLE_DEVICES
OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OPENBLAS_THREAD_TIMEOUT
LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
HF_HOME HF_HUB_OFFLINE TORCH_HOME SSL_CERT_FILE
XDG_CACHE_HOME XDG_DATA_HOME XDG_CONFIG_HOME XDG_RUNTIME_DIR
""".split())
_PASS_PREFIXES = ("LC_", spec.PREFIX, "OMP_", "GOMP_", "KMP_")
# ...except these: the environment builder's pip options may hold an index's
# credentials (--index-url https://user:token@...), and a worker never
# builds an environment.
_NEVER_PASS = frozenset({spec.PIP_ARGS, spec.AS_ZYGOTE})


def describe_status(status):
    """Words for a waitpid status."""
    if status is None:
        return "is still running"
    if status == _native.STATUS_UNREPORTED:   # its zygote stopped or hung (bh_proc_wait)
        return ("ended (its exit status is unknown: the zygote that forked it did not report it, stopped or "
                "hung; a new zygote forks the next worker)")
    if status < 0:   # a zygote's child whose zygote died first: no one could tell (bh_proc_wait)
        return "ended (its exit status is unknown: the zygote that forked it had gone)"
    if os.WIFSIGNALED(status):
        n = os.WTERMSIG(status)
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        return f"was killed by signal {n} ({name})"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status:#x}"


_root_lock = threading.Lock()
_root = None
_ROOT_NAME = "pkgroot-"


def worker_pythonpath():
    """A directory holding only the ``bulkhead`` package, for a worker's
    PYTHONPATH.  The package's own parent when it holds nothing else (a
    build tree); otherwise a directory of this host process alone, made
    with mkdtemp in the checked private directory (rundir) and holding a
    copy of the package's tree made of links (_link_tree): no other user
    can swap it, another install's host (another version) never repoints
    it, and a worker never writes into the installed package.  Removed at
    exit; those of hosts that died without exiting go at the next host's
    first worker.  Raises rundir.PrivateDirError when the private directory
    is not ours."""
    global _root
    with _root_lock:
        if _root is not None:
            return _root
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # host/ -> bulkhead/
        parent = os.path.dirname(pkg)
        others = [e for e in os.listdir(parent) if e != "bulkhead" and not e.startswith(".")]
        if not others:
            _root = parent
            return _root
        from . import rundir
        base = rundir.runtime_dir()
        _sweep_roots(base)
        root = tempfile.mkdtemp(prefix=f"{_ROOT_NAME}{os.getpid()}-", dir=base)
        atexit.register(_remove_root, root, os.getpid())
        _link_tree(pkg, os.path.join(root, "bulkhead"))
        _root = root
        return _root


def _link_tree(src, dst):
    """dst: src's directories made anew, every file in them a symbolic link
    to src's (the bytecode pip compiled included, so a worker under the
    host's Python reads it as from the package).  A worker under another
    minor then writes its own bytecode into dst's __pycache__, never into
    the installed package: pip uninstall leaves what it did not install,
    and the folder left then imported as an empty namespace package, on
    which every pack failed ("module 'bulkhead' has no attribute
    'comfy_pack'")."""
    for dirpath, _dirs, files in os.walk(src):
        out = os.path.normpath(os.path.join(dst, os.path.relpath(dirpath, src)))
        os.mkdir(out, 0o700)
        for name in files:
            os.symlink(os.path.join(dirpath, name), os.path.join(out, name))


def _remove_root(root, pid=None):
    if pid is not None and pid != os.getpid():
        return  # a forked child exiting: the root is its parent's
    shutil.rmtree(root, ignore_errors=True)   # directories and links: no link is followed


def _sweep_roots(base):
    """Removes the package roots of host processes that are gone."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    from .rundir import owner_gone
    for name in names:
        if owner_gone(name, _ROOT_NAME):
            _remove_root(os.path.join(base, name))


# How long a worker's idle OpenMP and BLAS threads spin after their work
# before they sleep.  libgomp's default, 300,000 steps of `pause`, is 8-15 ms
# on current x86 CPUs; OpenBLAS's (numpy's BLAS) is 2**28 TSC ticks, about
# 0.1 s.  After every node a worker's pool threads spin that long, and on a
# small machine they take the CPUs the host and the next worker need (a
# 3 MiB IMAGE through five workers, bench/spin.py).  200 us still covers the
# gaps between a node's own parallel regions, so its compute keeps the
# default's speed, where OMP_WAIT_POLICY=PASSIVE (sleep at once) costs it
# up to 3x.  docs/performance.md has the figures.
SPIN_US = 200.0
_spin = None


def spin_env():
    """What a worker's environment gets to bound that spin:
    GOMP_SPINCOUNT ($BULKHEAD_OMP_SPIN_US, default SPIN_US, over what one
    spin step costs on this CPU, measured once in ~1 ms; at most libgomp's
    default) and OPENBLAS_THREAD_TIMEOUT (log2 of the same time in TSC
    ticks, taken as 3 a ns; 4 to 28, OpenBLAS's own range and default).
    build_env sets each unless the host's or the pack's environment tunes
    it (GOMP_SPINCOUNT or OMP_WAIT_POLICY; OPENBLAS_THREAD_TIMEOUT)."""
    global _spin
    if _spin is None:
        raw = os.environ.get(spec.OMP_SPIN_US, "")
        try:
            us = float(raw) if raw else SPIN_US
            if not 0 <= us < math.inf:      # nan and inf too: no count of steps
                raise ValueError(raw)
        except ValueError:
            raise BulkheadError(f"{spec.OMP_SPIN_US}={raw!r} is not a number of microseconds (0 or more); "
                                f"unset it for the default ({SPIN_US:g})") from None
        steps = min(300_000, round(us * 1000 / max(_native.relax_ns(), 0.1)))
        ticks_log2 = max(4, min(28, round(math.log2(max(us * 3000, 1)))))
        _spin = {"GOMP_SPINCOUNT": str(steps), "OPENBLAS_THREAD_TIMEOUT": str(ticks_log2)}
    return _spin


def bound_host_spin():
    """The same bound for ComfyUI's own process, from bulkhead's prestartup
    script: the host's torch runs parallel regions too (an EmptyImage's
    fill, a preview's conversion), and its idle pool thread then spins
    libgomp's default 8-15 ms on a CPU that the worker running the next
    node needs (a 3 MiB IMAGE through five workers: half the warm prompt's
    time here, bench/many_packs.py).  Each variable is set in this process's
    environment only while the library that reads it is not loaded yet (it
    reads it once, as it loads: ComfyUI imports torch after the prestartup
    scripts) and unless it or what replaces it is set already
    (GOMP_SPINCOUNT or OMP_WAIT_POLICY; OPENBLAS_THREAD_TIMEOUT).  Workers
    inherit the same values.  Returns {variable: value} for what it set."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return {}  # cannot tell what is loaded: leave it all as it is
    done = {k: v for k, v in _spin_untuned(os.environ).items() if _SPIN_VARS[k][0] not in maps}
    os.environ.update(done)
    return done


# Each variable spin_env gives: the library that reads it (once, as it
# loads) and the variables that, set, say the thread spin is tuned already.
_SPIN_VARS = {"GOMP_SPINCOUNT": ("libgomp", ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")),
              "OPENBLAS_THREAD_TIMEOUT": ("openblas", ("OPENBLAS_THREAD_TIMEOUT",))}


def _spin_untuned(env):
    """spin_env's variables for what env does not tune itself."""
    return {k: v for k, v in spin_env().items() if not any(t in env for t in _SPIN_VARS[k][1])}


def build_env(extra=None, inherit=True):
    """The worker's whole environment as a dict."""
    env = {}
    if inherit:
        for k, v in os.environ.items():
            if (k in _PASS or k.startswith(_PASS_PREFIXES)) and k not in _NEVER_PASS:
                env[k] = v
    extra = dict(extra or {})
    path = worker_pythonpath()
    user_pp = extra.pop("PYTHONPATH", "")
    env.update(extra)
    env["PYTHONPATH"] = path + (os.pathsep + user_pp if user_pp else "")
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env[spec.FD] = "3"
    env[spec.HOST_PID] = str(os.getpid())
    env.update(_spin_untuned(env))
    env.setdefault(spec.LOG_LEVEL, str(logging.getLogger().getEffectiveLevel()))
    return env


# Object-handle releases: a RemoteObject's finalizer (any thread, any time,
# even inside an encode) only queues; this thread sends the batch to each
# worker that is idle, and a worker that is busy sends its own at the end
# of the call that keeps it busy.
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
            w._try_flush()
        del pending, item


def _start_flusher():
    global _flusher
    with _flusher_lock:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_loop, name="bulkhead-release", daemon=True)
            _flusher.start()


_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for w in list(_live):
        try:
            w.close()
        except Exception:
            pass
    zygote.close_all()


# A parked reader tries the worker lock after this many ms, then twice as
# long each time up to PARK_MAX_MS, until it gets it (the call ended).
PARK_FIRST_MS, PARK_MAX_MS = 2, 20


def _read_unasked(ref, chan, wake_r):
    """Reader of one generation's channel while no call waits on it (see
    the module doc).  Ends when its wake pipe closes (teardown), when the
    channel is no longer the worker's, or at EOF (the next call or poll()
    sees the death).  A byte on the wake pipe parks it (Worker.park_reader):
    it leaves the channel to the call, so the call's reply wakes only the
    thread that waits for it, and takes the worker lock back only when it
    finds it free, never queuing on it: a waiter got the lock as the call
    released it, and the next call of the same worker (a pack's next node)
    then waited for the reader (~50 us a call, measured)."""
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
                if w._lock.acquire(blocking=False):
                    break
                del w
                if parked.poll(wait_ms) and not os.read(wake_r, 64):
                    return
                wait_ms = min(2 * wait_ms, PARK_MAX_MS)
            try:
                w._reader_parked = False
                if w._chan is not chan:
                    return
                try:
                    why = chan.serve(0)
                except Exception:  # a broken channel: the next call reports it
                    why = "eof"
                if why != "idle":
                    return
                peer = w._peer
                if peer is not None and peer.pending_releases:
                    w._flush_releases()
            finally:
                w._lock.release()
            del w
    finally:
        os.close(wake_r)


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
        argv = [self.python, "-m", "bulkhead.worker"]
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
        peer.on_release_queued = lambda _peer: _flush_queue.put(ref)
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
        _start_flusher()
        self._proc, self._chan, self._peer = proc, chan, peer
        peer.timeout = self.call_timeout_s
        self.generation = gen
        self.info = hello
        if self.serve_unasked:
            wake_r, self._reader_wake = os.pipe()
            os.set_blocking(self._reader_wake, False)
            threading.Thread(target=_read_unasked, args=(self._ref, chan, wake_r),
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

    def _try_flush(self):
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
