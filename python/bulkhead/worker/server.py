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
  here with the pack's PIL and crosses as the bytes of ``PREVIEW_IMAGE``
  (or of the metadata event), exactly what upstream's ``send_image`` puts
  on the websocket.
* ``client_id``, ``last_node_id``, ``last_prompt_id``: read from the host
  on the main thread, the last value read on other threads.
* ``routes`` (a RouteTableDef), ``app.add_routes``, ``app.router.add_*``
  and a module-level ``ROUTES`` list in the pack: collected after the pack
  imported (``collect_routes``), described to the host with the nodes, and
  served on the host's server by ``bulkhead.host.serverproxy``, which calls
  ``handle_route`` here.  Handlers run on this worker's own event loop
  thread (as upstream runs them on its loop) under the host's deadline;
  the answer crosses as data (status, headers, body, or a file path).
* ``add_on_prompt_handler``: run by ``on_prompt`` on the host's prompt, on
  the same loop thread, under a deadline.

Both halves of the route and event formats live here and in
host/serverproxy.py; ``HOST_TARGET`` (channel/targets.py) is the name the host exposes.
"""

import asyncio
import concurrent.futures
import io
import json
import os
import struct
import sys
import threading

from .. import _native
from .. import worker as _worker
from ..channel import targets

HOST_TARGET = targets.SERVER
_PACK = os.environ.get("BULKHEAD_PACK_NAME", "?")


class BinaryEventTypes:
    """The websocket's binary event numbers, as upstream's protocol.py."""
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3
    PREVIEW_IMAGE_WITH_METADATA = 4


class RouteTimeout(Exception):
    """A route or prompt handler did not finish within the host's deadline."""


class UnsendableEvent(TypeError):
    """An event whose data cannot cross to the host's PromptServer."""


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
        print(f"bulkhead: pack {_PACK!r}: event {op} not sent, the host channel is gone: {e}",
              file=sys.stderr)
    return None


def _json_data(event, data):
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError, RecursionError) as e:
        raise UnsendableEvent(
            f"PromptServer.send_sync({event!r}, ...) in pack {_PACK!r}: the data cannot be sent to "
            f"the host ({e}); an event's data must be JSON (dict, list, str, number, bool, None) or "
            "bytes, as ComfyUI's websocket sends it") from None


def _pil_image(event, image):
    save = getattr(image, "save", None)
    if save is None or not hasattr(image, "size"):
        raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {_PACK!r}: a preview "
                              f"must be (format, PIL.Image, max_size), not a {type(image).__name__}")
    return image


def _contain(image, max_size):
    if max_size is None:
        return image
    from PIL import Image, ImageOps
    resampling = Image.Resampling.BILINEAR if hasattr(Image, "Resampling") else Image.LANCZOS
    return ImageOps.contain(image, (max_size, max_size), resampling)


def _image_bytes(event, image_data):
    """(format, image, max_size) -> (format, encoded bytes), as upstream's
    send_image encodes them."""
    try:
        fmt, image, max_size = image_data
    except (TypeError, ValueError):
        raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {_PACK!r}: a preview "
                              "must be a (format, PIL.Image, max_size) tuple") from None
    image = _contain(_pil_image(event, image), max_size)
    out = io.BytesIO()
    image.save(out, format=fmt, quality=95, compress_level=1)
    return fmt, out.getvalue()


def encode_event(event, data):
    """What crosses for send_sync(event, data): (event, data) with a
    preview encoded and everything else JSON or bytes."""
    if not isinstance(event, (str, int)) or isinstance(event, bool):
        raise UnsendableEvent(f"PromptServer.send_sync in pack {_PACK!r}: the event must be a str "
                              f"or a binary event number, not {type(event).__name__}")
    if event == BinaryEventTypes.UNENCODED_PREVIEW_IMAGE:
        fmt, raw = _image_bytes(event, data)
        return BinaryEventTypes.PREVIEW_IMAGE, struct.pack(">I", 2 if fmt == "PNG" else 1) + raw
    if event == BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA:
        try:
            image_data, metadata = data
        except (TypeError, ValueError):
            raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {_PACK!r}: expected "
                                  "((format, PIL.Image, max_size), metadata)") from None
        fmt, raw = _image_bytes(event, image_data)
        metadata = dict(_json_data(event, metadata or {}))
        metadata["image_type"] = "image/png" if fmt == "PNG" else "image/jpeg"
        meta = json.dumps(metadata).encode()
        return event, struct.pack(">I", len(meta)) + meta + raw
    if isinstance(data, (bytes, bytearray, memoryview)):
        return event, bytes(data)
    return event, _json_data(event, data)


