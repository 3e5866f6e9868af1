"""bulkhead.comfy_pack: the one call a pack's __init__.py makes.  Config ->
environment -> proxy nodes in a worker under the host's memory budget, and
every fallback case with its one warning.  Each case runs in a fresh host
(tests/comfyui, or COMFYUI_PATH) through comfyenv."""

import textwrap

import pytest

from nodepacks import COMFY_PACK_INIT, HOST_VERSION, run_host

pytestmark = pytest.mark.torch

NODES = '''
import os

class WhereAmI:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"x": ("INT", {"default": 1})}}
    RETURN_TYPES = ("INT", "INT")
    RETURN_NAMES = ("pid", "doubled")
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, x):
        return (os.getpid(), 2 * x)

NODE_CLASS_MAPPINGS = {"WhereAmI": WhereAmI}
NODE_DISPLAY_NAME_MAPPINGS = {"WhereAmI": "Where am I"}
'''



def make_pack(root, name, config):
    d = root / name
    d.mkdir()
    (d / "__init__.py").write_text(COMFY_PACK_INIT)
    (d / "nodes.py").write_text(NODES)
    if config is not None:
        (d / "comfy-env.toml").write_text(textwrap.dedent(config))
    return d


@pytest.mark.parametrize("built", ["by bulkhead install", "at start"])
def test_isolated_pack_runs_in_a_worker_under_the_memory_budget(tmp_path, built):
    """Built by `bulkhead install` first, or (a pack just cloned into
    custom_nodes/) by ComfyUI's start itself, with its progress logged."""
    pack = make_pack(tmp_path, "iso_pack", f'python = "{HOST_VERSION}"\n')
    r = run_host(tmp_path, pack, f"""
        import io
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
        if {built!r} == "by bulkhead install":
            bulkhead.install(PACK, progress=lambda line: None)
        mod = load(PACK)
        statuses = bulkhead.install(PACK, progress=lambda line: None)
        cls = mod.NODE_CLASS_MAPPINGS["WhereAmI"]
        pid, doubled = getattr(cls(), cls.FUNCTION)(x=21)
        hm = bulkhead.host_memory()
        rec = hm.ledger.read(pid)
        emit(dict(state=statuses[0].state, me=os.getpid(), pid=pid, doubled=doubled,
                  role=rec and rec["role"], host_pid=rec and rec["host_pid"], pack=rec and rec["pack"],
                  display=mod.NODE_DISPLAY_NAME_MAPPINGS, log=buf.getvalue()))
        from bulkhead.host import nodes
        nodes.close_all()
        hm.close()
    """)
    assert r["state"] == "ready"
    building = [line for line in r["log"].splitlines() if "building it now" in line]
    if built == "at start":
        assert len(building) == 1 and "iso_pack" in building[0] and "BULKHEAD_BUILD_AT_START=0" in building[0]
        assert any(line.startswith("[bulkhead install iso_pack] ") for line in r["log"].splitlines()), r["log"]
        assert any("environment built in" in line for line in r["log"].splitlines())
    else:
        assert building == [], r["log"]
    assert r["pid"] != r["me"] and r["doubled"] == 42
    assert r["role"] == "worker" and r["host_pid"] == r["me"] and r["pack"] == "iso_pack"
    assert r["display"] == {"WhereAmI": "Where am I"}


@pytest.mark.parametrize("case, config, edit, expect", [
    ("no config", None, None, "has no comfy-env.toml"),
    ("not built", f'python = "{HOST_VERSION}"\n', None, "environment is not built"),   # BULKHEAD_BUILD_AT_START=0
])
def test_fallbacks_warn_once_and_import_in_process(tmp_path, case, config, edit, expect):
    pack = make_pack(tmp_path, "fb_pack", config)
    r = run_host(tmp_path, pack, f"""
        if {case!r} == "stale":
            bulkhead.install(PACK, progress=lambda line: None)
            open(os.path.join(PACK, "comfy-env.toml"), "w").write({edit!r})
        import io, contextlib
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        logging.getLogger().addHandler(handler)
        mod = load(PACK)
        load(PACK)  # a second import warns no more
        cls = mod.NODE_CLASS_MAPPINGS["WhereAmI"]
        pid, _ = getattr(cls(), cls.FUNCTION)(x=1)
        from bulkhead.host import states
        emit(dict(me=os.getpid(), pid=pid, log=buf.getvalue(), states=states.pack_states()))
    """, env={"not built": {"BULKHEAD_BUILD_AT_START": "0"},
              "not buildable": {"BULKHEAD_PIP_ARGS": "--no-index"}}.get(case))
    assert r["pid"] == r["me"]  # in-process
    warnings = [l for l in r["log"].splitlines() if "runs in-process, NOT isolated" in l]
    assert len(warnings) == 1, r["log"]
    # one line (#36): the name first, the short reason, where the whole reason and the fix are
    assert warnings[0].startswith("bulkhead: pack 'fb_pack' ") and len(warnings[0]) <= 200, warnings[0]
    assert expect in warnings[0] and "`bulkhead status`" in warnings[0], warnings[0]
    [state] = r["states"]
    assert expect in state["reason"] and "bulkhead install" in state["fix"], state


