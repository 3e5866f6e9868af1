"""For both suites (tests/py, tests/e2e): under pytest-xdist each worker
runs in a mount namespace with a private /tmp (tests/xdist-worker), where
the base temporary directory the controller names has no parent yet."""

import os


def pytest_configure(config):
    basetemp = getattr(config.option, "basetemp", None)
    if basetemp and hasattr(config, "workerinput"):
        os.makedirs(os.path.dirname(os.path.abspath(str(basetemp))), exist_ok=True)
