"""The worker process: ``<python> -c 'from bulkhead.worker import run;
run()'`` (``run``: ``-m bulkhead.worker``'s start without runpy).

This package is everything that runs only in a worker: the process's
channel and call loop (here), the node runner for a pack (``nodes``) and
the memory runtime (``memory``: census, release ladders, admission).  It
imports what crosses the channel (``bulkhead.channel``) and the shared
top-level helpers, never host code.

Started by the host's supervisor with the channel on fd 3.  It says HELLO
(interpreter, protocol), takes the host's answer (its generation), then
serves calls until BYE or EOF.  A watchdog thread ends the process if the
host dies while a call is still running here.

Interrupts arrive twice, as an INTERRUPT frame (seen when the channel is
next read) and as SIGUSR1 (seen between two bytecodes of whatever Python
code runs now); both run every function in ``interrupt_handlers``.
Python ``logging`` goes to stderr (which the host prefixes with the pack
name) at the host's level.
"""

import _signal   # not signal: its enum classes cost every worker's start about 1 ms (#40)
import _thread   # not threading (with functools: about 1.5 ms of every worker's start, #40)
import os
import select
import sys

from .. import _native, envlock
from .._importwatch import when_imported
from ..channel import peer as _peer_mod, spec, targets
from ..channel.nodes import encode_comfy
from ..channel.peer import Peer, interpreter_info, resolve_target
from . import typed

_peer = None
# This worker's WorkerMemory when the host attached it to its budget (not
# named `memory`: that is the submodule bulkhead.worker.memory).
memory_runtime = None

# Called (no arguments) on every interrupt, on the main thread.
interrupt_handlers = []


def _interrupted(*_args):
    for fn in list(interrupt_handlers):
        try:
            fn()
        except Exception as e:  # a handler must not break the call it interrupts
            print(f"bulkhead.worker: interrupt handler {fn!r} failed: {e!r}", file=sys.stderr)


def release_objects(pairs):
    """The host dropped these object handles: (ident, count) pairs."""
    if _peer is not None:
        _peer.release_objects(pairs)


def _setup_logging(logging):
    """Python logging to stderr (the host prefixes it) at the host's level;
    run when the pack first imports logging."""
    try:
        level = int(os.environ.get(spec.LOG_LEVEL, logging.INFO))
    except ValueError:
        level = logging.INFO
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)


# The thread of the event loop where a pack's async nodes run (worker/nodes.py
# run_async), once it has started.
task_thread = None


def call_host(target, /, *args, **kwargs):
    """Calls a function the host exposed by name (``Worker.expose``),
    serving nested calls while it waits.  From the async nodes' loop
    thread (a model load's admission in an async node), the main thread
    makes the call for it (nodes.task_ask_host)."""
    if _peer is None:
        raise RuntimeError("bulkhead.worker.call_host works only inside a bulkhead worker")
    if task_thread is not None and _thread.get_ident() == task_thread.ident:
        from .nodes import task_ask_host  # lazy: worker start (and a cycle: nodes imports this package)
        return task_ask_host(target, args, kwargs)
    return _peer.channel.request(_native.CALLBACK, (target, args, kwargs), None)


def _watch_host(host_pid):
    try:
        pidfd = os.pidfd_open(host_pid)
    except (AttributeError, OSError):
        return
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.poll()
    os._exit(70)


_SERVED = frozenset(targets.WORKER_TARGETS)


def _pack_target(target):
    """A pack's worker resolves only the words of the crossing
    (targets.WORKER_TARGETS)."""
    if target not in _SERVED:
        raise PermissionError(f"a pack's worker serves only bulkhead's own calls (channel/targets.py), "
                              f"not {target!r}")
    return resolve_target(target)


