"""The e2e suite's pack of nodes whose input and output types are the
pack's own str subclasses with their own == / != (nodes.py): isolated as
e2e_pack is (its worker under the host's own interpreter), or imported
in-process when BH_E2E_IN_PROCESS is set, so the suite runs it both ways
and compares what ComfyUI's validation makes of those types
(tests/e2e/test_any_types.py)."""
import os
import sys

if os.environ.get("BH_E2E_IN_PROCESS"):
    from .nodes import NODE_CLASS_MAPPINGS  # noqa: F401
else:
    from bulkhead.host import nodes

    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
        os.path.dirname(os.path.abspath(__file__)), sys.executable, options={"cache": False})
