"""ComfyUI's execution values across the crossing (channel/nodes.py): an
ExecutionBlocker, the DynamicPrompt a node reads, the GraphBuilder prefix
the executor sets.  Each differential case runs the same nodes in this
process and isolated, through the same executor (tests/comfyui's, this
process the host), and compares what ComfyUI and the user get: each
node's outputs, the history, the messages and the ids of the nodes an
expansion made.  The V1 nodes are the e2e pack's (tests/e2e/packs/e2e_pack,
which tests/e2e/test_server.py queues over HTTP both ways); the V3 ones
are below.
"""

import asyncio
import importlib.util
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(os.path.dirname(HERE), "comfyui")
E2E_NODES = os.path.join(os.path.dirname(HERE), "e2e", "packs", "e2e_pack", "nodes.py")

INIT = '''\
import os, sys
from bulkhead.host.nodes import load_pack
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = load_pack(
    os.path.dirname(os.path.abspath(__file__)), sys.executable,
    options={"comfyui": os.environ["BH_TEST_COMFYUI"], "cache": False})
'''

# V3 nodes: a blocker as an output, an expansion by GraphBuilder reading
# its hidden dynprompt, and what a blocker the host sends turns into.
V3_NODES = '''
from comfy_api.latest import io


class Block(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3ValBlock", inputs=[io.String.Input("text")], outputs=[io.String.Output()])

    @classmethod
    def execute(cls, text):
        from comfy_execution.graph_utils import ExecutionBlocker
        return io.NodeOutput(ExecutionBlocker(f"{text} is blocked"))


class Expand(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3ValExpand", enable_expand=True,
                         inputs=[io.String.Input("text"), io.Int.Input("depth", default=1)],
                         outputs=[io.String.Output()], hidden=[io.Hidden.unique_id, io.Hidden.dynprompt])

    @classmethod
    def execute(cls, text, depth):
        from comfy_execution.graph_utils import GraphBuilder
        graph = GraphBuilder()
        seen = ",".join(sorted(cls.hidden.dynprompt.all_node_ids()))
        out = graph.node("E2EShow", text=f"{text}{depth} after {seen}").out(0)
        if depth > 1:
            out = graph.node("V3ValExpand", text=text, depth=depth - 1).out(0)
        return io.NodeOutput(out, expand=graph.finalize())


class Kind(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="V3ValKind", inputs=[io.Custom("*").Input("value")], outputs=[io.String.Output()])

    @classmethod
    def execute(cls, value):
        return io.NodeOutput(_kinds(value))


def _kinds(v):
    """What a node sees of a value: each blocker in it as its class's
    module and name, whether it is this process's ExecutionBlocker, and
    its message."""
    from comfy_execution import graph_utils
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_kinds(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_kinds(x)}" for k, x in v.items()) + "}"
    t = type(v)
    own = isinstance(v, graph_utils.ExecutionBlocker)
    return f"{t.__module__}.{t.__qualname__}" + (f"(own={own}, message={v.message!r})" if own else f"={v!r}")


NODE_CLASS_MAPPINGS = {"V3ValBlock": Block, "V3ValExpand": Expand, "V3ValKind": Kind}
'''

# V1 nodes for what no prompt of the stand-in executor reaches: a list
# output holding blockers (OUTPUT_IS_LIST) and a blocker the host sends.
V1_LIST_NODES = '''

class BlockList:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "a"})}}
    RETURN_TYPES = ("STRING",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "run"
    CATEGORY = "bulkhead/test"

    def run(self, text):
        from comfy_execution.graph_utils import ExecutionBlocker
        return ([text, ExecutionBlocker(None), ExecutionBlocker(f"{text} is blocked")],)


class Kind:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*",)}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bulkhead/test"

    def run(self, value):
        from .v3nodes import _kinds
        return (_kinds(value),)


NODE_CLASS_MAPPINGS.update({"E2EBlockList": BlockList, "E2EKind": Kind})
'''


