"""#36: a pack whose environment builds in the background registers its
nodes at once where they were described before (host/building.py
``early_nodes``), seen over HTTP.  A pack built and served once; a
bulkhead update that changed its protocol leaves the environment
"foreign", so the next start rebuilds it in the background (held by a
gate file: no timing).  Meanwhile /object_info lists the pack's node as
the start before did (its worker's description), and a prompt queued for
it waits for the build, then runs in the pack's worker."""

import os
import time

from .e2eenv import built_gated_pack, make_foreign, pack_state

NAME = "ComfyUI-Early"


def test_a_building_pack_has_its_nodes_from_an_earlier_description(comfyui, tmp_path):
    srv, gate, source = built_gated_pack(comfyui, tmp_path, NAME)
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EGateWhere" in info
    described = info["E2EGateWhere"]

    # another protocol's environment: rebuilt in the background, its
    # requirement's build held until the gate opens (its source touched,
    # so that the installer builds it again rather than reuse its wheel)
    env = make_foreign(srv, NAME)
    gate.unlink()
    with open(os.path.join(source, "pyproject.toml"), "a") as f:
        f.write("\n")
    srv.wait_for_builds = False
    srv.start()
    assert pack_state(srv, NAME)["state"] == "building"
    assert "1 node type(s) from an earlier build's description" in srv.log_since_start()
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and info.get("E2EGateWhere") == described

    prompt_id = srv.queue({"1": {"class_type": "E2EGateWhere", "inputs": {"n": 1}}})
    deadline = time.monotonic() + 60
    while srv.http("GET", "/queue")[1]["queue_running"] == []:     # it runs: waiting for the build
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    assert pack_state(srv, NAME)["state"] == "building"
    gate.write_text("open")
    entry = srv.wait_history(prompt_id, timeout_s=300)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    out = entry["outputs"]["1"]
    assert out["pid"][0] != srv.proc.pid and out["value"] == ["bhgate 1.0"] and out["prefix"] == [env], out
    srv.wait_built()
    assert pack_state(srv, NAME)["state"] == "isolated"
    status, info = srv.http("GET", "/object_info")
    assert info["E2EGateWhere"] == described
    assert "runs in-process" not in srv.log_since_start()
