"""What comfy-env's releases accepted in a ``comfy-env.toml`` and bulkhead
once refused or read otherwise, each put to a release's own reader where
its code runs here (test_comfy_env_names's ``releases`` and
``run_release``: the wheel's modules run in a child, never committed) and
to bulkhead's: a PEP 440 ``python`` specifier, a typo inside ``[cuda]``,
extras in a dependency key; and the CUDA wheel picked by version where an
index lists several.  Where bulkhead answers otherwise on purpose the
difference is in docs/comfy-env-dialects.md and the test says so."""

import json
import os
import platform
import subprocess
import sys
import types

import pytest

from bulkhead.envs import config as packconfig, cudawheels, interpreters
from bulkhead.envs.config import PackConfigError
from bulkhead.envs.hostmatch import Version
from localsources import PY_TAG, write
from test_comfy_env_names import releases, run_release  # noqa: F401  (releases: a fixture)

HOST_MM = "%d.%d" % sys.version_info[:2]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    for v in ("COMFY_ENV_ROOT", "BULKHEAD_PIP_ARGS", "BULKHEAD_COMFY_ENV"):
        monkeypatch.delenv(v, raising=False)
    return tmp_path / "bh-home"


def release_config(tmp_path, releases, version, text):
    """comfy-env ``version``'s load_config over ``text``: its python, cuda
    packages, pypi dependencies and what it printed to stderr."""
    p = write(tmp_path / "rel" / "comfy-env.toml", text)
    return run_release(tmp_path, releases[version], f"""
        import contextlib, io
        from comfy_env.config import load_config
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                c = load_config({p!r})
                out = dict(python=c.python, cuda=c.cuda_packages,
                           pypi=c.pixi_passthrough.get("pypi-dependencies", {{}}))
            except ValueError as e:
                out = dict(error=str(e))
        out["stderr"] = err.getvalue()
        print(json.dumps(out))
    """)


def bulkhead_config(tmp_path, text):
    p = write(tmp_path / "bh" / "nodes" / "comfy-env.toml", text)
    return packconfig.load(p, warn=False)


# --- python = ">=3.10": a PEP 440 specifier, resolved to an interpreter found here ---

def release_python_pick(tmp_path, releases, spec):
    """The interpreter comfy-env 0.4.46 would get for ``spec`` among those
    on this machine: the python entry its own toml_generator writes into
    the pixi manifest, read by rattler (pixi's own spec parser); pixi's
    solve takes the newest version that matches."""
    rattler = pytest.importorskip("rattler", reason="py-rattler (make check-py installs it)")
    conda_spec = run_release(tmp_path, releases["0.4.46"], f"""
        from comfy_env.packages.toml_generator import _common_base_dependencies
        print(json.dumps(_common_base_dependencies({spec!r})["python"]))
    """)
    vs = rattler.VersionSpec(conda_spec)
    here = [v for v, _, _ in interpreters.list_interpreters() if vs.matches(rattler.Version(v))]
    return max(here, key=lambda v: tuple(map(int, v.split("."))), default=None)


@pytest.mark.parametrize("spec", [">=3.10", ">=3.10,<3.12", "~=3.10", "!=3.12.*,>=3.10", "<3.12,>3.10.2"])
def test_a_python_specifier_picks_the_interpreter_the_release_would(tmp_path, releases, spec):
    text = f'python = "{spec}"\n'
    want = release_config(tmp_path, releases, "0.4.46", text)
    assert want.get("python") == spec, want
    pick = release_python_pick(tmp_path, releases, spec)
    if pick is None:
        pytest.skip(f"no interpreter on this machine satisfies {spec}")
    c = bulkhead_config(tmp_path, text)
    it = interpreters.find_interpreter(c.python)
    assert it.version == pick, (it, pick)
    assert f"python = {c.python!r} in the config: the newest interpreter here that satisfies it" in it.why


