"""Environments built in the background while ComfyUI runs.

When ComfyUI starts and a pack's environment must be built (missing, or
stale because the host changed) or rebuilt (its comfy-env.toml changed: a
ComfyUI-Manager update that bumped a pin), host/pack.py hands the build
here instead of building it inside ComfyUI's start-up: the pack is
recorded "building" (host/states.py, with its phase), ComfyUI's server
comes up without it, and the build runs in a thread of its own, side by
side with other packs' builds, bounded by what they use (``_Gate``): a
build at work holds one of the CPU slots (``cpu_slots``) -- its Python
steps, the commands that work the CPU (a venv made, an install that
downloads nothing) and its pack described in a worker once built --
except while it downloads: a command that downloads from an index takes
that index's one download stream instead, and its CPU slot again once
the installer says its downloads are done.  A build that waits (for a
CPU slot, a download stream, or the lock of an environment another
process installs) holds nothing meanwhile, so that no build waits behind
one that waits: at most one build per CPU slot and one per download
stream are at work at once (``pool_size``), more than there are CPUs
where they download, and the slots go to the builds submitted first, so
that they end one after another rather than all at the end.  Each
environment is built at most once at a time: ``submit`` keeps one build
per environment directory, and envs/build.py's lock on the environment
is the one ``bulkhead install`` takes too.

When a build ends, the caller's ``finish`` (on the build's thread) serves
the pack -- described in its worker, or the fallback its failure calls
for -- and ``register`` adds its nodes to ComfyUI's
``nodes.NODE_CLASS_MAPPINGS`` / ``NODE_DISPLAY_NAME_MAPPINGS`` (ComfyUI
answers /object_info from those on each request) and sends the
``bulkhead.pack_ready`` event, on which the panel asks the frontend to
read the node definitions again.

A prompt queued meanwhile that names a node type ComfyUI does not know
yet waits for the builds in progress before ComfyUI validates it
(``wait_middleware``, on POST /prompt: the server's loop stays free, only
that request waits), with one log line; then it is validated and runs as
any other.  Where a build it waited for failed, it is refused at the
nodes that build's pack would have served, with the build's error and the
fix, never run in ComfyUI's process.

What a person reads and does: each build's progress is one line per
phase in ComfyUI's log (``Build.phase_line``: at most LINE_MAX
characters, the pack's name first); the output of the commands it runs
goes to the build's log file (envs.build), its last line the panel's
"what is known"; a failure is one line, its first error line and the
log's path.  The panel's buttons, POST /bulkhead/build and `bulkhead
install` (through the control socket) have a pack built again
(``act``, ``picked_up``; GET /bulkhead/status lists what each pack
offers: ``annotate``).
"""

import asyncio
import atexit
import concurrent.futures
import contextlib
import heapq
import itertools
import json
import logging
import os
import sys
import threading

from .. import _native
from ..channel import spec
from ..channel.formats import FORMAT, decode_meta
from ..envs import config as packconfig
from ..envs.config import PackConfigError
from ..packimport import default_module
from . import states
from .metadata import MetadataCache, comfyui_version_hash, source_hash
from .runtime import DESCRIBED, find_comfyui
from .serverproxy import late_routes_middleware

log = logging.getLogger("bulkhead")

# The bulkhead event (PromptServer.send_sync) saying a pack built in the
# background is ready: {"pack": name, "nodes": [node types]}.
READY_EVENT = "bulkhead.pack_ready"
PHASE_LEN = 160          # the most of a progress line a pack's phase shows
LINE_MAX = states.LINE_MAX   # the most of one line of a build's in ComfyUI's log, as of every pack's line
LOCK_WAIT = "waiting for another install of "   # envs.build's line before it waits for an environment's lock
short = states.short


def cpu_slots():
    """How many builds work the CPU at once (their Python steps, a venv
    made, an install that downloads nothing, a pack described in a
    worker): the CPU count, at least 1 and at most 4 (uv and pip use
    several CPUs each at times)."""
    return max(1, min(4, os.cpu_count() or 1))


def pool_size():
    """How many environments are at work at once, not counting those that
    wait: one build per CPU slot, and one per download stream (an index
    the builds download from, at least the one they use unless told
    another), which works the network, not the CPU."""
    streams = len(_gate.streams) if _gate is not None else 0
    return cpu_slots() + max(1, streams)


class _Slots:
    """A counting semaphore whose waiters go by their ``order``, the
    smallest first (a build submitted before goes on before one submitted
    after, whatever it waited for), not by who asks first: ``ask`` takes
    a slot where one is free and no smaller order waits, else puts the
    order in line; ``wait`` then blocks until the slot is its own."""

    def __init__(self, n):
        self.free = n
        self.cond = threading.Condition()
        self.waiting = []       # the orders in line, a heap; under self.cond

    def ask(self, order):
        """True: a slot is taken; False: order is in line (``wait``)."""
        with self.cond:
            if self.free > 0 and (not self.waiting or self.waiting[0] > order):
                self.free -= 1
                return True
            heapq.heappush(self.waiting, order)
            return False

    def wait(self, order):
        with self.cond:
            try:
                while not (self.free > 0 and self.waiting[0] == order):
                    self.cond.wait()
            except BaseException:
                self.waiting.remove(order)
                heapq.heapify(self.waiting)
                self.cond.notify_all()
                raise
            heapq.heappop(self.waiting)
            self.free -= 1
            self.cond.notify_all()      # the next in line goes too where another slot is free

    def release(self):
        with self.cond:
            self.free += 1
            self.cond.notify_all()