@pytest.fixture
def host(tmp_path, monkeypatch):
    """load() -> (proxies: {key: class}, real: {key: class}) of a pack made
    of the e2e pack's nodes, the V3 nodes above and the list nodes; the
    proxies' workers run under this interpreter with the stand-in ComfyUI."""
    monkeypatch.syspath_prepend(STUB)
    monkeypatch.setenv("BH_TEST_COMFYUI", STUB)
    from bulkhead.host import nodes
    pack = tmp_path / "valpack"
    pack.mkdir()
    (pack / "nodes.py").write_text(open(E2E_NODES).read() + V1_LIST_NODES + '''
from .v3nodes import NODE_CLASS_MAPPINGS as _V3
NODE_CLASS_MAPPINGS.update(_V3)
''')
    (pack / "v3nodes.py").write_text(V3_NODES)
    (pack / "__init__.py").write_text(INIT)

    def load():
        real_name = "valpack_real"
        spec = importlib.util.spec_from_file_location(real_name, pack / "__init__.py",
                                                      submodule_search_locations=[str(pack)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[real_name] = pkg
        real = importlib.import_module(real_name + ".nodes")
        spec = importlib.util.spec_from_file_location("valpack_proxy", pack / "__init__.py")
        proxy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(proxy)
        return proxy.NODE_CLASS_MAPPINGS, real.NODE_CLASS_MAPPINGS
    before = set(sys.modules)
    yield load
    nodes._forget_all()
    for name in set(sys.modules) - before:   # the stub's modules and the real pack: not for other tests
        if name.split(".")[0] in ("comfy", "comfy_api", "comfy_execution", "nodes", "execution",
                                  "folder_paths", "server", "valpack_real"):
            del sys.modules[name]


class _Server:
    """What the executor tells the user: every message, as sent."""
    client_id = None
    last_node_id = None

    def __init__(self):
        self.sent = []

    def send_sync(self, event, data, sid=None):
        self.sent.append((event, {k: v for k, v in data.items() if k != "timestamp"}))


def _run(mappings, prompt):
    """What the stand-in executor makes of prompt with these node classes:
    {"invalid"} or {"success", "history", "sent"}."""
    from comfy.cli_args import args
    args.cpu = True   # the stub's model_management picks its device at import
    import execution
    import nodes as stub_nodes
    stub_nodes.NODE_CLASS_MAPPINGS.clear()
    stub_nodes.NODE_CLASS_MAPPINGS.update(mappings)
    valid = asyncio.run(execution.validate_prompt("p", prompt))
    if not valid[0]:
        return {"invalid": valid[3]}
    server = _Server()
    ex = execution.PromptExecutor(server)
    ex.execute(prompt, "p", {"client_id": "me"}, valid[2])
    return {"success": ex.success, "history": ex.history_result, "sent": server.sent}


def _both(host, prompt):
    proxies, real = host()
    got, want = _run(proxies, prompt), _run(real, prompt)
    assert got == want, f"isolated:\n{got}\nin-process:\n{want}"
    return want


def _errors(result):
    return [d for e, d in result["sent"] if e == "execution_error"]


def test_a_blocker_a_worker_node_returns_blocks_as_in_process(host):
    """A V1 node's ExecutionBlocker (with a message, silent) and a V3
    node's stop the nodes after them as the same nodes' in ComfyUI's own
    process do: the message reported once, the next node not run (its
    ui missing from the history), the prompt a success."""
    want = _both(host, {
        "1": {"class_type": "E2EBlock", "inputs": {"text": "a", "block": True, "verbose": True}},
        "2": {"class_type": "E2EShow", "inputs": {"text": ["1", 0]}},
        "3": {"class_type": "E2EBlock", "inputs": {"text": "b", "block": True, "verbose": False}},
        "4": {"class_type": "E2EShow", "inputs": {"text": ["3", 0]}},
        "5": {"class_type": "E2EBlock", "inputs": {"text": "c", "block": False, "verbose": False}},
        "6": {"class_type": "E2EShow", "inputs": {"text": ["5", 0]}},
        "7": {"class_type": "V3ValBlock", "inputs": {"text": "d"}},
        "8": {"class_type": "E2EShow", "inputs": {"text": ["7", 0]}},
    })
    assert want["success"] and sorted(want["history"]["outputs"]) == ["6"], want
    assert [e["exception_message"] for e in _errors(want)] == ["Execution Blocked: a is blocked",
                                                               "Execution Blocked: d is blocked"]


def test_a_v1_nodes_hidden_dynprompt_is_the_prompt_as_executed(host):
    """E2EWhere asks for DYNPROMPT (refused before: a DynamicPrompt made in
    the host): it reads the prompt and, inside an expansion, the nodes
    the expansion added, as it does in-process."""
    want = _both(host, {
        "1": {"class_type": "E2EWhere", "inputs": {}},
        "2": {"class_type": "E2EExpand", "inputs": {"text": "x", "depth": 1}},
        "3": {"class_type": "E2EShow", "inputs": {"text": ["2", 0]}},
    })
    outputs = want["history"]["outputs"]
    assert outputs["1"]["original"] == ["1", "2", "3"] and outputs["1"]["parent"] == [None]
    assert outputs["2.0.0.2"]["siblings"] == ["2.0.0.1", "2.0.0.2"] and outputs["2.0.0.2"]["parent"] == ["2"]


def test_nodes_a_worker_graphbuilder_makes_get_the_ids_they_get_in_process(host):
    """GraphBuilder ids carry the prefix ComfyUI's executor sets before each
    call of a node ("<id>.<call index>.<graph index>."), in a V1 and a V3
    node's expansion, nested: the history's node ids, the display ids in
    the messages and what a node inside reads of the prompt are the same
    isolated (before: ".0.<n>." from the worker's own count)."""
    want = _both(host, {
        "1": {"class_type": "E2EExpand", "inputs": {"text": "x", "depth": 2}},
        "2": {"class_type": "E2EShow", "inputs": {"text": ["1", 0]}},
        "3": {"class_type": "V3ValExpand", "inputs": {"text": "y", "depth": 2}},
        "4": {"class_type": "E2EShow", "inputs": {"text": ["3", 0]}},
    })
    outputs = want["history"]["outputs"]
    assert {"1.0.0.1", "1.0.0.2", "1.0.0.3.0.0.1", "1.0.0.3.0.0.2", "3.0.0.1", "3.0.0.2.0.0.1"} <= set(outputs)
    assert outputs["2"]["text"] == ["x1"] and outputs["1.0.0.3.0.0.2"]["siblings"] == ["1.0.0.3.0.0.1",
                                                                                    "1.0.0.3.0.0.2"]
    assert "3.0.0.2" in outputs["3.0.0.2.0.0.1"]["text"][0]   # the nested V3 node saw its own entry


def test_blockers_cross_as_values_both_ways_inside_lists_too(host):
    """A list output holding blockers (OUTPUT_IS_LIST) reaches the host as
    ComfyUI's own ExecutionBlockers with their messages (the executor
    blocks each list item's node by isinstance); blockers the host sends,
    nested in an input, reach a V1 and a V3 node as the worker's own class
    (the first call of a fresh worker too: ComfyUI is on its path by
    then)."""
    from bulkhead.host import nodes
    from comfy_execution.graph_utils import ExecutionBlocker
    proxies, real = host()
    nodes.close_all()   # describing the pack imported ComfyUI there: the next call is a fresh worker's first
    kind = proxies["E2EKind"]
    value = [ExecutionBlocker("m"), {"k": ExecutionBlocker(None)}, "text"]
    got = kind().run(value=value)
    assert got == real["E2EKind"]().run(value=value)
    assert got == ("[comfy_execution.graph_utils.ExecutionBlocker(own=True, message='m'), "
                   "{k: comfy_execution.graph_utils.ExecutionBlocker(own=True, message=None)}, builtins.str='text']",)
    v3 = proxies["V3ValKind"]
    assert v3.execute.__func__(v3.PREPARE_CLASS_CLONE({}), value=value).args == got
    items, = proxies["E2EBlockList"]().run(text="a")
    assert items[0] == "a" and [type(b) for b in items[1:]] == [ExecutionBlocker] * 2
    assert [b.message for b in items[1:]] == [None, "a is blocked"]


def test_the_formats_own_halves():
    """encode_comfy / decode_comfy on one side: a blocker and a
    DynamicPrompt as tagged maps and back; any other tagged map (a pack's
    registered type) is left as it is; the prefix read is None where no
    GraphBuilder is imported."""
    from bulkhead.channel import nodes as fmt
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "comfy_execution"}
    sys.path.insert(0, STUB)
    try:
        assert fmt.graph_prefix() is None
        from comfy_execution.graph import DynamicPrompt
        from comfy_execution.graph_utils import ExecutionBlocker, GraphBuilder
        m = fmt.encode_comfy(ExecutionBlocker("stop"))
        assert m == {fmt.MARK: fmt.BLOCKER, "message": "stop"}
        back = fmt.decode_comfy(m)
        assert type(back) is ExecutionBlocker and back.message == "stop"
        assert fmt.decode_comfy(fmt.encode_comfy(ExecutionBlocker(None))).message is None
        dp = DynamicPrompt({"1": {"class_type": "A", "inputs": {}}})
        dp.add_ephemeral_node("1.0.0.1", {"class_type": "B", "inputs": {"x": ["1", 0]}}, "1")
        mine = fmt.decode_comfy(fmt.encode_comfy(dp))
        assert isinstance(mine, fmt.DynPrompt)
        assert mine.all_node_ids() == {"1", "1.0.0.1"} and mine.get_node("1.0.0.1")["class_type"] == "B"
        assert mine.get_parent_node_id("1.0.0.1") == "1" and mine.get_real_node_id("1.0.0.1") == "1"
        assert mine.get_original_prompt() == dp.get_original_prompt()
        with pytest.raises(KeyError, match="Node 9 not found"):
            mine.get_node("9")
        typed = {fmt.MARK: "PackThing", "type": "Thing", "pack": "p", "value": 1}
        assert fmt.decode_comfy(typed) is typed
        assert fmt.encode_comfy(object()) is None
        GraphBuilder.set_default_prefix("7", 2, 0)
        GraphBuilder()
        assert fmt.graph_prefix() == ["7", 2, 1]
        GraphBuilder.set_default_prefix("", 0, 0)
        fmt.set_graph_prefix(["5", 1, 3])
        assert GraphBuilder().prefix == "5.1.3."
    finally:
        sys.path.remove(STUB)
        for k in [k for k in sys.modules if k.split(".")[0] == "comfy_execution"]:
            del sys.modules[k]
        sys.modules.update(saved)
