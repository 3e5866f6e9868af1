"""comfy-env's packs as they are: their layouts (comfy-env-root.toml,
nodes/comfy-env.toml, nodes/<subdir>/comfy-env.toml, the old root file),
every key of their environment files honoured or refused by name, their
entry points (register_nodes, install, setup_env, copy_files,
register_serializer) served by bulkhead, and environments comfy-env built
in ~/.ce reused.  Fixture packs are written into tmp; their dependencies
come from local sources the tests make (a git repository, a directory, a
wheel file, a simple index) and, where cheap, PyPI."""

import os
import subprocess
import sys
import textwrap

import pytest

import bulkhead
from bulkhead.envs import build as envs, config as packconfig, rootconfig
from bulkhead.envs.config import PackConfigError
from localsources import PY_TAG, make_channel, make_cuda_index, make_sources, make_wheel, write

HOST_MM = "%d.%d" % sys.version_info[:2]

@pytest.fixture
def sources(tmp_path):
    """Local sources of every kind a [pypi-dependencies] entry names."""
    return make_sources(tmp_path)


@pytest.fixture
def channel(tmp_path):
    """A local conda channel (localsources.make_channel)."""
    pytest.importorskip("rattler.index", reason="py-rattler (make check-py installs it)")
    return make_channel(tmp_path)


@pytest.fixture
def cuda_index(tmp_path):
    """A CUDA-wheel index (localsources.make_cuda_index)."""
    return make_cuda_index(tmp_path)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    monkeypatch.delenv("COMFY_ENV_ROOT", raising=False)
    monkeypatch.delenv("BULKHEAD_PIP_ARGS", raising=False)
    monkeypatch.delenv("BULKHEAD_COMFY_ENV", raising=False)
    return tmp_path / "bh-home"


def other_platform():
    return "win-64" if packconfig.current_platform() != "win-64" else "linux-64"


FULL_ENV = '''
python = "{mm}"

[pypi-dependencies]
bhplain = "==1.0"
bhindexed = {{ version = ">=4", index = "{index}" }}
bhurl = {{ url = "file://{url}" }}
bhpath = {{ path = "../src/bhpath" }}

[pypi-dependencies.bhgit]
git = "file://{git}"
tag = "v1"

[target.{here}.pypi-dependencies]
bhplain = "*"

[target.{other}.pypi-dependencies]
bh-not-for-this-machine = "*"

[env_vars]
BH_INT = 3
BH_BOOL = true
BH_TEXT = "x"
'''


def full_env_text(s, tmp_path):
    return FULL_ENV.format(mm=HOST_MM, index=s["index"], url=s["url"], git=s["git"],
                           here=packconfig.current_platform(), other=other_platform())