@pytest.mark.parametrize("case, config, expect, unlike", [
    ("not buildable", f'python = "{HOST_VERSION}"\nrequirements = ["bh-no-such-dist==3"]\n',
     "building it at start failed", "bh-no-such-dist==3 (not installed in ComfyUI's Python)"),  # --no-index
    ("invalid", "python = \n", "comfy-env.toml is invalid", "what it requires is not known"),
])
def test_a_pack_unlike_the_host_is_refused_not_run_in_process(tmp_path, case, config, expect, unlike):
    """#36 fail closed: a pack that cannot run isolated, and whose
    environment ComfyUI's process is not the same as (a requirement the
    host lacks; a config that cannot be read), is imported for its node
    definitions only: its nodes are those in-process would list, and
    running one raises the reason and the fix, with one warning; the
    explicit BULKHEAD_FALLBACK=in-process runs it in-process."""
    pack = make_pack(tmp_path, "fb_pack", config)
    code = """
        import io
        buf = io.StringIO()
        logging.getLogger().addHandler(logging.StreamHandler(buf))
        mod = load(PACK)
        load(PACK)  # a second import warns no more
        cls = mod.NODE_CLASS_MAPPINGS["WhereAmI"]
        try:
            pid, _ = getattr(cls(), cls.FUNCTION)(x=1)
            error = None
        except Exception as e:
            pid, error = None, f"{type(e).__name__}: {e}"
        from bulkhead.host import states
        emit(dict(me=os.getpid(), pid=pid, error=error, log=buf.getvalue(), display=mod.NODE_DISPLAY_NAME_MAPPINGS,
                  inputs=cls.INPUT_TYPES(), states=[s["state"] for s in states.pack_states()]))
    """
    env = {"BULKHEAD_PIP_ARGS": "--no-index"}
    r = run_host(tmp_path, pack, code, env=env)
    warnings = [l for l in r["log"].splitlines() if "is refused, NOT run" in l]
    assert len(warnings) == 1 and expect in warnings[0] and len(warnings[0]) <= 200, r["log"]
    assert unlike in r["error"], r["error"]     # the whole reason: the node's error, the pack's state
    assert r["pid"] is None and r["error"].startswith("PackRefused: bulkhead: pack 'fb_pack' does not run"), r
    assert expect in r["error"] and unlike in r["error"] and "Fix: " in r["error"], r["error"]
    assert 'fallback = "in-process"' in r["error"] and "bulkhead install" in r["error"], r["error"]
    assert r["states"] == ["refused"], r
    chosen = run_host(tmp_path, pack, code, env=dict(env, BULKHEAD_FALLBACK="in-process"))
    assert chosen["pid"] == chosen["me"] and chosen["states"] == ["in-process"], chosen
    assert (chosen["display"], chosen["inputs"]) == (r["display"], r["inputs"])


def test_a_build_at_import_logs_one_short_line_per_phase(tmp_path):
    """#36 logs a person reads: outside ComfyUI's server (a script
    importing a pack) a missing environment is built there and then, its
    progress one short line per phase as a background build's, and its
    failure one line: the first error line and the build log's path.  The
    installer's own output is in that log file only: of the build's lines
    in the log, only bulkhead's "installing" phase names the requirement
    (the installer's lines about it, several, are in the file)."""
    import shutil
    import tempfile
    pack = make_pack(tmp_path, "fb_pack", f'python = "{HOST_VERSION}"\nrequirements = ["bh-no-such-dist==3"]\n')
    # a home as short as a user's (~/.local/share/bulkhead): the failure
    # line carries its log's path whole, within 200 characters there
    home = tempfile.mkdtemp(prefix="bh", dir="/tmp")
    try:
        r = run_host(tmp_path, pack, """
            import io
            buf = io.StringIO()
            logging.getLogger().addHandler(logging.StreamHandler(buf))
            logging.getLogger().setLevel(logging.INFO)
            load(PACK)
            emit(dict(log=buf.getvalue()))
        """, env={"BULKHEAD_PIP_ARGS": "--no-index", "BULKHEAD_HOME": home})
        lines = [line for line in r["log"].splitlines() if "bulkhead" in line]
        assert not [line for line in lines if len(line) > 200], r["log"]
        [failed] = [line for line in lines if "building its environment failed: " in line]
        assert failed.startswith("bulkhead: pack 'fb_pack': ") and failed.endswith(".log)"), failed
        with open(failed[failed.index(" (log: ") + 7:-1]) as f:
            whole = f.read()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    named = [line for line in lines if line.startswith("[bulkhead install fb_pack] ") and "bh-no-such-dist" in line]
    assert len(named) == 1 and "installing 1 requirement(s): bh-no-such-dist==3" in named[0], r["log"]
    assert whole.count("bh-no-such-dist") > 2, whole     # the installing line, the installer's, FAILED


