"""The e2e suite's V3 and PromptServer pack (nodes.py), isolated as a
published pack is -- its own environment, built by bulkhead at ComfyUI's
start from its comfy-env.toml, which declares none of ComfyUI's own
dependencies: the aiohttp, Pillow, comfy_api and server it imports are
what the worker sees of the host, as an in-process pack sees them -- or
imported in-process when BH_E2E_IN_PROCESS is set: the suite runs it both
ways and compares what the server serves (tests/e2e/test_v3_server.py)."""
import os

if os.environ.get("BH_E2E_IN_PROCESS"):
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401
else:
    import bulkhead

    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
