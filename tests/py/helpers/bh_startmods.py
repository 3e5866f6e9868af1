"""What a worker has imported (tests/py/test_worker_start.py)."""

import sys


def loaded(names):
    """Those of names this process has imported, in order."""
    return [n for n in names if n in sys.modules]
