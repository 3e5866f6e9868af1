"""bulkhead inside ComfyUI's web server: the routes the sidebar panel and
scripts use, the observer of ComfyUI's ``/free``, and their installing.

Routes (``install`` puts them on ``PromptServer.instance.routes`` while
custom nodes load, so upstream's ``add_routes`` also serves each under
``/api``):

    GET  /bulkhead/status   the status document, plus "host_pid" (this
                            process) and "timeline" (recent releases and
                            evictions from HostMemory.events, oldest first)
    POST /bulkhead/release  {"pid": int} or {"pack": str} (this host's
                            worker of that pack when it has one), optional
                            "bytes": int|null (null: the full ladder) ->
                            {"worker_pid", "pack", "host_pid", "before_bytes",
                            "after_bytes", "freed_bytes", "receipt"}; errors
                            are {"error": message} with 400 (bad body, or a
                            pack name that matches several workers), 403 (a
                            worker of another host, asked from off the
                            machine), 404 (no such worker), 409 (the worker
                            stayed busy), 429 (ACT_ADMITTED releases in
                            progress already), 502 (its host is unreachable
                            or failed), 504 (timeout)
    POST /bulkhead/free     {"all_hosts": bool, "wait_s": float <= 60}: the
                            full ladder on every worker of this host (waiting
                            up to wait_s for one in a call), and with
                            all_hosts (403 from off the machine) on every
                            idle worker of the other hosts ->
                            {"host_pid", "all_hosts", "processes": [{"pid",
                            "pack", "host_pid", "state", "before_bytes",
                            "after_bytes", "freed_bytes", "error"}...],
                            "before_bytes", "after_bytes", "freed_bytes"};
                            sent only after the bytes moved; errors as above

    POST /bulkhead/build    {"pack": str, "action": "build"|"retry"|"rebuild"}:
                            the pack's environment is built again in the
                            background (host/building.py ``act``; the
                            actions each pack offers are its "actions" in
                            the status) -> 202 {"pack", "action", "phase",
                            "log": null}; its progress is in the status;
                            errors as above, and 403 from a request of
                            another origin (its Origin is not its Host) or,
                            without an Origin, from off the machine, 404
                            (no such pack), 409 (not offered now, or its
                            comfy-env.toml is invalid)
    GET  /bulkhead/log?pack=<name>
                            the newest build log of that pack: {"pack",
                            "path", "text" (its last MAX_LOG_BYTES),
                            "truncated": bool}; 404 where it has none

What a web client may do (ComfyUI often listens on 0.0.0.0, with no
authentication): read the status, release and free this instance's
workers, read a pack's build log, and have a pack built (only a request
of ComfyUI's own page -- its Origin is its Host, as ComfyUI's own origin
check has it -- or, without an Origin, a client on this machine: a page
of another site cannot start builds).  Reaching other instances' workers (all_hosts, a release of
another host's worker) needs a loopback client or
$BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1.  Every wait is bounded (wait_s at most
MAX_WAIT_S, a release by the worker's release timeout), releases run on
ACT_THREADS threads of their own with at most ACT_ADMITTED admitted, and
the status snapshot runs off the loop, one at a time.

The work behind each route -- the status document (its schema), the
measured releases, the wait for ComfyUI's own /free, the prompt boundary
-- is host/service.py's (its module doc).
"""

import asyncio
import concurrent.futures
import ipaddress
import json
import logging
import os
import urllib.parse
import weakref

from ..envs.config import PackConfigError
from . import building, prewarm, states
from .service import ALLOW_REMOTE_ENV, BulkheadService, RouteError, refuse_other_hosts, default_host_memory

log = logging.getLogger("bulkhead")

MAX_WAIT_S = 60.0                 # the most a request's "wait_s" may ask
MAX_BYTES = (1 << 63) - 1         # the most a request's "bytes" may ask (the codec's int64)
# Releases and frees (POST /bulkhead/release, /bulkhead/free, ComfyUI's
# /free) run on ACT_THREADS threads of their own, never the default
# executor's; at most ACT_ADMITTED are admitted at once (running or
# waiting for a thread), more are answered 429.
ACT_THREADS = 2
ACT_ADMITTED = 4


# --------------------------------------------------------------- requests

