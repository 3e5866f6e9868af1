"""The memory probes through bulkhead._native: Gpu over the fake NVML driver
the build makes, and ram() over fixture trees and this machine.

The fake driver is $BULKHEAD_BUILD/tests/c/fake_nvml/libnvidia-ml.so.1
(BULKHEAD_BUILD defaults to build/rel); what it reports comes from the state
file named by BH_FAKE_NVML, rewritten here (by rename) between reads.  See
tests/c/fake_nvml.c for the format.
"""

import os
import subprocess
import sys
import threading

import pytest

from bulkhead import _native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
FAKE_DIR = os.path.join(BUILD, "tests", "c", "fake_nvml")
FAKE = os.path.join(FAKE_DIR, "libnvidia-ml.so.1")
BROKEN = os.path.join(FAKE_DIR, "libfake_nvml_broken.so")

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
MIG0 = "MIG-abcdef01-2345-6789-abcd-ef0123456789"
TWO = (
    f'device {UUID0} "Fake H200" total=150000000000 free=140000000000 used=9000000000 reserved=1000000000\n'
    f'device {UUID1} "Fake A100" total=80000000000 free=80000000000 used=0\n'
)

pytestmark = pytest.mark.skipif(not os.path.exists(FAKE), reason=f"no fake NVML at {FAKE} (build first)")


class FakeDriver:
    def __init__(self, path):
        self.path = str(path)

    def set(self, text):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    d = FakeDriver(tmp_path / "state")
    d.set(TWO)
    monkeypatch.setenv("BH_FAKE_NVML", d.path)
    monkeypatch.delenv("BULKHEAD_NVML_LIBRARY", raising=False)
    return d


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _fds():
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- contracts


def test_api_presence():
    for name in ("Gpu", "ram", "ProbeError", "DriverUnavailable"):
        assert hasattr(_native, name), name
    assert issubclass(_native.ProbeError, _native.Error)
    assert issubclass(_native.DriverUnavailable, _native.ProbeError)
    for meth in ("count", "uuid", "name", "find", "visible", "memory", "process_used", "close",
                 "__enter__", "__exit__"):
        assert callable(getattr(_native.Gpu, meth)), meth


# --------------------------------------------------------------------- GPU


def test_gpu_reads_the_fake_driver(fake):
    with _native.Gpu(FAKE) as g:
        assert g.backend == "nvml"
        assert g.count() == 2
        assert g.uuid(0) == UUID0 and g.uuid(1) == UUID1
        assert g.name(0) == "Fake H200"
        assert g.find(UUID1) == 1
        assert g.find("gpu-1111") == 0
        assert g.visible(None, 1) == 1
        assert g.visible("GPU-6666,0", 0) == 1
        assert g.visible("GPU-6666,0", 1) == 0
        assert g.memory(0) == (150000000000, 140000000000, 9000000000)
        fake.set(TWO.replace("free=140000000000", "free=5"))
        assert g.memory(0)[1] == 5
        fake.set(TWO)
        assert g.memory(0)[1] == 140000000000
    assert g.closed
    with pytest.raises(ValueError):
        g.count()
    g.close()  # idempotent


def test_gpu_process_used(fake):
    fake.set(TWO + f"process 0 pid={os.getpid()} used=4096\nprocess 0 pid=77 used=na\n")
    with _native.Gpu(FAKE) as g:
        assert g.process_used(0, os.getpid()) == 4096
        assert g.process_used(1, os.getpid()) == 0
        assert g.process_used(0, 77) is None  # the driver hides it
        fake.set(TWO + "fail nvmlDeviceGetComputeRunningProcesses_v3=3\n")
        assert g.process_used(0, os.getpid()) is None  # not supported
        with pytest.raises(ValueError):
            g.process_used(0, 0)


