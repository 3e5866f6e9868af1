"""An isolated pack of async nodes and grad-mode probes (nodes.py), served
from a worker under the host's own interpreter, as the e2e pack is.
tests/e2e/test_async_nodes.py also loads the same nodes.py in ComfyUI's
own process, to compare."""
import os
import sys

from bulkhead.host import nodes, pack

_hm = pack.host_memory()
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
    os.path.dirname(os.path.abspath(__file__)), sys.executable,
    options={"cache": False}, memory=_hm)
