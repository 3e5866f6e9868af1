"""The kill matrix: a worker killed (SIGKILL) or hung (SIGSTOP, a Python
infinite loop) at each phase of its life, and the host that survives it.

Each row runs in ONE host process shaped like ComfyUI (a fresh process
for the whole table: ComfyUI's memory manager is module-global state),
with a victim worker under the host's memory budget that holds a real
32 MiB model (tests/py/helpers/bh_mempack.py), so it has a stand-in in
ComfyUI's list and a record in the shared ledger.  The worker hits the
signal itself at the phase (tests/py/helpers/bh_killpoints.py, and a
sitecustomize hook for start-up), so every phase is hit exactly.

For every row:
  * the host keeps running, and the pending operation fails within a
    bound with the error of the table, naming the worker and the signal
    (an operation ComfyUI runs itself, its eviction loop, never sees an
    exception: the error is logged and the stand-in counts as freed);
  * after the next reconcile the stand-ins of that generation are out of
    ComfyUI's list (retired: they read 0), the worker's ledger record is
    reaped and no reserve is left published for it;
  * the host has the fds, children, /dev/shm entries, control-socket
    directory and /tmp entries it had before the worker started: no fd,
    shm block, zombie or temp file is left behind;
  * the next call works, on generation + 1.

The zygote's rows (ZYGOTE_MATRIX) signal the zygote that forked the
victim instead, at each phase of the victim's life, with the same checks
beside their own.

Then the HOST is killed: its workers notice and exit, and the next reader
of the ledger reaps all their records.
"""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from comfyenv import run_comfy_script

pytestmark = pytest.mark.torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HELPERS = os.path.join(HERE, "helpers")
HOOKS = os.path.join(HELPERS, "hooks")
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))

# The per-worker deadlines the hang rows run under (call, release, start).
DEADLINE_S = 2.0
# How long a killed worker may take to be reported: "at once", with room
# for a loaded machine.
KILL_BOUND_S = 8.0
# A hang is reported at its deadline, plus the kill and the report; the
# ledger-lock rows may also wait once for the segment's bounded lock.
HANG_BOUND_S = DEADLINE_S + 8.0

#        phase           signal     the pending operation fails with
MATRIX = [
    ("idle",           "SIGKILL", None),               # nothing pending: the next call just works
    ("idle",           "SIGSTOP", "CallTimeout"),      # ComfyUI's eviction walks its stand-in
    ("startup",        "SIGKILL", "WorkerStartError"),
    ("startup",        "SIGSTOP", "WorkerStartError"),
    ("call",           "SIGKILL", "WorkerDied"),
    ("call",           "SIGSTOP", "CallTimeout"),
    ("call",           "loop",    "CallTimeout"),      # a Python infinite loop
    ("transfer-in",    "SIGKILL", "WorkerDied"),       # a 64 MiB array going in
    ("transfer-in",    "SIGSTOP", "CallTimeout"),
    ("transfer-out",   "SIGKILL", "WorkerDied"),       # a 64 MiB array coming out
    ("transfer-out",   "SIGSTOP", "CallTimeout"),
    ("release",        "SIGKILL", "WorkerDied"),       # partially_unload -> RELEASE in flight
    ("release",        "SIGSTOP", "CallTimeout"),
    ("admission",      "SIGKILL", "WorkerDied"),       # inside the host's admit callback
    ("admission",      "SIGSTOP", "CallTimeout"),
    ("ledger-lock",    "SIGKILL", "WorkerDied"),       # holding the ledger's robust mutex
    ("ledger-lock",    "SIGSTOP", "CallTimeout"),      # stopped holding it
]


