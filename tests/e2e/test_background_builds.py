"""#36: ComfyUI is up at once, and updates rebuild themselves, seen over
HTTP.  A pack copied into custom_nodes/ whose environment is not built:
the server answers while the environment builds in the background, the
pack's nodes join /object_info when it is built, and a prompt queued
meanwhile waits for it, then runs in the pack's worker.  A pack whose
comfy-env.toml changed between two starts (a Manager update that bumped
a pin): the environment built before serves it at once, the new one
after its background build, and a rebuild that fails leaves the old one
serving.  The builds are held deterministically: the pack's requirement
is a local source tree whose build backend waits for a gate file the test
creates (no timing)."""

import os
import threading
import time

from .e2eenv import (NO_INDEX, built_gated_pack, env_config, gated_pack, gated_source, make_foreign, pack_state,
                     run_gated, wait_pack_state)


def _wait_log(srv, text, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while text not in srv.log_since_start():
        assert time.monotonic() < deadline, f"{text!r} not in the server's log:\n{srv.log()}"
        time.sleep(0.05)


def test_the_server_is_up_while_packs_build(comfyui, tmp_path):
    """Two packs build side by side, held by one gate: one builds, the
    other's build fails.  A prompt queued meanwhile for the first waits
    and runs in its worker; one that also names the second's node is
    refused at that node with the build's error and the fix."""
    gate = tmp_path / "gate"
    good = gated_pack(tmp_path, "ComfyUI-Gated",
                      f'bhgate = {{ path = "{gated_source(tmp_path / "src", "1.0", gate)}" }}')
    bad = gated_pack(tmp_path, "ComfyUI-GatedBad",
                     f'bhgate = {{ path = "{gated_source(tmp_path / "bad", "9.0", gate, True)}" }}', cls="E2EGateBad")
    srv = comfyui(packs=(), pack_dirs=[str(good), str(bad)], env=NO_INDEX, wait_built=False)
    # stopped while they build: the builds' processes end with the server
    # (stop() checks none is left), and the next start builds them again
    assert pack_state(srv, "ComfyUI-Gated")["state"] == "building"
    srv.stop()
    srv.start()
    assert "is not retried at start" not in srv.log_since_start()
    # the builds wait for the gate: the packs are building, the server answers
    for name in ("ComfyUI-Gated", "ComfyUI-GatedBad"):
        state = pack_state(srv, name)
        assert state["state"] == "building" and state["phase"], state
    status, stats = srv.http("GET", "/system_stats")
    assert status == 200 and "system" in stats, stats
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EGateWhere" not in info and "E2EGateBad" not in info
    assert "2 building in the background (ComfyUI-Gated, ComfyUI-GatedBad" in srv.log_since_start()
    if (os.cpu_count() or 1) >= 2:
        # side by side: both have left the queue while the gate holds each
        deadline = time.monotonic() + 120
        while any(pack_state(srv, n)["phase"].startswith("queued") for n in ("ComfyUI-Gated", "ComfyUI-GatedBad")):
            assert time.monotonic() < deadline, [pack_state(srv, n) for n in ("ComfyUI-Gated", "ComfyUI-GatedBad")]
            time.sleep(0.1)
    # prompts queued meanwhile wait for the builds
    answers = {}

    def post(key, prompt):
        answers[key] = srv.http("POST", "/prompt", {"prompt": prompt}, timeout=600)
    threads = [threading.Thread(target=post, args=("good", {"1": {"class_type": "E2EGateWhere", "inputs": {"n": 1}}})),
               threading.Thread(target=post, args=("both", {"1": {"class_type": "E2EGateWhere", "inputs": {"n": 2}},
                                                            "2": {"class_type": "E2EGateBad", "inputs": {"n": 2}}}))]
    threads[0].start()
    _wait_log(srv, "it waits for them, then ComfyUI validates it")
    threads[1].start()
    deadline = time.monotonic() + 120
    while srv.log_since_start().count("it waits for them, then ComfyUI validates it") < 2:
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    assert srv.http("GET", "/system_stats")[0] == 200     # the loop is free while the prompts wait
    gate.write_text("open")
    for t in threads:
        t.join(600)
    status, body = answers["good"]
    assert status == 200, (body, srv.log())
    entry = srv.wait_history(body["prompt_id"], timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    out = entry["outputs"]["1"]
    assert out["pid"][0] != srv.proc.pid and out["value"] == ["bhgate 1.0"], out
    # the prompt naming the failed pack's node is refused at that node, never run in-process
    status, body = answers["both"]
    assert status == 400 and list(body["node_errors"]) == ["2"], (status, body)
    [error] = body["node_errors"]["2"]["errors"]
    assert "'ComfyUI-GatedBad' could not be built" in error["message"], error
    assert "bulkhead install" in error["details"], error
    # pip's output is in the build's log file (the panel's Show log), not ComfyUI's log
    status, shown = srv.http("GET", "/bulkhead/log?pack=ComfyUI-GatedBad")
    assert status == 200 and "fails on purpose" in shown["text"], shown
    assert "fails on purpose" not in srv.log_since_start()
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EGateWhere" in info
    state = pack_state(srv, "ComfyUI-Gated")
    assert state["state"] == "isolated" and state["pid"] == out["pid"][0], state
    assert pack_state(srv, "ComfyUI-GatedBad")["state"] != "building"
    assert "background builds done: " in srv.log_since_start()


def test_a_changed_config_is_rebuilt_while_the_old_environment_serves(comfyui, tmp_path):
    srv, gate, _ = built_gated_pack(comfyui, tmp_path, "ComfyUI-Update")
    pid, value, old_prefix = run_gated(srv, 1)
    assert pid != srv.proc.pid and value == "bhgate 1.0"
    config = os.path.join(srv.base, "custom_nodes", "ComfyUI-Update", "comfy-env.toml")

    # a rebuild that fails: the old environment keeps serving, and says so
    srv.stop()
    with open(config, "w") as f:
        f.write(env_config('bh-nowhere-to-be-found = "*"'))
    srv.wait_for_builds = False
    srv.start()
    pid, value, prefix = run_gated(srv, 2)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and prefix == old_prefix
    srv.wait_built()
    wait_pack_state(srv, "ComfyUI-Update", lambda s: s.get("rebuild", "").startswith("failed"))
    state = pack_state(srv, "ComfyUI-Update")
    assert state["state"] == "isolated" and "bh-nowhere-to-be-found" in state["rebuild"], state
    assert "bulkhead install" in state["rebuild"], state
    assert "keeps serving it, isolated with its old requirements" in srv.log_since_start()
    pid, value, prefix = run_gated(srv, 3)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and prefix == old_prefix
    assert "runs in-process" not in srv.log_since_start()

    # an update that builds: the old environment serves until the new one is built
    srv.stop()
    gate.unlink()
    v2 = gated_source(tmp_path / "src", "2.0", gate)
    with open(config, "w") as f:
        f.write(env_config(f'bhgate = {{ path = "{v2}" }}'))
    srv.start()
    pid, value, prefix = run_gated(srv, 4)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and prefix == old_prefix
    assert "rebuilding" in pack_state(srv, "ComfyUI-Update")["rebuild"]
    gate.write_text("open")
    srv.wait_built()
    wait_pack_state(srv, "ComfyUI-Update", lambda s: s.get("rebuild", "").startswith("built"))
    # the worker's next start runs in the new environment (ComfyUI's
    # "Free model and node cache" stops the idle worker)
    status, _ = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    pid, value, prefix = run_gated(srv, 5)
    assert pid != srv.proc.pid and value == "bhgate 2.0" and prefix != old_prefix, (value, prefix)
    state = pack_state(srv, "ComfyUI-Update")
    assert state["state"] == "isolated" and state["env"] == prefix, state
    assert "runs in-process" not in srv.log_since_start()


def test_an_environment_of_another_protocol_is_rebuilt_in_the_background(comfyui, tmp_path):
    """A bulkhead update that changed its protocol leaves each environment
    "foreign": ComfyUI's start rebuilds it in the background, as a
    missing one, rather than run the pack in its process."""
    srv, _, _ = built_gated_pack(comfyui, tmp_path, "ComfyUI-Proto")
    env = make_foreign(srv, "ComfyUI-Proto")
    srv.start()
    log = srv.log_since_start()
    assert "its environment is foreign" in log and "building it in the background" in log, log
    pid, value, prefix = run_gated(srv, 1)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and prefix == env
    assert "runs in-process" not in srv.log_since_start()
