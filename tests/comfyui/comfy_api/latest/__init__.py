"""`comfy_api.latest` (tests only): `io` (the V3 node API, _io.py) and
`ComfyExtension`, what a pack's `comfy_entrypoint()` returns (nodes.py's
load_custom_node awaits its get_node_list() and registers each node under
its schema's node_id).  Not here: `ui`, `Input`, `InputImpl`, `Types`,
the `ComfyAPI` singleton.  Written for bulkhead from a reading of
upstream's behaviour; no upstream code."""

from abc import ABC, abstractmethod

from . import _io as io


class ComfyExtension(ABC):
    async def on_load(self):
        """Called once when the extension is loaded."""

    @abstractmethod
    async def get_node_list(self):
        """The extension's node classes (io.ComfyNode subclasses)."""


__all__ = ["io", "ComfyExtension"]