# The zygote's rows: the workers are forked by a zygote (host/zygote.py),
# and the ZYGOTE is signalled, at each phase of its worker's life:
#   zygote-serving    while its worker serves (the worker serves on), then
#                     the worker ends on its own: its end is seen, without
#                     a status (its zygote went, or cannot report: stopped),
#                     and its helper goes with it;
#   zygote-close      then the host stops its worker (Worker.close);
#   zygote-fork       its worker closed, then the next start asks it a fork;
#   zygote-stop-idle  its worker closed, then /free's stop_idle.
# For every row nothing waits on a stopped zygote past a bound, the next
# worker is forked by a new zygote, the signalled one is gone (a stopped one
# killed), and the rest is as for the worker's rows.
ZYGOTE_PHASES = ("zygote-serving", "zygote-close", "zygote-fork", "zygote-stop-idle")
ZYGOTE_MATRIX = [(phase, sig) for phase in ZYGOTE_PHASES for sig in ("SIGKILL", "SIGSTOP")]
# The report a stopped zygote owes is waited for 3 s (BH__REPORT_GRACE_MS),
# /free's answer 2 s (zygote.ANSWER_TIMEOUT_S); plus room for the kill.
ZYGOTE_BOUND_S = 3.0 + 8.0


def row_id(phase, sig):
    return f"{phase}-{sig}"


