"""Every public name a comfy-env release exported, under bulkhead's routed
``comfy_env``: there (served, or refused by a callable that raises a
RuntimeError naming the release and the fix, never an ImportError a
pack's ``except ImportError`` would swallow), with and without the real
comfy-env installed beside bulkhead; the served ones answer as the
release answered (its own code, run here, is the oracle where it runs
without its dependencies); comfy-env's internal module spellings
(``comfy_env.isolation.workers._ipc_shared.register_serializer``); and the
user's old switches (COMFY_ENV_ISOLATE, USE_COMFY_ENV,
COMFY_ENV_AUTO_INSTALL).

The releases are fetched from PyPI once into build/comfy-env-releases (a
wheel is data: its code is read, or run in a child with ``tomli`` standing
for ``tomllib``, never committed); without PyPI those tests skip.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

import bulkhead
from localsources import PY_TAG, make_cuda_index, write
from test_comfy_env import BUILD, HOST_MM, host, node_module

PY_PATH = os.path.dirname(os.path.dirname(os.path.abspath(bulkhead.__file__)))
RELEASES = ("0.3.0", "0.4.22", "0.4.46")     # the widest surface (0.4.22) and the two ends PyPI serves


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    for v in ("COMFY_ENV_ROOT", "BULKHEAD_COMFY_ENV", "COMFY_ENV_ISOLATE", "USE_COMFY_ENV", "COMFY_ENV_AUTO_INSTALL"):
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="session")
def releases():
    """{version: folder holding that release's comfy_env package}, fetched
    with pip once (kept in build/comfy-env-releases)."""
    root = os.path.join(os.path.dirname(BUILD), "comfy-env-releases")
    out = {}
    for v in RELEASES:
        d = os.path.join(root, v)
        if not os.path.isfile(os.path.join(d, "comfy_env", "__init__.py")):
            dl = os.path.join(root, "wheels")
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                                "-d", dl, f"comfy-env=={v}"], capture_output=True, text=True, timeout=180)
            wheel = os.path.join(dl, f"comfy_env-{v}-py3-none-any.whl")
            if r.returncode != 0 or not os.path.isfile(wheel):
                pytest.skip(f"comfy-env {v} could not be fetched from PyPI: {r.stderr[-500:]}")
            with zipfile.ZipFile(wheel) as z:
                z.extractall(d, [n for n in z.namelist() if n.startswith("comfy_env/")])
        out[v] = d
    return out


def exported(site):
    """The names a release's ``__init__.py`` exports (its ``__all__`` and
    the PEP 562 signposts of names it used to), read, not imported."""
    tree = ast.parse(open(os.path.join(site, "comfy_env", "__init__.py"), encoding="utf-8").read())
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) in ("__all__", "_INTERNAL") for t in n.targets):
            v = n.value
            names |= {e.value for e in (v.elts if isinstance(v, (ast.List, ast.Tuple)) else v.keys)}
    return names


def routed(tmp_path, code, site=None, env=None):
    """code run in a fresh interpreter after bulkhead routed comfy_env
    (route(), as ComfyUI's prestartup does), with site -- a folder holding
    a real comfy_env -- first on sys.path; returns its printed JSON."""
    code = textwrap.dedent(f"""
        import io, json, logging, sys
        sys.path.insert(0, {str(site or tmp_path / 'no-site')!r})
        buf = io.StringIO()
        logging.getLogger("bulkhead").addHandler(logging.StreamHandler(buf))
        logging.getLogger("bulkhead").setLevel(logging.INFO)
        from bulkhead.host import comfy_env as served
        served.route()
    """) + textwrap.dedent(code)
    e = dict(os.environ, PYTHONPATH=PY_PATH)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=str(tmp_path),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


IMPORT_EACH = """
    out = {}
    for n in NAMES:
        try:
            exec(f"from comfy_env import {n}")
            out[n] = "ok"
        except BaseException as e:
            out[n] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
"""


@pytest.mark.parametrize("real", [None, "0.4.46", "0.4.22"])
def test_every_name_a_release_exported_imports(tmp_path, releases, real):
    """A pack's `from comfy_env import X` for every X of every release
    (the releases' own export lists, and the older ones read from their
    sources: legacy.NAMES), with no comfy-env, or a real release
    installed beside bulkhead."""
    from bulkhead.host import comfy_env_legacy as legacy
    names = set(legacy.NAMES)
    for site in releases.values():
        names |= exported(site)
    r = routed(tmp_path, f"NAMES = {sorted(names)!r}\n" + textwrap.dedent(IMPORT_EACH),
               site=releases[real] if real else None)
    assert {n: v for n, v in r.items() if v != "ok"} == {}


@pytest.mark.parametrize("real", [False, True])
def test_a_name_the_real_package_lacks_is_no_unknown_location(tmp_path, real):
    """The reported symptom: with a real comfy-env of another era beside
    bulkhead, `from comfy_env import wrap_isolated_nodes` raised
    `ImportError ... (unknown location)`; now it is bulkhead's."""
    site = tmp_path / "site"
    if real:
        write(site / "comfy_env" / "__init__.py", "def register_nodes():\n    return 'real'\n")
    r = routed(tmp_path, """
        from comfy_env import wrap_isolated_nodes, wrap_nodes, register_serializer
        print(json.dumps([wrap_isolated_nodes is served.wrap_isolated_nodes, wrap_nodes is served.wrap_nodes,
                          register_serializer is served.register_serializer]))
    """, site=site)
    assert r == [True, True, True]


def test_refused_names_raise_naming_the_release_and_the_fix():
    """A refused name is importable; using it raises NameRefused (a
    RuntimeError, so a pack's `except ImportError` does not hide it) that
    names the releases that had it and the switch back to the real one."""
    from bulkhead.host import comfy_env_legacy as legacy
    refused = sorted(n for n in legacy.NAMES if n in legacy._WHY)
    assert {"SubprocessWorker", "Worker", "isolated", "PIXI", "get_gpu_summary"} <= set(refused)
    for n in refused:
        v = legacy.value(n)
        with pytest.raises(legacy.NameRefused) as e:
            if n in ("PIXI", "CACHE_DIR", "MARKER_FILE"):   # path constants: any use as a path
                os.fspath(v)
            else:
                v()
        msg = str(e.value)
        assert not isinstance(e.value, ImportError)
        assert f"comfy_env.{n} (exported by comfy-env {legacy.NAMES[n]})" in msg and "BULKHEAD_COMFY_ENV=off" in msg, msg
    assert isinstance(legacy.value("SubprocessWorker"), type)       # `except`/isinstance uses still work
    assert issubclass(legacy.value("WorkerError"), Exception)


CONFIG = '''
python = "{mm}"

[cuda]
packages = ["bh-cudaext"]

[env_vars]
OMP_NUM_THREADS = "1"
BH_FLAG = "x"

[pypi-dependencies]
numpy = ">=1.20"
'''


def run_release(tmp_path, site, code):
    """code run against a real release's own modules (tomli is tomllib)."""
    code = textwrap.dedent(f"""
        import json, sys, tomllib, types
        sys.modules["tomli"] = tomllib
        # the package without its __init__, which imports every layer and
        # their dependencies: only the modules the code names run
        pkg = types.ModuleType("comfy_env")
        pkg.__path__ = [{os.path.join(str(site), "comfy_env")!r}]
        sys.modules["comfy_env"] = pkg
    """) + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), timeout=120,
                       env=dict(os.environ, PYTHONPATH=""))
    if r.returncode != 0:
        pytest.skip(f"the release's own code does not run here: {r.stderr[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_load_config_and_discover_config_answer_as_the_release(tmp_path, releases):
    pack = tmp_path / "ComfyUI-Conf"
    write(pack / "__init__.py", "")
    write(pack / "nodes" / "__init__.py", "")
    write(pack / "nodes" / "comfy-env.toml", CONFIG.format(mm=HOST_MM))
    write(pack / "comfy-env-root.toml", '[node_reqs]\nComfyUI-Other = { github = "a/b" }\n[types]\nMESH = "custom"\n')
    code = f"""
        from comfy_env.config import load_config, discover_config
        c = load_config({str(pack / 'nodes' / 'comfy-env.toml')!r})
        r = discover_config({str(pack)!r})
        none = discover_config({str(tmp_path)!r})
        print(json.dumps(dict(python=c.python, cuda=c.cuda_packages, env=c["env_vars"], has_cuda=c.has_cuda,
                              pypi=sorted(c.pixi_passthrough.get("pypi-dependencies", {{}})),
                              reqs=[q["name"] for q in r.node_reqs], types=r.types, none=none)))
    """
    want = run_release(tmp_path, releases["0.4.22"], code)
    got = routed(tmp_path, code)
    assert got == want


def test_detect_cuda_version_is_the_host_torch_build(tmp_path):
    torch = pytest.importorskip("torch")
    r = routed(tmp_path, """
        from comfy_env import detect_cuda_version, has_nvidia_gpu, get_cuda_torch_mapping
        print(json.dumps([detect_cuda_version(), has_nvidia_gpu(), get_cuda_torch_mapping()]))
    """)
    cuda = ".".join(torch.version.cuda.split(".")[:2]) if torch.version.cuda else None
    tv = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert r == [cuda, cuda is not None, {cuda: tv} if cuda else {}]


@pytest.fixture
def served_index(tmp_path):
    """The local CUDA wheel index served over HTTP (comfy-env reads an
    index's <package>/ page as a web server gives it)."""
    import functools
    import http.server
    import threading
    index = make_cuda_index(tmp_path)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=index)
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()
    srv.server_close()
    t.join()


