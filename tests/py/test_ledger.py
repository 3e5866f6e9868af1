"""The machine-wide ledger through bulkhead._native.Ledger: the binding's
API and its argument checks, files it must refuse, records written by a
real worker process (under this interpreter and another one) and reaped
after SIGKILL, live residency readings, and a repeated-call leak check.

Every test points the ledger at its own file under tmp_path, never at the
default /dev/shm path other bulkhead processes of this user may share.
"""

import os
import signal
import struct
import sys
import time

import pytest

from bulkhead import _native
from bulkhead._native import Ledger, LedgerError

from conftest import WORKER_VENVS


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "ledger")


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_api_roundtrip(path):
    with Ledger(path) as l:
        assert l.path == path and not l.closed
        assert not l.joined and l.slot == -1
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert l.records() == []
        assert l.read(os.getpid()) is None and l.version(os.getpid()) is None
        before = time.monotonic_ns()
        ver = "%d.%d.%d" % sys.version_info[:3]
        slot = l.join("host", pack="", interpreter=ver, generation=1)
        assert l.joined and l.slot == slot >= 0
        # the record's write counter: the same until the record changes
        v = l.version(os.getpid())
        assert v % 2 == 0 and l.read(os.getpid()) and l.version(os.getpid()) == v
        l.set_run("idle")
        assert l.version(os.getpid()) > v
        # A second join refills the record, never duplicates it.
        assert l.join("host", interpreter=ver, generation=2) == slot
        l.set_device("cuda:GPU-8f3a", held_bytes=1, pinned_bytes=2, pin_ceiling_bytes=3,
                     pager_bytes=4, floor_bytes=5, reserve_bytes=6)
        l.set_device("cpu")
        l.set_model(7, "unet", "cuda:GPU-8f3a", 5 << 30, 3 << 30)
        l.set_model(2**64 - 1, "clip", "cpu", 100, 100)
        l.set_model(9, "vae", "", 10, 0)
        l.set_run("busy")
        l.note_release(100)
        l.note_release(23)
        recs = l.records()
        assert len(recs) == 1
        r = recs[0]
        assert r == l.read(os.getpid())
        assert r["slot"] == slot and r["pid"] == os.getpid()
        assert r["role"] == "host" and r["run"] == "busy" and r["generation"] == 2
        assert r["host_pid"] == 0 and r["pack"] == ""
        assert r["interpreter"] == "%d.%d.%d" % sys.version_info[:3]
        with open(f"/proc/{os.getpid()}/stat") as f:
            assert r["start_time"] == int(f.read().rsplit(")", 1)[1].split()[19])
        assert before <= r["last_used_ns"] <= time.monotonic_ns()
        assert r["release_count"] == 2 and r["released_bytes"] == 123
        assert r["devices"] == [
            {"device": "cuda:GPU-8f3a", "held_bytes": 1, "pinned_bytes": 2, "pin_ceiling_bytes": 3,
             "pager_bytes": 4, "floor_bytes": 5, "reserve_bytes": 6},
            {"device": "cpu", "held_bytes": 0, "pinned_bytes": 0, "pin_ceiling_bytes": 0,
             "pager_bytes": 0, "floor_bytes": 0, "reserve_bytes": 0}]
        assert r["models"] == [
            {"id": 7, "name": "unet", "device": "cuda:GPU-8f3a", "size_bytes": 5 << 30,
             "resident_bytes": 3 << 30},
            {"id": 2**64 - 1, "name": "clip", "device": "cpu", "size_bytes": 100, "resident_bytes": 100},
            {"id": 9, "name": "vae", "device": "", "size_bytes": 10, "resident_bytes": 0}]
        assert l.resident(os.getpid(), 7) == (5 << 30, 3 << 30)
        assert l.resident(os.getpid(), 2**64 - 1) == (100, 100)
        assert l.resident(os.getpid(), 8) is None
        assert l.resident(1, 7) is None  # pid 1 has no record
        l.drop_model(7)
        assert l.resident(os.getpid(), 7) is None
        with pytest.raises(KeyError):
            l.drop_model(7)
        assert l.reap() == 0
        l.leave()
        assert not l.joined and l.slot == -1
        assert l.records() == []
    assert l.closed
    l.close()  # idempotent
    assert not os.path.exists(path)  # the last handle out removed it
    with pytest.raises(ValueError, match="closed"):
        l.records()
    with pytest.raises(ValueError, match="closed"):
        l.path


def test_default_path_and_env(path, monkeypatch):
    monkeypatch.delenv("BULKHEAD_LEDGER", raising=False)
    assert _native.ledger_default_path() == f"/dev/shm/bulkhead-{os.geteuid()}/ledger"
    monkeypatch.setenv("BULKHEAD_LEDGER", path)
    assert _native.ledger_default_path() == path
    l = Ledger()
    assert l.path == path and os.path.exists(path)
    l.close()
    assert not os.path.exists(path)
    assert _native.LEDGER_SLOTS >= 64 and _native.LEDGER_MODELS >= 32 and _native.LEDGER_VERSION >= 1