_orders = itertools.count()     # the order of builds (and of other threads' commands) for _Slots


class _Gate:
    """envs.build's ``gate``, and the CPU slots of the pool's builds.  A
    build of the pool (``_Turn``) holds a CPU slot while at work; a
    command it runs that downloads (``indexes``: the indexes it may
    reach, envs.build.indexes_of) lets its CPU slot go and takes each of
    those indexes' one download stream, in their sorted order, until the
    installer says its downloads are done (``_Held.downloaded``,
    envs.build.DOWNLOADS_DONE): then it takes its CPU slot again (it
    installs) while the next build downloads.  A command of any other
    thread (a build in the foreground) takes a CPU slot for itself where
    it downloads nothing.  One kind is held at a time and streams are
    taken in one order: no two builds wait on each other.  Waiting is
    said on the build's stream (its log file, the panel's "what is
    known"), not in ComfyUI's log."""

    def __init__(self, cpus):
        self.n, self.cpus = cpus, _Slots(cpus)
        self.streams = {}       # index -> its one download stream (a Lock); under self.lock
        self.lock = threading.Lock()

    def __call__(self, indexes, say):
        with self.lock:
            streams = [(i, self.streams.setdefault(i, threading.Lock())) for i in indexes]
        return _Held(self, streams, say)

    def take_cpu(self, order, say, asked=False):
        """Takes a CPU slot for order, saying so where it waits; asked:
        order was put in line already (``_Slots.ask`` said False)."""
        if asked or not self.cpus.ask(order):
            say(f"waiting for a CPU slot ({self.n} build(s) at a time work the CPU)")
            self.cpus.wait(order)


class _Turn:
    """A build of the pool's hold on a CPU slot of its _Gate: taken when
    it starts (``take``), let go while it waits on something else or
    downloads (``let_go``), taken again when it goes on.  ``lock_wait``:
    it waits for the lock of its environment, which another process
    holds (``_Progress``).  owner: the Build, whose stream says what it
    waits for."""

    def __init__(self, gate, order, owner):
        self.gate, self.order, self.owner = gate, order, owner
        self.say = owner.stream_line
        self.held = False
        self.queued = False     # in line for a slot since ``ask``
        self.lock_wait = False

    def ask(self):
        """Takes a slot now where one is free, else puts the build in line
        (when it is submitted: the builds' order is the submitters')."""
        self.held = self.gate.cpus.ask(self.order)
        self.queued = not self.held

    def take(self):
        if not self.held:
            queued, self.queued = self.queued, False
            self.gate.take_cpu(self.order, self.say, asked=queued)
            self.held = True

    def let_go(self):
        if self.held:
            self.held = False
            self.gate.cpus.release()


_here = threading.local()       # .turn: the _Turn of the pool's build on this thread, if it is one


def _turn():
    return getattr(_here, "turn", None)


@contextlib.contextmanager
def _off_cpu():
    """Around a wait of a build of the pool on something that is not
    CPU work (ComfyUI's server loop taking its nodes): its CPU slot goes
    to another build meanwhile."""
    turn = _turn()
    held = turn is not None and turn.held
    if held:
        turn.let_go()
    try:
        yield
    finally:
        if held:
            turn.take()


class _Held:
    """What one command holds of a _Gate, taken on entering, let go on
    leaving; a download's streams also when its installer says its
    downloads are done (``downloaded``).  For a build of the pool, what
    its _Turn holds: let go for a download, taken again after."""

    def __init__(self, gate, streams, say):
        self.gate, self.wanted, self.say = gate, streams, say
        turn = _turn()
        self.turn = turn if turn is not None and turn.gate is gate else None
        self.streams = []
        self.cpu = False        # a CPU slot this command took for itself (a thread not of the pool)

    def __enter__(self):
        try:
            if self.wanted:
                if self.turn is not None:
                    self.turn.let_go()
                for index, stream in self.wanted:
                    if not stream.acquire(blocking=False):
                        self.say(f"waiting for the download stream of {index} (one build at a time downloads "
                                 "from it)")
                        stream.acquire()
                    self.streams.append(stream)
            elif self.turn is not None:
                self.turn.take()
            else:
                self.gate.take_cpu(next(_orders), self.say)
                self.cpu = True
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        self._streams_go()
        if self.cpu:
            self.cpu = False
            self.gate.cpus.release()
        if self.turn is not None:
            self.turn.take()

    def _streams_go(self):
        while self.streams:
            self.streams.pop().release()

    def downloaded(self):
        if self.streams:
            self._streams_go()
            if self.turn is not None:
                self.turn.take()


