"""``import comfy_env`` inside ComfyUI, in any load order.

Run at every interpreter start by ``bulkhead-comfy-env.pth`` (installed
with bulkhead into ComfyUI's site-packages), this module only puts one
finder first on ``sys.meta_path``; it imports nothing and costs one string
comparison per import.  ComfyUI runs its packs' ``prestartup_script.py``
files and imports its packs in ``os.listdir`` order, so a pack whose
folder comes before bulkhead's can ``from comfy_env import setup_env``
before bulkhead's own prestartup step has routed ``comfy_env``
(bulkhead.host.comfy_env.route): without this finder it would get the real
comfy-env where one is installed, and ``No module named 'comfy_env'``
where none is.

The finder answers ``comfy_env`` (and its submodules, such as the
``comfy_env.isolation.workers._ipc_shared`` a pack's serialization.py
imports register_serializer from) only inside ComfyUI -- ComfyUI's
``folder_paths`` is imported (its main.py imports it before any
prestartup script runs), bulkhead's custom node is in its custom_nodes
(bulkhead.packimport.custom_node_missing, the one check), and this is no
bulkhead worker -- and only while bulkhead's switch is on
(``BULKHEAD_COMFY_ENV``); then it hands the
import to bulkhead.host.comfy_env's own finder, the one route() installs.
Everywhere else (a plain script, pip, a worker, bulkhead missing or
failing to import) it answers nothing and ``import comfy_env`` finds the
real package as usual.  Why a .pth and not only the prestartup step: the
prestartup step runs in ComfyUI's order, the .pth before anything.
"""

import sys


class BulkheadComfyEnvFinder:
    """Answers ``import comfy_env`` with bulkhead's surface inside ComfyUI."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith("comfy_env"):    # every import of the process passes here: first, and cheap
            return None
        if fullname != "comfy_env" and not fullname.startswith("comfy_env."):
            return None
        if "folder_paths" not in sys.modules:
            return None
        worker = sys.modules.get("bulkhead.worker")
        if worker is not None and getattr(worker, "_peer", None) is not None:
            return None
        try:
            from bulkhead import packimport
            from bulkhead.host import comfy_env
        except Exception:       # bulkhead missing or broken here: the real comfy-env, as without it
            return None
        if packimport.custom_node_missing() is not None:    # its custom node deleted: off
            return None
        return comfy_env.Finder().find_spec(fullname, path, target)


def install():
    if not any(getattr(f, "__name__", None) == "BulkheadComfyEnvFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, BulkheadComfyEnvFinder)


install()
