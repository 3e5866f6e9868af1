"""Any load order, from the user's side: ComfyUI runs prestartup scripts
and imports custom nodes in directory order, so packs whose folders sort
before `bulkhead` (this stand-in sorts them by name, as a real checkout's
os.listdir happens to order them or not) run first.  A comfy-env pack
whose prestartup script imports `comfy_env` works before and after
bulkhead (without the real comfy-env installed), isolated both ways; a
`bulkhead.comfy_pack` pack before a clone whose package is not installed
gets the documented in-process fallback, not IMPORT FAILED."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from localsources import HOST_MM, write  # noqa: E402
from .e2eenv import clone_into  # noqa: E402

PRESTARTUP = '''
import os
from comfy_env import setup_env, copy_files
here = os.path.dirname(os.path.abspath(__file__))
setup_env()
copy_files(os.path.join(here, "assets"), os.path.join(here, "copied"), "*.txt")
'''

INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''

NODES = '''
import os


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{}}}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True

    def run(self):
        return {{"ui": {{"pid": [os.getpid()]}}}}


NODE_CLASS_MAPPINGS = {{"{cls}": {cls}}}
'''


def _ce_pack(root, name, cls):
    pack = root / name
    write(pack / "prestartup_script.py", PRESTARTUP)
    write(pack / "assets" / "viewer.txt", f"asset of {name}\n")
    write(pack / "__init__.py", INIT)
    write(pack / "nodes" / "__init__.py", NODES.format(cls=cls))
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    return str(pack)


def test_comfy_env_prestartup_before_and_after_bulkhead(comfyui, manager_install, tmp_path):
    first = _ce_pack(tmp_path / "repos", "a_first_ce", "E2EFirst")     # sorts before "bulkhead"
    last = _ce_pack(tmp_path / "repos", "z_last_ce", "E2ELast")        # and after it
    srv = comfyui(packs=(), pack_dirs=[first, last], installed=manager_install)
    log = srv.log()
    assert "No module named 'comfy_env'" not in log and "(IMPORT FAILED)" not in log, log
    assert "NOT isolated" not in log, log
    # bulkhead's own prestartup bounded ComfyUI's idle OpenMP threads before torch loaded
    assert "ComfyUI's idle OpenMP/BLAS threads spin 200 us before they sleep (GOMP_SPINCOUNT=" in log, log
    for name in ("a_first_ce", "z_last_ce"):
        copied = os.path.join(srv.base, "custom_nodes", name, "copied", "viewer.txt")
        with open(copied) as f:
            assert f.read() == f"asset of {name}\n"
    prompt_id = srv.queue({"1": {"class_type": "E2EFirst", "inputs": {}},
                           "2": {"class_type": "E2ELast", "inputs": {}}})
    entry = srv.wait_history(prompt_id, timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    pids = {entry["outputs"][k]["pid"][0] for k in ("1", "2")}
    assert srv.proc.pid not in pids and len(pids) == 2, (pids, srv.proc.pid)


def test_comfy_pack_before_a_clone_whose_package_is_missing(comfyui, tmp_path):
    """A clone in custom_nodes/ whose install.py never ran (bulkhead's
    package is in no path of this Python), and a pack sorting before it."""
    clone = clone_into(str(tmp_path / "src"))
    pack = tmp_path / "repos" / "a_comfy_pack"
    write(pack / "__init__.py", "import bulkhead\n"
                                "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)\n")
    write(pack / "nodes.py", NODES.format(cls="E2EBeforeMissing"))
    write(pack / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    srv = comfyui(packs=(), pack_dirs=[str(pack)], installed=(sys.executable, clone))
    log = srv.log()
    assert "(IMPORT FAILED)" not in log, log  # a custom node; comfy_extras lacking torchaudio print "IMPORT FAILED: nodes_....py"
    assert "bulkhead: not loaded, isolated packs run in-process" in log, log
    fallback = [l for l in log.splitlines() if "NOT isolated" in l]
    # one short line per pack (#36), pointing at the "not loaded" line, which names install.py
    assert len(fallback) == 1 and "'a_comfy_pack'" in fallback[0] and '"not loaded"' in fallback[0], fallback
    assert "install.py" in next(l for l in log.splitlines() if "bulkhead: not loaded" in l)
    prompt_id = srv.queue({"1": {"class_type": "E2EBeforeMissing", "inputs": {}}})
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    assert entry["outputs"]["1"]["pid"] == [srv.proc.pid]