@pytest.mark.parametrize("torch_v, cuda_v", [("2.8.0", "12.8"), ("2.5.1", "12.4"), ("2.8.0", "11.8")])
def test_get_wheel_url_answers_as_the_release(tmp_path, releases, served_index, torch_v, cuda_v):
    """The same local index put to the release's get_wheel_url (its
    CUDA_WHEELS_INDEX pointed there; its fallback to GitHub's API for its
    own index off) and to bulkhead's."""
    code = f"""
        import comfy_env.packages.cuda_wheels as cw
        cw.CUDA_WHEELS_INDEX = {served_index!r}
        cw._fetch_from_github_api = lambda *a, **k: None
        print(json.dumps(cw.get_wheel_url("bh-cudaext", {torch_v!r}, {cuda_v!r}, {HOST_MM!r})))
    """
    want = run_release(tmp_path, releases["0.4.22"], code)
    got = routed(tmp_path, f"""
        from comfy_env import get_wheel_url
        print(json.dumps(get_wheel_url("bh-cudaext", {torch_v!r}, {cuda_v!r}, {HOST_MM!r})))
    """, env={"BULKHEAD_CUDA_INDEX": served_index})
    assert got == want
    assert (got is None) == (cuda_v == "11.8"), got


# --- comfy-env's internal spelling of register_serializer ---

