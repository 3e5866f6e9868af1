"""#36: `bulkhead install <pack>` describes the pack's nodes into the node
metadata cache that ComfyUI's next start reads, so that start registers
them from the cache and starts no worker to describe them (the first
start after an install spent ~11 s there, past upstream's connect window
in some tests), and /object_info lists them exactly as a start that
described them in a worker does.  So does a pack's install.py that calls
bulkhead.install(), which ComfyUI-Manager runs with ComfyUI's Python when
it installs the pack."""

import os
import pathlib
import subprocess

from .e2eenv import CLI, host_config, start_describing, start_from_cache, unbuilt_server, write_pack

NODES = '''
import os


class E2EDescribed:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3, "min": 0}), "text": ("STRING", {"multiline": True})},
                "optional": {"mode": (["a", "b"],)}}
    RETURN_TYPES = ("INT",)
    RETURN_NAMES = ("twice",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/described"

    def run(self, n, text="", mode="a"):
        return {"ui": {"pid": [os.getpid()]}, "result": (2 * n,)}


NODE_CLASS_MAPPINGS = {"E2EDescribed": E2EDescribed}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EDescribed": "E2E described at install"}
'''


# A pack's install.py, as the Manager runs it: its own directory, ComfyUI's Python.
INSTALL_PY = '''
import os
import bulkhead
bulkhead.install(os.path.dirname(os.path.abspath(__file__)))
'''


def test_install_fills_the_metadata_cache_the_next_start_reads(comfyui, tmp_path):
    pack = write_pack(tmp_path / "repos" / "ComfyUI-Described", NODES, host_config())
    # a start that builds nothing: the pack is not isolated, nothing is described
    srv = unbuilt_server(comfyui, pack)
    srv.stop()
    cli = subprocess.run([CLI, "install", os.path.join(srv.base, "custom_nodes", "ComfyUI-Described")],
                         env=srv.env, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "ComfyUI-Described: 1 node(s) described: ComfyUI's next start registers them from the cache" in \
        cli.stdout, cli.stdout

    # the next start: isolated, its nodes from the cache, no worker started to describe them
    _, cached = start_from_cache(srv, "ComfyUI-Described", "E2EDescribed")
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EDescribed", "inputs": {"n": 1, "text": "x"}}}), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    assert entry["outputs"]["1"]["pid"][0] != srv.proc.pid

    # a start that describes them in a worker (no cache) lists the same
    assert start_describing(srv, "ComfyUI-Described", "E2EDescribed") == cached


def test_a_packs_install_py_fills_the_cache_as_the_manager_runs_it(comfyui, tmp_path):
    pack = write_pack(tmp_path / "repos" / "ComfyUI-ManagerDescribed", NODES, host_config())
    (pathlib.Path(pack) / "install.py").write_text(INSTALL_PY.lstrip("\n"))
    srv = unbuilt_server(comfyui, pack)
    srv.stop()
    # what the Manager does after it cloned the pack: `python install.py` in its directory
    here = os.path.join(srv.base, "custom_nodes", "ComfyUI-ManagerDescribed")
    run = subprocess.run([srv.python, "install.py"], cwd=here, env=srv.env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ComfyUI-ManagerDescribed: 1 node(s) described: ComfyUI's next start registers them from the " \
        "cache" in run.stderr, run.stderr[-3000:]

    _, cached = start_from_cache(srv, "ComfyUI-ManagerDescribed", "E2EDescribed")

    # a start that describes them in a worker (no cache) lists the same
    assert start_describing(srv, "ComfyUI-ManagerDescribed", "E2EDescribed") == cached

    # a pack whose nodes fail to import in its worker: installed all the same, one line says why
    broken = write_pack(os.path.join(srv.base, "custom_nodes", "ComfyUI-ManagerBroken"),
                        "raise ImportError('e2e: no such module here')\n", host_config())
    (pathlib.Path(broken) / "install.py").write_text(INSTALL_PY.lstrip("\n"))
    run = subprocess.run([srv.python, "install.py"], cwd=broken, env=srv.env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [said] = [l for l in run.stderr.splitlines() if l.startswith("ComfyUI-ManagerBroken: not described now (")]
    assert "e2e: no such module here" in said and said.endswith("ComfyUI's start describes its nodes"), said
