"""A skeleton of ComfyUI's top-level `server` module (tests only): the
`PromptServer` whose routes custom node packages extend while they load.

What bulkhead relies on, as upstream has it: `PromptServer.instance` is
set by the constructor (custom nodes are imported after it, so they find
it); `.routes` is an aiohttp `RouteTableDef` packs add to; `.app` is the
aiohttp application, whose middleware list can still grow until the
server starts; `add_routes()` (called after custom nodes loaded) serves
every route in the table twice, as is and under `/api`, plus each
extension's web directory under `/extensions/<name>/`; `POST /free` only
sets the prompt worker's flags (`unload_models`, `free_memory`) on the
queue and answers an empty 200 at once -- the prompt worker (main.py)
acts on them later.  `send_sync` records what it would send (bytes as
bytes, an unencoded preview as the tuple); `send`, `send_json`,
`send_bytes`, `encode_bytes`, `send_progress_text` and `BinaryEventTypes`
(upstream's protocol.py, which server.py imports) behave as upstream's;
`trigger_on_prompt` runs the `add_on_prompt_handler` handlers in order,
skipping one that raises.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import json
import struct

from aiohttp import web

import execution
import nodes


class BinaryEventTypes:
    PREVIEW_IMAGE = 1
    UNENCODED_PREVIEW_IMAGE = 2
    TEXT = 3
    PREVIEW_IMAGE_WITH_METADATA = 4


class PromptServer:
    instance = None

    def __init__(self, loop=None):
        PromptServer.instance = self
        self.loop = loop
        self.prompt_queue = execution.PromptQueue(self)
        self.routes = web.RouteTableDef()
        self.app = web.Application(middlewares=[])
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.number = 0
        self.on_prompt_handlers = []
        self.sent = []   # (event, data, sid) in order: the tests read what went out

        routes = self.routes

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

        @routes.post("/prompt")
        async def post_prompt(request):
            body = await request.json()
            prompt = self.trigger_on_prompt(body).get("prompt", {})
            number = self.number
            self.number += 1
            prompt_id = body.get("prompt_id") or f"prompt-{number}"
            outputs = list(prompt)
            self.prompt_queue.put((number, prompt_id, prompt, {"client_id": body.get("client_id")},
                                   outputs))
            return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": {}})

    def add_routes(self):
        api = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        self.app.add_routes(api)
        self.app.add_routes(self.routes)
        for name, path in nodes.EXTENSION_WEB_DIRS.items():
            self.app.add_routes([web.static("/extensions/" + name, path)])

    def queue_updated(self):
        self.send_sync("status", {"exec_info": {"queue_remaining": self.prompt_queue.get_tasks_remaining()}})

    def send_sync(self, event, data, sid=None):
        if isinstance(data, (bytes, bytearray)):
            self.sent.append((event, bytes(data), sid))
        elif event in (BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, BinaryEventTypes.PREVIEW_IMAGE_WITH_METADATA):
            self.sent.append((event, data, sid))
        else:
            self.sent.append((event, json.loads(json.dumps(data, default=str)), sid))

    async def send(self, event, data, sid=None):
        if isinstance(data, (bytes, bytearray)):
            await self.send_bytes(event, data, sid)
        else:
            await self.send_json(event, data, sid)

    async def send_json(self, event, data, sid=None):
        self.send_sync(event, data, sid)

    async def send_bytes(self, event, data, sid=None):
        self.send_sync(event, bytes(data), sid)

    def encode_bytes(self, event, data):
        if not isinstance(event, int):
            raise RuntimeError(f"Binary event types must be integers, got {event}")
        return struct.pack(">I", event) + bytes(data)

    def send_progress_text(self, text, node_id, sid=None):
        if isinstance(text, str):
            text = text.encode("utf-8")
        node = str(node_id).encode("utf-8")
        self.send_sync(BinaryEventTypes.TEXT, struct.pack(">I", len(node)) + node + text, sid)

    def add_on_prompt_handler(self, handler):
        self.on_prompt_handlers.append(handler)

    def trigger_on_prompt(self, json_data):
        for handler in self.on_prompt_handlers:
            try:
                json_data = handler(json_data)
            except Exception:
                pass
        return json_data
