"""#25: a prompt's workers are started ahead of its first node only where
its nodes will execute: ComfyUI's cache decides (its executor's
`execution_cached`, before any node runs), as it does for in-process
nodes.  Driven over HTTP, with the e2e pack's idle exit at 2 s."""

import json
import re
import time

import psutil


def _log(srv):
    with open(srv.log_path, errors="replace") as f:
        return f.read()


def _wait_log(srv, pattern, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(pattern, _log(srv))
        if m:
            return m
        time.sleep(0.1)
    raise AssertionError(f"no {pattern!r} in the log:\n{_log(srv)[-6000:]}")


def _pack_pid(srv):
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200, doc
    [row] = [p for p in doc["packs"] if p["name"] == "e2e_pack"]
    return row["pid"]


def test_a_fully_cached_prompt_starts_no_worker(comfyui):
    srv = comfyui(env={"BH_E2E_IDLE_EXIT": "2"})
    prompt = {"1": {"class_type": "E2EEcho", "inputs": {"text": "cached", "times": 2}}}
    first = srv.queue(prompt)
    entry = srv.wait_history(first)
    assert entry["status"]["status_str"] == "success", entry["status"]
    pid = entry["outputs"]["1"]["pid"][0]   # the worker that described the pack's nodes at start
    # idle, holding nothing: the worker exits
    _wait_log(srv, rf"its worker \(pid {pid}\) exited after")
    assert _pack_pid(srv) is None

    # the same prompt again: ComfyUI serves it from its cache; no worker starts
    second = srv.queue(prompt)
    entry = srv.wait_history(second)
    assert entry["status"]["status_str"] == "success", entry["status"]
    cached = [m for kind, m in entry["status"]["messages"] if kind == "execution_cached"]
    assert cached and cached[0]["nodes"] == ["1"], entry["status"]
    assert _pack_pid(srv) is None
    assert psutil.Process(srv.proc.pid).children(recursive=True) == []

    # a prompt with new inputs starts it again: its VALIDATE_INPUTS, at queue time (the inputs that
    # passed before, the cached prompt's, are not asked again), and the node runs there
    third = srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "new", "times": 1}}})
    entry = srv.wait_history(third)
    assert entry["status"]["status_str"] == "success" and entry["outputs"]["1"]["text"] == ["new"]
    assert entry["outputs"]["1"]["pid"][0] not in (None, pid)
    log = _log(srv)
    assert f"for prompt {second}" not in log, log[-3000:]


def test_a_v3_validate_inputs_on_a_stopped_worker_refuses_at_queue_time(comfyui):
    """With nothing starting workers when a prompt is queued, a V3 node's
    validate_inputs, which ComfyUI calls on the server's event loop, finds
    its worker stopped (here by its idle exit): ComfyUI's executor awaits a
    task a validator returns, so the worker is started on a thread of its
    own (never on the loop) and the prompt is refused at queue time, as
    in-process (it was deferred to the node's run: an execution_error
    instead of HTTP 400).  A good prompt then runs."""
    srv = comfyui(packs=("e2e_v3",), env={"BULKHEAD_IDLE_EXIT_S": "2"})
    _wait_log(srv, r"its worker \(pid \d+\) exited after")
    status, bad = srv.http("POST", "/prompt", {"prompt": {
        "1": {"class_type": "E2EV3Count", "inputs": {"n": 7}},
        "2": {"class_type": "E2EV3Show", "inputs": {"value": ["1", 0]}}}})
    assert status == 400 and bad["error"]["type"] == "prompt_outputs_failed_validation", bad
    assert "seven is not allowed" in json.dumps(bad["node_errors"]["1"]), bad
    assert "is checked when the node runs" not in _log(srv)
    good = srv.wait_history(srv.queue({"1": {"class_type": "E2EV3Count", "inputs": {"n": 3}},
                                       "2": {"class_type": "E2EV3Show", "inputs": {"value": ["1", 0]}}}))
    assert good["status"]["status_str"] == "success", good["status"]
