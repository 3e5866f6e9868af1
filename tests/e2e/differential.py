"""The differential harness: every fixture node of the project run two ways
through the same ComfyUI executor -- isolated, in an environment bulkhead
builds for it, and in ComfyUI's own process -- and what ComfyUI and the
user see of the two compared (tests/e2e/test_differential.py drives it).

Two servers (tests/comfyui, or the checkout COMFYUI_PATH names) get the
same two packs.  `bh_differential` is every fixture pack under
tests/e2e/packs that has a nodes.py, copied in as one pack (each a
package of its own under packs/, its loader left out; the pack's nodes.py
imports each one's nodes module): in one server it is isolated as
a published pack is (`bulkhead.comfy_pack`, a comfy-env.toml naming no
requirements: its environment is built at the server's start), in the
other imported in-process (BH_E2E_IN_PROCESS).  `bh_diff_tools` runs
in-process in both: a source of deterministic values (small tensors, a
latent, literals, and tensors made outside inference mode) and a sink, an
output node taking anything, whose ui is a digest of what it got (a
tensor's class, dtype, shape, bytes' sha256, requires_grad and whether it
is an inference tensor; a value's type and value; an object that stays in
a worker only as "opaque"): what the next node sees of a node's output.

The nodes come from the in-process server's /object_info: for each, the
inputs are built from its INPUT_TYPES (the default, the first combo
choice, the source's output of that type, else the output of a fixture
node that returns that type), and each of its outputs goes to a sink, so a
new fixture node is covered with no new test code.  A node that needs
other inputs, several variants, a prompt of its own (one that fails: an
error ends the prompt it is in) or that cannot run both ways has an entry
in SPECIAL, with its reason.  All the other nodes run in ONE prompt, queued
twice (the second run shows what came from the cache); each alone node in
a prompt of its own.  For every prompt the harness records what /prompt
answered (the validation errors per node), each node's websocket messages
in order (executing, executed with its ui, progress, previews and
progress text as binary frames; execution_error with its class, message
and node), the prompt's own messages (execution_cached's nodes) and the
/history entry, with what must differ between two runs taken out (the
prompt id, timestamps, tracebacks, and the ui keys in VOLATILE_UI), and
compares the two servers' records node by node.

`make check` runs it against tests/comfyui (about 25 s); against a real
checkout: COMFYUI_PATH=<checkout> pytest tests/e2e/test_differential.py
(about 50 s).
"""

import io
import json
import os
import shutil
import struct
import threading

from .e2eenv import HELPERS, PACKS, Server, assemble

DIFF_PACK = "bh_differential"
TOOLS_PACK = "bh_diff_tools"
SOURCE = "bh-source"

# ui keys whose values differ from run to run (a pid, a clock): compared by
# presence only.
VOLATILE_UI = frozenset({"pid", "made_in", "start", "end", "ran_s"})

# The source's outputs by type (bh_diff_tools' BHDiffSource).
SOURCE_SLOTS = {"IMAGE": 0, "MASK": 1, "LATENT": 2, "INT": 3, "FLOAT": 4, "STRING": 5, "BOOLEAN": 6,
                "GRAD_LEAF": 7, "PLAIN": 8, "PARAMETER": 9}
PRIMITIVES = ("INT", "FLOAT", "STRING", "BOOLEAN")


def src(kind):
    """A link to the source's output of that kind (SOURCE_SLOTS)."""
    return [SOURCE, SOURCE_SLOTS[kind]]


def out(node, slot=0):
    """A link to output `slot` of the node of class `node` in the prompt."""
    return ["@" + node, slot]


