"""What a worker has imported (tests/py/test_worker_start.py)."""

import sys


def loaded(names):
    """Those of names this process has imported, in order."""
    return [n for n in names if n in sys.modules]


def entry():
    """[sys.argv[0], sys.path[0]]: what a worker's start made them."""
    return [sys.argv[0], sys.path[0]]


if __name__ == "__main__":   # `python -m bh_startmods`: what -m makes sys.path[0]
    print(sys.path[0])