INTERNAL_SERIALIZATION = '''
from comfy_env.isolation.workers._ipc_shared import register_serializer

def serialize(obj, recurse):
    return {"v": obj.v}

def deserialize(payload, recurse):
    return payload

register_serializer("Thing", serialize, deserialize, tag="BH_THING")
'''

REAL_IPC_SHARED = '''
def register_serializer(type_name, serialize, deserialize=None, tag=None):
    raise SystemExit("the real comfy-env's register_serializer ran")
'''


def fake_real_comfy_env(site):
    """A real comfy-env beside bulkhead, its internal module included."""
    write(site / "comfy_env" / "__init__.py", "from .isolation.workers._ipc_shared import register_serializer\n")
    write(site / "comfy_env" / "isolation" / "__init__.py", "")
    write(site / "comfy_env" / "isolation" / "workers" / "__init__.py", "")
    write(site / "comfy_env" / "isolation" / "workers" / "_ipc_shared.py", REAL_IPC_SHARED)


@pytest.mark.parametrize("real", [False, True])
def test_the_internal_register_serializer_spelling_is_bulkheads_in_the_host(tmp_path, real):
    pack = tmp_path / "ComfyUI-Internal"
    write(pack / "comfy-env-root.toml", '[types]\nBH_THING = "custom"\n')
    write(pack / "serialization.py", INTERNAL_SERIALIZATION)
    site = tmp_path / "site"
    if real:
        fake_real_comfy_env(site)
    r = routed(tmp_path, f"""
        from bulkhead.envs import rootconfig
        served._load_serializers({str(pack)!r}, rootconfig.load_root({str(pack)!r}, warn=False))
        print(json.dumps(sorted(served.SERIALIZERS)))
    """, site=site)
    assert r == ["BH_THING"]


