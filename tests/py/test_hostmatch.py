"""Pack environments matched to the host (envs/hostmatch.py): a pack with no
requirements gets the host's torch (shared read-only) and every requirement
of ComfyUI's requirements.txt, and its worker runs comfy.utils and torch
under tests/comfyui; a torch pin the host's torch does not satisfy is
refused; another pin wins and is reported; an upgraded host's torch marks
the environment stale; another minor installs the host's versions
(planned; the host's torch build from a local index; where it is nowhere,
built without it with one warning, and a pack that never imports torch
runs isolated)."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import bulkhead
from bulkhead.envs import build as envs, hostmatch
from bulkhead.envs.build import EnvBuildError
from bulkhead.envs.errors import InterpreterNotFound
from comfyenv import STUB_ROOT, run_comfy_script
from test_envs import HOST_MM, cli, make_pack, make_wheel, only_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
HOST_TORCH = importlib.metadata.version("torch")
HOST_PSUTIL = importlib.metadata.version("psutil")
try:    # the host's comfy-kitchen pin, which imports torch without requiring it (hostmatch.TORCH_ONLY)
    KITCHEN = [f"comfy-kitchen=={importlib.metadata.version('comfy-kitchen')}"]
except importlib.metadata.PackageNotFoundError:
    KITCHEN = []


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("BULKHEAD_HOME", str(h))
    monkeypatch.delenv("BULKHEAD_PIP_ARGS", raising=False)
    monkeypatch.delenv("BULKHEAD_INSTALLER", raising=False)
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    return h


def env_run(python, code):
    return subprocess.run([python, "-I", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=True).stdout.strip()


NODES = '''
import os, sys


class UsesComfy:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self, n):
        import json
        import comfy.utils
        import comfy.model_management as mm
        import psutil
        import torch
        bar = comfy.utils.ProgressBar(n)
        t = torch.arange(n, dtype=torch.float32)
        bar.update(n)
        return (json.dumps({"sum": float(t.sum()), "torch": torch.__version__, "torch_file": torch.__file__,
                            "psutil_file": psutil.__file__, "prefix": sys.prefix,
                            "device": str(mm.get_torch_device())}),)


NODE_CLASS_MAPPINGS = {"UsesComfy": UsesComfy}
'''


def test_a_pack_without_requirements_runs_comfy_and_torch(tmp_path, home, monkeypatch):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\n', name="bare")
    with open(os.path.join(pack, "nodes.py"), "w") as f:
        f.write(NODES)
    monkeypatch.setenv("COMFYUI_PATH", STUB_ROOT)
    lines = []
    # offline: nothing may need a download (the host's set is shared)
    [st] = bulkhead.install(pack, progress=lines.append, pip_args=["--no-index"])
    assert st.ok, st
    s = envs.read_stamp(st.env_dir)["host"]
    assert s["torch"] == HOST_TORCH and s["comfyui"] == os.path.realpath(STUB_ROOT)
    assert s["shared"]["torch"] == HOST_TORCH and s["shared"]["psutil"] == HOST_PSUTIL
    assert "comfy-aimdo" in s["shared"] and "sympy" in s["shared"]       # ALWAYS, torch's own
    assert s["installed"] == [] and s["pack_wins"] == []
    assert any(l.startswith("sharing the host's torch " + HOST_TORCH) for l in lines), lines
    farm = s["farm"]
    assert os.path.isdir(farm) and not farm.startswith(st.env_dir + os.sep)
    # what an in-process pack sees: every requirement of ComfyUI's requirements.txt (aiohttp,
    # which server.py imports and comfy does not) -- and only those: not pytest, nor bulkhead
    out = env_run(st.python, "import importlib.util as u, torch, psutil, aiohttp; print(torch.__version__, "
                             "torch.__file__, aiohttp.__file__, [u.find_spec(m) is None for m in ('pytest', "
                             "'bulkhead')])")
    version, where, aio, absent = out.split(" ", 3)
    assert version == HOST_TORCH and where.startswith(farm + os.sep) and aio.startswith(farm + os.sep)
    assert absent == "[True, True]"
    assert bulkhead.env_status(only_config(pack)).ok
    # its worker, in a ComfyUI-shaped host: comfy.utils, comfy.model_management and torch
    r = run_comfy_script(textwrap.dedent(f"""
        from bulkhead.host import nodes
        m, _ = nodes.load_pack({pack!r}, {st.python!r})
        out = json.loads(m["UsesComfy"]().go(n=4)[0])
        nodes.close_all()
        emit(out)
    """), env={"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(home)}, timeout=240)
    assert r["sum"] == 6.0 and r["torch"] == HOST_TORCH and r["device"] == "cpu"
    assert r["torch_file"].startswith(farm + os.sep) and r["psutil_file"].startswith(farm + os.sep)
    assert r["prefix"] == st.env_dir


def test_a_torch_pin_other_than_the_hosts_is_refused(tmp_path, home):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["torch<2"]\n')
    with pytest.raises(bulkhead.PackConfigError) as ei:
        bulkhead.install(pack, progress=lambda l: None)
    msg = str(ei.value)
    assert msg.startswith(f"{pack}/comfy-env.toml: ") and "'torch<2'" in msg
    assert f"the host's torch {HOST_TORCH}" in msg and "CUDA IPC" in msg
    assert [e for e in os.listdir(home / "envs") if not e.endswith(".lock")] == []
    # a pin the host's torch satisfies is no conflict
    make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["torch>=2"]\n')
    [st] = bulkhead.install(pack, progress=lambda l: None, pip_args=["--no-index"])
    assert st.ok and envs.read_stamp(st.env_dir)["host"]["shared"]["torch"] == HOST_TORCH


def test_another_pin_wins_and_is_reported(tmp_path, home, monkeypatch):
    wheels = str(tmp_path / "wheels")
    os.makedirs(wheels)
    make_wheel(wheels, "psutil", "0.1", {"psutil/__init__.py": "__version__ = '0.1'\n"})
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["psutil==0.1"]\n')
    monkeypatch.setenv("COMFYUI_PATH", STUB_ROOT)
    lines = []
    [st] = bulkhead.install(pack, progress=lines.append, pip_args=["--no-index", "--find-links", wheels])
    won = [l for l in lines if "wins over" in l]
    assert won == [f"psutil: the pack's psutil==0.1 wins over the host's psutil {HOST_PSUTIL}"], lines
    s = envs.read_stamp(st.env_dir)["host"]
    assert "psutil" not in s["shared"] and s["shared"]["torch"] == HOST_TORCH
    assert s["pack_wins"] == [["psutil", "psutil==0.1", HOST_PSUTIL]]
    assert env_run(st.python, "import psutil, torch; print(psutil.__version__, torch.__version__)") \
        == f"0.1 {HOST_TORCH}"


def test_an_upgraded_host_torch_makes_it_stale(tmp_path, home, monkeypatch):
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\n')
    [st] = bulkhead.install(pack, progress=lambda l: None, pip_args=["--no-index"])
    c = only_config(pack)
    assert bulkhead.env_status(c).ok
    # the host now has another torch first on its path: a distribution's
    # metadata is what the host's torch is read from
    newer = tmp_path / "newer-host"
    info = newer / "torch-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    monkeypatch.syspath_prepend(str(newer))
    s = bulkhead.env_status(c)
    assert s.state == "stale" and not s.ok
    assert s.reason == f"the host's torch changed from {HOST_TORCH} to 9.9.9; run `bulkhead install {pack}`"
    assert f"bulkhead install {pack}" in s.fix
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(newer), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "bulkhead", "env", pack], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=120)
    assert r.returncode == 1 and "pack: stale" in r.stdout
    assert f"the host's torch changed from {HOST_TORCH} to 9.9.9; run `bulkhead install {pack}`" in r.stdout
    monkeypatch.syspath_prepend(str(tmp_path / "nothing"))
    sys.path.remove(str(newer))
    assert bulkhead.env_status(c).ok
    # the host ComfyUI's requirements.txt changing does too
    base = tmp_path / "ComfyUI"
    (base / "comfy").mkdir(parents=True)
    (base / "requirements.txt").write_text("torch\n")
    monkeypatch.setenv("COMFYUI_PATH", str(base))
    # built without a ComfyUI, it is not held against one found now (its torch matches)
    assert bulkhead.env_status(c).ok
    [st] = bulkhead.install(pack, force=True, progress=lambda l: None, pip_args=["--no-index"])
    assert st.ok and envs.read_stamp(st.env_dir)["host"]["comfyui"] == str(base)
    (base / "requirements.txt").write_text("torch\npsutil\n")
    s = bulkhead.env_status(c)
    assert s.state == "stale" and f"the host ComfyUI's requirements.txt ({base}/requirements.txt) changed" in s.reason
    # a stamp from before host matching is stale too
    stamp = envs.read_stamp(st.env_dir)
    del stamp["host"]
    envs._write_stamp(st.env_dir, stamp)
    s = bulkhead.env_status(c)
    assert s.state == "stale" and "built before bulkhead matched environments to the host" in s.reason


def test_a_start_rebuilds_an_environment_stale_only_because_the_host_changed(tmp_path, home, monkeypatch,
                                                                                caplog):
    """#24 M5: the host ComfyUI's requirements changed (an upgrade) and
    nothing of the pack's did: ComfyUI's start rebuilds the environment,
    as it builds a missing one (main left it stale, and the pack ran
    in-process).  One stale because its own config changed is left to
    `bulkhead install`."""
    import logging
    from bulkhead.host import pack as hpack
    monkeypatch.setenv("BULKHEAD_PIP_ARGS", "--no-index")
    base = tmp_path / "ComfyUI"
    (base / "comfy").mkdir(parents=True)
    (base / "requirements.txt").write_text("torch\n")
    monkeypatch.setenv("COMFYUI_PATH", str(base))
    pack = make_pack(tmp_path, f'python = "{HOST_MM}"\n')
    [st] = bulkhead.install(pack, progress=lambda l: None)
    c = only_config(pack)
    (base / "requirements.txt").write_text("torch\npsutil\n")
    s = bulkhead.env_status(c)
    assert s.state == "stale" and s.host_changed
    with caplog.at_level(logging.INFO, logger="bulkhead"):
        after = hpack.build_at_start(c, s)
    assert after.ok and bulkhead.env_status(c).ok, after
    assert "stale because the host changed (the host ComfyUI's requirements.txt" in caplog.text, caplog.text
    # the pack's own config changed: stale, not the host's doing, not rebuilt at start
    with open(c.path, "a") as f:
        f.write('[pypi-dependencies]\nedited-requirement = "*"\n')
    c = only_config(pack)
    s = bulkhead.env_status(c)
    assert s.state == "stale" and not s.host_changed
    assert hpack.build_at_start(c, s) is s


OTHER_MM = "3.12" if HOST_MM != "3.12" else "3.11"

NUMPY_NODES = '''
import sys


class NoTorch:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self, n):
        import json
        import importlib.util
        import numpy
        return (json.dumps({"sum": int(numpy.arange(n).sum()), "python": "%d.%d" % sys.version_info[:2],
                            "torch": importlib.util.find_spec("torch") is not None, "prefix": sys.prefix}),)


NODE_CLASS_MAPPINGS = {"NoTorch": NoTorch}
'''


TENSOR_NODE = '''

class Shade:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "go"

    def go(self, image):
        return (image,)


NODE_CLASS_MAPPINGS["Shade"] = Shade
'''


def test_a_distribution_installed_into_the_host_between_two_builds_is_seen(tmp_path, home, monkeypatch):
    """#36: a build reads the host's distributions once per process (its
    plan and farm run in ComfyUI's process, one GIL), and again once a
    directory on the host's path changed: bhlate, which ComfyUI's
    requirements.txt lists, installed by pip into a host site directory
    between two builds in this process is shared with the second build,
    whose Python imports it, as an in-process pack would."""
    site = tmp_path / "site"
    site.mkdir()
    # a site directory as a host's is: written long before these builds
    # (one written within the last seconds is read again on every call)
    past = time.time() - 3600
    os.utime(site, (past, past))
    monkeypatch.syspath_prepend(str(site))
    # kept whatever else on sys.path was written just now (the build tree): what follows tests the key
    monkeypatch.setattr(hostmatch, "_RACY_S", -1e9)
    comfy = tmp_path / "comfyui"
    shutil.copytree(STUB_ROOT, comfy, symlinks=True)
    with open(comfy / "requirements.txt", "a") as f:
        f.write("bhlate\n")
    monkeypatch.setenv("COMFYUI_PATH", str(comfy))
    first = make_pack(tmp_path, f'python = "{HOST_MM}"\n', name="first")
    lines = []
    [st] = bulkhead.install(first, progress=lines.append, pip_args=["--no-index"])
    assert st.ok and "bhlate" not in envs.read_stamp(st.env_dir)["host"]["shared"]
    assert any("the host has no bhlate installed" in l for l in lines), lines
    assert hostmatch._host() is hostmatch._host()      # the read is kept
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(str(wheels), "bhlate", "1.0", {"bhlate/__init__.py": "V = '1.0'\n"})
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", str(wheels), "--target", str(site), "bhlate"], check=True)
    second = make_pack(tmp_path, f'python = "{HOST_MM}"\n', name="second")
    [st] = bulkhead.install(second, progress=lambda l: None, pip_args=["--no-index"])
    s = envs.read_stamp(st.env_dir)["host"]
    assert st.ok and s["shared"].get("bhlate") == "1.0", s
    assert env_run(st.python, "import bhlate; print(bhlate.V, bhlate.__file__)") == \
        f"1.0 {os.path.join(s['farm'], 'bhlate', '__init__.py')}"


def test_a_distribution_made_within_the_mtime_of_the_last_read_is_seen(tmp_path, monkeypatch):
    """#36: a read of the host's distributions is not kept while a
    directory on the host's path was modified within seconds of it (one
    mtime tick may cover a write made after the read): bhtick made in a
    site directory that then shows the very mtime it had at the first
    plan (a write within the same tick) is in the second plan."""
    site = tmp_path / "site"
    site.mkdir()
    # its mtime set ahead: the first read is within seconds of it however slow this machine is
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(site, ns=(ahead, ahead))
    monkeypatch.syspath_prepend(str(site))
    comfy = tmp_path / "comfyui"
    shutil.copytree(STUB_ROOT, comfy, symlinks=True)
    with open(comfy / "requirements.txt", "a") as f:
        f.write("bhtick\n")
    c = only_config(make_pack(tmp_path, f'python = "{HOST_MM}"\n'))
    version = "%d.%d.%d" % sys.version_info[:3]
    assert "bhtick" not in hostmatch.plan(c, version, str(comfy)).share
    info = site / "bhtick-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bhtick\nVersion: 1.0\n")
    (info / "RECORD").write_text("bhtick-1.0.dist-info/METADATA,,\n")
    os.utime(site, ns=(ahead, ahead))
    assert "bhtick" in hostmatch.plan(c, version, str(comfy)).share


def _du(path, follow=False):
    """Bytes on disk of the files under path, each once; through symlinks
    when follow."""
    seen, total = set(), 0
    for dp, _, fns in os.walk(path, followlinks=follow):
        for n in fns:
            try:
                st = os.stat(os.path.join(dp, n)) if follow else os.lstat(os.path.join(dp, n))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _other_minor():
    try:
        envs.find_interpreter(OTHER_MM)
    except InterpreterNotFound:
        pytest.skip(f"no Python {OTHER_MM} here to build under")


def test_another_minor_plans_the_hosts_versions(tmp_path, home, monkeypatch):
    pack = make_pack(tmp_path, f'python = "{OTHER_MM}"\nrequirements = ["bhdemo"]\n')
    c = only_config(pack)
    p = hostmatch.plan(c, OTHER_MM + ".1", os.path.realpath(STUB_ROOT))
    assert p.share == [] and p.install[0] == f"torch=={HOST_TORCH}"
    assert f"psutil=={HOST_PSUTIL}" in p.install and p.constraints == [f"torch=={HOST_TORCH}"]
    assert any(r.lower().startswith("aiohttp==") for r in p.install)       # requirements.txt lists it
    local = HOST_TORCH.partition("+")[2]
    if local:       # a local build: looked for where it came from, then where pip looks
        where = [w for _, w in p.sources[f"torch=={HOST_TORCH}"]]
        assert where[-1] == "BULKHEAD_PIP_ARGS and pip's configuration"
        assert where[0] == f"the PyTorch index for +{local} builds (https://download.pytorch.org/whl/{local})"
        monkeypatch.setenv("BULKHEAD_TORCH_INDEX", str(tmp_path / "idx-{local}"))
        p = hostmatch.plan(c, OTHER_MM + ".1", os.path.realpath(STUB_ROOT))
        [(args, w), *_] = p.sources[f"torch=={HOST_TORCH}"]
        assert args == ["--extra-index-url", str(tmp_path / f"idx-{local}")] and w.startswith("BULKHEAD_TORCH_INDEX")
    assert f"torch=={HOST_TORCH}" in p.needing(["torch"]) and f"psutil=={HOST_PSUTIL}" not in p.needing(["torch"])


def test_another_minor_leaves_out_what_only_comfyuis_server_uses(tmp_path, home, monkeypatch):
    """#36: ComfyUI's web assets (the frontend, the templates: ~140 MB) are
    installed under no other minor (a numpy-only pack under 3.12 was
    883 MB against 95 MB under 3.11); under the host's own minor they
    stay shared, links costing nothing.  A distribution of the host's
    (a .dist-info on sys.path) that ComfyUI's requirements.txt lists."""
    import importlib
    site = tmp_path / "site"
    info = site / "comfyui_frontend_package-1.27.10.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: comfyui-frontend-package\nVersion: 1.27.10\n")
    (info / "RECORD").write_text("comfyui_frontend_package/__init__.py,,\n")
    (site / "comfyui_frontend_package").mkdir()
    (site / "comfyui_frontend_package" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    comfy = tmp_path / "comfyui"
    shutil.copytree(STUB_ROOT, comfy, symlinks=True)
    with open(comfy / "requirements.txt", "a") as f:
        f.write("comfyui-frontend-package==1.27.10\n")
    pack = make_pack(tmp_path, f'python = "{OTHER_MM}"\nrequirements = ["bhdemo"]\n')
    c = only_config(pack)
    other = hostmatch.plan(c, OTHER_MM + ".1", str(comfy))
    assert not any(r.lower().startswith("comfyui-frontend-package") for r in other.install), other.install
    assert any(r.lower().startswith("aiohttp==") for r in other.install)
    assert any("not installed: comfyui-frontend-package (ComfyUI's server alone uses it" in n for n in other.notes)
    same = hostmatch.plan(c, "%d.%d.0" % sys.version_info[:2], str(comfy))
    assert "comfyui-frontend-package" in same.share


def test_another_minor_gets_the_hosts_torch_from_a_local_index(tmp_path, home, monkeypatch):
    """The host's torch build lies on a local index only (a directory of
    wheels named by BULKHEAD_TORCH_INDEX): the environment gets it from
    there.  (A stand-in wheel of the host's exact version: no real torch
    build for another minor can be had here.)"""
    _other_minor()
    index = tmp_path / "torch-index"
    index.mkdir()
    make_wheel(str(index), "torch", HOST_TORCH, {"torch/__init__.py": f"__version__ = {HOST_TORCH!r}\n"})
    wheels = str(tmp_path / "wheels")
    os.makedirs(wheels)
    make_wheel(wheels, "bhdemo", "1.0", {"bhdemo/__init__.py": ""})
    monkeypatch.setenv("BULKHEAD_TORCH_INDEX", str(index))
    monkeypatch.setenv("COMFYUI_PATH", STUB_ROOT)
    pack = make_pack(tmp_path, f'python = "{OTHER_MM}"\nrequirements = ["bhdemo"]\n')
    lines = []
    [st] = bulkhead.install(pack, progress=lines.append, pip_args=["--find-links", wheels])
    assert st.ok, st
    assert not any("lacks the host's" in l for l in lines), [l for l in lines if "lacks" in l]
    assert any(l.startswith(f"installing the host's build torch=={HOST_TORCH} (looking in BULKHEAD_TORCH_INDEX")
               for l in lines), lines
    s = envs.read_stamp(st.env_dir)["host"]
    assert s["lacking"] == {} and f"torch=={HOST_TORCH}" in s["installed"]
    assert env_run(st.python, "import importlib.metadata as m, aiohttp, psutil; print(m.version('torch'), "
                              "psutil.__version__)") == f"{HOST_TORCH} {HOST_PSUTIL}"


def test_another_minor_without_the_hosts_torch_runs_isolated(tmp_path, home, monkeypatch):
    """No build of the host's torch for that minor anywhere pip looks: the
    environment is built without it, one warning says what the worker
    lacks, and a pack that never imports torch runs in its worker."""
    _other_minor()
    monkeypatch.setenv("BULKHEAD_TORCH_INDEX", "none")
    monkeypatch.setenv("COMFYUI_PATH", STUB_ROOT)
    pack = make_pack(tmp_path, f'python = "{OTHER_MM}"\nrequirements = ["numpy"]\n', name="notorch")
    with open(os.path.join(pack, "nodes.py"), "w") as f:
        f.write(NUMPY_NODES + TENSOR_NODE)
    lines = []
    [st] = bulkhead.install(pack, progress=lines.append)
    assert st.ok, st
    warned = [l for l in lines if l.startswith("warning: this environment lacks")]   # not uv's own warnings
    assert len(warned) == 1, warned
    w = warned[0]
    assert f"lacks the host's torch {HOST_TORCH}" in w and "`import torch`" in w
    assert f"host's Python minor ({HOST_MM})" in w and "BULKHEAD_TORCH_INDEX" in w
    s = envs.read_stamp(st.env_dir)["host"]
    assert sorted(s["lacking"]) == sorted([f"torch=={HOST_TORCH}"] + KITCHEN), s["lacking"]
    assert bulkhead.env_status(only_config(pack)).ok
    # #36: what imports torch without declaring it (comfy-kitchen's kernels, ~190 MB) is left out with
    # it: a worker there cannot import it, as in-process it imports only with torch
    if KITCHEN:
        assert "it requires torch" in s["lacking"][KITCHEN[0]] and "comfy-kitchen" in w
        assert env_run(st.python, "import importlib.util as u; print(u.find_spec('comfy_kitchen'))") == "None"
    # #36's size target: this numpy-only environment (without torch: it has none) is at most 1.5x
    # what the same pack's worker sees under the host's minor (its environment and the host's files
    # it shares) less the host's torch.  (bench/env_size.py measures it against a real ComfyUI.)
    same = make_pack(tmp_path, f'python = "{HOST_MM}"\nrequirements = ["numpy"]\n', name="samenumpy")
    [st_same] = bulkhead.install(same, progress=lambda l: None, pip_args=["--no-index"])
    farm = envs.read_stamp(st_same.env_dir)["host"]["farm"]
    seen = _du(st_same.env_dir) + _du(farm, follow=True) - _du(os.path.join(farm, "torch"), follow=True)
    assert _du(st.env_dir) <= 1.5 * seen, (_du(st.env_dir), seen)
    r = run_comfy_script(textwrap.dedent(f"""
        import torch
        from bulkhead.host import nodes, states
        m, _ = nodes.load_pack({pack!r}, {st.python!r})
        out = json.loads(m["NoTorch"]().go(n=4)[0])
        [row] = [r for r in states.pack_states() if r["name"] == "notorch"]
        try:
            m["Shade"]().go(image=torch.zeros(1, 2, 2, 3))
            out["error"] = None
        except Exception as e:
            out["error"] = str(e)
        nodes.close_all()
        emit(dict(out, state=row["state"], warning=row.get("warning"), fix=row.get("fix")))
    """), env={"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(home)}, timeout=240)
    # #35: the pack is isolated, and says that its tensor node cannot run there, with the fix; that
    # node fails saying so (it was 'No module named torch' in bulkhead's decoder, and every surface
    # said "isolated")
    assert r.pop("state") == "isolated" and f"isolated without torch" in r["warning"] and "Shade" in r["warning"]
    assert "NoTorch" not in r.pop("warning") and "BULKHEAD_TORCH_INDEX" in r.pop("fix")
    assert "a torch tensor reached this worker" in r["error"] and "has no torch" in r.pop("error")
    assert r == {"sum": 6, "python": OTHER_MM, "torch": False, "prefix": st.env_dir}
    # a pack that needs torch itself fails to build, naming why
    make_pack(tmp_path, f'python = "{OTHER_MM}"\nrequirements = ["torch"]\n', name="needs")
    with pytest.raises(EnvBuildError) as ei:
        bulkhead.install(str(tmp_path / "needs"), progress=lambda l: None)
    assert "which this Python has no build of here" in str(ei.value)
    assert [e for e in os.listdir(home / "envs") if not e.endswith(".lock") and "needs" in e] == []
    r = cli("env", pack)
    assert r.returncode == 0 and "notorch: ready" in r.stdout


RESOLVED_NODE = '''
import json, sys


class Versions:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self):
        import bhgone
        import numpy
        return (json.dumps({"numpy": numpy.__version__, "sum": int(numpy.arange(4).sum()), "bhgone": bhgone.V,
                            "python": "%d.%d" % sys.version_info[:2]}),)


NODE_CLASS_MAPPINGS = {"Versions": Versions}
'''


def test_another_minor_resolves_the_host_versions_it_has_none_of(tmp_path, home, monkeypatch):
    """#36: a host's version that does not exist for the environment's
    minor is resolved for it, not left out: the host's numpy (its
    Requires-Python excludes 3.10: numpy 2.3 dropped 3.10) becomes the
    numpy pip resolves for 3.10 on its own; a host's version that no
    index has although nothing says so (bhgone 9.9, a distribution of the
    host's that only 1.0 of is published) is resolved when pip cannot
    install it alone.  Both said in the build log and the stamp, and the
    worker under 3.10 imports both, as an in-process pack does.  (PyPI.)"""
    old_mm = "3.10"
    try:
        old = envs.find_interpreter(old_mm)
    except InterpreterNotFound:
        pytest.skip(f"no Python {old_mm} here to build under")
    numpy_dist = importlib.metadata.distribution("numpy")
    from packaging.specifiers import SpecifierSet
    if SpecifierSet(numpy_dist.metadata["Requires-Python"] or "").contains(old.version):
        pytest.skip(f"the host's numpy {numpy_dist.version} runs under {old_mm}: nothing to resolve")
    # the real answer: what pip picks for numpy under that minor, with nothing of the host's
    report = subprocess.run([old.path, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--disable-pip-version-check", "--report", "-", "numpy"],
                            stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    [picked] = [i["metadata"]["version"] for i in __import__("json").loads(report)["install"]
                if i["metadata"]["name"] == "numpy"]
    # bhgone 9.9 is the host's (a .dist-info on sys.path) and ComfyUI's requirements.txt lists it
    site = tmp_path / "site"
    info = site / "bhgone-9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bhgone\nVersion: 9.9\n")
    (info / "RECORD").write_text("bhgone/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(str(wheels), "bhgone", "1.0", {"bhgone/__init__.py": "V = '1.0'\n"})
    comfy = tmp_path / "comfyui"
    shutil.copytree(STUB_ROOT, comfy, symlinks=True)
    with open(comfy / "requirements.txt", "a") as f:
        f.write("bhgone\n")
    monkeypatch.setenv("COMFYUI_PATH", str(comfy))
    monkeypatch.setenv("BULKHEAD_TORCH_INDEX", "none")      # no torch for it: not what this tests
    pack = make_pack(tmp_path, f'python = "{old_mm}"\n', name="oldminor")
    with open(os.path.join(pack, "nodes.py"), "w") as f:
        f.write(RESOLVED_NODE)
    lines = []
    [st] = bulkhead.install(pack, progress=lines.append, pip_args=["--find-links", str(wheels)])
    assert st.ok, st
    s = envs.read_stamp(st.env_dir)["host"]
    assert "numpy" in s["installed"] and s["resolved"]["numpy"] == picked, s
    assert s["resolved"]["bhgone"] == "1.0", s
    assert sorted(s["lacking"]) == sorted([f"torch=={HOST_TORCH}"] + KITCHEN), s
    said = [l for l in lines if l.startswith("resolved for this Python: ")]
    assert len(said) == 1, lines
    assert f"numpy {picked} (the host's {numpy_dist.version} requires Python " in said[0]
    assert "bhgone 1.0 (pip could not install the host's 9.9 here)" in said[0]
    assert any(f"the host's numpy {numpy_dist.version}" in l and f"do not run under Python {old_mm}" in l
               for l in lines), lines
    w = [l for l in lines if l.startswith("warning: this environment lacks")]
    assert len(w) == 1 and "numpy" not in w[0] and "bhgone" not in w[0], w
    r = run_comfy_script(textwrap.dedent(f"""
        from bulkhead.host import nodes
        m, _ = nodes.load_pack({pack!r}, {st.python!r})
        out = json.loads(m["Versions"]().go()[0])
        nodes.close_all()
        emit(out)
    """), env={"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(home),
               "COMFYUI_PATH": str(comfy)}, timeout=240)
    assert r == {"numpy": picked, "sum": 6, "bhgone": "1.0", "python": old_mm}
