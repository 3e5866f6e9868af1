"""The ``server`` module a pack imports inside a worker.

``from server import PromptServer`` in pack code must not run ComfyUI's
real server.py there (it imports aiohttp, PIL and app.*, and its
``PromptServer.instance`` is set only by the host's ``main.py``).
``nodes.ready()`` puts this module in ``sys.modules`` as ``server`` before
the pack imports, and ``PromptServer.instance`` here forwards to the
host's real PromptServer:

* ``send_sync``, ``send``, ``send_json``, ``send_bytes``, ``send_image``,
  ``send_progress_text``: the event goes to the host's ``send_sync``.  From
  the worker's main thread (a node's own thread, pack code at import) it
  is a CALLBACK the host answers, so a failure there is raised here; from
  any other thread (a pack's own, a route handler) it is a CALLBACK with
  request id 0 (no reply), which the host serves while it waits on this
  worker or, when it does not, from its reader thread (Worker.serve_unasked).
  Data is JSON as ComfyUI's websocket sends it, or bytes; a preview image
  (``UNENCODED_PREVIEW_IMAGE``, ``PREVIEW_IMAGE_WITH_METADATA``) is encoded
  in the worker with the pack's PIL (channel/events.py ``encode_event``)
  and crosses as the bytes of ``PREVIEW_IMAGE``
  (or of the metadata event), exactly what upstream's ``send_image`` puts
  on the websocket.
* ``client_id``, ``last_node_id``, ``last_prompt_id``: read from the host
  on the main thread, the last value read on other threads.
* ``routes`` (a RouteTableDef), ``app.add_routes``, ``app.router.add_*``
  and a module-level ``ROUTES`` list in the pack: collected after the pack
  imported (``collect_routes``), described to the host with the nodes, and
  served on the host's server by ``bulkhead.host.serverproxy``, which calls
  worker/nodes.py's ``handle_route``: ``serve_route`` here.  Handlers run on this worker's own event loop
  thread (as upstream runs them on its loop) under the host's deadline;
  the answer crosses as data (status, headers, body, or a file path).
* ``add_on_prompt_handler``: run by ``run_prompt_handlers`` (worker/nodes.py's
  ``on_prompt``) on the host's prompt, on the same loop thread, under a
  deadline.  This module never imports worker/nodes.py: the node runner
  imports it, and hands it the pack's routes.

The route and event formats (both halves) are channel/events.py's; the
route registration packs call is worker/routes.py's; ``HOST_TARGET``
(channel/targets.py) is the name the host exposes.  BinaryEventTypes,
describe_routes and UnsendableEvent stay importable from here, as packs
and worker/nodes.py find them on ``server``.
"""

import asyncio
import concurrent.futures
import sys
import threading

from .. import _native
from .. import worker as _worker
from ..channel import targets
from ..channel.events import (OP_SEND, OP_STATE, STATE_NAMES, BinaryEventTypes, UnsendableEvent,  # noqa: F401
                              check_sid, describe_routes, encode_event, encode_response,
                              progress_text)
from ..channel.events import pack_name, json_data as _json_data   # on_prompt's parameter is json_data
from .routes import App, Request, RouteDef, RouteTableDef, collect_routes as _collect

HOST_TARGET = targets.SERVER


class RouteTimeout(Exception):
    """A route or prompt handler did not finish within the host's deadline."""


# --- to the host ---

def _forward(op, *args):
    peer = _worker._peer
    if peer is None or peer.channel is None:
        raise RuntimeError("bulkhead's PromptServer works only inside a bulkhead worker")
    if threading.current_thread() is threading.main_thread():
        return _worker.call_host(HOST_TARGET, op, *args)
    try:  # request id 0: no reply; the host serves it when it reads this channel
        peer.channel.notify(_native.CALLBACK, (HOST_TARGET, (op,) + args, {}), 0)
    except _native.Error as e:
        print(f"bulkhead: pack {pack_name()!r}: event {op} not sent, the host channel is gone: {e}",
              file=sys.stderr)
    return None


# --- the worker's own event loop, where handlers run ---

_loop = None
_loop_lock = threading.Lock()


def _server_loop():
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="bulkhead-server-loop", daemon=True).start()
            _loop = loop
        return _loop


def _run_on_loop(make, timeout_s, what):
    """Runs make() (a coroutine, or a plain call) on the loop thread; its
    result within timeout_s, else RouteTimeout.  A loop left blocked by a
    handler that ignores cancellation is abandoned for a fresh one."""
    global _loop
    loop = _server_loop()

    async def runner():
        out = make()
        if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
            out = await out
        return out
    fut = asyncio.run_coroutine_threadsafe(runner(), loop)
    try:
        return fut.result(timeout_s)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        probe = concurrent.futures.Future()
        loop.call_soon_threadsafe(probe.set_result, None)
        try:
            probe.result(0.2)
        except concurrent.futures.TimeoutError:
            with _loop_lock:
                if _loop is loop:
                    _loop = None  # stuck in a handler: the next one gets a new loop
        raise RouteTimeout(f"{what} did not finish within {timeout_s:g} s") from None


