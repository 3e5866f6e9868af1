"""Per-pack environments: interpreter discovery, offline builds from local
wheels (every error path), the stamp's states, the command line, and one
real-PyPI build of two packs whose numpy requirements conflict, each run in
a worker under its own interpreter."""

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

import bulkhead
from bulkhead.envs import build as envs, config as packconfig
from bulkhead.envs.build import EnvBuildError
from bulkhead.envs.errors import InterpreterNotFound
from bulkhead.envs.interpreters import list_interpreters

from conftest import HELPERS

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_ENVS = os.path.join(HERE, "..", "..", "build", "test-envs")
HOST_MM = "%d.%d" % sys.version_info[:2]
HOST_REAL = os.path.realpath(sys.executable)


def make_wheel(directory, name, version, files):
    """Writes a minimal valid pure-Python wheel (METADATA, WHEEL, RECORD)
    and returns its path: pip installs it offline without setuptools."""
    info = f"{name}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: bulkhead-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for path, text in entries.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = "\n".join(record) + "\n"
    whl = os.path.join(directory, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
    return whl


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("wheels"))
    make_wheel(d, "bhdemo", "1.0", {
        "bhdemo/__init__.py": "VALUE = 'from a local wheel'\n\ndef value():\n    return VALUE\n"})
    return d


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("BULKHEAD_HOME", str(h))
    monkeypatch.delenv("BULKHEAD_PIP_ARGS", raising=False)
    monkeypatch.delenv("BULKHEAD_INSTALLER", raising=False)
    return h


@pytest.fixture
def offline(wheels, monkeypatch):
    monkeypatch.setenv("BULKHEAD_PIP_ARGS", f"--no-index --find-links {wheels}")


def make_pack(tmp_path, text, name="pack"):
    d = os.path.join(tmp_path, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "comfy-env.toml"), "w") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))
    return d


def only_config(pack):
    [c] = packconfig.load_configs(pack, warn=False)
    return c


def env_entries(home):
    d = os.path.join(home, "envs")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "bulkhead"] + list(args), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=timeout)


def edit_stamp(status, **changes):
    p = os.path.join(status.env_dir, envs.STAMP)
    with open(p) as f:
        s = json.load(f)
    for k, v in changes.items():
        if k.startswith("interpreter_"):
            s["interpreter"][k[len("interpreter_"):]] = v
        else:
            s[k] = v
    with open(p, "w") as f:
        json.dump(s, f)


# --- places and interpreters ---

def test_workspace_locations(monkeypatch, tmp_path):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert envs.workspace() == str(tmp_path / "bh")
    monkeypatch.delenv("BULKHEAD_HOME")
    assert envs.workspace() == str(tmp_path / "xdg" / "bulkhead")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/is/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    assert envs.workspace() == str(tmp_path / "u" / ".local" / "share" / "bulkhead")
    monkeypatch.delenv("XDG_DATA_HOME")
    assert envs.workspace() == str(tmp_path / "u" / ".local" / "share" / "bulkhead")
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh"))
    c = only_config(make_pack(tmp_path, 'python = "3.12"\n', name="My Pack!"))
    assert envs.env_dir(c) == str(tmp_path / "bh" / "envs" / f"My_Pack_-{c.config_hash[:12]}")


def _fake_pyenv(tmp_path, monkeypatch, versions):
    root = tmp_path / "pyenv"
    for v in versions:
        b = root / "versions" / v / "bin"
        b.mkdir(parents=True)
        os.symlink(HOST_REAL, b / "python3")
    monkeypatch.setenv("PYENV_ROOT", str(root))
    return root


def test_pyenv_newest_patch_wins(tmp_path, monkeypatch):
    # 3.x.10 is newer than 3.x.9 (numeric, not lexical); other versions,
    # non-numeric names and dirs without a python are not candidates.
    root = _fake_pyenv(tmp_path, monkeypatch, [f"{HOST_MM}.9", f"{HOST_MM}.10", "3.1.99", f"{HOST_MM}-dev"])
    (root / "versions" / f"{HOST_MM}.77").mkdir()
    it = envs.find_interpreter(HOST_MM)
    assert it.path == str(root / "versions" / f"{HOST_MM}.10" / "bin" / "python3")
    assert it.source == "pyenv" and it.version == "%d.%d.%d" % sys.version_info[:3]
    assert f"newest {HOST_MM} patch" in it.why and f"also there: {HOST_MM}.9" in it.why


