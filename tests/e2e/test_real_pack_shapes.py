"""Shapes real comfy-env packs ship, seen over HTTP in a Manager-installed
ComfyUI (found by running published packs: tests/e2e/test_real_packs.py).

A 3D pack in the layout comfy-env's register_nodes serves, one
`nodes/<subdir>/` per environment: a `blender/` whose environment cannot
be built here and whose nodes import what only that environment would
have (`bpy`), a `gpu/` whose `[cuda] packages` list torch and torchvision
beside the CUDA wheels (as comfy-env before 0.3.0 read them), and a
config-free `utils/`.  The blender subdirectory costs only its own
nodes, with one line saying so; the gpu one runs isolated with the
host's torch; the pack is never IMPORT FAILED.  Beside it, a pack whose
one environment (`nodes/comfy-env.toml`) cannot be built and whose nodes
need it: nothing of it loads, one error line says so (its build ran in
the background, after ComfyUI loaded the pack: no IMPORT FAILED of
ComfyUI's own), and it is listed failed in /bulkhead/status with the
import that failed."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from localsources import HOST_MM, make_wheel, write  # noqa: E402

INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''

NODE = '''
import os
{imports}


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{}}}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/shapes"

    def run(self):
        return {{"ui": {{"pid": [os.getpid()], "saw": [{saw}]}}}}


NODE_CLASS_MAPPINGS = {{"{cls}": {cls}}}
'''

SUBDIRS = {
    "blender": ('python = "{mm}"\n[pypi-dependencies]\nbh-nowhere-to-be-found = "*"\n',
                "import bh_bpy_nowhere", "'blender'"),
    "gpu": ('[cuda]\npackages = ["torch", "torchvision"]\n\n[pypi-dependencies]\nbhmeshlib = "*"\n'
            '\n[env_vars]\nKMP_DUPLICATE_LIB_OK = "TRUE"\n',
            "import bhmeshlib, torch", "bhmeshlib.VALUE + ' ' + torch.__version__ + ' ' + "
                                       "os.environ['KMP_DUPLICATE_LIB_OK']"),
    "utils": (None, "", "'utils'"),
}


def _geometry_pack(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(str(wheels), "bhmeshlib", "1.0", {"bhmeshlib/__init__.py": "VALUE = 'mesh wheel'\n"})
    pack = tmp_path / "repos" / "ComfyUI-ShapesPack"
    write(pack / "__init__.py", INIT)
    write(pack / "comfy-env-root.toml", '[env_vars]\nKMP_DUPLICATE_LIB_OK = "TRUE"\nOMP_NUM_THREADS = 1\n')
    write(pack / "nodes" / "__init__.py", "")
    for sub, (config, imports, saw) in SUBDIRS.items():
        write(pack / "nodes" / sub / "__init__.py", NODE.format(cls="E2EShape" + sub.capitalize(),
                                                                 imports=imports, saw=saw))
        if config is not None:
            write(pack / "nodes" / sub / "comfy-env.toml", config.format(mm=HOST_MM))
    return str(pack), {"BULKHEAD_PIP_ARGS": f"--find-links {wheels}"}


def _whole_lost_pack(tmp_path):
    pack = tmp_path / "repos" / "ComfyUI-WholeLost"
    write(pack / "__init__.py", INIT)
    write(pack / "nodes" / "__init__.py", NODE.format(cls="E2EShapeWhole", imports="import bh_bpy_nowhere",
                                                       saw="'whole'"))
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n[pypi-dependencies]\nbh-nowhere-to-be-found = "*"\n')
    return str(pack)


def test_a_lost_subdirectory_costs_only_its_nodes(comfyui, manager_install, tmp_path):
    import torch
    pack, env = _geometry_pack(tmp_path)
    srv = comfyui(packs=(), pack_dirs=[pack, _whole_lost_pack(tmp_path)], installed=manager_install, env=env)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    assert [line for line in log.splitlines() if "(IMPORT FAILED)" in line and "custom_nodes" in line] == [], log
    [whole] = [line for line in log.splitlines() if "'ComfyUI-WholeLost'" in line and "NOT loaded" in line]
    assert "No module named 'bh_bpy_nowhere'" in whole, whole
    # blender: its build failed, so it is refused (#36: the host lacks its requirement), and reading its
    # nodes in ComfyUI's process fails, `bpy` not being there either
    # (one short line, #36: the whole reason and the fix in its state, below)
    failed = [l for l in log.splitlines() if "is refused, NOT run" in l and "ShapesPack" in l]
    assert len(failed) == 1 and "ComfyUI-ShapesPack.blender'" in failed[0] and len(failed[0]) <= 200, failed
    assert "its environment could not be built" in failed[0] and "`bulkhead status`" in failed[0], failed
    [lost] = [l for l in log.splitlines() if "its nodes are NOT loaded" in l and "ShapesPack" in l]
    assert "ComfyUI-ShapesPack.blender'" in lost and "No module named 'bh_bpy_nowhere'" in lost, lost
    assert "its other parts served as they are" in lost, lost
    # gpu: the torch family in [cuda] is the host's, one note; no CUDA wheel was looked for
    [note] = [l for l in log.splitlines() if "[cuda] packages lists torch, torchvision" in l]
    assert "nodes/gpu/comfy-env.toml:2:" in note, note
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    assert "E2EShapeGpu" in info and "E2EShapeUtils" in info and "E2EShapeBlender" not in info
    prompt = {"1": {"class_type": "E2EShapeGpu", "inputs": {}}, "2": {"class_type": "E2EShapeUtils", "inputs": {}}}
    entry = srv.wait_history(srv.queue(prompt), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    gpu, utils = entry["outputs"]["1"], entry["outputs"]["2"]
    host = srv.proc.pid
    assert gpu["pid"][0] != host and gpu["saw"] == [f"mesh wheel {torch.__version__} TRUE"], gpu
    assert utils["pid"] == [host] and utils["saw"] == ["utils"], utils
    status, doc = srv.http("GET", "/bulkhead/status")
    states = {p["name"]: p for p in doc["packs"]}
    blender = states["ComfyUI-ShapesPack.blender"]
    assert blender["state"] == "failed", doc["packs"]
    assert "its environment could not be built" in blender["reason"] and "bh-nowhere-to-be-found" in \
        blender["reason"] and "No module named 'bh_bpy_nowhere'" in blender["reason"], blender
    assert blender["fix"].startswith("what that build error names"), blender
    assert states["ComfyUI-ShapesPack.gpu"]["state"] == "isolated", doc["packs"]
    assert states["ComfyUI-WholeLost"]["state"] == "failed", doc["packs"]
    assert "No module named 'bh_bpy_nowhere'" in states["ComfyUI-WholeLost"]["reason"], doc["packs"]