def _shown(value):
    """A request's value as JSON, shortened for an error message."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_release(body):
    if not isinstance(body, dict):
        raise RouteError(400, 'the body must be a JSON object: {"pid": <int>} or {"pack": <str>}, '
                              'optionally "bytes": <int> or null')
    pid, pack, nbytes = body.get("pid"), body.get("pack"), body.get("bytes")
    if (pid is None) == (pack is None):
        raise RouteError(400, 'name exactly one worker: "pid" (an int) or "pack" (a string)')
    if pid is not None and (type(pid) is not int or not 0 < pid < 1 << 31):
        raise RouteError(400, f'"pid" must be a positive integer, not {_shown(pid)}')
    if pack is not None and (not isinstance(pack, str) or not pack):
        raise RouteError(400, f'"pack" must be a non-empty string, not {_shown(pack)}')
    if nbytes is not None and (type(nbytes) is not int or not 0 < nbytes <= MAX_BYTES):
        raise RouteError(400, f'"bytes" must be a positive integer or null (the full release), '
                              f'at most {MAX_BYTES}, not {_shown(nbytes)}')
    return (pid if pid is not None else pack), nbytes


def _parse_free(body):
    """(all_hosts, wait_s) of a /bulkhead/free body; wait_s None: the
    route's default."""
    if not isinstance(body, dict):
        raise RouteError(400, 'the body must be a JSON object: {"all_hosts": <bool>, "wait_s": <seconds>}')
    all_hosts, wait_s = body.get("all_hosts", False), body.get("wait_s")
    if not isinstance(all_hosts, bool):
        raise RouteError(400, f'"all_hosts" must be a boolean, not {_shown(all_hosts)}')
    # (NaN and infinities fail the comparison, as a huge int does)
    if wait_s is not None and (isinstance(wait_s, bool) or not isinstance(wait_s, (int, float))
                               or not 0 <= wait_s <= MAX_WAIT_S):
        raise RouteError(400, f'"wait_s" must be a number of seconds from 0 to {MAX_WAIT_S:g}, '
                              f'not {_shown(wait_s)}')
    return all_hosts, (None if wait_s is None else float(wait_s))


# Headers a reverse proxy adds for the client it forwards: a request that
# carries one came from somewhere else, whatever its loopback peer says.
FORWARDED_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


def from_loopback(request):
    """True when the request's client is on this machine (a loopback
    address; IPv4-mapped IPv6 included) and no proxy forwarded it (no
    Forwarded / X-Forwarded-For / X-Real-IP header: behind a local reverse
    proxy every peer is loopback).  A request without an IP peer (a Unix
    socket, an unknown transport) is not."""
    headers = getattr(request, "headers", None) or {}
    if any(h in headers for h in FORWARDED_HEADERS):
        return False
    try:
        addr = ipaddress.ip_address(request.remote or "")
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def same_origin_or_loopback(request):
    """Whether a request may change what bulkhead serves (POST
    /bulkhead/build): one that carries an Origin (a browser's) only where
    it is its Host, as ComfyUI's own origin check compares them (ports
    only where both give one), from anywhere: ComfyUI's own page; one
    without an Origin (a script) only from this machine (``from_loopback``)
    or with $BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1."""
    headers = getattr(request, "headers", None) or {}
    origin = headers.get("Origin")
    if origin is None:
        return may_reach_other_hosts(request)
    host = (headers.get("Host") or "").lower()
    parsed = urllib.parse.urlparse(origin.lower())
    host_parsed = urllib.parse.urlsplit("//" + host)
    origin_domain = parsed.netloc if host_parsed.port is not None else parsed.hostname
    host_domain = host if parsed.port is not None else host_parsed.hostname
    return bool(host_domain) and origin_domain == host_domain


def only_this_host(doc):
    """The status document as a client off the machine sees it: this
    host's records and its workers' only (the other ComfyUI instances of
    the user -- their pids, interpreters, packs, models -- are not its
    business, as acting on them is not)."""
    me = os.getpid()
    doc = dict(doc)
    doc["processes"] = [p for p in doc.get("processes", []) if p.get("pid") == me or p.get("host_pid") == me]
    doc["other_hosts_hidden"] = True
    return doc


def may_reach_other_hosts(request):
    """Whether this request may act on other ComfyUI instances' workers:
    from loopback, or anywhere with $BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1."""
    return from_loopback(request) or os.environ.get(ALLOW_REMOTE_ENV) == "1"


