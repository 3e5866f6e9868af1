"""tools/gpu-check.c (`make gpu-check`), run as a program.

On a machine without an NVIDIA driver it must say so and exit 0; its
arguments are checked (2 for usage errors).  The whole flow -- workers
allocating with cuMemAlloc, NVML seeing it by UUID, the ledger and the
change-of-variables target agreeing -- runs here over two FAKE driver
libraries the build makes: $BULKHEAD_BUILD/tests/c/fake_cuda/libcuda.so.1
and the fake NVML, which share one state file (BH_FAKE_NVML; see
tests/c/fake_cuda.c).  Every run gets its own TMPDIR, which must be empty
afterwards (the temporary ledger removed), and no worker may outlive it.
"""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
TOOL = os.path.join(BUILD, "tools", "bulkhead-gpu-check")
FAKE_CUDA = os.path.join(BUILD, "tests", "c", "fake_cuda", "libcuda.so.1")
FAKE_NVML = os.path.join(BUILD, "tests", "c", "fake_nvml", "libnvidia-ml.so.1")

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
DEVICES = (
    f'device {UUID0} "Fake H200" total=150000000000 free=140000000000 used=9000000000 reserved=1000000000\n'
    f'device {UUID1} "Fake A100" total=80000000000 free=80000000000 used=0\n'
)
CTX = 500 << 20

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL), reason=f"no {TOOL} (build first)")


def _workers_alive():
    """pids of gpu-check workers still running (any parent)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--worker" in argv and argv[0].endswith(b"bulkhead-gpu-check"):
            out.append(int(pid))
    return out


@pytest.fixture
def run(tmp_path):
    """run(*args, state=None, timeout=60) -> CompletedProcess, with a private
    TMPDIR that is checked empty afterwards, and no workers left."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    before = set(_workers_alive())

    def go(*args, state=None, timeout=60, env=None):
        e = dict(os.environ, TMPDIR=str(tmpdir))
        e.pop("CUDA_VISIBLE_DEVICES", None)
        e.pop("BH_FAKE_NVML", None)
        if state is not None:
            path = tmp_path / "state"
            path.write_text(state)
            e["BH_FAKE_NVML"] = str(path)
        e.update(env or {})
        r = subprocess.run([TOOL, *args], env=e, capture_output=True, text=True, timeout=timeout)
        assert os.listdir(tmpdir) == [], f"left in TMPDIR: {os.listdir(tmpdir)}"
        assert set(_workers_alive()) - before == set(), "workers left running"
        return r

    return go


def fake_args(*extra):
    return ["--cuda-library", FAKE_CUDA, "--nvml-library", FAKE_NVML, *extra]


def state_of(tmp_path):
    """The state file with every device line's absent reserved= as 0 (the
    fake CUDA writes the field when it rewrites a line)."""
    lines = (tmp_path / "state").read_text().splitlines(keepends=True)
    return "".join(l.replace(" reserved=0\n", "\n") for l in lines)


# ----------------------------------------------------- no driver, arguments


def _libcuda_loadable():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_libcuda_loadable(), reason="this machine has libcuda.so.1")
def test_no_driver_default_search(run):
    r = run()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("gpu-check: no NVIDIA driver (libcuda.so.1: ")
    assert "nothing to check" in r.stdout


def test_no_driver_explicit_path(run, tmp_path):
    missing = str(tmp_path / "libcuda.so.1")
    r = run("--cuda-library", missing)
    assert r.returncode == 0, r.stderr
    assert f"gpu-check: no NVIDIA driver ({missing}: " in r.stdout


def test_fake_nvml_without_cuda_is_no_driver(run, tmp_path):
    r = run("--cuda-library", str(tmp_path / "nope.so"), "--nvml-library", FAKE_NVML, state=DEVICES)
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA driver" in r.stdout and "nothing to check" in r.stdout


def test_library_without_cuda_symbols_is_no_driver(run):
    r = run("--cuda-library", FAKE_NVML, state=DEVICES)
    assert r.returncode == 0, r.stderr
    assert "no NVIDIA driver" in r.stdout and "no symbol cuInit" in r.stdout


def test_help(run):
    r = run("--help")
    assert r.returncode == 0
    assert r.stdout.startswith("usage: bulkhead-gpu-check")
    for opt in ("--workers", "--steps", "--step-mib", "--timeout", "--cuda-library", "--nvml-library"):
        assert opt in r.stdout
    assert run("-h").returncode == 0


