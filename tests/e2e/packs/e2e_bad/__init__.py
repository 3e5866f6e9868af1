"""The e2e suite's badly behaved PromptServer and V3 pack (nodes.py),
isolated under the host's own interpreter with a short route timeout:
tests/e2e/test_bad_pack.py drives it over HTTP and the websocket."""
import os
import sys

from bulkhead.host import nodes, pack

_hm = pack.host_memory()
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
    os.path.dirname(os.path.abspath(__file__)), sys.executable,
    options={"cache": False, "route_timeout_s": 1.5}, memory=_hm)
