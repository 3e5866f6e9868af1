"""Nodes of the e2e pack (they run in the pack's worker)."""
import os
import sys
import time


class Echo:
    """An output node: its text in the history's ui, and the worker's pid."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "hi"}),
                             "times": ("INT", {"default": 1, "min": 1, "max": 8})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("text",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    DESCRIPTION = "Repeats a text in the pack's worker."
    OUTPUT_NODE = True

    @classmethod
    def VALIDATE_INPUTS(cls, text):
        return True if "\n" not in text else "one line only"

    def run(self, text, times, unique_id=None):
        out = text * times
        return {"ui": {"text": [out], "pid": [os.getpid()], "node": [unique_id]}, "result": (out,)}


class Steps:
    """Reports progress through ComfyUI's progress bar."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"steps": ("INT", {"default": 4, "min": 1, "max": 50})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, steps):
        import comfy.utils
        bar = comfy.utils.ProgressBar(steps)
        for _ in range(steps):
            time.sleep(0.12)   # past upstream's progress throttle
            bar.update(1)
        return (steps,)


class Spin:
    """Runs `seconds` unless interrupted (ComfyUI's interrupt flag)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 60.0})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, seconds):
        import comfy.model_management as mm
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            mm.throw_exception_if_processing_interrupted()
            time.sleep(0.005)
        return {"ui": {"ran_s": [time.monotonic() - t0]}, "result": (time.monotonic() - t0,)}


class Burn:
    """Computes `seconds` on one CPU inside its call, then returns."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 0.2})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    def run(self, seconds):
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < seconds:
            n += 1
        return {"ui": {"burned": [n > 0]}}


class HoldObjects:
    """Holds `count` small Python objects (a pack's large object graph: a
    tokenizer's vocabulary, an index) until its next call: a collection in
    the worker -- the full release ladder's -- walks every one of them."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"count": ("INT", {"default": 1000, "min": 0, "max": 4_000_000})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    held = []

    def run(self, count):
        HoldObjects.held = [[i] for i in range(count)]
        return {"ui": {"pid": [os.getpid()]}}


class HoldRam:
    """Loads a model of `mib` MiB in the worker through its comfy.model_management
    (tests/py/helpers/bh_mempack, found through BH_E2E_HELPERS)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "UNetE2E"}),
                             "mib": ("INT", {"default": 64, "min": 1, "max": 4096})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, name, mib):
        sys.path.insert(0, os.environ["BH_E2E_HELPERS"])
        import bh_mempack
        bh_mempack.load(name, mib << 20)
        return {"ui": {"pid": [os.getpid()], "resident": [bh_mempack.resident()]}, "result": (mib,)}


class Thing:
    """What MakeThing returns: an object no codec carries, so it stays in the
    worker and the host holds a handle to it (a MODEL a loader made)."""

    def __init__(self, label):
        self.label = label
        self.pid = os.getpid()


class MakeThing:
    """Makes a Thing (its output crosses as a handle)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"label": ("STRING", {"default": "thing"})}}

    RETURN_TYPES = ("E2E_THING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, label):
        return (Thing(label),)


class UseThing:
    """Reads a Thing of the same worker: its label, the pid that made it and
    this worker's pid."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"thing": ("E2E_THING",), "suffix": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, thing, suffix):
        return {"ui": {"text": [thing.label + suffix], "made_in": [thing.pid], "pid": [os.getpid()]},
                "result": (thing.label + suffix,)}