def main():
    global _peer
    if os.environ.get(spec.AS_ZYGOTE) == "1":
        # A spawned worker needs none of the zygote's code (nor its struct
        # and signal); a forked one has it from the zygote.
        from . import zygote  # lazy: worker start
        zygote.serve()   # returns in a worker it forked (the zygote itself ends in it)
    fd = int(os.environ.pop(spec.FD, "3"))
    host_pid = int(os.environ.pop(spec.HOST_PID, os.getppid()))
    parent = int(os.environ.pop(spec.PARENT_PID, host_pid))   # a zygote's, where it forked this one
    if parent != os.getppid():
        print(f"bulkhead.worker: started by pid {os.getppid()}, expected {'host' if parent == host_pid else 'zygote'} "
              f"{parent}", file=sys.stderr)
        return 2
    envlock.hold(sys.prefix)    # while this worker lives, its environment is in use (a rebuild keeps it)
    if os.environ.get(spec.SANDBOXED) == "1":
        from . import sandbox  # lazy: worker start (only a sandboxed one)
        _peer_mod.on_error = sandbox.note   # a refusal that crosses is named in the log, with the fix
    # Before HELLO: the host signals only running workers, and SIGUSR1's
    # default action would end this one.
    _signal.signal(_signal.SIGUSR1, _interrupted)
    when_imported("logging", _setup_logging)
    resolve = _pack_target if os.environ.get(spec.PACK_DIR) else resolve_target
    peer = Peer(describe=f"host (pid {host_pid})", outgoing=_native.CALLBACK, resolve=resolve, cache_sends=True)
    peer.frame_handlers[_native.INTERRUPT] = _interrupted
    peer.holds_for_nodes = True  # a node's output that cannot cross stays here, as a handle
    peer.received = {}  # a node's input tensors, for its outputs that pass one through
    peer.node_serializer = typed.serialize  # ... unless a pack registered a serializer for its class
    peer.execution_values = encode_comfy  # ... and ComfyUI's execution values (a blocker) cross as data
    chan = _native.channel_open(fd, peer, os.getuid(), host_pid, first_id=2)
    chan.set_tagged(typed.MARK, typed.decode_tagged)  # and such a map comes back as its object
    peer.channel = chan
    _peer = peer
    # A bare thread, as a daemon thread of threading's would be: nothing
    # waits for it at exit, and a fork's child has none.
    _thread.start_new_thread(_watch_host, (host_pid,))
    hello = interpreter_info()
    hello.update(protocol=_native.PROTOCOL_VERSION, pid=os.getpid())
    chan.notify(_native.HELLO, hello)
    kind, _, ack = chan.recv(60.0)
    if kind != _native.HELLO:
        print(f"bulkhead.worker: expected HELLO from the host, got frame kind {kind}", file=sys.stderr)
        return 2
    peer.name = str(ack.get("name", ""))
    peer.generation = int(ack.get("generation", 0))
    global memory_runtime
    memory = None
    if os.environ.get(spec.MEMORY) == "1":
        try:
            memory = memory_runtime = _attach_memory(peer, ack, host_pid)
        except Exception as e:  # the worker still serves calls; the host sees no record
            print(f"bulkhead.worker: WARNING: not under the host's memory budget: {e}", file=sys.stderr)
    idle = memory.idle_release_s if memory is not None and memory.idle_release_s > 0 else None
    # A call's census ran before its result was encoded: RECOUNT_S after a
    # request (none since), it runs again, and the result's shared-memory
    # blocks are in the record.
    quiet = memory.RECOUNT_S if memory is not None else None
    while True:
        why = chan.serve(idle, quiet)
        if why == "quiet":
            memory.recount()
        elif why == "idle":
            if not _tasks_running():   # a task at work is no idle worker
                memory.on_idle()
        else:
            break
    chan.close()
    return 0


def run():
    """The entry the host starts a worker and a zygote with
    (host/zygote.py WORKER_ARGS: ``-c``), as ``-m bulkhead.worker`` would
    start it but without runpy, whose imports (importlib.util and
    .machinery, contextlib, functools) cost every worker's start about
    1.5 ms (#40):
    sys.argv[0] and sys.path[0] are what ``-m`` makes them (this
    package's ``__main__.py``; the working directory, where the
    interpreter puts one); ``__main__`` is ``-c``'s (no ``__file__`` nor
    ``__spec__``: multiprocessing's spawned children, which re-import a
    ``__main__`` file, re-run nothing of the worker's, as with ``-m``)."""
    sys.argv[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
    if sys.path and sys.path[0] == "" and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()
    sys.exit(main())


def _tasks_running():
    """Whether async node calls are in flight here (worker/nodes.py's tasks)."""
    nodes = sys.modules.get("bulkhead.worker.nodes")
    return bool(getattr(nodes, "_tasks", None))


def _attach_memory(peer, ack, host_pid):
    """Joins the host's memory budget (worker/memory.py): RELEASE frames go
    to the release ladders, every call ends with the node-boundary census
    (but a load, targets.LOAD: the memory runtime's own work, which
    publishes its own census, as a release does)."""
    from .memory import WorkerMemory  # lazy: worker start (only one under the host's budget)
    memory = WorkerMemory(os.environ.get(spec.LEDGER), str(ack.get("name", "")),
                          int(ack.get("generation", 0)), host_pid, call_host,
                          spec.from_env(spec.IDLE_RELEASE_S))
    peer.request_handlers[_native.RELEASE] = memory.release
    resolve = peer._resolve

    def resolve_and_count(target):
        fn = resolve(target)
        if target == targets.LOAD:
            return fn

        def call(*args, **kwargs):
            memory.call_started()
            try:
                return fn(*args, **kwargs)
            finally:
                memory.after_call()
        return call
    peer._resolve = resolve_and_count
    return memory