def test_two_handles_one_file(path):
    a, b = Ledger(path), Ledger(path)
    slot = a.join("worker", pack="p", generation=3)
    assert b.join("worker", pack="p", generation=3) == slot  # same process, same record
    a.set_model(1, "m", "cpu", 10, 10)
    assert b.resident(os.getpid(), 1) == (10, 10)
    a.set_model(1, "m", "cpu", 10, 4)
    assert b.resident(os.getpid(), 1) == (10, 4)  # a live reading, not a copy
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)


def test_argument_errors(path):
    with Ledger(path) as l:
        with pytest.raises(LedgerError) as ei:
            l.set_run("busy")
        assert ei.value.errname == "BH_ENOTJOINED" and ei.value.code == 10043
        with pytest.raises(LedgerError, match="join first"):
            l.leave()
        with pytest.raises(ValueError, match="unknown role 'boss'"):
            l.join("boss")
        with pytest.raises(TypeError):
            l.join(1)
        with pytest.raises(ValueError, match=r"pack is 64 bytes in UTF-8; the ledger holds at most 63"):
            l.join("worker", pack="p" * 64)
        with pytest.raises(ValueError, match=r"interpreter is 48 bytes"):
            l.join("worker", interpreter="é" * 24)
        with pytest.raises(ValueError, match="NUL"):
            l.join("worker", pack="a\0b")
        with pytest.raises(OverflowError, match="generation must be at most 4294967295"):
            l.join("worker", generation=2**32)
        with pytest.raises(OverflowError, match="generation must not be negative"):
            l.join("worker", generation=-1)
        with pytest.raises(OverflowError, match="host_pid"):
            l.join("worker", host_pid=2**31)
        with pytest.raises(TypeError, match="generation must be an int"):
            l.join("worker", generation=1.5)
        assert not l.joined
        l.join("worker", pack="p" * 63, interpreter="i" * 47)  # exactly full fields
        assert l.read(os.getpid())["pack"] == "p" * 63
        with pytest.raises(ValueError, match="unknown run state 'sleeping'"):
            l.set_run("sleeping")
        with pytest.raises(ValueError, match="run state 'stale' is only read"):
            l.set_run("stale")
        l.set_run("working")     # a pack's bulkhead.working()
        assert l.read(os.getpid())["run"] == "working"
        with pytest.raises(ValueError, match="device must not be empty"):
            l.set_device("")
        with pytest.raises(ValueError, match="device is 48 bytes"):
            l.set_device("d" * 48)
        with pytest.raises(OverflowError, match="held_bytes must not be negative"):
            l.set_device("cpu", held_bytes=-1)
        with pytest.raises(OverflowError, match="reserve_bytes must be at most 9223372036854775807"):
            l.set_device("cpu", reserve_bytes=2**63)
        with pytest.raises(OverflowError, match="model_id must be at most"):
            l.set_model(2**64, "m", "cpu", 1, 1)
        with pytest.raises(OverflowError, match="model_id must not be negative"):
            l.set_model(-1, "m", "cpu", 1, 1)
        with pytest.raises(OverflowError, match="size_bytes"):
            l.set_model(1, "m", "cpu", 2**64, 1)
        with pytest.raises(OverflowError, match="resident_bytes"):
            l.set_model(1, "m", "cpu", 1, -5)
        with pytest.raises(ValueError, match="name is 48 bytes"):
            l.set_model(1, "n" * 48, "cpu", 1, 1)
        with pytest.raises(TypeError, match="name must be a str"):
            l.set_model(1, b"m", "cpu", 1, 1)
        with pytest.raises(OverflowError, match="bytes must not be negative"):
            l.note_release(-1)
        with pytest.raises(ValueError, match="pid must be a positive pid"):
            l.read(0)
        with pytest.raises(OverflowError):
            l.resident(-3, 1)
        for i in range(_native.LEDGER_MODELS):
            l.set_model(i, "m", "cpu", i, i)
        with pytest.raises(LedgerError) as ei:
            l.set_model(1000, "m", "cpu", 1, 1)
        assert ei.value.errname == "BH_EMODELS"
        for i in range(_native.LEDGER_DEVICES - 1):
            l.set_device(f"cuda:{i}")
        with pytest.raises(LedgerError, match="BH_EMODELS"):
            l.set_device("cuda:99")
        assert len(l.read(os.getpid())["models"]) == _native.LEDGER_MODELS
    assert not os.path.exists(path)


def test_refuses_files_that_are_not_ours(path):
    with open(path, "wb") as f:
        f.write(b"not a ledger at all")
    os.chmod(path, 0o600)
    with pytest.raises(LedgerError) as ei:
        Ledger(path)
    assert ei.value.errname == "BH_ELEDGER" and path in str(ei.value)
    # The right magic, another layout version.
    with open(path, "wb") as f:
        f.write(b"BHLEDGR\0" + struct.pack("<I", _native.LEDGER_VERSION + 1))
        f.truncate(204800)
    with pytest.raises(LedgerError) as ei:
        Ledger(path)
    assert ei.value.errname == "BH_ELEDGERVER"
    os.unlink(path)
    # Group/other permissions on a real ledger.
    keep = Ledger(path)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError) as ei:
        Ledger(path)
    assert ei.value.filename == path and "0600" in str(ei.value)
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 12345, -1)
        with pytest.raises(PermissionError, match="owned by another user"):
            Ledger(path)
        os.chown(path, 0, -1)
    keep.close()
    assert not os.path.exists(path)
    link = path + ".link"
    os.symlink("/nonexistent", link)
    with pytest.raises(OSError, match="symbolic link"):
        Ledger(link)
    os.unlink(link)