class BulkheadRoutes(BulkheadService):
    """The routes, the /free observer and the prompt boundary of one
    ComfyUI process, on aiohttp (the work is BulkheadService's)."""

    def __init__(self, host_memory=None, **options):
        super().__init__(host_memory, **options)
        # GET /bulkhead/status: the snapshot in flight (an asyncio future on
        # the server's loop, shared by every request that comes meanwhile)
        # and the one thread that takes snapshots, off the loop and apart
        # from the default executor's (a snapshot may wait 2 s on the
        # ledger's mutex; aiohttp's FileResponse needs those threads).
        self._snapshot = None
        self._status_pool = None
        self._act_pool = None          # the threads releases and frees run on
        self._acting = 0               # releases and frees admitted (on the loop only)

    async def status_async(self):
        """The GET /bulkhead/status answer, on the server's loop: the
        snapshot runs on this object's own thread, one at a time; a request
        that comes while one is in flight shares its document (taken at
        most one snapshot's time before), so neither a held ledger mutex
        nor a client polling in a loop ever waits on the loop or queues
        snapshots."""
        fut = self._snapshot
        if fut is None or fut.done():
            if self._status_pool is None:
                self._status_pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="bulkhead-status")
            fut = asyncio.get_running_loop().run_in_executor(self._status_pool, self.snapshot)
            self._snapshot = fut
        # shield: a client that goes away cancels its wait, not the others'
        return self._answer(await asyncio.shield(fut))

    # --- aiohttp ---

    async def _run(self, fn, *args):
        """fn(*args) on this object's acting threads (not the default
        executor: aiohttp's FileResponse needs those)."""
        if self._act_pool is None:
            self._act_pool = concurrent.futures.ThreadPoolExecutor(
                ACT_THREADS, thread_name_prefix="bulkhead-act")
        return await asyncio.get_running_loop().run_in_executor(self._act_pool, fn, *args)

    async def _act(self, fn, *args):
        """fn(*args) on the acting threads, if fewer than ACT_ADMITTED are
        admitted already; else RouteError 429 (nothing runs)."""
        if self._acting >= ACT_ADMITTED:
            raise RouteError(429, f"{self._acting} releases and frees are in progress already; "
                                  "try again when they have answered")
        self._acting += 1
        try:
            return await self._run(fn, *args)
        finally:
            self._acting -= 1

    async def _json_body(self, request, default=None):
        if default is not None and not request.can_read_body:
            return default
        try:
            return await request.json()
        except ValueError as e:
            raise RouteError(400, f"the body is not JSON: {e}") from None

    async def get_status(self, request):
        from aiohttp import web  # optional: aiohttp
        doc = await self.status_async()
        if not may_reach_other_hosts(request):
            doc = only_this_host(doc)
        return web.json_response(doc)

    async def post_release(self, request):
        from aiohttp import web  # optional: aiohttp
        try:
            who, nbytes = _parse_release(await self._json_body(request))
            refused = None if may_reach_other_hosts(request) else (request.remote or "")
            return web.json_response(await self._act(self.release, who, nbytes, refused))
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    async def post_free(self, request):
        from aiohttp import web  # optional: aiohttp
        try:
            all_hosts, wait_s = _parse_free(await self._json_body(request, {}))
            if all_hosts and not may_reach_other_hosts(request):
                raise refuse_other_hosts(request.remote,
                                         '"all_hosts" reaches every instance on this machine')
            return web.json_response(await self._act(self.free, all_hosts, wait_s, "free"))
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    async def post_build(self, request):
        from aiohttp import web  # optional: aiohttp
        try:
            body = await self._json_body(request)
            if not isinstance(body, dict) or not isinstance(body.get("pack"), str) or \
                    body.get("action") not in building.ACTIONS:
                raise RouteError(400, 'the body must be a JSON object: {"pack": <a pack\'s name, as GET '
                                      '/bulkhead/status lists it>, "action": "build", "retry" or "rebuild"}')
            if not same_origin_or_loopback(request):
                raise RouteError(403, f"a build is started only from ComfyUI's own page (an Origin that is its "
                                      f"Host) or a client on this machine; {request.remote or 'this client'} is "
                                      f"neither. Fix: press the button in ComfyUI's bulkhead panel, or run "
                                      f"`bulkhead install <pack dir>` on the machine")
            try:
                b = await self._run(building.act, body["pack"], body["action"])
            except LookupError as e:
                raise RouteError(404, str(e).strip("'\"")) from None
            except (ValueError, PackConfigError) as e:
                raise RouteError(409, str(e)) from None
            return web.json_response({"pack": b.name, "action": body["action"], "phase": b.phase,
                                      "log": b.log_path}, status=202)
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    async def get_log(self, request):
        from aiohttp import web  # optional: aiohttp
        try:
            name = request.query.get("pack")
            if not name:
                raise RouteError(400, "name the pack: GET /bulkhead/log?pack=<its name, as GET /bulkhead/status "
                                      "lists it>")
            rows = [dict(r) for r in states.pack_states() if r["name"] == name]
            if not rows:
                raise RouteError(404, f"no pack {name!r} is served by bulkhead here; name one as GET "
                                      "/bulkhead/status lists it")
            path = building.annotate(rows)[0].get("log")
            if not path:
                raise RouteError(404, f"pack {name!r} has no build log here (none of its builds ran since its "
                                      "logs were kept); its state in GET /bulkhead/status says why")
            text, truncated = await self._run(_read_tail, path, MAX_LOG_BYTES)
            return web.json_response({"pack": name, "path": path, "text": text, "truncated": truncated})
        except OSError as e:
            return web.json_response({"error": f"the build log cannot be read: {e}"}, status=404)
        except RouteError as e:
            return web.json_response({"error": str(e)}, status=e.status)

    def free_observer(self):
        """The aiohttp middleware that follows ComfyUI's POST /free (and
        /api/free): upstream's handler runs first and sets its flags; then,
        if either flag was asked for, this host's workers run the full
        ladder, and the answer carries their before/after bytes."""
        from aiohttp import web  # optional: aiohttp

        @web.middleware
        async def bulkhead_free_observer(request, handler):
            if request.method != "POST" or request.path not in ("/free", "/api/free"):
                return await handler(request)
            try:
                body = await request.json()   # aiohttp keeps the body: upstream reads it again
            except ValueError:
                body = None
            asked = isinstance(body, dict) and bool(body.get("free_memory") or body.get("unload_models"))
            # Read before upstream's handler: its prompt worker may start
            # unloading (through the stand-ins) as soon as the flags are set.
            before = await self._run(self.held_now) if asked else None
            response = await handler(request)
            if not asked or response.status != 200 or not isinstance(response, web.Response):
                return response
            # "Free model and node cache" stops idle workers only for a
            # client on this machine; from elsewhere (any web client can
            # post it, and ComfyUI has no authentication) they release.
            exit_idle = bool(body.get("free_memory")) and from_loopback(request)
            try:
                report = await self._act(self.free_after_comfyui, before, exit_idle)
            except RouteError as e:  # too many at once: upstream's answer alone
                log.warning("bulkhead: ComfyUI's /free: %s (the workers release after their idle time)", e)
                return response
            if response.body is None or response.body == b"":
                return web.json_response({"bulkhead": report}, status=response.status)
            if response.content_type == "application/json":
                try:
                    doc = json.loads(response.body)
                except ValueError:
                    return response
                if isinstance(doc, dict):
                    doc["bulkhead"] = report
                    return web.json_response(doc, status=response.status)
            return response  # a body of upstream's own: left as it is (the timeline has the figures)

        return bulkhead_free_observer

    def add_to(self, routes):
        """Adds the routes to an aiohttp RouteTableDef (ComfyUI's
        ``PromptServer.instance.routes``) or a router (``app.router``)."""
        table = [("GET", "/bulkhead/status", self.get_status),
                 ("POST", "/bulkhead/release", self.post_release),
                 ("POST", "/bulkhead/free", self.post_free),
                 ("POST", "/bulkhead/build", self.post_build),
                 ("GET", "/bulkhead/log", self.get_log)]
        for method, path, handler in table:
            if hasattr(routes, "add_route"):
                routes.add_route(method, path, handler)
            else:
                routes.route(method, path)(handler)