# The host: everything below runs in one process after comfyenv's prelude
# (mm, torch, json, sys, emit in scope).
HOST = r'''
import logging, signal, threading, time
import numpy as np
import bulkhead
from bulkhead import _native
from bulkhead.host import controlclient
from bulkhead.host import zygote as zygotes
from bulkhead.host.memory import HostMemory

MiB = 1 << 20
ROWS = ROWS_
DEADLINE = DEADLINE_
ZYGOTE_BOUND = ZYGOTE_BOUND_
TMP = TMP_
HELPERS, HOOKS = HELPERS_, HOOKS_

logs = []

class Keep(logging.Handler):
    def emit(self, record):
        logs.append(record.getMessage())

logging.getLogger("bulkhead").addHandler(Keep(logging.WARNING))
logging.getLogger("bulkhead").propagate = False

def children():
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/stat" % pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                out.append((int(pid), fields[0]))
    return sorted(out)

def ours(names):
    """Entries of a directory other processes on this machine share that
    bulkhead could have made for this host or its workers: named after
    one of their pids, or bulkhead's own."""
    pids = [str(os.getpid())] + [str(p) for p, _ in children()] + [str(p) for p in victims]
    return sorted(n for n in names if "bulkhead" in n or any(p in n for p in pids))

victims = []

def state():
    """What a dead worker could leave in the host: fds, children (zombies
    too), /dev/shm entries, control sockets, temp files."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
    return {"fds": fds, "children": children(),
            "shm": [n for n in ours(os.listdir("/dev/shm")) if n != f"bulkhead-{os.geteuid()}"],  # the ledger's (kept) directory
            "control": ours(os.listdir(controlclient.control_dir())),
            "tmp": ours(os.listdir("/tmp")), "tmpdir": sorted(os.listdir(TMP))}

def diff(a, b):
    out = {}
    for k in a:
        if k == "fds":
            d = {fd: b["fds"][fd] for fd in set(b["fds"]) - set(a["fds"])}
        else:
            d = sorted(set(map(str, b[k])) ^ set(map(str, a[k])))
        if d:
            out[k] = d
    return out

def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

def wait_state(pid, states, timeout=10.0):
    deadline = time.monotonic() + timeout
    while proc_state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc_state(pid)

def wait_dead(pid, timeout=10.0):
    """Until pid (our child) can be reaped, without reaping it: a process
    killed with threads shows state Z while its other threads still exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        time.sleep(0.01)
    return False

def listed(standins):
    ids = set(id(s) for s in standins)
    return sum(1 for lm in mm.current_loaded_models if id(lm.model) in ids)

def evict(standins, ask=16 * MiB):
    """ComfyUI's own eviction loop, asked for more than is free, walks the
    stand-ins.  Returns (seconds it took, how many of `standins` it
    visited and then read as holding nothing: upstream counts all of
    their bytes freed, whether it popped the entry or kept it after a
    partial unload)."""
    dev = mm.get_torch_device()
    seen = []
    for lm in mm.current_loaded_models:
        if any(lm.model is s for s in standins):
            unload = lm.model_unload   # instrumented on the instance only
            def model_unload(*a, _unload=unload, _lm=lm, **k):
                r = _unload(*a, **k)
                seen.append(_lm.model.loaded_size())
                return r
            lm.model_unload = model_unload
    t = time.monotonic()
    mm.free_memory(mm.get_free_memory(dev) + ask, dev)
    return time.monotonic() - t, sum(1 for after in seen if after == 0)

hm = HostMemory(mm, ledger_path=os.path.join(TMP, "ledger"))

# --- the phases: each returns nothing or raises what the pending op raised ---

def act_idle(w, sig, res):
    pid = w.pid
    w.kill(getattr(signal, sig))
    if sig == "SIGKILL":
        wait_dead(pid)
        hm.reconcile()          # the drain notices the death, reaps, logs
        res["pending"] = [m for m in logs if "while idle" in m]
        return
    wait_state(pid, ("T",))
    res["evict_s"], res["counted_freed"] = evict(hm.standins(w))
    res["pending"] = [m for m in logs if "releasing model" in m]

def act_startup(w, sig, res):
    w.close()                   # generation 1 ends; the restart dies before HELLO
    open(os.path.join(TMP, "die-" + sig), "w").close()
    w.start_timeout_s = DEADLINE
    try:
        w.call("bh_testmod:pid")
    finally:
        w.start_timeout_s = 60.0

def act_call(w, sig, res):
    w.call("bh_killpoints:hit", sig)

def act_transfer_in(w, sig, res):
    w.call("bh_killpoints:arm", "transfer-in", sig)
    w.call("bh_killpoints:consume", np.ones(64 * MiB, dtype=np.uint8))

def act_transfer_out(w, sig, res):
    w.call("bh_killpoints:arm", "transfer-out", sig)
    w.call("bh_killpoints:produce", 64 * MiB)

def act_release(w, sig, res):
    w.call("bh_killpoints:arm", "release", sig)
    res["evict_s"], res["counted_freed"] = evict(hm.standins(w))
    res["pending"] = [m for m in logs if "releasing model" in m]

def act_admission(w, sig, res):
    # The asker is signalled from inside HostMemory.admit (its first
    # measurement), while the worker waits on the CALLBACK.  (The channel
    # caches the exposed admit itself, so the hook goes one level in.)
    true_free = hm.true_free
    def true_free_and_signal(device):
        if "signalled" not in res:
            res["signalled"] = w.pid
            os.kill(w.pid, getattr(signal, sig))
            if sig == "SIGKILL":
                wait_dead(w.pid)
            else:
                wait_state(w.pid, ("T",))
        return true_free(device)
    hm.true_free = true_free_and_signal
    try:
        w.call("bh_mempack:load", "Second", 16 * MiB)
    finally:
        del hm.true_free

def act_ledger_lock(w, sig, res):
    if sig == "SIGKILL":
        try:
            w.call("bh_killpoints:hold_ledger_lock", sig)
        finally:
            t = time.monotonic()   # EOWNERDEAD: the next locker recovers it
            res["records_after"] = len(hm.ledger.records())
            res["records_s"] = time.monotonic() - t
        return
    pid = w.pid
    w.call("bh_killpoints:hold_ledger_lock", sig, 0.2)  # returns, then stops holding it
    wait_state(pid, ("T",))
    t = time.monotonic()          # the bounded lock: no reader waits on it for long
    res["records_while_stopped"] = sorted(r["pid"] for r in hm.ledger.records())
    res["records_s"] = time.monotonic() - t
    hm.reconcile()
    res["evict_s"], res["counted_freed"] = evict(hm.standins(w))  # the deadline kills it
    res["pending"] = [m for m in logs if "releasing model" in m]
    t = time.monotonic()
    res["records_after"] = len(hm.ledger.records())
    res["records_after_s"] = time.monotonic() - t

def parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None

def signal_zygote(w, sig, res):
    """Signals the zygote that forked w's generation; waits until it took
    effect."""
    zpid = res["zygote"] = w._zygote_pid
    os.kill(zpid, getattr(signal, sig))
    if sig == "SIGKILL":
        wait_dead(zpid)          # the host's child: a zombie until the host reaps it
    else:
        wait_state(zpid, ("T",))

def bounded(res, what, fn):
    t = time.monotonic()
    out = fn()
    res.setdefault("bounded", {})[what] = time.monotonic() - t
    return out

def act_zygote_serving(w, sig, res):
    res["helpers"] = [w.call("bh_killpoints:helper")]
    signal_zygote(w, sig, res)
    res["served"] = w.call("bh_testmod:pid") == w.pid      # a worker outlives its zygote
    os.kill(w.pid, signal.SIGKILL)                          # then ends on its own

    def seen():
        deadline = time.monotonic() + ZYGOTE_BOUND
        while w.last_exit is None and time.monotonic() < deadline:
            w.poll()
            time.sleep(0.02)
    bounded(res, "end seen", seen)
    res["pending"] = [m for m in logs if "while idle" in m]

def act_zygote_close(w, sig, res):
    res["helpers"] = [w.call("bh_killpoints:helper")]
    signal_zygote(w, sig, res)
    bounded(res, "close", w.close)

def act_zygote_fork(w, sig, res):
    w.close()
    signal_zygote(w, sig, res)
    res["forked_by"] = bounded(res, "fork", lambda: parent(w.call("bh_testmod:pid")))

def act_zygote_stop_idle(w, sig, res):
    w.close()
    signal_zygote(w, sig, res)
    res["stopped_idle"] = bounded(res, "stop_idle", zygotes.stop_idle)

ACTS = {"idle": act_idle, "startup": act_startup, "call": act_call,
        "transfer-in": act_transfer_in, "transfer-out": act_transfer_out,
        "release": act_release, "admission": act_admission, "ledger-lock": act_ledger_lock,
        "zygote-serving": act_zygote_serving, "zygote-close": act_zygote_close,
        "zygote-fork": act_zygote_fork, "zygote-stop-idle": act_zygote_stop_idle}

def run(phase, sig):
    res = {}
    before = state()
    env = {"PYTHONPATH": os.pathsep.join([HELPERS, HOOKS, os.getcwd()])}
    if phase == "startup":
        env["BH_TEST_HOOK"] = "die-before-hello:%s:%s" % (sig, os.path.join(TMP, "die-" + sig))
    w = bulkhead.Worker(sys.executable, name="victim-%s-%s" % (phase, sig), env=env,
                        release_timeout_s=DEADLINE)
    if phase.startswith("zygote"):
        w.zygote_preload = []        # forked by a zygote (of nothing preloaded: each row starts one)
    hm.attach(w)
    w.call("bh_mempack:load", "UNetV", 32 * MiB)   # imports torch: no deadline yet
    w._zygote_pid = parent(w.pid)                 # (the host's pid where it was spawned)
    hm.reconcile()
    gen0, pid0 = w.generation, w.pid
    victims.append(pid0)
    old = hm.standins(w)
    res["listed_before"] = listed(old)
    res["record_before"] = hm.ledger.read(pid0) is not None
    del logs[:]
    w.call_timeout_s = DEADLINE
    t = time.monotonic()
    try:
        ACTS[phase](w, sig, res)
        res["error_type"], res["error"] = None, None
    except Exception as e:
        res["error_type"], res["error"] = type(e).__name__, str(e)
        res["stopped"] = getattr(e, "stopped", None)
    res["elapsed"] = time.monotonic() - t
    w.call_timeout_s = None
    res["host_alive"] = True
    hm.reconcile()
    res["old_listed_after"] = listed(old)
    res["old_retired"] = all(_native.standin_info(s)["retired"] for s in old)
    res["old_resident"] = sum(s.loaded_size() for s in old)
    res["record_left"] = (hm.ledger.read(pid0) is not None
                          or pid0 in [r["pid"] for r in hm.ledger.records()])
    res["old_pid_state"] = proc_state(pid0)
    res["reserve_back"] = mm.EXTRA_RESERVED_VRAM == hm.base_reserve
    res["next"] = w.call("bh_mempack:load", "UNetV", 32 * MiB)
    res["generations"] = [gen0, w.generation]
    if "zygote" in res:
        res["host"] = os.getpid()
        res["next_forked_by"] = parent(w.pid)
        res["zygote_state"] = proc_state(res["zygote"])
        res["helpers_state"] = [proc_state(h) for h in res.get("helpers", [])]
        res["old_pid_parent"] = parent(pid0)
    victims.append(w.pid)
    hm.reconcile()
    res["new_listed"] = listed(hm.standins(w))
    res["logs"] = logs[:]
    hm.detach_worker(w)
    w.close()
    if "zygote" in res:
        zygotes.close_all()      # the row's new zygote, lingering with no worker
    res["leaks"] = diff(before, state())
    return res

results = {}
for phase, sig in ROWS:
    try:
        results["%s-%s" % (phase, sig)] = run(phase, sig)
    except Exception as e:
        import traceback
        results["%s-%s" % (phase, sig)] = {"crashed": traceback.format_exc()}
control_path = hm.control.path
hm.close()
results["_host"] = {"control_left": os.path.exists(control_path),
                    "ledger_left": os.path.exists(os.path.join(TMP, "ledger"))}
emit(results)
'''


