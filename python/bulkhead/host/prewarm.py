"""Workers started before they are needed, only for nodes that will run.

The first node of an isolated pack pays for its worker: the spawn, then
the pack's import (torch, ComfyUI's own modules) on the prompt's critical
path.  A prompt's packs are started ahead of their first node, each in a
thread of its own (``PackRuntime.prewarm``: spawn, import, a rehearsed
call), in parallel with the host's earlier nodes -- but only the packs
whose nodes will execute: a node ComfyUI serves from its output cache runs
nowhere, and a fully cached prompt must not start a worker (an idle worker
that exited costs 2 s of CPU to bring back, for nothing).

ComfyUI's cache decides, as it does for in-process nodes.  Its executor
computes the prompt's cache keys (IS_CHANGED included) when it starts the
prompt, then, before any node runs, sends ``execution_cached`` with the
ids of the prompt's nodes it has outputs for, through
``PromptExecutor.add_message`` (every upstream version; the websocket gets
it only when the prompt has a client, so the server's ``send_sync`` would
miss a prompt queued without one).  ``install`` wraps that method once,
calling upstream's first and never raising into it; on
``execution_cached`` (``on_cached``) the running prompt is read off
ComfyUI's queue (``get_current_queue_volatile``: (number, prompt_id,
prompt, extra_data, outputs)), the nodes that will run are found as
ComfyUI's execution list finds them (from the outputs to execute, through
the links of every node not cached; a lazy input's branch is counted, an
expansion's new nodes are not: they start their worker themselves), and
the packs of those nodes are started.  Everything there only looks names
up and starts threads: the prompt thread never waits for a worker.

Where the executor cannot be watched (no ``execution`` module with
``PromptExecutor.add_message``, or a queue without the running item), the
workers are started when the prompt is queued, as before: ComfyUI runs
its on-prompt handlers inside POST /prompt, and ``on_prompt`` starts the
packs of every node the prompt names (a cached one too).  A pack whose
``[bulkhead] prewarm`` is ``"startup"`` is started when ComfyUI loads it
(host/nodes.py ``load_pack``); ``"off"`` leaves it to its first node.  The
waiting happens on the prewarm thread, which holds the worker's lock while
it starts it (a node that needs the worker meanwhile waits for the import
it would have had to do itself).
"""

import logging
import os
import sys
import threading
import time

from . import states

log = logging.getLogger("bulkhead")

_lock = threading.Lock()
_warming = {}        # PackRuntime -> its prewarm thread, while it runs
# Cold workers start side by side, as many at once as this process may use
# CPUs (each start is a spawn and an import, CPU-bound): N packs cost about
# N / CPUs of the slowest, not their sum, without more starts than cores
# fighting for them.  A thread waiting here holds nothing: a node that
# needs its worker meanwhile starts it itself.
STARTS_AT_ONCE = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
_starts = threading.BoundedSemaphore(STARTS_AT_ONCE)
_servers = set()     # ids of the servers the handler is on


def runtimes_for(class_types):
    """The PackRuntimes serving any of these node type names.  Where
    ComfyUI's own NODE_CLASS_MAPPINGS is loaded, it decides which class a
    name is (two packs may define one name; ComfyUI keeps one)."""
    comfy_nodes = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", None)
    out = []
    for rt in states.runtimes():
        for name in class_types:
            cls = rt.classes.get(name)
            if cls is not None and (not isinstance(comfy_nodes, dict) or comfy_nodes.get(name, cls) is cls):
                out.append(rt)
                break
    return out


def start(rt, why=""):
    """Starts rt's worker and imports its pack, in a thread.  Returns the
    thread, or None when the worker is warm already (prewarmed, or it ran a
    node) or being warmed.  A worker alive only because it described the
    pack's nodes (a metadata-cache miss: the first start after an install
    or a change) is warmed too.  why: what the log line adds (the prompt
    it is started for)."""
    with _lock:
        w = rt.worker
        if rt in _warming or (w.alive and getattr(rt, "warm_generation", None) == w.generation):
            return None
        thread = threading.Thread(target=_prewarm, args=(rt, why), name=f"bulkhead-prewarm-{rt.name}",
                                  daemon=True)
        _warming[rt] = thread
    thread.start()
    return thread


def _prewarm(rt, why):
    t0 = time.perf_counter()
    try:
        with _starts:
            n = rt.prewarm()
        log.info("bulkhead: pack %r: worker pid %s started ahead of its first node%s (%d nodes, %.0f ms)",
                 rt.name, rt.worker.pid, why, n, (time.perf_counter() - t0) * 1000)
    except Exception as e:  # its first node starts it, and names the error then
        log.warning("bulkhead: pack %r: starting its worker ahead of time failed (%s); its first node "
                    "will start it", rt.name, e)
    finally:
        with _lock:
            _warming.pop(rt, None)


