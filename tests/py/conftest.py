"""Fixtures for bulkhead's Python tests.

Every test runs under `no_leaks` (autouse): afterwards this process has
the same open fds, no child processes (running or zombie) and /dev/shm is
unchanged.  Worker interpreters come from the venvs `make` builds under
BULKHEAD_WORKER_VENVS (one per pyenv CPython 3.9-3.13 and Debian's python3,
each with numpy), so calls really cross interpreters.
"""

import gc
import os
import sys
import time

import pytest

import bulkhead
import bulkhead.host.workers

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "helpers")


def _worker_venvs():
    root = os.environ.get("BULKHEAD_WORKER_VENVS", os.path.join(HERE, "..", "..", "build", "venvs"))
    out = {}
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            py = os.path.join(root, name, "bin", "python")
            if os.access(py, os.X_OK):
                out[name] = os.path.abspath(py)
    return out


WORKER_VENVS = _worker_venvs()


def other_interpreter():
    """A worker interpreter that is not the host's own version."""
    host = "%d.%d." % sys.version_info[:2]
    for name, py in WORKER_VENVS.items():
        if host not in name:
            return py
    pytest.skip("no worker venv with another Python version (run `make worker-venvs`)")


def _fds():
    return sorted(os.listdir("/proc/self/fd"))


def _children():
    me = str(os.getpid())
    kids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            kids.append((int(pid), fields[0]))
    return kids


def _shm():
    """/dev/shm's names; the default ledger's private directory (made once,
    kept: bh_private_dir) counts as what is in it."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    mine = f"bulkhead-{os.geteuid()}"
    if mine in names:
        names.remove(mine)
        try:
            names += [f"{mine}/{n}" for n in os.listdir(f"/dev/shm/{mine}")]
        except OSError:
            names.append(mine)
    return sorted(names)


# no_leaks collects garbage before and after every test, so that what a
# test leaves is told from what an earlier one left for the collector.  A
# full collection walks every object the process tracks: once a test has
# imported torch, ~175k of them and ~0.14 s, twice a test, whatever the
# test does.  So what is alive when a test starts is frozen (gc.freeze:
# kept out of later collections) and each collection walks only what was
# made since; the test's own objects, fixtures of its scope included, are
# collected as before.  What was alive at a test's start and becomes
# garbage during it waits for the module's end, where the frozen objects
# are handed back to the collector (thaw) and the next test's collection
# is a full one.
@pytest.fixture(scope="module", autouse=True)
def thaw():
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def no_leaks(thaw):
    gc.collect()
    gc.freeze()
    fds, shm = _fds(), _shm()
    yield
    bulkhead.host.workers._close_all()
    gc.collect()
    deadline = time.monotonic() + 5
    while (_children() or _fds() != fds) and time.monotonic() < deadline:
        time.sleep(0.02)
        gc.collect()
    kids = _children()
    assert not kids, f"child processes left behind (pid, state): {kids}"
    now = _fds()
    leaked = {fd: _readlink(fd) for fd in set(now) - set(fds)}
    assert not leaked, f"fds left open: {leaked}"
    assert _shm() == shm, f"/dev/shm changed: {set(_shm()) ^ set(shm)}"


def _readlink(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture
def make_worker():
    """make_worker(python=sys.executable, **kw) -> a started Worker that
    can import the test helpers; closed after the test."""
    made = []

    def make(python=None, **kw):
        env = dict(kw.pop("env", {}))
        env.setdefault("PYTHONPATH", HELPERS)
        w = bulkhead.Worker(python or sys.executable, env=env, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.fixture
def worker(make_worker):
    w = make_worker(name="test")
    w.start()
    return w
