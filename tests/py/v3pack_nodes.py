"""The V3 pack of tests/py/test_v3.py (its nodes.py): a sync and an async
node, hidden inputs, a ui output, an expansion, validate / fingerprint /
lazy, a dynamic input, and a node whose schema cannot cross."""
import os

from comfy_api.latest import ComfyExtension, io


class Thing:
    """An object that cannot cross: stays in the worker as a handle."""

    def __init__(self, n):
        self.n = n


class Make(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Make", display_name="V3 Make", category="bulkhead/v3", description="Makes a thing.",
            inputs=[io.Int.Input("n", default=2, min=0, max=10, tooltip="how many"),
                    io.Combo.Input("kind", options=["a", "b"], default="a"),
                    io.String.Input("text", multiline=True, default="x", optional=True)],
            outputs=[io.Custom("THING").Output(display_name="thing"), io.Int.Output()],
            hidden=[io.Hidden.unique_id], not_idempotent=True)

    @classmethod
    def execute(cls, n, kind, text="x"):
        return io.NodeOutput(Thing(n), n * 2 if kind == "a" else n)

    @classmethod
    def validate_inputs(cls, n):
        return True if n != 7 else "seven is not allowed"

    @classmethod
    def fingerprint_inputs(cls, n, kind, text="x"):
        return f"{n}:{kind}"


class Show(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Show", category="bulkhead/v3", is_output_node=True,
            inputs=[io.Custom("THING").Input("thing"), io.Int.Input("value", force_input=True)],
            outputs=[io.String.Output()],
            hidden=[io.Hidden.unique_id, io.Hidden.dynprompt, io.Hidden.auth_token_comfy_org])

    @classmethod
    async def execute(cls, thing, value):
        text = f"{thing.n}/{value}/{cls.hidden.unique_id}"
        nodes_seen = sorted(cls.hidden.dynprompt.all_node_ids()) if cls.hidden.dynprompt else []
        return io.NodeOutput(text, ui={"text": [text], "nodes": nodes_seen,
                                       "pid_is_worker": [os.environ.get("BULKHEAD_PACK_NAME") is not None]})


class Pick(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Pick", category="bulkhead/v3",
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
    """Expands into two V3Make nodes and a sum."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3Twice", category="bulkhead/v3", enable_expand=True,
                         inputs=[io.Int.Input("n", default=1)], outputs=[io.Int.Output()],
                         hidden=[io.Hidden.unique_id])

    @classmethod
    def execute(cls, n):
        me = cls.hidden.unique_id
        graph = {f"{me}.m": {"class_type": "V3Make", "inputs": {"n": n, "kind": "a"}}}
        return io.NodeOutput([f"{me}.m", 1], expand=graph)


class Many(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Many", category="bulkhead/v3", is_experimental=True,
            inputs=[io.AutogrowDynamic.Input("v", io.Int.Input("int"), min=1, max=3),
                    io.MultiType.Input(io.Float.Input("f", default=1.5, step=0.5), types=[io.Int])],
            outputs=[io.Int.Output(is_output_list=False)])

    @classmethod
    def execute(cls, f=1.5, **kwargs):
        return io.NodeOutput(sum(v for v in kwargs.values() if v is not None) + int(f))


class Opaque:
    def __str__(self):
        return "opaque"


class Unsendable(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3Unsendable", inputs=[io.Custom("OPAQUE").Input("n", extra_dict={"thing": Opaque()})],
                         outputs=[io.Int.Output()])

    @classmethod
    def execute(cls, n):
        return io.NodeOutput(n)


NODES = [Make, Show, Pick, Twice, Many, Unsendable]

if os.environ.get("BH_V3_ENTRYPOINT"):
    class Extension(ComfyExtension):
        loaded = 0

        async def on_load(self):
            Extension.loaded += 1

        async def get_node_list(self):
            return [Make, Show] + ([Pick] if Extension.loaded else [])

    async def comfy_entrypoint():
        return Extension()
else:
    NODE_CLASS_MAPPINGS = {n.define_schema().node_id: n for n in NODES}
    NODE_DISPLAY_NAME_MAPPINGS = {"V3Make": "V3 Make"}