def test_gpu_errors_name_the_code(fake):
    with _native.Gpu(FAKE) as g:
        with pytest.raises(_native.ProbeError) as e:
            g.find("GPU-")
        assert e.value.errname == "ENOTUNIQ"
        with pytest.raises(_native.ProbeError) as e:
            g.find("GPU-ffff")
        assert e.value.errname == "BH_ENODEVICE" and "GPU-ffff" in str(e.value)
        with pytest.raises(_native.ProbeError) as e:
            g.memory(2)
        assert e.value.errname == "BH_ENODEVICE"
        with pytest.raises(_native.ProbeError) as e:
            g.visible("", 0)
        assert e.value.errname == "BH_ENODEVICE"
        fake.set(TWO + "fail nvmlDeviceGetMemoryInfo_v2=15\n")  # GPU is lost
        with pytest.raises(_native.ProbeError) as e:
            g.memory(0)
        assert e.value.errname == "BH_ENVML"
        assert not isinstance(e.value, _native.DriverUnavailable)


def test_gpu_mig_by_uuid(fake):
    fake.set(TWO + f'mig {MIG0} "Fake MIG" total=18000000000 free=17000000000 used=1000000000\n')
    with _native.Gpu(FAKE) as g:
        i = g.find(MIG0)
        assert i == 2 and g.uuid(i) == MIG0
        assert g.memory(i) == (18000000000, 17000000000, 1000000000)
        assert g.visible(MIG0, 0) == 2


def test_gpu_no_driver():
    with pytest.raises(_native.DriverUnavailable) as e:
        _native.Gpu("/nonexistent/bulkhead/libnvidia-ml.so.1")
    assert e.value.errname == "BH_ENODRIVER"
    assert "/nonexistent/bulkhead/libnvidia-ml.so.1" in str(e.value)  # dlerror's text
    assert isinstance(e.value, _native.Error)


def test_gpu_broken_library(fake):
    with pytest.raises(_native.DriverUnavailable) as e:
        _native.Gpu(BROKEN)
    assert "nvmlShutdown" in str(e.value) and "undefined symbol" in str(e.value)


def test_gpu_driver_not_loaded(fake):
    fake.set(TWO + "fail nvmlInit_v2=9\n")
    with pytest.raises(_native.DriverUnavailable) as e:
        _native.Gpu(FAKE)
    assert "Driver Not Loaded" in str(e.value)


def test_gpu_library_from_environment(fake, monkeypatch):
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", FAKE)
    with _native.Gpu() as g:
        assert g.count() == 2
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml-from-env.so")
    with pytest.raises(_native.DriverUnavailable) as e:
        _native.Gpu()
    assert "libnvml-from-env" in str(e.value)
    # An explicit path wins over the variable.
    with _native.Gpu(FAKE) as g:
        assert g.count() == 2


def test_gpu_default_search(fake):
    """No path, no variable: dlopen's search finds libnvidia-ml.so.1 (here the
    fake, through LD_LIBRARY_PATH, which only a new process reads)."""
    env = dict(os.environ, LD_LIBRARY_PATH=FAKE_DIR, PYTHONPATH=os.path.dirname(os.path.dirname(_native.__file__)))
    env.pop("BULKHEAD_NVML_LIBRARY", None)
    code = "from bulkhead import _native as n; g = n.Gpu(); print(g.count(), g.uuid(0)); g.close()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", UUID0]


def test_gpu_threads_read_concurrently(fake):
    g = _native.Gpu(FAKE)
    errors = []

    def reader():
        try:
            for i in range(2000):
                assert g.memory(i & 1)[0] > 0
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g.close()
    assert not errors


def test_gpu_repeated_calls_leak_nothing(fake):
    g = _native.Gpu(FAKE)
    pid = os.getpid()
    fake.set(TWO + f"process 0 pid={pid} used=1\n")

    def calls(n):
        for _ in range(n):
            g.memory(0)
            g.uuid(1)
            g.name(0)
            g.find("GPU-6666")
            g.visible("1,0", 1)
            g.process_used(0, pid)
            try:
                g.memory(9)
            except _native.ProbeError:
                pass

    calls(1000)
    fds, rss = _fds(), _rss_kib()
    calls(10000)
    assert _fds() == fds
    if not os.environ.get("BULKHEAD_ASAN"):  # ASan's quarantine holds freed memory
        assert _rss_kib() - rss < 2048, "RSS grew over 10^4 rounds of calls"
    g.close()


