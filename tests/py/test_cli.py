"""The `bulkhead` command (tools/bulkhead.c), run as a program.

The ledger it reads is populated here by real processes: this test process
joins as a host, and small Python members (subprocesses) join as its
workers through _native.Ledger, each publishing devices, models, a run
state and releases, then waiting until told to leave.  `release` talks to
a real ControlServer (python/bulkhead/host/control.py) in this process, serving
a stand-in HostMemory whose workers record what they were asked; the
torch test runs it all against a real host with real workers holding real
RAM.  `top` runs under a pseudo-terminal (os.openpty) of a chosen size.

Every run gets a private ledger and XDG_RUNTIME_DIR under tmp_path and a
GPU probe that finds no driver, unless a test gives it the fake NVML the
build makes.
"""

import fcntl
import io
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from bulkhead import _native

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
CLI = os.path.join(BUILD, "tools", "bulkhead")
FAKE_NVML = os.path.join(BUILD, "tests", "c", "fake_nvml", "libnvidia-ml.so.1")
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason=f"no {CLI} (build first)")

CSI = re.compile(r"\x1b\[[0-9;?]*[@-~]")


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The environment every run gets (also this process's, for the
    ControlServer): a private XDG_RUNTIME_DIR, no default ledger, no GPU
    driver."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.delenv("BULKHEAD_LEDGER", raising=False)
    monkeypatch.delenv("BH_FAKE_NVML", raising=False)
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", str(tmp_path / "no-driver" / "libnvidia-ml.so.1"))
    return dict(os.environ)


