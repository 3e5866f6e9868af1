"""#36: the panel drives the builds, and the log says one line per phase,
seen from the user's side.  One server with four packs whose builds fail
(their requirement is a local source tree whose build backend raises),
then are fixed (their comfy-env.toml names a source that builds): Retry
over HTTP, from the panel in Chromium and `bulkhead install` each build
one again, and its nodes join /object_info and run in its worker without
a restart; "Show log" (GET /bulkhead/log, the panel's box) shows pip's
output, which ComfyUI's log does not carry; Rebuild on a built pack makes
a new build and log; a Retry and `bulkhead install` at once build the
pack once (the lock they share; a gate file holds the first, no timing);
and no line bulkhead writes in that start's log (a build's, a pack's
refusal or fallback) is longer than 200 characters."""

import os
import re
import shutil
import subprocess
import time

import pytest

from .e2eenv import CLI, NO_INDEX, env_config, gated_pack, gated_source, pack_state, run_gated, wait_pack_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

NODE = {"ComfyUI-RetryHttp": "E2ERetryHttp", "ComfyUI-RetryPanel": "E2ERetryPanel", "ComfyUI-RetryCli": "E2ERetryCli",
        "ComfyUI-RetryLock": "E2ERetryLock"}

# The node imports its requirement when its module loads: without its
# environment it cannot be imported in ComfyUI's process either, so a
# failed build leaves no node of it (state "failed") until one builds.
TOP_IMPORT = "import bhgate  # noqa: F401  (only in its environment)\n"


def _fix(srv, name, source):
    with open(os.path.join(srv.base, "custom_nodes", name, "comfy-env.toml"), "w") as f:
        f.write(env_config(f'bhgate = {{ path = "{source}" }}'))


def _run(srv, name, n):
    return run_gated(srv, n, NODE[name])[:2]


def _bulkhead_lines(text):
    return [line for line in text.splitlines() if "bulkhead" in line]


