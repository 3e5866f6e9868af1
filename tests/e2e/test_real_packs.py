"""Real public packs, opt in: BULKHEAD_REAL_PACKS names a folder of packs
(fetched outside this repository, as their repositories hold them; never
committed).  They are copied unmodified into the custom_nodes/ of a
ComfyUI where bulkhead was installed through the Manager flow, ComfyUI
starts with nothing else done (their environments built at start), and
each pack that asks for isolation must load isolated: no IMPORT FAILED,
no "NOT isolated" line naming it, its nodes in /object_info.  A pack
whose dependencies cannot be had here (a host other than PyPI, a GPU) is
reported with bulkhead's one line for it, which is what the test prints.

    BULKHEAD_REAL_PACKS=/path/to/packs make check-py PYTEST_PATHS=tests/e2e/test_real_packs.py
"""

import os
import re

import pytest

REAL = os.environ.get("BULKHEAD_REAL_PACKS")

pytestmark = pytest.mark.skipif(not REAL, reason="BULKHEAD_REAL_PACKS names no folder of real packs")


def _asks_for_isolation(pack):
    if os.path.isfile(os.path.join(pack, "comfy-env.toml")):
        return True
    nodes = os.path.join(pack, "nodes")
    if os.path.isfile(os.path.join(nodes, "comfy-env.toml")):
        return True
    return os.path.isdir(nodes) and any(os.path.isfile(os.path.join(nodes, d, "comfy-env.toml"))
                                        for d in os.listdir(nodes))


def test_real_packs_run_isolated(comfyui, manager_install):
    packs = sorted(os.path.join(REAL, d) for d in os.listdir(REAL)
                   if os.path.isfile(os.path.join(REAL, d, "__init__.py")))
    assert packs, f"no packs (folders with an __init__.py) in {REAL}"
    srv = comfyui(packs=(), pack_dirs=packs, installed=manager_install)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    problems = []
    for pack in packs:
        name = os.path.basename(pack)
        if re.search(rf"IMPORT FAILED.*{re.escape(name)}|{re.escape(name)}.*IMPORT FAILED", log):
            problems.append(f"{name}: IMPORT FAILED")
        if not _asks_for_isolation(pack):
            continue
        lost = [line for line in log.splitlines() if "NOT isolated" in line and f"'{name}" in line]
        problems += [f"{name}: {line.strip()}" for line in lost]
    print("\n".join(problems) or f"all {len(packs)} packs isolated")
    assert not problems, "\n".join(problems) + "\n--- log ---\n" + log[-6000:]
