"""Calls, results, exceptions and callbacks across a real process."""

import math
import os

import pytest

import bulkhead

from conftest import HELPERS, WORKER_VENVS


def test_call_roundtrip_plain_values(worker):
    values = [None, True, False, 0, -1, 2**63 - 1, -2**63, 1.5, float("inf"), "", "héllo ✓",
              b"\x00\xff", [1, [2, [3]]], (1, (2,)), {"a": 1, 2: "b", (1, 2): None}, bytearray(b"xy")]
    for v in values:
        args, kwargs = worker.call("bh_testmod:echo", v, key=v)
        expect = bytes(v) if isinstance(v, bytearray) else v
        assert args == (expect,) and kwargs == {"key": expect}
        assert type(args[0]) is type(expect)
    nan = worker.call("bh_testmod:echo", float("nan"))[0][0]
    assert math.isnan(nan)


def test_module_dot_function_target(worker):
    assert worker.call("math.sqrt", 16.0) == 4.0
    assert worker.call("os.path:join", "a", "b") == "a/b"


def test_call_under_other_interpreter(make_worker):
    for name, py in WORKER_VENVS.items():
        w = make_worker(py, name=name)
        v = w.call("bh_testmod:version")
        assert w.info["python"] == v
        assert w.call("operator:mul", 6, 7) == 42
        w.close()
    if not WORKER_VENVS:
        pytest.skip("no worker venvs built")


INSTALLED_HOST = """
import glob, os, sys, bulkhead
from bulkhead.host import workerenv
root = workerenv.worker_pythonpath()
for py in sys.argv[2:]:
    w = bulkhead.Worker(py, name="installed", env={"PYTHONPATH": sys.argv[1]})
    try:
        assert w.call("operator:add", 1, 2) == 3
        assert w.call("bh_testmod:echo", 1) == ((1,), {})     # bulkhead's modules imported there
    finally:
        w.close()
print("root", root, len([p for p in glob.glob(os.path.join(root, "bulkhead", "**", "*.pyc"), recursive=True)
                         if not os.path.islink(p)]))   # what the workers compiled (pip's are links)
"""