def _sid(sid):
    if sid is not None and not isinstance(sid, str):
        raise UnsendableEvent(f"PromptServer.send_sync in pack {_PACK!r}: sid must be a str or None")
    return sid


# --- routes ---

class RouteDef:
    __slots__ = ("method", "path", "handler", "kwargs")

    def __init__(self, method, path, handler, kwargs=None):
        self.method, self.path, self.handler, self.kwargs = method, path, handler, kwargs or {}

    def __repr__(self):
        return f"<RouteDef {self.method} {self.path} -> {getattr(self.handler, '__qualname__', self.handler)}>"


class StaticDef:
    __slots__ = ("prefix", "path", "kwargs")

    def __init__(self, prefix, path, kwargs=None):
        self.prefix, self.path, self.kwargs = prefix, path, kwargs or {}


class RouteTableDef:
    """aiohttp's RouteTableDef as packs use it: decorators that record."""

    def __init__(self):
        self._items = []

    def route(self, method, path, **kwargs):
        def register(handler):
            self._items.append(RouteDef(method.upper(), path, handler, kwargs))
            return handler
        return register

    def get(self, path, **kwargs):
        return self.route("GET", path, **kwargs)

    def head(self, path, **kwargs):
        return self.route("HEAD", path, **kwargs)

    def post(self, path, **kwargs):
        return self.route("POST", path, **kwargs)

    def put(self, path, **kwargs):
        return self.route("PUT", path, **kwargs)

    def patch(self, path, **kwargs):
        return self.route("PATCH", path, **kwargs)

    def delete(self, path, **kwargs):
        return self.route("DELETE", path, **kwargs)

    def view(self, path, **kwargs):
        return self.route("*", path, **kwargs)

    def static(self, prefix, path, **kwargs):
        self._items.append(StaticDef(prefix, os.fspath(path), kwargs))

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __getitem__(self, i):
        return self._items[i]


class _Router:
    def __init__(self, added):
        self._added = added

    def add_route(self, method, path, handler, **kwargs):
        self._added.append(RouteDef(method.upper(), path, handler, kwargs))

    def add_get(self, path, handler, **kwargs):
        self.add_route("GET", path, handler, **kwargs)

    def add_post(self, path, handler, **kwargs):
        self.add_route("POST", path, handler, **kwargs)

    def add_put(self, path, handler, **kwargs):
        self.add_route("PUT", path, handler, **kwargs)

    def add_patch(self, path, handler, **kwargs):
        self.add_route("PATCH", path, handler, **kwargs)

    def add_delete(self, path, handler, **kwargs):
        self.add_route("DELETE", path, handler, **kwargs)

    def add_static(self, prefix, path, **kwargs):
        self._added.append(StaticDef(prefix, os.fspath(path), kwargs))


class _App:
    """The part of the aiohttp Application packs touch at import."""

    def __init__(self):
        self.added = []
        self.router = _Router(self.added)
        self.middlewares = []  # kept, not isolated: a worker's middleware cannot wrap host routes

    def add_routes(self, routes):
        for r in routes:
            self.added.append(r)


def _route_entry(r):
    """A RouteDef/StaticDef (ours or aiohttp's), a (method, path, handler)
    tuple or a {"method", "path", "handler"} dict -> ours, or None."""
    if isinstance(r, (RouteDef, StaticDef)):
        return r
    if isinstance(r, dict):
        if "prefix" in r:
            return StaticDef(r["prefix"], os.fspath(r["path"]))
        return RouteDef(str(r.get("method", "GET")).upper(), r.get("path"), r.get("handler"))
    if isinstance(r, (tuple, list)) and len(r) == 3:
        return RouteDef(str(r[0]).upper(), r[1], r[2])
    if hasattr(r, "handler") and hasattr(r, "method") and hasattr(r, "path"):
        return RouteDef(str(r.method).upper(), r.path, r.handler, dict(getattr(r, "kwargs", {}) or {}))
    if hasattr(r, "prefix") and hasattr(r, "path"):
        return StaticDef(r.prefix, os.fspath(r.path))
    return None


def collect_routes(modules=()):
    """Every route registered so far, in a stable order: the table, then
    app.add_routes / app.router, then each module's ROUTES list.  Returns
    (entries, problems)."""
    srv = PromptServer.instance
    raw = list(srv.routes) + list(srv.app.added)
    for mod in modules:
        raw.extend(getattr(mod, "ROUTES", None) or ())
    out, problems = [], []
    for r in raw:
        e = _route_entry(r)
        if e is None or (isinstance(e, RouteDef) and not (isinstance(e.path, str) and callable(e.handler))):
            problems.append(f"route {r!r} left out: not a route (method, path, handler) bulkhead can serve")
            continue
        out.append(e)
    if srv.app.middlewares:
        problems.append(f"{len(srv.app.middlewares)} aiohttp middleware(s) left out: a worker's "
                        "middleware cannot wrap the host's routes")
    return out, problems