@pytest.fixture
def short_home():
    """A BULKHEAD_HOME as short as a user's (~/.local/share/bulkhead),
    not pytest's long tmp path: a failure line carries its log's path
    whole, within the 200 characters where the path is a usual one.
    Removed after the server (fixtures end in reverse order)."""
    import tempfile
    home = tempfile.mkdtemp(prefix="bh", dir="/tmp")
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _panel(srv, tmp_path, query=""):
    """The panel's DOM as Chromium renders it from the server (the
    e2e_frontend pack's page), 4 s of virtual time after it loads."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--user-data-dir=" + str(tmp_path / "chromium"), "--virtual-time-budget=4000",
             "--window-size=400,900"]
    dom = subprocess.run(flags + ["--dump-dom", srv.url + "/e2e/panel" + query], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0 and "data-bh-panel" in dom.stdout, dom.stderr[-3000:]
    return dom.stdout


def test_retry_show_log_and_rebuild(short_home, comfyui, tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("open")
    broken = gated_source(tmp_path / "broken", "9.0", gate, fail=True)
    packs = []
    for name, cls in NODE.items():
        pack = gated_pack(tmp_path, name, f'bhgate = {{ path = "{broken}" }}', cls=cls)
        nodes = pack / "nodes.py"
        nodes.write_text(TOP_IMPORT + nodes.read_text())
        packs.append(str(pack))
    srv = comfyui(packs=("e2e_frontend",), pack_dirs=packs, env=NO_INDEX, bulkhead_home=short_home)
    start_log = srv.log_since_start()

    # Each failed: its fix is a button (Retry), its build's log is kept,
    # with pip's output, which ComfyUI's log does not carry.
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and not set(NODE.values()) & set(info)
    for name in NODE:
        # (its actions once the build's thread has let it go, just after its state says failed)
        state = wait_pack_state(srv, name, lambda s: s.get("actions"))
        assert state["state"] != "isolated" and state["actions"] == ["retry"], state
        assert state["log"].startswith(os.path.join(srv.env["BULKHEAD_HOME"], "logs")), state
    status, shown = srv.http("GET", "/bulkhead/log?pack=ComfyUI-RetryHttp")
    assert status == 200 and shown["path"] == pack_state(srv, "ComfyUI-RetryHttp")["log"], shown
    assert "bhgate: this build fails on purpose" in shown["text"], shown["text"][-3000:]
    assert "fails on purpose" not in start_log
    # The log rule: one line per phase, the pack's name first; the start
    # summary one short line; a failure its first error line and the log's
    # path, no output of pip's.
    long = [line for line in _bulkhead_lines(start_log) if len(line) > 200]
    assert not long, "\n".join(long)
    phases = [line for line in start_log.splitlines() if line.startswith("[bulkhead install ")]
    assert phases and all(re.match(r"\[bulkhead install ComfyUI-Retry(Http|Panel|Cli|Lock)\] ", line) for line in phases)
    failures = [line for line in start_log.splitlines() if "building its environment failed" in line]
    assert len(failures) == len(NODE) and all(" (log: " in line and ".log)" in line for line in failures), failures

    # A request of another origin may not start a build (ComfyUI's own
    # origin check's rule); one without an Origin from this machine may.
    import urllib.error
    import urllib.request
    req = urllib.request.Request(srv.url + "/bulkhead/build", method="POST",
                                 data=b'{"pack": "ComfyUI-RetryHttp", "action": "retry"}',
                                 headers={"Content-Type": "application/json", "Origin": "http://elsewhere.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    assert refused.value.code == 403
    assert srv.http("POST", "/bulkhead/build", {"pack": "ComfyUI-Nowhere", "action": "retry"})[0] == 404
    status, answer = srv.http("GET", "/bulkhead/log?pack=ComfyUI-Nowhere")
    assert status == 404 and "no pack 'ComfyUI-Nowhere'" in answer["error"], answer

    # Retry over HTTP, once its config is fixed: built, its nodes join
    # /object_info and run in its worker, without a restart.
    good = gated_source(tmp_path / "good", "2.0", gate)
    _fix(srv, "ComfyUI-RetryHttp", good)
    status, body = srv.http("POST", "/bulkhead/build", {"pack": "ComfyUI-RetryHttp", "action": "retry"})
    assert status == 202 and body["pack"] == "ComfyUI-RetryHttp", body
    state = wait_pack_state(srv, "ComfyUI-RetryHttp", lambda s: s["state"] == "isolated" and s.get("actions"))
    assert state["actions"] == ["rebuild"], state
    status, info = srv.http("GET", "/object_info")
    assert "E2ERetryHttp" in info
    pid, value = _run(srv, "ComfyUI-RetryHttp", 1)
    assert pid != srv.proc.pid and value == "bhgate 2.0"
    status, shown = srv.http("GET", "/bulkhead/log?pack=ComfyUI-RetryHttp")
    assert status == 200 and "bhgate" in shown["text"] and "fails on purpose" not in shown["text"], shown
    first_log = shown["path"]

    # Rebuild on a built pack: a new build (its own log), still isolated.
    status, body = srv.http("POST", "/bulkhead/build", {"pack": "ComfyUI-RetryHttp", "action": "rebuild"})
    assert status == 202, body
    state = wait_pack_state(srv, "ComfyUI-RetryHttp", lambda s: "building" not in s and s["log"] != first_log)
    assert state["state"] == "isolated" and state["rebuild"].startswith("rebuilt "), state
    pid, value = _run(srv, "ComfyUI-RetryHttp", 2)
    assert pid != srv.proc.pid and value == "bhgate 2.0"

    # `bulkhead install` of a fixed pack: it says the running ComfyUI
    # picks it up, and it does.
    _fix(srv, "ComfyUI-RetryCli", good)
    cli = subprocess.run([CLI, "install", os.path.join(srv.base, "custom_nodes", "ComfyUI-RetryCli")],
                         env=srv.env, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert f"ComfyUI (bulkhead host pid {srv.proc.pid}): ComfyUI-RetryCli: picked up" in cli.stdout, cli.stdout
    wait_pack_state(srv, "ComfyUI-RetryCli", lambda s: s["state"] == "isolated")
    pid, value = _run(srv, "ComfyUI-RetryCli", 3)
    assert pid != srv.proc.pid and value == "bhgate 2.0"

    # A Retry in ComfyUI and `bulkhead install` of the same pack at once
    # build it once: the command waits for the lock the background build
    # holds (held by a gate in the requirement's build), then finds it
    # built, and says the running ComfyUI serves it already.
    gate2 = tmp_path / "gate2"
    _fix(srv, "ComfyUI-RetryLock", gated_source(tmp_path / "gated", "3.0", gate2))
    assert srv.http("POST", "/bulkhead/build", {"pack": "ComfyUI-RetryLock", "action": "retry"})[0] == 202
    state = wait_pack_state(srv, "ComfyUI-RetryLock", lambda s: str(s.get("phase")).startswith("installing "))
    logs = os.path.dirname(state["log"])
    err_path = tmp_path / "install-lock.err"
    with open(err_path, "w") as err:
        cli = subprocess.Popen([CLI, "install", os.path.join(srv.base, "custom_nodes", "ComfyUI-RetryLock")],
                               env=srv.env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 120
            while "waiting for another install of ComfyUI-RetryLock" not in err_path.read_text():
                assert cli.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.1)
            if CHROMIUM is not None:    # the panel shows the build's phase while it runs
                row = _panel(srv, tmp_path).split('data-bh-pack="ComfyUI-RetryLock"', 1)[1]
                row = row.split("data-bh-pack=", 1)[0]      # up to the next pack's row
                assert "data-bh-progress" in row and "installing 1 requirement" in row, row[:3000]
            gate2.write_text("open")
            out, _ = cli.communicate(timeout=600)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
    assert cli.returncode == 0 and "ComfyUI-RetryLock: ready" in out, (out, err_path.read_text()[-3000:])
    # (the host may still be serving it, its build done, when the command asks)
    assert "ComfyUI-RetryLock: isolated in it already" in out or "ComfyUI-RetryLock: being built here" in out, out
    wait_pack_state(srv, "ComfyUI-RetryLock", lambda s: s["state"] == "isolated")
    assert os.listdir(logs) == [os.path.basename(state["log"])], os.listdir(logs)   # one build, the host's
    pid, value = _run(srv, "ComfyUI-RetryLock", 5)
    assert pid != srv.proc.pid and value == "bhgate 3.0"

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (`make chromium`): the panel's buttons are not driven")
    # The panel: Retry pressed in Chromium builds it; Show log shows pip's output.
    _fix(srv, "ComfyUI-RetryPanel", good)
    dom = _panel(srv, tmp_path, "?act=ComfyUI-RetryPanel:retry:1500")
    assert 'data-acted="yes"' in dom, dom[-3000:]
    wait_pack_state(srv, "ComfyUI-RetryPanel", lambda s: s["state"] == "isolated")
    assert "E2ERetryPanel" in srv.http("GET", "/object_info")[1]
    pid, value = _run(srv, "ComfyUI-RetryPanel", 4)
    assert pid != srv.proc.pid and value == "bhgate 2.0"
    dom = _panel(srv, tmp_path, "?act=ComfyUI-RetryPanel:log:1500")
    assert 'data-acted="yes"' in dom, dom[-3000:]
    box = dom[dom.index("data-bh-log="):]
    log_path = pack_state(srv, "ComfyUI-RetryPanel")["log"]
    assert log_path in box and "bhgate" in box[box.index("data-bh-log-text"):], box[:3000]
    # its path is shown whole, and every pack's row offers its fix as a button
    assert 'data-bh-action="rebuild" data-pack="ComfyUI-RetryPanel"' in dom