def test_a_python_specifier_is_built_and_said_in_the_log_and_bulkhead_env(tmp_path):
    import bulkhead
    pack = tmp_path / "ComfyUI-Spec"
    write(pack / "nodes" / "comfy-env.toml", f'python = ">={HOST_MM},<{HOST_MM}.9999"\n')
    lines = []
    [st] = bulkhead.install(str(pack), progress=lines.append)
    assert st.ok and st.version.startswith(HOST_MM + "."), st
    [said] = [l for l in lines if l.startswith("interpreter: ")]
    assert f"(Python {st.version}): python = '<{HOST_MM}.9999,>={HOST_MM}' in the config: the newest" in said, said
    out = subprocess.run([sys.executable, "-m", "bulkhead", "env", str(pack)], stdout=subprocess.PIPE,
                         universal_newlines=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stdout
    assert f"  picked:  python = '<{HOST_MM}.9999,>={HOST_MM}' in the config: the newest" in out.stdout, out.stdout


def test_a_python_specifier_nothing_here_satisfies_names_file_line_and_interpreters(tmp_path):
    import bulkhead
    pack = tmp_path / "ComfyUI-Spec"
    cfg = write(pack / "nodes" / "comfy-env.toml", '# a pack for the future\npython = ">=3.99"\n')
    with pytest.raises(bulkhead.EnvBuildError) as ei:
        bulkhead.install(str(pack), progress=lambda l: None)
    e = str(ei.value)
    assert e.startswith(f"{cfg}:2: python = '>=3.99': no interpreter found here satisfies it"), e
    found = interpreters.list_interpreters()
    assert all(f"{v} ({p})" in e for v, p, _ in found) and "widen the specifier" in e, e


@pytest.mark.parametrize("text, expected", [
    ('python = ">=3.x"\n', "python = '>=3.x' is not a PEP 440 version specifier"),
    ('python = "<3.9"\n', "python = '<3.9' admits no Python 3.9 or newer"),
])
def test_a_bad_python_specifier_names_file_and_line(tmp_path, text, expected):
    with pytest.raises(PackConfigError) as ei:
        bulkhead_config(tmp_path, "# a pack\n" + text)
    assert str(ei.value).startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:2: {expected}"), str(ei.value)


# --- which CUDA wheel: the newest version that fits, not the first in text order ---

ARCH = platform.machine()


def wheel_page(root, names):
    """A CUDA-wheel index (``<pkg>/index.html`` of links named for wheels)
    listing ``names`` in that order; the wheels themselves are not there
    (resolve reads the page only)."""
    write(root / "idx" / "bh_cudaext" / "index.html", "".join(f'<a href="{n}">{n}</a>\n' for n in names))
    return str(root / "idx")


def wheel(version, local="cu128torch2.8", py=PY_TAG, plat=f"linux_{ARCH}"):
    return f"bh_cudaext-{version}+{local}-{py}-{py}-{plat}.whl"


@pytest.mark.parametrize("listed", [
    [wheel("1.9"), wheel("1.10")],
    [wheel("1.10"), wheel("1.9")],
    [wheel("2.0"), wheel("2.1")],
    [wheel("2.1"), wheel("2.0"), wheel("1.10")],
    # newer versions that do not fit (another CUDA, torch, Python, machine), a pre-release, a manylinux twin
    [wheel("1.9"), wheel("3.0", local="cu130torch2.9"), wheel("1.10"), wheel("3.0", py="cp30"),
     wheel("3.0", plat="linux_ppc64le"), wheel("2.0rc1"), wheel("1.10", plat=f"manylinux_2_28_{ARCH}")],
])
def test_the_cuda_wheel_picked_is_the_newest_version_that_fits(tmp_path, monkeypatch, listed):
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", wheel_page(tmp_path, listed))
    config = types.SimpleNamespace(path=str(tmp_path / "comfy-env.toml"), cuda=("bh-cudaext",))
    lines = []
    [got] = cudawheels.resolve(config, HOST_MM, lines.append, torch=("2.8.0", "12.8"))
    # The answer by PEP 440 (packaging's Version): of the wheels for this
    # build, the newest final release, manylinux before plain linux.
    fits = [n for n in listed if "+cu128torch2.8-" in n and f"-{PY_TAG}-" in n and n.endswith(f"_{ARCH}.whl")]
    final = [n for n in fits if not Version(n.split("-")[1].split("+")[0]).is_prerelease] or fits
    best = max(final, key=lambda n: (Version(n.split("-")[1].split("+")[0]), "manylinux" in n))
    assert got.endswith("/" + best), (got, best)
    [said] = [l for l in lines if l.startswith("[cuda] bh-cudaext: ")]
    assert said.startswith(f"[cuda] bh-cudaext: {best} (") and "the newest version of" in said, said
    others = {n.split("-")[1] for n in fits} - {best.split("-")[1]}
    assert all(o in said for o in others), said


def test_a_pinned_cuda_wheel_version_compares_as_a_version(tmp_path, monkeypatch):
    """comfy-env 0.0.x's ``name = "1.10.0"`` names 1.10 however the wheel spells it."""
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", wheel_page(tmp_path, [wheel("1.9"), wheel("1.10"), wheel("2.0")]))
    config = types.SimpleNamespace(path=str(tmp_path / "comfy-env.toml"), cuda=("bh-cudaext==1.10.0",))
    [got] = cudawheels.resolve(config, HOST_MM, lambda l: None, torch=("2.8.0", "12.8"))
    assert got.endswith("/" + wheel("1.10"))


# --- a typo inside [cuda]: a warning naming file and line, as comfy-env warned ---

@pytest.mark.parametrize("body, typo", [
    ('pakages = ["bh-other"]\npackages = ["nvdiffrast"]\n', "pakages"),
    ('packages = ["nvdiffrast"]\npackage = "bh-other"\n', "package"),
    ('packges = ["nvdiffrast"]\n', "packges"),
    ('packages = ["nvdiffrast"]\nwheel_index = { url = "https://x" }\n', "wheel_index"),
])
def test_a_typo_inside_cuda_is_a_warning_as_the_release_gives(tmp_path, releases, body, typo):
    text = f'python = "{HOST_MM}"\n[cuda]\n{body}'
    want = release_config(tmp_path, releases, "0.4.46", text)
    assert "error" not in want and f"unrecognized key '{typo}' in [cuda]" in want["stderr"], want
    c = bulkhead_config(tmp_path, text)
    assert list(c.cuda) == want["cuda"]
    line = 1 + text.splitlines().index(next(l for l in text.splitlines() if l.startswith(typo + " ")))
    [w] = [w for w in c.warnings if "[cuda]" in w]
    assert w.startswith(f"{c.path}:{line}: [cuda] unknown key {typo!r}"), w
    close = typo != "wheel_index"
    assert ("(did you mean 'packages'?)" in w) == close, w


# --- extras in a dependency key ---

EXTRAS = f'''
python = "{HOST_MM}"
[pypi-dependencies]
"bhextra[easy]" = "*"
"bhtable[More,easy]" = {{ version = ">=1", extras = ["easy"] }}
'''


def test_extras_in_a_dependency_key_are_read_as_the_release_reads_them(tmp_path, releases):
    want = release_config(tmp_path, releases, "0.4.46", EXTRAS)
    assert "error" not in want and set(want["pypi"]) == {"bhextra[easy]", "bhtable[More,easy]"}, want
    c = bulkhead_config(tmp_path, EXTRAS)
    assert c.requirements == ("bhextra[easy]", "bhtable[easy,more]>=1")
    with pytest.raises(PackConfigError) as ei:
        bulkhead_config(tmp_path, '[pypi-dependencies]\n"bhextra[e asy]" = "*"\n')
    assert str(ei.value).startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:2: [pypi-dependencies] 'bhextra[e asy]' "
                                    "is not a valid distribution name"), str(ei.value)


