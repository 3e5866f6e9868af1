"""V3 nodes that use ComfyUI's server the ways packs do: routes registered
at import, `send_sync` from
the node and from the pack's own thread, progress text, progress-bar
previews, a file written to the output folder and shown through `ui`, an
async execute, hidden inputs, an expansion, validate / fingerprint / lazy,
a node that never checks the interrupt flag and a dropdown the pack lists
itself."""
import os
import threading
import time

from aiohttp import web
from PIL import Image

import comfy.utils
import folder_paths
from comfy_api.latest import io
from server import PromptServer

srv = PromptServer.instance


@srv.routes.get("/e2e_v3/hello/{name}")
async def hello(request):
    return web.json_response({"hello": request.match_info["name"], "q": request.query.get("q")})


@srv.routes.post("/e2e_v3/tick")
async def tick(request):
    """Starts the pack's own thread: it sends `n` events a moment after
    this answer, while no node runs."""
    n = (await request.json())["n"]

    def later():
        time.sleep(0.2)
        for i in range(n):
            PromptServer.instance.send_sync("e2e_v3.tick", {"i": i})
    threading.Thread(target=later, daemon=True).start()
    return web.json_response({"started": n}, status=202)


class Gen(io.ComfyNode):
    """A sampler-like node: a progress bar with a preview at every step."""

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="E2EV3Gen", display_name="E2E V3 Gen", category="e2e/v3", description="Makes an image.",
            inputs=[io.Int.Input("steps", default=3, min=1, max=8), io.Int.Input("size", default=16, min=4, max=64)],
            outputs=[io.Image.Output()], hidden=[io.Hidden.unique_id])

    @classmethod
    def execute(cls, steps, size):
        import torch
        bar = comfy.utils.ProgressBar(steps)
        for i in range(steps):
            shade = 40 * (i + 1)
            bar.update_absolute(i + 1, steps, ("JPEG", Image.new("RGB", (size, size), (shade, 0, 255 - shade)), 512))
        PromptServer.instance.send_sync("e2e_v3.node", {"node": cls.hidden.unique_id, "steps": steps},
                                        PromptServer.instance.client_id)
        PromptServer.instance.send_progress_text(f"made {size}x{size}", cls.hidden.unique_id)
        return io.NodeOutput(torch.full((1, size, size, 3), 0.5))


class Save(io.ComfyNode):
    """An output node: an async execute writing a PNG to the output folder,
    shown through its ui dict as SaveImage's is."""

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="E2EV3Save", category="e2e/v3", is_output_node=True,
            inputs=[io.Image.Input("images"), io.String.Input("prefix", default="e2e_v3")],
            outputs=[], hidden=[io.Hidden.unique_id, io.Hidden.prompt])

    @classmethod
    async def execute(cls, images, prefix):
        import numpy as np
        out = folder_paths.get_output_directory()
        name = f"{prefix}_{cls.hidden.unique_id}.png"
        pixels = (images[0].cpu().numpy() * 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(out, name))
        classes = sorted(n["class_type"] for n in (cls.hidden.prompt or {}).values())
        return io.NodeOutput(ui={"images": [{"filename": name, "subfolder": "", "type": "output"}],
                                 "classes": classes})


class Count(io.ComfyNode):
    """validate_inputs and fingerprint_inputs."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EV3Count", category="e2e/v3",
                         inputs=[io.Int.Input("n", default=2, min=0, max=100)], outputs=[io.Int.Output()])

    @classmethod
    def validate_inputs(cls, n):
        return True if n != 7 else "seven is not allowed"

    @classmethod
    def fingerprint_inputs(cls, n):
        return n

    @classmethod
    def execute(cls, n):
        return io.NodeOutput(n * 10)


class Pick(io.ComfyNode):
    """check_lazy_status: only the chosen input is computed."""

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="E2EV3Pick", category="e2e/v3",
            inputs=[io.Boolean.Input("first", default=True),
                    io.Int.Input("a", lazy=True, force_input=True), io.Int.Input("b", lazy=True, force_input=True)],
            outputs=[io.Int.Output()])

    @classmethod
    def check_lazy_status(cls, first, a=None, b=None):
        return ["a"] if first else ["b"]

    @classmethod
    def execute(cls, first, a=None, b=None):
        return io.NodeOutput(a if first else b)


class Twice(io.ComfyNode):
    """Expands into a Count node whose result it returns."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EV3Twice", category="e2e/v3", enable_expand=True,
                         inputs=[io.Int.Input("n", default=1)], outputs=[io.Int.Output()],
                         hidden=[io.Hidden.unique_id])

    @classmethod
    def execute(cls, n):
        me = cls.hidden.unique_id
        return io.NodeOutput([f"{me}.c", 0], expand={f"{me}.c": {"class_type": "E2EV3Count", "inputs": {"n": n * 2}}})


class Show(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EV3Show", category="e2e/v3", is_output_node=True,
                         inputs=[io.Int.Input("value", force_input=True)], outputs=[])

    @classmethod
    def execute(cls, value):
        return io.NodeOutput(ui={"value": [value]})


class Stubborn(io.ComfyNode):
    """Never checks the interrupt flag."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EV3Stubborn", category="e2e/v3", is_output_node=True,
                         inputs=[io.Float.Input("seconds", default=10.0)], outputs=[])

    @classmethod
    def execute(cls, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.01)
        return io.NodeOutput(ui={"ran": [seconds]})


class Listed(io.ComfyNode):
    """A dropdown of the files in the pack's `listed/` folder, built with
    os.listdir as packs do (not folder_paths): ComfyUI runs define_schema
    again each time the frontend asks for the node definitions."""

    @classmethod
    def define_schema(cls):
        d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "listed")
        return io.Schema(node_id="E2EV3Listed", category="e2e/v3", is_output_node=True,
                         inputs=[io.Combo.Input("name", options=sorted(os.listdir(d)) if os.path.isdir(d) else [])],
                         outputs=[])

    @classmethod
    def execute(cls, name):
        return io.NodeOutput(ui={"name": [name]})


NODE_CLASS_MAPPINGS = {n.define_schema().node_id: n for n in (Gen, Save, Count, Pick, Twice, Show, Stubborn, Listed)}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EV3Gen": "E2E V3 Gen"}
