"""Workers started before they are needed.

The first node of an isolated pack pays for its worker: the spawn, then
the pack's import (torch, ComfyUI's own modules) on the prompt's critical
path.  When a prompt is queued, ComfyUI runs its on-prompt handlers inside
POST /prompt; ``on_prompt`` finds the isolated packs the prompt's nodes
belong to and starts each of those workers in a thread of its own
(``PackRuntime.prewarm``: spawn and import), in parallel with the host's
earlier nodes.  A pack whose ``[bulkhead] prewarm`` is ``"startup"`` is
started when ComfyUI loads it (host/nodes.py ``load_pack``); ``"off"``
leaves it to its first node.  The handler runs on the server's event
loop, so it only looks names up and starts threads: the waiting happens
on the prewarm thread, which holds the worker's lock while it starts it
(a node that needs the worker meanwhile waits for the import it would
have had to do itself).
"""

import logging
import sys
import threading
import time

from . import states

log = logging.getLogger("bulkhead")

_lock = threading.Lock()
_warming = {}        # PackRuntime -> its prewarm thread, while it runs
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


def start(rt):
    """Starts rt's worker and imports its pack, in a thread.  Returns the
    thread, or None when the worker is warm already (prewarmed, or it ran a
    node) or being warmed.  A worker alive only because it described the
    pack's nodes (a metadata-cache miss: the first start after an install
    or a change) is warmed too."""
    with _lock:
        w = rt.worker
        if rt in _warming or (w.alive and getattr(rt, "warm_generation", None) == w.generation):
            return None
        thread = threading.Thread(target=_prewarm, args=(rt,), name=f"bulkhead-prewarm-{rt.name}", daemon=True)
        _warming[rt] = thread
    thread.start()
    return thread


def _prewarm(rt):
    t0 = time.perf_counter()
    try:
        n = rt.prewarm()
        log.info("bulkhead: pack %r: worker pid %s started ahead of its first node (%d nodes, %.0f ms)",
                 rt.name, rt.worker.pid, n, (time.perf_counter() - t0) * 1000)
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


def on_prompt(json_data):
    """ComfyUI's on-prompt handler (POST /prompt, on the event loop):
    starts the workers of the isolated packs the prompt uses, unless their
    pack says ``prewarm = "off"``.  Returns json_data unchanged."""
    try:
        prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
        if isinstance(prompt, dict):
            names = {n.get("class_type") for n in prompt.values() if isinstance(n, dict)}
            for rt in runtimes_for(names):
                if rt.options.get("prewarm", "prompt") != "off":
                    start(rt)
    except Exception as e:  # never fail ComfyUI's prompt
        log.warning("bulkhead: prewarming the prompt's workers failed: %s", e)
    return json_data


def install(server):
    """Adds on_prompt to ComfyUI's server (once per server)."""
    add = getattr(server, "add_on_prompt_handler", None)
    if add is None or id(server) in _servers:
        return False
    add(on_prompt)
    _servers.add(id(server))
    return True
