"""Workers forked by a zygote (host/zygote.py, worker/zygote.py).

Each test starts real workers in real venvs through a real zygote and
checks what a spawned worker would have: the interpreter, sys.path and
site of its own environment, its own process group, the status of its
end, and nothing left behind (no_leaks: no child, no fd)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from bulkhead.host import zygote


PROBE = "bulkhead_zyprobe:info"
PROBE_SRC = '''
import os, sys
def info():
    mod = sys.modules.get("zyshared")
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "executable": sys.executable,
            "prefix": sys.prefix, "path": list(sys.path), "cwd": os.getcwd(),
            "env": {k: v for k, v in os.environ.items() if k.startswith("ZY_")},
            "zyshared": getattr(mod, "__file__", None), "torch_loaded": "torch" in sys.modules,
            "pth_mark": getattr(sys, "zy_pth", None)}
def zyshared():
    import zyshared
    return zyshared.WHO
def helper():
    import subprocess
    return subprocess.Popen(["sleep", "60"]).pid
'''


def _venv(root, name, shared=None):
    """A venv of this interpreter (no pip) whose site-packages holds the
    probe and, where shared is given, a module zyshared saying so and a
    .pth whose import line marks sys with it (as an editable install's
    hook would change the interpreter)."""
    path = os.path.join(root, name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    site = subprocess.run([os.path.join(path, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "bulkhead_zyprobe.py"), "w") as f:
        f.write(PROBE_SRC)
    if shared is not None:
        with open(os.path.join(site, "zyshared.py"), "w") as f:
            f.write(f"WHO = {shared!r}\n")
        with open(os.path.join(site, "zymark.pth"), "w") as f:
            f.write(f"import sys; sys.zy_pth = {shared!r}\n")
    return os.path.join(path, "bin", "python")


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """Three venvs, made once for the module: the tests only read them
    (the one that rewrites a module makes its own, fresh_a)."""
    root = str(tmp_path_factory.mktemp("zyvenvs"))
    return {"a": _venv(root, "a", shared="a"), "b": _venv(root, "b", shared="b"), "plain": _venv(root, "plain")}


@pytest.fixture
def fresh_a(tmp_path):
    """A venv like venvs["a"], the test's own to change."""
    return _venv(str(tmp_path), "a", shared="a")


# multiprocessing, as torch imports it: it names __main__ (this worker's
# __main__.py) __mp_main__ too, which is no import an environment makes
PRELOAD = ("zyshared", "multiprocessing")


@pytest.fixture
def forked(make_worker):
    """forked(python, preload=PRELOAD, name=, **env) -> a Worker that a
    zygote forks (closed after the test, by make_worker)."""
    def make(python, preload=PRELOAD, name="zy", **env):
        w = make_worker(python, name=name, env=env)
        w.zygote_preload = list(preload)
        return w
    return make


def test_a_forked_worker_is_what_a_spawned_one_would_be(forked, make_worker, venvs):
    w = forked(venvs["a"], ZY_X="1")
    got = w.call(PROBE)
    z = next(iter(zygote._zygotes.values()))
    assert got["ppid"] == z.pid != os.getpid()          # forked by the zygote ...
    assert got["pgid"] == got["pid"]                     # ... leading its own group
    # not exec'd: the zygote's zyshared, imported before the fork
    assert got["zyshared"].startswith(os.path.dirname(os.path.dirname(os.path.dirname(venvs["a"]))))
    want = make_worker(venvs["a"], name="spawned", env={"ZY_X": "1"}).call(PROBE)
    for k in ("executable", "prefix", "path", "cwd", "env"):
        assert got[k] == want[k], k
    assert w.call("bulkhead_zyprobe:zyshared") == "a"


def test_one_zygote_serves_workers_of_many_environments_and_execs_where_a_module_differs(forked, venvs):
    a, b, plain = forked(venvs["a"], name="a"), forked(venvs["b"], name="b"), forked(venvs["plain"], name="p")
    ia, ib, ip = a.call(PROBE), b.call(PROBE), plain.call(PROBE)
    assert len(zygote._zygotes) == 1
    zpid = next(iter(zygote._zygotes.values())).pid
    assert ia["ppid"] == ib["ppid"] == ip["ppid"] == zpid
    # b's environment has its own zyshared: b was exec'd, and imports its own
    assert b.call("bulkhead_zyprobe:zyshared") == "b"
    assert a.call("bulkhead_zyprobe:zyshared") == "a"
    # plain has none: a's preloaded copy is not its to see
    assert ip["zyshared"] is None
    assert (ia["pth_mark"], ib["pth_mark"], ip["pth_mark"]) == ("a", "b", None)
    with pytest.raises(Exception, match="zyshared"):
        plain.call("bulkhead_zyprobe:zyshared")
    assert ip["prefix"] == os.path.dirname(os.path.dirname(venvs["plain"]))


def test_a_module_rewritten_in_place_is_not_handed_out_from_the_preload(forked, fresh_a):
    """An environment rebuilt in place (the same paths, new files) while
    its zygote runs: the next worker imports the new file, not the module
    the zygote preloaded from the old one (it execs, as where a module
    differs)."""
    w = forked(fresh_a)
    assert w.call("bulkhead_zyprobe:zyshared") == "a"
    zpid = w.call(PROBE)["ppid"]
    path = w.call(PROBE)["zyshared"]
    time.sleep(0.01)
    with open(path + ".new", "w") as f:
        f.write("WHO = 'a, rebuilt'\n")
    os.replace(path + ".new", path)
    w.close()
    assert w.call("bulkhead_zyprobe:zyshared") == "a, rebuilt"
    assert w.call(PROBE)["ppid"] == zpid     # forked by that zygote, which then exec'd the interpreter


