"""Fail closed (#36), from the user's side: two packs whose environments
cannot be built (pip gets no index), one needing numpy<2 -- ComfyUI's
Python has numpy 2 -- and one whose requirements ComfyUI's Python meets.
By default the second runs in ComfyUI's process, which is the same as its
environment, while the first is refused: its node is listed as in-process
would list it, and a prompt using it fails at that node, over the
websocket and in /history as ComfyUI reports a node's exception, with the
reason (numpy<2 against the host's numpy) and the fix; /bulkhead/status
says "refused".  BULKHEAD_FALLBACK=in-process, the user's explicit
choice, runs it in ComfyUI's process, listed the same."""

import json
from importlib import metadata

from .e2eenv import host_config, output_node, write_pack

PACKS = {
    "ComfyUI-OldNumpy": ("E2EOldNumpy", 'numpy = "<2"\n'),
    # pytest: in ComfyUI's Python (this test's), not in the host set an environment gets
    "ComfyUI-SameNumpy": ("E2ESameNumpy", 'numpy = ">=1.20"\npytest = "*"\n'),
}


def _packs(tmp_path):
    dirs = []
    for name, (cls, deps) in PACKS.items():
        nodes = output_node(cls, {"scale": ("FLOAT", {"default": 1.5, "min": 0.0})},
                            'return {"ui": {"pid": [os.getpid()], "numpy": [numpy.__version__]}}',
                            imports="import os\nimport numpy", category="e2e/fail-closed", display=f"{cls} (e2e)")
        dirs.append(write_pack(tmp_path / "repos" / name, nodes, host_config("[pypi-dependencies]\n" + deps)))
    return dirs


def _run(srv, cls):
    """The websocket's end-of-prompt message and the /history entry of a
    prompt running one node of class cls."""
    async def session(ws, sid):
        import aiohttp  # noqa: F401
        status, answer = srv.http("POST", "/prompt", {"prompt": {"1": {"class_type": cls, "inputs": {"scale": 2.0}}},
                                                      "client_id": sid})
        assert status == 200, (answer, srv.log())
        while True:
            msg = json.loads((await ws.receive()).data)
            if msg["type"] in ("execution_error", "execution_success") and \
                    msg["data"].get("prompt_id") == answer["prompt_id"]:
                return answer["prompt_id"], msg
    prompt_id, msg = srv.run_ws(session, timeout_s=120)
    return msg, srv.wait_history(prompt_id)


def test_a_pack_unlike_the_host_is_refused_and_one_alike_falls_back(comfyui, tmp_path):
    srv = comfyui(packs=(), pack_dirs=_packs(tmp_path), env={"BULKHEAD_PIP_ARGS": "--no-index"})
    host = srv.proc.pid
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EOldNumpy" in info and "E2ESameNumpy" in info, srv.log()
    refused_info = info["E2EOldNumpy"]
    status, doc = srv.http("GET", "/bulkhead/status")
    states = {p["name"]: p for p in doc["packs"]}
    old, same = states["ComfyUI-OldNumpy"], states["ComfyUI-SameNumpy"]
    assert same["state"] == "in-process", same
    host_numpy = metadata.version("numpy")
    assert old["state"] == "refused", old
    assert "could not be built" in old["reason"] and f"numpy<2 (ComfyUI's Python has numpy {host_numpy})" \
        in old["reason"], old
    assert "bulkhead install" in old["fix"] and 'fallback = "in-process"' in old["fix"], old

    # the equivalent pack runs in ComfyUI's process
    msg, entry = _run(srv, "E2ESameNumpy")
    assert msg["type"] == "execution_success" and entry["status"]["status_str"] == "success", (msg, entry)
    assert entry["outputs"]["1"] == {"pid": [host], "numpy": [host_numpy]}, entry

    # the other fails at its node, as ComfyUI reports a node's exception
    msg, entry = _run(srv, "E2EOldNumpy")
    assert msg["type"] == "execution_error", msg
    data = msg["data"]
    assert data["node_id"] == "1" and data["node_type"] == "E2EOldNumpy", data
    text = data["exception_message"]
    assert "'ComfyUI-OldNumpy' does not run" in text and f"numpy {host_numpy}" in text and "numpy<2" in text, text
    assert "Fix: " in text and "bulkhead install" in text and 'fallback = "in-process"' in text, text
    assert entry["status"]["status_str"] == "error" and "1" not in entry["outputs"], entry
    [err] = [m for kind, m in entry["status"]["messages"] if kind == "execution_error"]
    assert err["exception_message"] == text, err

    # the user's explicit choice: in ComfyUI's process, listed the same
    srv.stop()
    srv.env["BULKHEAD_FALLBACK"] = "in-process"
    srv.start()
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and info["E2EOldNumpy"] == refused_info, (info.get("E2EOldNumpy"), refused_info)
    status, doc = srv.http("GET", "/bulkhead/status")
    assert {p["name"]: p for p in doc["packs"]}["ComfyUI-OldNumpy"]["state"] == "in-process", doc["packs"]
    msg, entry = _run(srv, "E2EOldNumpy")
    assert entry["status"]["status_str"] == "success", (msg, entry)
    assert entry["outputs"]["1"] == {"pid": [srv.proc.pid], "numpy": [host_numpy]}, entry
