"""The e2e suite's V3 and PromptServer pack (nodes.py), isolated as
e2e_pack is (under the host's own interpreter), or imported in-process
when BH_E2E_IN_PROCESS is set: the suite runs it both ways and compares
what the server serves (tests/e2e/test_v3_server.py)."""
import os
import sys

if os.environ.get("BH_E2E_IN_PROCESS"):
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401
else:
    from bulkhead.host import nodes, pack

    _hm = pack.host_memory()
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
        os.path.dirname(os.path.abspath(__file__)), sys.executable,
        options={"attach": pack._attach(_hm), "after_call": pack._drain(_hm), "cache": False,
                 "interrupt_grace": float(os.environ.get("BH_E2E_GRACE", "1.0"))})