def test_no_environment_s_pth_code_reaches_another_s_worker(forked, venvs):
    """The zygote, started from a's interpreter, runs no site: a's .pth
    import line runs in a's workers only, and plain's worker, forked (its
    environment imports the preload from where the zygote did), has none."""
    a, plain = forked(venvs["a"], preload=("multiprocessing",), name="a"), \
        forked(venvs["plain"], preload=("multiprocessing",), name="p")
    ia, ip = a.call(PROBE), plain.call(PROBE)
    assert ia["ppid"] == ip["ppid"] != os.getpid()     # one zygote, neither exec'd
    assert (ia["pth_mark"], ip["pth_mark"]) == ("a", None)


def test_another_environment_gets_another_zygote(forked, venvs):
    one, two = forked(venvs["a"], name="one"), forked(venvs["a"], name="two", OMP_NUM_THREADS="1")
    assert one.call(PROBE)["ppid"] != two.call(PROBE)["ppid"]
    assert len(zygote._zygotes) == 2


def test_a_killed_worker_is_seen_with_its_signal_and_the_next_is_forked_again(forked, venvs):
    w = forked(venvs["a"])
    first = w.call(PROBE)
    helper = w.call("bulkhead_zyprobe:helper")
    os.kill(first["pid"], signal.SIGKILL)
    # seen (poll, or whichever host thread noticed first) with the
    # status the zygote reported for it
    deadline = time.monotonic() + 10
    while w.last_exit is None and time.monotonic() < deadline:
        w.poll()
        time.sleep(0.02)
    assert "signal 9 (SIGKILL)" in (w.last_exit or ""), w.last_exit
    # its helper (its process group) went with it, as with a spawned worker
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{helper}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{helper}")
    again = w.call(PROBE)
    assert again["pid"] != first["pid"] and again["ppid"] == first["ppid"]


# A zygote killed (SIGKILL) or stopped (SIGSTOP) at each phase of its
# worker's life -- while the worker serves, then ends on its own; when the
# host stops the worker; when a fork is asked of it; at /free's stop_idle
# -- is a row of the kill matrix (test_kill_matrix.py, ZYGOTE_MATRIX).


def test_a_request_that_is_not_a_fork_is_refused_and_the_zygote_serves_on(forked, venvs):
    w = forked(venvs["a"])
    first = w.call(PROBE)
    z = next(iter(zygote._zygotes.values()))
    for bad in (b"[1]", b"not json", b'{"op": "fork"}', b'"x"'):   # the last two: no fds, not a map
        with z._lock:
            os.write(z.fd, bad)
            answer = os.read(z.fd, 600)
        assert answer[:4] == (-22).to_bytes(4, sys.byteorder, signed=True), answer
    w.close()
    assert w.call(PROBE)["ppid"] == first["ppid"] == z.pid


def test_stop_idle_ends_a_zygote_with_no_worker_and_keeps_one_with_workers(forked, venvs):
    w = forked(venvs["a"])
    w.call(PROBE)
    assert zygote.stop_idle() == 0 and len(zygote._zygotes) == 1
    w.close()
    assert zygote.stop_idle() == 1 and not zygote._zygotes


def test_zygotes_off(forked, venvs, monkeypatch):
    monkeypatch.setenv("BULKHEAD_ZYGOTE", "0")
    w = forked(venvs["a"])
    assert w.call(PROBE)["ppid"] == os.getpid()
    assert not zygote._zygotes


def test_a_zygote_that_could_not_start_is_tried_again_later(forked, venvs, tmp_path, monkeypatch):
    """An interpreter that fails as a zygote (here: while a flag file
    exists) gets its workers spawned, one by one; a later worker tries a
    zygote again only BULKHEAD_ZYGOTE_RETRY_S after, and then is forked."""
    flag = tmp_path / "refuse"
    flag.write_text("")
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nif [ -n "$BULKHEAD_AS_ZYGOTE" ] && [ -e {flag} ]; then\n'
                  f'  echo no zygote here >&2; exit 3\nfi\nexec {venvs["a"]} "$@"\n')
    py.chmod(0o755)
    w = forked(str(py))
    assert w.call(PROBE)["ppid"] == os.getpid()           # spawned: its zygote ended at start-up
    assert len(zygote._refused) == 1 and not zygote._zygotes
    flag.unlink()
    w.close()
    assert w.call(PROBE)["ppid"] == os.getpid()           # not tried again so soon
    monkeypatch.setenv("BULKHEAD_ZYGOTE_RETRY_S", "0")
    w.close()
    got = w.call(PROBE)
    assert got["ppid"] == next(iter(zygote._zygotes.values())).pid != os.getpid()
    assert not zygote._refused


def test_many_starts_leave_nothing(forked, venvs):
    """20 generations through one zygote: fds flat here (no_leaks checks
    the rest) and the zygote reaped every one (no zombie under it)."""
    w = forked(venvs["a"])
    w.call(PROBE)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        w.close()
        w.call(PROBE)
    assert len(os.listdir("/proc/self/fd")) == fds
    zpid = next(iter(zygote._zygotes.values())).pid
    kids = [p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == zpid]
    assert len(kids) == 1, kids


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None
