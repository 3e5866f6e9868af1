"""An isolated pack's sandbox from the user's side (host/sandbox.py): the
probe pack (packs/e2e_sandbox) tries each escape -- ~/.bashrc, ~/.ssh,
ComfyUI's code, another pack's folder and environment, bulkhead's
installation, signals and ptrace to ComfyUI and to another worker, an
abstract Unix socket outside the sandbox, TCP
with the network off -- and each action a pack needs (its own folder,
models, output, temp, a model cache, the network), in its worker and in a
grandchild the worker starts.  The real answer is the same probe where
the kernel has no Landlock (simulated: BULKHEAD_SANDBOX_NO_LANDLOCK=1),
which runs it unsandboxed: there every attempt succeeds, so the probe
can tell; sandboxed, each escape is refused with PermissionError and each
allowed action still works, under a zygote-forked worker (network off)
and a spawned one (network on).  `required` on such a kernel refuses to
start the worker, naming why."""

import json
import os
import socket
import subprocess

import pytest

from .e2eenv import BUILD_PY, CLI

ESCAPES = ("write ~/.bashrc", "read ~/.ssh/id_ed25519", "write ComfyUI's code", "write another pack's folder",
           "write another pack's env", "read another pack's env", "write bulkhead's package",
           "write bulkhead's custom node", "kill ComfyUI", "kill another worker", "ptrace ComfyUI",
           "ptrace another worker", "connect an abstract socket outside")
ALLOWED = ("write own folder", "write models", "write output", "write ComfyUI's temp", "write tmp",
           "write a model cache", "read ComfyUI's code")


