"""Importing a node pack's nodes: the helpers both processes use.

The worker imports its pack with them (``bulkhead.worker.nodes``); the
host uses the same ones to name a pack's node module and, when a pack runs
in-process (the fallback, or a pack imported from inside another pack's
worker), to import it.  Nothing here knows which process it is in, except
``in_worker``, which reads the worker's state without importing it, and
``custom_node_missing``, which reads ComfyUI's custom_nodes folders.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys


def in_worker():
    """True inside a bulkhead worker process (its channel is open)."""
    worker = sys.modules.get("bulkhead.worker")
    return worker is not None and getattr(worker, "_peer", None) is not None


# What makes a folder of ComfyUI's custom_nodes bulkhead's custom node: a
# clone of the repository (its package at python/bulkhead/), or the package
# itself linked or copied there (this file beside its __init__.py).
_CLONE_MARK = os.path.join("python", "bulkhead", "__init__.py")
_PACKAGE_MARK = os.path.basename(__file__)


def _is_custom_node(d):
    return os.path.isfile(os.path.join(d, _CLONE_MARK)) or \
        (os.path.isfile(os.path.join(d, "__init__.py")) and os.path.isfile(os.path.join(d, _PACKAGE_MARK)))


def custom_node_missing(*pack_dirs):
    """bulkhead is on in a ComfyUI only while its custom node is in one of
    ComfyUI's custom_nodes folders: deleting that folder (ComfyUI-Manager's
    Uninstall) turns it off at the next start, though the package stays
    installed in ComfyUI's Python.  This is the one check, for the routing
    of ``import comfy_env`` (python/_bulkhead_comfy_env.py), the routes on
    ComfyUI's server (``bulkhead._comfyui_server``) and each pack's
    ``comfy_pack`` (host/pack.py).

    Returns the custom_nodes folders looked in (a list) when bulkhead's
    custom node is in none of them, the ".disabled" ones (ComfyUI skips
    them) not counting; None when it is in one, and None wherever it cannot
    be told, so bulkhead never turns itself off on a guess: not in ComfyUI
    (its folder_paths not imported), in a bulkhead worker, a ComfyUI
    without ``get_folder_paths``, no custom_nodes folder that exists.
    pack_dirs: the paths of a pack calling bulkhead (as ComfyUI imported
    it, and resolved); then only a pack inside one of those folders -- one
    ComfyUI loads as a custom node -- is told (a pack a script or a test
    loads from elsewhere is not)."""
    fp = sys.modules.get("folder_paths")
    if fp is None or in_worker():
        return None
    try:
        folders = [os.path.abspath(d) for d in fp.get_folder_paths("custom_nodes") if os.path.isdir(d)]
    except Exception:
        return None
    if not folders:
        return None
    if pack_dirs:
        roots = {os.path.join(r, "") for d in folders for r in (d, os.path.realpath(d))}
        if not any(os.path.join(os.path.abspath(p), "").startswith(tuple(roots)) for p in pack_dirs):
            return None
    for d in folders:
        try:
            names = os.listdir(d)
        except OSError:
            return None
        if any(_is_custom_node(os.path.join(d, n)) for n in names if not n.endswith(".disabled")):
            return None
    return folders


def package_name(pack_dir):
    """The name a pack directory is imported under: its basename, as
    ComfyUI names the packs it loads (dots would make a dotted name)."""
    return os.path.basename(os.path.normpath(pack_dir)).replace(".", "_x_")


def default_module(pack_dir):
    """'nodes' when pack_dir holds the pack's nodes.py or nodes/__init__.py, else None
    (the package's __init__ holds the nodes)."""
    if os.path.isfile(os.path.join(pack_dir, "nodes.py")) or \
            os.path.isfile(os.path.join(pack_dir, "nodes", "__init__.py")):
        return "nodes"
    return None


def package_for(pack_dir):
    """An already imported package made from pack_dir (ComfyUI imports a
    pack under its path), or None."""
    for name, mod in list(sys.modules.items()):
        paths = getattr(mod, "__path__", None)
        try:
            if paths is not None and len(paths) == 1 and os.path.realpath(list(paths)[0]) == pack_dir:
                return mod
        except (TypeError, OSError):
            continue
    return None


def import_nodes(pack_dir, module="auto", *, unique_name=False):
    """Imports a pack's node module and returns it.

    pack_dir is imported as a package (its basename; with unique_name, the
    path, as ComfyUI names packs, for a host where basenames may clash);
    module is the submodule with NODE_CLASS_MAPPINGS ('auto': 'nodes' if
    there is one), or None for the package's own __init__.  A package
    already imported from pack_dir (the pack ComfyUI is loading) is used
    as it is.  Raises ImportError naming the pack on failure."""
    pack_dir = os.path.realpath(pack_dir)
    if module == "auto":
        module = default_module(pack_dir)
    if not os.path.isdir(pack_dir):
        raise ImportError(f"node pack directory {pack_dir} does not exist")
    pkg = package_for(pack_dir)
    if pkg is None:
        name = pack_dir.replace(".", "_x_") if unique_name else package_name(pack_dir)
        if name in sys.modules:
            name = pack_dir.replace(".", "_x_")
        init = os.path.join(pack_dir, "__init__.py")
        if module is None:
            if not os.path.isfile(init):
                raise ImportError(f"node pack {pack_dir} has neither __init__.py nor a nodes module")
            spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[pack_dir])
            pkg = importlib.util.module_from_spec(spec)
            sys.modules[name] = pkg
            try:
                spec.loader.exec_module(pkg)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return pkg
        # The package without its __init__ (host-side glue): a bare
        # package over the directory, so `from .x import y` works.
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [pack_dir]
        pkg = importlib.util.module_from_spec(spec)
        pkg.__file__ = init if os.path.isfile(init) else None
        sys.modules[name] = pkg
    elif module is None:
        if getattr(getattr(pkg, "__spec__", None), "_initializing", False):
            raise ImportError(
                f"node pack {pack_dir}: its __init__.py calls bulkhead but holds the nodes itself; "
                "move the node classes into nodes.py (or name their module in options['module'])")
        return pkg
    return importlib.import_module(f"{pkg.__name__}.{module}")
