"""#36: what a person asks of a pack from the panel (POST /bulkhead/build,
as its buttons send it) where ComfyUI's start builds nothing
(BULKHEAD_BUILD_AT_START=0), seen over HTTP.  A pack with no environment
offers Build: pressed, it builds in the background and its node joins
/object_info and runs in its worker, without a restart.  The same pack's
comfy-env.toml then changes (a Manager update that bumped its pin) and
ComfyUI restarts: nothing rebuilds it, the environment built before
serves it, isolated, and it offers Rebuild: pressed, the new environment
is built while the old one serves, and the worker's next start runs in
it, with the new pin.  The builds are local source trees (no index), their
gate open from the start."""

import os

from .e2eenv import NO_INDEX, env_config, gated_pack, gated_source, pack_state, run_gated, wait_pack_state

NAME = "ComfyUI-Asked"
ENV = dict(NO_INDEX, BULKHEAD_BUILD_AT_START="0")


def test_build_and_rebuild_asked_where_the_start_builds_nothing(comfyui, tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("open")
    pack = gated_pack(tmp_path, NAME, f'bhgate = {{ path = "{gated_source(tmp_path / "src", "1.0", gate)}" }}')
    srv = comfyui(packs=(), pack_dirs=[str(pack)], env=ENV)

    # Nothing built at start: the panel offers Build, and pressing it builds it.
    state = pack_state(srv, NAME)
    assert state["state"] != "isolated" and state["actions"] == ["build"], state
    status, body = srv.http("POST", "/bulkhead/build", {"pack": NAME, "action": "build"})
    assert status == 202 and body["pack"] == NAME, body
    state = wait_pack_state(srv, NAME, lambda s: s["state"] == "isolated" and s.get("actions"))
    assert state["actions"] == ["rebuild"], state
    assert "E2EGateWhere" in srv.http("GET", "/object_info")[1]
    pid, value, old_prefix = run_gated(srv, 1)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and old_prefix == state["env"], (value, old_prefix, state)

    # Its config changes between two starts: not rebuilt at start, the
    # old environment serves it, and the panel offers Rebuild.
    srv.stop()
    with open(os.path.join(srv.base, "custom_nodes", NAME, "comfy-env.toml"), "w") as f:
        f.write(env_config(f'bhgate = {{ path = "{gated_source(tmp_path / "src", "2.0", gate)}" }}'))
    srv.start()
    state = pack_state(srv, NAME)
    assert state["state"] == "isolated" and state["rebuild"].startswith("not rebuilt"), state
    assert state["actions"] == ["rebuild"], state
    pid, value, prefix = run_gated(srv, 2)
    assert pid != srv.proc.pid and value == "bhgate 1.0" and prefix == old_prefix

    # Rebuild pressed: the new environment is built (the old one serving
    # meanwhile), and the worker's next start runs there, with the new pin.
    status, body = srv.http("POST", "/bulkhead/build", {"pack": NAME, "action": "rebuild"})
    assert status == 202, body
    state = wait_pack_state(srv, NAME, lambda s: "building" not in s and s.get("rebuild", "").startswith("rebuilt "))
    assert state["state"] == "isolated", state
    status, _ = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})   # its idle worker stops
    assert status == 200
    pid, value, prefix = run_gated(srv, 3)
    assert pid != srv.proc.pid and value == "bhgate 2.0" and prefix != old_prefix, (value, prefix)
    assert pack_state(srv, NAME)["env"] == prefix
    assert "runs in-process" not in srv.log_since_start()