@pytest.fixture(scope="module")
def matrix(request, tmp_path_factory):
    """Runs the rows this session selected, in one host, once."""
    wanted = []
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if item.module is request.module and spec is not None and "phase" in spec.params:
            row = (spec.params["phase"], spec.params["sig"])
            if row not in wanted:
                wanted.append(row)
    tmp = str(tmp_path_factory.mktemp("kill"))
    code = (HOST.replace("ROWS_", repr(wanted)).replace("DEADLINE_", repr(DEADLINE_S))
            .replace("ZYGOTE_BOUND_", repr(ZYGOTE_BOUND_S))
            .replace("TMP_", repr(tmp)).replace("HELPERS_", repr(HELPERS)).replace("HOOKS_", repr(HOOKS)))
    env = {"PYTHONPATH": os.pathsep.join([os.path.join(BUILD, "python"), HELPERS])}
    return run_comfy_script(code, timeout=60 + 30 * len(wanted), env=env)


@pytest.mark.parametrize("phase,sig,expected", MATRIX, ids=[row_id(p, s) for p, s, _ in MATRIX])
def test_kill_matrix(matrix, phase, sig, expected):
    r = matrix[row_id(phase, sig)]
    assert "crashed" not in r, r.get("crashed")
    name = f"victim-{phase}-{sig}"
    assert r["listed_before"] == 1 and r["record_before"], r

    # The pending operation failed, clearly and in time.
    if "pending" in r:
        # Nothing of the caller's was pending (idle), or ComfyUI's own
        # eviction loop was: it saw no exception; the log says what happened.
        assert r["error_type"] is None, r
        assert len(r["pending"]) == 1, r["logs"]
        message = r["pending"][0]
    else:
        assert r["error_type"] == expected, r
        message = r["error"]
    assert f"worker {name!r}" in message, message
    if sig in ("SIGSTOP", "loop"):
        # A hang: found by its deadline, killed, and reported as such.
        assert "did not answer" in message or "did not say HELLO" in message, message
        assert "killed (SIGKILL)" in message, message
        assert ("it was stopped" in message) == (sig == "SIGSTOP"), message
        assert r["elapsed"] < HANG_BOUND_S, r
    else:
        assert f"signal {int(getattr(signal, sig))} ({sig})" in message, message
        assert r["elapsed"] < KILL_BOUND_S, r
    if "evict_s" in r:
        # A hung worker never blocks ComfyUI's eviction loop: the walk over
        # its stand-in returns within the release deadline, counting it freed.
        assert r["evict_s"] < HANG_BOUND_S, r
        assert r["counted_freed"] == 1, r
    if phase == "ledger-lock":
        assert r["records_s"] < 4.0, r          # a bounded wait (2 s), never a hang
        assert r["records_after"] >= 1, r       # the lock recovered (EOWNERDEAD)
        if sig == "SIGSTOP":
            assert r["records_after_s"] < 1.0, r

    # The generation is gone from ComfyUI and from the ledger.
    assert r["old_listed_after"] == 0 and r["old_retired"] and r["old_resident"] == 0, r
    assert not r["record_left"], r
    assert r["old_pid_state"] is None, r        # reaped: no zombie
    assert r["reserve_back"], r

    # Nothing left behind, and the next call works on the next generation.
    assert r["leaks"] == {}, r["leaks"]
    assert r["next"] == 32 << 20
    gen0, gen1 = r["generations"]
    assert gen1 == gen0 + 1, r
    assert r["new_listed"] == 1, r


