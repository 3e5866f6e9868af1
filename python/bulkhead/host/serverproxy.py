"""The host side of ``server.PromptServer`` in workers (worker/server.py);
what crosses between the two is channel/events.py's.

One ``ServerProxy`` per isolated pack.  It exposes ``HOST_TARGET`` to the
pack's worker, through which the worker's PromptServer sends events
(``send_sync`` on this process's real ``PromptServer.instance``) and reads
``client_id`` / ``last_node_id`` / ``last_prompt_id``; and, from the
pack's description, it installs on the host's server what the pack
registered at import, as an in-process pack would have: each route on
``PromptServer.instance.routes`` (so ``add_routes()`` serves it, ``/api``
copy included), static directories as they are, and one prompt handler
standing for the pack's.

A route's handler runs on the host's event loop only to read the request;
the call into the worker runs on a thread of bulkhead's own route pool
(``ROUTE_THREADS``; never aiohttp's default executor, which ComfyUI's
static files use), at most ``ROUTE_PER_PACK`` requests of one pack at once
(past either bound: 503 at once).  It waits ``ROUTE_BUSY_S`` at most for
the worker lock (a running node holds it, maybe for minutes: 503), and
gives the worker ``route_timeout`` s for the pack's handler.  Each way it
can fail is an HTTP answer naming the pack: 503 busy, 504 too slow, 502
dead or failed to start, 500 the handler raised.  Prompt handlers run
synchronously (upstream's ``trigger_on_prompt`` is) under
``prompt_handler_timeout`` s; a failure is logged and the prompt goes on
unchanged, as upstream does with a handler that raises.
"""

import asyncio
import concurrent.futures
import logging
import sys
import threading

from .. import _native
from ..channel.peer import BulkheadError, RemoteError
from ..channel import events, targets

log = logging.getLogger("bulkhead")

HOST_TARGET = targets.SERVER
ROUTE_TIMEOUT_S = 60.0
ROUTE_BUSY_S = 1.0     # the longest a route request waits for a worker running a node
ROUTE_THREADS = 8      # bulkhead's route pool, all packs together
ROUTE_PER_PACK = 4     # route requests of one pack in the pool at once
PROMPT_HANDLER_TIMEOUT_S = 10.0
GRACE_S = 10.0  # beyond the worker-side deadline before the worker counts as hung


# Routes of packs described after ComfyUI's server started (an environment
# built in the background: host/building.py): aiohttp's router is frozen by
# then, so they go into a router of bulkhead's own, which a middleware put
# on ComfyUI's app while its packs loaded (host/building.install_wait)
# serves ahead of ComfyUI's router, for those paths only.
_late = None
_late_lock = threading.Lock()


def _started(srv):
    """Whether srv's aiohttp app has frozen its router (it serves)."""
    router = getattr(getattr(srv, "app", None), "router", None)
    return bool(getattr(router, "frozen", False))


def _late_router():
    global _late
    with _late_lock:
        if _late is None:
            from aiohttp import web  # optional: aiohttp
            _late = web.UrlDispatcher()
        return _late


def late_routes_middleware():
    """The aiohttp middleware serving the routes of packs described after
    the server started (see above); every other request goes on as it
    came."""
    from aiohttp import web  # optional: aiohttp

    @web.middleware
    async def bulkhead_late_routes(request, handler):
        router = _late
        if router is not None:
            match = await router.resolve(request)
            if match.http_exception is None:
                late = request.clone()          # a request whose match_info was never read (it is cached)
                late._match_info = match        # the pack's handler reads its path's variables there
                return await match.handler(late)
        return await handler(request)
    return bulkhead_late_routes


def prompt_server():
    """This process's PromptServer.instance, or None."""
    srv = sys.modules.get("server")
    cls = getattr(srv, "PromptServer", None)
    return getattr(cls, "instance", None)


# The longest on_prompt waits on the server's loop for the worker's lock:
# its reader thread holds it for a frame at a time, a node call for the
# whole node (never waited for: Worker.busy).
BRIEF_S = 0.25


_pool = None
_pool_lock = threading.Lock()
_pool_used = 0


def _route_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(ROUTE_THREADS, thread_name_prefix="bulkhead-route")
        return _pool