def test_exact_patch_and_a_lying_interpreter(tmp_path, monkeypatch):
    real = "%d.%d.%d" % sys.version_info[:3]
    root = _fake_pyenv(tmp_path, monkeypatch, [real, f"{HOST_MM}.99"])
    it = envs.find_interpreter(real)
    assert it.path == str(root / "versions" / real / "bin" / "python3") and it.version == real
    # a pyenv dir whose python is not the version its name says is refused
    with pytest.raises(InterpreterNotFound) as ei:
        envs.find_interpreter(f"{HOST_MM}.99")
    assert f"{root}/versions/{HOST_MM}.99/bin/python3 (pyenv): is Python {real}" in str(ei.value)


def test_explicit_and_default_interpreter(tmp_path):
    it = envs.find_interpreter(HOST_REAL)
    assert (it.path, it.source) == (HOST_REAL, "explicit") and "in the config" in it.why
    with pytest.raises(InterpreterNotFound, match="does not exist"):
        envs.find_interpreter(str(tmp_path / "nope" / "python3"))
    with pytest.raises(InterpreterNotFound, match="cannot be used: does not run"):
        envs.find_interpreter("/bin/false")
    old = [p for v, p, _ in list_interpreters() if tuple(map(int, v.split(".")))[:2] < (3, 9)]
    if old:
        with pytest.raises(InterpreterNotFound, match="a bulkhead worker needs 3.9 or newer"):
            envs.find_interpreter(old[0])
    it = envs.find_interpreter(None)
    assert it.version.startswith(HOST_MM + ".") and f"the host's version {HOST_MM}" in it.why


def test_version_not_on_this_machine(tmp_path, home):
    pack = make_pack(tmp_path, 'python = "3.99"\n')
    with pytest.raises(InterpreterNotFound) as ei:
        bulkhead.install(pack, progress=lambda line: None)
    msg = str(ei.value)
    assert "no Python 3.99 interpreter found" in msg and "python3.99 on PATH" in msg
    assert "interpreters on this machine: " in msg and "pyenv install 3.99" in msg
    assert ei.value.found and all(v in msg for v, _, _ in ei.value.found)
    assert f"{HOST_MM}." in msg
    assert [e for e in env_entries(home) if not e.endswith(".lock")] == []


# --- building offline ---

