"""API presence and the one-binary-for-every-interpreter promise."""

import glob
import os
import subprocess
import sys

import pytest

import bulkhead
from bulkhead import _native

from conftest import WORKER_VENVS


def test_public_api():
    for name in ("Worker", "WorkerDied", "WorkerStartError", "CallTimeout", "RemoteError",
                 "BulkheadError", "ProtocolError", "PeerClosed", "Timeout", "RemoteCallable",
                 "RemoteObject", "HandleError"):
        assert hasattr(bulkhead, name), name
    assert issubclass(bulkhead.WorkerDied, bulkhead.BulkheadError)
    assert issubclass(bulkhead.ProtocolError, _native.Error)
    for name in ("channel_open", "spawn", "strerror", "dtypes", "Channel", "Lease", "Proc"):
        assert hasattr(_native, name), name
    assert _native.PROTOCOL_VERSION >= 1
    # The idle sweep is each worker's own timer (worker_memory.on_idle); no
    # process decides it for several workers, so policy.c's rule has no
    # binding to drift from.
    assert not hasattr(_native, "policy_idle_sweep")


def test_pack_environment_api():
    # exported lazily: `import bulkhead` (every worker start) does not load them
    r = subprocess.run([sys.executable, "-c", "import bulkhead, sys; "
                        "print(sorted(m for m in sys.modules if m in ('bulkhead.envs', 'bulkhead.packconfig')))"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
    for name in ("install", "env_status", "EnvStatus", "EnvBuildError", "PackConfig", "PackConfigError",
                 "PackConfigWarning"):
        assert hasattr(bulkhead, name) and name in dir(bulkhead), name
    assert issubclass(bulkhead.PackConfigError, bulkhead.BulkheadError)
    assert issubclass(bulkhead.PackConfigError, ValueError)
    assert issubclass(bulkhead.EnvBuildError, bulkhead.BulkheadError)
    assert issubclass(bulkhead.PackConfigWarning, UserWarning)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bulkhead.nope


def test_native_is_one_abi3_binary():
    assert _native.__file__.endswith(".abi3.so")
    d = os.path.dirname(_native.__file__)
    assert [os.path.basename(p) for p in glob.glob(os.path.join(d, "_native*.so"))] == ["_native.abi3.so"]


def _interpreters():
    found = set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    found.add("/usr/bin/python3")
    out = []
    for p in sorted(found):
        try:
            v = subprocess.run([p, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if v and tuple(map(int, v.split("."))) >= (3, 9):
            out.append(p)
    return out


@pytest.mark.parametrize("python", _interpreters())
def test_native_imports_under_every_interpreter(python):
    root = os.path.dirname(os.path.dirname(_native.__file__))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([python, "-c", "import bulkhead._native as n, sys; print(n.PROTOCOL_VERSION, sys.version_info[:2])"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(_native.PROTOCOL_VERSION))


def test_strerror_names_codes():
    assert "magic" in _native.strerror(10001)
    assert _native.strerror(2)  # errno values too


def test_worker_venvs_cover_other_interpreters():
    if not WORKER_VENVS:
        pytest.skip("no worker venvs built (run `make worker-venvs`)")
    host = "%d.%d." % sys.version_info[:2]
    assert any(host not in name for name in WORKER_VENVS), WORKER_VENVS