class _Progress:
    """envs.build's progress for one Build: bulkhead's own lines are the
    build's phases (one line each in ComfyUI's log); the output of the
    commands it runs (pip's, uv's, conda's stream: ``stream``) goes to the
    build's log file only (envs.build writes every line there, and sets
    ``log_path``), its last line the phase's "what is known"."""

    def __init__(self, build):
        self.build = build
        self.log_path = None

    def __call__(self, line):
        # envs.build says LOCK_WAIT just before it waits for the lock of
        # the environment, which another process holds (`bulkhead
        # install`, another ComfyUI): the build's CPU slot goes to another
        # build meanwhile, and is taken again at its next line (the lock
        # is its own then).
        turn = _turn()
        if turn is not None and turn.owner is self.build:
            if line.strip().startswith(LOCK_WAIT):
                self.build.phase_line(line)
                turn.lock_wait = True
                turn.let_go()
                return
            if turn.lock_wait:
                turn.lock_wait = False
                turn.take()
        self.build.phase_line(line)

    def stream(self, line):
        self.build.stream_line(line)


class Build:
    """One background build of one environment.  ``kind``: "new" (a pack
    with no usable environment: its nodes come when it ends), "update"
    (its config changed: the environment built before serves meanwhile),
    or an action asked of it (``act``: "build", "retry", "rebuild").
    ``phase`` says where it is and ``known`` the last line of the command
    it runs; ``error`` is the build's error (its first line) once it
    failed, ``fix`` what to do then; ``node_types`` what the pack
    registered when it ended; ``log_path`` the build's log file."""

    def __init__(self, config, kind, directory, module):
        self.config, self.kind = config, kind
        self.name = config.name
        self.directory, self.module = directory, module
        self.phase = "queued"
        self.known = ""
        self.error = None
        self.fix = ""
        self.node_types = ()
        self.future = None
        self.progress = _Progress(self)

    @property
    def log_path(self):
        return self.progress.log_path

    def phase_line(self, line):
        """One of bulkhead's progress lines: one line in ComfyUI's log
        (``log_phase``), and the pack's phase."""
        line = line.strip()
        if not line:
            return
        if not log_phase(self.name, line, self.log_path):
            states_update(self, log=self.log_path)
            return
        self.phase, self.known = short(line, PHASE_LEN), ""
        states_update(self, phase=self.phase, progress="", log=self.log_path)

    def stream_line(self, line):
        """A line of the output of a command the build runs: the log
        file has it (envs.build); the panel shows it as what is known."""
        line = line.strip()
        if line:
            self.known = short(line, PHASE_LEN)
            states_update(self, progress=self.known)

    def done(self):
        return self.future is not None and self.future.done()


def log_phase(name, line, log_path=None):
    """One of a build's progress lines (bulkhead's own) as one line in
    ComfyUI's log: the pack's name first, at most LINE_MAX characters (the
    whole line is in the build's log file).  The line naming the log's
    path ("the whole output goes to <path>") is shown whole or not at
    all: a path is never cut; where it does not fit, the panel and the
    failure line have it.  Returns False for that line, True for a
    phase."""
    prefix = f"[bulkhead install {name}] "
    if log_path and log_path in line:
        if len(prefix) + len(line) <= LINE_MAX:
            log.info("%s%s", prefix, line)
        return False
    log.info("%s%s", prefix, short(line, max(40, LINE_MAX - len(prefix))))
    return True


class LogProgress:
    """envs.build's progress for a build that runs in the foreground (a
    script importing a pack outside ComfyUI's server: host/pack.py
    ``build_at_start``): bulkhead's lines in the log as a background
    build's (``log_phase``), the output of the commands it runs in the
    build's log file only (envs.build writes every line there)."""

    def __init__(self, name):
        self.name = name
        self.log_path = None

    def __call__(self, line):
        line = line.strip()
        if line:
            log_phase(self.name, line, self.log_path)

    def stream(self, line):
        pass


def states_update(b, **fields):
    states.update(b.directory, b.module, **fields)


# The pool: a daemon thread per Build, which takes a CPU slot of the
# _Gate (envs.build.gate, set with the first build) before it starts
# (``_Turn``), in the order builds were submitted, and lets it go while it
# waits or downloads: what bounds the builds at work is the gate's slots
# and streams, not a count of threads, so that a build that waits (for
# another process's install of its environment) keeps no other from
# going on.  Daemon threads, not a ThreadPoolExecutor's, so that a
# ComfyUI stopping while builds run is not held until they end (the
# interpreter joins an executor's threads before its atexit hooks run):
# _stop, at exit, ends their commands (envs.build.stop_builds).
_gate = None            # the pool's _Gate, made with the first build
_builds = {}            # environment directory -> its Build in progress; under _lock
_all = []               # every Build of this process, in order; under _lock
_lock = threading.Lock()


