"""A pack's ``[settings] isolate`` in its ``comfy-env-root.toml``
(comfy-env 0.2.40-0.4.24's per-pack switch), from the user's side: a
ComfyUI host loads a ``register_nodes`` pack, and whether its nodes run
isolated is what comfy-env's own code decides for that file and the
user's COMFY_ENV_ISOLATE (settings.resolve_bool over the release's
load_config, run here from the wheel PyPI serves: the oracle); in
ComfyUI's process it is said once, and its state says why and the fix.
"""

import json
import os

import pytest

import bulkhead
from bulkhead.envs import rootconfig
from localsources import write
from test_comfy_env import HOST_MM, host, node_module
from test_comfy_env_names import releases, run_release  # noqa: F401  (releases: a fixture)

RELEASE = "0.4.22"      # the newest PyPI serves that still reads [settings] (0.4.25 removed it)

RUN = """
    import importlib
    from bulkhead.host import states
    cls = mods["ComfyUI-Setting"].NODE_CLASS_MAPPINGS["SettingNode"]
    real = importlib.import_module("ComfyUI-Setting.nodes").SettingNode      # the pack's own class
    emit(dict(me=os.getpid(), proxy="_bulkhead_pack" in vars(cls), got=run("ComfyUI-Setting", "SettingNode", x=3),
              own=list(getattr(real(), real.FUNCTION)(x=3)),
              states=[s for s in states.pack_states() if s["name"].startswith("ComfyUI-Setting")],
              log=buf.getvalue()))
"""


def release_isolates(tmp_path, releases, root_file, env):
    """comfy-env's answer: its resolve_bool("COMFY_ENV_ISOLATE", ...) over
    the [settings] its own load_config read from root_file."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run_release(tmp_path, releases[RELEASE], f"""
            from comfy_env.config import load_config
            from comfy_env.settings import resolve_bool, GENERAL_DEFAULTS
            c = load_config({root_file!r})
            print(json.dumps(resolve_bool("COMFY_ENV_ISOLATE", c.settings or None,
                                          GENERAL_DEFAULTS["COMFY_ENV_ISOLATE"])))
        """)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.torch
@pytest.mark.parametrize("setting, env", [
    ("isolate = false", {}),
    ("isolate = true", {"COMFY_ENV_ISOLATE": "0"}),
    ('isolate = "false"', {}),
], ids=["false", "true-over-the-users-switch", "quoted-false"])
def test_settings_isolate_runs_the_pack_as_comfy_env_did(tmp_path, releases, monkeypatch, setting, env):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    pack = tmp_path / "ComfyUI-Setting"
    root_file = write(pack / "comfy-env-root.toml", f"[settings]\n{setting}\n")
    write(pack / "__init__.py", "from comfy_env import register_nodes\n"
                                "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()\n")
    write(pack / "nodes" / "__init__.py", node_module("SettingNode", "x * 2"))
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    isolates = release_isolates(tmp_path, releases, root_file, env)
    [st] = bulkhead.install(str(pack), progress=lambda l: None)
    assert st.ok, st
    r = host(tmp_path, [pack], RUN, env=dict(env, BULKHEAD_BUILD_AT_START="0"))
    assert r["got"][1] == r["own"][1] == 6
    assert r["proxy"] == isolates, (isolates, r["log"][-3000:])
    assert (r["got"][0] != r["me"]) == isolates, r
    said = [l for l in r["log"].splitlines() if "[settings]" in l and "isolate" in l]
    if isolates:
        assert all(s["state"] != "in-process" for s in r["states"]), r["states"]
        if env:
            assert len(said) == 1 and "runs isolated although COMFY_ENV_ISOLATE=0 is set" in said[0], said
        else:
            assert said == [], said
    else:
        [s] = r["states"]
        assert s["state"] == "in-process" and "[settings] isolate = false" in s["reason"], s
        assert f"remove isolate = false from [settings] in {root_file}" in s["fix"], s
        assert len(said) == 1 and "NOT isolated" in said[0] and f"{root_file}:2" in said[0], said


def test_a_settings_value_that_is_no_boolean_is_noted_with_what_it_was_read_as(tmp_path):
    write(tmp_path / "p" / "comfy-env-root.toml", '[settings]\nisolate = "false"\nauto_install = true\nisolat = 1\n')
    r = rootconfig.load_root(tmp_path / "p", warn=False)
    assert r.isolate is True and r.isolate_where.endswith("comfy-env-root.toml:2"), r
    notes = "\n".join(r.warnings)
    assert "comfy-env-root.toml:2: [settings] isolate = 'false' is not true or false: comfy-env read it as True" \
        in notes and "write isolate = false (no quotes)" in notes, notes
    assert "comfy-env-root.toml:3: [settings] auto_install is not read: bulkhead builds" in notes, notes
    assert "comfy-env-root.toml:4: [settings] isolat is not read (did you mean 'isolate'?)" in notes, notes
    json.dumps(r.warnings)