def test_a_dependency_with_extras_in_its_key_is_installed_with_them(tmp_path):
    import bulkhead
    from localsources import make_wheel
    wheels = str(tmp_path / "wheels")
    make_wheel(wheels, "bhextra", "1.0", {"bhextra/__init__.py": "VALUE = 'extra'\n"},
               'Provides-Extra: easy\nRequires-Dist: bhplain; extra == "easy"\n')
    make_wheel(wheels, "bhplain", "1.0", {"bhplain/__init__.py": "VALUE = 'plain'\n"})
    pack = tmp_path / "ComfyUI-Extras"
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n[pypi-dependencies]\n"bhextra[easy]" = "*"\n')
    [st] = bulkhead.install(str(pack), progress=lambda l: None, pip_args=["--no-index", "--find-links", wheels])
    assert st.ok, st
    out = subprocess.run([st.python, "-I", "-c", "import bhextra, bhplain; print(bhextra.VALUE, bhplain.VALUE)"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    assert out == "extra plain"


# --- 0.0.x's {var} substitution in requirement strings ---

COMFY_ENV_GIT = "https://github.com/PozzettiAndrea/comfy-env"


@pytest.fixture(scope="session")
def release_0_0_65():
    """comfy-env 0.0.65's package (no longer on PyPI), taken from the
    project's git history: $BULKHEAD_COMFY_ENV_GIT, a clone of it (this
    machine's tests reach PyPI and Debian only, so make check clones
    nothing: without it the test skips, saying how to run it); the folder
    holding its comfy_env, extracted once into build/comfy-env-releases."""
    from test_comfy_env import BUILD
    root = os.path.dirname(BUILD)
    site = os.path.join(root, "comfy-env-releases", "0.0.65", "src")
    if not os.path.isfile(os.path.join(site, "comfy_env", "env", "config_file.py")):
        repo = os.environ.get("BULKHEAD_COMFY_ENV_GIT")
        if not repo or not os.path.isdir(repo):
            pytest.skip(f"comfy-env 0.0.65 is on no registry: set BULKHEAD_COMFY_ENV_GIT to a clone of its history "
                        f"(git clone --bare {COMFY_ENV_GIT} <dir>) to compare with its reader")
        commit = subprocess.run(["git", "-C", repo, "log", "--all", "--reverse", "--format=%H", "-S",
                                 'version = "0.0.65"', "--", "pyproject.toml"], capture_output=True, text=True,
                                check=True).stdout.split()[0]
        os.makedirs(os.path.dirname(site), exist_ok=True)
        archive = subprocess.run(["git", "-C", repo, "archive", commit, "src/comfy_env"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", os.path.dirname(site)], input=archive, check=True)
    return site


OLD_SIMPLE = '''
[env]
name = "geom"
python = "{mm}"
[variables]
scatter = "2.1.2"
[packages]
requirements = ["trimesh>=4", "torch-scatter=={{scatter}}+pt{{pytorch_mm}}cu{{cuda_short}}"]
no_deps = ["torch-cluster==1.6.3+pt{{pytorch_short}}cu{{cuda_version}}"]
'''
OLD_CUDA_LIST = 'cuda = ["torch-scatter==2.1.2+pt{pytorch_mm}cu{cuda_short}", "spconv=={pytorch_version}"]\n'


@pytest.mark.parametrize("text", [OLD_SIMPLE.format(mm=HOST_MM), OLD_CUDA_LIST])
def test_old_var_substitution_expands_as_the_release_did(tmp_path, monkeypatch, release_0_0_65, text):
    """The release's own reader with its CUDA detection answering 12.8 (its
    torch for that: 2.8.0), and bulkhead's with a host torch 2.8.0+cu128."""
    p = write(tmp_path / "rel" / "comfy-env.toml", text)
    want = run_release(tmp_path, release_0_0_65, f"""
        import comfy_env.env.config_file as cf
        cf.detect_cuda_version = lambda: "12.8"
        c = cf.load_config({p!r})
        envs = list(c.envs.values())
        reqs = envs[0].requirements + envs[0].no_deps_requirements if envs else \\
            [k + ("==" + v if v else "") for k, v in c.local.cuda_packages.items()] + c.local.requirements
        print(json.dumps(reqs))
    """)
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0+cu128")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "12.8")
    c = bulkhead_config(tmp_path, text)
    assert sorted(c.requirements + c.cuda) == sorted(want), (c.requirements, c.cuda, want)
    assert not any("[variables]" in w for w in c.warnings), c.warnings


def test_an_old_var_with_no_value_here_names_file_line_and_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "none")
    with pytest.raises(PackConfigError) as ei:
        bulkhead_config(tmp_path, OLD_CUDA_LIST)
    e = str(ei.value)
    assert e.startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:1: 'torch-scatter==2.1.2+pt28cu{{cuda_short}}' names "
                        "{cuda_short}"), e
    assert "the host's torch has no CUDA" in e and "set it under [variables]" in e, e


def release_0_0_65_reqs(tmp_path, site, p):
    """0.0.65's load_config over the file at p: its environment's
    requirements and no_deps ones, and what [local] (or the simple shape
    with no environment) put into ComfyUI's own Python."""
    return run_release(tmp_path, site, f"""
        import comfy_env.env.config_file as cf
        cf.detect_cuda_version = lambda: "12.8"
        c = cf.load_config({p!r})
        envs = list(c.envs.values())
        reqs = envs[0].requirements + envs[0].no_deps_requirements if envs else []
        local = [k + ("==" + v if v else "") for k, v in c.local.cuda_packages.items()] + c.local.requirements
        print(json.dumps(dict(reqs=reqs, local=local)))
    """)


# --- 0.0.x's [cuda] winning over [packages] in the simple shape ---

@pytest.mark.parametrize("cuda", ['[cuda]\nnvdiffrast = "0.3.3"\n', 'cuda = ["nvdiffrast==0.3.3"]\n'])
def test_cuda_wins_over_packages_in_the_simple_shape_as_the_release_read_it(tmp_path, release_0_0_65, cuda):
    text = (cuda + f'[env]\nname = "geom"\npython = "{HOST_MM}"\n'
            '[packages]\nrequirements = ["trimesh>=4"]\nno_deps = ["bhplain"]\n')
    want = release_0_0_65_reqs(tmp_path, release_0_0_65, write(tmp_path / "rel" / "comfy-env.toml", text))
    c = bulkhead_config(tmp_path, text)
    assert sorted(c.requirements + c.cuda) == sorted(want["reqs"]) == ["nvdiffrast==0.3.3"], (c, want)
    [n] = [w for w in c.warnings if "[packages] is not read beside [cuda]" in w]
    assert n.startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:{cuda.count(chr(10)) + 4}: "), n


# --- 0.0.x's [local]: into the host's Python, by an install only ---

OLD_LOCAL = '[local.cuda]\nnvdiffrast = "0.4.0"\n[local.packages]\nrequirements = ["trimesh>=4"]\n'


def test_local_packages_are_read_as_the_release_read_them(tmp_path, release_0_0_65):
    want = release_0_0_65_reqs(tmp_path, release_0_0_65, write(tmp_path / "rel" / "comfy-env.toml", OLD_LOCAL))
    c = bulkhead_config(tmp_path, OLD_LOCAL)
    assert list(c.local) == want["local"] == ["nvdiffrast==0.4.0", "trimesh>=4"], (c.local, want)
    assert c.requirements == () and c.cuda == (), c


def test_install_puts_local_packages_into_the_host_and_the_start_names_the_command(tmp_path, monkeypatch, caplog):
    """The install (envs/build.py install, what ``bulkhead install`` and
    ``bulkhead.install()`` run) puts a [local] package, a wheel from a
    local folder, into the host's Python: here a throwaway venv standing
    for ComfyUI's; the environment's own build is stubbed.  A start where
    it is missing says the commands in one line and installs nothing."""
    from localsources import make_wheel
    from bulkhead.envs import build as envs
    from bulkhead.host import pack as hostpack
    wheels = tmp_path / "wheels"
    make_wheel(str(wheels), "bhlocalpkg", "1.0", {"bhlocalpkg/__init__.py": "VALUE = 'from [local]'\n"})
    pack = tmp_path / "ComfyUI-Local"
    write(pack / "nodes" / "comfy-env.toml", '[local.packages]\nrequirements = ["bhlocalpkg==1.0"]\n')
    [c] = packconfig.load_configs(str(pack), warn=False)

    with caplog.at_level("WARNING", logger="bulkhead"):
        hostpack.tell_local(str(pack), [c])
    [line] = [r.getMessage() for r in caplog.records if "[local]" in r.getMessage()]
    assert f"`{sys.executable} -m pip install 'bhlocalpkg==1.0'` or `bulkhead install {pack}`" in line, line

    host = tmp_path / "host"
    uv = interpreters.find_uv()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(host)] if uv else
                   [sys.executable, "-m", "venv", str(host)], check=True, env=interpreters.clean_env())
    host_py = str(host / "bin" / "python")
    monkeypatch.setattr(envs, "build", lambda config, progress, force, pip_args=None: config.name)
    lines = []
    assert envs.install(str(pack), lines.append, pip_args=["--no-index", "--find-links", str(wheels)],
                        host_python=host_py) == [c.name]
    said = [l for l in lines if l.startswith("[local]: installing")]
    assert said == [f"[local]: installing bhlocalpkg==1.0 into the host's Python ({host_py}) with "
                    f"{'uv pip' if uv else 'pip'}, as comfy-env 0.0.x installed them into ComfyUI's"], lines
    out = subprocess.run([host_py, "-c", "import bhlocalpkg; print(bhlocalpkg.VALUE)"], capture_output=True,
                         text=True, env=interpreters.clean_env())
    assert out.stdout.strip() == "from [local]", (out, lines)


