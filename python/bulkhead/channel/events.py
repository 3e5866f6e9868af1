"""Both halves of the formats a pack's ``server.PromptServer`` uses between
a worker (worker/server.py) and the host (host/serverproxy.py): the
events it sends (``send_sync``: what crosses, a preview encoded as
upstream's websocket carries it), the operations the host serves for it,
the routes it describes, and a route's request and answer as data.

Events.  The worker encodes (``encode_event``): a str event with JSON data
(dict, list, str, number, bool, None) or bytes, or a binary event number
(``BinaryEventTypes``, upstream's protocol.py) with bytes; a preview
(UNENCODED_PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA: (format, PIL.Image,
max_size)) is encoded with the pack's PIL into the bytes of PREVIEW_IMAGE
(or of the metadata event), exactly what upstream's ``send_image`` puts on
the websocket.  The host passes what crosses to its own ``send_sync``
unchanged (``OP_SEND``); ``OP_STATE`` answers ``STATE_NAMES``.

Routes.  ``describe_routes`` (worker) lists them as the host installs
them: {"method", "path", "name"} or {"static": True, "prefix", "path"}.
A request crosses as ``encode_request`` makes it (host: from aiohttp's
request) and ``decode_request`` reads it (worker); an answer as
``encode_response`` makes it (worker: from aiohttp's Response,
json_response, FileResponse or a raised HTTPException) and
``decode_response`` turns it back into an aiohttp response (host).
"""

import io
import json
import os
import struct

from .spec import PACK_NAME

def pack_name():
    """In a worker: its pack, for messages (read when said: a zygote's
    child imported this module before it had a pack)."""
    return os.environ.get(PACK_NAME, "?")


OP_SEND = "send_sync"     # (event, data, sid): the host's PromptServer.send_sync
OP_STATE = "state"        # () -> {name: value} of STATE_NAMES
STATE_NAMES = ("client_id", "last_node_id", "last_prompt_id")


class BinaryEventTypes:
    """The websocket's binary event numbers, as upstream's protocol.py."""
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3
    PREVIEW_IMAGE_WITH_METADATA = 4


class UnsendableEvent(TypeError):
    """An event whose data cannot cross to the host's PromptServer."""


# --------------------------------------------------------------- events

def json_data(event, data):
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError, RecursionError) as e:
        raise UnsendableEvent(
            f"PromptServer.send_sync({event!r}, ...) in pack {pack_name()!r}: the data cannot be sent to "
            f"the host ({e}); an event's data must be JSON (dict, list, str, number, bool, None) or "
            "bytes, as ComfyUI's websocket sends it") from None


def _pil_image(event, image):
    save = getattr(image, "save", None)
    if save is None or not hasattr(image, "size"):
        raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {pack_name()!r}: a preview "
                              f"must be (format, PIL.Image, max_size), not a {type(image).__name__}")
    return image


def _contain(image, max_size):
    if max_size is None:
        return image
    from PIL import Image, ImageOps  # optional: PIL
    resampling = Image.Resampling.BILINEAR if hasattr(Image, "Resampling") else Image.LANCZOS
    return ImageOps.contain(image, (max_size, max_size), resampling)


def _image_bytes(event, image_data):
    """(format, image, max_size) -> (format, encoded bytes), as upstream's
    send_image encodes them."""
    try:
        fmt, image, max_size = image_data
    except (TypeError, ValueError):
        raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {pack_name()!r}: a preview "
                              "must be a (format, PIL.Image, max_size) tuple") from None
    image = _contain(_pil_image(event, image), max_size)
    out = io.BytesIO()
    image.save(out, format=fmt, quality=95, compress_level=1)
    return fmt, out.getvalue()


def encode_event(event, data):
    """What crosses for send_sync(event, data): (event, data) with a
    preview encoded and everything else JSON or bytes."""
    if not isinstance(event, (str, int)) or isinstance(event, bool):
        raise UnsendableEvent(f"PromptServer.send_sync in pack {pack_name()!r}: the event must be a str "
                              f"or a binary event number, not {type(event).__name__}")
    if event == BinaryEventTypes.UNENCODED_PREVIEW_IMAGE:
        fmt, raw = _image_bytes(event, data)
        return BinaryEventTypes.PREVIEW_IMAGE, struct.pack(">I", 2 if fmt == "PNG" else 1) + raw
    if event == BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA:
        try:
            image_data, metadata = data
        except (TypeError, ValueError):
            raise UnsendableEvent(f"PromptServer.send_sync({event!r}, ...) in pack {pack_name()!r}: expected "
                                  "((format, PIL.Image, max_size), metadata)") from None
        fmt, raw = _image_bytes(event, image_data)
        metadata = dict(json_data(event, metadata or {}))
        metadata["image_type"] = "image/png" if fmt == "PNG" else "image/jpeg"
        meta = json.dumps(metadata).encode()
        return event, struct.pack(">I", len(meta)) + meta + raw
    if isinstance(data, (bytes, bytearray, memoryview)):
        return event, bytes(data)
    return event, json_data(event, data)


def check_sid(sid):
    if sid is not None and not isinstance(sid, str):
        raise UnsendableEvent(f"PromptServer.send_sync in pack {pack_name()!r}: sid must be a str or None")
    return sid


def progress_text(text, node_id):
    """send_progress_text's bytes (BinaryEventTypes.TEXT), as upstream's."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    node = str(node_id).encode("utf-8")
    return struct.pack(">I", len(node)) + node + bytes(text)


# --------------------------------------------------------------- routes

def describe_routes(entries):
    """The routes as the host installs them (JSON-able)."""
    out = []
    for e in entries:
        if hasattr(e, "prefix"):   # worker/routes.py's StaticDef
            out.append({"static": True, "prefix": e.prefix, "path": e.path})
        else:
            out.append({"method": e.method, "path": e.path,
                        "name": getattr(e.handler, "__qualname__", None)})
    return out


def encode_request(request, body):
    """The host's aiohttp request (its body read) as data for the worker."""
    return {"method": request.method, "path": request.path, "path_qs": request.path_qs,
            "query": list(request.query.items()), "headers": list(request.headers.items()),
            "match_info": dict(request.match_info), "remote": request.remote, "body": body}


def decode_request(d):
    """encode_request's data as the worker's Request reads it:
    (method, path, path_qs, query pairs, header pairs, match_info, remote, body)."""
    path = d["path"]
    return (d["method"], path, d.get("path_qs", path), d.get("query") or (), d.get("headers") or (),
            dict(d.get("match_info") or {}), d.get("remote"), d.get("body") or b"")


def encode_response(res, where):
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


def decode_response(res, web):
    """encode_response's data as an aiohttp response (web: aiohttp.web)."""
    if res.get("file"):
        resp = web.FileResponse(res["file"], status=res["status"])
    else:
        resp = web.Response(status=res["status"], body=res.get("body") or b"",
                            content_type=res.get("content_type") or None,
                            charset=res.get("charset") or None)
    for k, v in res.get("headers") or ():
        resp.headers.add(k, v)
    return resp