@pytest.mark.parametrize("phase,sig", ZYGOTE_MATRIX, ids=[row_id(p, s) for p, s in ZYGOTE_MATRIX])
def test_zygote_kill_matrix(matrix, phase, sig):
    r = matrix[row_id(phase, sig)]
    assert "crashed" not in r, r.get("crashed")
    name = f"victim-{phase}-{sig}"
    assert r["listed_before"] == 1 and r["record_before"], r
    assert r["zygote"] not in (None, 1, r["host"]), r        # forked by a zygote

    # Nothing the caller waits on fails, and nothing waits past a bound.
    assert r["error_type"] is None, r
    assert r["bounded"] and all(t < ZYGOTE_BOUND_S for t in r["bounded"].values()), r["bounded"]
    if phase == "zygote-serving":
        assert r["served"], r                              # the worker served on without it
        assert len(r["pending"]) == 1, r["logs"]
        message = r["pending"][0]
        assert f"worker {name!r}" in message, message
        why = "the zygote that forked it had gone" if sig == "SIGKILL" else "did not report it"
        assert why in message, message
    if phase == "zygote-fork":
        assert r["forked_by"] not in (r["zygote"], r["host"]), r
    if phase == "zygote-stop-idle":
        assert r["stopped_idle"] == 1, r
    # The worker's helpers went with it, whatever became of its zygote.
    assert all(s in (None, "Z") for s in r["helpers_state"]), r
    # The signalled zygote is gone (a stopped one killed), reaped; a new one
    # forked the next generation.
    assert r["zygote_state"] is None, r
    assert r["next_forked_by"] not in (r["zygote"], r["host"], None), r

    # The generation is gone from ComfyUI and from the ledger.
    assert r["old_listed_after"] == 0 and r["old_retired"] and r["old_resident"] == 0, r
    assert not r["record_left"], r
    # no zombie of the host's or its zygote's (an orphan is init's to reap)
    assert r["old_pid_state"] is None or r["old_pid_parent"] not in (r["host"], r["zygote"]), r
    assert r["reserve_back"], r

    # Nothing left behind, and the next call works on the next generation.
    assert r["leaks"] == {}, r["leaks"]
    assert r["next"] == 32 << 20
    gen0, gen1 = r["generations"]
    assert gen1 == gen0 + 1, r
    assert r["new_listed"] == 1, r