def test_gpu_open_close_leaks_nothing(fake):
    for _ in range(20):
        _native.Gpu(FAKE).close()
    fds, rss = _fds(), _rss_kib()
    for _ in range(300):
        with _native.Gpu(FAKE) as g:
            g.memory(0)
        try:
            _native.Gpu(BROKEN)
        except _native.DriverUnavailable:
            pass
    assert _fds() == fds
    if not os.environ.get("BULKHEAD_ASAN"):
        assert _rss_kib() - rss < 4096


# --------------------------------------------------------------------- RAM


def _tree(root, files):
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)


MEMINFO = "MemTotal: 16777216 kB\nMemFree: 1048576 kB\nMemAvailable: 8388608 kB\n"
SWAPS = "Filename\tType\tSize\tUsed\tPriority\n/dev/sda2 partition 1048576 0 -2\n"
GiB = 1 << 30


def test_ram_fixture_cgroup_v2(tmp_path):
    _tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/swaps": SWAPS,
        "proc/self/cgroup": "0::/app/job\n",
        "proc/self/mountinfo": "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "sys/fs/cgroup/app/job/memory.max": "max\n",
        "sys/fs/cgroup/app/job/memory.current": "1\n",
        "sys/fs/cgroup/app/memory.max": f"{4 * GiB}\n",
        "sys/fs/cgroup/app/memory.current": f"{3 * GiB}\n",
        "sys/fs/cgroup/app/memory.stat": f"anon 1\ninactive_file {GiB // 2}\n",
    })
    r = _native.ram(tmp_path)
    assert r == {
        "total_bytes": 4 * GiB,
        "available_bytes": GiB + GiB // 2,
        "meminfo_total_bytes": 16 * GiB,
        "meminfo_available_bytes": 8 * GiB,
        "cgroup_version": 2,
        "limited": True,
        "cgroup_limit_bytes": 4 * GiB,
        "cgroup_current_bytes": 3 * GiB,
        "cgroup_reclaimable_bytes": GiB // 2,
        "swap_total_bytes": GiB,
        "pcp_free_bytes": None,  # no proc/zoneinfo in the tree
    }
    assert _native.ram(str(tmp_path)) == r and _native.ram(os.fsencode(str(tmp_path))) == r


def test_ram_fixture_without_cgroup(tmp_path):
    _tree(tmp_path, {"proc/meminfo": MEMINFO})
    r = _native.ram(root=tmp_path)
    assert r["cgroup_version"] == 0 and r["limited"] is False
    assert r["available_bytes"] == 8 * GiB and r["swap_total_bytes"] == 0


def test_ram_malformed_names_the_file(tmp_path):
    _tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/a\n",
        "sys/fs/cgroup/a/memory.max": "lots\n",
    })
    with pytest.raises(_native.ProbeError) as e:
        _native.ram(tmp_path)
    assert e.value.errname == "BH_ECGROUP"
    assert "memory.max" in str(e.value)
    with pytest.raises(_native.ProbeError) as e:
        _native.ram(tmp_path / "nowhere")
    assert e.value.errname == "ENOENT"


def test_ram_this_machine():
    r = _native.ram()
    assert r["total_bytes"] > 0
    assert 0 <= r["available_bytes"] <= r["total_bytes"] <= r["meminfo_total_bytes"]
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert r["meminfo_total_bytes"] == total
    assert r["cgroup_version"] in (0, 1, 2)


def test_ram_repeated_reads_leak_nothing(tmp_path):
    _tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/swaps": SWAPS, "proc/self/cgroup": "0::/a\n",
                     "sys/fs/cgroup/a/memory.max": "1000\n", "sys/fs/cgroup/a/memory.current": "10\n"})
    for _ in range(500):
        _native.ram(tmp_path)
        _native.ram()
    fds, rss = _fds(), _rss_kib()
    for _ in range(5000):
        _native.ram(tmp_path)
        _native.ram()
    assert _fds() == fds
    if not os.environ.get("BULKHEAD_ASAN"):
        assert _rss_kib() - rss < 2048
