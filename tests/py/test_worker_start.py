"""A worker's start imports only what serving a call needs: modules a
bare interpreter does not import and that a call does not use (json and
re, logging and traceback, socket and selectors; together several ms of
every worker's start, #40) are imported where they are used, not at the
worker's start.  Judged against a bare interpreter of the same
environment, not against a list of what a worker may import."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import HELPERS

DEFERRED = ["json", "re", "logging", "traceback", "socket", "selectors", "tokenize",
            # enum (signal's enum classes too) and the zygote's code (with
            # struct): a spawned worker serves calls without them; threading,
            # where _thread's lock and thread do; runpy (-m's), with what it
            # imports, where -c starts the worker (host/zygote.py WORKER_ARGS);
            # collections, for channel/spec.py's two rows
            "enum", "signal", "struct", "bulkhead.worker.zygote", "threading",
            "runpy", "importlib.util", "importlib.machinery", "contextlib", "functools",
            "collections", "keyword", "reprlib"]


def test_a_started_worker_has_imported_nothing_a_call_does_not_need(make_worker):
    w = make_worker(name="start")
    w.start()
    assert w.call("operator:add", 1, 2) == 3
    in_worker = w.call("bh_startmods:loaded", DEFERRED)
    bare = subprocess.run([sys.executable, "-S", "-c", "import sys; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert [n for n in in_worker if n not in bare] == []


def test_what_was_deferred_still_works_in_a_worker(make_worker):
    """Each deferred import where it is used: a record array's dtype
    description (json) both ways, and the pack logging a worker sets up
    when the pack imports logging."""
    np = __import__("numpy")
    w = make_worker(name="start-use")
    w.start()
    a = np.zeros(3, dtype=[("x", "<f4"), ("red", "u1")])
    a["x"] = [1.5, 2.5, 3.5]
    b = w.call("numpy:asarray", a)
    assert b.dtype == a.dtype and np.array_equal(b, a)
    assert w.call("bh_startmods:loaded", ["json"]) == ["json"]
    assert w.call("logging:getLevelName", 30) == "WARNING"


def test_a_worker_starts_as_dash_m_would(make_worker, tmp_path):
    """Started with -c, not -m (no runpy), a worker's sys.argv[0] and
    sys.path[0] are what ``python -m bulkhead.worker`` makes them: the
    origin of bulkhead.worker.__main__'s spec (runpy's argv[0]) and what a
    ``python -m`` run in the same directory finds first on sys.path."""
    w = make_worker(name="entry", cwd=str(tmp_path))
    w.start()
    argv0, path0 = w.call("bh_startmods:entry")
    dash_m = subprocess.run([sys.executable, "-m", "bh_startmods"], cwd=tmp_path, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=HELPERS), check=True).stdout.strip()
    assert path0 == dash_m
    assert argv0 == importlib.util.find_spec("bulkhead.worker.__main__").origin


WARM_TORCH = """
import json, os, torch
from bulkhead.worker import nodes
threads = lambda: len(os.listdir("/proc/self/task"))
rng = torch.random.get_rng_state()
nodes._warm_torch()
warmed = threads()
x = torch.full((512, 512), 0.5)          # a node's first tensor ops
float(torch.tanh(x @ x + 0.5).sum())
print(json.dumps([warmed, threads(), torch.equal(rng, torch.random.get_rng_state()), torch.cuda.is_initialized()]))
"""


def test_a_prewarmed_worker_s_first_tensor_ops_start_nothing():
    """rehearse (a prewarm's last step) runs torch's first-op set-up where
    the pack imported torch: a node's first tensor ops then start no
    thread (torch's intra-op pool runs already, as in a process whose
    torch ran before), and the warm-up drew nothing from the random
    stream and made no CUDA context.  A fresh interpreter, whose torch has
    run nothing yet."""
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() < 2:
        pytest.skip("one intra-op thread here: torch starts no pool")
    warmed, after_node, rng_same, cuda = json.loads(subprocess.run(
        [sys.executable, "-c", WARM_TORCH], capture_output=True, text=True, check=True).stdout)
    assert after_node == warmed
    assert rng_same and not cuda