# Per node class: "inputs" (literals or links: src(), out()) over what the
# harness would choose; "variants", one node per dict of inputs (each may
# say "alone"); "alone", a prompt of its own; "volatile_outputs", outputs
# that differ run to run (a duration: the sink's digest is compared by type
# only); "skip", why the node cannot be compared this way.
SPECIAL = {
    "E2EHoldRam": {"skip": "loads a model through tests/py/helpers' fake memory pack, found through "
                           "BH_E2E_HELPERS, which an isolated worker's allow-listed environment lacks; its "
                           "subject is the memory budget (test_server)"},
    "E2ESandboxProbe": {"skip": "its subject is the sandbox around an isolated worker, which a node in "
                                "ComfyUI's own process does not have (test_sandbox)"},
    "E2ESandboxRefused": {"skip": "as E2ESandboxProbe"},
    "E2EBadUnsendable": {"skip": "its schema holds an object JSON cannot carry: in ComfyUI's own process "
                                 "/object_info then fails as a whole (500), isolated the node is refused at "
                                 "load saying so (test_bad_pack)"},
    "E2EBadTalk": {"skip": "its send_sync payload is no JSON: in-process the server's send loop turns it into a "
                           "string, isolated it cannot leave the worker and the node fails saying so, by design "
                           "(no pickle: test_bad_pack)"},
    "E2ESpin": {"inputs": {"seconds": 0.0}, "volatile_outputs": True},
    "E2ESteps": {"inputs": {"steps": 2}},
    "E2EBigArray": {"inputs": {"mib": 1}},
    "E2EBackground": {"inputs": {"seconds": 0.0, "done": os.devnull}},
    "E2EAsyncSleep": {"inputs": {"seconds": 0.0}, "volatile_outputs": True},
    "E2EV3AsyncSleep": {"inputs": {"seconds": 0.0}, "volatile_outputs": True},
    "E2EV3Stubborn": {"inputs": {"seconds": 0.0}},
    "E2EAnyShow": {"inputs": {"any": 0.1, "smart": 3.0}},
    "E2EAnyNumber": {"inputs": {"value": out("E2EAnyImage", 1)}},   # its VALIDATE_INPUTS wants the pack's type
    "E2EAnyTake": {"inputs": {"value": src("INT"), "anything": src("IMAGE")}},
    "E2EBlock": {"variants": [{"block": True}, {"block": False}, {"block": True, "verbose": True, "alone": True}]},
    "E2ERaise": {"variants": [{"kind": k, "alone": True} for k in ("ValueError", "RuntimeError", "KeyError",
                                                                   "E2EPackError")]
                 + [{"kind": "ValueError", "message": "first line\nsecond line\n", "alone": True}]},
    "E2EV3Pick": {"variants": [{"first": True}, {"first": False}]},
    "E2EV3Count": {"variants": [{"n": 2}, {"n": 7, "alone": True}]},
    "E2EEcho": {"variants": [{}, {"text": "two\nlines", "alone": True}]},
    "E2ESlowCheck": {"variants": [{}, {"text": "no", "alone": True}]},
    # lists: E2EListJoin gets E2EListMake's lists whole (and a source's value as a list of one); the
    # sinks of E2EListMake's outputs, and E2EEcho fed its texts, run once per item
    "E2EListJoin": {"variants": [{"texts": out("E2EListMake", 0), "images": out("E2EListMake", 1)},
                                 {"texts": src("STRING"), "images": src("IMAGE")}]},
    "E2EGradSee": {"variants": [{"image": src("GRAD_LEAF")}, {"image": src("PLAIN")}, {"image": src("IMAGE")},
                                {"image": src("PARAMETER")}, {"image": out("E2EGradLeaf", 0)},
                                {"image": out("E2EGradLeaf", 1)}, {"image": out("E2EGradLeaf", 2)},
                                {"image": out("E2EGradLeaf", 3)}]},
}

DIFF_INIT = '''"""Every fixture pack's nodes as one pack (nodes.py), for the differential
harness (tests/e2e/differential.py): isolated in an environment bulkhead
builds, or in ComfyUI's own process where BH_E2E_IN_PROCESS is set."""
import os

if os.environ.get("BH_E2E_IN_PROCESS"):
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401
else:
    import bulkhead

    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
'''

DIFF_NODES = '''"""The fixture packs (packs/<pack>/: each pack's files, its __init__.py, the
loader, left out), each one's nodes module imported, their mappings
merged, less the nodes the harness skips (SPECIAL's reasons)."""
import importlib
import os

SKIP = %s

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "packs")
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}
for _name in sorted(os.listdir(HERE)):
    if os.path.isfile(os.path.join(HERE, _name, "nodes.py")):
        _mod = importlib.import_module(f".packs.{_name}.nodes", __package__)
        NODE_CLASS_MAPPINGS.update({k: v for k, v in _mod.NODE_CLASS_MAPPINGS.items() if k not in SKIP})
        NODE_DISPLAY_NAME_MAPPINGS.update({k: v for k, v in (getattr(_mod, "NODE_DISPLAY_NAME_MAPPINGS", None)
                                                             or {}).items() if k not in SKIP})
'''

