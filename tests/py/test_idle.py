"""host/idle.py's choice under machine memory pressure, in process: which
idle workers exit and in what order (the e2e test,
tests/e2e/test_server.py, sees one exit from the user's side); and, on
real workers, /free's look for work of their own: one CPU window for all
of them, a worker at work found among idle ones."""

import time
import types

from bulkhead.host import idle


def _runtimes(monkeypatch, idle_s, short_after):
    """Fake runtimes idle for idle_s seconds each (None: busy); the RAM is
    short until short_after exits have happened."""
    rts = [types.SimpleNamespace(name=f"pack{i}", idle_s=s) for i, s in enumerate(idle_s)]
    stopped = []
    monkeypatch.setattr(idle, "_watched", rts)
    monkeypatch.setattr(idle, "idle_for", lambda rt: rt.idle_s)
    monkeypatch.setattr(idle, "ram_short_bytes", lambda: 0 if len(stopped) >= short_after else 1 << 30)

    def exit_one(rt, idle_s, why, starts=None):
        stopped.append((rt.name, why))
        return {"pack": rt.name, "exited": True}
    monkeypatch.setattr(idle, "_exit_one", exit_one)
    monkeypatch.setattr(idle, "_window_starts", lambda candidates: {})   # no worker to sample
    return stopped


def test_the_least_recently_used_idle_worker_exits_first_until_memory_is_back(monkeypatch):
    stopped = _runtimes(monkeypatch, [30.0, None, 300.0, 1.0, 90.0], short_after=2)
    rows = idle.exit_under_pressure()
    assert [r["pack"] for r in rows] == ["pack2", "pack4"]      # idle longest first; then memory is back
    assert all("under machine memory pressure" in why and "the least recently used first" in why
               for _, why in stopped)


def test_a_busy_or_just_used_worker_never_exits_for_pressure(monkeypatch):
    stopped = _runtimes(monkeypatch, [None, 1.0, idle.PRESSURE_MIN_IDLE_S - 0.5], short_after=99)
    assert idle.exit_under_pressure() == [] and stopped == []


def test_no_pressure_no_exit(monkeypatch):
    stopped = _runtimes(monkeypatch, [500.0], short_after=0)
    assert idle.exit_under_pressure() == [] and stopped == []


def test_the_pressure_line_is_read_from_the_switch(monkeypatch, tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 1048576 kB\nMemFree: 51200 kB\nMemAvailable: 51200 kB\n")
    monkeypatch.setenv("BULKHEAD_RAM_ROOT", str(tmp_path))
    monkeypatch.delenv(idle.PRESSURE_SWITCH, raising=False)
    assert idle.ram_short_bytes() == (1 << 30) // 10 - (50 << 20)      # 10% of 1 GiB, 50 MiB available
    monkeypatch.setenv(idle.PRESSURE_SWITCH, "4")
    assert idle.ram_short_bytes() == 0                                # 4%: 40 MiB < 50 MiB
    monkeypatch.setenv(idle.PRESSURE_SWITCH, "0")
    assert idle.ram_short_bytes() == 0 and idle.pressure_pct() == 0
    monkeypatch.setenv(idle.PRESSURE_SWITCH, "lots")
    assert idle.pressure_pct() == idle.PRESSURE_PCT


# /free's check of every idle worker for work of its own (working()), on
# real workers: a stand-in for a PackRuntime with what exit_idle reads (no
# ledger: a worker in no call is idle when asked now).

def _packs(make_worker, n):
    rts = []
    for i in range(n):
        w = make_worker(name=f"pack{i}")
        w.start()
        rts.append(types.SimpleNamespace(worker=w, ledger=None, options={}, name=f"pack{i}",
                                         pack_dir=f"/nowhere/pack{i}", instances=[], async_calls=lambda: []))
    return rts


class _Windows:
    """time, as host/idle.py sees it, counting the CPU windows slept on
    the calling thread (the sweeper, if another test started it, sleeps
    on its own)."""

    def __init__(self):
        import threading
        self.thread, self.slept = threading.get_ident(), 0

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        import threading
        if threading.get_ident() == self.thread and seconds == idle.CPU_WINDOW_S:
            self.slept += 1
        time.sleep(seconds)


def test_free_checks_every_idle_worker_in_one_cpu_window(make_worker, monkeypatch):
    """ComfyUI's "Free model and node cache" (exit_idle(0.0)) samples the
    CPU of every idle worker over one shared window, not one window per
    worker one after another (20 idle workers: /free slept 20 windows,
    ~4 s in bench/many_packs.py); each of them exits."""
    rts = _packs(make_worker, 4)
    pids = [rt.worker.pid for rt in rts]
    monkeypatch.setattr(idle, "_watched", rts)
    monkeypatch.setattr(idle, "_cpu", {})            # no sweeper's sample: each needs a fresh window
    clock = _Windows()
    monkeypatch.setattr(idle, "time", clock)
    rows = idle.exit_idle(0.0)
    assert sorted((r["pid"], r["exited"]) for r in rows) == sorted((pid, True) for pid in pids)
    assert not any(rt.worker.alive for rt in rts)
    assert clock.slept == 1


def test_a_worker_at_work_of_its_own_stays_when_checked_with_idle_ones(make_worker, monkeypatch, caplog):
    """A worker computing in a thread of its own (in no call) is found at
    work and stays, its reason logged, while the idle workers checked in
    the same window exit; in-process nothing would stop the thread."""
    rts = _packs(make_worker, 3)
    busy = rts[1]
    busy.worker.call("bh_testmod:spin_in_thread", 60.0)
    monkeypatch.setattr(idle, "_watched", rts)
    monkeypatch.setattr(idle, "_cpu", {})
    monkeypatch.setattr(idle, "_kept_working", set())
    with caplog.at_level("INFO", logger="bulkhead"):
        rows = idle.exit_idle(0.0)
    assert sorted(r["pack"] for r in rows if r["exited"]) == ["pack0", "pack2"]
    assert busy.worker.alive and busy.name not in [r["pack"] for r in rows]
    assert f"its worker (pid {busy.worker.pid}) runs no node but stays: it used" in caplog.text