@pytest.mark.parametrize(
    "args, named",
    [
        (["--bogus"], "'--bogus'"),
        (["-x"], "'-x'"),
        (["--steps"], "'--steps'"),
        (["--steps", "0"], "'--steps'"),
        (["--steps=65"], "'--steps'"),
        (["--step-mib", "x"], "'--step-mib'"),
        (["--workers", "-1"], "'--workers'"),
        (["--workers", "17"], "'--workers'"),
        (["--timeout", "1.5"], "'--timeout'"),
        (["extra"], "'extra'"),
        (["--worker"], "usage:"),
    ],
)
def test_usage_errors(run, args, named):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert named in r.stderr
    assert "usage:" in r.stderr
    assert r.stdout == ""


# ------------------------------------------------- the flow over the fakes


def test_full_flow_passes(run, tmp_path):
    state = DEVICES + f"cuda context={CTX}\n"
    r = run(*fake_args(), state=state)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"CUDA device 0 = NVML device 0: Fake H200 {UUID0}" in out
    assert "2 workers x 3 steps x 256 MiB" in out
    assert out.count("NVML drop 500.0 MiB") == 2  # one context per worker
    assert "context size 500.0 MiB" in out
    rows = [l for l in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", l)]
    assert len(rows) == 6
    for k, row in enumerate(rows, 1):
        f = row.split()
        assert float(f[2]) == 256.0 * k  # allocated so far
        assert float(f[3]) == 256.0  # NVML drop
        assert float(f[6]) == 256.0 * k  # ledger
        assert f.count("ok") == 3, row
    assert "total: allocated 1536.0 MiB, NVML drop 1536.0 MiB" in out
    assert out.rstrip().endswith("gpu-check: all checks passed")
    # Everything given back: workers freed and destroyed their contexts,
    # the parent destroyed its own.
    assert state_of(tmp_path) == state


def test_options_change_the_run(run):
    r = run(*fake_args("--workers", "3", "--steps", "2", "--step-mib", "64"), state=DEVICES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 workers x 2 steps x 64 MiB" in r.stdout
    assert "total: allocated 384.0 MiB, NVML drop 384.0 MiB" in r.stdout


@pytest.mark.parametrize("cvd", ["1", "GPU-6666", "1,0"])
def test_device_follows_cuda_visible_devices(run, tmp_path, cvd):
    # CUDA's device 0 is NVML's device 1: resolved by UUID, never by index;
    # the workers inherit the variable and find the same device.
    state = DEVICES + f"cuda context={CTX}\n"
    r = run(*fake_args(), state=state, env={"CUDA_VISIBLE_DEVICES": cvd})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"CUDA device 0 = NVML device 1: Fake A100 {UUID1} (CUDA_VISIBLE_DEVICES={cvd})" in r.stdout
    assert "total: allocated 1536.0 MiB, NVML drop 1536.0 MiB" in r.stdout
    assert state_of(tmp_path) == state


def test_no_visible_device(run):
    r = run(*fake_args(), state=DEVICES, env={"CUDA_VISIBLE_DEVICES": ""})
    # CUDA fails cuInit with "no device" then, as the real driver does.
    assert r.returncode == 0, r.stdout
    assert "gpu-check: no CUDA device (no CUDA-capable device is detected): nothing to check" in r.stdout


def test_check_a_fails_when_nvml_does_not_see_allocations(run):
    # Contexts of no cost: the per-step tolerance is the 2 MiB slack.
    r = run(*fake_args(), state=DEVICES + "cuda invisible\n")
    assert r.returncode == 1
    assert "gpu-check: FAILED: (a) step 1 worker 0: NVML drop off by -256.0 MiB" in r.stdout
    assert "all checks passed" not in r.stdout


def test_check_a_total_catches_what_each_step_tolerates(run):
    # Each 256 MiB step NVML misses is within one 500 MiB context; the
    # total (1536 MiB missing) is not.
    r = run(*fake_args(), state=DEVICES + f"cuda context={CTX}\ncuda invisible\n")
    assert r.returncode == 1
    assert "FAILED: (a) step" not in r.stdout
    assert "gpu-check: FAILED: (a) total NVML drop off by -1536.0 MiB" in r.stdout


def test_check_a_passes_within_one_context(run):
    # Allocations NVML never sees are within tolerance when a context is
    # bigger than a step (the per-step tolerance is one context + 2 MiB).
    r = run(*fake_args("--step-mib", "64", "--steps", "1", "--workers", "1"),
            state=DEVICES + f"cuda context={CTX}\ncuda invisible\n")
    assert r.returncode == 0, r.stdout


def test_check_c_fails_when_blind_free_is_off(run):
    r = run(*fake_args(), state=DEVICES + f"cuda context={CTX}\ncuda skew={-(CTX + (64 << 20))}\n")
    assert r.returncode == 1
    assert "gpu-check: FAILED: (c) ask target - need = -564.0 MiB" in r.stdout


def test_check_c_passes_within_one_context(run):
    r = run(*fake_args(), state=DEVICES + f"cuda context={CTX}\ncuda skew={CTX - 1}\n")
    assert r.returncode == 0, r.stdout


def test_worker_allocation_failure(run, tmp_path):
    state = DEVICES + f"cuda context={CTX}\nfail cuMemAlloc_v2=2\n"
    r = run(*fake_args(), state=state)
    assert r.returncode == 1
    assert "FAILED: worker 0: cuMemAlloc(256 MiB): out of memory" in r.stdout
    assert state_of(tmp_path) == state  # contexts given back


def test_worker_context_failure(run):
    r = run(*fake_args(), state=DEVICES + "fail cuCtxCreate_v2=2\n")
    # The parent's own context fails first.
    assert r.returncode == 1
    assert "FAILED: cuCtxCreate: out of memory" in r.stdout


def test_timeout_kills_workers(run):
    r = run(*fake_args("--timeout", "1"), state=DEVICES + "cuda sleep_ms=20000\n", timeout=30)
    assert r.returncode == 1
    assert "FAILED: timeout: no answer from worker 0 within --timeout 1 s" in r.stdout


def test_no_cuda_device(run):
    r = run(*fake_args(), state="# no devices\n")
    assert r.returncode == 0, r.stdout
    assert "gpu-check: no CUDA device (no CUDA-capable device is detected): nothing to check" in r.stdout


def test_cuinit_other_failure_fails(run):
    r = run(*fake_args(), state=DEVICES + "fail cuInit=999\n")
    assert r.returncode == 1
    assert "FAILED: cuInit" in r.stdout and "CUresult 999" in r.stdout


def test_nvml_missing_is_no_driver(run, tmp_path):
    r = run("--cuda-library", FAKE_CUDA, "--nvml-library", str(tmp_path / "nope.so"), state=DEVICES)
    assert r.returncode == 0, r.stdout
    assert "no NVIDIA driver (NVML: " in r.stdout


def test_nvml_without_the_cuda_device_fails(run):
    # CUDA reports a UUID NVML does not list: fail, never fall back to an index.
    r = run(*fake_args(), state=DEVICES + "cuda uuid=GPU-99999999-2222-3333-4444-555555555555\n")
    assert r.returncode == 1, r.stdout
    assert ("FAILED: NVML has no device with CUDA device 0's UUID "
            "GPU-99999999-2222-3333-4444-555555555555") in r.stdout


def test_mig_uuid_resolves(run):
    # CUDA's UUID bytes are a MIG instance's: found as "MIG-..." through NVML.
    mig = "MIG-abcdef01-2345-6789-abcd-ef0123456789"
    state = (DEVICES + f'mig {mig} "Fake MIG 1g" total=20000000000 free=20000000000 used=0\n'
             f"cuda uuid={mig}\n")
    r = run(*fake_args("--workers", "1", "--steps", "1", "--step-mib", "1"), state=state)
    assert f"CUDA device 0 = NVML device 2: Fake MIG 1g {mig}" in r.stdout, r.stdout


def test_not_enough_memory(run):
    small = f'device {UUID0} "Tiny" total=2000000000 free=1500000000 used=500000000\n'
    r = run(*fake_args(), state=small)
    assert r.returncode == 1
    assert "not enough free device memory" in r.stdout


def test_sigterm_stops_and_cleans_up(tmp_path):
    import signal

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    state = tmp_path / "state"
    state.write_text(DEVICES + "cuda sleep_ms=20000\n")
    env = dict(os.environ, TMPDIR=str(tmpdir), BH_FAKE_NVML=str(state))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    before = set(_workers_alive())
    with subprocess.Popen([TOOL, *fake_args()], env=env, stdout=subprocess.PIPE, text=True) as p:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("step worker"):
                break
        assert len(set(_workers_alive()) - before) == 2
        p.send_signal(signal.SIGTERM)
        rest = p.stdout.read()
        assert p.wait(timeout=30) == 1
    assert "gpu-check: FAILED: interrupted by signal 15" in rest, lines + [rest]
    assert os.listdir(tmpdir) == []
    assert set(_workers_alive()) - before == set()