def cli(*args, env, timeout=60):
    return subprocess.run([CLI, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


MEMBER = r"""
import json, sys
from bulkhead import _native
spec = json.loads(sys.argv[2])
l = _native.Ledger(sys.argv[1])
l.join(spec["role"], **spec.get("join", {}))
for d in spec.get("devices", []):
    l.set_device(**d)
for m in spec.get("models", []):
    l.set_model(**m)
for b in spec.get("releases", []):
    l.note_release(b)
if "run" in spec:
    l.set_run(spec["run"])
print("ready", flush=True)
sys.stdin.read()
l.close()
"""


@pytest.fixture
def ledger(tmp_path):
    return str(tmp_path / "ledger")


@pytest.fixture
def member(ledger, env):
    """member(role, pack=..., host_pid=..., devices=[...], models=[...],
    releases=[...], run=...) -> the pid of a process holding that record;
    they leave at the end of the test."""
    procs = []

    def start(role, devices=(), models=(), releases=(), run=None, **join):
        spec = {"role": role, "join": join, "devices": list(devices), "models": list(models),
                "releases": list(releases)}
        if run:
            spec["run"] = run
        p = subprocess.Popen([sys.executable, "-c", MEMBER, ledger, json.dumps(spec)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.stdin.close()  # EOF: the member leaves and exits
        p.stdout.close()
        p.wait(30)


@pytest.fixture
def host(ledger):
    """This process joined as a host; its workers name os.getpid()."""
    l = _native.Ledger(ledger)
    l.join("host", pack="host", interpreter="3.11.9")
    l.set_device("cpu", held_bytes=300 * MiB)
    yield l
    l.close()


def worker_spec(held, pack="pack-a", **kw):
    return dict(pack=pack, interpreter="3.12.1", generation=2, host_pid=os.getpid(),
                devices=[dict(device="cpu", held_bytes=held, pinned_bytes=MiB, pin_ceiling_bytes=2 << 30,
                              floor_bytes=5 * MiB),
                         dict(device="cuda:0", held_bytes=3 * held, reserve_bytes=1 << 30)],
                models=[dict(model_id=1, name="UNetA", device="cuda:0", size_bytes=4 << 30,
                             resident_bytes=2 << 30),
                        dict(model_id=2, name="VAE", device="cpu", size_bytes=300 * MiB,
                             resident_bytes=300 * MiB)],
                **kw)


def assert_fits(text, cols):
    for line in text.splitlines():
        assert len(line) <= cols, f"{len(line)} columns: {line!r}"


# ------------------------------------------------------------- usage


def test_help_lists_verbs_and_exit_codes(env):
    r = cli("--help", env=env)
    assert r.returncode == 0 and r.stderr == ""
    for word in ("status", "top", "release", "exit codes", "BULKHEAD_LEDGER"):
        assert word in r.stdout
    assert_fits(r.stdout, 80)
    for verb in ("status", "top", "release"):
        for args in ((verb, "--help"), (verb, "-h"), ("help", verb)):
            r = cli(*args, env=env)
            assert r.returncode == 0, args
            assert r.stdout.startswith(f"usage: bulkhead {verb}"), args
            assert "exit codes" in r.stdout
            assert_fits(r.stdout, 80)
    r = cli("release", "--help", env=env)
    for code in "012345":
        assert f"  {code}  " in r.stdout
    r = cli("--version", env=env)
    assert r.returncode == 0 and r.stdout.startswith("bulkhead ")


@pytest.mark.parametrize("args, says", [
    ((), "which verb"),
    (("frobnicate",), "unknown verb 'frobnicate'"),
    (("--json",), "unknown option '--json'"),
    (("help", "nope"), "no verb 'nope'"),
    (("status", "--bogus"), "unknown option '--bogus'"),
    (("status", "extra"), "unexpected argument 'extra'"),
    (("status", "--ledger"), "needs a value"),
    (("status", "--ledger", ""), "--ledger needs a path"),
    (("top", "--interval", "0"), "--interval wants seconds"),
    (("top", "--interval", "abc"), "--interval wants seconds"),
    (("top", "-x"), "unknown option '-x'"),
    (("release",), "which worker"),
    (("release", "a", "b"), "unexpected argument 'b'"),
    (("release", "a", "--bytes", "12Q"), "--bytes wants a size"),
    (("release", "a", "--bytes", "0"), "--bytes wants a size"),
    (("release", "a", "--bytes", "1.5"), "--bytes wants a size"),
    (("release", "a", "--bytes", "9E"), "--bytes wants a size"),
    (("release", "a", "--timeout", "-1"), "--timeout wants seconds"),
    (("release", ""), "is empty"),
])
def test_usage_errors_exit_2(env, args, says):
    r = cli(*args, env=env)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stdout == ""
    assert says in r.stderr and "usage: bulkhead" in r.stderr


# ------------------------------------------------------------ status


def test_status_without_a_ledger(env, ledger, tmp_path):
    r = cli("status", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    assert "no bulkhead processes" in r.stdout
    assert "no NVIDIA driver" in r.stdout
    assert re.search(r"^cpu +\d", r.stdout, re.M)
    assert not os.path.exists(ledger), "status created the ledger"
    # the reason is there whole, wrapped within 80 columns (at spaces; a path longer than a line broken)
    gpu = r.stdout[r.stdout.index("\ngpu ") + 1:].split("\n\n")[0].splitlines()
    assert all(len(line) <= 80 for line in gpu), gpu
    shown = "".join(line[10:].strip() for line in gpu).replace(" ", "")
    r = cli("status", "--json", env=dict(env, BULKHEAD_LEDGER=ledger))
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and doc["ledger"] == ledger and doc["ledger_present"] is False
    assert doc["processes"] == []
    assert doc["gpu_error"].startswith("no NVIDIA driver")
    assert shown == doc["gpu_error"].replace(" ", ""), (gpu, doc["gpu_error"])
    assert [d["device"] for d in doc["devices"]] == ["cpu"]
    cpu = doc["devices"][0]
    assert 0 < cpu["free_bytes"] <= cpu["total_bytes"] and cpu["source"] in ("meminfo", "cgroup")
    assert cpu["index"] is None and cpu["uuid"] is None
    assert not os.path.exists(ledger)
    # top --once and release say the same without creating it either
    r = cli("top", "--once", "--ledger", ledger, env=env)
    assert r.returncode == 0 and "no bulkhead processes" in r.stdout
    r = cli("release", "pack-a", "--ledger", ledger, env=env)
    assert r.returncode == 1 and "no bulkhead processes" in r.stderr and ledger in r.stderr
    assert not os.path.exists(ledger)


def test_status_groups_workers_under_their_host(env, ledger, host, member):
    a = member("worker", **worker_spec(1 << 30, releases=[MiB, 2 * MiB], run="busy"))
    b = member("worker", **worker_spec(5 * MiB, pack="pack-b"))
    weird = 'we"ird\\pack\n\x01\x1b[2J-with-a-long-name'
    orphan = member("worker", pack=weird, interpreter="3.9.18", generation=1,
                    devices=[dict(device="cpu", held_bytes=7 * MiB)])
    r = cli("status", "--json", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ledger_present"] is True
    procs = doc["processes"]
    # the host, its workers by pid, then the worker without a host
    assert [p["pid"] for p in procs] == [os.getpid()] + sorted([a.pid, b.pid]) + [orphan.pid]
    by = {p["pid"]: p for p in procs}
    h = by[os.getpid()]
    assert h["role"] == "host" and h["host_pid"] is None and h["held_bytes"] == 300 * MiB
    w = by[a.pid]
    assert w["role"] == "worker" and w["pack"] == "pack-a" and w["host_pid"] == os.getpid()
    assert w["interpreter"] == "3.12.1" and w["generation"] == 2 and w["state"] == "busy"
    assert w["held_bytes"] == 4 << 30  # 1 GiB cpu + 3 GiB cuda:0
    assert 0 <= w["idle_s"] < 60
    assert w["devices"][0] == {"device": "cpu", "held_bytes": 1 << 30, "pinned_bytes": MiB,
                               "pin_ceiling_bytes": 2 << 30, "pager_bytes": 0,
                               "floor_bytes": 5 * MiB, "reserve_bytes": 0}
    assert w["devices"][1]["device"] == "cuda:0" and w["devices"][1]["reserve_bytes"] == 1 << 30
    assert w["models"] == [
        {"id": 1, "name": "UNetA", "device": "cuda:0", "size_bytes": 4 << 30, "resident_bytes": 2 << 30},
        {"id": 2, "name": "VAE", "device": "cpu", "size_bytes": 300 * MiB, "resident_bytes": 300 * MiB}]
    assert w["release_count"] == 2 and w["released_bytes"] == 3 * MiB
    assert by[b.pid]["state"] == "idle" and by[b.pid]["release_count"] == 0
    o = by[orphan.pid]
    assert o["pack"] == weird and o["host_pid"] is None and o["models"] == []  # escaped and back

    r = cli("status", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert_fits(out, 80)
    assert "\x1b" not in out and "\x01" not in out, "a pack name reached the terminal raw"
    lines = out.splitlines()
    row = {pid: next(i for i, line in enumerate(lines) if re.match(rf"^ *{pid} ", line))
           for pid in by}
    assert row[os.getpid()] < row[min(a.pid, b.pid)] < row[max(a.pid, b.pid)] < row[orphan.pid]
    assert lines[row[a.pid]].startswith(f"  {a.pid} ")  # indented under its host
    assert lines[row[orphan.pid]].startswith(f"{orphan.pid} ")
    wa = lines[row[a.pid]]
    for word in ("worker", "pack-a", "3.12.1", "busy", "4.0 GiB"):
        assert word in wa
    detail = "\n".join(lines[row[a.pid]:row[a.pid] + 6])
    assert "held 1.0 GiB" in detail and "pinned 1.0 MiB of 2.0 GiB" in detail and "floor 5.0 MiB" in detail
    assert "reserve 1.0 GiB" in detail
    assert re.search(r"model UNetA +cuda:0 +2\.0 GiB of 4\.0 GiB", detail)
    assert "released 2 times, 3.0 MiB in all" in detail
    assert 'we"ird\\pack???[2J~' in out  # cut to 18 columns, controls shown as '?'


def test_status_reads_gpus_from_nvml(env, ledger, tmp_path, host):
    state = tmp_path / "nvml"
    state.write_text(
        'device GPU-11111111-2222-3333-4444-555555555555 "Fake H200" total=150000000000 '
        'free=140000000000 used=9000000000 reserved=1000000000\n'
        'device GPU-66666666-7777-8888-9999-000000000000 "Fake A100" total=80000000000 '
        'free=80000000000 used=0\n')
    e = dict(env, BULKHEAD_NVML_LIBRARY=FAKE_NVML, BH_FAKE_NVML=str(state))
    doc = json.loads(cli("status", "--json", "--ledger", ledger, env=e).stdout)
    assert doc["gpu_error"] is None
    gpus = [d for d in doc["devices"] if d["source"] == "nvml"]
    assert gpus == [
        {"device": "cuda:0", "total_bytes": 150000000000, "free_bytes": 140000000000, "source": "nvml",
         "index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "Fake H200"},
        {"device": "cuda:1", "total_bytes": 80000000000, "free_bytes": 80000000000, "source": "nvml",
         "index": 1, "uuid": "GPU-66666666-7777-8888-9999-000000000000", "name": "Fake A100"}]
    out = cli("status", "--ledger", ledger, env=e).stdout
    assert re.search(r"^cuda:0 +139\.7 GiB +130\.4 GiB +nvml +Fake H200 +GPU-1111", out, re.M)
    assert "no NVIDIA driver" not in out
    assert_fits(out, 80)
    # a driver that is there but has no devices
    state.write_text("")
    out = cli("status", "--ledger", ledger, env=e).stdout
    assert "NVML reports no devices" in out


def test_status_drops_processes_that_died(env, ledger, host, member):
    a = member("worker", **worker_spec(MiB))
    b = member("worker", **worker_spec(MiB, pack="pack-b"))
    a.kill()
    a.wait()
    pids = [p["pid"] for p in json.loads(cli("status", "--json", "--ledger", ledger, env=env).stdout)["processes"]]
    assert pids == [os.getpid(), b.pid]


def test_status_refuses_a_ledger_it_cannot_read(env, tmp_path):
    bad = tmp_path / "not-a-ledger"
    bad.write_bytes(b"hello" * 100)
    bad.chmod(0o600)
    r = cli("status", "--ledger", bad, env=env)
    assert r.returncode == 5 and r.stdout == ""
    assert str(bad) in r.stderr and "not a bulkhead ledger" in r.stderr
    bad.chmod(0o644)
    r = cli("status", "--json", "--ledger", bad, env=env)
    assert r.returncode == 5 and "Permission denied" in r.stderr
    assert cli("top", "--once", "--ledger", bad, env=env).returncode == 5
    assert cli("release", "x", "--ledger", bad, env=env).returncode == 5


# ----------------------------------------------------------- release


class StandInWorker:
    """What ControlServer reads of a bulkhead.Worker; records the asks."""

    def __init__(self, pid, name, held):
        self.pid, self.name, self.held = pid, name, held
        self.alive, self.busy, self.generation = True, False, 1
        self.asks = []

    def release(self, op, model_id, nbytes, timeout_s=None, wait_s=None):
        self.asks.append((op, nbytes))
        before = self.held
        self.held = 0 if op == "all" else max(0, self.held - nbytes)
        return {"before_bytes": before, "after_bytes": self.held, "freed_bytes": before - self.held}


class StandInHost:
    def __init__(self, workers):
        self.owners = {w: None for w in workers}
        self.noted = []

    def note_release(self, w):
        self.noted.append(w.pid)


@pytest.fixture
def control():
    """control(workers) -> a ControlServer in this process (the host)."""
    from bulkhead.host.control import ControlServer
    servers = []

    def start(workers):
        s = ControlServer(StandInHost(workers), release_timeout_s=10)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def test_status_lists_where_each_hosts_packs_stand(env, ledger, host, member, control, tmp_path):
    """#25: `bulkhead status` asks each host's control socket where its
    packs stand: one that fell back in-process with why and the fix, one
    that failed; --json carries them as "packs" with their host's pid."""
    from bulkhead.host import nodes, states
    lost = tmp_path / "lost_pack"
    lost.mkdir()
    (lost / "nodes.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    try:
        nodes.fallback(str(lost), nodes.ENV_NOT_BUILT, detail=": pip found no bh-nowhere")
        states.failed("/nowhere/broken_pack", "broken_pack", "No module named 'bh_missing'")
        states.failed("/nowhere/zz", "zz\x1b[2J", "a \x1b[31mred\x1b[0m message")   # never moves the cursor
        control([])
        r = cli("status", "--ledger", ledger, env=env)
        assert r.returncode == 0, r.stderr
        text = r.stdout.split(f"packs of host {os.getpid()}:\n", 1)[1]
        lines = text.splitlines()
        assert lines[0].split() == ["broken_pack", "FAILED"], text
        assert lines[1].split() == ["why:", "No", "module", "named", "'bh_missing'"], text
        at = next(i for i, line in enumerate(lines) if line.startswith("  lost_pack"))
        assert "NOT isolated (in ComfyUI's process)" in lines[at], text
        assert lines[at + 1].split()[0] == "why:" and "pip found no bh-nowhere" in lines[at + 1], text
        # the fix is shown whole, its command wrapped onto the lines under it, none past 80 columns
        fix = [line for line in lines[at + 2:] if line.startswith(" " * 11) or line.split()[:1] == ["fix:"]]
        assert fix[0].split()[0] == "fix:" and all(len(line) <= 80 for line in lines), text
        joined = "".join("".join(line.split()) for line in fix)     # the wrapped lines, blanks dropped
        assert f"`bulkhead install {lost}`".replace(" ", "") in joined, text
        assert "\x1b" not in r.stdout and "zz?[2J" in text and "a ?[31mred?[0m message" in text, text
        doc = json.loads(cli("status", "--json", "--ledger", ledger, env=env).stdout)
        assert [(p["host_pid"], p["name"], p["state"]) for p in doc["packs"]] == [
            (os.getpid(), "broken_pack", "failed"), (os.getpid(), "zz\x1b[2J", "failed"),
            (os.getpid(), "lost_pack", "in-process")], doc["packs"]
    finally:
        nodes._forget_all()


def test_status_shows_the_build_log_and_what_the_panel_offers(env, ledger, host, control, tmp_path, monkeypatch):
    """#36: for a pack whose build failed, `bulkhead status` shows its
    build's log file and the command that does what the panel's button
    (Retry) does, whole, as GET /bulkhead/status lists them for the panel
    (host/building.py annotate); --json carries them."""
    from bulkhead.envs import build as envs, config as packconfig
    from bulkhead.host import building, nodes, states
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "home"))
    pack = tmp_path / "a_pack_whose_build_failed"
    pack.mkdir()
    (pack / "nodes.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    (pack / "comfy-env.toml").write_text('requirements = ["bh-nowhere"]\n')
    config = packconfig.load(str(pack / "comfy-env.toml"), warn=False)
    os.makedirs(envs.logs_dir(config))
    with open(os.path.join(envs.logs_dir(config), "20260101-000000-1.log"), "w") as f:
        f.write("FAILED: pip found no bh-nowhere\n")
    try:
        building.served(config, str(pack), "auto", None, None, None, None)
        nodes.fallback(str(pack), nodes.ENV_NOT_BUILT, name=config.name,
                       detail=": building it at start failed: pip found no bh-nowhere")
        [panel] = building.annotate(states.pack_states())
        assert panel["actions"] == ["retry"] and panel["log"] and panel["command"], panel
        control([])
        r = cli("status", "--ledger", ledger, env=env)
        assert r.returncode == 0, r.stderr
        text = r.stdout.split(f"packs of host {os.getpid()}:\n", 1)[1]
        assert all(len(line) <= 80 for line in text.splitlines()), text
        labelled = {}
        for line in text.splitlines()[1:]:      # each label's lines, wrapped under it: blanks dropped
            if line.split()[0].endswith(":"):
                label = line.split()[0]
            labelled[label] = labelled.get(label, "") + "".join(line.split()[1 if label in line else 0:])
        assert labelled["log:"] == "".join(panel["log"].split()), text
        assert labelled["run:"] == "".join(f"{panel['command']} (or the panel's Retry)".split()), text
        [row] = json.loads(cli("status", "--json", "--ledger", ledger, env=env).stdout)["packs"]
        assert (row["log"], row["actions"], row["command"]) == (panel["log"], "retry", panel["command"]), row
    finally:
        nodes._forget_all()
        building._served.clear()


def test_release_by_pack_and_by_pid(env, ledger, host, member, control):
    a = member("worker", **worker_spec(64 * MiB))
    b = member("worker", **worker_spec(32 * MiB, pack="pack-b"))
    wa, wb = StandInWorker(a.pid, "pack-a", 64 * MiB), StandInWorker(b.pid, "pack-b", 32 * MiB)
    srv = control([wa, wb])
    assert srv.path == os.path.join(env["XDG_RUNTIME_DIR"], "bulkhead", f"host-{os.getpid()}.sock")

    r = cli("release", "pack-a", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    assert wa.asks == [("all", None)] and wb.asks == []
    assert f"released worker {a.pid} (pack-a) of host {os.getpid()}" in r.stdout
    assert re.search(r"before +64\.0 MiB +\(67108864 bytes\)", r.stdout)
    assert re.search(r"after +0 B +\(0 bytes\)", r.stdout)
    assert re.search(r"freed +64\.0 MiB +\(67108864 bytes\)", r.stdout)

    r = cli("release", b.pid, "--bytes", "1.5M", "--json", "--timeout", "20", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    assert wb.asks == [("bytes", 3 * MiB // 2)]
    assert json.loads(r.stdout) == {"worker_pid": b.pid, "pack": "pack-b", "host_pid": os.getpid(),
                                    "asked_bytes": 3 * MiB // 2, "before_bytes": 32 * MiB,
                                    "after_bytes": 32 * MiB - 3 * MiB // 2, "freed_bytes": 3 * MiB // 2}
    # BULKHEAD_LEDGER is the default path
    r = cli("release", "pack-b", "--bytes", "1KiB", env=dict(env, BULKHEAD_LEDGER=ledger))
    assert r.returncode == 0 and "asked for 1.0 KiB" in r.stdout
    assert wb.asks[-1] == ("bytes", 1024)


def test_release_finds_the_socket_where_the_host_put_it(env, ledger, host, member, control, monkeypatch):
    # The host ran without XDG_RUNTIME_DIR (its socket is under /tmp); the
    # command, with one, looks there first and then where the host is.
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    a = member("worker", **worker_spec(8 * MiB))
    srv = control([StandInWorker(a.pid, "pack-a", 8 * MiB)])
    assert srv.path.startswith(f"/tmp/bulkhead-{os.getuid()}-{os.getpid()}-")
    assert srv.path.endswith(f"/host-{os.getpid()}.sock")
    r = cli("release", "pack-a", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    assert "(8388608 bytes)" in r.stdout


def test_python_client_finds_the_socket_where_the_host_put_it(env, ledger, host, member, control,
                                                               monkeypatch):
    """controlclient.request looks in both places, as the command does (issue 17
    item 16): a host without XDG_RUNTIME_DIR, a client with one."""
    from bulkhead.host import controlclient as bh_control
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    a = member("worker", **worker_spec(8 * MiB))
    srv = control([StandInWorker(a.pid, "pack-a", 8 * MiB)])
    assert srv.path.startswith(f"/tmp/bulkhead-{os.getuid()}-{os.getpid()}-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
    assert bh_control.request(os.getpid(), "workers") == [
        {"pid": a.pid, "pack": "pack-a", "generation": 1, "busy": False}]
    with pytest.raises(bh_control.ControlUnreachable) as e:
        bh_control.request(999999999, "workers")
    assert os.path.join(env["XDG_RUNTIME_DIR"], "bulkhead", "host-999999999.sock") in str(e.value)
    assert f"/tmp/bulkhead-{os.getuid()}/host-999999999.sock" in str(e.value)


def test_release_no_such_worker_exits_1(env, ledger, host, member):
    a = member("worker", **worker_spec(MiB))
    d1 = member("worker", **worker_spec(MiB, pack="dup"))
    d2 = member("worker", **worker_spec(MiB, pack="dup"))
    r = cli("release", "nope", "--ledger", ledger, env=env)
    assert r.returncode == 1 and r.stdout == ""
    assert "no worker of pack 'nope'" in r.stderr and f"pack-a (pid {a.pid}, host {os.getpid()})" in r.stderr
    r = cli("release", "999999999", "--ledger", ledger, env=env)
    assert r.returncode == 1 and "no bulkhead process with pid 999999999" in r.stderr
    r = cli("release", "99999999999", "--ledger", ledger, env=env)  # no pid is that large: a pack
    assert r.returncode == 1 and "no worker of pack '99999999999'" in r.stderr
    dead = subprocess.Popen(["true"])
    dead.wait()
    r = cli("release", dead.pid, "--ledger", ledger, env=env)
    assert r.returncode == 1 and f"no bulkhead process with pid {dead.pid}" in r.stderr
    assert "dup (pid" in r.stderr
    r = cli("release", os.getpid(), "--ledger", ledger, env=env)
    assert r.returncode == 1 and f"pid {os.getpid()} is a host, not a worker" in r.stderr
    r = cli("release", "dup", "--ledger", ledger, env=env)
    assert r.returncode == 1 and "pack 'dup' has 2 workers" in r.stderr
    assert str(d1.pid) in r.stderr and str(d2.pid) in r.stderr and "name one by pid" in r.stderr


def test_release_host_unreachable_exits_3(env, ledger, host, member):
    a = member("worker", **worker_spec(MiB))
    r = cli("release", "pack-a", "--ledger", ledger, env=env)
    assert r.returncode == 3 and r.stdout == ""
    path = os.path.join(env["XDG_RUNTIME_DIR"], "bulkhead", f"host-{os.getpid()}.sock")
    assert f"host {os.getpid()} is unreachable: {path}: No such file or directory" in r.stderr
    assert f"/tmp/bulkhead-{os.getuid()}/host-{os.getpid()}.sock" in r.stderr  # also tried
    # a socket file nobody listens on: refused
    import socket
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.close()
    try:
        r = cli("release", a.pid, "--ledger", ledger, env=env)
        assert r.returncode == 3 and "Connection refused" in r.stderr and path in r.stderr
    finally:
        os.unlink(path)
    # a worker with no host at all
    lone = member("worker", pack="lone", devices=[dict(device="cpu", held_bytes=MiB)])
    r = cli("release", "lone", "--ledger", ledger, env=env)
    assert r.returncode == 3 and f"worker {lone.pid} (lone) has no host" in r.stderr


def test_release_looks_in_no_packs_tmpdir(env, ledger, host, member, tmp_path):
    """A pack's private TMPDIR under /tmp (host/sandbox.py private_tmp)
    shares the host's /tmp prefix; neither the CLI nor rundir takes it
    for a directory a control socket may be in."""
    import tempfile
    from bulkhead.host import rundir
    member("worker", **worker_spec(MiB))
    tmp = tempfile.mkdtemp(prefix=f"{rundir.tmp_prefix(os.getpid())}{rundir.SANDBOX_TMP}pack-a-", dir="/tmp")
    try:
        r = cli("release", "pack-a", "--ledger", ledger, env=env)
        assert r.returncode == 3 and f"/tmp/bulkhead-{os.getuid()}/host-{os.getpid()}.sock" in r.stderr
        assert tmp not in r.stderr
        assert tmp not in rundir.runtime_dirs(os.getpid())
    finally:
        os.rmdir(tmp)


def test_release_host_that_never_answers_exits_3(env, ledger, host, member):
    import socket
    a = member("worker", **worker_spec(MiB))
    path = os.path.join(env["XDG_RUNTIME_DIR"], "bulkhead", f"host-{os.getpid()}.sock")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.bind(path)
        s.listen(1)  # accepts into the backlog, never answers
        t0 = time.monotonic()
        r = cli("release", "pack-a", "--timeout", "0.5", "--ledger", ledger, env=env)
        assert r.returncode == 3 and "did not answer within 0.5 s" in r.stderr
        assert time.monotonic() - t0 < 10
    finally:
        s.close()
        os.unlink(path)


def test_release_host_refuses_exits_4(env, ledger, host, member, control):
    a = member("worker", **worker_spec(MiB))
    control([])  # the host does not know the worker the ledger names
    r = cli("release", "pack-a", "--ledger", ledger, env=env)
    assert r.returncode == 4 and r.stdout == ""
    assert f"host {os.getpid()} refused: LookupError: no running worker {a.pid}" in r.stderr


# --------------------------------------------------------------- top


def test_top_once_without_a_terminal(env, ledger, host, member):
    a = member("worker", **worker_spec(MiB))
    r = cli("top", "--once", "--ledger", ledger, env=env)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout  # plain text, no screen control
    assert r.stdout.count("PID ") == 1 and f"  {a.pid} " in r.stdout
    # the status table, as `status` prints it
    status = cli("status", "--ledger", ledger, env=env).stdout
    assert [line.split()[:3] for line in r.stdout.splitlines() if line.strip()] == \
        [line.split()[:3] for line in status.splitlines() if line.strip()]
    assert_fits(r.stdout, 80)


def test_top_without_a_terminal_repeats(env, ledger, host):
    p = subprocess.Popen([CLI, "top", "--interval", "0.2", "--ledger", ledger], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
    finally:
        p.terminate()
        out, err = p.communicate(10)
    assert p.returncode == -signal.SIGTERM, err
    assert out.count(b"ledger ") >= 3, out


class Pty:
    """A child under a pseudo-terminal of cols x rows; read() collects
    what it drew."""

    def __init__(self, args, env, cols=80, rows=24):
        self.master, slave = os.openpty()
        self.resize(cols, rows, fd=slave)
        self.before = self.lflag()  # the terminal's modes before the child touches them
        self.p = subprocess.Popen(args, env=env, stdin=slave, stdout=slave, stderr=slave,
                                  start_new_session=True)
        os.close(slave)
        self.out = b""

    def resize(self, cols, rows, fd=None):
        fcntl.ioctl(self.master if fd is None else fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def read_until(self, pred, timeout=20):
        deadline = time.monotonic() + timeout
        while not pred(self.out):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; the terminal got {self.out[-3000:]!r}")
            r, _, _ = select.select([self.master], [], [], left)
            if r:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    if not pred(self.out):
                        raise AssertionError(f"terminal closed; it got {self.out[-3000:]!r}")
                    break
                self.out += chunk
        return self.out

    def lflag(self):
        return termios.tcgetattr(self.master)[3]

    def finish(self):
        try:
            self.read_until(lambda b: False, timeout=10)
        except AssertionError:
            pass
        rc = self.p.wait(10)
        return rc

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        os.close(self.master)


def frames(out):
    """The frames drawn, each as its list of visible lines."""
    text = out.decode("utf-8", "replace")
    shown = []
    for chunk in text.split("\x1b[H")[1:]:
        body = chunk.split("\x1b[J")[0]
        # the terminal's ONLCR turns the CR LF it was sent into CR CR LF
        shown.append([CSI.sub("", line).replace("\r", "") for line in body.split("\n")])
    return shown


ENTER = b"\x1b[?1049h\x1b[?25l"
LEAVE = b"\x1b[?25h\x1b[?1049l"


@pytest.mark.parametrize("cols, rows", [(80, 24), (60, 8)])
def test_top_on_a_terminal_quits_on_q(env, ledger, host, member, cols, rows):
    ws = [member("worker", **worker_spec((i + 1) * 64 * MiB, pack=f"pack-{i}")) for i in range(4)]
    t = Pty([CLI, "top", "--interval", "0.2", "--ledger", ledger], env, cols, rows)
    try:
        before = t.before
        assert before & termios.ICANON and before & termios.ECHO
        t.read_until(lambda b: b.count(b"\x1b[J") >= 2)
        assert t.out.startswith(ENTER)
        running = t.lflag()
        assert not running & (termios.ICANON | termios.ECHO), "not in raw mode"
        os.write(t.master, b"q")
        assert t.finish() == 0
        assert t.out.endswith(LEAVE), t.out[-200:]
        after = t.lflag()
        assert after & termios.ICANON and after & termios.ECHO and after == before
    finally:
        t.close()
    last = frames(t.out[:-len(LEAVE)])[-1]
    assert len(last) <= rows
    for line in last:
        assert len(line) <= cols, f"{len(line)} > {cols}: {line!r}"
    assert last[0].startswith("bulkhead top  5 processes") and len(last[0]) == cols
    table = [line for line in last if re.match(r"^ *\d+ ", line)]
    if rows >= 24:
        # groups and workers by bytes held: the host, then pack-3 .. pack-0
        assert [int(line.split()[0]) for line in table] == [os.getpid()] + [w.pid for w in reversed(ws)]
        assert all(line.rstrip().endswith("]") for line in table), "bars at 80 columns"
    else:
        assert last[-1].startswith("... ") and last[-1].endswith(" more")


def test_top_follows_the_window_size(env, ledger, host):
    t = Pty([CLI, "top", "--interval", "5", "--ledger", ledger], env, 80, 24)
    try:
        t.read_until(lambda b: b.count(b"\x1b[J") >= 1)
        t.resize(100, 30)
        t.p.send_signal(signal.SIGWINCH)
        t.read_until(lambda b: b.count(b"\x1b[J") >= 2)
        os.write(t.master, b"q")
        assert t.finish() == 0
    finally:
        t.close()
    first, second = frames(t.out[:-len(LEAVE)])[:2]
    assert len(first[0]) == 80 and len(second[0]) == 100


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_top_restores_the_terminal_when_signalled(env, ledger, host, sig):
    t = Pty([CLI, "top", "--interval", "0.2", "--ledger", ledger], env)
    try:
        before = t.before
        t.read_until(lambda b: b.count(b"\x1b[J") >= 1)
        assert not t.lflag() & (termios.ICANON | termios.ECHO)
        t.p.send_signal(sig)
        assert t.finish() == -sig
        assert t.out.endswith(LEAVE)
        assert t.lflag() == before
    finally:
        t.close()


# ------------------------------------------------- a real host (torch)


PREAMBLE = """
import subprocess
import bulkhead
from bulkhead.host.memory import HostMemory
MiB = 1 << 20
CLI = {cli!r}
LEDGER = {ledger!r}
hm = HostMemory(mm, ledger_path=LEDGER)
WORKER_PATH = os.pathsep.join([{helpers!r}, os.getcwd()])

def worker(name):
    return hm.attach(bulkhead.Worker(sys.executable, name=name, env={{"PYTHONPATH": WORKER_PATH}}))

def run(*args):
    r = subprocess.run([CLI, *map(str, args), "--ledger", LEDGER], capture_output=True, text=True, timeout=120)
    return {{"rc": r.returncode, "out": r.stdout, "err": r.stderr}}
"""


@pytest.mark.torch
def test_release_pack_through_a_real_host(env, tmp_path):
    from comfyenv import run_comfy_script
    code = PREAMBLE.format(cli=CLI, ledger=str(tmp_path / "ledger"), helpers=os.path.join(HERE, "helpers"))
    code += textwrap.dedent("""
        a, b = worker("pack-a"), worker("pack-b")
        a.call("bh_mempack:load", "UNetA", 64 * MiB)
        b.call("bh_mempack:load", "UNetB", 32 * MiB)
        res = {"pids": [os.getpid(), a.pid, b.pid]}
        res["before"] = run("status", "--json")
        res["top"] = run("top", "--once")
        res["partial"] = run("release", "pack-b", "--bytes", "8M")
        res["release"] = run("release", "pack-a")
        res["after"] = run("status", "--json")
        res["resident_after"] = [sum(m["resident_bytes"] for m in hm.ledger.read(w.pid)["models"]) for w in (a, b)]
        # a pack's worker without ComfyUI's memory manager, holding 48 MiB
        # the host had from it (a result ComfyUI's cache dropped since)
        c = worker("pack-c")
        x = c.call("bh_testmod:big", 48 * MiB)
        del x
        c.call("bh_testmod:pid")          # carries the block's return
        res["c_pid"] = c.pid
        res["c_before"] = run("status", "--json")
        res["c_release"] = run("release", "pack-c", "--json")
        res["c_after"] = run("status", "--json")
        hm.close(); a.close(); b.close(); c.close()
        emit(res)
    """)
    r = run_comfy_script(code, timeout=240, env={
        "PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"), os.path.join(HERE, "helpers")]),
        "XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]})
    host_pid, a_pid, b_pid = r["pids"]
    assert r["before"]["rc"] == 0, r["before"]
    before = {p["pid"]: p for p in json.loads(r["before"]["out"])["processes"]}
    assert [p for p in before] == [host_pid] + sorted([a_pid, b_pid])
    wa = before[a_pid]
    assert wa["role"] == "worker" and wa["pack"] == "pack-a" and wa["host_pid"] == host_pid
    assert [(m["name"], m["resident_bytes"]) for m in wa["models"]] == [("UNetA", 64 * MiB)]
    assert wa["state"] == "idle" and wa["held_bytes"] >= 64 * MiB
    assert r["top"]["rc"] == 0 and f"  {a_pid} " in r["top"]["out"] and "pack-b" in r["top"]["out"]

    assert r["partial"]["rc"] == 0, r["partial"]
    assert "asked for 8.0 MiB" in r["partial"]["out"]
    assert r["release"]["rc"] == 0, r["release"]
    out = r["release"]["out"]
    assert f"released worker {a_pid} (pack-a) of host {host_pid}" in out
    assert re.search(r"before +64\.0 MiB +\(67108864 bytes\)", out), out
    assert re.search(r"freed +64\.0 MiB +\(67108864 bytes\)", out), out
    assert r["resident_after"][0] == 0 and r["resident_after"][1] <= 24 * MiB
    after = {p["pid"]: p for p in json.loads(r["after"]["out"])["processes"]}
    assert [m["resident_bytes"] for m in after[a_pid]["models"]] == [0]
    assert after[a_pid]["release_count"] >= 1 and after[a_pid]["released_bytes"] >= 64 * MiB

    # #37: release's figures are the ones `bulkhead status` shows, before
    # and after, wherever the worker holds them (it said "before 0 B,
    # freed 0 B" of a worker status showed holding 48 MiB)
    held = lambda doc: next(p["held_bytes"] for p in json.loads(doc["out"])["processes"] if p["pid"] == r["c_pid"])
    assert r["c_release"]["rc"] == 0, r["c_release"]
    got = json.loads(r["c_release"]["out"])
    assert held(r["c_before"]) >= 48 * MiB
    assert (got["before_bytes"], got["after_bytes"]) == (held(r["c_before"]), held(r["c_after"])), got
    assert got["freed_bytes"] == got["before_bytes"] - got["after_bytes"] >= 48 * MiB, got


def test_extension_serves_the_same_document(tmp_path):
    """ComfyUI's GET /bulkhead/status serves _native.status_json(), built by
    the command's own C code: one schema, two doors."""
    import json as _json
    from bulkhead import _native
    path = str(tmp_path / "ledger")
    led = _native.Ledger(path)
    led.join("worker", pack="same-doc", interpreter="3.12.1", generation=3)
    led.set_model(1, "UNet", "cpu", 100, 40)
    try:
        mine = _json.loads(_native.status_json(path))
        cmd = _json.loads(subprocess.run([CLI, "status", "--json", "--ledger", path],
                                         capture_output=True, text=True, check=True).stdout)
    finally:
        led.close()
    for doc in (mine, cmd):
        for p in doc["processes"]:
            p.pop("idle_s", None)
        for d in doc["devices"]:
            d.pop("free_bytes", None)
    assert mine == cmd
    assert mine["processes"][0]["pack"] == "same-doc"


def test_install_and_env_run_bulkheads_python(tmp_path):
    """`bulkhead install|env` hand over to `<python> -m bulkhead`, with the
    same arguments and exit status; a Python that cannot run is named."""
    pack = tmp_path / "no_config_pack"
    pack.mkdir()
    env = dict(os.environ, BULKHEAD_PYTHON=sys.executable, BULKHEAD_HOME=str(tmp_path / "home"))
    p = subprocess.run([CLI, "env", str(pack)], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "comfy-env.toml" in (p.stdout + p.stderr)
    env["BULKHEAD_PYTHON"] = str(tmp_path / "no-such-python")
    p = subprocess.run([CLI, "install", str(pack)], capture_output=True, text=True, env=env)
    assert p.returncode == 127 and "no-such-python" in p.stderr and "BULKHEAD_PYTHON" in p.stderr


class BusyWorker:
    """A real Worker (its lock, its channel) under the pid and pack of a
    ledger record, so the command finds it; counts the releases that ran."""

    def __init__(self, real, pid, name, release_timeout_s):
        self.real, self.pid, self.name, self.release_timeout_s = real, pid, name, release_timeout_s
        self.alive, self.generation = True, 1
        self.ran = []

    @property
    def busy(self):
        return self.real.busy

    def release(self, *args, **kw):
        r = self.real.release(*args, **kw)
        self.ran.append(r)
        return r


def test_release_of_a_worker_in_a_long_call_answers_within_its_release_timeout(
        env, ledger, host, member, make_worker):
    """The control socket never waits on a busy worker past its release
    timeout, serves workers() meanwhile, and runs no stale release after
    the call ends (issue 17, item 7)."""
    import threading
    from bulkhead.host import control, controlclient
    a = member("worker", **worker_spec(8 * MiB))
    real = make_worker(name="pack-a")
    real.start()
    w = BusyWorker(real, a.pid, "pack-a", release_timeout_s=1.0)
    srv = control.ControlServer(StandInHost([w]), release_timeout_s=10)
    try:
        call = threading.Thread(target=real.call, args=("time:sleep", 6.0))
        call.start()
        deadline = time.monotonic() + 10
        while not real.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        r = cli("release", "pack-a", "--timeout", "20", "--ledger", ledger, env=env)
        listed = controlclient.request(os.getpid(), "workers", timeout_s=1.0)  # while the call runs
        still_busy = real.busy
        call.join()
        time.sleep(0.5)
    finally:
        srv.close()
    assert still_busy
    assert r.returncode == 4 and "stayed busy in a call for 1 s" in r.stderr, (r.returncode, r.stderr)
    assert listed == [{"pid": a.pid, "pack": "pack-a", "generation": 1, "busy": True}]
    assert w.ran == []     # nothing ran once the call was over


def _bulkhead_leftovers(tmp_path):
    """What bulkhead leaves for a user, made as it makes it: the workspace
    (an environment, a link farm, a failure record), the metadata cache,
    a ledger file, a run directory."""
    home, cache, run = tmp_path / "home", tmp_path / "xdg-cache", tmp_path / "xdg-run"
    for d, size in ((home / "envs" / "pack-0123456789ab" / "bin", 4096), (home / "host" / "abc", 100),
                    (home / "failed", 10), (cache / "bulkhead" / "nodes", 2048)):
        d.mkdir(parents=True)
        (d / "f").write_bytes(b"x" * size)
    run.mkdir(mode=0o700)
    (run / "bulkhead").mkdir(mode=0o700)
    ledger = tmp_path / "shm-ledger"
    ledger.write_bytes(b"\0" * 8192)
    env = dict(os.environ, BULKHEAD_PYTHON=sys.executable, BULKHEAD_HOME=str(home), XDG_CACHE_HOME=str(cache),
               XDG_RUNTIME_DIR=str(run), BULKHEAD_LEDGER=str(ledger))
    return env, [home / "envs", home / "host", home / "failed", cache / "bulkhead" / "nodes", ledger, run / "bulkhead"]


def test_uninstall_lists_asks_and_removes(tmp_path):
    """`bulkhead uninstall` from a terminal: every thing bulkhead left,
    with its size; "n" keeps it all, "y" removes it all; without a
    terminal it asks for --yes; the last line names pip and the folder."""
    import pty
    env, paths = _bulkhead_leftovers(tmp_path)
    p = subprocess.run([CLI, "uninstall", "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    for path in paths:
        assert str(path) in p.stdout, (path, p.stdout)
    assert "4.0 KiB  " + str(paths[0]) in p.stdout and "in all" in p.stdout and all(os.path.exists(x) for x in paths)
    p = subprocess.run([CLI, "uninstall"], capture_output=True, text=True, env=env, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and "run it with --yes" in p.stdout and all(os.path.exists(x) for x in paths)

    def in_a_terminal(answer):
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(CLI, [CLI, "uninstall"], env)
        out = b""
        while b"[y/N]" not in out:
            out += os.read(fd, 4096)
        os.write(fd, answer + b"\n")
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        return os.waitstatus_to_exitcode(status), out.decode(errors="replace")
    rc, out = in_a_terminal(b"n")
    assert rc == 1 and "nothing removed" in out and all(os.path.exists(x) for x in paths)
    rc, out = in_a_terminal(b"y")
    assert rc == 0 and "removed" in out, out
    assert not any(os.path.lexists(x) for x in paths), [x for x in paths if os.path.lexists(x)]
    assert "pip uninstall bulkhead" in out and "custom_nodes" in out
    p = subprocess.run([CLI, "uninstall", "--yes"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "nothing of bulkhead's is left" in p.stdout


def test_uninstall_removes_only_what_bulkhead_made(tmp_path, monkeypatch):
    """What the user keeps beside bulkhead's own stays: other files in
    $BULKHEAD_HOME and in ~/.cache/bulkhead, and, where the ledger fell
    back to $XDG_RUNTIME_DIR/bulkhead-ledger (another local user took
    /dev/shm/bulkhead-<uid> first), the rest of that runtime directory
    (agent and session sockets): only the ledger file goes.  The holders
    bulkhead named for itself go once empty; one that is not is named.
    (uninstall removed $BULKHEAD_HOME and the ledger's parent whole.)"""
    from bulkhead import _native
    from bulkhead.envs import build as envs
    from bulkhead.cli import uninstall
    env, paths = _bulkhead_leftovers(tmp_path)
    home, cache, run = tmp_path / "home", tmp_path / "xdg-cache", tmp_path / "xdg-run"
    for k in ("BULKHEAD_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("BULKHEAD_LEDGER", raising=False)
    ledger = run / "bulkhead-ledger"
    ledger.write_bytes(b"\0" * 8192)
    monkeypatch.setattr(_native, "ledger_default_path", lambda: str(ledger))
    (home / "notes.txt").write_text("mine")
    (run / "agent.sock").write_text("")
    (cache / "bulkhead" / "theirs").write_text("")
    (home / "conda-pkgs").mkdir()
    out = io.StringIO()
    assert uninstall.main(yes=True, out=out) == 0, out.getvalue()
    gone = [*paths[:4], home / "conda-pkgs", ledger, run / "bulkhead"]
    assert not any(os.path.lexists(p) for p in gone), [p for p in gone if os.path.lexists(p)]
    assert (home / "notes.txt").exists() and (run / "agent.sock").exists() and (cache / "bulkhead" / "theirs").exists()
    assert f"kept {cache / 'bulkhead'}: it holds what bulkhead did not make (theirs)" in out.getvalue()
    assert sorted(os.listdir(home)) == ["notes.txt"] and sorted(os.listdir(run)) == ["agent.sock"]
    # Once that file is gone, its holder goes too, and nothing else is.
    (cache / "bulkhead" / "theirs").unlink()
    (home / "envs").mkdir()
    assert uninstall.main(yes=True, out=io.StringIO()) == 0
    assert not (cache / "bulkhead").exists() and not (home / "envs").exists() and (home / "notes.txt").exists()


def test_uninstall_knows_every_workspace_entry():
    """Each os.path.join(workspace(), "<name>", ...) in bulkhead's sources
    names an entry of WORKSPACE_ENTRIES, the list uninstall removes."""
    import ast
    import glob
    from bulkhead.envs import build as envs
    root = os.path.dirname(os.path.abspath(envs.__file__ + "/.."))
    named = set()
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if (isinstance(node, ast.Call) and node.args and len(node.args) > 1
                    and isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, "id",
                                                                       getattr(node.args[0].func, "attr", "")) == "workspace"
                    and isinstance(node.args[1], ast.Constant)):
                named.add(node.args[1].value)
    assert named and named <= set(envs.WORKSPACE_ENTRIES), named - set(envs.WORKSPACE_ENTRIES)


def test_uninstall_refuses_while_a_worker_runs(tmp_path):
    env, paths = _bulkhead_leftovers(tmp_path)
    envdir = paths[0] / "pack-0123456789ab"
    os.symlink(sys.executable, envdir / "bin" / "python")
    worker = subprocess.Popen([str(envdir / "bin" / "python"), "-c", "import time; time.sleep(60)"])
    try:
        p = subprocess.run([CLI, "uninstall", "--yes"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 1 and f"pid {worker.pid}" in p.stdout and "stop ComfyUI" in p.stdout, p.stdout
        assert all(os.path.exists(x) for x in paths)
    finally:
        worker.kill()
        worker.wait()


def test_uninstall_leaves_a_running_hosts_own_directory(tmp_path):
    """A host's own directory under /tmp (bulkhead-<uid>-<pid>-*: its
    control socket, its workers' package root) is never a leftover while
    that host runs; once it has exited, it is."""
    import tempfile
    env, paths = _bulkhead_leftovers(tmp_path)
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = tempfile.mkdtemp(prefix=f"bulkhead-{os.getuid()}-{host.pid}-", dir="/tmp")
    try:
        p = subprocess.run([CLI, "uninstall", "--yes"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stdout
        assert os.path.isdir(live) and live not in p.stdout, p.stdout
        assert not any(os.path.lexists(x) for x in paths)
    finally:
        host.kill()
        host.wait()
    p = subprocess.run([CLI, "uninstall", "--yes"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and live in p.stdout and not os.path.exists(live), p.stdout
