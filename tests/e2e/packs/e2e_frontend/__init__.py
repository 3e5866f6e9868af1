"""A stand-in for ComfyUI's frontend, for the panel test: GET /e2e/panel
is a page that imports bulkhead's sidebar panel from /extensions/bulkhead/
and renders its tab; /scripts/app.js and /scripts/api.js are the two
frontend modules the panel imports, reduced to what it uses.  Served by
whichever server loads this pack (tests/comfyui or a real checkout, whose
own frontend package may be absent)."""
import os

from aiohttp import web
from server import PromptServer

HERE = os.path.dirname(os.path.abspath(__file__))
routes = PromptServer.instance.routes


def _file(name, content_type):
    async def handler(request):
        with open(os.path.join(HERE, name)) as f:
            return web.Response(text=f.read(), content_type=content_type)
    return handler


routes.get("/e2e/panel")(_file("page.html", "text/html"))
routes.get("/scripts/app.js")(_file("app.js", "text/javascript"))
routes.get("/scripts/api.js")(_file("api.js", "text/javascript"))

NODE_CLASS_MAPPINGS = {}