def collect_routes(modules=()):
    """Every route the pack registered so far on this PromptServer, and the
    problems (worker/routes.py's collect_routes)."""
    srv = PromptServer.instance
    return _collect(srv.routes, srv.app, modules)


def serve_route(entries, index, method, path, request, timeout_s):
    """Serves route #index of entries (collect_routes' list: method, path
    as described to the host) for the host: worker/nodes.py's
    handle_route (targets.HANDLE_ROUTE) hands it the pack's routes."""
    e = entries[index] if 0 <= index < len(entries) else None
    if not isinstance(e, RouteDef) or e.path != path or e.method not in (method, "*"):
        raise LookupError(f"pack {pack_name()!r} no longer has the route {method} {path} (its sources "
                          "changed since the host read them? restart ComfyUI)")
    where = f"route {method} {path} of pack {pack_name()!r}"
    req = Request(request, PromptServer.instance.app)
    try:
        res = _run_on_loop(lambda: e.handler(req), timeout_s, where)
    except RouteTimeout:
        raise
    except Exception as exc:
        if isinstance(getattr(exc, "status", None), int) and hasattr(exc, "headers"):
            res = exc  # aiohttp's HTTPException: a response raised
        else:
            raise
    return encode_response(res, where)


def run_prompt_handlers(json_data, timeout_s):
    """Runs the pack's prompt handlers in order, as upstream's
    trigger_on_prompt does (a failing one is reported and skipped):
    worker/nodes.py's on_prompt (targets.ON_PROMPT), once the pack is
    imported."""
    handlers = list(PromptServer.instance.on_prompt_handlers)

    def run_all():
        data = json_data
        for h in handlers:
            try:
                data = h(data)
            except Exception as e:
                import traceback  # lazy: worker start
                print(f"bulkhead: pack {pack_name()!r}: on_prompt handler {h!r} failed: {e!r}\n"
                      + traceback.format_exc(), file=sys.stderr)
        return data
    out = _run_on_loop(run_all, timeout_s, f"the prompt handlers of pack {pack_name()!r}")
    return _json_data("on_prompt", out)


# --- the server ---

class PromptServer:
    """``PromptServer.instance`` inside a worker (see the module doc)."""

    instance = None

    def __init__(self):
        PromptServer.instance = self
        self.routes = RouteTableDef()
        self.app = App()
        self.on_prompt_handlers = []
        self._state = dict.fromkeys(STATE_NAMES)

    def _read(self, name):
        if threading.current_thread() is threading.main_thread() and _worker._peer is not None:
            try:
                self._state.update(_forward(OP_STATE) or {})
            except Exception:  # the host is not waiting (or says nothing): the last value read
                pass
        return self._state.get(name)

    client_id = property(lambda self: self._read("client_id"),
                         lambda self, v: self._state.__setitem__("client_id", v))
    last_node_id = property(lambda self: self._read("last_node_id"),
                            lambda self, v: self._state.__setitem__("last_node_id", v))
    last_prompt_id = property(lambda self: self._read("last_prompt_id"),
                              lambda self, v: self._state.__setitem__("last_prompt_id", v))

    def send_sync(self, event, data, sid=None):
        event, data = encode_event(event, data)
        _forward(OP_SEND, event, data, check_sid(sid))

    async def send(self, event, data, sid=None):
        self.send_sync(event, data, sid)

    async def send_json(self, event, data, sid=None):
        _forward(OP_SEND, event, _json_data(event, data), check_sid(sid))

    async def send_bytes(self, event, data, sid=None):
        self.send_sync(event, bytes(data), sid)

    async def send_image(self, image_data, sid=None):
        self.send_sync(BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, image_data, sid)

    async def send_image_with_metadata(self, image_data, metadata=None, sid=None):
        self.send_sync(BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA, (image_data, metadata), sid)

    def send_progress_text(self, text, node_id, sid=None):
        self.send_sync(BinaryEventTypes.TEXT, progress_text(text, node_id), sid)

    def add_on_prompt_handler(self, handler):
        self.on_prompt_handlers.append(handler)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"PromptServer.instance.{name} is not available to pack {pack_name()!r} in its bulkhead worker: "
            "there it has routes, app.add_routes, send_sync/send/send_json/send_bytes/send_image, "
            "send_progress_text, client_id, last_node_id, last_prompt_id and add_on_prompt_handler")


PromptServer()
