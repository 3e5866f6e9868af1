"""A skeleton of ComfyUI's top-level `server` module (tests only): the
`PromptServer` whose routes custom node packages extend while they load,
and that main.py serves.

What bulkhead relies on, as upstream has it: `PromptServer.instance` is
set by the constructor (custom nodes are imported after it, so they find
it); `.routes` is an aiohttp `RouteTableDef` packs add to; `.app` is the
aiohttp application, whose middleware list can still grow until the
server starts; `add_routes()` (called after custom nodes loaded) serves
every route in the table twice, as is and under `/api`, plus each
extension's web directory under `/extensions/<name>/`; `POST /free` only
sets the prompt worker's flags (`unload_models`, `free_memory`) on the
queue and answers an empty 200 at once -- the prompt worker (main.py)
acts on them later.

The routes, with upstream's request and answer shapes: GET /ws (the
websocket: `status` with the client's `sid` on connect, then every
message the executor and the progress hook send, as JSON
{"type", "data"}; to the prompt's client, or to all when no client is
named), GET /object_info and /object_info/{node_class} (upstream's
node_info fields), GET /prompt (queue info), POST /prompt (validated by
execution.validate_prompt on the event loop, then queued; 400 with
`error` and `node_errors` when invalid), GET/POST /queue, GET/POST
/history, GET /history/{prompt_id}, POST /interrupt (global, or only when
the named prompt runs), POST /free, GET /system_stats (a small subset).
Not here: the frontend (no GET /), binary preview frames, /upload, /view,
/models, the user and model managers, internal routes.

`send_sync` may be called from any thread: it records what it sends in
`.sent` (the tests read it) and, once the server runs (`loop` given),
hands it to the event loop, whose `publish_loop` sends it.

`send_sync` records what it sends (bytes as bytes, an unencoded preview
as the tuple); `send`, `send_json`, `send_bytes`, `encode_bytes`,
`send_progress_text` and `BinaryEventTypes` (upstream's protocol.py, which
server.py imports) behave as upstream's; `trigger_on_prompt` runs the
`add_on_prompt_handler` handlers in order, skipping one that raises.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import asyncio
import json
import logging
import os
import struct
import sys
import uuid

import aiohttp
from aiohttp import web

import execution
import nodes


def _is_v3(cls):
    try:
        from comfy_api.internal import _ComfyNodeInternal
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, _ComfyNodeInternal)


class BinaryEventTypes:
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3
    PREVIEW_IMAGE_WITH_METADATA = 4


def _node_info(name):
    cls = nodes.NODE_CLASS_MAPPINGS[name]
    if _is_v3(cls):
        return cls.GET_NODE_INFO_V1()   # V3: the schema's V1 info, as upstream
    types = cls.INPUT_TYPES()
    info = {
        "input": types,
        "input_order": {section: list(value) for section, value in types.items()},
        "output": cls.RETURN_TYPES,
        "output_is_list": getattr(cls, "OUTPUT_IS_LIST", [False] * len(cls.RETURN_TYPES)),
        "output_name": getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES),
        "name": name,
        "display_name": nodes.NODE_DISPLAY_NAME_MAPPINGS.get(name, name),
        "description": getattr(cls, "DESCRIPTION", ""),
        "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", "nodes"),
        "category": getattr(cls, "CATEGORY", "sd"),
        "output_node": getattr(cls, "OUTPUT_NODE", False) is True,
    }
    if hasattr(cls, "OUTPUT_TOOLTIPS"):
        info["output_tooltips"] = cls.OUTPUT_TOOLTIPS
    if getattr(cls, "DEPRECATED", False):
        info["deprecated"] = True
    if getattr(cls, "EXPERIMENTAL", False):
        info["experimental"] = True
    if hasattr(cls, "API_NODE"):
        info["api_node"] = cls.API_NODE
    return info


class PromptServer:
    instance = None

    def __init__(self, loop=None):
        PromptServer.instance = self
        self.loop = loop
        self.messages = asyncio.Queue() if loop is not None else None
        self.prompt_queue = execution.PromptQueue(self)
        self.routes = web.RouteTableDef()
        self.app = web.Application(middlewares=[], client_max_size=100 * 1024 * 1024)
        self.sockets = {}
        self.sockets_metadata = {}
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.number = 0
        self.on_prompt_handlers = []
        self.sent = []   # (event, data, sid) in order: the tests read what went out

        routes = self.routes

        @routes.get("/ws")
        async def websocket_handler(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            sid = request.rel_url.query.get("clientId", "")
            if sid:
                self.sockets.pop(sid, None)   # a reconnect replaces the old socket
            else:
                sid = uuid.uuid4().hex
            self.sockets[sid] = ws
            self.sockets_metadata[sid] = {"feature_flags": {}}
            try:
                await self.send("status", {"status": self.get_queue_info(), "sid": sid}, sid)
                if self.client_id == sid and self.last_node_id is not None:
                    await self.send("executing", {"node": self.last_node_id}, sid)
                first = True
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        try:
                            data = json.loads(msg.data)
                        except ValueError:
                            logging.warning(f"Invalid JSON received from client {sid}: {msg.data}")
                            continue
                        if first and isinstance(data, dict) and data.get("type") == "feature_flags":
                            self.sockets_metadata[sid]["feature_flags"] = data.get("data", {})
                            await self.send("feature_flags", {"supports_preview_metadata": False}, sid)
                        first = False
                    elif msg.type == aiohttp.WSMsgType.ERROR:
                        logging.warning("ws connection closed with exception %s" % ws.exception())
            finally:
                self.sockets.pop(sid, None)
                self.sockets_metadata.pop(sid, None)
            return ws

        @routes.get("/object_info")
        async def get_object_info(request):
            out = {}
            for name in list(nodes.NODE_CLASS_MAPPINGS):
                try:
                    out[name] = _node_info(name)
                except Exception:
                    logging.exception(f"[ERROR] An error occurred while retrieving information for the "
                                      f"'{name}' node.")
            return web.json_response(out)

        @routes.get("/object_info/{node_class}")
        async def get_object_info_node(request):
            name = request.match_info.get("node_class")
            return web.json_response({name: _node_info(name)} if name in nodes.NODE_CLASS_MAPPINGS else {})

        @routes.get("/system_stats")
        async def system_stats(request):
            import comfy.model_management as mm
            return web.json_response({
                "system": {"os": os.name, "python_version": sys.version, "embedded_python": False,
                           "ram_total": mm.get_total_memory(mm.torch.device("cpu")),
                           "ram_free": mm.get_free_memory(mm.torch.device("cpu"))},
                "devices": []})

        @routes.get("/prompt")
        async def get_prompt(request):
            return web.json_response(self.get_queue_info())

        @routes.post("/prompt")
        async def post_prompt(request):
            body = self.trigger_on_prompt(await request.json())
            if "number" in body:
                number = float(body["number"])
            else:
                number = self.number
                if body.get("front"):
                    number = -number
                self.number += 1
            if "prompt" not in body:
                return web.json_response({"error": execution._error("no_prompt", "No prompt provided",
                                                                   "No prompt provided"),
                                          "node_errors": {}}, status=400)
            prompt = body["prompt"]
            prompt_id = str(body.get("prompt_id") or uuid.uuid4())
            valid = await execution.validate_prompt(prompt_id, prompt, body.get("partial_execution_targets"))
            extra_data = dict(body.get("extra_data") or {})
            if "client_id" in body:
                extra_data["client_id"] = body["client_id"]
            if not valid[0]:
                logging.warning("invalid prompt: {}".format(valid[1]))
                return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)
            self.prompt_queue.put((number, prompt_id, prompt, extra_data, valid[2]))
            return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": valid[3]})

        @routes.get("/queue")
        async def get_queue(request):
            running, pending = self.prompt_queue.get_current_queue_volatile()
            return web.json_response({"queue_running": running, "queue_pending": pending})

        @routes.post("/queue")
        async def post_queue(request):
            body = await request.json()
            if body.get("clear"):
                self.prompt_queue.wipe_queue()
            for prompt_id in body.get("delete", []):
                self.prompt_queue.delete_queue_item(lambda item, p=prompt_id: item[1] == p)
            return web.Response(status=200)

        @routes.get("/history")
        async def get_history(request):
            query = request.rel_url.query
            max_items = int(query["max_items"]) if "max_items" in query else None
            offset = int(query["offset"]) if "offset" in query else -1
            return web.json_response(self.prompt_queue.get_history(max_items=max_items, offset=offset))

        @routes.get("/history/{prompt_id}")
        async def get_history_prompt_id(request):
            return web.json_response(self.prompt_queue.get_history(prompt_id=request.match_info["prompt_id"]))

        @routes.post("/history")
        async def post_history(request):
            body = await request.json()
            if body.get("clear"):
                self.prompt_queue.wipe_history()
            for prompt_id in body.get("delete", []):
                self.prompt_queue.delete_history_item(prompt_id)
            return web.Response(status=200)

        @routes.post("/interrupt")
        async def post_interrupt(request):
            try:
                body = await request.json()
            except ValueError:
                body = {}
            prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
            if prompt_id:
                running, _ = self.prompt_queue.get_current_queue_volatile()
                if any(item[1] == prompt_id for item in running):
                    logging.info(f"Interrupting prompt {prompt_id}")
                    nodes.interrupt_processing()
                else:
                    logging.info(f"Prompt {prompt_id} is not currently running, skipping interrupt")
            else:
                logging.info("Global interrupt (no prompt_id specified)")
                nodes.interrupt_processing()
            return web.Response(status=200)

        @routes.post("/free")
        async def post_free(request):
            body = await request.json()
            unload_models = body.get("unload_models", False)
            free_memory = body.get("free_memory", False)
            if unload_models:
                self.prompt_queue.set_flag("unload_models", unload_models)
            if free_memory:
                self.prompt_queue.set_flag("free_memory", free_memory)
            return web.Response(status=200)

    def add_routes(self):
        api = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        self.app.add_routes(api)
        self.app.add_routes(self.routes)
        for name, path in nodes.EXTENSION_WEB_DIRS.items():
            self.app.add_routes([web.static("/extensions/" + name, path)])

    def get_queue_info(self):
        return {"exec_info": {"queue_remaining": self.prompt_queue.get_tasks_remaining()}}

    def queue_updated(self):
        self.send_sync("status", {"status": self.get_queue_info()})

    def _targets(self, sid):
        return list(self.sockets.values()) if sid is None else [self.sockets[sid]] if sid in self.sockets else []

    async def send(self, event, data, sid=None):
        if event == BinaryEventTypes.UNENCODED_PREVIEW_IMAGE:
            await self.send_image(data, sid=sid)
        elif isinstance(data, (bytes, bytearray)):
            await self.send_bytes(event, data, sid)
        else:
            await self.send_json(event, data, sid)

    async def send_image(self, image_data, sid=None):
        image_type, image, max_size = image_data
        import io
        from PIL import Image, ImageOps
        if max_size is not None:   # contained in max_size, enlarged too, as upstream
            image = ImageOps.contain(image, (max_size, max_size), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        image.save(buf, format=image_type, quality=95, compress_level=1)
        header = struct.pack(">I", {"JPEG": 1, "PNG": 2}.get(image_type, 1))
        await self.send_bytes(BinaryEventTypes.PREVIEW_IMAGE, header + buf.getvalue(), sid)

    async def send_json(self, event, data, sid=None):
        message = json.dumps({"type": event, "data": data}, default=str)
        for ws in self._targets(sid):
            try:
                await ws.send_str(message)
            except (aiohttp.ClientError, ConnectionError) as e:
                logging.warning("send error: {}".format(e))

    async def send_bytes(self, event, data, sid=None):
        message = self.encode_bytes(event, data)
        for ws in self._targets(sid):
            try:
                await ws.send_bytes(message)
            except (aiohttp.ClientError, ConnectionError) as e:
                logging.warning("send error: {}".format(e))

    def encode_bytes(self, event, data):
        if not isinstance(event, int):
            raise RuntimeError(f"Binary event types must be integers, got {event}")
        return struct.pack(">I", event) + bytes(data)

    def send_progress_text(self, text, node_id, sid=None):
        if isinstance(text, str):
            text = text.encode("utf-8")
        node = str(node_id).encode("utf-8")
        self.send_sync(BinaryEventTypes.TEXT, struct.pack(">I", len(node)) + node + text, sid)

    def send_sync(self, event, data, sid=None):
        if isinstance(data, (bytes, bytearray)):
            self.sent.append((event, bytes(data), sid))
        elif event in (BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA):
            self.sent.append((event, data, sid))
        else:
            self.sent.append((event, json.loads(json.dumps(data, default=str)), sid))
        del self.sent[:-1000]   # a long-running server keeps only the latest
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, (event, data, sid))

    async def publish_loop(self):
        while True:
            event, data, sid = await self.messages.get()
            await self.send(event, data, sid)

    async def start_multi_address(self, addresses, call_on_start=None, verbose=True):
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        for address, port in addresses:
            await web.TCPSite(runner, address, port).start()
            if verbose:
                logging.info("Starting server\n")
                logging.info(f"To see the GUI go to: http://{address}:{port}")
        if call_on_start is not None:
            call_on_start("http", addresses[0][0], addresses[0][1])

    def add_on_prompt_handler(self, handler):
        self.on_prompt_handlers.append(handler)

    def trigger_on_prompt(self, json_data):
        for handler in self.on_prompt_handlers:
            try:
                json_data = handler(json_data)
            except Exception:
                logging.warning("[ERROR] An error occurred during the on_prompt_handler processing",
                                exc_info=True)
        return json_data