# --- 0.0.x's no_deps, bare [packages] and packages = [...]: read as the release read them ---

OLD_SHAPES = {
    # [env] + [packages]: requirements with their dependencies, no_deps without, {var}s expanded in both
    "simple-no-deps": f'[env]\nname = "geom"\npython = "{HOST_MM}"\n[packages]\nrequirements = ["trimesh>=4"]\n'
                      'no_deps = ["torch-cluster==1.6.3+pt{pytorch_mm}cu{cuda_short}", "bhplain"]\n',
    # a top-level packages = [...]: its CUDA packages, as cuda = [...]
    "packages-list": 'packages = ["torch-scatter==2.1.2+pt{pytorch_mm}cu{cuda_short}", "spconv"]\n'
                     f'[env]\nname = "geom"\npython = "{HOST_MM}"\n',
    "packages-list-alone": 'packages = ["torch-scatter==2.1.2+pt{pytorch_mm}"]\n',
    # a bare [packages] without [env]: the simple shape's (the release: into ComfyUI's Python)
    "bare-packages": '[variables]\nscatter = "2.1.2"\n[packages]\n'
                     'requirements = ["trimesh>=4", "torch-scatter=={scatter}+pt{pytorch_mm}cu{cuda_short}"]\n'
                     'no_deps = ["bhplain"]\n',
    "bare-packages-cuda": '[packages]\nnvdiffrast = "0.3.3"\nspconv = "*"\n',
    # package = "version" beside requirements: not read there
    "plain-beside-requirements": f'[env]\nname = "geom"\npython = "{HOST_MM}"\n[packages]\n'
                                 'requirements = ["trimesh>=4"]\nnvdiffrast = "0.3.3"\n',
    # an environment table's no_deps: not read by that release
    "named-no-deps": f'[geom]\npython = "{HOST_MM}"\n[geom.packages]\nrequirements = ["trimesh>=4"]\n'
                     'no_deps = ["bhplain"]\n',
}