def test_workers_never_write_into_the_installed_package(tmp_path):
    """bulkhead installed beside other packages (site-packages): workers
    under every interpreter import it from their host's package root, and
    the bytecode a worker under another minor compiles stays there, never
    in the installed package (pip uninstall leaves files it did not
    install: the folder left imported as an empty namespace package, and
    every pack failed on bulkhead.comfy_pack)."""
    import shutil
    import subprocess
    import sys
    if not WORKER_VENVS:
        pytest.skip("no worker venvs built")
    site = tmp_path / "site-packages"
    pkg = site / "bulkhead"
    shutil.copytree(os.path.dirname(os.path.abspath(bulkhead.__file__)), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "another_package.py").write_text("")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg)], check=True)   # as pip does
    before = sorted(p.relative_to(pkg) for p in pkg.rglob("*"))
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{HELPERS}")
    r = subprocess.run([sys.executable, "-c", INSTALLED_HOST, HELPERS, *WORKER_VENVS.values()], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0 and "root" in r.stdout, (r.stdout, r.stderr)
    assert sorted(p.relative_to(pkg) for p in pkg.rglob("*")) == before
    root, compiled = r.stdout.split()[1], int(r.stdout.split()[2])
    assert compiled > 0 and not os.path.exists(root)     # other minors' bytecode, gone with the host's root


HOST_SCRIPT = """
import sys, bulkhead
w = bulkhead.Worker(sys.executable, name="h", env={"PYTHONPATH": sys.argv[1]})
try:
    assert w.call("operator:add", 1, 2) == 3 and w.busy == 0 and w.generation == 1
    try:
        w._chan = object()
    except TypeError as e:
        assert "not <class 'object'>" in str(e), e
    else:
        raise AssertionError("a non-Channel was accepted")
    w.call_timeout_s = 5
    assert w.call("bh_testmod:echo", 1, k=2) == ((1,), {"k": 2})
    with w._lock:
        assert w.call("operator:mul", 6, 7) == 42  # the RLock is re-entrant from C too
finally:
    w.close()
print("host ok", "%d.%d" % sys.version_info[:2])
"""


def test_host_under_other_interpreter():
    """The host side (Worker.call in C, _native.Caller) under every
    interpreter: ComfyUI's own Python may be any of 3.9-3.13."""
    import subprocess
    if not WORKER_VENVS:
        pytest.skip("no worker venvs built")
    # Only bulkhead's own directory: the host's sys.path holds its stdlib.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(bulkhead.__file__))))
    for name, py in WORKER_VENVS.items():
        run = subprocess.run([py, "-c", HOST_SCRIPT, HELPERS], capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0 and "host ok" in run.stdout, (name, run.stdout, run.stderr)


def test_builtin_exception_crosses_as_builtin(worker):
    with pytest.raises(KeyError) as ei:
        worker.call("bh_testmod:boom", "missing-thing")
    e = ei.value
    assert isinstance(e, bulkhead.RemoteError)
    assert e.remote_type == "KeyError"
    assert "missing-thing" in e.remote_message
    assert "bh_testmod.py" in e.remote_traceback and "boom" in e.remote_traceback


def test_custom_exception_carries_type_and_traceback(worker):
    with pytest.raises(bulkhead.RemoteError) as ei:
        worker.call("bh_testmod:custom_boom")
    e = ei.value
    assert e.remote_type == "bh_testmod.PackError"
    assert isinstance(e, RuntimeError)  # nearest builtin base
    assert "inner()" in e.remote_message
    assert "in inner" in e.remote_traceback
    assert str(e) == "the pack failed in inner()"
    assert "worker 'test'" in e.detail and "in inner" in e.detail


def _testmod():
    """bh_testmod loaded here, under its own name (as the worker has it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bh_testmod", os.path.join(HELPERS, "bh_testmod.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raised_here(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        return e
    raise AssertionError(f"{fn} did not raise")


def _full_type_name(klass):
    """How ComfyUI's executor names an exception's class (execution.py
    full_type_name): module.qualname, the bare qualname for a builtin."""
    return klass.__qualname__ if klass.__module__ == "builtins" else f"{klass.__module__}.{klass.__qualname__}"


@pytest.mark.parametrize("target, args", [
    ("raise_builtin", ("ValueError", "msg")),
    ("raise_builtin", ("KeyError", "missing-thing")),              # str() quotes it
    ("raise_builtin", ("OSError", 2, "No such file", "/no/where")),  # FileNotFoundError, errno, filename
    ("raise_builtin", ("RuntimeError", "first line\nsecond line\n\nafter a blank line\n")),
    ("raise_builtin", ("ValueError",)),                               # no message at all
    ("raise_pack", ("a pack's own class\nover two lines", 3)),
    ("custom_boom", ()),
])
def test_exception_is_named_and_said_as_in_process(worker, target, args):
    """What the host raises for a worker's exception is, to ComfyUI's
    executor (its exception_type and exception_message) and to code that
    catches it, what the same call raises in-process; the worker's
    traceback is its __cause__, in a logged traceback, not in its message."""
    import traceback
    bh_testmod = _testmod()
    want = _raised_here(getattr(bh_testmod, target), *args)
    with pytest.raises(Exception) as ei:
        worker.call(f"bh_testmod:{target}", *args)
    got = ei.value
    assert _full_type_name(type(got)) == _full_type_name(type(want))
    assert type(got).__name__ == type(want).__name__
    assert str(got) == str(want) and got.args == want.args and repr(got) == repr(want)
    for base in type(want).__mro__:
        if base.__module__ == "builtins":
            assert isinstance(got, base), base
    assert isinstance(got, bulkhead.RemoteError) and got.remote_type == _full_type_name(type(want))
    if isinstance(want, OSError):
        assert (got.errno, got.strerror, got.filename) == (want.errno, want.strerror, want.filename)
    logged = "".join(traceback.format_exception(got))
    assert "worker 'test'" in logged and f", in {target}" in logged and "bh_testmod.py" in logged
    assert "worker" not in str(got)


def test_exception_args_that_cannot_cross_leave_the_message(worker):
    """An argument the channel does not carry as a plain value (here a
    list) stays in the worker: args is the message, str() still the
    original's."""
    bh_testmod = _testmod()
    want = _raised_here(bh_testmod.raise_builtin, "ValueError", "bad", [1, 2])
    with pytest.raises(ValueError) as ei:
        worker.call("bh_testmod:raise_builtin", "ValueError", "bad", [1, 2])
    assert str(ei.value) == str(want) == "('bad', [1, 2])"
    assert ei.value.args == (str(want),)


def test_unknown_target_is_a_clear_error(worker):
    with pytest.raises(ModuleNotFoundError):
        worker.call("no_such_module_xyz:f")
    with pytest.raises(AttributeError):
        worker.call("math:no_such_function")
    with pytest.raises(ValueError, match="module:function"):
        worker.call("justaname")
    assert worker.call("math:floor", 2.5) == 2  # still usable


def test_unsendable_argument_is_typeerror_naming_type(worker):
    class Thing:
        pass
    with pytest.raises(TypeError, match=r"test_calls\..*Thing.*no pickle"):
        worker.call("bh_testmod:echo", Thing())
    with pytest.raises(OverflowError, match="int64"):
        worker.call("bh_testmod:echo", 2**64)
    assert worker.call("operator:add", 1, 1) == 2


def test_unsendable_result_is_typeerror_naming_type(worker):
    with pytest.raises(TypeError, match="builtins.object"):
        worker.call("bh_testmod:unsendable")
    assert worker.call("operator:add", 2, 2) == 4


def test_callback_and_nested_reentry(worker):
    seen = []

    def host_fn(depth):
        seen.append(depth)
        if depth == 0:
            return "bottom"
        # re-enter the worker while it waits for this callback
        return worker.call("bh_testmod:call_back_twice_nested", host_fn, depth - 1)

    assert worker.call("bh_testmod:call_back_twice_nested", host_fn, 5) == "bottom"
    assert seen == [5, 4, 3, 2, 1, 0]
    assert worker.call("bh_testmod:call_back", lambda a, b: a * b, 6, 7) == 42


def test_callback_exception_reaches_worker_and_back(worker):
    def bad():
        raise ValueError("host side failure")
    with pytest.raises(ValueError, match="host side failure"):
        worker.call("bh_testmod:call_back", bad)


def test_named_host_function(worker):
    worker.expose("double", lambda x: 2 * x)
    assert worker.call("bh_testmod:host_named", "double", 21) == 42
    with pytest.raises(PermissionError, match="exposes no callable named 'nope'"):
        worker.call("bh_testmod:host_named", "nope")


def test_worker_env_is_controlled(make_worker, monkeypatch):
    monkeypatch.setenv("PYTHONHOME", "/nonexistent")  # would break the worker if it leaked
    monkeypatch.setenv("SOME_HOST_SECRET", "x")
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"):  # the user's thread tuning
        monkeypatch.setenv(k, "7")
    w = make_worker(env={"PACK_SETTING": "on"})
    env = w.call("os:environ.copy")
    assert env["PACK_SETTING"] == "on"
    assert env["OMP_WAIT_POLICY"] == env["GOMP_SPINCOUNT"] == env["KMP_BLOCKTIME"] == "7"
    assert "SOME_HOST_SECRET" not in env and "PYTHONHOME" not in env
    assert "BULKHEAD_FD" not in env


def test_worker_openmp_spin_is_bounded(make_worker, monkeypatch):
    """A worker's OpenMP and BLAS threads spin about 200 us after their
    work, not libgomp's 8-15 ms nor OpenBLAS's 0.1 s (bench/spin.py):
    GOMP_SPINCOUNT is set from the measured cost of a spin step and
    OPENBLAS_THREAD_TIMEOUT from the same time, unless the host's or the
    pack's environment tunes the threads itself."""
    from bulkhead.host import spin
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT", "BULKHEAD_OMP_SPIN_US"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(spin, "_spin", None)
    env = make_worker().call("os:environ.copy")
    assert env["GOMP_SPINCOUNT"] == spin.spin_env()["GOMP_SPINCOUNT"]
    assert 0 < int(env["GOMP_SPINCOUNT"]) < 300_000
    assert 4 < int(env["OPENBLAS_THREAD_TIMEOUT"]) < 28
    env = make_worker(env={"GOMP_SPINCOUNT": "5", "OPENBLAS_THREAD_TIMEOUT": "6"}).call("os:environ.copy")
    assert (env["GOMP_SPINCOUNT"], env["OPENBLAS_THREAD_TIMEOUT"]) == ("5", "6")
    passive = make_worker(env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert passive.call("os:getenv", "GOMP_SPINCOUNT") is None

    monkeypatch.setattr(spin, "_spin", None)
    monkeypatch.setenv("BULKHEAD_OMP_SPIN_US", "0")
    env = make_worker().call("os:environ.copy")
    assert (env["GOMP_SPINCOUNT"], env["OPENBLAS_THREAD_TIMEOUT"]) == ("0", "4")
    monkeypatch.setattr(spin, "_spin", None)
    for bad in ("fast", "inf", "nan", "-1"):   # inf was an OverflowError naming nothing
        monkeypatch.setenv("BULKHEAD_OMP_SPIN_US", bad)
        with pytest.raises(bulkhead.BulkheadError, match=rf"BULKHEAD_OMP_SPIN_US='{bad}' is not a number"):
            make_worker().call("os:getpid")
        monkeypatch.setattr(spin, "_spin", None)


_HOST_SPIN_PROBE = """
import json, os, sys
for m in sys.argv[1:]:
    __import__(m)
from bulkhead.host import spin
done = spin.bound_host_spin()
import numpy, torch
print(json.dumps({"done": done, "env": {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT")}}))
"""


def test_host_openmp_spin_is_bounded_before_torch_loads(monkeypatch):
    """ComfyUI's own process gets the same bound from bulkhead's prestartup
    script (spin.bound_host_spin; ComfyUI imports torch after it): each
    variable where the library reading it (once, as it loads) is not loaded
    yet and the user did not tune it; nothing where it is loaded already."""
    import json
    import subprocess
    import sys
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT", "BULKHEAD_OMP_SPIN_US"):
        monkeypatch.delenv(k, raising=False)

    def probe(*first, **env):
        out = subprocess.run([sys.executable, "-c", _HOST_SPIN_PROBE, *first], env=dict(os.environ, **env),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[-1])

    r = probe()
    assert r["done"] == r["env"], r
    assert 0 < int(r["env"]["GOMP_SPINCOUNT"]) < 300_000 and 4 <= int(r["env"]["OPENBLAS_THREAD_TIMEOUT"]) < 28
    assert "GOMP_SPINCOUNT" not in probe("torch")["done"]            # libgomp read its default already
    assert "OPENBLAS_THREAD_TIMEOUT" not in probe("numpy")["done"]   # so did OpenBLAS
    assert probe(GOMP_SPINCOUNT="5")["env"]["GOMP_SPINCOUNT"] == "5"
    r = probe(OMP_WAIT_POLICY="PASSIVE", OPENBLAS_THREAD_TIMEOUT="6")
    assert r["done"] == {} and r["env"] == {"GOMP_SPINCOUNT": None, "OPENBLAS_THREAD_TIMEOUT": "6"}, r
    assert probe(BULKHEAD_OMP_SPIN_US="0")["done"] == {"GOMP_SPINCOUNT": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}


def test_pip_args_stay_out_of_workers(make_worker, monkeypatch):
    """BULKHEAD_PIP_ARGS may hold an index's credentials: the environment
    builder's, never a worker's (issue 17 item 19)."""
    monkeypatch.setenv("BULKHEAD_PIP_ARGS", "--index-url https://user:token@example.invalid/simple")
    monkeypatch.setenv("BULKHEAD_IDLE_RELEASE_S", "7")
    env = make_worker().call("os:environ.copy")
    assert "BULKHEAD_PIP_ARGS" not in env
    assert env["BULKHEAD_IDLE_RELEASE_S"] == "7"  # the other BULKHEAD_ settings still pass


def test_cwd_option(make_worker, tmp_path):
    w = make_worker(cwd=str(tmp_path))
    assert w.call("os:getcwd") == str(tmp_path)


def test_calls_from_two_threads_are_serialized(worker):
    import threading
    out = []

    def run():
        for i in range(50):
            out.append(worker.call("operator:add", i, 1))
    ts = [threading.Thread(target=run) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(out) == sorted([i + 1 for i in range(50)] * 3)


def test_call_waits_for_the_worker_lock(worker):
    """Worker.call (C) takes the same RLock as the Python methods: a call
    from another thread waits while this one holds it."""
    import threading
    got = []
    with worker._lock:
        t = threading.Thread(target=lambda: got.append(worker.call("bh_testmod:echo", 1)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and got == []
    t.join(30)
    assert got == [((1,), {})]
    assert worker.busy == 0


def test_holding_idle_waits_for_a_short_hold_not_for_a_call(worker):
    """holding_idle (VALIDATE_INPUTS at queue time) waits for a holder of
    the worker lock that is in no call (the reader thread's turn after
    every call, a poll, a release flush); holding(0), which validation
    used, lost to those, and the check was deferred to the node's run.
    A holder in a call (a node running) is not waited for."""
    import threading

    def held_while(hold):
        taken, let_go, got = threading.Event(), threading.Event(), []

        def holder():
            with worker.holding():
                hold(taken, let_go)
        t = threading.Thread(target=holder)
        t.start()
        taken.wait(30)
        threading.Timer(0.01, let_go.set).start()
        with worker.holding_idle() as held:
            got.append(held)
        let_go.set()
        t.join(30)
        return got[0]

    worker.SHORT_HOLD_WAIT_S = 30.0   # the short hold is let go after 10 ms, however loaded the machine
    worker.start()
    assert held_while(lambda taken, let_go: (taken.set(), let_go.wait(30)))   # no call: waited for
    # in a call (the worker calls back; the callback waits): not waited for
    assert not held_while(lambda taken, let_go: worker.call(
        "bh_testmod:call_back", lambda: (taken.set(), let_go.wait(30)) and None))
    with worker.holding_idle() as held:
        assert held and worker.busy == 0


def test_call_after_teardown_while_waiting_for_the_lock(worker):
    """A call that waited for the lock while its holder closed the worker
    starts the next generation instead of using the closed channel."""
    import threading
    pid1, got = worker.pid, []
    with worker._lock:
        t = threading.Thread(target=lambda: got.append(worker.call("bh_testmod:pid")))
        t.start()
        t.join(0.2)
        assert worker.close() == 0
    t.join(30)
    assert got and got[0] != pid1 and worker.generation == 2


def test_busy_counts_nested_requests(worker):
    seen = []

    def host_fn(depth):
        seen.append(worker.busy)
        if depth == 0:
            return "bottom"
        return worker.call("bh_testmod:call_back_twice_nested", host_fn, depth - 1)

    assert worker.call("bh_testmod:call_back_twice_nested", host_fn, 2) == "bottom"
    assert seen == [1, 2, 3] and worker.busy == 0


def test_worker_state_slots_refuse_bad_values(worker):
    with pytest.raises(TypeError, match="Worker.call.. needs a target"):
        worker.call()
    with pytest.raises(TypeError, match="_chan must be a bulkhead._native.Channel or None, not <class 'object'>"):
        worker._chan = object()
    with pytest.raises(AttributeError, match="cannot be deleted"):
        del worker._lock
    with pytest.raises(TypeError):
        worker.call_timeout_s = "soon"
    assert worker.call_timeout_s is None
    assert worker.call("operator:add", 1, 2) == 3


def test_close_and_restart(worker):
    pid1 = worker.pid
    assert worker.close() == 0  # BYE: the worker exits on its own
    assert worker.call("bh_testmod:pid") != pid1
    assert worker.generation == 2


def test_many_calls_keep_working(worker):
    for i in range(3000):
        assert worker.call("operator:add", i, 1) == i + 1


def test_release_and_call_take_one_request_path(worker):
    """Worker.release and Worker.call are both Caller.request (C): both
    count busy while they wait, and both wait for the worker lock."""
    import threading
    from bulkhead import _native
    seen = []

    def watch(payload):
        seen.append((payload["op"], worker.busy))
        return {"freed_bytes": 0}
    worker.expose("watch", watch)
    assert worker.call("bh_testmod:serve_release_via", "watch") is True
    assert worker.call("bh_testmod:host_named", "watch", {"op": "call"}) == {"freed_bytes": 0}
    assert worker.release("pins", timeout_s=30) == {"freed_bytes": 0}
    assert seen == [("call", 1), ("pins", 1)] and worker.busy == 0
    got = []
    with worker._lock:
        ts = [threading.Thread(target=lambda: got.append(worker.release("all", timeout_s=30))),
              threading.Thread(target=lambda: got.append(worker.call("bh_testmod:echo", 1)))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(0.3)
            assert t.is_alive()
        posted = []  # from a third thread: the RLock is this one's
        p = threading.Thread(target=lambda: posted.append(worker.post_release("all")))
        p.start()
        p.join(30)
        assert got == [] and posted == [False]  # the lock is taken: not idle, nothing sent
    for t in ts:
        t.join(30)
    assert sorted(map(repr, got)) == sorted(map(repr, [{"freed_bytes": 0}, ((1,), {})]))
    assert seen[-1] == ("all", 1)
    assert worker.call("bh_testmod:serve_release_via", None) is True
    assert worker.post_release("pins") is True
    assert worker.call("bh_testmod:released") == [{"op": "pins", "model_id": None, "bytes": None}]
    assert worker.request(_native.CALL, ("operator:add", (2, 3), {}), 30, "call", "operator:add") == 5


def test_request_reruns_a_release_after_idle_death_on_the_next_generation(worker):
    """The generation rerun rule is Caller.request's, so a RELEASE request
    that finds the worker dead idle runs on generation 2 as a call does
    (test_faults.test_call_after_idle_death_runs_on_the_next_generation).
    Generation 2 has no RELEASE handler: its refusal proves it got it."""
    import os
    import select
    import signal
    from bulkhead import _native
    pid = worker.call("bh_testmod:pid")
    os.kill(pid, signal.SIGKILL)
    poller = select.poll()
    poller.register(worker._chan.fileno(), select.POLLRDHUP)
    assert poller.poll(10_000), "the killed worker's socket never closed"
    with pytest.raises(bulkhead.RemoteError, match="does not handle frame kind") as ei:
        worker.request(_native.RELEASE, {"op": "all", "model_id": None, "bytes": None}, 30, "release", "all")
    assert isinstance(ei.value, NotImplementedError)
    assert worker.generation == 2 and worker.busy == 0 and worker.pid != pid
    assert "while idle" in worker.last_exit


def test_caller_hooks_are_checked_at_import():
    """The methods caller.c calls by name are _native.CALLER_HOOKS, each
    defined on Worker; a class that lacks one is refused (as a rename would
    be, when bulkhead.host.workers is imported)."""
    from bulkhead import _native
    from bulkhead.host import workers
    assert _native.CALLER_HOOKS == ("_start", "_request_failed", "_after_request")
    workers._check_hooks(workers.Worker)

    class Renamed(workers.Worker):
        _start = None
    with pytest.raises(ImportError, match="Renamed lacks _start, which _native.Caller calls by name"):
        workers._check_hooks(Renamed)
