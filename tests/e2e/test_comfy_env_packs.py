"""Two packs in comfy-env's current layout, unmodified, in a ComfyUI where
bulkhead was installed as ComfyUI-Manager installs it, driven over HTTP:
`register_nodes()` in `__init__.py`, `nodes/comfy-env.toml` with PyPI
dependencies of every kind (index, git, url, path, plain), a target
table, an integer env var, a conda dependency from a local channel and a
`[cuda]` package from a local CUDA-wheel index, and a custom type made by
one pack and consumed by the other (comfy-env-root.toml `[types]`,
a pack's serialization.py).  The packs are copied into custom_nodes/ as `git
clone` puts them there, no install step: their environments are built
in the background as ComfyUI starts (pack._build_in_background), from local
sources only."""

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from localsources import HOST_MM, make_channel, make_cuda_index, make_sources, make_wheel, write  # noqa: E402

INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''

SERIALIZATION = '''
from comfy_env import register_serializer

def serialize(mesh, recurse):
    return {"vertices": mesh.vertices, "name": mesh.name}

def deserialize(payload, recurse):
    import bhmesh
    return bhmesh.Mesh(payload["vertices"], payload["name"])

register_serializer("Mesh", serialize, deserialize, tag="E2E_MESH")
'''

GEO_ENV = '''
python = "{mm}"

[workspace]
channels = ["{channel}"]

[dependencies]
bhtool = "1.2.*"

[pypi-dependencies]
numpy = "*"
bhmesh = "*"
bhplain = "==1.0"
bhindexed = {{ version = ">=4", index = "{index}" }}
bhurl = {{ url = "file://{url}" }}
bhpath = {{ path = "{path}" }}

[pypi-dependencies.bhgit]
git = "file://{git}"
tag = "v1"

[target.{here}.pypi-dependencies]
bhplain = "*"

[cuda]
packages = ["bh-cudaext"]

[env_vars]
BH_E2E_INT = 3
'''

GEO_NODES = '''
import os, subprocess
import numpy as np
import bhmesh


class E2EDeps:
    """What each dependency gives, seen from the worker."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/comfy-env"

    def run(self):
        import bhplain, bhindexed, bhurl, bhpath, bhgit, bhconda, bh_cudaext
        tool = subprocess.run(["bhtool"], capture_output=True, text=True).stdout.split()[:2]
        return {"ui": {"deps": [bhplain.VALUE, bhindexed.VALUE, bhurl.VALUE, bhpath.VALUE, bhgit.VALUE,
                                bhconda.VALUE, " ".join(tool), bh_cudaext.VALUE],
                       "int": [os.environ["BH_E2E_INT"]], "pid": [os.getpid()]}}


class E2EMakeMesh:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3})}}
    RETURN_TYPES = ("E2E_MESH",)
    FUNCTION = "run"
    CATEGORY = "e2e/comfy-env"

    def run(self, n):
        return (bhmesh.Mesh(np.arange(n * 3, dtype=np.float32).reshape(n, 3), "made in %d" % os.getpid()),)


NODE_CLASS_MAPPINGS = {"E2EDeps": E2EDeps, "E2EMakeMesh": E2EMakeMesh}
NODE_DISPLAY_NAME_MAPPINGS = {"E2EDeps": "E2E dependencies"}
'''

USE_NODES = '''
import os
import bhmesh


class E2EUseMesh:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mesh": ("E2E_MESH",)}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/comfy-env"

    def run(self, mesh):
        return {"ui": {"type": [type(mesh).__module__ + "." + type(mesh).__name__],
                       "total": [float(mesh.vertices.sum())], "name": [mesh.name], "pid": [os.getpid()]}}


NODE_CLASS_MAPPINGS = {"E2EUseMesh": E2EUseMesh}
'''


@pytest.fixture
def comfy_env_packs(tmp_path):
    """The two packs, written as their repositories hold them, and the
    server environment that points bulkhead's builds at local sources."""
    pytest.importorskip("rattler.index", reason="py-rattler (make check-py installs it)")
    import torch
    src = make_sources(tmp_path)
    channel = make_channel(tmp_path)
    torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    cuda = make_cuda_index(tmp_path, locals_=(f"cputorch{torch_mm}",))   # this host's torch is a CPU build
    make_wheel(src["wheels"], "bhmesh", "1.0", {"bhmesh/__init__.py": (
        "class Mesh:\n    def __init__(self, vertices, name):\n        self.vertices, self.name = vertices, name\n")})
    from bulkhead.envs import config as packconfig
    packs = tmp_path / "repos"
    geo, use = packs / "ComfyUI-GeoE2E", packs / "ComfyUI-UseE2E"
    for pack, nodes, root in ((geo, GEO_NODES, ""), (use, USE_NODES, '[node_packs]\nComfyUI-GeoE2E = "x/y"\n')):
        write(pack / "__init__.py", INIT)
        write(pack / "comfy-env-root.toml", root + '[types]\nE2E_MESH = "custom"\n')
        write(pack / "serialization.py", SERIALIZATION)
        write(pack / "nodes" / "__init__.py", nodes)
    write(geo / "nodes" / "comfy-env.toml", GEO_ENV.format(
        mm=HOST_MM, channel=channel, index=src["index"], url=src["url"], path=src["path"], git=src["git"],
        here=packconfig.current_platform()))
    write(use / "nodes" / "comfy-env.toml", textwrap.dedent(f'''
        python = "{HOST_MM}"
        [pypi-dependencies]
        numpy = "*"
        bhmesh = "*"
    '''))
    env = {"BULKHEAD_PIP_ARGS": f"--find-links {src['wheels']}", "BULKHEAD_CUDA_INDEX": cuda}
    return [str(geo), str(use)], env