def submit(config, kind, env_dir, directory, module, work):
    """Runs ``work(build)`` for config's environment at env_dir on the
    pool, unless a build of that environment is in progress already (then
    that Build is returned and work is not run).  Returns the Build."""
    global _gate
    from ..envs import build as envs  # lazy: ComfyUI's start (envs loads once a pack builds)
    with _lock:
        b = _builds.get(env_dir)
        if b is not None and not b.done():
            return b
        b = Build(config, kind, directory, module)
        b.future = concurrent.futures.Future()
        _builds[env_dir] = b
        _all.append(b)
        if _gate is None:
            atexit.register(_stop)
            _gate = _Gate(cpu_slots())
        if envs.gate is None:
            envs.gate = _gate
        gate = envs.gate if isinstance(envs.gate, _Gate) else _gate
        turn = _Turn(gate, next(_orders), b)
        turn.ask()
        b.future.set_running_or_notify_cancel()
        threading.Thread(target=_run, args=(b, work, env_dir, turn), name=f"bulkhead-build {b.name}",
                         daemon=True).start()
    return b


def _run(b, work, env_dir, turn):
    _here.turn = turn
    try:
        turn.take()
        work(b)
    except Exception as e:  # work records its own outcome; what escapes is a bug, logged, not lost
        log.exception("bulkhead: pack %r: its background build ended with an error", b.name)
        if b.error is None:
            b.error = f"{type(e).__name__}: {e} (bulkhead's own error: the traceback is in ComfyUI's log)"
        if states.state_of(b.directory, b.module) == "building":     # not left "building" for ever
            states.failed(b.directory, b.name, b.error, module=b.module)
    finally:
        turn.let_go()
        _here.turn = None
        with _lock:
            if _builds.get(env_dir) is b:
                del _builds[env_dir]
            last = not _builds
            entry = _served.get((b.directory, b.name))
            if entry is not None and b.kind != "update":    # what its button says: Retry after a failure
                entry["failed"] = b.error is not None
        b.future.set_result(None)
        if last:
            log.info("%s", states.startup_line("bulkhead: background builds done: "))


def _stop():
    """At exit: the builds still running end (their commands and what
    those started), not remembered as failed; a later start builds them."""
    from ..envs import build as envs  # lazy: ComfyUI start
    if pending():
        log.info("bulkhead: stopping the background builds of %s (the next start builds them)",
                 ", ".join(repr(b.name) for b in pending()))
    envs.stop_builds()


def pending():
    """The Builds in progress (queued or running)."""
    with _lock:
        return [b for b in _builds.values() if not b.done()]


def builds():
    """Every Build of this process, in the order they were submitted."""
    with _lock:
        return list(_all)


def wait(bs, timeout_s=None):
    """Waits for the Builds bs to end; True when they all have."""
    done, not_done = concurrent.futures.wait([b.future for b in bs], timeout=timeout_s)
    return not not_done


def register(config, classes, display):
    """Adds a pack's nodes, served after ComfyUI loaded its custom nodes,
    to ComfyUI's own mappings (as ComfyUI's custom node loader does: a
    node type another pack registered first is kept, with one warning;
    one this pack registered itself before, in-process or refusing to
    run, is replaced: ``_own``), and tells the frontend
    (``READY_EVENT``)."""
    comfy_nodes = sys.modules.get("nodes")
    mapping = getattr(comfy_nodes, "NODE_CLASS_MAPPINGS", None)
    if mapping is None:
        return []
    names = getattr(comfy_nodes, "NODE_DISPLAY_NAME_MAPPINGS", {})
    srv = getattr(getattr(sys.modules.get("server"), "PromptServer", None), "instance", None)
    loop = getattr(srv, "loop", None)
    added = []
    if loop is not None and loop.is_running():
        # On the server's loop: ComfyUI's /object_info walks the mapping
        # there, and a dict that grows under a walk raises.  Waited for, so
        # that a prompt waiting for this build finds the nodes after it.
        done = threading.Event()

        def add():
            try:
                added.extend(_add(config, classes, display, mapping, names))
            finally:
                done.set()
        loop.call_soon_threadsafe(add)
        with _off_cpu():
            on_time = done.wait(REGISTER_WAIT_S)
        if not on_time:
            log.warning("bulkhead: pack %r: ComfyUI's server loop did not take its nodes within %g s; they are "
                        "added from the build's thread", config.name, REGISTER_WAIT_S)
            added.extend(_add(config, classes, display, mapping, names))
    else:
        added = _add(config, classes, display, mapping, names)
    if srv is not None and added:
        try:
            srv.send_sync(READY_EVENT, {"pack": config.name, "nodes": added})
        except Exception as e:  # a frontend that is told nothing still finds them on its next /object_info
            log.debug("bulkhead: %s not sent: %s", READY_EVENT, e)
    return added


# How long register waits for ComfyUI's server loop to add a pack's nodes.
REGISTER_WAIT_S = 60.0