DIFF_CONFIG = '''# The differential harness's pack: the host's own Python minor and no
# requirements (ComfyUI's modules, torch, aiohttp and Pillow come from what
# the worker sees of the host, as in-process).
[bulkhead]
interrupt_grace_s = 1.0
'''

TOOLS_INIT = '''"""The differential harness's own nodes, in ComfyUI's process on both
servers: BHDiffSource (deterministic values) and BHDiffSink (a digest of
what it got, in its ui)."""
import hashlib

import torch


class AnyType(str):
    def __ne__(self, other):
        return False


class BHDiffSource:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("IMAGE", "MASK", "LATENT", "INT", "FLOAT", "STRING", "BOOLEAN", "IMAGE", "IMAGE", "IMAGE")
    RETURN_NAMES = ("image", "mask", "latent", "int", "float", "string", "boolean", "grad_leaf", "plain",
                    "parameter")
    FUNCTION = "make"
    CATEGORY = "bulkhead differential"

    def make(self):
        image = torch.arange(2 * 4 * 4 * 3, dtype=torch.float32).reshape(2, 4, 4, 3) / 96
        latent = {"samples": torch.linspace(-1, 1, 32).reshape(1, 4, 2, 4)}
        with torch.inference_mode(False), torch.enable_grad():
            leaf = (torch.arange(12, dtype=torch.float32).reshape(1, 2, 2, 3) / 12).requires_grad_()
            plain = torch.full((1, 2, 2, 3), 0.75)
            parameter = torch.nn.Parameter(torch.full((1, 2, 2, 3), 0.125))
        return (image, image[..., 0].clone(), latent, 3, 0.5, "text", True, leaf, plain, parameter)


def digest(v, depth=0):
    if depth > 8:
        return "deep"
    if isinstance(v, torch.Tensor):
        t = v.detach()
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"tensor": type(v).__name__, "dtype": str(v.dtype), "shape": list(v.shape),
                "sha256": hashlib.sha256(data).hexdigest(), "requires_grad": v.requires_grad,
                "inference": v.is_inference()}
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and isinstance(v, np.ndarray):
        return {"ndarray": v.dtype.str, "shape": list(v.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()}
    if isinstance(v, dict):
        return {"dict": {str(k): digest(x, depth + 1) for k, x in v.items()}}
    if isinstance(v, (list, tuple)):
        return {type(v).__name__: [digest(x, depth + 1) for x in v]}
    if v is None or isinstance(v, (bool, int, str)):
        return {type(v).__name__: v}
    if isinstance(v, float):
        return {"float": repr(v)}
    return "opaque"


class BHDiffSink:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": (AnyType("*"), {})}}

    RETURN_TYPES = ()
    FUNCTION = "see"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead differential"

    def see(self, value):
        return {"ui": {"seen": [digest(value)]}}


NODE_CLASS_MAPPINGS = {"BHDiffSource": BHDiffSource, "BHDiffSink": BHDiffSink}
'''


def skipped():
    """{class: why} of the fixture nodes the harness leaves out."""
    return {cls: special["skip"] for cls, special in SPECIAL.items() if "skip" in special}


def fixture_packs():
    """The fixture packs: tests/e2e/packs/* with a nodes.py."""
    return sorted(p for p in os.listdir(PACKS) if os.path.isfile(os.path.join(PACKS, p, "nodes.py")))


