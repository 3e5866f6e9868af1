"""What a buggy pack does to ComfyUI's server: a route that raises, one
that never answers, a send_sync of something JSON cannot carry, a V3
schema holding an object that cannot leave the worker; and the nodes that
show the worker still serves (a plain node, a long one)."""
import asyncio
import os
import time

from aiohttp import web

from comfy_api.latest import io
from server import PromptServer

srv = PromptServer.instance


@srv.routes.get("/e2e_bad/hello")
async def hello(request):
    return web.json_response({"pid": os.getpid()})


@srv.routes.get("/e2e_bad/raise")
async def boom(request):
    raise ValueError("route exploded")


@srv.routes.get("/e2e_bad/hang")
async def hang(request):
    await asyncio.sleep(3600)


class Opaque:
    """Not a value the schema's codec carries."""


class Unsendable(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EBadUnsendable", category="e2e/bad",
                         inputs=[io.Custom("OPAQUE").Input("n", extra_dict={"thing": Opaque()})],
                         outputs=[io.Int.Output()])

    @classmethod
    def execute(cls, n):
        return io.NodeOutput(n)


class Talk(io.ComfyNode):
    """send_sync with a payload JSON cannot carry."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EBadTalk", category="e2e/bad", is_output_node=True, inputs=[], outputs=[])

    @classmethod
    def execute(cls):
        PromptServer.instance.send_sync("e2e_bad.talk", {"obj": Opaque()}, PromptServer.instance.client_id)
        return io.NodeOutput(ui={"sent": [True]})


class Pid(io.ComfyNode):
    """The worker's pid, after a sleep."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EBadPid", category="e2e/bad", is_output_node=True,
                         inputs=[io.Float.Input("seconds", default=0.0)], outputs=[])

    @classmethod
    def execute(cls, seconds):
        time.sleep(seconds)
        return io.NodeOutput(ui={"pid": [os.getpid()]})


NODE_CLASS_MAPPINGS = {n.define_schema().node_id: n for n in (Unsendable, Talk, Pid)}
