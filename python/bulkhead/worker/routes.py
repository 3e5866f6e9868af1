"""What a pack's ``server.PromptServer`` route registration looks like in a
worker (worker/server.py's ``routes``, ``app``): aiohttp's RouteTableDef,
Application and Request as packs use them, recording routes instead of
serving them.  The host serves them (host/serverproxy.py); a request
arrives as data (channel/events.py) and a handler gets a ``Request``.
"""

import io
import json
import os

from ..channel.events import decode_request


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


class App:
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


def collect_routes(table, app, modules=()):
    """Every route registered so far, in a stable order: the table, then
    app.add_routes / app.router, then each module's ROUTES list.  Returns
    (entries, problems)."""
    raw = list(table) + list(app.added)
    for mod in modules:
        raw.extend(getattr(mod, "ROUTES", None) or ())
    out, problems = [], []
    for r in raw:
        e = _route_entry(r)
        if e is None or (isinstance(e, RouteDef) and not (isinstance(e.path, str) and callable(e.handler))):
            problems.append(f"route {r!r} left out: not a route (method, path, handler) bulkhead can serve")
            continue
        out.append(e)
    if app.middlewares:
        problems.append(f"{len(app.middlewares)} aiohttp middleware(s) left out: a worker's "
                        "middleware cannot wrap the host's routes")
    return out, problems


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

    def __init__(self, d, app):
        self.method, self.path, self.path_qs, query, headers, self.match_info, self.remote, self._body = \
            decode_request(d)
        self.query = _MultiDict(query)
        self.rel_url = _URL(self.path, self.query, self.path_qs)
        self.url = self.rel_url
        self.headers = _MultiDict(headers, ci=True)
        self.content_type = (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip()
        self.app = app

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
            from urllib.parse import parse_qsl  # lazy: worker start
            return _MultiDict(parse_qsl(self._body.decode("utf-8"), keep_blank_values=True))
        if self.content_type.startswith("multipart/"):
            import email.parser  # lazy: worker start
            import email.policy  # lazy: worker start
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
