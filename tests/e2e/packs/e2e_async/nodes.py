"""Nodes of the e2e async pack: an async node that sleeps and says when it
ran, and nodes that say which grad mode their code runs under (sync and
async).  The same file runs isolated and in ComfyUI's own process
(tests/e2e/test_async_nodes.py)."""
import asyncio
import os
import time

import torch


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
        import comfy.model_management as mm
        start = time.time()
        while time.time() < start + seconds:
            if mm.processing_interrupted():
                raise mm.InterruptProcessingException()
            await asyncio.sleep(0.02)
        end = time.time()
        return {"ui": {"start": [start], "end": [end], "tag": [tag], "pid": [os.getpid()]}, "result": (end - start,)}


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


NODE_CLASS_MAPPINGS = {"E2EAsyncSleep": AsyncSleep, "E2EGradMode": GradMode, "E2EAsyncGradMode": AsyncGradMode}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EAsyncSleep": "Async sleep (e2e)", "E2EGradMode": "Grad mode (e2e)",
                              "E2EAsyncGradMode": "Async grad mode (e2e)"}