def release_0_0_65_split(tmp_path, site, p):
    """0.0.65's load_config over the file at p: what it installed with
    their dependencies and what without (its no_deps and CUDA packages,
    all installed with --no-deps), into its environment or, without one,
    into ComfyUI's own Python."""
    return run_release(tmp_path, site, f"""
        import comfy_env.env.config_file as cf
        cf.detect_cuda_version = lambda: "12.8"
        c = cf.load_config({p!r})
        envs = list(c.envs.values())
        if envs:
            out = dict(where="env", deps=envs[0].requirements + envs[0].linux_requirements,
                       no_deps=envs[0].no_deps_requirements)
        else:
            out = dict(where="local", deps=c.local.requirements,
                       no_deps=[k + ("==" + v if v else "") for k, v in c.local.cuda_packages.items()])
        print(json.dumps(out))
    """)


@pytest.mark.parametrize("name", sorted(OLD_SHAPES))
def test_old_no_deps_and_packages_shapes_read_as_the_release_did(tmp_path, monkeypatch, release_0_0_65, name):
    """What the release installed with its dependencies is bulkhead's
    requirements less its no_deps; what it installed without (its no_deps
    and CUDA packages) is bulkhead's no_deps and CUDA wheels.  Where the
    release made no environment (no [env] name or python) it installed
    them into ComfyUI's own Python, bulkhead into the pack's environment
    (docs/comfy-env-dialects.md: the simple shape's packages)."""
    text = OLD_SHAPES[name]
    want = release_0_0_65_split(tmp_path, release_0_0_65, write(tmp_path / "rel" / "comfy-env.toml", text))
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0+cu128")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "12.8")
    c = bulkhead_config(tmp_path, text)
    deps = sorted(set(c.requirements) - set(c.no_deps))
    assert (deps, sorted(c.no_deps + c.cuda)) == (sorted(want["deps"]), sorted(want["no_deps"])), (c, want)
    assert c.local == () and not any("not implemented" in w or "is not read by bulkhead" in w
                                     for w in c.warnings), c.warnings
    if name == "named-no-deps":
        [n] = [w for w in c.warnings if "no_deps is not read" in w]
        assert n.startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:5: [geom.packages] no_deps is not read, as "
                            "comfy-env 0.0.x read no_deps only in the simple shape") and "bhplain" in n, n
    if name == "plain-beside-requirements":
        [n] = [w for w in c.warnings if "nvdiffrast: not read beside requirements" in w]
        assert n.startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:6: "), n