def describe_routes(entries):
    """The routes as the host installs them (JSON-able)."""
    out = []
    for e in entries:
        if isinstance(e, StaticDef):
            out.append({"static": True, "prefix": e.prefix, "path": e.path})
        else:
            out.append({"method": e.method, "path": e.path,
                        "name": getattr(e.handler, "__qualname__", None)})
    return out


class _MultiDict:
    """The read side of multidict's MultiDict (case-insensitive keys when ci)."""

    def __init__(self, pairs=(), ci=False):
        self._ci = ci
        self._pairs = [(str(k), v) for k, v in pairs]

    def _k(self, k):
        return k.lower() if self._ci else k

    def getall(self, key, default=None):
        key = self._k(key)
        vals = [v for k, v in self._pairs if self._k(k) == key]
        if not vals and default is None:
            raise KeyError(key)
        return vals or default

    def getone(self, key, default=KeyError):
        key = self._k(key)
        for k, v in self._pairs:
            if self._k(k) == key:
                return v
        if default is KeyError:
            raise KeyError(key)
        return default

    def get(self, key, default=None):
        return self.getone(key, default)

    def __getitem__(self, key):
        return self.getone(key)

    def __contains__(self, key):
        return self.getone(key, None) is not None

    def __iter__(self):
        return iter(k for k, _ in self._pairs)

    def __len__(self):
        return len(self._pairs)

    def keys(self):
        return [k for k, _ in self._pairs]

    def values(self):
        return [v for _, v in self._pairs]

    def items(self):
        return list(self._pairs)

    def __repr__(self):
        return f"<MultiDict {self._pairs!r}>"


class FileField:
    """A file part of a multipart form (aiohttp's FileField)."""

    def __init__(self, name, filename, data, content_type, headers):
        self.name, self.filename, self.content_type, self.headers = name, filename, content_type, headers
        self.file = io.BytesIO(data)


class _URL:
    def __init__(self, path, query, path_qs):
        self.path, self.query, self.path_qs = path, query, path_qs
        self.raw_path = path

    def __str__(self):
        return self.path_qs


class Request:
    """What a route handler gets: the host request as data."""

    def __init__(self, d):
        self.method = d["method"]
        self.path = d["path"]
        self.path_qs = d.get("path_qs", self.path)
        self.query = _MultiDict(d.get("query") or ())
        self.rel_url = _URL(self.path, self.query, self.path_qs)
        self.url = self.rel_url
        self.headers = _MultiDict(d.get("headers") or (), ci=True)
        self.match_info = dict(d.get("match_info") or {})
        self.remote = d.get("remote")
        self._body = d.get("body") or b""
        self.content_type = (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip()
        self.app = PromptServer.instance.app

    @property
    def can_read_body(self):
        return bool(self._body)

    body_exists = can_read_body

    async def read(self):
        return self._body

    async def text(self):
        return self._body.decode("utf-8", "replace")

    async def json(self, *, loads=json.loads):
        return loads(self._body.decode("utf-8"))

    async def post(self):
        if self.content_type == "application/x-www-form-urlencoded":
            from urllib.parse import parse_qsl
            return _MultiDict(parse_qsl(self._body.decode("utf-8"), keep_blank_values=True))
        if self.content_type.startswith("multipart/"):
            import email.parser
            import email.policy
            head = f"Content-Type: {self.headers.get('Content-Type')}\r\n\r\n".encode()
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + self._body)
            pairs = []
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                filename = part.get_filename()
                data = part.get_payload(decode=True) or b""
                if filename is not None:
                    pairs.append((name, FileField(name, filename, data, part.get_content_type(),
                                                  dict(part.items()))))
                else:
                    pairs.append((name, data.decode(part.get_content_charset() or "utf-8", "replace")))
            return _MultiDict(pairs)
        return _MultiDict()


