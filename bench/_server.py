"""The ComfyUI-shaped server as the benches that time a ComfyUI start run
it (failed_start.py, many_packs.py, six_packs.py): tests/e2e's Server on a
base directory assembled by e2eenv.assemble, in an environment of the
bench's own, timed from the start of its process.

One place for it, so that every bench's start means the same: the same
environment (a BULKHEAD_HOME, its ledger, unbuffered output, no
COMFYUI_PATH) and the same clock around Server.start, which returns once
GET /prompt answers (and, unless told not to wait, once no pack builds).
"""

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.join(ROOT, "tests", "e2e") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from e2eenv import Server  # noqa: E402


def server_env(home, **extra):
    """os.environ with home as BULKHEAD_HOME (its ledger in it), output
    unbuffered and extra on top: for the server and for what a bench runs
    beside it (`bulkhead install`)."""
    return dict(os.environ, BULKHEAD_HOME=home, BULKHEAD_LEDGER=os.path.join(home, "ledger"),
                PYTHONUNBUFFERED="1", **extra)


def start(base, env, wait_for_builds=True):
    """Starts the server at base in env (server_env's, less COMFYUI_PATH:
    the base directory assembled from it is the ComfyUI); returns (the
    server, the time.monotonic() just before its process started).  The
    caller stops it; a start that fails stops it here, so that no server
    is left behind."""
    env = {k: v for k, v in env.items() if k != "COMFYUI_PATH"}
    srv = Server(base, env, env["BULKHEAD_LEDGER"])
    srv.wait_for_builds = wait_for_builds
    t0 = time.monotonic()
    try:
        srv.start()
    except BaseException:
        srv.stop()
        raise
    return srv, t0
