"""Start-up hooks for workers in the kill matrix and the bad-input
catalogue.  On a worker's PYTHONPATH only in those tests; acts only when
the worker's environment sets BH_TEST_HOOK:

  die-before-hello:<SIGNAL>:<flag file>
        when the flag file exists (removed first: one shot), the worker
        sends itself SIGNAL before bulkhead.worker runs;
  protocol:<n>
        the worker says HELLO with bulkhead protocol n.
"""

import os

_hook = os.environ.get("BH_TEST_HOOK", "")
if _hook.startswith("die-before-hello:"):
    _, _sig, _flag = _hook.split(":", 2)
    try:
        os.unlink(_flag)
    except FileNotFoundError:
        pass
    else:
        import signal
        os.kill(os.getpid(), getattr(signal, _sig))
elif _hook.startswith("protocol:"):
    from bulkhead import _native
    _native.PROTOCOL_VERSION = int(_hook.split(":", 1)[1])