def _write_packs(root):
    """bh_differential and bh_diff_tools under root; returns their paths."""
    diff = os.path.join(root, DIFF_PACK)
    os.makedirs(os.path.join(diff, "packs"))
    open(os.path.join(diff, "packs", "__init__.py"), "w").close()
    for name in fixture_packs():
        shutil.copytree(os.path.join(PACKS, name), os.path.join(diff, "packs", name),
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(diff, "packs", name, "__init__.py"), "w") as f:   # the loader: bulkhead's part
            f.write(f'"""tests/e2e/packs/{name}, its nodes served by bh_differential."""\n')
    for name in ("e2e_pack", "e2e_v3"):     # E2EListed's and E2EV3Listed's choice
        os.makedirs(os.path.join(diff, "packs", name, "listed"), exist_ok=True)
        with open(os.path.join(diff, "packs", name, "listed", "a.txt"), "w") as f:
            f.write("a\n")
    for name, text in (("__init__.py", DIFF_INIT), ("nodes.py", DIFF_NODES % sorted(skipped())), ("comfy-env.toml", DIFF_CONFIG)):
        with open(os.path.join(diff, name), "w") as f:
            f.write(text)
    tools = os.path.join(root, TOOLS_PACK)
    os.makedirs(tools)
    with open(os.path.join(tools, "__init__.py"), "w") as f:
        f.write(TOOLS_INIT)
    return diff, tools


def start_pair(root):
    """The two servers under root, started side by side: {"isolated":
    Server, "in-process": Server}.  The caller stops them (stop_pair)."""
    packs = _write_packs(os.path.join(root, "packs"))
    servers = {}
    for way, extra in (("isolated", {}), ("in-process", {"BH_E2E_IN_PROCESS": "1"})):
        base = os.path.join(root, way)
        path = assemble(base, pack_dirs=packs)
        env = dict(os.environ)
        env.pop("COMFYUI_PATH", None)
        env.update({"PYTHONPATH": os.pathsep.join(path), "BULKHEAD_LEDGER": os.path.join(root, way + "-ledger"),
                    "BH_E2E_HELPERS": HELPERS, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
                    "BULKHEAD_HOME": os.path.join(root, "bulkhead-home")}, **extra)
        servers[way] = Server(base, env, env["BULKHEAD_LEDGER"])
    errors = []

    def start(s):
        try:
            s.start()
        except BaseException as e:   # reported below, on the test's thread
            errors.append(e)
    threads = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        stop_pair(servers)
        raise errors[0]
    return servers


def stop_pair(servers):
    """Stops both (each checked for processes left behind)."""
    errors = []
    for s in servers.values():
        try:
            s.stop()
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)


# --- the prompts ---

def fixture_nodes(info):
    """The fixture nodes' /object_info entries, by class."""
    return {k: v for k, v in info.items() if v.get("python_module", "").endswith(DIFF_PACK)}


def _literal(kind, opts):
    if isinstance(kind, list):
        return kind[0] if kind else None
    if kind == "COMBO":
        options = opts.get("options") or []
        return options[0] if options else None
    if "default" in opts:
        return opts["default"]
    return {"INT": opts.get("min", 0), "FLOAT": float(opts.get("min", 0.0)), "STRING": "",
            "BOOLEAN": False}.get(kind)


def _inputs(cls, entry, producers, given):
    """A node's inputs: `given` over what the harness chooses for each
    required input.  Raises AssertionError for an input it cannot fill."""
    got = {}
    for name, spec in (entry.get("input", {}).get("required") or {}).items():
        kind, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
        if name in given:
            got[name] = given[name]
        elif isinstance(kind, list) or kind == "COMBO" or (kind in PRIMITIVES and not opts.get("forceInput")):
            got[name] = _literal(kind, opts)
        elif kind in SOURCE_SLOTS:
            got[name] = src(kind)
        elif kind in producers and producers[kind][0] != cls:
            got[name] = out(*producers[kind])
        else:
            raise AssertionError(f"the differential harness cannot fill input {name!r} ({kind}) of {cls}: no "
                                 f"source or fixture node gives a {kind}; give it one in SPECIAL "
                                 "(tests/e2e/differential.py)")
    for name, value in given.items():   # optional inputs named in SPECIAL
        got.setdefault(name, value)
    return got