def test_no_deps_change_the_environment_hash(tmp_path):
    with_deps = bulkhead_config(tmp_path, '[env]\nname = "g"\n[packages]\nrequirements = ["bhplain"]\n')
    without = bulkhead_config(tmp_path, '[env]\nname = "g"\n[packages]\nno_deps = ["bhplain"]\n')
    assert with_deps.requirements == without.requirements == ("bhplain",) and without.no_deps == ("bhplain",)
    assert with_deps.config_hash != without.config_hash


def test_a_var_in_an_environment_table_names_file_line_and_fix(tmp_path, monkeypatch, release_0_0_65):
    """The release left a {var} in an environment table as written (pip
    then refused the requirement); bulkhead says so at its line, with the
    version written out for this host."""
    text = (f'[geom]\npython = "{HOST_MM}"\n[geom.packages]\n'
            'requirements = ["trimesh>=4", "torch-scatter==2.1.2+pt{pytorch_mm}cu{cuda_short}"]\n')
    want = release_0_0_65_split(tmp_path, release_0_0_65, write(tmp_path / "rel" / "comfy-env.toml", text))
    assert "torch-scatter==2.1.2+pt{pytorch_mm}cu{cuda_short}" in want["deps"], want
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0+cu128")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "12.8")
    with pytest.raises(PackConfigError) as ei:
        bulkhead_config(tmp_path, text)
    e = str(ei.value)
    assert e.startswith(f"{tmp_path}/bh/nodes/comfy-env.toml:4: 'torch-scatter==2.1.2+pt{{pytorch_mm}}cu{{cuda_short}}' "
                        "names {pytorch_mm}: comfy-env 0.0.x expanded {var}s only in the simple shape"), e
    assert "handed the text to pip as written" in e and "(on this host: 'torch-scatter==2.1.2+pt28cu128')" in e, e


