"""Idle exit: an idle worker costs nothing.

An isolated pack's worker that has been idle for its idle exit time -- the
pack's ``[bulkhead] idle_exit_s``, else ``BULKHEAD_IDLE_EXIT_S``, else
IDLE_EXIT_S; 0 never -- exits, and every byte it held goes back (on a GPU
its CUDA context too); the next node of the pack starts it again
(generation + 1; prewarm starts it as soon as a prompt that uses the pack
is queued).  A worker the host still holds handles of (a RemoteObject of
it alive here: a MODEL in ComfyUI's output cache) is not stopped -- its
objects would be lost and their nodes run again -- but released (its full
ladder) once, and the log says why it stays.

Idle time is the worker's own stamp in the shared ledger (``last_used_ns``,
set at every node boundary, CLOCK_MONOTONIC) while its run state is
"idle"; a worker outside the memory budget (no ledger) is never stopped
for being idle.  One daemon thread looks every SWEEP_S seconds; it never
waits on a worker's lock (a busy one is skipped).  ``exit_idle(min_idle_s)``
is the same step on demand: ComfyUI's "Free model and node cache"
(``/free`` with ``free_memory``) stops every idle worker that holds no
handle, whatever its idle time.

Under machine memory pressure idle workers exit first, least recently used
first, whatever their idle exit time (``exit_under_pressure``, each sweep):
while the RAM available to this machine's processes (the RAM probe: meminfo
clamped to the cgroup) is below PRESSURE_SWITCH percent of its total
(default PRESSURE_PCT; 0 turns it off), the idle worker that has been idle
longest (at least PRESSURE_MIN_IDLE_S) is stopped, then the next, until it
is not.  A pack whose idle_exit_s is 0 is never stopped, as above.

A worker in no call may still be at work of its own (a job a pack's
route started, a download on a pack's thread): in-process nothing would
stop it, so none of the above stops it (``working``): not while its pack
holds ``bulkhead.working()`` (its ledger run state "working"), has a
process of its own running (a helper it forked), or uses CPU_BUSY_PCT of
a CPU now.  The sweeper samples every watched worker's CPU time on each
pass: little CPU time used since that sample is a quick "not at work";
more, and the worker is sampled afresh over CPU_WINDOW_S from now (as is
a worker seen for the first time), because since the sweeper's sample
the host may have asked the worker for work that is no call -- a release
ladder (the panel's Release just before ComfyUI's "Free model and node
cache"; a collection and the heap trimmed: 0.1-0.2 s of CPU with torch
loaded), a prompt's end, blocks returned -- and the ledger's stamp of
its last call says nothing of that.  (/free itself stops idle workers
before it runs the ladder on the others: host/service.py.)  The host
waits for what it asks (a release for its receipt), and the window is
taken holding the worker's lock (no request of another thread runs
meanwhile), so it holds only what the worker does of its own accord.
CPU time is the process's CPU clock (nanoseconds), not /proc's clock
ticks: one 10 ms tick in a 0.1 s window reads as 10% of a CPU.

The workers one step looks at (exit_idle: /free's twenty idle workers;
exit_under_pressure) share one window: the start of each one's window is
taken first (the sweeper's sample where it can serve, else a new one),
one CPU_WINDOW_S is slept for them all, holding no worker's lock, and then
each worker is looked at in turn under its lock.  Like the sweeper's
sample, that shared window can only clear a worker; one it finds using
CPU is sampled afresh under its lock, as above (_window_starts says why
no lock is held across the shared sleep).
"""

import logging
import os
import threading
import time

from .. import _native
from ..channel import spec, targets
from . import zygote

log = logging.getLogger("bulkhead")

SWITCH = spec.IDLE_EXIT_S
IDLE_EXIT_S = 600.0
SWEEP_S = 5.0
PRESSURE_SWITCH = spec.IDLE_PRESSURE_PCT
PRESSURE_PCT = 10.0          # below this % of RAM available, idle workers exit (LRU first)
# The longest an asked exit (/free) waits for a worker's lock: a frame of
# the reader's, or the sweeper measuring the worker's CPU under it (one
# CPU_WINDOW_S at most: the window it shares with other workers is slept
# holding no lock) before it stops the worker itself.
BRIEF_S = 0.65
PRESSURE_MIN_IDLE_S = 10.0   # ... once idle this long (not between two nodes, or two prompts in a row)
CPU_BUSY_PCT = 10.0          # a worker in no call that uses this much of one CPU is working
CPU_WINDOW_S = 0.2           # a fresh sample of a worker is taken over this long