def test_matrix_host_cleaned_up(matrix):
    assert matrix["_host"] == {"control_left": False, "ledger_left": False}


# --- the host itself killed ---

HOST_TO_KILL = r'''
import bulkhead
from bulkhead.host.memory import HostMemory
MiB = 1 << 20
hm = HostMemory(mm, ledger_path=LEDGER_)
env = {"PYTHONPATH": os.pathsep.join([HELPERS_, os.getcwd()])}
idle = hm.attach(bulkhead.Worker(sys.executable, name="idle-pack", env=env))
busy = hm.attach(bulkhead.Worker(sys.executable, name="busy-pack", env=env))
idle.call("bh_mempack:load", "UNetI", 16 * MiB)
busy.call("bh_mempack:load", "UNetB", 16 * MiB)
hm.reconcile()
print("PIDS", os.getpid(), idle.pid, busy.pid, hm.control.path, flush=True)
busy.call("bh_testmod:sleep", 120)   # killed in here
'''

PR_SET_CHILD_SUBREAPER = 36


def _proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_host_killed_workers_exit_and_records_are_reaped(tmp_path):
    from bulkhead import _native
    from bulkhead.host import controlclient
    from comfyenv import script_prelude, comfy_root

    ledger = str(tmp_path / "ledger")
    code = script_prelude() + textwrap.dedent(
        HOST_TO_KILL.replace("LEDGER_", repr(ledger)).replace("HELPERS_", repr(HELPERS)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(BUILD, "python"), HELPERS])
    libc = ctypes.CDLL(None, use_errno=True)
    # The workers are the host's children: made ours when it dies, so this
    # test sees how they end and reaps them (nothing is left as a zombie).
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    host = subprocess.Popen([sys.executable, "-c", code], cwd=comfy_root(), env=env,
                            stdout=subprocess.PIPE, text=True)
    workers = []
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("PIDS") and time.monotonic() < deadline:
            line = host.stdout.readline()
            if not line and host.poll() is not None:
                break
        assert line.startswith("PIDS"), f"host did not start (rc {host.poll()})"
        _, hpid, ipid, bpid, sock = line.split()
        hpid, workers = int(hpid), [int(ipid), int(bpid)]
        time.sleep(0.3)  # the busy worker is inside its call
        host.kill()
        host.wait()
        statuses = {}
        t = time.monotonic()
        while len(statuses) < 2 and time.monotonic() - t < 10:
            for pid in workers:
                if pid not in statuses:
                    r, status = os.waitpid(pid, os.WNOHANG)
                    if r == pid:
                        statuses[pid] = status
            time.sleep(0.02)
        elapsed = time.monotonic() - t
        assert len(statuses) == 2, f"workers outlived their host: {set(workers) - set(statuses)}"
        assert elapsed < 5, elapsed
        # The idle one saw EOF and left; the busy one's watchdog ended it.
        assert all(os.WIFEXITED(s) for s in statuses.values()), statuses
        # Their records (and the host's) are reaped by the next reader; the
        # last one out removes the ledger file.
        with _native.Ledger(ledger) as l:
            assert l.records() == []
        assert not os.path.exists(ledger)
        # The host could not remove its control socket; the next host's
        # server sweeps it (here: the sweep itself).
        assert os.path.exists(sock)
        assert sock in controlclient.sweep(os.path.dirname(sock))
        assert not os.path.exists(sock)
    finally:
        for pid in workers:
            if _proc_state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        if host.poll() is None:
            host.kill()
            host.wait()
        host.stdout.close()


# --- the deadlines are per pack ---

def test_deadlines_come_from_the_pack(tmp_path):
    """call_timeout_s / start_timeout_s / release_timeout_s of a pack's
    [bulkhead] table reach its Worker (pack.py maps them to these options),
    and HostMemory releases with the worker's own deadline."""
    from bulkhead.host import memory, nodes
    rt = nodes.PackRuntime(str(tmp_path), sys.executable, "slow-pack", {},
                           {"call_timeout_s": 3.0, "start_timeout_s": 40.0, "release_timeout_s": 1.5},
                           str(tmp_path))
    w = rt.worker
    assert (w.call_timeout_s, w.start_timeout_s, w.release_timeout_s) == (3.0, 40.0, 1.5)
    assert memory.release_timeout_s(w) == 1.5
    w.release_timeout_s = None
    assert memory.release_timeout_s(w) == memory.RELEASE_TIMEOUT_S