def _response(res, where):
    """A handler's answer (aiohttp's Response, json_response, FileResponse,
    an HTTPException) as data for the host."""
    path = getattr(res, "_path", None)
    status = getattr(res, "status", None)
    if not isinstance(status, int):
        raise TypeError(f"{where} returned a {type(res).__module__}.{type(res).__qualname__}, not an "
                        "aiohttp Response")
    headers = [(str(k), str(v)) for k, v in getattr(res, "headers", {}).items()
               if str(k).lower() not in ("content-type", "content-length")]
    out = {"status": status, "headers": headers, "content_type": getattr(res, "content_type", None),
           "charset": getattr(res, "charset", None), "body": b"", "file": None}
    if path is not None and type(res).__name__ == "FileResponse":
        out["file"] = os.fspath(path)
        return out
    body = getattr(res, "body", None)
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = getattr(body, "_value", None)  # an aiohttp Payload over bytes
        if not isinstance(body, (bytes, bytearray)):
            raise TypeError(f"{where} returned a streaming body ({type(res.body).__name__}); an isolated "
                            "route answers with bytes, text, JSON or a file")
    out["body"] = bytes(body or b"")
    return out


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


def _entries():
    from . import nodes
    mod = nodes._load()
    return collect_routes(nodes.route_modules(mod))[0]


def handle_route(index, method, path, request, timeout_s):
    """Serves route #index (method, path as described) for the host."""
    entries = _entries()
    e = entries[index] if 0 <= index < len(entries) else None
    if not isinstance(e, RouteDef) or e.path != path or e.method not in (method, "*"):
        raise LookupError(f"pack {_PACK!r} no longer has the route {method} {path} (its sources "
                          "changed since the host read them? restart ComfyUI)")
    where = f"route {method} {path} of pack {_PACK!r}"
    req = Request(request)
    try:
        res = _run_on_loop(lambda: e.handler(req), timeout_s, where)
    except RouteTimeout:
        raise
    except Exception as exc:
        if isinstance(getattr(exc, "status", None), int) and hasattr(exc, "headers"):
            res = exc  # aiohttp's HTTPException: a response raised
        else:
            raise
    return _response(res, where)


def on_prompt(json_data, timeout_s):
    """Runs the pack's prompt handlers in order, as upstream's
    trigger_on_prompt does (a failing one is reported and skipped).
    Refused while the pack is not imported in this worker (a worker just
    restarted): its handlers are not registered yet, and an empty answer
    would skip them silently."""
    nodes = sys.modules.get("bulkhead.worker.nodes")
    if nodes is None or getattr(nodes, "_nodes_module", None) is None:
        raise RuntimeError(f"pack {_PACK!r} is not imported in this worker yet: its prompt handlers are "
                           "not registered")
    handlers = list(PromptServer.instance.on_prompt_handlers)

    def run_all():
        data = json_data
        for h in handlers:
            try:
                data = h(data)
            except Exception as e:
                import traceback
                print(f"bulkhead: pack {_PACK!r}: on_prompt handler {h!r} failed: {e!r}\n"
                      + traceback.format_exc(), file=sys.stderr)
        return data
    out = _run_on_loop(run_all, timeout_s, f"the prompt handlers of pack {_PACK!r}")
    return _json_data("on_prompt", out)


# --- the server ---

class PromptServer:
    """``PromptServer.instance`` inside a worker (see the module doc)."""

    instance = None

    def __init__(self):
        PromptServer.instance = self
        self.routes = RouteTableDef()
        self.app = _App()
        self.on_prompt_handlers = []
        self._state = {"client_id": None, "last_node_id": None, "last_prompt_id": None}

    def _read(self, name):
        if threading.current_thread() is threading.main_thread() and _worker._peer is not None:
            try:
                self._state.update(_forward("state") or {})
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
        _forward("send_sync", event, data, _sid(sid))

    async def send(self, event, data, sid=None):
        self.send_sync(event, data, sid)

    async def send_json(self, event, data, sid=None):
        _forward("send_sync", event, _json_data(event, data), _sid(sid))

    async def send_bytes(self, event, data, sid=None):
        self.send_sync(event, bytes(data), sid)

    async def send_image(self, image_data, sid=None):
        self.send_sync(BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, image_data, sid)

    async def send_image_with_metadata(self, image_data, metadata=None, sid=None):
        self.send_sync(BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA, (image_data, metadata), sid)

    def send_progress_text(self, text, node_id, sid=None):
        if isinstance(text, str):
            text = text.encode("utf-8")
        node = str(node_id).encode("utf-8")
        self.send_sync(BinaryEventTypes.TEXT, struct.pack(">I", len(node)) + node + bytes(text), sid)

    def add_on_prompt_handler(self, handler):
        self.on_prompt_handlers.append(handler)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"PromptServer.instance.{name} is not available to pack {_PACK!r} in its bulkhead worker: "
            "there it has routes, app.add_routes, send_sync/send/send_json/send_bytes/send_image, "
            "send_progress_text, client_id, last_node_id, last_prompt_id and add_on_prompt_handler")


PromptServer()
