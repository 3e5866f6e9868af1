"""The pager decision (python/bulkhead/pager.py): a worker pages exactly
when its host does, on CUDA, with a comfy-aimdo whose call signatures fit;
every other case stays on the ledger with a reason that says why."""

import types

import pytest

from bulkhead import pager


def control(init_params="implementation=None, simple_vram_headroom=None, nvml_pressure=False",
            with_devices=True):
    ns = {}
    exec(f"def init({init_params}): calls.append(('init', locals()))\n"
         "def init_devices(device_ids): calls.append(('init_devices', device_ids))\n"
         "def get_total_vram_usage(): return 12345\n", ns)
    m = types.SimpleNamespace(init=ns["init"], get_total_vram_usage=ns["get_total_vram_usage"])
    if with_devices:
        m.init_devices = ns["init_devices"]
    ns["calls"] = m.calls = []
    return m


@pytest.mark.parametrize("env, device, ctl, enabled, reason", [
    ("1", "cuda", control(), True, "follows the host"),
    ("0", "cuda", control(), False, "legacy ledger"),
    (None, "cuda", control(), False, "legacy ledger"),
    ("maybe", "cuda", control(), False, "is not 1"),
    ("1", "cpu", control(), False, "no cpu path"),
    ("1", "cuda", None, False, "not installed"),
    ("1", "cuda", control("implementation=None"), False, "takes no simple_vram_headroom, nvml_pressure"),
    ("1", "cuda", control("**kw"), True, "follows the host"),
    ("1", "cuda", control(with_devices=False), False, "no init_devices"),
    ("1", "cuda", types.SimpleNamespace(), False, "no init()"),
])
def test_decide(env, device, ctl, enabled, reason):
    got, why = pager.decide(env, device, ctl)
    assert got is enabled and reason in why


def test_real_comfy_aimdo_signatures_fit_when_installed():
    real = pytest.importorskip("comfy_aimdo.control")
    assert pager.protocol_problem(real) is None
    assert pager.decide("1", "cuda", real) == (True, "follows the host")
    assert pager.decide("1", "cpu", real)[0] is False


def test_bring_up_passes_the_hosts_headroom(monkeypatch):
    import sys
    mem = types.ModuleType("comfy.memory_management")
    mem.aimdo_enabled = False
    monkeypatch.setitem(sys.modules, "comfy.memory_management", mem)
    c = control()
    pager.bring_up(c, 400 << 20, [0])
    assert c.calls[0][0] == "init" and c.calls[0][1]["simple_vram_headroom"] == 400 << 20
    assert c.calls[0][1]["nvml_pressure"] is True
    assert c.calls[1] == ("init_devices", [0])
    assert mem.aimdo_enabled is True
    assert pager.pager_bytes(c) == 12345 and pager.pager_bytes(None) == 0


def test_host_state_is_read_not_written(monkeypatch):
    import sys
    mem = types.ModuleType("comfy.memory_management")
    monkeypatch.setitem(sys.modules, "comfy.memory_management", mem)
    assert pager.host_pager_enabled() is False
    mem.aimdo_enabled = True
    assert pager.host_pager_enabled() is True