def plan(info):
    """The prompts for the fixture nodes in `info` (the in-process
    server's /object_info): (main prompt, {name: alone prompt}, volatile
    sink ids)."""
    nodes = fixture_nodes(info)
    producers = {}
    for cls, entry in sorted(nodes.items()):
        for slot, kind in enumerate(entry.get("output") or ()):
            producers.setdefault(kind, (cls, slot))
    main, alone, volatile = {}, {}, set()
    for cls, entry in sorted(nodes.items()):
        special = SPECIAL.get(cls, {})
        for i, variant in enumerate(special.get("variants") or [{}]):
            variant = dict(variant)
            own = variant.pop("alone", special.get("alone", False))
            nid = cls if i == 0 else f"{cls}-v{i}"
            given = json.loads(json.dumps(dict(special.get("inputs", {}), **variant)))   # links get rewritten
            node = {"class_type": cls, "inputs": _inputs(cls, entry, producers, given)}
            prompt = {} if own else main
            prompt[nid] = node
            for slot, _kind in enumerate(entry.get("output") or ()):
                sink = f"sink-{nid}-{slot}"
                prompt[sink] = {"class_type": "BHDiffSink", "inputs": {"value": [nid, slot]}}
                if special.get("volatile_outputs"):
                    volatile.add(sink)
            if own:
                alone[nid] = prompt
    for prompt in [main, *alone.values()]:
        _resolve(prompt, main)
    return main, alone, volatile


def _resolve(prompt, main):
    """Links to "@Class" name that class's node: in the prompt, copied in
    (with what it needs) from the main prompt where absent; the source
    added where linked."""
    def visit(node):
        for name, value in node["inputs"].items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                if value[0].startswith("@"):
                    value[0] = value[0][1:]
                if value[0] not in prompt:
                    if value[0] == SOURCE:
                        prompt[SOURCE] = {"class_type": "BHDiffSource", "inputs": {}}
                    else:
                        prompt[value[0]] = json.loads(json.dumps(main[value[0]]))
                        visit(prompt[value[0]])
    for node in list(prompt.values()):
        visit(node)


# --- running one prompt and recording what the user sees ---

PREVIEW_IMAGE = 1