class RouteFailed(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


def from_worker(op, *args):
    """What the worker's PromptServer asks of the host's (HOST_TARGET)."""
    srv = prompt_server()
    if op == events.OP_SEND:
        event, data, sid = args
        if srv is not None:
            srv.send_sync(event, data, sid)
        return None
    if op == events.OP_STATE:
        return {name: getattr(srv, name, None) for name in events.STATE_NAMES}
    raise ValueError(f"unknown PromptServer operation {op!r}")


class ServerProxy:
    def __init__(self, rt):
        self.rt = rt
        rt.worker.expose(HOST_TARGET, from_worker)
        rt.worker.serve_unasked = True
        self.route_timeout_s = float(rt.options.get("route_timeout_s", ROUTE_TIMEOUT_S))
        self.prompt_timeout_s = float(rt.options.get("prompt_handler_timeout_s", PROMPT_HANDLER_TIMEOUT_S))
        self.installed = []
        self.in_flight = 0     # route requests of this pack in the pool (under _pool_lock)

    def install(self, meta):
        """Puts the pack's routes and prompt handler on the host's server."""
        routes = meta.get("routes") or []
        handlers = int(meta.get("prompt_handlers") or 0)
        if not routes and not handlers:
            return
        srv = prompt_server()
        if srv is None:
            log.warning("bulkhead: pack %r registers %d route(s) and %d prompt handler(s), but this "
                        "process has no PromptServer.instance: they are not served", self.rt.name,
                        len(routes), handlers)
            return
        late = _started(srv)
        for index, r in enumerate(routes):
            if late:    # ComfyUI's router is frozen: bulkhead's own serves it (late_routes_middleware)
                table = _late_router()
                if r.get("static"):
                    table.add_static(r["prefix"], r["path"])
                else:
                    table.add_route(r["method"], r["path"], self._handler(index, r["method"], r["path"]))
            elif r.get("static"):
                srv.routes.static(r["prefix"], r["path"])
            else:
                srv.routes.route(r["method"], r["path"])(self._handler(index, r["method"], r["path"]))
            self.installed.append(r)
        if handlers:
            srv.add_on_prompt_handler(self.on_prompt)

    def _handler(self, index, method, path):
        proxy = self

        async def handler(request):
            from aiohttp import web  # optional: aiohttp
            data = events.encode_request(request, await request.read() if request.can_read_body else b"")
            loop = asyncio.get_running_loop()
            try:
                proxy._enter()
                try:
                    res = await loop.run_in_executor(_route_pool(), proxy.call_route, index, method, path, data)
                finally:
                    proxy._leave()
            except RouteFailed as e:
                return web.Response(status=e.status, text=str(e),
                                    headers={"Retry-After": "1"} if e.status == 503 else None)
            return events.decode_response(res, web)
        handler.__name__ = handler.__qualname__ = f"bulkhead_route_{self.rt.name}_{index}"
        return handler

    def _enter(self):
        """Counts a route request into the pool, or RouteFailed(503) at once
        when this pack's share or the whole pool is taken."""
        global _pool_used
        with _pool_lock:
            if self.in_flight >= ROUTE_PER_PACK:
                raise RouteFailed(503, f"bulkhead: pack {self.rt.name!r} has {self.in_flight} route requests "
                                       f"in flight, the most it may (ROUTE_PER_PACK); try again when they answer")
            if _pool_used >= ROUTE_THREADS:
                raise RouteFailed(503, f"bulkhead: all {ROUTE_THREADS} route threads of the isolated packs are "
                                       f"busy; the route of pack {self.rt.name!r} cannot run now, try again")
            self.in_flight += 1
            _pool_used += 1

    def _leave(self):
        global _pool_used
        with _pool_lock:
            self.in_flight -= 1
            _pool_used -= 1

    def call_route(self, index, method, path, data):
        """On an executor thread: the worker's answer as data, or RouteFailed."""
        rt, t = self.rt, self.route_timeout_s
        what = f"route {method} {path} of pack {rt.name!r}"
        out = self._call(what, t, targets.HANDLE_ROUTE, index, method, path, data, t)
        if not isinstance(out, dict) or not isinstance(out.get("status"), int):
            raise RouteFailed(500, f"bulkhead: {what} answered {type(out).__name__}, not a response")
        return out

    def on_prompt(self, json_data):
        """Upstream's trigger_on_prompt calls this on the server's event
        loop, synchronously: it never waits there for the worker, never
        starts one and never imports the pack.  A worker that is not running,
        or busy running a node, has its handlers skipped for this prompt
        with one line; only an idle worker's handlers run (bounded by
        prompt_handler_timeout, as an in-process handler blocks the loop
        while it runs)."""
        what = f"the prompt handlers of pack {self.rt.name!r}"
        t = self.prompt_timeout_s
        if not self.rt.worker.alive:
            log.warning("bulkhead: %s are skipped for this prompt: the pack's worker is not running (it starts "
                        "when a node of the pack runs; ComfyUI's event loop never waits for that)", what)
            return json_data
        try:
            return self._call(what, t, targets.ON_PROMPT, json_data, t, wait=False)
        except RouteFailed as e:
            log.warning("%s; the prompt goes on without them", e)
            return json_data

    def _call(self, what, timeout_s, target, *args, wait=True):
        w = self.rt.worker
        if not wait and w.busy:
            raise RouteFailed(503, self._skipped(what))
        # A call in progress (a node) is never waited for past these; the
        # lock's brief holds by the worker's frame reader and release
        # flusher are.
        with w.holding(BRIEF_S if not wait else min(timeout_s, ROUTE_BUSY_S)) as held:
            if not held:
                raise RouteFailed(503, self._skipped(what) if not wait else
                                  f"bulkhead: {what} cannot run now: the pack's worker is busy running a "
                                  f"node; try again when it is done")
            return self._request(w, what, timeout_s, target, args)

    @staticmethod
    def _skipped(what):
        return (f"bulkhead: {what} are skipped for this prompt: the pack's worker is running a node "
                "(ComfyUI's event loop never waits for it)")

    @staticmethod
    def _request(w, what, timeout_s, target, args):
        """The route's or handler's call, under the worker lock."""
        try:
            return w.request(_native.CALL, (target, args, {}), timeout_s + GRACE_S, "call", what)
        except RemoteError as e:
            if e.remote_type.endswith("RouteTimeout"):
                raise RouteFailed(504, f"bulkhead: {what} did not answer within {timeout_s:g} s "
                                       "(the worker goes on serving)") from None
            log.warning("bulkhead: %s failed: %s", what, e.detail)
            raise RouteFailed(500, f"bulkhead: {what} raised {e.remote_type}: {e.remote_message}") from None
        except BulkheadError as e:
            log.warning("bulkhead: %s: %s", what, e)
            raise RouteFailed(502, f"bulkhead: {what} failed: {str(e).splitlines()[0]}") from None
