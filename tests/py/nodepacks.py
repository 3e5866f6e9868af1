"""Test packs written into tmp directories, for the tests that load them
(test_nodes, test_pack_types, test_pack, test_spec): the two __init__.py
a pack gets -- load_pack under a named interpreter in this process, or
bulkhead.comfy_pack in a fresh ComfyUI-shaped host -- writing a pack,
importing its own nodes module here for comparison, and running such a
host."""

import importlib
import importlib.util
import os
import sys
import textwrap

from comfyenv import run_comfy_script

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(HERE, "..", "..", "build", "rel")))
HOST_VERSION = "%d.%d" % sys.version_info[:2]

# A pack's __init__.py serving its nodes from a worker under the
# interpreter BH_TEST_PACK_PYTHON names, ComfyUI's base BH_TEST_COMFYUI.
LOAD_PACK_INIT = '''\
import os
from bulkhead.host.nodes import load_pack
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = load_pack(
    os.path.dirname(os.path.abspath(__file__)), os.environ["BH_TEST_PACK_PYTHON"],
    options={"comfyui": os.environ.get("BH_TEST_COMFYUI")})
'''

# A pack's __init__.py as a user writes it: one call.
COMFY_PACK_INIT = '''
import bulkhead
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
'''


def write_pack(root, name, files):
    """A pack at root/name of files (relative path -> text, dedented);
    returns its directory as a str."""
    d = root / name
    for rel, text in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return str(d)


def import_real(pack_dir):
    """The pack's own node module, imported here for comparison."""
    name = "bh_real_" + os.path.basename(pack_dir)
    spec = importlib.util.spec_from_file_location(name, os.path.join(pack_dir, "__init__.py"),
                                                  submodule_search_locations=[pack_dir])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    return importlib.import_module(name + ".nodes")


def run_host(tmp_path, pack, body, env=None):
    """body run in a fresh ComfyUI-shaped host (comfyenv) with PACK the
    pack's path and load ComfyUI's load_custom_node; its answer."""
    code = f"""
        import logging, warnings
        logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
        import bulkhead
        load = load_custom_node
        PACK = {str(pack)!r}
    """
    code = textwrap.dedent(code) + textwrap.dedent(body)
    env = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(tmp_path / "home"),
           "BULKHEAD_LEDGER": str(tmp_path / "ledger"), **(env or {})}
    return run_comfy_script(code, timeout=240, env=env)
