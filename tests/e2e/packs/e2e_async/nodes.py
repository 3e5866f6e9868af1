"""Nodes of the e2e async pack: async nodes (V1 and V3) that sleep and say
when they ran, and nodes that say which grad mode their code runs under
(sync and async), and what a tensor's grad flags are when they reach
the next node.  The same file runs isolated and in ComfyUI's own process
(tests/e2e/test_async_nodes.py)."""
import asyncio
import os
import time

import torch
from comfy_api.latest import io


async def _sleep(seconds):
    """(start, end) of a sleep on the event loop that stops when ComfyUI's
    interrupt flag is set."""
    import comfy.model_management as mm
    start = time.time()
    while time.time() < start + seconds:
        if mm.processing_interrupted():
            raise mm.InterruptProcessingException()
        await asyncio.sleep(0.02)
    return start, time.time()


class AsyncSleep:
    """Sleeps `seconds` on the event loop (an async FUNCTION), stopping
    when ComfyUI's interrupt flag is set; its ui says when it started and
    ended."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 600.0}),
                             "tag": ("STRING", {"default": "a"})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "sleep"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    async def sleep(self, seconds, tag):
        start, end = await _sleep(seconds)
        return {"ui": {"start": [start], "end": [end], "tag": [tag], "pid": [os.getpid()]}, "result": (end - start,)}


class V3AsyncSleep(io.ComfyNode):
    """AsyncSleep as a V3 node (an async execute)."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="E2EV3AsyncSleep", category="bulkhead e2e", is_output_node=True,
                         inputs=[io.Float.Input("seconds", default=1.0, min=0.0, max=600.0),
                                 io.String.Input("tag", default="a")],
                         outputs=[io.Float.Output()])

    @classmethod
    async def execute(cls, seconds, tag):
        start, end = await _sleep(seconds)
        return io.NodeOutput(end - start, ui={"start": [start], "end": [end], "tag": [tag], "pid": [os.getpid()]})


def _grad_mode():
    return {"inference_mode": [torch.is_inference_mode_enabled()], "grad": [torch.is_grad_enabled()]}


class GradMode:
    """Says whether its code runs under torch.inference_mode() and with
    autograd on."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tag": ("STRING", {"default": "a"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "probe"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def probe(self, tag):
        return {"ui": _grad_mode(), "result": (tag,)}


class AsyncGradMode(GradMode):
    """GradMode's answer from an async FUNCTION, after an await."""

    async def probe(self, tag):
        await asyncio.sleep(0.01)
        return {"ui": _grad_mode(), "result": (tag,)}


class GradLeaf:
    """Tensors made outside the executor's inference mode, as a pack's
    optimisation or training code makes them: a leaf that requires grad
    (under torch.inference_mode(False) and torch.enable_grad()), a plain
    tensor made there too, a torch.nn.Parameter, and one made under the
    executor's own mode (an inference tensor).  The node that gets them sees those flags
    in-process."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tag": ("STRING", {"default": "a"})}}

    RETURN_TYPES = ("IMAGE", "IMAGE", "IMAGE", "IMAGE")
    RETURN_NAMES = ("leaf", "plain", "inference", "parameter")
    FUNCTION = "make"
    CATEGORY = "bulkhead e2e"

    def make(self, tag):
        with torch.inference_mode(False), torch.enable_grad():
            leaf = torch.linspace(0, 1, 12).reshape(1, 2, 2, 3).requires_grad_()
            plain = torch.full((1, 2, 2, 3), 0.25)
            parameter = torch.nn.Parameter(torch.full((1, 2, 2, 3), 0.5))
        return (leaf, plain, torch.zeros(1, 2, 2, 3), parameter)


class GradSee:
    """What a node gets of a tensor's flags: requires_grad, whether it is
    an inference tensor (one that autograd, and an in-place change outside
    inference mode, refuse), its class (a Parameter); passes the tensor
    on."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "see"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def see(self, image):
        return {"ui": {"requires_grad": [image.requires_grad], "inference": [image.is_inference()],
                       "class": [type(image).__name__]}, "result": (image,)}


NODE_CLASS_MAPPINGS = {"E2EAsyncSleep": AsyncSleep, "E2EV3AsyncSleep": V3AsyncSleep, "E2EGradMode": GradMode,
                       "E2EAsyncGradMode": AsyncGradMode, "E2EGradLeaf": GradLeaf, "E2EGradSee": GradSee}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EAsyncSleep": "Async sleep (e2e)", "E2EV3AsyncSleep": "Async V3 sleep (e2e)",
                              "E2EGradMode": "Grad mode (e2e)", "E2EAsyncGradMode": "Async grad mode (e2e)"}