class SlowCheck:
    """A VALIDATE_INPUTS that takes `seconds` and refuses a text with "no"."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 0.0}), "text": ("STRING", {"default": "ok"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    @classmethod
    def VALIDATE_INPUTS(cls, seconds, text):
        time.sleep(seconds)
        return "no is no" if "no" in text else True

    def run(self, seconds, text):
        return {"ui": {"text": [text]}, "result": (text,)}


class BigArray:
    """Returns `mib` MiB of float32 (a shared-memory block of the worker's
    that the host maps, and ComfyUI caches as the node's output)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mib": ("INT", {"default": 32, "min": 1, "max": 1024})}}

    RETURN_TYPES = ("E2E_ARRAY",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    def run(self, mib):
        import numpy as np
        return {"ui": {"pid": [os.getpid()]}, "result": (np.ones(mib << 18, np.float32),)}


class Block:
    """Hands on its text, or, where block, an ExecutionBlocker in its place:
    with a message where verbose (ComfyUI reports it), silent otherwise."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "a"}), "block": ("BOOLEAN", {"default": True}),
                             "verbose": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, text, block, verbose):
        from comfy_execution.graph_utils import ExecutionBlocker
        if not block:
            return (text,)
        return (ExecutionBlocker(f"{text} is blocked" if verbose else None),)


class Show:
    """An output node: the text it got, and its node id, in the history."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})}, "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, text, unique_id=None):
        return {"ui": {"text": [text], "node": [unique_id]}, "result": (text,)}


class Where:
    """An output node reading the prompt as executed (its hidden DYNPROMPT):
    its own entry, the node that expanded it, the nodes of the same
    expansion, the prompt's own nodes."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "hidden": {"dynprompt": "DYNPROMPT", "unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, dynprompt, unique_id):
        group = unique_id.rpartition(".")[0]
        siblings = sorted(n for n in dynprompt.all_node_ids() if "." in n and n.rpartition(".")[0] == group)
        return {"ui": {"node": [unique_id], "class_type": [dynprompt.get_node(unique_id)["class_type"]],
                       "parent": [dynprompt.get_parent_node_id(unique_id)], "siblings": siblings,
                       "original": sorted(dynprompt.get_original_prompt())}}


class Expand:
    """Expands (a GraphBuilder graph, its ids under the prefix ComfyUI's
    executor set) into a Show of its text, a Where and, below depth 1, an
    Expand of depth - 1, whose text is its result."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "x"}), "depth": ("INT", {"default": 1, "min": 1, "max": 4})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, text, depth):
        from comfy_execution.graph_utils import GraphBuilder
        graph = GraphBuilder()
        out = graph.node("E2EShow", text=f"{text}{depth}").out(0)
        graph.node("E2EWhere")
        if depth > 1:
            out = graph.node("E2EExpand", text=text, depth=depth - 1).out(0)
        return {"result": (out,), "expand": graph.finalize()}


NODE_CLASS_MAPPINGS = {"E2EEcho": Echo, "E2ESlowCheck": SlowCheck, "E2EBigArray": BigArray, "E2ESteps": Steps, "E2ESpin": Spin, "E2EBurn": Burn, "E2EHoldRam": HoldRam,
                       "E2EHoldObjects": HoldObjects, "E2EMakeThing": MakeThing, "E2EUseThing": UseThing, "E2EBlock": Block,
                       "E2EShow": Show, "E2EWhere": Where, "E2EExpand": Expand}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EEcho": "Echo (isolated)", "E2ESteps": "Steps (isolated)"}


class Background:
    """Starts the pack's own work that outlives the node (as a job a pack's
    route starts): `kind` "cpu" (a thread computing), "child" (a process
    of its own) or "context" (a thread waiting inside bulkhead.working()),
    for `seconds`; then writes its pid to `done` (a path)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"kind": (["cpu", "child", "context"],), "seconds": ("FLOAT", {"default": 6.0}),
                             "done": ("STRING", {"default": ""})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    def run(self, kind, seconds, done):
        import subprocess
        import threading

        def job():
            t0 = time.monotonic()
            if kind == "cpu":
                n = 0
                while time.monotonic() - t0 < seconds:
                    n += 1
            elif kind == "child":
                subprocess.run(["sleep", str(seconds)], check=True)
            else:
                import bulkhead
                with bulkhead.working():
                    time.sleep(seconds)
            with open(done, "w") as f:
                f.write(str(os.getpid()))
        threading.Thread(target=job, daemon=True).start()
        return {"ui": {"pid": [os.getpid()]}}


NODE_CLASS_MAPPINGS["E2EBackground"] = Background


class Listed:
    """A dropdown of the files in the pack's `listed/` folder, built with
    os.listdir as packs do (not folder_paths): ComfyUI runs INPUT_TYPES
    again each time the frontend asks for the node definitions."""

    @classmethod
    def INPUT_TYPES(cls):
        d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "listed")
        return {"required": {"name": (sorted(os.listdir(d)) if os.path.isdir(d) else [],)}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead e2e"

    def run(self, name):
        return {"ui": {"name": [name], "pid": [os.getpid()]}}


NODE_CLASS_MAPPINGS["E2EListed"] = Listed


class ListMake:
    """OUTPUT_IS_LIST: `count` texts and `count` small images, each output
    a list ComfyUI hands on item by item (or whole, to an INPUT_IS_LIST
    node)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"count": ("INT", {"default": 3, "min": 1, "max": 8})}}

    RETURN_TYPES = ("STRING", "IMAGE")
    OUTPUT_IS_LIST = (True, True)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, count):
        import torch
        return ([f"item{i}" for i in range(count)], [torch.full((1, 2, 2, 3), i / 8) for i in range(count)])


class ListJoin:
    """INPUT_IS_LIST: every input a list (a widget's value a list of one);
    joins the texts, counts the images."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"texts": ("STRING", {"forceInput": True}), "images": ("IMAGE",),
                             "sep": ("STRING", {"default": "+"})}}

    INPUT_IS_LIST = True
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, texts, images, sep):
        joined = sep[0].join(texts)
        return {"ui": {"text": [joined], "images": [len(images)], "sep": sep}, "result": (joined,)}


NODE_CLASS_MAPPINGS.update({"E2EListMake": ListMake, "E2EListJoin": ListJoin})


class E2EPackError(ValueError):
    """A pack's own exception class (E2ERaise's kind "E2EPackError")."""


class Raise:
    """Raises `kind` (a builtin exception class's name, or the pack's own
    E2EPackError) with `message`: the error ComfyUI reports for the node,
    its class and message."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"kind": (["ValueError", "RuntimeError", "KeyError", "E2EPackError"],),
                             "message": ("STRING", {"default": "the node failed"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, kind, message):
        raise {"ValueError": ValueError, "RuntimeError": RuntimeError, "KeyError": KeyError,
               "E2EPackError": E2EPackError}[kind](message)


NODE_CLASS_MAPPINGS["E2ERaise"] = Raise