def test_a_changed_config_keeps_the_environment_built_before(tmp_path):
    """#36: a pack whose comfy-env.toml changed since its environment was
    built (a Manager update that bumped a pin) is not run in-process: the
    environment built before serves it, isolated, with one warning naming
    the fix.  Outside ComfyUI's server (here) nothing rebuilds it; there a
    background build does (tests/e2e/test_background_builds.py).  Once
    `bulkhead install` built the new one, the worker's next start runs
    there."""
    pack = make_pack(tmp_path, "upd_pack", f'python = "{HOST_VERSION}"\n')
    r = run_host(tmp_path, pack, f"""
        bulkhead.install(PACK, progress=lambda line: None)
        from bulkhead.host import pack as hpack
        built = bulkhead.env_status(hpack.load_config(os.path.join(PACK, "comfy-env.toml"), PACK))
        with open(os.path.join(PACK, "comfy-env.toml"), "w") as f:
            f.write('python = "{HOST_VERSION}"\\nrequirements = ["psutil"]\\n')
        import io
        buf = io.StringIO()
        logging.getLogger().addHandler(logging.StreamHandler(buf))
        mod = load(PACK)
        cls = mod.NODE_CLASS_MAPPINGS["WhereAmI"]
        pid, _ = getattr(cls(), cls.FUNCTION)(x=1)
        from bulkhead.host import nodes, states
        [state] = states.pack_states()
        # `bulkhead install` builds the new one while this host serves the
        # old one (its worker stopped: the old one may then be removed);
        # the worker's next start runs in the new one
        nodes.close_all()
        from bulkhead.host import zygote
        zygote.close_all()
        [new] = bulkhead.install(PACK, progress=lambda line: None, pip_args=["--no-index"])
        old_removed = not os.path.exists(built.python)
        pid2, _ = getattr(cls(), cls.FUNCTION)(x=2)
        [after] = states.pack_states()
        emit(dict(me=os.getpid(), pid=pid, log=buf.getvalue(), state=state, built=built.python,
                  new=new.python, pid2=pid2, after=after, old_removed=old_removed))
        nodes.close_all()
    """)
    assert r["pid"] != r["me"], r["log"]        # isolated, in the environment built before
    assert r["state"]["state"] == "isolated" and r["state"]["python"] == r["built"], r["state"]
    assert "bulkhead install" in r["state"]["rebuild"], r["state"]
    [line] = [l for l in r["log"].splitlines() if "is isolated with its old requirements, NOT rebuilt" in l]
    assert "changed since" in line and len(line) <= 200, line
    assert "runs in-process" not in r["log"], r["log"]
    assert r["new"] != r["built"] and r["pid2"] not in (r["me"], r["pid"]), r
    assert r["old_removed"], r     # no process ran there: the install removed it
    assert r["after"]["python"] == r["new"], r["after"]


def test_the_drain_runs_only_off_the_server_loop(monkeypatch, tmp_path):
    # PackRuntime.drain reconciles current_loaded_models, which ComfyUI's execution
    # thread walks: never from the web server's loop (VALIDATE_INPUTS runs
    # there); the execution thread's own loop (upstream wraps each prompt in
    # asyncio.run) is not the server's.
    import asyncio
    import sys
    import threading
    import types
    from bulkhead.host import runtime
    from bulkhead.host.runtime import PackRuntime

    calls = []
    hm = types.SimpleNamespace(reconcile=lambda called: calls.append((threading.current_thread().name, called)),
                               attach=lambda worker: None)
    drain = PackRuntime(str(tmp_path), sys.executable, "drain-pack", {}, {}, str(tmp_path), memory=hm).drain
    w = object()  # the worker whose call ended: the drain reconciles it in full

    async def on_loop():
        drain(w)
    server_loop = asyncio.new_event_loop()
    fake = types.ModuleType("server")
    fake.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(loop=server_loop))
    monkeypatch.setitem(sys.modules, "server", fake)
    try:
        server_loop.run_until_complete(on_loop())      # the server's loop: no drain
        assert calls == []
        t = threading.Thread(target=lambda: asyncio.run(on_loop()), name="prompt_worker")
        t.start()
        t.join()
        drain(w)                                       # no loop at all
        assert calls == [("prompt_worker", w), (threading.current_thread().name, w)]
        monkeypatch.delitem(sys.modules, "server")     # no PromptServer: the main thread's loop is the server's
        asyncio.run(on_loop())
        assert len(calls) == 2 and not runtime.on_server_loop()
    finally:
        server_loop.close()