def wait(timeout_s=None):
    """Waits for every prewarm thread running now (tests, the bench).
    Returns True when none is left."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with _lock:
            threads = list(_warming.values())
        if not threads:
            return True
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if deadline is not None and time.monotonic() >= deadline:
            with _lock:
                return not _warming


def _start_for(class_types, why=""):
    """Starts the workers of the isolated packs serving these node type
    names, unless their pack says ``prewarm = "off"``."""
    for rt in runtimes_for(class_types):
        if rt.options.get("prewarm", "prompt") != "off":
            start(rt, why)


def on_prompt(json_data):
    """ComfyUI's on-prompt handler (POST /prompt, on the event loop): where
    the executor is not watched (``install``), starts the workers of the
    isolated packs the prompt uses.  Returns json_data unchanged."""
    try:
        if _watched[0]:
            return json_data    # on_cached starts those whose nodes will run
        prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
        if isinstance(prompt, dict):
            _start_for({n.get("class_type") for n in prompt.values() if isinstance(n, dict)})
    except Exception as e:  # never fail ComfyUI's prompt
        log.warning("bulkhead: prewarming the prompt's workers failed: %s", e)
    return json_data


def _is_link(value):
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def will_run(prompt, outputs, cached):
    """The ids of the prompt's nodes ComfyUI's executor will run: from the
    outputs to execute (every node when none are named), each node not
    cached and, through its links, the nodes it needs that are not cached
    either -- a cached node's inputs are not run for it.  (ComfyUI's
    execution list walks the same way; it skips a lazy input until the
    node asks for it, which this counts as run.)"""
    todo = [o for o in (outputs or prompt) if o in prompt]
    seen, run = set(), set()
    while todo:
        node_id = todo.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        if node_id in cached:
            continue
        run.add(node_id)
        spec = prompt[node_id]
        inputs = spec.get("inputs") if isinstance(spec, dict) else None
        for v in (inputs or {}).values():
            if _is_link(v) and v[0] in prompt:
                todo.append(v[0])
    return run


def _running_item(executor, prompt_id):
    """The item (number, prompt_id, prompt, extra_data, outputs, ...) of
    ComfyUI's queue that the executor is running, or None."""
    queue = getattr(getattr(executor, "server", None), "prompt_queue", None)
    read = getattr(queue, "get_current_queue_volatile", None) or getattr(queue, "get_current_queue", None)
    if read is None:
        return None
    running, _pending = read()
    return next((item for item in running if len(item) > 4 and item[1] == prompt_id), None)


def on_cached(executor, data):
    """ComfyUI's executor knows which of the prompt's nodes its cache
    serves (``execution_cached``, on the prompt thread, before the first
    node runs): starts the workers of the packs of the nodes it will run.
    Returns the node ids found to run, or None when the prompt was not
    found (then nothing is started: its nodes start their workers)."""
    prompt_id = data.get("prompt_id")
    item = _running_item(executor, prompt_id)
    if item is None or not isinstance(item[2], dict):
        log.debug("bulkhead: prompt %s is not in ComfyUI's queue: no worker prewarmed for it", prompt_id)
        return None
    prompt = item[2]
    run = will_run(prompt, list(item[4] or ()), set(data.get("nodes") or ()))
    _start_for({prompt[n].get("class_type") for n in run if isinstance(prompt[n], dict)},
               f" for prompt {prompt_id}")
    return run


_watched = [False]   # the executor's messages are watched (ComfyUI's execution.PromptExecutor)


def _watch_executor():
    """Wraps ComfyUI's ``execution.PromptExecutor.add_message`` once so that
    ``execution_cached`` reaches on_cached.  Upstream's method always runs
    first and as it is; what bulkhead does after never raises into it.
    Returns whether the executor is watched."""
    execution = sys.modules.get("execution")
    cls = getattr(execution, "PromptExecutor", None)
    original = getattr(cls, "add_message", None)
    if original is None or not callable(original):
        return False
    if getattr(original, "_bulkhead_prewarm", False):
        return True

    def add_message(self, event, data, *args, **kwargs):
        out = original(self, event, data, *args, **kwargs)
        if event == "execution_cached":
            try:
                on_cached(self, data if isinstance(data, dict) else {})
            except Exception as e:  # never fail ComfyUI's prompt
                log.warning("bulkhead: prewarming the prompt's workers failed: %s", e)
        return out
    add_message._bulkhead_prewarm = True
    add_message.__wrapped__ = original
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(add_message, attr, getattr(original, attr))
        except AttributeError:
            pass
    cls.add_message = add_message
    return True


def install(server):
    """Adds on_prompt to ComfyUI's server (once per server), and watches
    ComfyUI's executor where it can (then on_prompt leaves the prewarm to
    on_cached)."""
    add = getattr(server, "add_on_prompt_handler", None)
    if add is None or id(server) in _servers:
        return False
    add(on_prompt)
    _servers.add(id(server))
    queue = getattr(server, "prompt_queue", None)
    try:
        _watched[0] = (hasattr(queue, "get_current_queue_volatile") or hasattr(queue, "get_current_queue")) \
            and _watch_executor()
    except Exception as e:  # then the prompt's packs start when it is queued
        log.debug("bulkhead: ComfyUI's executor is not watched (%s): workers start when a prompt is queued", e)
    return True
