"""Importing a node pack's nodes: the helpers both processes use.

The worker imports its pack with them (``bulkhead.worker.nodes``); the
host uses the same ones to name a pack's node module and, when a pack runs
in-process (the fallback, or a pack imported from inside another pack's
worker), to import it.  Nothing here knows which process it is in, except
``in_worker``, which reads the worker's state without importing it.
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


def package_name(pack_dir):
    """The name a pack directory is imported under: its basename, as
    ComfyUI names the packs it loads (dots would make a dotted name)."""
    return os.path.basename(os.path.normpath(pack_dir)).replace(".", "_x_")


def default_module(pack_dir):
    """'nodes' when the pack has nodes.py or nodes/__init__.py, else None
    (the package's __init__ holds the nodes)."""
    if os.path.isfile(os.path.join(pack_dir, "nodes.py")) or \
            os.path.isfile(os.path.join(pack_dir, "nodes", "__init__.py")):
        return "nodes"
    return None


def _package_for(pack_dir):
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
    pkg = _package_for(pack_dir)
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