def _own(cls, config):
    """Whether cls, a node class in ComfyUI's mapping, is config's pack's
    own: defined in a module under its directory (the pack imported in
    ComfyUI's process: its in-process fallback, or its nodes refusing to
    run), or one of its proxies registered before (``_registered``)."""
    if cls in _registered.get(config.path, ()):
        return True
    path = getattr(sys.modules.get(getattr(cls, "__module__", None) or ""), "__file__", None)
    root = os.path.realpath(config.root)
    return bool(path) and os.path.realpath(path).startswith(root + os.sep)


_registered = {}    # config path -> the classes register added for it last


def _add(config, classes, display, mapping, names):
    module = "custom_nodes." + os.path.basename(os.path.realpath(config.root))
    added = []
    for key, cls in classes.items():
        if key in mapping and mapping[key] is not cls and not _own(mapping[key], config):
            log.warning("bulkhead: pack %r: node type %r is registered already (by another pack); its own is "
                        "left out", config.name, key)
            continue
        try:
            if getattr(cls, "RELATIVE_PYTHON_MODULE", None) is None:   # a V3 ComfyNode has it, None
                cls.RELATIVE_PYTHON_MODULE = module      # what ComfyUI's loader sets (/object_info's python_module)
        except (AttributeError, TypeError):
            pass
        mapping[key] = cls
        if key in display:
            names[key] = display[key]
        added.append(key)
    _registered[config.path] = {classes[k] for k in added}
    _real[config.path] = {k: classes[k] for k in added}    # what early_nodes' placeholders run
    return added


# --- a pack's nodes while it builds: an earlier build's description ---
#
# A pack whose environment builds in the background has no nodes until the
# build ends -- unless its nodes were described before (host/metadata.py's
# cache: its worker in an earlier environment, or `bulkhead install`), with
# the pack's sources, ComfyUI and bulkhead's description format unchanged
# since: a ComfyUI or bulkhead update, the host's packages moved, an
# environment made again.  The cache's key names the environment (its
# interpreter and stamp), so the start's lookup misses; ``early_nodes``
# reads the pack's one file whatever environment it names, and registers
# its nodes at once as placeholders: /object_info lists them as before,
# and a node run waits for the build, then runs the real proxy the build
# registers (``_real``), or raises the build's error and fix.  Where a
# node needs more than a FUNCTION (V3, async, VALIDATE_INPUTS, lazy
# inputs) or the pack has type strings of its own, none is registered
# early: the pack's nodes come when it is built, as without a description.

_real = {}      # config path -> {node type: the class register added for it}


def early_nodes(b, config, pack_dir, module):
    """(classes, display) for config's pack (its nodes in ``module`` of
    the package at pack_dir), building in the background as Build b:
    placeholders from the pack's earlier description where it has one that
    still fits (see above), else ({}, {})."""
    opts = spec.settings(config.options)
    comfyui = find_comfyui(opts)
    if opts.get("cache", True) is False or comfyui is None:
        return {}, {}
    found = MetadataCache(opts.get("cache_dir")).latest(pack_dir)
    if found is None:
        return {}, {}
    key, text = found
    want = {"format": FORMAT, "described": DESCRIBED, "protocol": _native.PROTOCOL_VERSION, "pack": pack_dir,
            "module": default_module(pack_dir) if module == "auto" else module, "sources": source_hash(pack_dir),
            "comfyui": [comfyui, comfyui_version_hash(comfyui)]}
    try:
        meta = json.loads(text)
    except ValueError:
        return {}, {}
    nodes = meta.get("nodes") or {}
    if any(key.get(k) != v for k, v in want.items()) or meta.get("types") or not nodes or any(
            n.get("v3") or n.get("function_async") or set(n.get("methods") or ()) & {"VALIDATE_INPUTS",
                                                                                   "check_lazy_status"}
            for n in nodes.values()):
        return {}, {}
    classes = {k: _waiting(b, config, k, n, decode_meta) for k, n in nodes.items()}
    _registered[config.path] = set(classes.values())    # register's real proxies replace them
    log.info("bulkhead: pack %r: %d node type(s) from an earlier build's description; they run once its "
             "environment is built", config.name, len(classes))
    return classes, {k: v for k, v in (meta.get("display") or {}).items() if k in classes}


def _waiting(b, config, key, node, decode_meta):
    """A placeholder node class: the described node's inputs, outputs and
    attributes; its run waits for Build b, then runs the real proxy."""
    input_types = node["input_types"]
    ns = {"__module__": f"bulkhead.nodes.{config.name}", "_bulkhead_pack": config.name,
          "__doc__": f"{node['class_name']} of pack {config.name!r}, whose environment is being built: it runs "
                     "once the build ends.",
          "INPUT_TYPES": classmethod(lambda cls: decode_meta(input_types))}
    for attr, value in node["attrs"].items():
        ns[attr] = decode_meta(value)
    function = node["function"]
    ns["FUNCTION"] = function

    def run(self, **kwargs):
        b.future.result()
        real = _real.get(config.path, {}).get(key)
        if real is None:
            raise RuntimeError(f"bulkhead: pack {config.name!r}: node {key!r} does not run: the environment of the "
                               f"pack could not be built ({b.error or 'its build ended without this node'})"
                               + (f". Fix: {b.fix}" if b.fix else ""))
        return getattr(real(), real.FUNCTION)(**kwargs)
    run.__name__ = run.__qualname__ = function
    ns[function] = run
    name = node["class_name"].rsplit(".", 1)[-1]
    cls = type(name if name.isidentifier() else "ProxyNode", (), ns)
    cls.__qualname__ = node["class_name"]
    return cls