@pytest.mark.parametrize("real", [False, True])
def test_the_internal_register_serializer_spelling_in_a_worker(tmp_path, real):
    """A worker runs the same file with worker/typed.py's registry standing
    for every spelling, the real comfy-env in its environment or not."""
    write(tmp_path / "serialization.py", INTERNAL_SERIALIZATION)
    site = tmp_path / "site"
    if real:
        fake_real_comfy_env(site)
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        from bulkhead.worker import typed
        typed._run_file("ComfyUI-Internal", {str(tmp_path / 'serialization.py')!r})
        print(json.dumps([sorted(typed._by_tag), "comfy_env" in sys.modules]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PY_PATH))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [["BH_THING"], False]


# --- wrap_isolated_nodes, wrap_nodes, and the old switches, in a ComfyUI host ---

GUARDED_WRAP_ISOLATED = '''
from pathlib import Path
NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
from .nodes.main import NODE_CLASS_MAPPINGS as main_nodes
NODE_CLASS_MAPPINGS.update(main_nodes)
try:
    from comfy_env import wrap_isolated_nodes
    from .nodes.isolated import NODE_CLASS_MAPPINGS as isolated_nodes
    NODE_CLASS_MAPPINGS.update(wrap_isolated_nodes(isolated_nodes, Path(__file__).parent / "nodes" / "isolated"))
except ImportError:
    print("comfy-env not installed, isolated nodes disabled")
'''

GUARDED_WRAP_NODES = '''
from .nodes.main import NODE_CLASS_MAPPINGS as _main
from .nodes.isolated import NODE_CLASS_MAPPINGS as _iso
NODE_CLASS_MAPPINGS = dict(_main, **_iso)
NODE_DISPLAY_NAME_MAPPINGS = {}
try:
    from comfy_env import wrap_nodes
    wrap_nodes()
except ImportError:
    print("comfy-env not installed, isolated nodes disabled")
'''


def wrap_pack(root, name, init):
    pack = root / name
    write(pack / "__init__.py", init)
    write(pack / "nodes" / "__init__.py", "")
    write(pack / "nodes" / "main" / "__init__.py", node_module(f"{name[8:]}Main", "'main'"))
    write(pack / "nodes" / "isolated" / "__init__.py",
          node_module(f"{name[8:]}Iso", "__import__('json').dumps([x, x * 2, sys.version_info[:2]])"))
    write(pack / "nodes" / "isolated" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    return pack


RUN_BOTH = """
    import importlib
    out = {}
    for p, key, sub in KEYS:
        cls = mods[p].NODE_CLASS_MAPPINGS[key]
        real = getattr(importlib.import_module(mods[p].__name__ + "." + sub), key)     # the pack's own class
        out[key] = dict(proxy="_bulkhead_pack" in vars(cls), isolated=run(p, key, x=5),
                        in_process=list(getattr(real(), real.FUNCTION)(x=5)))
    emit(dict(me=os.getpid(), nodes=out, log=buf.getvalue()))
"""


@pytest.mark.torch
@pytest.mark.parametrize("real", [False, True])
def test_wrap_isolated_nodes_and_wrap_nodes_run_the_nodes_isolated(tmp_path, real):
    """Packs of comfy-env 0.1.x-0.2.18, their import guarded as in the
    field: their isolated nodes load and run in a worker under their
    environment, their main nodes in the host, as comfy-env ran them; the
    value a node returns is the one the same class returns in-process
    (but for the interpreter it reports)."""
    a = wrap_pack(tmp_path, "ComfyUI-WrapIso", GUARDED_WRAP_ISOLATED)
    b = wrap_pack(tmp_path, "ComfyUI-WrapAll", GUARDED_WRAP_NODES)
    for p in (a, b):
        [st] = bulkhead.install(str(p), progress=lambda l: None)
        assert st.ok, st
    env = {}
    if real:
        fake_real_comfy_env(tmp_path / "site")
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(BUILD, "python"), str(tmp_path / "site")])
    keys = [("ComfyUI-WrapIso", "WrapIsoIso", "nodes.isolated"), ("ComfyUI-WrapIso", "WrapIsoMain", "nodes.main"),
            ("ComfyUI-WrapAll", "WrapAllIso", "nodes.isolated"), ("ComfyUI-WrapAll", "WrapAllMain", "nodes.main")]
    r = host(tmp_path, [a, b], f"KEYS = {keys!r}\n" + textwrap.dedent(RUN_BOTH), env=env)
    assert "isolated nodes disabled" not in r["log"], r["log"][-3000:]
    for p, key, _ in keys:
        n = r["nodes"][key]
        assert n["isolated"][1] == n["in_process"][1], (key, n)         # the same answer both ways
        assert n["in_process"][0] == r["me"]
        if key.endswith("Iso"):
            assert n["proxy"] and n["isolated"][0] != r["me"], (key, n)     # ran in a worker
        else:
            assert not n["proxy"] and n["isolated"][0] == r["me"], (key, n)     # the main nodes stay in the host
    served = [l for l in r["log"].splitlines() if "is served by bulkhead" in l]
    assert any("wrap_isolated_nodes" in l for l in served) and any("wrap_nodes" in l for l in served), served


