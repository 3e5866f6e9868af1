"""#26 from the user's side: pack A's node output feeds pack B's node.

A prompt over HTTP: an IMAGE made by isolated pack A's node goes to a node
of isolated pack B and back to a node of pack A.  A new output lives in a
block A's pool reuses for its next output, so the host does not forward
it (B would hold its memfd, and A could never rewrite it: 9ee6867): it
copies the bytes once into a block of its channel with B, sealed against
writes, which B maps copy-on-write (another memfd: another inode); A's is
its own block again (a back ref).  A node that hands its image on (in
either pack) copies nothing: the host hands on its own object, and A
gets its own block back."""

import textwrap

from .e2eenv import HOST_INTERPRETER_INIT as INIT

NODES = '''
import os


def _mapping(address):
    """(inode, 's' shared / 'p' private, path) of the mapping holding address."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return int(parts[4]), parts[1][3], parts[5].strip() if len(parts) > 5 else ""
    return 0, "?", ""


class MakeImage:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 0.5})}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, value):
        import torch
        return (torch.full((1, 512, 512, 3), value, dtype=torch.float32),)  # 3 MiB


class Inspect:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, image):
        inode, kind, path = _mapping(image.data_ptr())
        total = float(image.sum())
        return {"ui": {"sum": [total], "pid": [os.getpid()], "inode": [inode], "kind": [kind],
                       "path": [path]}, "result": (total,)}


class Pass:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, image):
        return (image,)


NODE_CLASS_MAPPINGS = {"E2EFwdMake%(p)s": MakeImage, "E2EFwdInspect%(p)s": Inspect, "E2EFwdPass%(p)s": Pass}
NODE_DISPLAY_NAME_MAPPINGS = {}
'''


def _pack(root, name, suffix):
    d = root / "packs" / name
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(textwrap.dedent(INIT))
    (d / "nodes.py").write_text(textwrap.dedent(NODES) % {"p": suffix})
    return str(d)


def test_pack_a_output_feeds_pack_b_through_one_host_copy(comfyui, tmp_path):
    a, b = _pack(tmp_path, "e2e_fwd_a", "A"), _pack(tmp_path, "e2e_fwd_b", "B")
    srv = comfyui(packs=(), pack_dirs=(a, b))
    prompt = {
        "1": {"class_type": "E2EFwdMakeA", "inputs": {"value": 0.25}},
        "2": {"class_type": "E2EFwdInspectB", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "E2EFwdInspectA", "inputs": {"image": ["1", 0]}},
    }
    prompt_id = srv.queue(prompt)
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    in_b, in_a = entry["outputs"]["2"], entry["outputs"]["3"]
    n = 512 * 512 * 3
    assert in_b["sum"] == [0.25 * n] and in_a["sum"] == [0.25 * n]
    assert len({in_a["pid"][0], in_b["pid"][0], srv.proc.pid}) == 3  # two workers and the host
    # A its own block, shared; B a block of the host's channel with it (the
    # host's one copy, not A's memfd), copy-on-write
    assert in_b["inode"] != in_a["inode"] and 0 not in in_a["inode"] + in_b["inode"], (in_a, in_b)
    assert "bulkhead-block" in in_b["path"][0], in_b
    assert in_b["kind"] == ["p"] and in_a["kind"] == ["s"], (in_a, in_b)


def test_a_node_that_hands_its_image_on_copies_nothing(comfyui, tmp_path):
    """#27: A's image through B's pass-through node reaches A's inspector
    as A's own block (a copy made by B would be a block of its own:
    another memfd); through A's own, B's inspector sees a block the host
    copied it into, as when it comes from A's node directly."""
    a, b = _pack(tmp_path, "e2e_pass_a", "A"), _pack(tmp_path, "e2e_pass_b", "B")
    srv = comfyui(packs=(), pack_dirs=(a, b))
    prompt = {
        "1": {"class_type": "E2EFwdMakeA", "inputs": {"value": 0.5}},
        "2": {"class_type": "E2EFwdPassB", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "E2EFwdPassA", "inputs": {"image": ["1", 0]}},
        "4": {"class_type": "E2EFwdInspectA", "inputs": {"image": ["2", 0]}},
        "5": {"class_type": "E2EFwdInspectB", "inputs": {"image": ["3", 0]}},
        "6": {"class_type": "E2EFwdInspectA", "inputs": {"image": ["1", 0]}},
    }
    entry = srv.wait_history(srv.queue(prompt))
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    via_b, via_a, direct = entry["outputs"]["4"], entry["outputs"]["5"], entry["outputs"]["6"]
    n = 512 * 512 * 3
    assert via_b["sum"] == via_a["sum"] == direct["sum"] == [0.5 * n]
    assert direct["kind"] == ["s"] and direct["inode"][0] != 0, direct
    # B handed on what it was lent: A sees its own block again, shared
    assert via_b["inode"] == direct["inode"] and via_b["kind"] == ["s"], (via_b, direct)
    # A handed on its own block: B maps the host's copy of it (not A's
    # memfd), copy-on-write, as where A's output comes to it directly
    assert via_a["inode"] != direct["inode"] and via_a["kind"] == ["p"], (via_a, direct)
