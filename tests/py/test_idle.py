"""host/idle.py's choice under machine memory pressure, in process: which
idle workers exit and in what order (the e2e test,
tests/e2e/test_server.py, sees one exit from the user's side)."""

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

    def exit_one(rt, idle_s, why):
        stopped.append((rt.name, why))
        return {"pack": rt.name, "exited": True}
    monkeypatch.setattr(idle, "_exit_one", exit_one)
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
