"""bulkhead as a ComfyUI custom node: this folder, cloned into
``custom_nodes/`` (ComfyUI-Manager does that, then runs
``pip install -r requirements.txt`` and ``python install.py``).

ComfyUI imports this file by its path (the module is named after the
folder's path), so this is not the bulkhead package: that one is installed
into ComfyUI's Python by install.py (or ``pip install``) and imported here
exactly once, as ``bulkhead`` -- the one module every isolated pack's
``import bulkhead`` finds, so its routes and /free observer are installed
on ComfyUI's server once.  WEB_DIRECTORY is the installed package's panel.

Where bulkhead is not installed or cannot run here (not Linux, no wheel and
no compiler, a failed import), this file raises nothing: it logs one line
naming the fix and puts a stand-in ``bulkhead`` in sys.modules whose
``comfy_pack`` imports each pack in this process, with one warning per
pack, as bulkhead's own fallback does (bulkhead.host.nodes.fallback).
"""

import importlib.machinery
import importlib.util
import logging
import os
import sys
import types

_HERE = os.path.dirname(os.path.realpath(__file__))
_FIX = f"run `python install.py` in {_HERE} with ComfyUI's own Python ({sys.executable}), then restart ComfyUI"
_log = logging.getLogger("bulkhead")

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
WEB_DIRECTORY = None


def _import_installed():
    """The installed bulkhead package (imported now unless a pack already
    did), and None; or None and the reason it cannot be had."""
    mod = sys.modules.get("bulkhead")
    if mod is not None and mod.__dict__ is not globals():
        if getattr(mod, "BULKHEAD_MISSING", None):
            return None, mod.BULKHEAD_MISSING
        if getattr(mod, "__file__", None) is None:      # a namespace package (the prestartup's import)
            for name in [n for n in sys.modules if n == "bulkhead" or n.startswith("bulkhead.")]:
                del sys.modules[name]
            return None, _leftover(getattr(mod, "__path__", None))
        return mod, None
    if not sys.platform.startswith("linux"):
        return None, f"bulkhead runs on Linux only (this is {sys.platform})"
    # Never this folder itself: where custom_nodes/ is on sys.path (a pack
    # put it there), `import bulkhead` finds this file first.  Then this
    # module is "bulkhead" and the import returns whatever sys.modules holds
    # under that name once this file has run: the installed package.
    parent = os.path.dirname(_HERE)
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != parent]
    spec = importlib.machinery.PathFinder.find_spec("bulkhead", path)
    if spec is not None and spec.origin is None and spec.submodule_search_locations:
        return None, _leftover(spec.submodule_search_locations)
    if spec is None or spec.loader is None:
        return None, f"bulkhead is not installed into this Python ({sys.executable})"
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bulkhead"] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        for name in [n for n in sys.modules if n == "bulkhead" or n.startswith("bulkhead.")]:
            del sys.modules[name]
        return None, f"the installed bulkhead ({os.path.dirname(spec.origin or '?')}) fails to import: " \
                     f"{type(e).__name__}: {e}"
    return mod, None


def _leftover(paths):
    """The reason for a ``bulkhead`` that imports as a namespace package:
    folders without the package's __init__.py, what an uninstall left
    (pip removes only the files it installed: a __pycache__ written later
    stays, and the folder then imports as an empty package, on which every
    pack failed with "module 'bulkhead' has no attribute 'comfy_pack'")."""
    where = ", ".join(str(p) for p in (paths or [])) or "a folder on sys.path"
    return (f"{where} holds no bulkhead package, only what an uninstall left there (files pip did not "
            f"install): remove that folder first")


def _stand_in(reason):
    """A ``bulkhead`` module for packs when the package cannot run: its
    comfy_pack imports the pack here, NOT isolated, with one warning per
    pack (the import itself is the package's own packimport.import_nodes,
    read from this clone)."""
    spec = importlib.util.spec_from_file_location(
        "_bulkhead_missing_packimport", os.path.join(_HERE, "python", "bulkhead", "packimport.py"))
    packimport = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(packimport)
    warned = set()

    def comfy_pack(init_file, *, module="auto"):
        pack_dir = os.path.dirname(os.path.realpath(os.fspath(init_file)))
        if pack_dir not in warned:
            warned.add(pack_dir)
            # one short line per pack (#36): the reason and the fix are the "not loaded" line's
            _log.warning("bulkhead: pack %r runs in-process, NOT isolated: bulkhead is not loaded (why and the "
                         "fix: the line before, \"not loaded\")", os.path.basename(pack_dir))
        mod = packimport.import_nodes(pack_dir, module, unique_name=True)
        return (dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}),
                dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {}))

    stand_in = types.ModuleType("bulkhead", "bulkhead is not installed here; packs run in-process")
    stand_in.BULKHEAD_MISSING = reason
    stand_in.comfy_pack = comfy_pack
    return stand_in


def _load():
    global WEB_DIRECTORY
    mod, reason = _import_installed()
    if mod is not None:
        # The package may have been imported before ComfyUI's server existed
        # (our prestartup_script.py does, to route comfy_env): put its routes
        # on the server now.  Idempotent.
        install = getattr(mod, "_comfyui_server", None)
        if install is not None:
            install()
        web = os.path.join(os.path.dirname(os.path.abspath(mod.__file__)), getattr(mod, "WEB_DIRECTORY", "web"))
        WEB_DIRECTORY = web if os.path.isdir(web) else os.path.join(_HERE, "web")
        return
    if getattr(sys.modules.get("bulkhead"), "BULKHEAD_MISSING", None):  # made already (this file loaded twice)
        return
    _log.warning("bulkhead: not loaded, isolated packs run in-process: %s. Fix: %s", reason, _FIX)
    try:
        sys.modules["bulkhead"] = _stand_in(reason)
    except Exception as e:  # no packimport.py beside (not a clone): packs fail their own import
        _log.warning("bulkhead: no in-process fallback for packs either: %s", e)


_load()
