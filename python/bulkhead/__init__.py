"""bulkhead: run ComfyUI node packs in isolated worker processes under one
memory budget.  This package is the thin Python glue over the C core in
``bulkhead._native``."""

import importlib
import os
import sys

__version__ = "0.1.0"

if __name__ == "bulkhead":
    from ._native import PeerClosed, ProtocolError, Timeout  # noqa: F401
    from .channel.peer import BulkheadError, HandleError, RemoteCallable, RemoteError, RemoteObject  # noqa: F401
# else: a copy ComfyUI imported by path (_one_package, at the end), which
# loads nothing of its own and hands every name on to the one ``bulkhead``.

# The package is laid out by the process each file runs in:
#   channel/   what crosses the channel, used by both processes (the peer,
#              tensors, the private host <-> worker formats)
#   host/      the ComfyUI (host) process: Worker, pack loading, proxy
#              nodes, memory, the holder, the control socket, ComfyUI routes
#   worker/    the worker process (``python -m bulkhead.worker``)
#   envs/      pack configs and their environments (install, status)
#   cli/       what runs only from the command line (the canary, uninstall)
# The top-level modules (_importwatch, pager, packimport) are used by both.
#
# Host and environment names are imported on first use: a worker imports
# this package on every start and needs none of them (a test checks that a
# worker imports no host module).
_LAZY = {
    "CallTimeout": "host.errors", "Worker": "host.workers", "WorkerDied": "host.errors",
    "WorkerStartError": "host.errors", "describe_status": "host.errors",
    "install": "host.pack", "env_status": "envs.build", "EnvStatus": "envs.build", "EnvBuildError": "envs.build",
    "PackConfig": "envs.config", "PackConfigError": "envs.config", "PackConfigWarning": "envs.config",
    "comfy_pack": "host.pack", "host_memory": "host.pack", "load_pack": "host.nodes",
}


def __getattr__(name):
    if __name__ != "bulkhead" and _canonical is not None:
        return getattr(_canonical, name)
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def working():
    """A context manager for a pack's own work outside a node (a job its
    route started, a download on a thread of its own): while it is held,
    the pack's worker is not stopped for being idle (its idle exit, memory
    pressure, ComfyUI's "Free model and node cache") nor asked to release
    as an idle one.  In ComfyUI's own process (a pack not isolated) it
    does nothing::

        with bulkhead.working():
            fetch_weights()
    """
    import contextlib  # lazy: worker start
    memory = getattr(sys.modules.get("bulkhead.worker"), "memory_runtime", None)   # a worker's WorkerMemory
    return memory.working() if memory is not None else contextlib.nullcontext()


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


# Loaded by ComfyUI as a custom node package: it serves web/ (the sidebar
# panel) under /extensions/<package>/.  bulkhead adds no nodes of its own;
# the packs it isolates bring theirs.
WEB_DIRECTORY = "web"
NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}


def _comfyui_server():
    """In a ComfyUI process whose PromptServer exists (custom nodes load
    after it is made), put bulkhead's routes, /free observer and prompt
    boundary on it (host.routes.install), sharing from the start the one
    HostMemory the packs' workers will attach to (host.pack.host_memory),
    so /free, /bulkhead/* and the panel act on this host's workers before
    and after the first pack loads.  Only the package imported as
    ``bulkhead`` does this (``_one_package``).  Idempotent per server: the
    custom node's root __init__.py calls it again, for a package a
    prestartup script imported before the server existed.  Nothing where
    bulkhead's custom node is not in ComfyUI's custom_nodes (deleted: the
    Manager's Uninstall; packimport.custom_node_missing).  Never fails the
    import."""
    server = sys.modules.get("server")
    if getattr(getattr(server, "PromptServer", None), "instance", None) is None:
        return
    from .packimport import custom_node_missing  # lazy: worker start
    if custom_node_missing() is not None:
        # bulkhead's custom node was deleted (the Manager's Uninstall): off.
        # Packs that import the package run in-process (host/pack.py says
        # so once for each); nothing goes on ComfyUI's server.
        return
    try:
        from .host import pack  # host-only: host.pack
        from .host.routes import install  # host-only: host.routes
        # Made now, where this ComfyUI can host isolated packs: its control
        # socket then answers other instances, and the routes' releases go
        # to the same workers comfy_pack attaches later.
        memory = pack.host_memory if pack.contract_refusal() is None else None
        if memory is not None:
            memory()
        install(host_memory=memory)
    except Exception as e:  # the routes are a convenience; the nodes must load
        import logging  # lazy: worker start
        logging.getLogger("bulkhead").warning("bulkhead: routes not installed on ComfyUI's server: %s", e)


def _one_package(init_file):
    """ComfyUI imports a custom node by its path, under a module name of its
    own; the packs it isolates say ``import bulkhead``.  Two copies of the
    package would mean two HostMemory (two host records, two control
    sockets) and the routes on the copy no worker attaches to, so the copy
    imported by path only imports ``bulkhead`` -- found on sys.path, else
    this directory's parent (a clone or symlink in custom_nodes/) -- which
    installs itself on the server.  Returns that package, or None (logged)."""
    import logging  # lazy: worker start
    here = os.path.dirname(os.path.realpath(init_file))
    try:
        try:
            return importlib.import_module("bulkhead")
        except ModuleNotFoundError as e:
            if e.name != "bulkhead" or os.path.basename(here) != "bulkhead":
                raise
        sys.path.append(os.path.dirname(here))
        return importlib.import_module("bulkhead")
    except Exception as e:  # ComfyUI must start; isolated packs then fall back
        logging.getLogger("bulkhead").warning("bulkhead: the package cannot be imported as 'bulkhead' "
                                              "(%s): isolated packs will not find it", e)
        return None


_canonical = None
if __name__ == "bulkhead":
    _comfyui_server()
else:
    _canonical = _one_package(__file__)
    if _canonical is not None:  # imported earlier (a prestartup script), maybe before the server existed
        _canonical._comfyui_server()