def _other_python():
    host = "%d.%d." % sys.version_info[:2]
    for name, py in WORKER_VENVS.items():
        if host not in name:
            return py
    return None


@pytest.mark.parametrize("which", ["same", "other"])
def test_worker_record_then_sigkill_reaps_it(make_worker, path, which):
    python = sys.executable if which == "same" else _other_python()
    if python is None:
        pytest.skip("no worker venv with another Python version (run `make worker-venvs`)")
    host = Ledger(path)
    host.join("host", interpreter="%d.%d.%d" % sys.version_info[:3], generation=1)
    w = make_worker(python, name="ledger", env={"BULKHEAD_LEDGER": path})
    w.start()
    slot, wpath = w.call("bh_testmod:ledger_join", "worker", "my-pack", 5)
    assert wpath == path
    wver = w.call("bh_testmod:version")
    r = host.read(w.pid)
    assert r is not None and r["slot"] == slot
    assert r["role"] == "worker" and r["pack"] == "my-pack"
    assert r["interpreter"] == wver and r["generation"] == 5
    assert r["host_pid"] == os.getpid() and r["run"] == "idle"
    assert sorted(x["pid"] for x in host.records()) == sorted([os.getpid(), w.pid])

    # resident() follows the writer: live values, no messages.
    assert host.resident(w.pid, 11) is None
    w.call("bh_testmod:ledger_set_model", 11, "unet", "cpu", 4096, 4096)
    assert host.resident(w.pid, 11) == (4096, 4096)
    w.call("bh_testmod:ledger_set_model", 11, "unet", "cpu", 4096, 1024)
    assert host.resident(w.pid, 11) == (4096, 1024)
    w.call("bh_testmod:ledger_set_run", "busy")
    assert host.read(w.pid)["run"] == "busy"

    pid = w.pid
    w.kill(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while host.read(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert host.read(pid) is None
    assert [x["pid"] for x in host.records()] == [os.getpid()]
    assert host.resident(pid, 11) is None
    w.close()
    host.close()
    assert not os.path.exists(path)


def test_worker_leaves_on_close(make_worker, path):
    host = Ledger(path)
    w = make_worker(name="ledger-leave", env={"BULKHEAD_LEDGER": path})
    w.start()
    w.call("bh_testmod:ledger_join", "worker", "p", 1)
    assert len(host.records()) == 1
    w.call("bh_testmod:ledger_close")
    assert host.records() == []
    w.close()
    host.close()
    assert not os.path.exists(path)


def test_fork_child_does_not_own_the_record(path):
    l = Ledger(path)
    l.join("host")
    l.set_model(1, "m", "cpu", 1, 1)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            try:
                l.set_model(1, "m", "cpu", 2, 2)
                code = 2
            except LedgerError as e:
                code = 0 if e.errname == "BH_ENOTJOINED" else 3
            if l.joined or l.resident(os.getppid(), 1) != (1, 1):
                code = 4
            l.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert os.path.exists(path)
    assert l.resident(os.getpid(), 1) == (1, 1)
    l.close()
    assert not os.path.exists(path)


def test_repeated_calls_do_not_leak(path):
    l = Ledger(path)
    l.join("worker", pack="leak", generation=1)
    me = os.getpid()

    def round_(n):
        for i in range(n):
            l.set_model(i % 8, "model", "cpu", i, i)
            assert l.resident(me, i % 8) == (i, i)
            assert len(l.records()) == 1
            l.read(me)
            l.set_device("cpu", held_bytes=i)
            l.set_run("busy" if i % 2 else "idle")
            l.note_release(1)

    round_(1000)  # warm up allocators and caches
    fds = sorted(os.listdir("/proc/self/fd"))
    rss = _rss_kib()
    round_(10000)
    assert sorted(os.listdir("/proc/self/fd")) == fds
    if not os.environ.get("BULKHEAD_ASAN"):  # ASan's quarantine grows RSS by design
        grown = _rss_kib() - rss
        assert grown < 2048, f"RSS grew {grown} KiB over 10^4 rounds"
    for _ in range(200):  # open/close churn: fds come back every time
        Ledger(path).close()
    assert sorted(os.listdir("/proc/self/fd")) == fds
    l.close()
    assert not os.path.exists(path)


def test_native_api_presence():
    for name in ("join", "leave", "close", "set_run", "set_device", "set_model", "drop_model",
                 "note_release", "records", "read", "resident", "reap", "__enter__", "__exit__"):
        assert callable(getattr(Ledger, name)), name
    for name in ("path", "joined", "slot", "closed"):
        assert hasattr(Ledger, name), name
    assert issubclass(LedgerError, _native.Error)
