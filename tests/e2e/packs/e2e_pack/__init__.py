"""The e2e suite's own isolated pack: its nodes (nodes.py) run in a worker
under the host's own interpreter (which has torch, as the worker's
`comfy` import needs), so no environment has to be built for it.  It is
what `bulkhead.comfy_pack` does for a built environment, with the
interpreter named instead of found from a comfy-env.toml.  BH_E2E_PREWARM
sets its prewarm option (as `prewarm` in a comfy-env.toml would), and
BH_E2E_IDLE_EXIT its idle exit time (`idle_exit_s`).  BH_E2E_SWEEP_S and
BH_E2E_PRESSURE_MIN_IDLE_S set host/idle.py's SWEEP_S and
PRESSURE_MIN_IDLE_S in this server (neither is a setting): the sweeper and
the exit under memory pressure run as they do, on a test's clock instead
of seconds of waiting.  With BH_E2E_IN_PROCESS set its nodes are imported
in ComfyUI's process instead, for the tests that compare the two
(tests/e2e/test_server.py)."""
import os
import sys

if os.environ.get("BH_E2E_IN_PROCESS"):
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401
else:
    from bulkhead.host import idle, nodes, pack

    for _name in ("SWEEP_S", "PRESSURE_MIN_IDLE_S"):
        if os.environ.get("BH_E2E_" + _name):
            if not hasattr(idle, _name):   # a rename must fail here, not leave the test waiting on the old value
                raise AttributeError(f"host/idle.py has no {_name}: rename BH_E2E_{_name} here and in the tests")
            setattr(idle, _name, float(os.environ["BH_E2E_" + _name]))
    _hm = pack.host_memory()
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
        os.path.dirname(os.path.abspath(__file__)), sys.executable,
        env={"BH_E2E_HELPERS": os.environ.get("BH_E2E_HELPERS", "")},  # workers get an allow-listed environment
        options={"cache": False, "prewarm": os.environ.get("BH_E2E_PREWARM", "prompt"),
                 **({"idle_exit_s": float(os.environ["BH_E2E_IDLE_EXIT"])} if os.environ.get("BH_E2E_IDLE_EXIT")
                    else {})}, memory=_hm)