def test_comfy_env_packs_run_unmodified_after_a_manager_install(comfyui, manager_install, comfy_env_packs):
    pack_dirs, env = comfy_env_packs
    srv = comfyui(packs=(), pack_dirs=pack_dirs, installed=manager_install, env=env)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    for name in ("ComfyUI-GeoE2E", "ComfyUI-UseE2E"):
        assert f"pack {name!r}: its environment is not built; building it in the background" in log, log
    assert "comfy_env.register_nodes is served by bulkhead" in log
    assert "NOT isolated" not in log, log
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    assert info["E2EDeps"]["display_name"] == "E2E dependencies"
    assert info["E2EUseMesh"]["input"]["required"]["mesh"][0] == "E2E_MESH"
    prompt_id = srv.queue({"1": {"class_type": "E2EDeps", "inputs": {}},
                           "2": {"class_type": "E2EMakeMesh", "inputs": {"n": 3}},
                           "3": {"class_type": "E2EUseMesh", "inputs": {"mesh": ["2", 0]}}})
    entry = srv.wait_history(prompt_id, timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    deps, used = entry["outputs"]["1"], entry["outputs"]["3"]
    assert deps["deps"] == ["plain", "from the index", "from a url", "from a path", "from git v1", "conda 1.2",
                            "bhtool 1.2", f"cputorch{'.'.join(__import__('torch').__version__.split('.')[:2])}"], deps
    assert deps["int"] == ["3"]
    # the custom type crossed from one pack's worker to the other's as the object itself
    assert used["type"] == ["bhmesh.Mesh"] and used["total"] == [36.0]
    made_in = int(used["name"][0].split()[-1])
    pids = {deps["pid"][0], used["pid"][0], made_in, srv.proc.pid}
    assert made_in == deps["pid"][0] and len(pids) == 3, (pids, srv.proc.pid)


# --- packs of comfy-env 0.1.x-0.2.18: wrap_isolated_nodes / wrap_nodes ---

WRAP_ISOLATED_INIT = '''
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

WRAP_NODES_INIT = '''
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

WRAP_NODE = '''
import os


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"n": ("INT", {{"default": 3}})}}}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/comfy-env-wrap"

    def run(self, n):
        return {{"ui": {{"pid": [os.getpid()], "value": [n, n * n, "{cls}" * n]}}}}


NODE_CLASS_MAPPINGS = {{"{cls}": {cls}}}
'''


def in_process(cls, n):
    """What the node returns run in this process: the answer it must give
    isolated too (its pid aside)."""
    ns = {}
    exec(WRAP_NODE.format(cls=cls), ns)
    return ns[cls]().run(n=n)["ui"]["value"]


def test_wrap_isolated_nodes_and_wrap_nodes_packs_load_isolated(comfyui, manager_install, tmp_path):
    """Two packs of comfy-env's 0.1.x-0.2.18 era, as published: their
    __init__.py imports wrap_isolated_nodes / wrap_nodes guarded by
    `except ImportError` (which hid their isolated nodes under bulkhead
    before), copied into a Manager-installed ComfyUI.  Their nodes load;
    those under nodes/isolated/ (its comfy-env.toml) run in a worker, the
    others in ComfyUI's process, as comfy-env ran them; each answers as it
    does in-process."""
    packs = tmp_path / "repos"
    nodes = {}
    for name, init, prefix in (("ComfyUI-WrapIsoE2E", WRAP_ISOLATED_INIT, "E2EWrapIso"),
                               ("ComfyUI-WrapNodesE2E", WRAP_NODES_INIT, "E2EWrapAll")):
        pack = packs / name
        write(pack / "__init__.py", init)
        write(pack / "nodes" / "__init__.py", "")
        for sub in ("main", "isolated"):
            cls = prefix + sub.capitalize()
            write(pack / "nodes" / sub / "__init__.py", WRAP_NODE.format(cls=cls))
            nodes[cls] = sub
        write(pack / "nodes" / "isolated" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    srv = comfyui(packs=(), pack_dirs=[str(packs / "ComfyUI-WrapIsoE2E"), str(packs / "ComfyUI-WrapNodesE2E")],
                  installed=manager_install)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    assert "isolated nodes disabled" not in log and "NOT isolated" not in log, log[-4000:]
    assert "comfy_env.wrap_isolated_nodes is served by bulkhead" in log
    assert "comfy_env.wrap_nodes is served by bulkhead" in log
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and set(nodes) <= set(info), sorted(info)[:20]
    prompt = {str(i): {"class_type": cls, "inputs": {"n": i + 2}} for i, cls in enumerate(sorted(nodes))}
    entry = srv.wait_history(srv.queue(prompt), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    for i, cls in enumerate(sorted(nodes)):
        out = entry["outputs"][str(i)]
        assert out["value"] == in_process(cls, i + 2), (cls, out)
        if nodes[cls] == "isolated":
            assert out["pid"][0] != srv.proc.pid, (cls, out)
        else:
            assert out["pid"] == [srv.proc.pid], (cls, out)
