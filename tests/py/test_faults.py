"""Workers that die, hang, never start, or send garbage."""

import os
import signal
import stat
import sys
import time

import pytest

import bulkhead


def test_sigkill_mid_call_fails_fast_and_names_everything(worker):
    pid = worker.pid
    import threading
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    t = time.monotonic()
    with pytest.raises(bulkhead.WorkerDied) as ei:
        worker.call("bh_testmod:sleep", 30)
    elapsed = time.monotonic() - t
    e = ei.value
    msg = str(e)
    assert "worker 'test'" in msg and str(pid) in msg and sys.executable in msg
    assert "signal 9 (SIGKILL)" in msg and "bh_testmod:sleep" in msg
    assert "generation 2" in msg
    assert e.signal == signal.SIGKILL
    assert elapsed < 10  # generous: the point is "not the 30 s call"
    assert worker.call("bh_testmod:pid") != pid
    assert worker.generation == 2


def test_call_after_idle_death_runs_on_the_next_generation(worker):
    """Killed between calls, and the death not yet noticed: the next call
    finds the socket closed before its request was delivered, so none of it
    ran, and it runs on generation 2 instead of failing."""
    import select
    pid = worker.call("bh_testmod:pid")
    os.kill(pid, signal.SIGKILL)
    # Dead once its end of the socket is closed (the last of its threads
    # gone), not when the main thread turns zombie; nobody has reaped it.
    poller = select.poll()
    poller.register(worker._chan.fileno(), select.POLLRDHUP)
    assert poller.poll(10_000), "the killed worker's socket never closed"
    assert worker.call("bh_testmod:pid") not in (pid, None)
    assert worker.generation == 2 and worker.busy == 0
    assert "while idle" in worker.last_exit and "SIGKILL" in worker.last_exit, worker.last_exit


def test_worker_exit_mid_call_quotes_its_output(worker):
    with pytest.raises(bulkhead.WorkerDied) as ei:
        worker.call("bh_testmod:exit_now", 7, "last words from the pack")
    assert ei.value.exit_code == 7
    assert "exited with status 7" in str(ei.value)
    assert "last words from the pack" in str(ei.value)
    assert worker.call("operator:add", 1, 2) == 3


def test_worker_death_hidden_by_a_forked_helper(worker):
    """The worker dies while a process it forked still holds its end of the
    channel: the host's wait watches the worker's pidfd too, so the call
    ends with WorkerDied, not at its timeout (nor never, with none)."""
    import re
    worker.call_timeout_s = 120  # a failure here is a CallTimeout, not a hung test
    with pytest.raises(bulkhead.WorkerDied) as ei:
        worker.call("bh_testmod:exit_leaving_a_helper", 5)
    helper = int(re.search(r"helper=(\d+)", str(ei.value)).group(1))
    try:
        assert ei.value.exit_code == 5 and "exited with status 5" in str(ei.value)
        assert _gone(helper), "the worker's helper outlived it"
        assert worker.call("operator:add", 1, 2) == 3
    finally:
        _kill_quietly(helper)


def _gone(pid, within=5.0):
    """Whether pid is gone (or a zombie nobody has reaped yet) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.02)
    return False


def _kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("how", ["killed", "hung", "closed"])
def test_a_workers_helpers_go_with_it(worker, how, tmp_path):
    """#24 L1: a pack's helper process (in the worker's process group) is
    killed with the worker however it ends: killed from outside mid-call
    (its death), past the call deadline (the hang's SIGKILL), and at
    close (teardown).  main signalled the group only before the leader was
    reaped, so a helper was alive after WorkerDied."""
    import threading
    where = str(tmp_path / "helper.pid")
    if how == "killed":
        threading.Timer(1.0, os.kill, (worker.pid, signal.SIGKILL)).start()
        with pytest.raises(bulkhead.WorkerDied):
            worker.call("bh_testmod:helper_then_sleep", where, 30)
    elif how == "hung":
        worker.call_timeout_s = 1.0
        with pytest.raises(bulkhead.CallTimeout):
            worker.call("bh_testmod:helper_then_sleep", where, 30)
    else:
        worker.call("bh_testmod:helper_then_sleep", where, 0)
        worker.close()
    helper = int(open(where).read())
    try:
        assert _gone(helper), f"the worker's helper {helper} outlived it ({how})"
    finally:
        _kill_quietly(helper)


def test_missing_interpreter_fails_fast(make_worker):
    w = make_worker("/nonexistent/bin/python3", name="ghost")
    t = time.monotonic()
    with pytest.raises(bulkhead.WorkerStartError, match=r"ghost.*/nonexistent/bin/python3.*not found"):
        w.start()
    assert time.monotonic() - t < 5


def _script(tmp_path, body):
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_death_during_startup_reports_stderr(make_worker, tmp_path):
    py = _script(tmp_path, "echo 'ImportError: no module named torch_special' >&2\nexit 3\n")
    w = make_worker(py, name="broken", start_timeout_s=60)
    t = time.monotonic()
    with pytest.raises(bulkhead.WorkerStartError) as ei:
        w.start()
    assert time.monotonic() - t < 10  # never the 60 s start timeout
    msg = str(ei.value)
    assert "exited with status 3 during start-up" in msg
    assert "torch_special" in msg


def test_worker_that_never_says_hello_times_out(make_worker, tmp_path):
    py = _script(tmp_path, "exec sleep 30\n")
    w = make_worker(py, name="mute", start_timeout_s=0.5)
    with pytest.raises(bulkhead.WorkerStartError, match="did not say HELLO within 0.5 s"):
        w.start()


def test_hung_call_times_out_and_is_killed(make_worker):
    w = make_worker(name="slow", call_timeout_s=0.5)
    pid = w.start().pid
    with pytest.raises(bulkhead.CallTimeout, match="did not answer call 'bh_testmod:sleep' within 0.5 s"):
        w.call("bh_testmod:sleep", 30)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert w.call("operator:add", 1, 1) == 2


def test_stopped_worker_is_killed_on_close(make_worker):
    w = make_worker(name="stopped", stop_grace_s=0.2, stop_term_s=0.2)
    w.start()
    os.kill(w.pid, signal.SIGSTOP)
    status = w.close()
    assert os.WIFSIGNALED(status)


@pytest.mark.parametrize("what,named", [
    ("garbage", "BH_EMAGIC"), ("version", "BH_EVERSION"), ("kind", "BH_EKIND"),
    ("short", "BH_ESHORT"), ("oversized", "BH_E2BIG"), ("badvalue", "BH_EBADTAG"),
    ("uid", "BH_EPEERCRED")])
def test_malformed_frames_are_named_errors(make_worker, what, named):
    if what == "uid" and os.getuid() != 0:
        pytest.skip("needs root to send from another uid")
    w = make_worker(name="liar")
    w.start()
    with pytest.raises(bulkhead.ProtocolError, match=named) as ei:
        w.call("bh_testmod:send_raw", what)
    assert "worker 'liar'" in str(ei.value)
    assert w.call("operator:add", 2, 3) == 5  # a fresh generation


def test_host_death_ends_workers(tmp_path):
    import subprocess
    code = (
        "import bulkhead, sys, time\n"
        "w = bulkhead.Worker(sys.executable, name='orphan')\n"
        "print(w.start().pid, flush=True)\n"
        "time.sleep(60)\n")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        wpid = int(host.stdout.readline())
        host.kill()
        host.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(wpid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(wpid, signal.SIGKILL)
            pytest.fail(f"worker {wpid} outlived its host")
    finally:
        host.stdout.close()