def test_no_deps_requirements_are_installed_without_their_dependencies(tmp_path):
    """A 0.0.x simple shape's no_deps requirement is installed without its
    dependency, as that release ran ``pip install --no-deps``, while a
    requirement beside it gets its own; every wheel, the dependency
    included, is in the one folder pip looks in.  The build's log says
    which run installed them."""
    import bulkhead
    from localsources import make_wheel
    wheels = str(tmp_path / "wheels")
    make_wheel(wheels, "bhnodeps", "1.0", {"bhnodeps/__init__.py": "VALUE = 'no deps'\n"}, "Requires-Dist: bhdepa\n")
    make_wheel(wheels, "bhwithdeps", "1.0", {"bhwithdeps/__init__.py": "VALUE = 'with deps'\n"},
               "Requires-Dist: bhdepb\n")
    make_wheel(wheels, "bhdepa", "1.0", {"bhdepa/__init__.py": ""})
    make_wheel(wheels, "bhdepb", "1.0", {"bhdepb/__init__.py": ""})
    pack = tmp_path / "ComfyUI-NoDeps"
    write(pack / "nodes" / "comfy-env.toml", f'[env]\nname = "nodeps"\npython = "{HOST_MM}"\n[packages]\n'
                                             'requirements = ["bhwithdeps"]\nno_deps = ["bhnodeps==1.0"]\n')
    lines = []
    [st] = bulkhead.install(str(pack), progress=lines.append, pip_args=["--no-index", "--find-links", wheels])
    assert st.ok, st
    out = subprocess.run([st.python, "-I", "-c", "import importlib.metadata as m, json\nout = {}\n"
                          "for n in ('bhnodeps', 'bhdepa', 'bhwithdeps', 'bhdepb'):\n"
                          "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\n"
                          "print(json.dumps(out))"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert json.loads(out) == {"bhnodeps": "1.0", "bhdepa": None, "bhwithdeps": "1.0", "bhdepb": "1.0"}, out
    [said] = [l for l in lines if "without their dependencies" in l]
    assert said == ("installing 1 no_deps requirement(s) without their dependencies (--no-deps, as comfy-env "
                    "0.0.x installed them): bhnodeps==1.0"), lines


def test_install_takes_local_cuda_wheels_from_the_cuda_wheel_index(tmp_path, monkeypatch):
    """[local.cuda] names CUDA wheels, which comfy-env 0.0.x took from its
    wheel sources for the machine's torch and installed without their
    dependencies into ComfyUI's Python: the install takes the build for
    the host's torch from the CUDA wheel index (here torch 2.5.1 with
    CUDA 12.4), never a same-named wheel from pip's indexes (one is in the
    find-links folder), and installs it into the host's Python (a
    throwaway venv here); [local.packages] beside it from pip's."""
    from localsources import make_cuda_index, make_wheel
    from bulkhead.envs import build as envs
    monkeypatch.setenv("BULKHEAD_CUDA_INDEX", make_cuda_index(tmp_path))
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.5.1")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "12.4")
    wheels = tmp_path / "wheels"
    make_wheel(str(wheels), "bh_cudaext", "1.0", {"bh_cudaext/__init__.py": "VALUE = \"pip's index\"\n"})
    make_wheel(str(wheels), "bhlocalpkg", "1.0", {"bhlocalpkg/__init__.py": "VALUE = 'from [local]'\n"})
    pack = tmp_path / "ComfyUI-LocalCuda"
    write(pack / "nodes" / "comfy-env.toml",
          '[local.cuda]\nbh_cudaext = "1.0"\n[local.packages]\nrequirements = ["bhlocalpkg==1.0"]\n')
    [c] = packconfig.load_configs(str(pack), warn=False)
    assert c.local_cuda == ("bh_cudaext==1.0",) and c.local == ("bh_cudaext==1.0", "bhlocalpkg==1.0"), c
    host = tmp_path / "host"
    uv = interpreters.find_uv()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(host)] if uv else
                   [sys.executable, "-m", "venv", str(host)], check=True, env=interpreters.clean_env())
    host_py = str(host / "bin" / "python")
    monkeypatch.setattr(envs, "build", lambda config, progress, force, pip_args=None: config.name)
    lines = []
    envs.install(str(pack), lines.append, pip_args=["--no-index", "--find-links", str(wheels)], host_python=host_py)
    out = subprocess.run([host_py, "-c", "import bh_cudaext, bhlocalpkg; print(bh_cudaext.VALUE, bhlocalpkg.VALUE)"],
                         capture_output=True, text=True, env=interpreters.clean_env())
    assert out.stdout.strip() == "cu124torch2.5 from [local]", (out, lines)
    [picked] = [l for l in lines if l.startswith("[local.cuda] bh_cudaext==1.0: bh_cudaext-1.0+cu124torch2.5-")]
    [said] = [l for l in lines if l.startswith("[local.cuda]: installing bh_cudaext @ ")]
    assert said.endswith(f"into the host's Python ({host_py}) with {'uv pip' if uv else 'pip'}, without their "
                         "dependencies, from the CUDA wheel index, as comfy-env 0.0.x installed them into ComfyUI's"), said