@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_build_offline_then_run_a_worker(tmp_path, home, wheels, installer, monkeypatch):
    monkeypatch.setenv("BULKHEAD_INSTALLER", installer)
    pack = make_pack(tmp_path, f"""
        python = "{HOST_MM}"
        requirements = ["bhdemo==1.0"]
        [env_vars]
        BH_PACK_SETTING = "only in the worker"
        [bulkhead]
        idle_release_s = 7
    """)
    lines = []
    [st] = bulkhead.install(pack, progress=lines.append, pip_args=["--no-index", "--find-links", wheels])
    c = only_config(pack)
    assert st.ok and st.state == "ready" and st.fix == ""
    assert st.python == os.path.join(envs.env_dir(c), "bin", "python") and os.access(st.python, os.X_OK)
    assert st.version.startswith(HOST_MM + ".")
    assert any("interpreter: " in l and f"(Python {HOST_MM}." in l for l in lines)
    assert any(("Successfully installed bhdemo-1.0" if installer == "pip" else "+ bhdemo==1.0") in l for l in lines)
    assert env_entries(home) == sorted([os.path.basename(st.env_dir), f".{os.path.basename(st.env_dir)}.lock"])
    s = envs.read_stamp(st.env_dir)
    assert s["config_hash"] == c.config_hash and s["protocol"] == bulkhead._native.PROTOCOL_VERSION
    assert s["config"] == c.path and s["requirements"] == ["bhdemo==1.0"] and s["installer"] == installer
    assert s["interpreter"]["version"] == st.version and os.path.exists(s["interpreter"]["path"])
    # nothing in bin/ still names the temporary build directory
    for n in os.listdir(os.path.join(st.env_dir, "bin")):
        p = os.path.join(st.env_dir, "bin", n)
        if not os.path.islink(p):
            with open(p, "rb") as f:
                assert b".tmp-" not in f.read(), n
    # the environment holds the pack's requirements plus the host's matched
    # set (test_hostmatch.py): not bulkhead, nor the host's pytest
    out = subprocess.run([st.python, "-I", "-c", "import bhdemo, importlib.util as u; "
                          "print(bhdemo.value(), u.find_spec('bulkhead'), u.find_spec('pytest'))"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert out.strip() == "from a local wheel None None"
    import importlib.metadata
    assert s["host"]["shared"]["torch"] == importlib.metadata.version("torch")
    assert "pytest" not in s["host"]["shared"] and "bhdemo" not in s["host"]["shared"]
    # a worker on it: the pack's module, its env var, and not in the host
    w = bulkhead.Worker(st.python, name=c.name, env=c.env_vars)
    try:
        assert w.call("bhdemo:value") == "from a local wheel"
        assert w.call("os:getenv", "BH_PACK_SETTING") == "only in the worker"
        assert w.call("sys:prefix.__str__") == st.env_dir
    finally:
        w.close()
    assert "BH_PACK_SETTING" not in os.environ
    # installing again finds it ready and builds nothing
    lines.clear()
    [again] = bulkhead.install(pack, progress=lines.append)
    assert again.ok and envs.read_stamp(st.env_dir)["created_unix"] == s["created_unix"]
    assert any(": ready: " in l for l in lines) and not any("building" in l for l in lines)
    r = cli("env", pack)
    assert r.returncode == 0 and f"{c.name}: ready" in r.stdout and st.python in r.stdout


def test_failed_pip_install_leaves_nothing(tmp_path, home, offline, monkeypatch):
    monkeypatch.setenv("BULKHEAD_INSTALLER", "pip")   # pip's own words below
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo==1.0", "bh-no-such-dist==3"]\n')
    lines = []
    with pytest.raises(EnvBuildError) as ei:
        bulkhead.install(pack, progress=lines.append)
    e = ei.value
    assert f"pip install for pack ({pack}/comfy-env.toml) failed with exit status" in str(e)
    assert "no environment was made" in str(e)
    assert "--- last lines of pip's output ---" in str(e)
    assert "bh-no-such-dist" in e.output_tail and "No matching distribution" in e.output_tail
    assert e.returncode not in (0, None)
    assert [x for x in env_entries(home) if not x.endswith(".lock")] == []
    assert bulkhead.env_status(only_config(pack)).state == "missing"


def test_stale_after_editing_the_config(tmp_path, home, offline):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\n')
    [first] = bulkhead.install(pack, progress=lambda l: None)
    with open(os.path.join(pack, "comfy-env.toml"), "a") as f:
        f.write('requirements = ["bhdemo"]\n')
    c = only_config(pack)
    st = bulkhead.env_status(c)
    assert st.state == "stale" and not st.ok and st.python is None
    assert f"{c.path} changed since {first.env_dir} was built" in st.reason
    assert f"bulkhead install {pack}" in st.fix and f"python -m bulkhead install {pack}" in st.fix
    assert f"bulkhead.install({pack!r})" in st.fix
    r = cli("env", pack)
    assert r.returncode == 1 and "pack: stale" in r.stdout and f"fix:     rebuild it with: bulkhead install {pack}" in r.stdout
    [again] = bulkhead.install(pack, progress=lambda l: None)
    assert again.ok and again.env_dir != first.env_dir
    assert not os.path.exists(first.env_dir)           # the superseded one is removed
    # editing only run-time settings does not make it stale
    with open(os.path.join(pack, "comfy-env.toml"), "a") as f:
        f.write('[env_vars]\nX = "1"\n[bulkhead]\nidle_release_s = 3\n')
    assert bulkhead.env_status(only_config(pack)).ok


def test_foreign_and_broken_stamps(tmp_path, home, offline):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\n')
    [st] = bulkhead.install(pack, progress=lambda l: None)
    c = only_config(pack)
    good = envs.read_stamp(st.env_dir)

    edit_stamp(st, protocol=good["protocol"] + 1)
    s = bulkhead.env_status(c)
    assert s.state == "foreign" and f"built for bulkhead protocol {good['protocol'] + 1}" in s.reason
    assert "rebuild it with: bulkhead install" in s.fix

    edit_stamp(st, protocol=good["protocol"], interpreter_version="2.7.18")
    s = bulkhead.env_status(c)
    assert s.state == "foreign" and "changed version: built with Python 2.7.18, now " in s.reason

    edit_stamp(st, interpreter_version=good["interpreter"]["version"], interpreter_path=str(tmp_path / "gone"))
    s = bulkhead.env_status(c)
    assert s.state == "foreign" and f"({tmp_path / 'gone'}, Python " in s.reason and "is gone" in s.reason

    edit_stamp(st, interpreter_path=good["interpreter"]["path"], config_hash="0" * 64)
    assert bulkhead.env_status(c).state == "stale"

    with open(os.path.join(st.env_dir, envs.STAMP), "w") as f:
        f.write("{ not json")
    s = bulkhead.env_status(c)
    assert s.state == "broken" and "no readable bulkhead-stamp.json" in s.reason

    os.unlink(os.path.join(st.env_dir, envs.STAMP))
    assert bulkhead.env_status(c).state == "broken"
    r = cli("env", pack)
    assert r.returncode == 1 and "pack: broken" in r.stdout

    # a sibling built for another protocol (its hash differs too) is foreign
    [st] = bulkhead.install(pack, progress=lambda l: None)
    sib = st.env_dir[:-12] + "f" * 12
    os.rename(st.env_dir, sib)
    with open(os.path.join(sib, envs.STAMP)) as f:
        s = json.load(f)
    s["protocol"] += 1
    with open(os.path.join(sib, envs.STAMP), "w") as f:
        json.dump(s, f)
    s = bulkhead.env_status(c)
    assert s.state == "foreign" and sib in s.reason

    # install repairs it, and --force rebuilds a ready one
    [st] = bulkhead.install(pack, progress=lambda l: None)
    assert st.ok and not os.path.exists(sib)
    created = envs.read_stamp(st.env_dir)["created_unix"]
    r = cli("install", pack, "--force")
    assert r.returncode == 0, r.stderr
    assert envs.read_stamp(st.env_dir)["created_unix"] != created
    assert bulkhead.env_status(c).ok
    assert [x for x in env_entries(home) if ".tmp-" in x or ".old-" in x] == []


def test_killed_install_leaves_no_env(tmp_path, home, offline):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo"]\n')
    envdir = os.path.join(home, "envs")
    p = subprocess.Popen([sys.executable, "-m", "bulkhead", "install", pack], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # killed once its temporary environment has an interpreter (well
        # into the build, before its requirements are in): not after a fixed
        # sleep, which a fast uv could outrun
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            tmp = [n for n in os.listdir(envdir) if ".tmp-" in n] if os.path.isdir(envdir) else []
            if tmp and os.path.exists(os.path.join(envdir, tmp[0], "bin", "python")):
                break
            time.sleep(0.002)
        assert p.poll() is None, "the install finished before it could be killed"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    left = env_entries(home)
    assert any(".tmp-" in n for n in left)            # its temporary directory...
    c = only_config(pack)
    assert not os.path.exists(envs.env_dir(c))         # ...but nothing that looks built
    assert bulkhead.env_status(c).state == "missing"
    # the next install clears the remains and builds it
    [st] = bulkhead.install(pack, progress=lambda l: None)
    assert st.ok
    assert [n for n in env_entries(home) if ".tmp-" in n] == []


def test_concurrent_installs_build_once(tmp_path, home, offline):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo"]\n')
    procs = [subprocess.Popen([sys.executable, "-m", "bulkhead", "install", pack], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    errs = [e for _, e in outs]
    assert sum("pack: building " in e for e in errs) == 1, errs
    assert sum(": ready: " in e for e in errs) == 1, errs
    assert bulkhead.env_status(only_config(pack)).ok
    assert [n for n in env_entries(home) if ".tmp-" in n] == []


# --- entry points ---

def test_cli_usage_and_exit_codes(tmp_path):
    for args in ([], ["frobnicate"], ["install"], ["env"], ["install", "a", "b"]):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "usage: python -m bulkhead" in r.stderr
    r = cli("--help")
    assert r.returncode == 0 and "install" in r.stdout and "env" in r.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("env", str(empty))
    assert r.returncode == 1 and "no comfy-env.toml" in r.stderr
    r = cli("install", str(empty))
    assert r.returncode == 1 and "no comfy-env.toml" in r.stderr and "does not ask for isolation" in r.stderr
    r = cli("install", str(tmp_path / "nope"))
    assert r.returncode == 1 and "does not exist" in r.stderr
    bad = make_pack(tmp_path, 'python = "3.12"\nrequirments = ["numpy"]\n', name="bad")
    r = cli("env", bad)
    assert r.returncode == 1 and f"{bad}/comfy-env.toml:2: unknown key 'requirments' (did you mean " \
        "'requirements'?)" in r.stderr, r.stderr


def test_install_api_errors_and_warnings(tmp_path):
    with pytest.raises(bulkhead.PackConfigError, match="does not ask for isolation"):
        bulkhead.install(tmp_path)
    pack = make_pack(tmp_path, 'python = "3.99"\n[apt]\npackages = ["x"]\n')
    lines = []
    with pytest.raises(InterpreterNotFound):
        bulkhead.install(pack, progress=lines.append)
    assert lines[0].startswith(f"warning: {pack}/comfy-env.toml:2: table [apt] is not implemented")
    assert issubclass(InterpreterNotFound, bulkhead.EnvBuildError)


# --- the real thing: two conflicting packs from PyPI, two interpreters ---

def _pyenv_minor(mm):
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    try:
        return any(re.fullmatch(re.escape(mm) + r"\.\d+", n) for n in os.listdir(os.path.join(root, "versions")))
    except OSError:
        return False


def test_conflicting_packs_from_pypi(tmp_path, monkeypatch):
    """numpy<2 under Python 3.11 in one pack, numpy>=2 under 3.12 in the
    other, both from PyPI, a worker in each.  The workspace is
    build/test-envs, so the environments (keyed by config hash) are built
    once and reused by later runs."""
    if os.environ.get("BULKHEAD_TEST_OFFLINE") == "1":
        pytest.skip("BULKHEAD_TEST_OFFLINE=1: no PyPI")
    if os.environ.get("BULKHEAD_ASAN"):
        pytest.skip("pip and PyPI under the ASan pass add nothing the normal pass did not check")
    if not (_pyenv_minor("3.11") and _pyenv_minor("3.12")):
        pytest.skip("needs pyenv CPython 3.11 and 3.12")
    monkeypatch.setenv("BULKHEAD_HOME", os.path.abspath(TEST_ENVS))
    old = make_pack(tmp_path, """
        python = "3.11"
        [pypi-dependencies]
        numpy = "<2"
        [env_vars]
        BH_WHICH = "old numpy"
    """, name="bh-numpy1")
    # The host's torch has no build for 3.12 here: that pack opts out of
    # the host's set (test_hostmatch.py builds under another minor).
    new = make_pack(tmp_path, """
        python = "3.12"
        [pypi-dependencies]
        numpy = ">=2"
        [env_vars]
        BH_WHICH = "new numpy"
        [bulkhead]
        host_packages = "none"
    """, name="bh-numpy2")
    got = {}
    for pack in (old, new):
        [st] = bulkhead.install(pack)
        c = only_config(pack)
        assert st.ok
        w = bulkhead.Worker(st.python, name=c.name, env=dict(c.env_vars, PYTHONPATH=HELPERS))
        try:
            got[c.name] = (w.call("bh_testmod:version"), w.call("bh_testmod:numpy_version"),
                           w.call("os:getenv", "BH_WHICH"))
        finally:
            w.close()
    (py1, np1, which1), (py2, np2, which2) = got["bh-numpy1"], got["bh-numpy2"]
    assert py1.startswith("3.11.") and py2.startswith("3.12."), got
    assert np1.startswith("1.") and int(np2.split(".")[0]) >= 2, got
    assert (which1, which2) == ("old numpy", "new numpy")


def test_a_rebuild_while_a_worker_runs_leaves_it_its_environment(tmp_path, home, offline, caplog):
    # `bulkhead install` after the pack's config changed (a new environment
    # directory) while ComfyUI's worker runs on the old one: the old one
    # stays while that worker runs, and its next generation starts in the
    # new one (the host's PackRuntime resolves the interpreter as here).
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo==1.0"]\n')
    [old] = bulkhead.install(pack, progress=lambda l: None)
    w = bulkhead.Worker(old.python, name="pack")
    w.resolve_python = envs.current_python
    try:
        assert w.call("bhdemo:value") == "from a local wheel"
        pid = w.pid
        make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo>=1.0"]\n')
        r = cli("install", pack)
        assert r.returncode == 0, r.stderr
        new = bulkhead.env_status(only_config(pack))
        assert new.ok and new.env_dir != old.env_dir
        assert f"keeping {old.env_dir}: worker pid(s) {pid} run on it" in r.stderr
        assert "a restart picks up " + new.env_dir in r.stderr
        assert os.path.isdir(old.env_dir) and w.call("sys:prefix.__str__") == old.env_dir
        w.kill()
        time.sleep(0.2)
        with caplog.at_level("WARNING", logger="bulkhead"):
            assert w.call("bhdemo:value") == "from a local wheel"
        assert w.pid != pid and w.call("sys:prefix.__str__") == new.env_dir
        assert f"its environment was rebuilt; generation 2 runs {new.python}" in caplog.text
        r = cli("install", pack, "--force")   # nothing runs on the old one now: it goes
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(old.env_dir)
    finally:
        w.close()


def test_a_rebuild_keeps_the_environment_of_a_worker_another_s_zygote_forked(tmp_path, home, offline):
    """#37: the worker on pack A's environment was forked by a zygote
    another environment of the same Python started (its argv[0] names that
    one's interpreter): a rebuild of A after its config changed still sees
    it (its in-use lock, envlock) and keeps A's old environment for it
    (the argv scan alone missed it, and the rebuild removed the
    environment under it)."""
    from bulkhead.envs import build
    other = make_pack(tmp_path / "o", f'python = "{HOST_MM}"\n', name="other")
    [o] = bulkhead.install(other, progress=lambda l: None)
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo==1.0"]\n')
    [old] = bulkhead.install(pack, progress=lambda l: None)
    first = bulkhead.Worker(o.python, name="other")
    w = bulkhead.Worker(old.python, name="pack")
    for x in (first, w):
        x.zygote_preload = ["multiprocessing"]
    try:
        first.call("os:getpid")                   # the zygote starts with the other environment's python
        assert w.call("bhdemo:value") == "from a local wheel"
        assert w.call("sys:prefix.__str__") == old.env_dir
        with open(f"/proc/{w.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[0].decode().startswith(o.env_dir)    # not under its own environment
        assert w.pid in build.users(old.env_dir)    # (and in the other's, by its argv: kept there too, safely)
        make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo>=1.0"]\n')
        r = cli("install", pack)
        assert r.returncode == 0, r.stderr
        assert f"keeping {old.env_dir}: worker pid(s) {w.pid} run on it" in r.stderr, r.stderr
        assert os.path.isdir(old.env_dir) and w.call("bhdemo:value") == "from a local wheel"
    finally:
        w.close()
        first.close()


def test_one_failed_config_does_not_stop_the_others(tmp_path, wheels):
    """bulkhead.install (comfy_env.install, `bulkhead install`) builds every
    config of the pack though one fails, then says which failed, in one
    line each, and raises the failure."""
    pack = tmp_path / "two"
    for sub, req in (("a_bad", "bh-nowhere-to-be-found"), ("b_good", "bhdemo")):
        os.makedirs(pack / "nodes" / sub)
        (pack / "nodes" / sub / "comfy-env.toml").write_text(f'python = "{HOST_MM}"\nrequirements = ["{req}"]\n'
                                                             "[bulkhead]\nhost_packages = \"none\"\n")
    lines = []
    with pytest.raises(EnvBuildError) as ei:
        bulkhead.install(str(pack), progress=lines.append, pip_args=["--no-index", "--find-links", wheels])
    assert "bh-nowhere-to-be-found" in str(ei.value)
    verdicts = [l for l in lines if ": FAILED, no environment was made" in l]
    assert len(verdicts) == 1 and verdicts[0].startswith("two.a_bad: FAILED") and "bulkhead install" in verdicts[0]
    assert "bh-nowhere-to-be-found" in verdicts[0], verdicts[0]     # pip's reason, not only "exit status 1"
    good, bad = (packconfig.load(str(pack / "nodes" / s / "comfy-env.toml"), warn=False) for s in ("b_good", "a_bad"))
    assert bulkhead.env_status(good).ok and bulkhead.env_status(bad).state == "missing"


def test_the_stamp_keeps_no_credentials_and_only_its_user_reads_it(tmp_path, wheels):
    """An index URL with a token in BULKHEAD_PIP_ARGS (served here by a
    local HTTP server that ignores it) builds the environment; the stamp
    records the URL with ****@ in place of the token, mode 0600."""
    import functools
    import http.server
    import threading
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=wheels)
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://alice:s3cr3t-token@127.0.0.1:{srv.server_port}/"
        pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo"]\n'
                                   '[bulkhead]\nhost_packages = "none"\n')
        [st] = bulkhead.install(pack, progress=lambda l: None, pip_args=["--no-index", "--find-links", url])
    finally:
        srv.shutdown()
        srv.server_close()
    path = os.path.join(st.env_dir, envs.STAMP)
    with open(path) as f:
        text = f.read()
    assert "s3cr3t-token" not in text and "alice" not in text, text
    assert f"http://****@127.0.0.1:{srv.server_port}/" in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert bulkhead.env_status(only_config(pack)).ok
    assert envs.redact({"a": ["https://u:p@h/x", "pkg @ https://tok@h/p.whl"], "b": 3}) == \
        {"a": ["https://****@h/x", "pkg @ https://****@h/p.whl"], "b": 3}


def test_a_start_does_not_wait_long_on_another_installs_lock(tmp_path, wheels, monkeypatch):
    """Another install holds the environment's lock (stuck, say): a build
    with a bound gives up after it (EnvBusy, naming the lock), tries
    nothing and remembers no failure; ComfyUI's start uses that bound
    (host.pack.START_LOCK_WAIT_S) and reports the pack not built."""
    import fcntl
    from bulkhead.host import pack as hpack
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["bhdemo"]\n[bulkhead]\nhost_packages = "none"\n')
    c = only_config(pack)
    envdir = os.path.join(envs.workspace(), "envs")
    os.makedirs(envdir, exist_ok=True)
    lock = os.path.join(envdir, f".{os.path.basename(envs.env_dir(c))}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(envs.EnvBusy) as ei:
            envs.build(c, progress=lambda l: None, pip_args=["--no-index", "--find-links", wheels], lock_timeout_s=0.5)
        assert lock in str(ei.value) and "bulkhead install" in str(ei.value)
        assert envs.failed_before(c) is None
        monkeypatch.setattr(hpack, "START_LOCK_WAIT_S", 0.5)
        st = hpack.build_at_start(c, envs.env_status(c))
        assert not st.ok and "held its lock" in st.reason, st.reason
        assert envs.failed_before(c) is None
    finally:
        os.close(fd)
    monkeypatch.setenv("BULKHEAD_PIP_ARGS", f"--no-index --find-links {wheels}")
    assert hpack.build_at_start(c, envs.env_status(c)).ok      # the lock gone, the start builds it
