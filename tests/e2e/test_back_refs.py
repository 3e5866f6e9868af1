"""#26 from the user's side: a prompt whose IMAGE, made by an isolated
pack's node, feeds two more nodes of that pack.  ComfyUI hands the cached
output to each; it crosses back to the worker that made it by reference
(a view of the worker's own block), so the host lends the worker no block
for it: the worker maps none of the host's."""

import textwrap

from .e2eenv import HOST_INTERPRETER_INIT as INIT

NODES = '''
import os


def _stats():
    from bulkhead import worker
    return worker._peer.channel.stats()


class MakeImage:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 0.5})}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"

    def run(self, value):
        import torch
        return (torch.full((1, 256, 256, 3), value, dtype=torch.float32),)  # 768 KiB: a block


class Measure:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",), "tag": ("STRING", {"default": "a"})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"
    CATEGORY = "bulkhead e2e"
    OUTPUT_NODE = True

    def run(self, image, tag):
        s = _stats()
        total = float(image.sum())
        return {"ui": {"sum": [total], "pid": [os.getpid()], "peer_blocks": [s["peer_blocks"]],
                       "own_blocks": [s["own_blocks"]], "tag": [tag]}, "result": (total,)}


NODE_CLASS_MAPPINGS = {"E2EBackMakeImage": MakeImage, "E2EBackMeasure": Measure}
NODE_DISPLAY_NAME_MAPPINGS = {}
'''


def test_an_image_feeds_two_nodes_of_its_pack_without_a_copy(comfyui, tmp_path):
    pack = tmp_path / "packs" / "e2e_backrefs"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(textwrap.dedent(INIT))
    (pack / "nodes.py").write_text(textwrap.dedent(NODES))
    srv = comfyui(packs=(), pack_dirs=(str(pack),))
    prompt = {
        "1": {"class_type": "E2EBackMakeImage", "inputs": {"value": 0.5}},
        "2": {"class_type": "E2EBackMeasure", "inputs": {"image": ["1", 0], "tag": "a"}},
        "3": {"class_type": "E2EBackMeasure", "inputs": {"image": ["1", 0], "tag": "b"}},
    }
    prompt_id = srv.queue(prompt)
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    a, b = entry["outputs"]["2"], entry["outputs"]["3"]
    n = 256 * 256 * 3
    assert a["sum"] == [0.5 * n] and b["sum"] == [0.5 * n]
    assert a["pid"] == b["pid"] and a["pid"][0] != srv.proc.pid
    # the image went back by reference: the host lent the worker no block
    assert a["peer_blocks"] == [0] and b["peer_blocks"] == [0], (a, b)