def test_every_pypi_dependency_kind_builds_offline(tmp_path, sources):
    pack = tmp_path / "ComfyUI-Kinds"
    write(pack / "comfy-env-root.toml", '[node_packs]\nComfyUI-Other = "someone/ComfyUI-Other"\n')
    # ../src/bhpath is relative to the config's directory (nodes/)
    os.symlink(tmp_path / "src", pack / "src")
    write(pack / "nodes" / "comfy-env.toml", full_env_text(sources, tmp_path))
    [c] = packconfig.load_configs(pack, warn=False)
    assert c.name == "ComfyUI-Kinds" and c.platform == packconfig.current_platform()
    assert dict(c.env_vars) == {"BH_INT": "3", "BH_BOOL": "True", "BH_TEXT": "x"}
    assert "bh-not-for-this-machine" not in " ".join(c.requirements)
    assert "bhplain" in c.requirements           # the target's "*" wins over the top level's ==1.0
    assert c.indexes == ((sources["index"], ("bhindexed>=4",)),)
    lines = []
    [st] = bulkhead.install(str(pack), progress=lines.append,
                            pip_args=["--no-index", "--find-links", sources["wheels"]])
    assert st.ok, st
    out = subprocess.run([st.python, "-I", "-c", "import bhplain, bhindexed, bhurl, bhpath, bhgit; "
                          "print(bhplain.VALUE, bhindexed.VALUE, bhurl.VALUE, bhpath.VALUE, bhgit.VALUE, sep='|')"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    assert out == "plain|from the index|from a url|from a path|from git v1"
    assert any("[node_packs] names packs not installed" in l and "ComfyUI-Other" in l for l in lines), lines
    assert any(f"from its index {sources['index']}" in l for l in lines)


def test_a_failed_index_install_leaves_nothing(tmp_path, sources, home):
    pack = tmp_path / "p"
    write(pack / "nodes" / "comfy-env.toml", f'''
        python = "{HOST_MM}"
        [pypi-dependencies]
        bhmissing = {{ version = "*", index = "{sources['index']}" }}
    ''')
    with pytest.raises(bulkhead.EnvBuildError, match=r"from the index file://.*no environment was made"):
        bulkhead.install(str(pack), progress=lambda l: None,
                         pip_args=["--no-index", "--find-links", sources["wheels"]])
    envs_dir = home / "envs"
    assert [n for n in os.listdir(envs_dir) if not n.endswith(".lock")] == []


def load_text(tmp_path, text, name="comfy-env.toml"):
    p = write(tmp_path / "bad" / "nodes" / name, text)
    return packconfig.load(p, warn=False)


@pytest.mark.parametrize("text, line, expected", [
    ('[target.linux-65.pypi-dependencies]\nx = "*"\n', 1, "unknown platform 'linux-65'"),
    ('[target]\nlinux-64 = 3\n', 2, "target.linux-64 must be a table"),
    ('[target.win-64.pypi-dependencies]\nx = 3\n', 2, "a version spec string or a table"),
    ('[pypi-dependencies]\nx = { index = 3 }\n', 2, "pypi-dependencies.x.index must be a string"),
    ('[pypi-dependencies]\nx = { index = "ftp://a", version = "1" }\n', 2, "not an http(s):// or file:// URL"),
    ('[pypi-dependencies]\nx = { git = "g", index = "https://a" }\n', 2, "index cannot be combined with git"),
    ('[pypi-dependencies.u3]\ngit = "https://g"\nrev = "a"\nbranch = "b"\n', 1, "give one of rev, tag, branch"),
    ('[env_vars]\nA = [1, 2]\n', 2, "must be a string, not an array"),
    ('[apt]\npackages = 3\n', 2, "apt.packages must be an array of package names"),
    ('[brew]\npackages = [1]\n', 2, "brew.packages must be an array"),
    ('[cuda]\npackages = [3]\n', 2, "cuda.packages must be an array"),
    ('[dependencies]\nffmpeg = 6\n', 2, "dependencies.ffmpeg must be a version spec string or a table"),
    ('[workspace]\nchannels = "conda-forge"\n', 2, "workspace.channels must be an array"),
    ('[target.linux-64.dependencies]\nav = [1]\n', 2, "target.linux-64.dependencies.av must be"),
    ('python = 3.10\n', 1, 'reads 3.10 as 3.1; write the version as a string: python = "3.10"'),
    ('[a]\npython = "3.11"\n[b]\npython = "3.12"\n', 3, "bulkhead runs one environment per comfy-env.toml"),
])
def test_malformed_environment_files_name_file_and_line(tmp_path, text, line, expected):
    with pytest.raises(PackConfigError) as ei:
        load_text(tmp_path, text)
    e = ei.value
    assert expected in str(e) and e.line == line, str(e)
    assert str(e).startswith(f"{tmp_path}/bad/nodes/comfy-env.toml:{line}")


@pytest.mark.parametrize("text, line, expected", [
    ('[types]\nTRIMESH = "pickle"\n', 2, 'must be "custom"'),
    ('[node_packs]\nA = 3\n', 2, "node_packs.A must be a string"),
    ('[node_reqs]\nA = { tag = "v1" }\n', 2, "names no source"),
])
def test_malformed_root_files_name_file_and_line(tmp_path, text, line, expected):
    write(tmp_path / "p" / "comfy-env-root.toml", text)
    with pytest.raises(PackConfigError) as ei:
        rootconfig.load_root(tmp_path / "p")
    assert expected in str(ei.value) and ei.value.line == line, str(ei.value)
    assert str(ei.value).startswith(f"{tmp_path}/p/comfy-env-root.toml:{line}")


def test_other_pixi_tables_warn_once_each_naming_table_and_file(tmp_path):
    c = load_text(tmp_path, f'''
        python = "{HOST_MM}.*"
        [pypi-options]
        no-build-isolation = ["x"]
        [system-requirements]
        cuda = "12"
        [activation]
        env = {{ A = "1" }}
        [dependencies]
        ffmpeg = "*"
        [cuda]
        packages = ["nvdiffrast"]
        [workspace]
        channels = ["conda-forge"]
        [target.{packconfig.current_platform()}.activation]
        env = {{ B = "1" }}
        [target.{other_platform()}.activation]
        env = {{ C = "1" }}
    ''')
    assert c.python == HOST_MM
    tables = {}
    for w in c.warnings:
        t = w.split("table [", 1)[1].split("]", 1)[0]
        tables[t] = w
        assert w.startswith(f"{tmp_path}/bad/nodes/comfy-env.toml:")
    assert set(tables) == {"pypi-options", "system-requirements", "activation",
                           f"target.{packconfig.current_platform()}.activation"}
    assert "pip options" in tables["pypi-options"] and "NOT checked" in tables["system-requirements"]
    assert c.conda == ("ffmpeg",) and c.channels == ("conda-forge",) and c.cuda == ("nvdiffrast",)


def test_apt_is_checked_never_run(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("dpkg-query: Linux")
    bindir = tmp_path / "bin"
    log = tmp_path / "calls"
    # a dpkg-query that knows one package, and records what it was asked
    write(bindir / "dpkg-query", f'''
        #!/bin/sh
        echo "$@" >> {log}
        [ "$3" = "bh-present" ] && printf "install ok installed" && exit 0
        exit 1
    ''')
    os.chmod(bindir / "dpkg-query", 0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    out = rootconfig.check_system_packages({"apt": ("bh-present", "bh-absent")}, "X.toml")
    assert out == ["X.toml: [apt] packages not installed: bh-absent; bulkhead does not install system "
                   "packages: sudo apt-get install bh-absent"]
    assert open(log).read().split() == ["-W", "-f=${Status}", "bh-present", "-W", "-f=${Status}", "bh-absent"]


# --- the entry points, in a ComfyUI host (tests/comfyui or COMFYUI_PATH) ---

from comfyenv import run_comfy_script  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(REPO, "build", "rel")))

PACK_INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''


def node_module(cls_name, body):
    return f'''
import os, sys

class {cls_name}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"x": ("INT", {{"default": 1}})}}}}
    RETURN_TYPES = ("INT", "STRING")
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, x):
        return (os.getpid(), {body})

NODE_CLASS_MAPPINGS = {{"{cls_name}": {cls_name}}}
NODE_DISPLAY_NAME_MAPPINGS = {{"{cls_name}": "{cls_name} (display)"}}
'''


def host(tmp_path, packs, body, env=None):
    """Runs body in a fresh ComfyUI host after the repository's
    prestartup_script.py (as ComfyUI runs it) and each pack's import."""
    code = f"""
        import logging, io
        buf = io.StringIO()
        _h = logging.StreamHandler(buf)
        logging.getLogger().addHandler(_h)
        logging.getLogger().setLevel(logging.INFO)
        import importlib.util as _u
        _s = _u.spec_from_file_location("bh_prestartup", {os.path.join(REPO, "prestartup_script.py")!r})
        _s.loader.exec_module(_u.module_from_spec(_s))
        mods = {{}}
        for p in {[str(p) for p in packs]!r}:
            mods[os.path.basename(p)] = load_custom_node(p)
        def run(name, key, x=1):
            cls = mods[name].NODE_CLASS_MAPPINGS[key]
            return getattr(cls(), cls.FUNCTION)(x=x)
    """
    code = textwrap.dedent(code) + textwrap.dedent(body) + textwrap.dedent("""
        from bulkhead.host import nodes as _n
        _n.close_all()
    """)
    e = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": os.environ["BULKHEAD_HOME"],
         "HOME": os.environ["HOME"], "BULKHEAD_LEDGER": str(tmp_path / "ledger")}
    e.update(env or {})
    return run_comfy_script(code, timeout=240, env=e)


@pytest.mark.torch
def test_register_nodes_whole_nodes_package_and_subdirs(tmp_path, sources):
    # layout 1: nodes/comfy-env.toml -- the whole nodes package is one environment
    one = tmp_path / "ComfyUI-Whole"
    write(one / "__init__.py", PACK_INIT)
    write(one / "nodes" / "__init__.py", "from .impl import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS\n")
    write(one / "nodes" / "impl.py", node_module("WholeNode", "__import__('bhplain').VALUE + os.environ['BH_N']"))
    write(one / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n[pypi-dependencies]\nbhplain = "*"\n'
                                           '[env_vars]\nBH_N = 7\n')
    # layout 2: nodes/<subdir>/comfy-env.toml per subdirectory; one without runs in the host
    two = tmp_path / "ComfyUI-Subs"
    write(two / "__init__.py", PACK_INIT)
    write(two / "comfy-env-root.toml", '[types]\nTRIMESH = "builtin"\n')
    write(two / "nodes" / "iso" / "__init__.py", node_module("IsoNode", "'iso'"))
    write(two / "nodes" / "iso" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    write(two / "nodes" / "main" / "__init__.py", node_module("MainNode", "'main'"))
    write(two / "nodes" / "_private" / "__init__.py", "raise SystemExit('never imported')\n")
    for p in (one, two):
        bulkhead.install(str(p), progress=lambda l: None, pip_args=["--no-index", "--find-links", sources["wheels"]])
    r = host(tmp_path, [one, two], """
        import comfy_env
        emit(dict(me=os.getpid(), ours=getattr(comfy_env, "__bulkhead__", False),
                  whole=run("ComfyUI-Whole", "WholeNode"), iso=run("ComfyUI-Subs", "IsoNode"),
                  main=run("ComfyUI-Subs", "MainNode"),
                  keys=sorted(mods["ComfyUI-Subs"].NODE_CLASS_MAPPINGS),
                  display=mods["ComfyUI-Whole"].NODE_DISPLAY_NAME_MAPPINGS, log=buf.getvalue()))
    """)
    assert r["ours"]
    assert r["whole"][0] != r["me"] and r["whole"][1] == "plain7"
    assert r["iso"][0] != r["me"] and r["iso"][1] == "iso"
    assert r["main"] == [r["me"], "main"]
    assert r["keys"] == ["IsoNode", "MainNode"]
    assert r["display"] == {"WholeNode": "WholeNode (display)"}
    served = [l for l in r["log"].splitlines() if "is served by bulkhead" in l]
    assert len(served) == 2 and "BULKHEAD_COMFY_ENV=off" in served[0], r["log"][-3000:]


@pytest.mark.torch
def test_the_switch_hands_packs_back(tmp_path):
    r = host(tmp_path, [], """
        import sys
        emit(dict(finder=any(type(f).__name__ == "Finder" for f in sys.meta_path), log=buf.getvalue()))
    """, env={"BULKHEAD_COMFY_ENV": "off"})
    assert not r["finder"] and "BULKHEAD_COMFY_ENV=off" in r["log"]


def fake_ce_env(tmp_path, pack, subdir, tag, source=None):
    """An environment as comfy-env lays one out in ~/.ce: a real venv at
    .pixi/envs/default and an env.stamp.json."""
    from bulkhead.host import comfy_env as ce
    cfg = pack / "nodes" / subdir / "comfy-env.toml"
    d = tmp_path / "user-home" / ".ce" / "envs" / f"{ce.ce_env_name(str(pack), str(cfg))}_{tag}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / ".pixi" / "envs" / "default")], check=True)
    import json
    write(d / "env.stamp.json", json.dumps({"abi_tag": tag, "source": source or f"{pack.name}/nodes/{subdir}/comfy-env.toml",
                                            "comfy_env_version": "0.4.46"}))
    return d


@pytest.mark.torch
def test_an_environment_comfy_env_built_is_reused_and_a_stale_one_reported(tmp_path):
    from bulkhead.host import comfy_env as ce
    pack = tmp_path / "ComfyUI-Reuse"
    write(pack / "__init__.py", PACK_INIT)
    write(pack / "nodes" / "good" / "__init__.py", node_module("GoodNode", "sys.prefix"))
    write(pack / "nodes" / "stale" / "__init__.py", node_module("StaleNode", "sys.prefix"))
    for sub in ("good", "stale"):
        write(pack / "nodes" / sub / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    good = fake_ce_env(tmp_path, pack, "good", ce.ce_abi_tag())
    fake_ce_env(tmp_path, pack, "stale", ce.ce_abi_tag())
    os.utime(good / "env.stamp.json")
    # the stale one: its stamp names another stack
    stale_dir = tmp_path / "user-home" / ".ce" / "envs" / f"reuse-stale_{ce.ce_abi_tag()}"
    write(stale_dir / "env.stamp.json", '{"abi_tag": "py39-torch1.0-cpu"}')
    r = host(tmp_path, [pack], """
        from bulkhead.host import states
        emit(dict(me=os.getpid(), good=run("ComfyUI-Reuse", "GoodNode"), stale=run("ComfyUI-Reuse", "StaleNode"),
                  log=buf.getvalue(), states={p["name"]: p for p in states.pack_states()}))
    """)
    assert r["good"][0] != r["me"] and r["good"][1] == str(good / ".pixi" / "envs" / "default")
    assert r["stale"][0] == r["me"]
    warn = [l for l in r["log"].splitlines() if "NOT isolated" in l]
    # one short line (#36); the whole reason and the fix in the pack's state
    assert len(warn) == 1 and "'ComfyUI-Reuse.stale'" in warn[0] and len(warn[0]) <= 200, r["log"]
    stale = r["states"]["ComfyUI-Reuse.stale"]
    assert "py39-torch1.0-cpu" in stale["reason"] and "comfy-env install --dir" in stale["reason"], stale
    assert "bulkhead install" in stale["fix"], stale


@pytest.mark.torch
def test_a_serializer_that_raises_fails_the_pack_with_file_and_line(tmp_path):
    pack = tmp_path / "ComfyUI-Ser"
    write(pack / "__init__.py", PACK_INIT)
    write(pack / "comfy-env-root.toml", '[types]\nTRIMESH = "custom"\n')
    write(pack / "serialization.py", "from comfy_env import register_serializer\n\n"
                                     "register_serializer('Trimesh', lambda o, r: {})\nraise RuntimeError('boom')\n")
    write(pack / "nodes" / "__init__.py", node_module("SerNode", "'x'"))
    r = host(tmp_path, [], f"""
        try:
            load_custom_node({str(pack)!r})
            emit("loaded")
        except Exception as e:
            emit(str(e))
    """)
    assert r.startswith(f"{pack}/serialization.py:4: failed while registering its serializers: RuntimeError: boom"), r


def test_register_serializer_records_and_checks():
    from bulkhead.host import comfy_env as ce
    ce.register_serializer("Mesh", lambda o, r: {"v": 1}, lambda p, r: p, tag="MESH")
    assert ce.SERIALIZERS["MESH"]["type_name"] == "Mesh"
    with pytest.raises(TypeError, match="serialize must be callable"):
        ce.register_serializer("Mesh", 3)


def test_copy_files_from_the_calling_script(tmp_path):
    from bulkhead.host import comfy_env as ce
    write(tmp_path / "caller" / "assets" / "a" / "x.txt", "x")
    write(tmp_path / "dst" / "a" / "x.txt", "old")
    script = write(tmp_path / "caller" / "pre.py", f"""
        from bulkhead.host.comfy_env import copy_files
        N = copy_files("assets", {str(tmp_path / 'dst')!r}, "**/*")
        M = copy_files("assets", {str(tmp_path / 'dst')!r}, "**/*", overwrite=True)
    """)
    ns = {"__file__": script, "__name__": "pre"}
    exec(compile(open(script).read(), script, "exec"), ns)
    assert ns["N"] == 0 and ns["M"] == 1 and open(tmp_path / "dst" / "a" / "x.txt").read() == "x"
    assert ce.copy_files("nowhere", str(tmp_path)) == 0


def test_bulkhead_install_needs_no_install_py(tmp_path, sources):
    pack = tmp_path / "ComfyUI-NoInstallPy"
    write(pack / "nodes" / "x" / "comfy-env.toml", f'python = "{HOST_MM}"\n[pypi-dependencies]\nbhplain = "*"\n')
    r = subprocess.run([sys.executable, "-m", "bulkhead", "install", str(pack), "--pip-args",
                        f"--no-index --find-links {sources['wheels']}"], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python")))
    assert r.returncode == 0, r.stderr
    assert "ComfyUI-NoInstallPy.x: ready" in r.stdout


# --- conda [dependencies] from a local channel (py-rattler) ---

def conda_pack(tmp_path, channel, deps, extra=""):
    pack = tmp_path / "ComfyUI-Conda"
    write(pack / "__init__.py", PACK_INIT)
    write(pack / "nodes" / "__init__.py", node_module(
        "CondaNode", "__import__('subprocess').run(['bhtool'], capture_output=True, text=True).stdout.strip() + '|' + "
                     "__import__('bhconda').VALUE + '|' + __import__('bhplain').VALUE + '|' + "
                     "open(os.path.join(os.environ['CONDA_PREFIX'], 'share/bhtool/data.txt')).read().strip()"))
    write(pack / "nodes" / "comfy-env.toml", f'''
        python = "{HOST_MM}"
        [workspace]
        channels = ["{channel}"]
        [dependencies]
        {deps}
        [pypi-dependencies]
        bhplain = "*"
        {extra}
    ''')
    return pack


def test_conda_dependencies_from_a_local_channel(tmp_path, sources, channel, home):
    pack = conda_pack(tmp_path, channel, 'bhtool = ">=1"',
                      f'[target.{packconfig.current_platform()}.dependencies]\nbhtool = "1.0.*"\n'
                      f'[target.{other_platform()}.dependencies]\nbhnowhere = "*"\n')
    [c] = packconfig.load_configs(pack, warn=False)
    assert c.conda == ("bhtool 1.0.*",) and c.channels == ("file://" + channel,)
    assert not [w for w in c.warnings if "dependencies" in w or "workspace" in w], c.warnings
    lines = []
    [st] = bulkhead.install(str(pack), progress=lines.append,
                            pip_args=["--no-index", "--find-links", sources["wheels"]])
    assert st.ok, st
    assert any("solving 1 conda package(s)" in l for l in lines), lines
    prefix = os.path.join(st.env_dir, "conda")
    assert os.path.isdir(os.path.join(prefix, "conda-meta"))
    stamp = envs.read_stamp(st.env_dir)
    assert [r[:2] for r in stamp["conda"]["installed"]] == [["bhtool", "1.0"]]
    # nothing of the temporary directory is left in the built environment
    pth = open(os.path.join(st.env_dir, "lib", f"python{HOST_MM}", "site-packages", "bulkhead-conda.pth")).read()
    assert pth.strip() == os.path.join(prefix, "lib", f"python{HOST_MM}", "site-packages")
    assert [n for n in os.listdir(home / "envs") if ".tmp-" in n] == []
    # the worker runs under the venv's python with the prefix activated
    r = host(tmp_path, [pack], """
        emit(dict(me=os.getpid(), out=run("ComfyUI-Conda", "CondaNode")))
    """)
    assert r["out"][0] != r["me"]
    assert r["out"][1] == f"bhtool 1.0 {prefix}|conda 1.0|plain|data 1.0", r


@pytest.mark.parametrize("deps, channel_text, expected", [
    ('bhmissing = "*"', None, r"cannot satisfy them .*bhmissing"),
    ('bhtool = ">=5"', None, r"cannot satisfy them .*bhtool >=5"),
    ('bhtool = "*"', "/nonexistent/channel", r"cannot read the conda channel\(s\) file:///nonexistent/channel "
                                             r"from this machine.*\[workspace\] channels"),
])
def test_conda_failures_name_the_package_and_leave_nothing(tmp_path, sources, channel, home, deps,
                                                           channel_text, expected):
    pack = conda_pack(tmp_path, channel_text or channel, deps)
    with pytest.raises(bulkhead.EnvBuildError, match=expected) as ei:
        bulkhead.install(str(pack), progress=lambda l: None,
                         pip_args=["--no-index", "--find-links", sources["wheels"]])
    assert "no environment was made" in str(ei.value) and str(pack / "nodes" / "comfy-env.toml") in str(ei.value)
    assert [n for n in os.listdir(home / "envs") if not n.endswith(".lock")] == []


def test_conda_spec_shapes(tmp_path):
    c = load_text(tmp_path, '''
        [dependencies]
        FFmpeg = "6.*"
        av = { version = ">=12", channel = "conda-forge" }
        cgal = { version = "5.6", build = "h1*" }
        mesalib = "*"
    ''')
    assert c.conda == ("cgal 5.6 h1*", "conda-forge::av >=12", "ffmpeg 6.*", "mesalib")
    assert c.channels == ("conda-forge",)
    with pytest.raises(PackConfigError, match=r"key 'md5' is not supported"):
        load_text(tmp_path, '[dependencies]\nav = { md5 = "x" }\n')


# --- [cuda] packages from a local wheel index ---

def cuda_pack(tmp_path, packages='["bh-cudaext"]'):
    pack = tmp_path / "ComfyUI-Cuda"
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n[cuda]\npackages = {packages}\n')
    return pack


@pytest.mark.parametrize("torch_v, cuda_v, value", [("2.8.0", "12.8", "cu128torch2.8"),
                                                     ("2.5.1", "12.4", "cu124torch2.5"),
                                                     ("2.4.0", "none", "cputorch2.4")])
def test_cuda_packages_from_a_local_index(tmp_path, cuda_index, monkeypatch, torch_v, cuda_v, value):
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", "/nonexistent-index " + cuda_index)
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", torch_v)
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", cuda_v)
    lines = []
    [st] = bulkhead.install(str(cuda_pack(tmp_path)), progress=lines.append, pip_args=["--no-index"])
    assert st.ok, st
    out = subprocess.run([st.python, "-I", "-c", "import bh_cudaext; print(bh_cudaext.VALUE)"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    assert out == value
    assert any(l.startswith("[cuda] bh-cudaext: bh_cudaext-1.0+" + value) for l in lines), lines


def test_cuda_package_without_a_wheel_names_package_build_and_indexes(tmp_path, cuda_index, monkeypatch, home):
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", cuda_index)
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.9.0")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "13.0")
    with pytest.raises(bulkhead.EnvBuildError) as ei:
        bulkhead.install(str(cuda_pack(tmp_path, '["bh-cudaext", "bh-other"]')), progress=lambda l: None,
                         pip_args=["--no-index"])
    e = str(ei.value)
    assert "no wheel of 'bh-cudaext' for +cu130torch2.9" in e and PY_TAG in e, e
    assert f"file://{cuda_index}/bh_cudaext/" in e and "no environment was made" in e
    assert [n for n in os.listdir(home / "envs") if not n.endswith(".lock")] == []


def test_cuda_package_on_a_host_whose_torch_has_no_cuda(tmp_path, cuda_index, monkeypatch):
    """As comfy-env without an NVIDIA GPU: a CUDA wheel with no CPU build is
    skipped with one warning naming it, and the rest is built."""
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", cuda_index)
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "none")
    pack = cuda_pack(tmp_path, '["bh-cudaext", "bh-nowhere"]')
    lines = []
    [st] = bulkhead.install(str(pack), progress=lines.append, pip_args=["--no-index"])
    assert st.ok, st
    warned = [l for l in lines if l.startswith("warning:") and "[cuda]" in l]
    assert len(warned) == 1, lines
    w = warned[0]
    assert w.startswith(f"warning: {pack}/nodes/comfy-env.toml: [cuda] packages: skipping the CUDA wheels "
                        "bh-cudaext, bh-nowhere: the host's torch (2.8.0) has no CUDA"), w
    assert "+cputorch2.8" in w and f"`bulkhead install {pack} --force`" in w
    assert envs.read_stamp(st.env_dir)["cuda"]["wheels"] == []
    r = subprocess.run([st.python, "-I", "-c", "import importlib.util as u; print(u.find_spec('bh_cudaext'))"],
                       stdout=subprocess.PIPE, universal_newlines=True, check=True)
    assert r.stdout.strip() == "None"


def test_cuda_host_torch_is_read_without_importing_it(monkeypatch):
    from bulkhead.envs import cudawheels
    monkeypatch.delenv("BULKHEAD_TORCH_VERSION", raising=False)
    monkeypatch.delenv("BULKHEAD_CUDA_VERSION", raising=False)
    tv, cv = cudawheels.host_torch()
    torch = pytest.importorskip("torch")
    assert tv == torch.__version__ and cv == torch.version.cuda
    monkeypatch.delenv("BULKHEAD_CUDA_INDEX", raising=False)
    monkeypatch.delenv("COMFY_ENV_CUDA_WHEELS_INDEX", raising=False)
    assert cudawheels.indexes() == ["https://comfy-forge.github.io/cuda-wheels/"]


def test_torch_in_cuda_packages_is_the_hosts_with_a_note(tmp_path):
    """comfy-env before 0.3.0 read torch and its family in [cuda] as the
    machine's CUDA build of torch, and packs in the field still list them
    (a GPU subdirectory's `packages = ["cumesh", "torch", "torchvision"]`):
    the environment gets the host's torch, as every environment does, with
    one note, and only the other names are CUDA wheels."""
    c = load_text(tmp_path, '[cuda]\npackages = ["nvdiffrast", "torch", "torchvision"]\n'
                            '[pypi-dependencies]\nnumpy = "*"\n')
    assert c.cuda == ("nvdiffrast",)
    [note] = [w for w in c.warnings if "torch" in w]
    assert note.startswith(f"{c.path}:2: [cuda] packages lists torch, torchvision: the environment gets the "
                           "host's torch"), note
    only = load_text(tmp_path, '[cuda]\npackages = ["torch"]\n', name="only.toml")
    assert only.cuda == () and "cuda" not in repr(only.requirements)
    assert only.config_hash == load_text(tmp_path, "", name="none.toml").config_hash


# --- typed values across packs: a custom [types] type by its serializer ---

MESH_SERIALIZATION = '''
from comfy_env import register_serializer

def serialize(mesh, recurse):
    {raise_}return {{"vertices": mesh.vertices, "faces": mesh.faces, "name": mesh.name}}

def deserialize(payload, recurse):
    import bhmesh
    return bhmesh.Mesh(payload["vertices"], payload["faces"], payload["name"])

register_serializer("Mesh", serialize, deserialize, tag="TRIMESH")
'''

MESH_NODES = '''
import os
import numpy as np
import bhmesh

class MakeMesh:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3})}}
    RETURN_TYPES = ("TRIMESH",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, n):
        v = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        return (bhmesh.Mesh(v, np.array([[0, 1, 2]], dtype=np.int32), "made in %d" % os.getpid()),)

class Opaque:
    pass

class MakeOpaque:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("THING",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self):
        return (Opaque(),)

NODE_CLASS_MAPPINGS = {"MakeMesh": MakeMesh, "MakeOpaque": MakeOpaque}
'''

USE_NODES = '''
import os
import bhmesh

class UseMesh:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mesh": ("TRIMESH",)}}
    RETURN_TYPES = ("FLOAT", "STRING")
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, mesh):
        assert isinstance(mesh, bhmesh.Mesh), type(mesh)
        return (float(mesh.vertices.sum()) + len(mesh.faces), "%s, used in %d" % (mesh.name, os.getpid()))

NODE_CLASS_MAPPINGS = {"UseMesh": UseMesh}
'''


# The same types made and used by V3 nodes (their outputs cross from run_v3).
MESH_NODES_V3 = '''
from comfy_api.latest import io

class MakeMesh3(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="MakeMesh3", category="test", inputs=[io.Int.Input("n", default=3)],
                         outputs=[io.Custom("TRIMESH").Output(), io.Custom("THING").Output()])

    @classmethod
    def execute(cls, n):
        v = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        return io.NodeOutput(bhmesh.Mesh(v, np.array([[0, 1, 2]], dtype=np.int32), "v3 made in %d" % os.getpid()),
                             Opaque())

NODE_CLASS_MAPPINGS["MakeMesh3"] = MakeMesh3
'''

USE_NODES_V3 = '''
from comfy_api.latest import io

class UseMesh3(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="UseMesh3", category="test", inputs=[io.Custom("TRIMESH").Input("mesh")],
                         outputs=[io.Float.Output(), io.String.Output()])

    @classmethod
    def execute(cls, mesh):
        assert isinstance(mesh, bhmesh.Mesh), type(mesh)
        return io.NodeOutput(float(mesh.vertices.sum()) + len(mesh.faces), "%s, used in %d" % (mesh.name, os.getpid()))

NODE_CLASS_MAPPINGS["UseMesh3"] = UseMesh3
'''


def mesh_packs(tmp_path, raise_="", v3=False):
    wheels = os.path.dirname(make_wheel(str(tmp_path / "meshwheels"), "bhmesh", "1.0", {"bhmesh/__init__.py": (
        "class Mesh:\n    def __init__(self, vertices, faces, name):\n"
        "        self.vertices, self.faces, self.name = vertices, faces, name\n")}))
    custom = tmp_path / "custom_nodes"
    geo, use = custom / "ComfyUI-Geo", custom / "ComfyUI-Use"
    geo_nodes, use_nodes = (MESH_NODES + MESH_NODES_V3, USE_NODES + USE_NODES_V3) if v3 else (MESH_NODES, USE_NODES)
    for pack, nodes_text, root in ((geo, geo_nodes, ""), (use, use_nodes, '[node_packs]\nComfyUI-Geo = "x/ComfyUI-Geo"\n')):
        write(pack / "__init__.py", PACK_INIT)
        write(pack / "comfy-env-root.toml", root + '[types]\nTRIMESH = "custom"\n')
        write(pack / "serialization.py", MESH_SERIALIZATION.format(raise_=raise_ if pack == geo else ""))
        write(pack / "nodes" / "__init__.py", nodes_text)
        write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n[pypi-dependencies]\nnumpy = "*"\nbhmesh = "*"\n')
        bulkhead.install(str(pack), progress=lambda l: None, pip_args=["--find-links", wheels])
    return geo, use


@pytest.mark.torch
def test_a_custom_type_made_in_one_pack_is_used_in_another(tmp_path):
    geo, use = mesh_packs(tmp_path)
    r = host(tmp_path, [geo, use], """
        geo, use = mods["ComfyUI-Geo"].NODE_CLASS_MAPPINGS, mods["ComfyUI-Use"].NODE_CLASS_MAPPINGS
        (mesh,) = geo["MakeMesh"]().run(n=3)
        held = dict(type=mesh.get(b"__bulkhead_type__"), pack=mesh.get("pack"),
                    vertices=type(mesh["value"]["vertices"]).__name__)
        total, name = use["UseMesh"]().run(mesh=mesh)
        (thing,) = geo["MakeOpaque"]().run()
        def err_of(value):
            try:
                use["UseMesh"]().run(mesh=value)
            except Exception as e:
                return type(e).__name__ + ": " + str(e)
        # what a web client can write in a prompt: the typed map's shape, str keys (JSON)
        forged = {"__bulkhead_type__": "TRIMESH", "type": "Mesh", "pack": "ComfyUI-Geo",
                  "value": {"vertices": [[1.0]], "faces": [[0, 1, 2]], "name": "chosen by a web client"}}
        emit(dict(me=os.getpid(), held=held, total=total, name=name, err=err_of(thing), forged=err_of(forged)))
    """)
    assert r["held"] == {"type": "TRIMESH", "pack": "ComfyUI-Geo", "vertices": "ndarray"}, r
    assert r["total"] == 36.0 + 1
    made, used = r["name"].split(", ")
    assert made.startswith("made in ") and used.startswith("used in ")
    assert len({int(made.split()[-1]), int(used.split()[-1]), r["me"]}) == 3, r
    # a class nobody registered stays a handle in its worker, with today's error
    assert r["err"].startswith("HandleError") and "ComfyUI-Geo" in r["err"], r["err"]
    # a forged marker reaches the node as the dict it is, never the deserializer
    assert "AssertionError" in r["forged"] and "dict" in r["forged"], r["forged"]


@pytest.mark.torch
def test_a_custom_type_made_by_a_v3_node_is_used_by_a_v3_node_of_another_pack(tmp_path):
    geo, use = mesh_packs(tmp_path, v3=True)
    r = host(tmp_path, [geo, use], """
        geo, use = mods["ComfyUI-Geo"].NODE_CLASS_MAPPINGS, mods["ComfyUI-Use"].NODE_CLASS_MAPPINGS
        make, take = geo["MakeMesh3"], use["UseMesh3"]
        mesh, thing = make.execute.__func__(make.PREPARE_CLASS_CLONE({}), n=3).args
        held = dict(type=mesh.get(b"__bulkhead_type__"), pack=mesh.get("pack"),
                    vertices=type(mesh["value"]["vertices"]).__name__, thing=type(thing).__name__)
        total, name = take.execute.__func__(take.PREPARE_CLASS_CLONE({}), mesh=mesh).args
        (v1_total, _) = use["UseMesh"]().run(mesh=mesh)
        emit(dict(me=os.getpid(), held=held, total=total, v1_total=v1_total, name=name))
    """)
    assert r["held"] == {"type": "TRIMESH", "pack": "ComfyUI-Geo", "vertices": "ndarray",
                         "thing": "RemoteObject"}, r
    assert r["total"] == r["v1_total"] == 36.0 + 1
    made, used = r["name"].split(", ")
    assert made.startswith("v3 made in ") and used.startswith("used in ")
    assert len({int(made.split()[-1]), int(used.split()[-1]), r["me"]}) == 3, r


@pytest.mark.torch
def test_a_serializer_that_raises_names_the_type_and_the_pack(tmp_path):
    geo, use = mesh_packs(tmp_path, raise_="raise ValueError('no mesh today')\n    ")
    r = host(tmp_path, [geo, use], """
        try:
            mods["ComfyUI-Geo"].NODE_CLASS_MAPPINGS["MakeMesh"]().run(n=3)
            emit("no error")
        except Exception as e:
            emit(str(e))
    """)
    assert "the serializer of type 'Mesh' (pack 'ComfyUI-Geo'" in r and "ValueError: no mesh today" in r, r


# --- `import comfy_env` at interpreter start (python/_bulkhead_comfy_env.py) ---

HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "python", "_bulkhead_comfy_env.py")


@pytest.mark.parametrize("where, expect", [
    ("plain", "ModuleNotFoundError"),                 # not ComfyUI: the real package, here none
    ("comfyui", "bulkhead"),                          # ComfyUI's folder_paths imported: bulkhead's surface
    ("comfyui-off", "ModuleNotFoundError"),           # BULKHEAD_COMFY_ENV=off: the real one
    ("worker", "ModuleNotFoundError"),                # a bulkhead worker: never routed there
    ("comfyui-clone", "bulkhead"),                    # bulkhead's custom node in custom_nodes/
    ("comfyui-no-clone", "ModuleNotFoundError"),      # its folder deleted: off
])
def test_the_start_hook_routes_comfy_env_only_inside_comfyui(tmp_path, where, expect):
    code = textwrap.dedent(f"""
        import importlib.util, sys, types
        spec = importlib.util.spec_from_file_location("_bulkhead_comfy_env", {HOOK!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        if {where!r}.startswith("comfyui") or {where!r} == "worker":
            sys.modules["folder_paths"] = fp = types.ModuleType("folder_paths")
            if {where!r} in ("comfyui-clone", "comfyui-no-clone"):
                fp.get_folder_paths = lambda name: [{str(tmp_path / "custom_nodes")!r}]
        if {where!r} == "worker":
            w = types.ModuleType("bulkhead.worker"); w._peer = object(); sys.modules["bulkhead.worker"] = w
        try:
            import comfy_env
        except ModuleNotFoundError:
            print("ModuleNotFoundError")
        else:
            print("bulkhead" if getattr(comfy_env, "__bulkhead__", False) else comfy_env.__file__)
    """)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(bulkhead.__file__))))
    env.pop("BULKHEAD_COMFY_ENV", None)
    if where == "comfyui-off":
        env["BULKHEAD_COMFY_ENV"] = "off"
    (tmp_path / "custom_nodes" / "other_pack").mkdir(parents=True)
    if where == "comfyui-clone":
        write(tmp_path / "custom_nodes" / "ComfyUI-bulkhead" / "python" / "bulkhead" / "__init__.py", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expect, (r.stdout, r.stderr)


# --- older comfy-env dialects (docs/comfy-env-dialects.md) ---

D1_NAMED = '''
[system]
linux = ["libgl1"]

[geometrypack]
python = "3.11"
cuda_version = "auto"
pytorch_version = "auto"

[geometrypack.cuda]
cumesh = "*"
torch-scatter = "2.1.2"

[geometrypack.conda]
channels = ["conda-forge"]
packages = ["cgal>=5"]

[geometrypack.packages]
requirements = ["trimesh>=4"]

[geometrypack.packages.linux]
requirements = ["pymeshlab"]

[geometrypack.packages.windows]
requirements = ["pywin32"]

[geometrypack.env]
OMP_NUM_THREADS = 1

[local.cuda]
cc_torch = "*"
'''


@pytest.mark.parametrize("text, want, warned", [
    # comfy-env 0.0.13-0.0.65: an environment named by its table
    (D1_NAMED, {"python": "3.11", "requirements": ("pymeshlab", "trimesh>=4"), "cuda": ("cumesh", "torch-scatter==2.1.2"),
                "conda": ("cgal >=5",), "channels": ("conda-forge",), "env_vars": {"OMP_NUM_THREADS": "1"},
                "apt": ("libgl1",), "local": ("cc_torch",)}, ("torch and its CUDA build are the host's",)),
    # 0.0.x's simple form: [env] + [packages]
    ('[env]\nname = "x"\npython = "3.10"\n[packages]\nrequirements = ["numpy<2"]\nno_deps = ["bhplain"]\n',
     {"python": "3.10", "requirements": ("bhplain", "numpy<2")}, ()),
    # 0.0.x: a top-level cuda array, and [cuda] as package = "version"
    ('cuda = ["nvdiffrast==0.3.3"]\n', {"cuda": ("nvdiffrast==0.3.3",)}, ()),
    ('[cuda]\nnvdiffrast = "*"\nspconv = "2.3"\n', {"cuda": ("nvdiffrast", "spconv==2.3")}, ()),
    # 0.0.66-0.4.13: python as a number, [apt] packages as one string
    ('python = 3.11\n[apt]\npackages = "libgl1"\n', {"python": "3.11", "apt": ("libgl1",)}, ()),
], ids=["d1-named", "d1-simple", "d1-cuda-array", "d1-cuda-table", "d3-scalars"])
def test_older_dialects_read_with_their_meaning(tmp_path, text, want, warned):
    c = load_text(tmp_path, text)
    got = {"python": c.python, "requirements": c.requirements, "cuda": c.cuda, "conda": c.conda,
           "channels": c.channels, "env_vars": dict(c.env_vars), "apt": c.system_packages.get("apt"), "local": c.local}
    for k, v in want.items():
        assert got[k] == v, (k, got)
    for w in warned:
        assert any(w in n for n in c.warnings), c.warnings


def test_older_root_files_warn_instead_of_refusing(tmp_path):
    """comfy-env 0.1.17-0.4.13 read comfy-env-root.toml with the environment
    files' parser: a root file of that era (a real pack's: [env_vars],
    [apt] as one string, [node_reqs] entries with keys comfy-env ignored)
    loads, with one warning each for what bulkhead does not read there."""
    write(tmp_path / "p" / "comfy-env-root.toml", textwrap.dedent('''
        [env_vars]
        KMP_DUPLICATE_LIB_OK = "TRUE"
        OMP_NUM_THREADS = 1

        [apt]
        packages = "libgl1"

        [node_reqs]
        ComfyUI-GeometryPack = { github = "a/b", sha = "x" }
    '''))
    r = rootconfig.load_root(tmp_path / "p", warn=False)
    assert r.node_packs == (("ComfyUI-GeometryPack", "a/b"),) and r.system_packages["apt"] == ("libgl1",)
    assert any("comfy-env-root.toml:1: [env_vars] is not read in comfy-env-root.toml" in w and "0.4.14 refuses" in w for w in r.warnings)
    assert any("key 'sha' is not read" in w for w in r.warnings), r.warnings


@pytest.mark.parametrize("real", [False, True])
def test_comfy_env_submodules_under_the_routing(tmp_path, real):
    """Routed, `import comfy_env.config` (a pack reading comfy-env's own
    modules) gets the real package's submodule where comfy-env is
    installed, and bulkhead's (its load_config) where it is not; a module
    bulkhead does not serve (comfy_env.settings) is the real one's, or an
    error naming the switch."""
    if real:
        write(tmp_path / "site" / "comfy_env" / "__init__.py", "def register_nodes():\n    return 'real'\n")
        write(tmp_path / "site" / "comfy_env" / "config.py", "WHERE = 'the real package'\n")
        write(tmp_path / "site" / "comfy_env" / "settings.py", "WHERE = 'the real package'\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / "site")!r})
        from bulkhead.host import comfy_env as served
        served.route()
        import comfy_env
        assert comfy_env.register_nodes is served.register_nodes
        import comfy_env.config as c
        print(getattr(c, "WHERE", None) or ("bulkhead's" if c.__bulkhead__ and callable(c.load_config) else "?"))
        try:
            import comfy_env.settings as s
            print(s.WHERE)
        except ModuleNotFoundError as e:
            print("ModuleNotFoundError:", e)
    """)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(bulkhead.__file__))))
    env.pop("BULKHEAD_COMFY_ENV", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    config, settings = r.stdout.strip().split("\n", 1)
    if real:
        assert config == settings == "the real package", r.stdout
    else:
        assert config == "bulkhead's", r.stdout
        assert settings.startswith("ModuleNotFoundError: No module named 'comfy_env.settings'") and \
            "BULKHEAD_COMFY_ENV=off" in settings, r.stdout