_watched = []               # PackRuntime, in load order
_lock = threading.Lock()
_thread = None
_released = set()           # (pack dir, pid) released instead of stopped: said once
_kept_working = set()       # pids left alone because they were working: said once
_cpu = {}                   # pid -> (CPU seconds, time.monotonic()) at its last sample


def limit_s(options):
    """The idle exit time of a pack with these load_pack options, in
    seconds (0: never)."""
    own = options.get("idle_exit_s")
    if own is not None:
        return float(own)
    try:
        return float(os.environ.get(SWITCH, IDLE_EXIT_S))
    except ValueError:
        return IDLE_EXIT_S


def watch(rt):
    """Puts a PackRuntime under the idle exit (its HostMemory's ledger
    stamps its worker's idle time: ``rt.ledger``); starts the sweeper once."""
    global _thread
    if rt.ledger is None or limit_s(rt.options) <= 0:
        return
    with _lock:
        if rt not in _watched:
            _watched.append(rt)
        if _thread is None:
            _thread = threading.Thread(target=_sweep_forever, name="bulkhead-idle-exit", daemon=True)
            _thread.start()


def _sweep_forever():
    while True:
        with _lock:
            limits = [limit_s(rt.options) for rt in _watched]
        time.sleep(min([SWEEP_S] + [x / 2 for x in limits if x > 0]))
        try:
            _sample_all()
            exit_idle()
            exit_under_pressure()
        except Exception:  # the sweeper never dies of one pack's trouble
            log.exception("bulkhead: the idle exit sweep failed")


def idle_for(rt):
    """Seconds rt's worker has been idle (None: not running, busy, or no
    stamp yet)."""
    w = rt.worker
    if not w.alive or w.busy:
        return None
    try:
        rec = rt.ledger.read(w.pid)
    except Exception:
        return None
    if not rec or rec.get("run") != "idle" or not rec.get("last_used_ns"):
        return None
    return max(0.0, (time.monotonic_ns() - rec["last_used_ns"]) / 1e9)


def _cpu_s(pid):
    """The CPU time pid has used (all its threads), in seconds, or None:
    its process CPU-time clock, whose id is what glibc's
    clock_getcpuclockid(pid) makes it (MAKE_PROCESS_CPUCLOCK(pid,
    CPUCLOCK_SCHED): ~pid << 3 | 2), to the nanosecond; else /proc's
    utime + stime, in clock ticks."""
    try:
        return time.clock_gettime_ns((~pid << 3) | 2) / 1e9
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _sample(pid):
    """A CPU sample of pid, (CPU seconds, time.monotonic()), kept as its
    last (the sweeper's, for working()); None when it cannot be read."""
    used = _cpu_s(pid)
    if used is None:
        return None
    _cpu[pid] = sample = (used, time.monotonic())
    return sample


def _busy_pct(pid, since):
    """The percent of one CPU pid used from sample `since` to now, or None."""
    now = _sample(pid)
    if since is None or now is None:
        return None
    return 100.0 * (now[0] - since[0]) / max(now[1] - since[1], 1e-3)


def _sample_all():
    """A CPU sample of every watched running worker (the sweeper's pass);
    those of workers gone are dropped."""
    with _lock:
        pids = {rt.worker.pid for rt in _watched if rt.worker.alive}
    for pid in list(_cpu):
        if pid not in pids:
            _cpu.pop(pid, None)
    for pid in pids:
        _sample(pid)


def _clears(last, idle_s):
    """Whether CPU sample `last` (the sweeper's) can start a window that
    says "not at work" of a worker in no call for idle_s seconds, without
    waiting: taken within those seconds (after its last call), and at
    least a quarter of CPU_WINDOW_S ago (a shorter window cannot tell)."""
    if last is None:
        return False
    age = time.monotonic() - last[1]
    return (idle_s is None or age <= idle_s) and age >= CPU_WINDOW_S / 4