@pytest.mark.torch
@pytest.mark.parametrize("var", ["COMFY_ENV_ISOLATE", "USE_COMFY_ENV"])
def test_the_users_old_off_switch_runs_the_packs_in_process_said_once(tmp_path, var):
    """COMFY_ENV_ISOLATE=0 (comfy-env 0.2.31-0.4.24) and USE_COMFY_ENV=0
    (0.1.x-0.2.30) ran the packs in ComfyUI's process: so does bulkhead,
    for register_nodes and wrap_isolated_nodes alike, with one line."""
    a = wrap_pack(tmp_path, "ComfyUI-OffIso", GUARDED_WRAP_ISOLATED)
    b = tmp_path / "ComfyUI-OffReg"
    write(b / "__init__.py", "from comfy_env import register_nodes\n"
                             "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()\n")
    write(b / "nodes" / "__init__.py", node_module("OffRegNode", "'reg'"))
    write(b / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    r = host(tmp_path, [a, b], """
        from bulkhead.host import states
        emit(dict(me=os.getpid(), iso=run("ComfyUI-OffIso", "OffIsoIso"), reg=run("ComfyUI-OffReg", "OffRegNode"),
                  states=[(s["name"], s["state"]) for s in states.pack_states()], log=buf.getvalue()))
    """, env={var: "0", "BULKHEAD_BUILD_AT_START": "0"})
    assert r["iso"][0] == r["me"] and r["reg"] == [r["me"], "reg"]
    said = [l for l in r["log"].splitlines() if f"{var}=0" in l]
    assert len(said) == 1 and "in ComfyUI's process" in said[0] and f"Unset {var}" in said[0], r["log"][-3000:]
    assert ("ComfyUI-OffReg", "in-process") in [tuple(s) for s in r["states"]], r["states"]
    assert "NOT isolated: " not in r["log"].replace(said[0], "")


@pytest.mark.parametrize("value, own, expect", [
    ("1", None, "bulkhead does that anyway"),
    ("1", "0", "BULKHEAD_BUILD_AT_START=0 is set and wins"),
    ("0", None, "COMFY_ENV_AUTO_INSTALL=0 is not read"),
])
def test_comfy_env_auto_install_is_said_once(tmp_path, value, own, expect):
    env = {"COMFY_ENV_AUTO_INSTALL": value}
    if own is not None:
        env["BULKHEAD_BUILD_AT_START"] = own
    r = routed(tmp_path, """
        import comfy_env
        served.route()
        print(json.dumps(buf.getvalue()))
    """, env=env)
    lines = [l for l in r.splitlines() if "COMFY_ENV_AUTO_INSTALL" in l]
    assert len(lines) == 1 and expect in lines[0], r


HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "python", "_bulkhead_comfy_env.py")


@pytest.mark.parametrize("real", [False, True])
def test_the_start_hook_serves_the_internal_spelling_before_bulkheads_prestartup(tmp_path, real):
    """A pack sorting before bulkhead imports register_serializer by its
    internal path before bulkhead's prestartup step has routed anything:
    the .pth hook answers the submodule as it answers comfy_env."""
    site = tmp_path / "site"
    if real:
        fake_real_comfy_env(site)
    code = textwrap.dedent(f"""
        import importlib.util, sys, types
        sys.path.insert(0, {str(site)!r})
        spec = importlib.util.spec_from_file_location("_bulkhead_comfy_env", {HOOK!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        sys.modules["folder_paths"] = types.ModuleType("folder_paths")
        from comfy_env.isolation.workers._ipc_shared import register_serializer
        from bulkhead.host import comfy_env as served
        print(register_serializer is served.register_serializer)
    """)
    env = dict(os.environ, PYTHONPATH=PY_PATH)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True", (r.stdout, r.stderr)