# --- prompts queued while packs build ---

def _unknown_nodes(prompt, mapping):
    return {nid: n.get("class_type") for nid, n in prompt.items()
            if isinstance(n, dict) and n.get("class_type") not in mapping}


def refusal(prompt, waited, mapping):
    """The (error, node_errors) ComfyUI's POST /prompt answers with for a
    prompt that waited for the Builds ``waited`` and names nodes a failed
    one of them serves now (the pack's fallback) or none does; None when
    it may be validated as it is."""
    failed = [b for b in waited if b.error is not None]
    if not failed:
        return None
    node_errors = {}
    unknown = _unknown_nodes(prompt, mapping)
    for nid, node in prompt.items():
        if not isinstance(node, dict):
            continue
        ct = node.get("class_type")
        mine = [b for b in failed if ct in b.node_types] or (failed if nid in unknown else [])
        if not mine:
            continue
        message = "; ".join(f"the environment of pack {b.name!r} could not be built: {b.error}" for b in mine)
        fix = "; ".join(dict.fromkeys(b.fix for b in mine if b.fix))
        node_errors[nid] = {"errors": [{"type": "bulkhead_build_failed", "message": message,
                                         "details": f"Fix: {fix}" if fix else "", "extra_info": {}}],
                            "dependent_outputs": [], "class_type": ct}
    if not node_errors:
        return None
    first = next(iter(node_errors.values()))["errors"][0]
    error = {"type": "bulkhead_build_failed", "message": first["message"], "details": first["details"],
             "extra_info": {}}
    return error, node_errors


def wait_middleware():
    """The aiohttp middleware on ComfyUI's POST /prompt (and /api/prompt):
    a prompt naming a node type ComfyUI does not know while packs with no
    nodes yet build ("new" builds; an update's pack serves its nodes
    meanwhile) waits for those builds (off the server's loop), then goes on to
    ComfyUI's own handler, or is refused where a build it waited for
    failed (``refusal``)."""
    from aiohttp import web  # optional: aiohttp

    @web.middleware
    async def bulkhead_build_wait(request, handler):
        if request.method != "POST" or request.path not in ("/prompt", "/api/prompt") or not pending():
            return await handler(request)
        try:
            body = await request.json()   # aiohttp keeps the body: upstream reads it again
        except ValueError:
            return await handler(request)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        mapping = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", None)
        if not isinstance(prompt, dict) or mapping is None:
            return await handler(request)
        unknown = _unknown_nodes(prompt, mapping)
        waited = [b for b in pending() if b.kind == "new"]   # an update's nodes are there already
        if not unknown or not waited:
            return await handler(request)
        log.info("bulkhead: a prompt names node type(s) not registered yet (%s) while the environment(s) of "
                 "%s build; it waits for them, then ComfyUI validates it",
                 ", ".join(sorted(map(str, set(unknown.values())))), ", ".join(repr(b.name) for b in waited))
        await asyncio.wait([asyncio.wrap_future(b.future) for b in waited])
        refused = refusal(prompt, waited, mapping)
        if refused is not None:
            error, node_errors = refused
            log.warning("bulkhead: a prompt that waited for a build is refused: %s", error["message"])
            return web.Response(text=json.dumps({"error": error, "node_errors": node_errors}), status=400,
                                content_type="application/json")
        return await handler(request)

    return bulkhead_build_wait


_middleware_on = set()   # id() of the servers whose app has the middleware


def install_wait(server=None):
    """Puts ``wait_middleware`` on ComfyUI's server (default
    ``PromptServer.instance``) once; True when it is there.  Called while
    custom nodes load, before aiohttp freezes the app's middleware list."""
    if server is None:
        server = getattr(getattr(sys.modules.get("server"), "PromptServer", None), "instance", None)
    app = getattr(server, "app", None)
    if app is None:
        return False
    if id(server) in _middleware_on:
        return True
    try:
        app.middlewares.append(wait_middleware())
        app.middlewares.append(late_routes_middleware())   # the routes of packs built meanwhile
    except (RuntimeError, AttributeError) as e:  # the app already runs: its list is frozen
        log.warning("bulkhead: a prompt queued while packs build is not held for them (%s): it is refused "
                    "until they are built", e)
        return False
    _middleware_on.add(id(server))
    return True