MAX_LOG_BYTES = 1 << 20           # the most of a build log GET /bulkhead/log answers with (its end)


def _read_tail(path, limit):
    """(text, truncated): the last ``limit`` bytes of the file at path."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace"), size > limit


# ----------------------------------------------------------- installing

_installed = weakref.WeakKeyDictionary()   # PromptServer -> BulkheadRoutes


def use_host_memory(host_memory):
    """Names this process's HostMemory for routes installed without one."""
    default_host_memory[0] = host_memory


def install(server=None, host_memory=None, **options):
    """Puts bulkhead on ComfyUI's server (default ``PromptServer.instance``):
    the routes, the /free observer, the prompt boundary.  Call while custom
    nodes load (before the server starts: aiohttp freezes its middleware
    list then).  Idempotent per server; returns its BulkheadRoutes, whose
    ``prompt_hook`` says which prompt hook was found (None: none)."""
    if server is None:
        import server as comfy_server  # comfyui: server
        server = comfy_server.PromptServer.instance
    routes = _installed.get(server)
    if routes is not None:
        if host_memory is not None:
            routes._host_memory = host_memory
        return routes
    routes = BulkheadRoutes(host_memory, **options)
    if getattr(server.app, "frozen", False):
        log.warning("bulkhead: ComfyUI's server already runs; its routes can no longer be added "
                    "(install bulkhead's while custom nodes load)")
    routes.add_to(server.routes)
    try:
        server.app.middlewares.append(routes.free_observer())
    except RuntimeError as e:  # the app already runs: its middleware list is frozen
        log.warning("bulkhead: ComfyUI's /free is not observed (%s); POST /bulkhead/free still "
                    "releases the workers", e)
    routes.hook_prompt_boundary()
    prewarm.install(server)
    try:
        server.app.on_startup.append(_log_startup_line)
    except (AttributeError, RuntimeError):       # no aiohttp signal, or the app already runs
        pass
    _installed[server] = routes
    return routes


async def _log_startup_line(app):
    log.info("%s", states.startup_line())


def installed(server=None):
    """The BulkheadRoutes installed on server (default: any), or None."""
    if server is not None:
        return _installed.get(server)
    return next(iter(_installed.values()), None)
