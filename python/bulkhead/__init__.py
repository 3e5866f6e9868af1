"""bulkhead: run ComfyUI node packs in isolated worker processes under one
memory budget.  This package is the thin Python glue over the C core in
``bulkhead._native``."""

__version__ = "0.1.0"

from ._native import PeerClosed, ProtocolError, Timeout  # noqa: F401
from ._rpc import BulkheadError, HandleError, RemoteCallable, RemoteError, RemoteObject  # noqa: F401
from .host import CallTimeout, Worker, WorkerDied, WorkerStartError, describe_status  # noqa: F401

# The environment tools are imported on first use: a worker imports this
# package on every start and needs none of them (they cost more to import
# than the rest of the package).
_LAZY = {
    "install": "envs", "env_status": "envs", "EnvStatus": "envs", "EnvBuildError": "envs",
    "PackConfig": "packconfig", "PackConfigError": "packconfig", "PackConfigWarning": "packconfig",
    "comfy_pack": "pack", "host_memory": "pack",
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
    boundary on it (comfy_routes.install).  Never fails the import."""
    import sys
    server = sys.modules.get("server")
    if getattr(getattr(server, "PromptServer", None), "instance", None) is None:
        return
    try:
        from .comfy_routes import install
        install()
    except Exception as e:  # the routes are a convenience; the nodes must load
        import logging
        logging.getLogger("bulkhead").warning("bulkhead: routes not installed on ComfyUI's server: %s", e)


_comfyui_server()
