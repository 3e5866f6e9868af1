"""Environments built in the background while ComfyUI runs.

When ComfyUI starts and a pack's environment must be built (missing, or
stale because the host changed) or rebuilt (its comfy-env.toml changed: a
ComfyUI-Manager update that bumped a pin), host/pack.py hands the build
here instead of building it inside ComfyUI's start-up: the pack is
recorded "building" (host/states.py, with its phase), ComfyUI's server
comes up without it, and the build runs on a small pool of threads
(``pool_size``: bounded by the CPU count), side by side with other packs'
builds.  Each environment is built at most once at a time: ``submit``
keeps one build per environment directory, and envs/build.py's lock on
the environment is the one ``bulkhead install`` takes too.

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
"""

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import queue
import sys
import threading

log = logging.getLogger("bulkhead")

# The bulkhead event (PromptServer.send_sync) saying a pack built in the
# background is ready: {"pack": name, "nodes": [node types]}.
READY_EVENT = "bulkhead.pack_ready"
PHASE_LEN = 160          # the most of a progress line a pack's phase shows


def pool_size():
    """How many environments build at once: the CPU count, at least 1 and
    at most 4 (a build is pip's or uv's work: downloads and unpacking,
    several CPUs each at times)."""
    return max(1, min(4, os.cpu_count() or 1))


class Build:
    """One background build of one environment.  ``kind``: "new" (a pack
    with no usable environment: its nodes come when it ends) or "update"
    (its config changed: the environment built before serves meanwhile).
    ``phase`` says where it is; ``error`` is the build's error (its first
    line) once it failed, ``fix`` what to do then; ``node_types`` what the
    pack registered when it ended."""

    def __init__(self, config, kind, directory, module):
        self.config, self.kind = config, kind
        self.name = config.name
        self.directory, self.module = directory, module
        self.phase = "queued"
        self.error = None
        self.fix = ""
        self.node_types = ()
        self.future = None

    def progress(self, line):
        """envs.build's progress: into ComfyUI's log, and the pack's phase."""
        log.info("[bulkhead install %s] %s", self.name, line)
        line = line.strip()
        if line:
            self.phase = line if len(line) <= PHASE_LEN else line[:PHASE_LEN - 3] + "..."
            from . import states  # a cycle: states is imported by everything here
            states.update(self.directory, self.module, phase=self.phase)

    def done(self):
        return self.future is not None and self.future.done()


# The pool: up to pool_size() daemon threads taking (Build, work, env_dir)
# from _queue.  Daemon threads, not a ThreadPoolExecutor's, so that a
# ComfyUI stopping while builds run is not held until they end (the
# interpreter joins an executor's threads before its atexit hooks run):
# _stop, at exit, ends their commands (envs.build.stop_builds).
_queue = queue.Queue()
_threads = []
_builds = {}            # environment directory -> its Build in progress; under _lock
_all = []               # every Build of this process, in order; under _lock
_lock = threading.Lock()


def submit(config, kind, env_dir, directory, module, work):
    """Runs ``work(build)`` for config's environment at env_dir on the
    pool, unless a build of that environment is in progress already (then
    that Build is returned and work is not run).  Returns the Build."""
    with _lock:
        b = _builds.get(env_dir)
        if b is not None and not b.done():
            return b
        b = Build(config, kind, directory, module)
        b.future = concurrent.futures.Future()
        _builds[env_dir] = b
        _all.append(b)
        if not _threads:
            atexit.register(_stop)
        if len(_threads) < pool_size():
            t = threading.Thread(target=_serve, name=f"bulkhead-build-{len(_threads)}", daemon=True)
            _threads.append(t)
            t.start()
        _queue.put((b, work, env_dir))
    return b


def _serve():
    while True:
        b, work, env_dir = _queue.get()
        if b.future.set_running_or_notify_cancel():
            _run(b, work, env_dir)


def _run(b, work, env_dir):
    try:
        work(b)
    except Exception as e:  # work records its own outcome; what escapes is a bug, logged, not lost
        log.exception("bulkhead: pack %r: its background build ended with an error", b.name)
        if b.error is None:
            b.error = f"{type(e).__name__}: {e} (bulkhead's own error: the traceback is in ComfyUI's log)"
        from . import states  # a cycle: states is imported by everything here
        if states.state_of(b.directory, b.module) == "building":     # not left "building" for ever
            states.failed(b.directory, b.name, b.error, module=b.module)
    finally:
        with _lock:
            if _builds.get(env_dir) is b:
                del _builds[env_dir]
            last = not _builds
        b.future.set_result(None)
        if last:
            from . import states  # a cycle: states is imported by everything here
            log.info("bulkhead: background builds done: %s", states.startup_line())


def _stop():
    """At exit: the builds still running end (their commands and what
    those started), not remembered as failed; a later start builds them."""
    from ..envs import build as envs
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
    node type another pack registered first is kept, with one warning),
    and tells the frontend (``READY_EVENT``)."""
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
        if not done.wait(REGISTER_WAIT_S):
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


def _add(config, classes, display, mapping, names):
    module = "custom_nodes." + os.path.basename(os.path.realpath(config.root))
    added = []
    for key, cls in classes.items():
        if key in mapping and mapping[key] is not cls:
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
    return added


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
    from aiohttp import web

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
    from .serverproxy import late_routes_middleware
    try:
        app.middlewares.append(wait_middleware())
        app.middlewares.append(late_routes_middleware())   # the routes of packs built meanwhile
    except (RuntimeError, AttributeError) as e:  # the app already runs: its list is frozen
        log.warning("bulkhead: a prompt queued while packs build is not held for them (%s): it is refused "
                    "until they are built", e)
        return False
    _middleware_on.add(id(server))
    return True