@pytest.fixture
def home(tmp_path):
    """A fake home for the server: a shell rc file, an ssh key, and
    another pack's environment outside ComfyUI."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".bashrc").write_text("# rc\n")
    (h / ".ssh" / "id_ed25519").write_text("not a key\n")
    other_env = tmp_path / "other-env"
    other_env.mkdir()
    (other_env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return h, other_env


def _probe(srv, home, other_env, port, abstract):
    """Starts e2e_pack's worker (another worker), writes the probe's
    targets and runs it: {"worker": {...}, "grandchild": {...}}."""
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "x", "times": 1}}}))
    assert entry["status"]["status_str"] == "success", srv.log()
    other_pid = entry["outputs"]["1"]["pid"][0]
    custom = os.path.join(srv.base, "custom_nodes")
    targets = {"home": str(home), "comfy_code": srv.base, "other_pack": os.path.join(custom, "e2e_pack"),
               "other_env": str(other_env), "bulkhead_pkg": os.path.join(os.path.realpath(BUILD_PY), "bulkhead"),
               "bulkhead_node": os.path.join(custom, "bulkhead"), "host_pid": srv.proc.pid, "other_pid": other_pid,
               "own_dir": os.path.join(custom, "e2e_sandbox"), "models": os.path.join(srv.base, "models"),
               "output": os.path.join(srv.base, "output"), "comfy_temp": os.path.join(srv.base, "temp"),
               "port": port, "abstract": abstract}
    with open(os.path.join(custom, "e2e_sandbox", "targets.json"), "w") as f:
        json.dump(targets, f)
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2ESandboxProbe", "inputs": {"run": 1}}}))
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    return json.loads(entry["outputs"]["1"]["text"][0])


def test_an_isolated_pack_is_sandboxed(comfyui, home, tmp_path):
    fake_home, other_env = home
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    abstract = f"bh-e2e-sandbox-{os.getpid()}-{port}"      # an abstract Unix socket of this process's
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    outside.bind("\0" + abstract)
    outside.listen(8)
    base_env = {"HOME": str(fake_home), "XDG_CACHE_HOME": "", "HF_HOME": "", "TORCH_HOME": "",
                "BULKHEAD_SANDBOX": "", "BULKHEAD_NETWORK": ""}
    try:
        # The real answer: the same probe where the kernel has no Landlock.
        bare = comfyui(packs=("e2e_pack", "e2e_sandbox"), name="bare",
                       env=dict(base_env, BULKHEAD_SANDBOX_NO_LANDLOCK="1"))
        unsandboxed = _probe(bare, fake_home, other_env, port, abstract)
        assert "this kernel has no Landlock" in bare.log(), bare.log()
        assert "2 packs isolated, 2 not sandboxed (e2e_pack, e2e_sandbox)" in bare.log(), bare.log()
        bare.stop()
        zygote = comfyui(packs=("e2e_pack", "e2e_sandbox"), name="zygote", env=dict(base_env, BULKHEAD_NETWORK="0"))
        forked = _probe(zygote, fake_home, other_env, port, abstract)
        assert "not sandboxed" not in zygote.log() and "e2e_sandbox': 2 nodes" in zygote.log(), zygote.log()
        zygote.stop()
        spawn = comfyui(packs=("e2e_pack", "e2e_sandbox"), name="spawn", env=dict(base_env, BULKHEAD_ZYGOTE="0"))
        spawned = _probe(spawn, fake_home, other_env, port, abstract)
    finally:
        listener.close()
        outside.close()
    for where in ("worker", "grandchild"):
        bare_side = unsandboxed[where]
        assert {k: v for k, v in bare_side.items() if v != "ok"} == {}, bare_side   # the probe can tell
        for name, got in (("zygote-forked", forked[where]), ("spawned", spawned[where])):
            refused = {k: got[k] for k in ESCAPES}
            assert all(v.startswith("PermissionError") for v in refused.values()), (name, where, refused)
            assert {k: got[k] for k in ALLOWED} == {k: bare_side[k] for k in ALLOWED}, (name, where, got)
        # the network: on by default, off with BULKHEAD_NETWORK=0
        assert spawned[where]["connect loopback"] == bare_side["connect loopback"] == "ok"
        assert forked[where]["connect loopback"].startswith("PermissionError"), forked[where]


def test_a_refusal_is_named_with_the_line_that_allows_it(comfyui, home):
    """The pack gets PermissionError as the OS raises it; the log names
    the pack, the path and the config line that would allow it."""
    fake_home, _ = home
    target = str(fake_home / "made-by-pack.txt")
    srv = comfyui(packs=("e2e_sandbox",), env={"HOME": str(fake_home)})
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2ESandboxRefused", "inputs": {"path": target}}}))
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert errors and errors[0]["exception_type"].endswith("PermissionError"), entry["status"]
    assert not os.path.exists(target)
    log = srv.log()
    assert f"pack 'e2e_sandbox' was refused writing {target}" in log, log
    assert f'sandbox_write = ["{fake_home}"] under [bulkhead]' in log, log
    status, doc = srv.http("GET", "/bulkhead/status")
    pack = [p for p in doc["packs"] if p["name"] == "e2e_sandbox"][0]
    assert pack["sandbox"]["state"] == "sandboxed", pack
    # `bulkhead status` says so too, from the host's control socket
    r = subprocess.run([CLI, "status", "--ledger", srv.ledger], env=srv.env, capture_output=True, text=True,
                       timeout=30)
    line = [l for l in r.stdout.splitlines() if l.strip().startswith("e2e_sandbox")]
    assert line and line[0].rstrip().endswith(", sandboxed"), r.stdout + r.stderr


def test_required_refuses_where_the_kernel_cannot(comfyui, home):
    """`required` on a kernel without Landlock: the worker is not started,
    and the pack does not run in ComfyUI's process instead either; the
    log says why and what to do.  The same pack without `required` runs
    (unsandboxed, one line saying so)."""
    fake_home, _ = home
    env = {"HOME": str(fake_home), "BULKHEAD_SANDBOX_NO_LANDLOCK": "1"}
    srv = comfyui(packs=("e2e_sandbox",), name="required", env=dict(env, BULKHEAD_SANDBOX="required"))
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2ESandboxRefused" not in info, sorted(info)
    log = srv.log()
    assert "BULKHEAD_SANDBOX=required and this kernel has no Landlock" in log, log
    assert "run it on a kernel with Landlock" in log, log
    srv.stop()
    srv = comfyui(packs=("e2e_sandbox",), name="on", env=dict(env, BULKHEAD_SANDBOX="on"))
    status, info = srv.http("GET", "/object_info")
    assert "E2ESandboxRefused" in info
    status, doc = srv.http("GET", "/bulkhead/status")
    [pack] = [p for p in doc["packs"] if p["name"] == "e2e_sandbox"]
    assert pack["sandbox"]["state"] == "unavailable", pack
