"""bulkhead: run ComfyUI node packs in isolated worker processes under one
memory budget.  This package is the thin Python glue over the C core in
``bulkhead._native``."""

__version__ = "0.1.0"

from ._native import PeerClosed, ProtocolError, Timeout  # noqa: F401
from .channel.peer import BulkheadError, HandleError, RemoteCallable, RemoteError, RemoteObject  # noqa: F401

# The package is laid out by the process each file runs in:
#   channel/   what crosses the channel, used by both processes (the peer,
#              tensors, the private host <-> worker formats)
#   host/      the ComfyUI (host) process: Worker, pack loading, proxy
#              nodes, memory, the holder, the control socket, ComfyUI routes
#   worker/    the worker process (``python -m bulkhead.worker``)
#   envs/      pack configs and their environments (install, status)
# The top-level modules (_importwatch, pager, packimport) are used by both.
#
# Host and environment names are imported on first use: a worker imports
# this package on every start and needs none of them (a test checks that a
# worker imports no host module).
_LAZY = {
    "CallTimeout": "host.workers", "Worker": "host.workers", "WorkerDied": "host.workers",
    "WorkerStartError": "host.workers", "describe_status": "host.workers",
    "install": "envs.build", "env_status": "envs.build", "EnvStatus": "envs.build", "EnvBuildError": "envs.build",
    "PackConfig": "envs.config", "PackConfigError": "envs.config", "PackConfigWarning": "envs.config",
    "comfy_pack": "host.pack", "host_memory": "host.pack", "load_pack": "host.nodes",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


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
    boundary on it (host.routes.install).  Never fails the import."""
    import sys
    server = sys.modules.get("server")
    if getattr(getattr(server, "PromptServer", None), "instance", None) is None:
        return
    try:
        from .host.routes import install
        install()
    except Exception as e:  # the routes are a convenience; the nodes must load
        import logging
        logging.getLogger("bulkhead").warning("bulkhead: routes not installed on ComfyUI's server: %s", e)


_comfyui_server()