# --- what a person asks: Build, Retry, Rebuild ---
#
# The panel's buttons, POST /bulkhead/build (host/routes.py) and `bulkhead
# install` (through the control socket: ``picked_up``) build a pack's
# environment again on the pool above, as a background build at start
# does, under the lock `bulkhead install` takes (envs.build): each
# environment is built at most once at a time.  The pack keeps serving as
# it did meanwhile (in-process, refused, or isolated in the environment
# built before); once built it is served again, isolated, and its nodes
# replace what it registered before (``register``).

ACTIONS = ("build", "retry", "rebuild")
_served = {}    # (pack directory, name) -> what the pack's config is and how it is served; under _lock


def served(config, pack_dir, module, hm, refusal, serve, load):
    """host/pack.py's hook: config's nodes (``module`` of the package at
    pack_dir) are served by this host, so a person may have its
    environment built again (``act``).  Called each time the pack is
    served (at start, and after each build).  serve and load are
    host/pack.py's ``serve_config`` and ``load_config``, handed here (this
    module does not import pack.py, which imports it)."""
    key = (os.path.realpath(pack_dir), config.name)
    with _lock:
        entry = _served.setdefault(key, {"failed": False})
        entry.update(path=config.path, root=config.root, name=config.name, directory=key[0], module=module,
                     hm=hm, refusal=refusal, serve=serve, load=load, env_dir=os.path.basename(_env_dir(config)))


def _env_dir(config):
    from ..envs import build as envs  # lazy: ComfyUI start
    return envs.env_dir(config)


def _pending_for(entry):
    with _lock:
        return next((b for b in _builds.values() if not b.done() and b.directory == entry["directory"]
                     and b.name == entry["name"]), None)


def _last_log(entry):
    from ..envs import build as envs  # lazy: ComfyUI start
    d = os.path.join(envs.workspace(), "logs", entry["env_dir"])
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".log"))
    except OSError:
        return None
    return os.path.join(d, names[-1]) if names else None


def actions(row, entry=None):
    """The actions a person may ask for the pack of a pack_states row:
    "rebuild" where it runs isolated ("retry" too where its update's
    rebuild failed) or where it is built but failed to import in its
    worker, "retry" where its build failed, "build" where it has no
    environment for another reason; none while it builds, where
    bulkhead's contract with this ComfyUI is refused (a build would not
    change that) or where it has no config bulkhead serves."""
    if entry is None:
        with _lock:
            entry = _served.get((row.get("directory"), row.get("name")))
    if entry is None or entry["refusal"] is not None or row.get("state") == "building" or _pending_for(entry):
        return []
    if row.get("state") == "isolated":
        return (["retry"] if str(row.get("rebuild", "")).startswith("failed") else []) + ["rebuild"]
    if states.REASONS[states.WORKER_IMPORT_FAILED][0].split("{")[0] in str(row.get("reason", "")):
        return ["rebuild"]      # built, but the pack does not import there: built again from scratch
    failed = entry["failed"] or "fail" in str(row.get("reason", "")).lower()
    return ["retry" if failed else "build"]


def annotate(rows):
    """Adds to each pack_states row what the panel shows of its builds:
    "actions" (``actions``), "command" (the same from a terminal:
    ``command``), "log" (the path of its newest build's log file, where it
    has one) and, while a build of it runs, "phase" and "progress" (the
    last line of the command the build runs)."""
    for row in rows:
        with _lock:
            entry = _served.get((row.get("directory"), row.get("name")))
        if entry is None:
            continue
        row["actions"] = actions(row, entry)
        row["command"] = command(entry, row["actions"])
        b = _pending_for(entry)
        if b is not None:
            row["phase"], row["progress"] = b.phase, b.known
            row["building"] = b.kind
        row["log"] = (b.log_path if b is not None else None) or _last_log(entry)
    return rows


def command(entry, offered):
    """The command line that does from a terminal what the first of the
    actions ``offered`` for the pack of ``entry`` does (its button in the
    panel): ``bulkhead install <pack>``, with --force for a rebuild; ""
    where none is offered.  `bulkhead status` shows it."""
    if not offered:
        return ""
    from ..envs.build import rebuild_command  # lazy: ComfyUI's start (envs loads once a pack builds)
    cmd = rebuild_command(entry["root"])
    return cmd.replace("bulkhead install ", "bulkhead install --force ", 1) if offered[0] == "rebuild" else cmd


def find(name):
    """The served entry of the pack called name; LookupError naming the
    packs there are when none is."""
    with _lock:
        found = [e for e in _served.values() if e["name"] == name]
        names = sorted(e["name"] for e in _served.values())
    if not found:
        raise LookupError(f"no pack {name!r} is served by bulkhead here (its packs: {', '.join(names) or 'none'}); "
                          "name one as GET /bulkhead/status lists it")
    return found[0]