def _window_starts(candidates):
    """The start of each candidate's CPU window, taken for all at once:
    {pid: CPU sample} for [(rt, idle_s)...] whose workers are in no call.
    The sweeper's sample where it can clear the worker now (_clears),
    else a new one; then, where any is new, one CPU_WINDOW_S is slept for
    all of them (N idle workers looked at one after another slept N
    windows: ~4 s of /free with 20 packs, bench/many_packs.py).

    No worker's lock is held here, neither for the samples nor across the
    sleep.  Holding every candidate's lock for the shared window would
    stop any other thread from calling, releasing or starting all of them
    at once, and a thread that holds one worker's lock while it waits for
    another's (a call whose callback reaches a second worker) would wait
    for this whole step, where today it waits one window at most.  So the
    window may hold a request another thread made meanwhile, which only
    adds CPU: like the sweeper's sample it can only clear a worker, and
    the verdict "at work" still comes from a fresh window under the
    worker's own lock (working), one worker at a time: those are the few
    at work of their own, each kept anyway.  The window ends under that
    lock (working reads it there), so no call starts between the verdict
    and the stop."""
    starts, new = {}, False
    for rt, idle_s in candidates:
        pid = rt.worker.pid
        if pid is None:
            continue        # stopped meanwhile (_exit_one looks again under its lock)
        last = _cpu.get(pid)
        if _clears(last, idle_s):
            starts[pid] = last
            continue
        sample = _sample(pid)
        if sample is not None:
            starts[pid], new = sample, True
    if new:
        time.sleep(CPU_WINDOW_S)
    return starts


def _children(pid):
    """The pids of pid's child processes (each thread's children file)."""
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def working(rt, idle_s=None, since=None):
    """Why rt's worker, in no call, is at work of its own (module doc), in
    words, or None.  idle_s: how long it has been in no call; a CPU sample
    older than that cannot even say "not at work" (its window holds the
    last call: a /free right after a node that computed for a second found
    it "at work").  since: the start of its window that the caller took
    (_window_starts: with other workers', in no call), used instead of the
    sweeper's sample and, as that, only to clear it.  Whatever the
    sweeper's sample saw, the verdict "at work" comes from a window that
    starts now, under the worker's lock (_exit_one): between that sample
    and now the host may have had the worker run its release ladder, which
    is no work of its pack's (bench/many_packs.py, when /free ran the
    ladder on every worker before stopping the idle ones: a worker that
    had just run a node "used 42% of a CPU in no call")."""
    w = rt.worker
    pid = w.pid
    try:
        rec = rt.ledger.read(pid) if rt.ledger is not None else None
    except Exception:
        rec = None
    if rec and rec.get("run") == "working":
        return "its pack holds bulkhead.working()"
    kids = _children(pid)
    if kids:
        return f"its own processes run (pid {', '.join(map(str, kids[:4]))})"
    last = since if since is not None else _cpu.get(pid)
    if last is not None and (since is not None or idle_s is None or time.monotonic() - last[1] <= idle_s):
        if time.monotonic() - last[1] < CPU_WINDOW_S / 4:
            time.sleep(CPU_WINDOW_S)     # too short a window to tell
        pct = _busy_pct(pid, last)
        if pct is None or pct < CPU_BUSY_PCT:
            return None
    start = _sample(pid)
    time.sleep(CPU_WINDOW_S)
    pct = _busy_pct(pid, start)
    if pct is not None and pct >= CPU_BUSY_PCT:
        return f"it used {pct:.0f}% of a CPU in no call (a thread of its pack)"
    return None


def held_handles(rt):
    """The type names of the worker's objects the host still holds
    (RemoteObjects alive here), less the node instances the proxies hold
    (made again on the next generation)."""
    peer = getattr(rt.worker, "_peer", None)
    objs = list(getattr(peer, "remote_objects", {}).values()) if peer is not None else []
    return [o.remote_type for o in objs if o not in rt.instances]


def exit_idle(min_idle_s=None):
    """Stops each watched worker idle for at least its idle exit time
    (min_idle_s: that instead, for all) that holds no handle of the host's;
    releases those that do.  Returns [{"pid", "pack", "idle_s", "exited"}...]
    for the workers it acted on."""
    with _lock:
        rts = list(_watched)
    todo = []
    for rt in rts:
        limit = limit_s(rt.options) if min_idle_s is None else min_idle_s
        idle = idle_for(rt)
        if idle is None and min_idle_s == 0 and rt.worker.alive and not rt.worker.busy:
            idle = 0.0      # asked now: not in a call is idle (its ledger stamp may lag its last answer;
                            # _exit_one leaves a worker whose pack holds bulkhead.working())
        if idle is None or idle < limit or (min_idle_s is None and limit <= 0):
            continue
        todo.append((rt, idle))
    starts = _window_starts(todo)
    out = []
    for rt, idle in todo:
        row = _exit_one(rt, idle, f"after {idle:.0f} s idle", wait_s=0 if min_idle_s is None else BRIEF_S,
                        starts=starts)
        if row is not None:
            out.append(row)
    if any(row["exited"] for row in out):
        zygote.stop_idle()   # a zygote with no worker left goes too (else after its linger)
    return out


