"""#25: deleting bulkhead's custom node folder (ComfyUI-Manager's
Uninstall) turns bulkhead off at the next start, though its package stays
installed in ComfyUI's Python: a pack that calls `bulkhead.comfy_pack`
runs in-process with one line naming why and the fix, or, where its
`[bulkhead] fallback = "error"`, loads no nodes; nothing of bulkhead's
goes on ComfyUI's server and no worker starts.  Driven over HTTP."""

import os
import shutil

import psutil

from .e2eenv import host_config, output_node, write_pack


def _pack(root, name, cls, extra=""):
    nodes = output_node(cls, {"n": ("INT", {"default": 1})}, 'return {"ui": {"pid": [os.getpid()]}}',
                        category="e2e/uninstall")
    return write_pack(root / name, nodes, host_config(extra))


def _pid_of(srv, cls):
    entry = srv.wait_history(srv.queue({"1": {"class_type": cls, "inputs": {"n": 1}}}), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    return entry["outputs"]["1"]["pid"][0]


def test_deleting_the_custom_node_turns_bulkhead_off(comfyui, tmp_path):
    lax = _pack(tmp_path / "repos", "lax_pack", "E2EUninstLax")
    strict = _pack(tmp_path / "repos", "strict_pack", "E2EUninstStrict", '[bulkhead]\nfallback = "error"\n')
    srv = comfyui(packs=(), pack_dirs=[lax], env={"BULKHEAD_PIP_ARGS": "--no-index"})
    # installed: the pack runs isolated, its environment built at start
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200 and [(p["name"], p["state"]) for p in doc["packs"]] == [("lax_pack", "isolated")], \
        (doc, srv.log())
    assert _pid_of(srv, "E2EUninstLax") != srv.proc.pid

    # the Manager's Uninstall: the folder goes; the package stays installed (on PYTHONPATH here)
    srv.stop()
    custom = os.path.join(srv.base, "custom_nodes")
    shutil.rmtree(os.path.join(custom, "bulkhead"))
    shutil.copytree(strict, os.path.join(custom, "strict_pack"))
    srv.start()
    log = srv.log_since_start()
    assert "(IMPORT FAILED)" not in log, log

    # one line for the pack: why, and the fix
    [line] = [l for l in log.splitlines() if "pack 'lax_pack'" in l]
    assert "runs in-process, NOT isolated: bulkhead's custom node is not in ComfyUI's custom_nodes" in line, line
    assert len(line) <= 200 and "reinstall bulkhead's custom node" in line, line   # one short line (#36)
    # its fallback = "error": no nodes, one error line
    [err] = [l for l in log.splitlines() if "pack 'strict_pack'" in l]
    assert "is NOT loaded" in err and 'its [bulkhead] fallback = "error"' in err and len(err) <= 200, err
    assert "reinstall bulkhead's custom node" in err, err
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EUninstLax" in info and "E2EUninstStrict" not in info
    status, _ = srv.http("POST", "/prompt", {"prompt": {"1": {"class_type": "E2EUninstStrict",
                                                              "inputs": {"n": 1}}}})
    assert status == 400

    # the pack runs in ComfyUI's own process; nothing of bulkhead's is on the server
    assert _pid_of(srv, "E2EUninstLax") == srv.proc.pid
    assert srv.http("GET", "/bulkhead/status")[0] == 404
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200 and not (isinstance(body, dict) and "bulkhead" in body), body
    assert psutil.Process(srv.proc.pid).children(recursive=True) == []
    assert not [l for l in log.splitlines() if "bulkhead" in l and "isolated" in l and "s loading them" in l]