def frame(data):
    """A binary websocket frame as something comparable: its event type
    and, for a preview, the image's format, size and centre pixel; else
    its bytes."""
    event = struct.unpack(">I", data[:4])[0]
    if event == PREVIEW_IMAGE:
        from PIL import Image
        image_type = struct.unpack(">I", data[4:8])[0]
        im = Image.open(io.BytesIO(data[8:]))
        return {"event": event, "image_type": image_type, "format": im.format, "size": list(im.size),
                "center": list(im.convert("RGB").getpixel((im.size[0] // 2, im.size[1] // 2)))}
    return {"event": event, "bytes": data[4:].decode("latin-1")}


def normal(value, prompt_id, base=None):
    """A message or history entry with what must differ between two runs
    taken out: the prompt id, the server's folder (`base`: ComfyUI names a
    pack's modules by its path, and so a pack's exception class),
    timestamps, tracebacks, VOLATILE_UI values."""
    text = json.dumps(value, sort_keys=True)
    if base:
        text = text.replace(base.rstrip("/") + "/", "SERVER/")
    value = json.loads(text.replace(prompt_id, "PROMPT") if prompt_id else text)

    def strip(v):
        if isinstance(v, dict):
            return {k: ("volatile" if k in VOLATILE_UI else strip(x)) for k, x in v.items()
                    if k not in ("timestamp", "traceback", "current_inputs", "current_outputs")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(value)


def by_node(messages):
    """The websocket messages of one prompt, node by node: each node's own
    messages in order (a binary frame belongs to the node executing when it
    came), each node's progress states (from `progress_state`, which real
    ComfyUI sends: consecutive repeats dropped), and the prompt's own
    messages.  The order between nodes is left out: ComfyUI's own order
    depends on set iteration and an async node may finish after later
    nodes."""
    nodes, states, prompt, current = {}, {}, [], None
    for m in messages:
        if "event" in m:
            nodes.setdefault(str(current), []).append(m)
            continue
        kind, data = m["type"], m["data"]
        if kind == "progress_state":
            for nid, st in data["nodes"].items():
                seq = states.setdefault(nid, [])
                if not seq or seq[-1] != [st["state"], st["value"], st["max"]]:
                    seq.append([st["state"], st["value"], st["max"]])
        elif isinstance(data, dict) and "node" in data:   # the prompt's end: node None
            if kind == "executing":
                current = data["node"]
            nodes.setdefault(str(data["node"]), []).append(m)
        else:   # execution_error (its node_id in it) among them
            prompt.append(m)
    return {"nodes": nodes, "states": states, "prompt": prompt}


def run(srv, prompt):
    """One prompt queued over HTTP with a websocket client listening:
    {"queued": the validation errors per node (or the refusal), "nodes",
    "states", "prompt" (by_node), "history": its outputs and status}."""
    import aiohttp
    record = {}

    async def session(ws, sid):
        async with aiohttp.ClientSession() as http:
            async with http.post(srv.url + "/prompt", json={"prompt": prompt, "client_id": sid}) as r:
                answer = await r.json()
                if r.status != 200:
                    record["queued"] = {"refused": r.status, "error": answer.get("error"),
                                        "node_errors": answer.get("node_errors")}
                    return None, []
                record["queued"] = {"node_errors": answer.get("node_errors")}
                prompt_id = answer["prompt_id"]
        messages = []
        while True:
            m = await ws.receive()
            if m.type == aiohttp.WSMsgType.BINARY:
                messages.append(frame(m.data))
                continue
            assert m.type == aiohttp.WSMsgType.TEXT, m
            msg = json.loads(m.data)
            if msg["type"] in ("status", "crystools.monitor") or msg["type"].startswith("bulkhead."):
                continue
            messages.append(msg)
            if msg["type"] == "executing" and msg["data"].get("node") is None \
                    and msg["data"].get("prompt_id") == prompt_id:
                return prompt_id, messages
            if msg["type"] in ("execution_error", "execution_interrupted") \
                    and msg["data"].get("prompt_id") == prompt_id:
                return prompt_id, messages
    try:
        prompt_id, messages = srv.run_ws(session, timeout_s=120)
    except TimeoutError:
        raise AssertionError(f"the prompt did not end; got {record}:\n{srv.log()}") from None
    if prompt_id is None:
        return normal(record, None, srv.base)
    record.update(by_node(messages))
    entry = srv.wait_history(prompt_id)
    record["history"] = {"outputs": entry["outputs"], "status": entry["status"]["status_str"],
                         "messages": [m[0] for m in entry["status"]["messages"]]}
    record = normal(record, prompt_id, srv.base)
    for m in record["prompt"]:
        if m["type"] == "execution_cached":
            m["data"]["nodes"] = sorted(m["data"]["nodes"])
    return record


def mask_volatile_sinks(record, volatile):
    """The digests of sinks in `volatile` reduced to their kind."""
    def reduce(seen):
        return [sorted(s) if isinstance(s, dict) else s for s in seen]
    for nid in volatile:
        ui = record.get("history", {}).get("outputs", {}).get(nid)
        if ui and "seen" in ui:
            ui["seen"] = reduce(ui["seen"])
        for m in record.get("nodes", {}).get(nid, []):
            if m.get("type") == "executed" and "seen" in (m["data"].get("output") or {}):
                m["data"]["output"]["seen"] = reduce(m["data"]["output"]["seen"])
    return record


def differences(a, b, names=("isolated", "in-process")):
    """What differs between two records of one prompt, a line per node and
    kind: [] where they are the same."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if key in ("nodes", "states") or (key == "history" and x and y):
            inner_x = (x or {}).get("outputs", x) if key == "history" else (x or {})
            inner_y = (y or {}).get("outputs", y) if key == "history" else (y or {})
            for nid in sorted(set(inner_x) | set(inner_y)):
                if inner_x.get(nid) != inner_y.get(nid):
                    out.append(f"{key} of node {nid}:\n  {names[0]}: {json.dumps(inner_x.get(nid))}\n"
                               f"  {names[1]}: {json.dumps(inner_y.get(nid))}")
            if key == "history":
                for k in ("status", "messages"):
                    if x.get(k) != y.get(k):
                        out.append(f"history {k}:\n  {names[0]}: {x.get(k)}\n  {names[1]}: {y.get(k)}")
        elif x != y:
            out.append(f"{key}:\n  {names[0]}: {json.dumps(x)}\n  {names[1]}: {json.dumps(y)}")
    return out
