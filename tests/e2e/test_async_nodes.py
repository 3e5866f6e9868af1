"""Async nodes and the grad mode, isolated and in ComfyUI's own process:
the same nodes (packs/e2e_async/nodes.py) loaded both ways in one server,
the isolated pack as "E2E..." and an in-process copy as "InProcE2E...",
and the same prompts queued over HTTP against each; what the user sees
must be the same (fixtures: conftest.py).

In ComfyUI's process a node whose FUNCTION is a coroutine function runs as
a task of the executor's event loop, and the executor goes on with other
nodes while it waits: three nodes sleeping at once overlap.  An interrupt
ends such a prompt; and every node runs under torch.inference_mode()."""

import os
import shutil
import time
import uuid

from .e2eenv import PACKS, worker_pids

WAYS = {"isolated": "", "in-process": "InProc"}

IN_PROCESS_INIT = '''
"""The e2e async pack's nodes in ComfyUI's own process, renamed InProc*."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "e2e_async_in_process_nodes", os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodes.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
NODE_CLASS_MAPPINGS = {"InProc" + k: v for k, v in _mod.NODE_CLASS_MAPPINGS.items()}
NODE_DISPLAY_NAME_MAPPINGS = {"InProc" + k: v for k, v in _mod.NODE_DISPLAY_NAME_MAPPINGS.items()}
'''


def _server(comfyui, tmp_path):
    """One server with the pack isolated and the same nodes in-process."""
    copy = tmp_path / "e2e_async_in_process"
    copy.mkdir()
    shutil.copy(os.path.join(PACKS, "e2e_async", "nodes.py"), copy / "nodes.py")
    (copy / "__init__.py").write_text(IN_PROCESS_INIT)
    return comfyui(packs=("e2e_async",), pack_dirs=(str(copy),))


def _sleeps(prefix, seconds, n=3, kind="E2EAsyncSleep"):
    """A prompt of n async sleeps (kind: the V1 node or the V3 one), each
    an output of its own (tags unique to the prompt: nothing comes from
    the cache)."""
    run = uuid.uuid4().hex[:8]
    return {str(i): {"class_type": f"{prefix}{kind}", "inputs": {"seconds": seconds, "tag": f"{run}-{i}"}}
            for i in range(1, n + 1)}


def _error(entry):
    """The last message of a prompt's history entry, in a line."""
    kind, data = entry["status"]["messages"][-1]
    return f"{kind}: {data.get('exception_message', '')}"


def _overlap(entry):
    """Whether the sleeps' intervals all overlap (one moment in all)."""
    spans = [(ui["start"][0], ui["end"][0]) for ui in entry["outputs"].values()]
    return len(spans) == 3 and max(s for s, _ in spans) < min(e for _, e in spans)


def test_async_nodes_overlap_isolated_as_in_process(comfyui, tmp_path):
    srv = _server(comfyui, tmp_path)
    overlap = {}
    for kind in ("E2EAsyncSleep", "E2EV3AsyncSleep"):
        for way, prefix in WAYS.items():
            entry = srv.wait_history(srv.queue(_sleeps(prefix, 1.0, kind=kind)), timeout_s=120)
            assert entry["status"]["status_str"] == "success", (way, kind, _error(entry), srv.log())
            overlap[kind, way] = _overlap(entry)
        assert overlap[kind, "in-process"], f"the oracle: in ComfyUI's process three {kind} overlap"
        assert overlap[kind, "isolated"] == overlap[kind, "in-process"], overlap


def test_an_interrupt_ends_a_prompt_of_running_async_nodes(comfyui, tmp_path):
    srv = _server(comfyui, tmp_path)
    ended, workers = {}, {}
    for way, prefix in WAYS.items():
        warm = srv.queue(_sleeps(prefix, 0.01))   # the worker started and its imports done first
        assert srv.wait_history(warm, timeout_s=120)["status"]["status_str"] == "success"
        workers[way] = set(worker_pids(srv))
        prompt_id = srv.queue(_sleeps(prefix, 300.0))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, q = srv.http("GET", "/queue")
            if q["queue_running"]:
                break
            time.sleep(0.05)
        time.sleep(0.5)   # the three are sleeping
        assert srv.http("POST", "/interrupt", {})[0] == 200
        entry = srv.wait_history(prompt_id, timeout_s=60)
        ended[way] = (entry["status"]["status_str"], [m[0] for m in entry["status"]["messages"]][-1])
    assert ended["in-process"] == ("error", "execution_interrupted"), ended
    assert ended["isolated"] == ended["in-process"], ended
    assert set(worker_pids(srv)) == workers["isolated"], srv.log()   # its worker lives on
    again = srv.wait_history(srv.queue(_sleeps("", 0.01)), timeout_s=60)
    assert again["status"]["status_str"] == "success", srv.log()


def test_node_code_runs_under_the_grad_mode_of_comfyuis_executor(comfyui, tmp_path):
    srv = _server(comfyui, tmp_path)
    seen = {}
    for way, prefix in WAYS.items():
        entry = srv.wait_history(srv.queue({
            "1": {"class_type": f"{prefix}E2EGradMode", "inputs": {"tag": "sync"}},
            "2": {"class_type": f"{prefix}E2EAsyncGradMode", "inputs": {"tag": "async"}}}), timeout_s=120)
        assert entry["status"]["status_str"] == "success", (way, _error(entry), srv.log())
        seen[way] = {node: ui for node, ui in entry["outputs"].items()}
    assert seen["isolated"] == seen["in-process"], seen