def pressure_pct():
    """The machine-wide pressure line, in percent of RAM (0: off)."""
    try:
        return max(0.0, float(os.environ.get(PRESSURE_SWITCH, PRESSURE_PCT)))
    except ValueError:
        return PRESSURE_PCT


def ram_short_bytes():
    """How far the RAM available is below the pressure line now, in bytes
    (0: not below it, or the line is off or cannot be read)."""
    pct = pressure_pct()
    if pct <= 0:
        return 0
    try:
        ram = _native.ram(os.environ.get(spec.RAM_ROOT) or None)
    except (_native.Error, OSError):
        return 0
    return max(0, int(ram["total_bytes"] * pct / 100) - ram["available_bytes"])


def exit_under_pressure():
    """Under machine memory pressure (module doc): stops idle workers that
    hold no handle of the host's, least recently used first, until the RAM
    available is back above the line (those that hold handles are released
    instead).  Returns the rows exit_idle returns."""
    short = ram_short_bytes()
    if not short:
        return []
    with _lock:
        rts = list(_watched)
    idle = sorted(((idle_for(rt), rt) for rt in rts), key=lambda x: -(x[0] or 0))
    idle = [(idle_s, rt) for idle_s, rt in idle if idle_s is not None and idle_s >= PRESSURE_MIN_IDLE_S]
    starts = _window_starts([(rt, idle_s) for idle_s, rt in idle])   # one window, however many are stopped
    out = []
    for idle_s, rt in idle:
        row = _exit_one(rt, idle_s, f"under machine memory pressure ({short >> 20} MiB short of "
                                    f"{pressure_pct():g}% of RAM available, {PRESSURE_SWITCH}; the least "
                                    f"recently used first, idle {idle_s:.0f} s)", starts=starts)
        if row is not None:
            out.append(row)
            short = ram_short_bytes()
            if not short:
                break
    return out


def _exit_one(rt, idle, why, wait_s=0, starts=None):
    """Stops rt's worker (idle for `idle` s) unless it is working for its
    pack (``working``: left alone, said once), the host holds its objects
    (then releases it, once per generation) or it is no longer idle.
    wait_s: how long to wait for its lock (the reader thread and the
    release flusher hold it for a frame at a time).  ``working`` looks
    under the lock, so no request of the host's (a /free's release on
    another thread) runs in the worker while its CPU is measured, and no
    call starts between the verdict and the stop.  starts: _window_starts'
    {pid: CPU sample}, the start of its window taken with the others' (a
    worker started again since, another pid, has none).  Returns its row,
    or None when it was left alone."""
    w = rt.worker
    with w.holding(wait_s) as held:
        if not held or not w.alive or w.busy or rt.async_calls():
            return None  # a call is starting or running (or async calls' tasks run): not idle after all
        why_working = working(rt, idle, (starts or {}).get(w.pid))
        if why_working is not None:
            if w.pid not in _kept_working:
                _kept_working.add(w.pid)
                log.info("bulkhead: pack %r: its worker (pid %d) runs no node but stays: %s", rt.name, w.pid,
                         why_working)
            return None
        pid, handles = w.pid, held_handles(rt)
        if handles:
            if (rt.pack_dir, pid) not in _released:
                _released.add((rt.pack_dir, pid))
                log.info("bulkhead: pack %r: its worker (pid %d) has been idle %.0f s but stays: ComfyUI "
                         "holds %d of its objects (%s: cached outputs); it is released instead", rt.name, pid,
                         idle, len(handles), ", ".join(sorted(set(handles))))
                try:
                    w.release(targets.RELEASE_ALL, wait_s=0)
                except Exception as e:
                    log.info("bulkhead: pack %r: releasing its idle worker failed: %s", rt.name, e)
            return {"pid": pid, "pack": rt.name, "idle_s": idle, "exited": False}
        w.close()
        log.info("bulkhead: pack %r: its worker (pid %d) exited %s; it starts again when a node of the pack "
                 "runs (%s, [bulkhead] idle_exit_s)", rt.name, pid, why, SWITCH)
        return {"pid": pid, "pack": rt.name, "idle_s": idle, "exited": True}