def act(name, action, force=None):
    """Has the pack called name built again (action: "build", "retry" or
    "rebuild", the last even where its environment is ready, unless force
    says otherwise) on the pool;
    returns its Build (one already in progress for that environment, if
    any).  Raises LookupError (no such pack), ValueError (an action not
    offered for it now: the message names those that are) or the
    PackConfigError of its comfy-env.toml, read again now."""
    entry = find(name)
    if action not in ACTIONS:
        raise ValueError(f"{action!r} is not an action: ask one of {', '.join(ACTIONS)}")
    b = _pending_for(entry)
    if b is not None:
        return b
    row = next((r for r in states.pack_states() if r["directory"] == entry["directory"] and r["name"] == name), {})
    offered = actions(row, entry)
    if action not in offered and not (action in ("build", "retry") and set(offered) & {"build", "retry"}):
        raise ValueError(f"pack {name!r} is {row.get('state', 'not served')}: {action!r} is not offered for it now "
                         f"({'it offers ' + ', '.join(offered) if offered else 'nothing is'})")
    config = entry["load"](entry["path"], entry["root"])
    if isinstance(config, packconfig.PackConfigError):
        raise config
    entry["env_dir"] = os.path.basename(_env_dir(config))
    prev = {k: v for k, v in row.items() if k not in ("directory", "pid", "actions", "log", "progress", "building")}
    if prev.get("state") != "isolated":
        states.set_state(entry["directory"], entry["module"], name=name, state="building", phase="queued",
                         reason=f"{action} asked; it serves as before ({prev.get('state', 'not served')}) meanwhile")
    log.info("bulkhead: pack %r: %s asked; its environment builds in the background", name, action)
    return submit(config, action, _env_dir(config), entry["directory"], entry["module"],
                  lambda b: _act_work(b, entry, config, action, prev, action == "rebuild" if force is None else force))


def _act_work(b, entry, config, action, prev, force):
    from ..envs import build as envs  # lazy: ComfyUI start
    name, directory, module = entry["name"], entry["directory"], entry["module"]

    def restore(**fields):
        if prev.get("state") == "isolated":     # the build's phase and progress are gone with it
            states.update(directory, module, phase=None, progress=None, **fields)
        elif prev:
            states.set_state(directory, module, **dict(prev, **fields))
    try:
        after = envs.build(config, progress=b.progress, force=force)
    except envs.BuildStopped:
        restore()
        return          # ComfyUI is stopping
    except (envs.EnvBuildError, PackConfigError, OSError) as e:
        entry["failed"] = True
        b.error = envs.first_line(e)
        b.fix = f"what the error names, then Retry (`bulkhead install {config.root}`)"
        prefix = f"bulkhead: pack {name!r}: {action} failed: "
        log.warning("%s%s", prefix, envs.brief(e, b.log_path, LINE_MAX - len(prefix)))
        if prev.get("state") == "isolated":
            restore(rebuild=f"failed: {b.error}; the environment built before keeps serving")
        else:
            restore(reason=f"its environment could not be built: {b.error}", fix=b.fix)
        return
    entry["failed"] = False
    if prev.get("state") == "isolated" and action == "rebuild":
        restore(rebuild=f"rebuilt {after.env_dir}; its worker runs there from its next start")
        log.info("bulkhead: pack %r: rebuilt; its worker runs in it from its next start", name)
        return
    with states.serving():
        classes, display = entry["serve"](config, directory, module, entry["refusal"], entry["hm"])
    b.node_types = tuple(classes)
    added = register(config, classes, display)
    log.info("bulkhead: pack %r is ready: %d node type(s) added (%s)", name, len(added),
             states.state_of(directory, module))


def picked_up(config_paths):
    """`bulkhead install` built the environments of these configs (their
    paths): each pack this host serves from one of them and does not run
    isolated there yet is served again now (``act``: the build finds it
    ready, under the lock); returns one line per config it serves saying
    what this ComfyUI does with it (the control socket's "built")."""
    out = []
    for path in config_paths:
        with _lock:
            entry = next((e for e in _served.values() if e["path"] == path), None)
        if entry is None:
            continue    # not a pack of this ComfyUI: nothing to say
        row = next((r for r in states.pack_states() if r["directory"] == entry["directory"]
                    and r["name"] == entry["name"]), {})
        if _pending_for(entry) is not None:
            out.append(f"{entry['name']}: being built here already; its nodes come when that build ends")
        elif row.get("state") == "isolated" and os.path.basename(str(row.get("env"))) == entry["env_dir"]:
            out.append(f"{entry['name']}: isolated in it already")
        elif row.get("state") == "isolated":
            out.append(f"{entry['name']}: isolated; its worker moves to the new environment at its next start")
        else:
            offered = actions(row, entry)
            try:    # built already: served from it, not built again (force=False, whatever the action)
                act(entry["name"], offered[0] if offered else "build", force=False)
            except Exception as e:  # what the host cannot do is the CLI's to show
                out.append(f"{entry['name']}: not picked up ({e}); restart ComfyUI to use it")
                continue
            out.append(f"{entry['name']}: picked up: served isolated in a moment, its nodes replacing what ran "
                       "before")
    return out
