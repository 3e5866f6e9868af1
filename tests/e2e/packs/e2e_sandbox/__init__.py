"""The e2e suite's sandbox probe (tests/e2e/test_sandbox.py): one node
that tries each escape the sandbox must refuse and each action it must
allow (probe.py), in its worker and in a grandchild process the worker
starts, and returns what each came to.  Isolated as e2e_pack is (its
worker under the host's own interpreter)."""
import os
import sys

from bulkhead.host import nodes

NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
    os.path.dirname(os.path.abspath(__file__)), sys.executable, options={"cache": False})
