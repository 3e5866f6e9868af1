"""bulkhead in a ComfyUI server process, driven only over HTTP and the
websocket, as the web UI drives it (fixtures: conftest.py)."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from .e2eenv import PACKS, rss, worker_pids

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _in_process_info():
    """/object_info's rows for the e2e pack's classes loaded in-process (the
    node classes themselves, nodes.py), computed as ComfyUI's node_info."""
    spec = importlib.util.spec_from_file_location("e2e_pack_nodes", os.path.join(PACKS, "e2e_pack", "nodes.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = {}
    for name, cls in mod.NODE_CLASS_MAPPINGS.items():
        types = cls.INPUT_TYPES()
        out[name] = {
            "input": types, "input_order": {k: list(v) for k, v in types.items()},
            "output": list(cls.RETURN_TYPES),
            "output_is_list": list(getattr(cls, "OUTPUT_IS_LIST", [False] * len(cls.RETURN_TYPES))),
            "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)), "name": name,
            "display_name": mod.NODE_DISPLAY_NAME_MAPPINGS.get(name, name),
            "description": getattr(cls, "DESCRIPTION", ""), "python_module": "custom_nodes.e2e_pack",
            "category": cls.CATEGORY, "output_node": getattr(cls, "OUTPUT_NODE", False)}
    return json.loads(json.dumps(out))


@pytest.fixture(scope="module")
def served(comfyui_module):
    """One server with the e2e pack for the module's tests that only ask it
    (the node list, a prompt of their own, /bulkhead/status, an empty
    /free); its worker never exits idle, so nothing of it changes while
    the module's other tests run."""
    return comfyui_module(env={"BH_E2E_IDLE_EXIT": "0"})


def test_object_info_shows_the_isolated_nodes_as_in_process(served):
    srv = served
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    expected = _in_process_info()
    got = {k: v for k, v in info.items() if k.startswith("E2E")}
    assert got == expected
    status, one = srv.http("GET", "/api/object_info/E2EEcho")
    assert status == 200 and one == {"E2EEcho": expected["E2EEcho"]}


def test_prompt_runs_in_the_worker_and_its_ui_is_in_the_history(served):
    srv = served
    prompt_id = srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "ab", "times": 3}}})
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    ui = entry["outputs"]["1"]
    assert ui["text"] == ["ababab"] and ui["node"] == ["1"]
    assert ui["pid"][0] != srv.proc.pid and ui["pid"][0] in worker_pids(srv)
    # validation as upstream: VALIDATE_INPUTS (inline on the event loop,
    # crossing to the worker) and min/max, each a 400 naming the node
    status, bad = srv.http("POST", "/prompt", {"prompt": {
        "1": {"class_type": "E2EEcho", "inputs": {"text": "a\nb", "times": 1}},
        "2": {"class_type": "E2EEcho", "inputs": {"text": "a", "times": 99}}}})
    assert status == 400 and bad["error"]["type"] == "prompt_outputs_failed_validation"
    assert [e["type"] for e in bad["node_errors"]["1"]["errors"]] == ["custom_validation_failed"]
    assert "one line only" in bad["node_errors"]["1"]["errors"][0]["details"]
    assert [e["type"] for e in bad["node_errors"]["2"]["errors"]] == ["value_bigger_than_max"]
    status, bad = srv.http("POST", "/prompt", {"prompt": {"1": {"class_type": "Nope", "inputs": {}}}})
    # "missing_node_type" in newer upstream (the stub's), "invalid_prompt" up to v0.3.64
    assert status == 400 and bad["error"]["type"] in ("missing_node_type", "invalid_prompt"), bad
    assert "Nope" in bad["error"]["message"], bad


def test_progress_frames_reach_the_websocket(served):
    srv = served

    async def go(ws, sid):
        first = json.loads((await ws.receive()).data)
        assert first["type"] == "status" and first["data"]["sid"] == sid
        prompt_id = srv.queue({"1": {"class_type": "E2ESteps", "inputs": {"steps": 4}},
                               "2": {"class_type": "E2EEcho", "inputs": {"text": "x", "times": 1}}},
                              client_id=sid)
        seen = []
        while True:
            msg = json.loads((await ws.receive()).data)
            seen.append(msg)
            if msg["type"] in ("execution_success", "execution_error"):
                return prompt_id, seen
    prompt_id, seen = srv.run_ws(go)
    kinds = [m["type"] for m in seen]
    assert "execution_start" in kinds and kinds[-1] == "execution_success", kinds
    progress = [(m["data"]["value"], m["data"]["max"]) for m in seen if m["type"] == "progress"]
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(m["data"]["prompt_id"] == prompt_id for m in seen if m["type"] == "progress")
    executed = [m["data"] for m in seen if m["type"] == "executed"]
    assert executed and executed[0]["node"] == "2" and executed[0]["output"]["text"] == ["x"]


def _queue_spin(srv):
    """Queues a 60 s E2ESpin and returns its prompt id once the worker runs
    it.  The worker's first node imports torch and ComfyUI there (seconds
    on a loaded machine): a click during that import is a click on a node
    that does not check the flag yet, which the hard interrupt
    (interrupt_grace_s) answers by stopping the worker; so a short spin
    runs first, and the 60 s one finds the imports done."""
    warm = srv.queue({"1": {"class_type": "E2ESpin", "inputs": {"seconds": 0.01}}})
    assert srv.wait_history(warm)["status"]["status_str"] == "success"
    prompt_id = srv.queue({"1": {"class_type": "E2ESpin", "inputs": {"seconds": 60.0}}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # running: the worker has the node
        _, q = srv.http("GET", "/queue")
        if q["queue_running"] and worker_pids(srv):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    return prompt_id


def test_interrupt_stops_a_running_isolated_node(comfyui):
    srv = comfyui()
    prompt_id = _queue_spin(srv)
    assert srv.http("POST", "/interrupt", {})[0] == 200
    entry = srv.wait_history(prompt_id, timeout_s=20)
    assert entry["status"]["status_str"] == "error"
    assert [m[0] for m in entry["status"]["messages"]][-1] == "execution_interrupted"
    assert len(worker_pids(srv)) == 1, srv.log()[-4000:]   # the worker survived its interrupt
    again = srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "after", "times": 1}}})
    assert srv.wait_history(again)["outputs"]["1"]["text"] == ["after"]


def test_interrupt_stops_a_progress_bar_node_on_a_fresh_worker(comfyui):
    """A node that only uses comfy.utils.ProgressBar, the first node of a
    fresh worker (comfy.model_management never imported there): the stop
    button ends it at its next progress update, as in-process, and the
    worker lives on.  (The worker's progress hook checked only ComfyUI's
    flag, which has no module yet: the click waited for the grace and the
    worker was killed, its models lost.)"""
    srv = comfyui()

    async def go(ws, client_id):
        prompt_id = srv.queue({"1": {"class_type": "E2ESteps", "inputs": {"steps": 50}}}, client_id=client_id)
        while True:
            msg = json.loads((await ws.receive()).data)
            if msg["type"] == "progress" and msg["data"]["value"] >= 2:
                return prompt_id
    prompt_id = srv.run_ws(go)
    pids = set(worker_pids(srv))
    assert srv.http("POST", "/interrupt", {})[0] == 200
    entry = srv.wait_history(prompt_id, timeout_s=20)
    assert [m[0] for m in entry["status"]["messages"]][-1] == "execution_interrupted", entry["status"]
    assert set(worker_pids(srv)) == pids and len(pids) == 1, srv.log()[-4000:]   # the same worker, alive


def test_bulkhead_status_and_free_answer(served):
    srv = served
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200 and any(p["pid"] == srv.proc.pid and p["role"] == "host" for p in doc["processes"])
    status, doc = srv.http("GET", "/api/bulkhead/status")
    assert status == 200 and "devices" in doc
    assert srv.http("POST", "/free", {}) == (200, None)   # upstream's empty 200 when nothing is asked


def test_free_reports_the_bytes_a_worker_gave_back(comfyui):
    srv = comfyui()
    prompt_id = srv.queue({"1": {"class_type": "E2EHoldRam", "inputs": {"name": "UNetE2E", "mib": 256}}})
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    pid = entry["outputs"]["1"]["pid"][0]
    rss_before = rss(pid)
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    rows = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
    assert rows and rows[0]["freed_bytes"] >= 256 << 20, body
    assert body["bulkhead"]["freed_bytes"] >= 256 << 20
    # "Free model and node cache" also stops an idle worker that holds
    # nothing ComfyUI references (host/idle.py): then every byte is back
    assert rows[0]["state"] in ("released", "exited"), rows
    if rows[0]["state"] == "exited":
        assert _wait_gone(pid, 10)
    else:
        assert rss(pid) < rss_before - (200 << 20)


def test_one_free_reports_what_comfyuis_cache_drop_lets_go(comfyui):
    """#25 item 5: the worker's 48 MiB output lives in a block ComfyUI's
    output cache holds.  ComfyUI drops that cache on its prompt thread
    after /free sets the flags; one /free reports those bytes freed (main
    released the workers before ComfyUI let go of them: freed 0, and a
    second press freed them), and a second press finds nothing left.  (Its
    idle exit off: /free would stop the worker, every byte back anyway.)"""
    srv = comfyui(env={"BH_E2E_IDLE_EXIT": "0"})
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EBigArray", "inputs": {"mib": 48}}}))
    assert entry["status"]["status_str"] == "success", entry["status"]
    pid = entry["outputs"]["1"]["pid"][0]
    deadline = time.monotonic() + 10   # the worker's recount after the call publishes the block
    while time.monotonic() < deadline and worker_pids(srv)[pid]["held_bytes"] < 48 << 20:
        time.sleep(0.05)
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200, body
    [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
    assert row["freed_bytes"] >= 48 << 20, body["bulkhead"]
    assert body["bulkhead"]["comfyui_settled"] is True, body["bulkhead"]
    status, again = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    [row] = [r for r in again["bulkhead"]["processes"] if r["pid"] == pid]
    assert row["freed_bytes"] < 4 << 20, again["bulkhead"]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    return not _alive(pid)


def test_free_right_after_a_node_that_computed_stops_its_worker(comfyui):
    """A worker whose node has just computed is not "at work of its own":
    ComfyUI's "Free model and node cache" right after the node stops it.
    The idle sweeper's CPU sample, taken before the node ran, counted the
    node's own CPU second as work in no call, and /free kept the worker
    (bench/many_packs.py's /free found workers left)."""
    from bulkhead.host import idle
    srv = comfyui()
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "a", "times": 1}}}))
    pid = entry["outputs"]["1"]["pid"][0]
    time.sleep(idle.SWEEP_S + 1)             # the sweeper has sampled the worker's CPU
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EBurn", "inputs": {"seconds": 1.5}}}))
    assert entry["status"]["status_str"] == "success", entry["status"]
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
    assert row["state"] == "exited", (body["bulkhead"], srv.log()[-2000:])
    assert "runs no node but stays" not in srv.log()


def test_free_right_after_a_prompt_stops_its_worker_whose_release_took_cpu(comfyui):
    """ComfyUI's "Free model and node cache" right after a prompt stops the
    prompt's worker, though a release ladder on it just before -- /free's
    own, or the panel's Release (POST /bulkhead/free) -- cost CPU in the
    worker (its collection walks the 1.5 million objects its pack holds).
    The idle sweeper's CPU sample, taken after the node and before the end
    of that release, counted the release as work the worker did of its own
    in no call, and /free kept it ("runs no node but stays: it used 42% of
    a CPU in no call": bench/many_packs.py's /free found workers left).
    The sweeper samples every 0.5 s here (BH_E2E_SWEEP_S), and the
    prompt's end is 0.6 s behind: a sample falls there in every round, and
    only one taken in the release's last few hundredths of a second would
    not have counted it (a round in ten, at most)."""
    srv = comfyui(env={"BH_E2E_SWEEP_S": "0.5"})
    for i, release_first in enumerate((False, True, True)):
        entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EHoldObjects", "inputs": {"count": 1_500_000 + i}}}))
        assert entry["status"]["status_str"] == "success", entry["status"]
        pid = entry["outputs"]["1"]["pid"][0]
        time.sleep(0.6)
        if release_first:
            status, body = srv.http("POST", "/bulkhead/free", {})
            assert status == 200 and [r["state"] for r in body["processes"] if r["pid"] == pid] == ["released"], body
        status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
        assert status == 200
        assert "runs no node but stays" not in srv.log(), (i, body["bulkhead"], srv.log()[-2000:])
        [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
        assert row["state"] == "exited" and not _alive(pid), (i, body["bulkhead"], srv.log()[-2000:])


def test_an_idle_worker_exits_unless_comfyui_holds_its_objects(comfyui):
    """#27: an idle worker costs nothing.  With idle_exit_s = 2: a worker
    whose object ComfyUI caches (a handle) stays and is released instead,
    saying so; ComfyUI's "Free model and node cache" (/free free_memory)
    drops that cache and the worker exits, its row "exited"; the next
    prompt starts it again; and, holding nothing, it exits on its own
    after its idle time."""
    srv = comfyui(env={"BH_E2E_IDLE_EXIT": "2"})
    prompt = {"1": {"class_type": "E2EMakeThing", "inputs": {"label": "kept"}},
              "2": {"class_type": "E2EUseThing", "inputs": {"thing": ["1", 0], "suffix": ""}}}
    entry = srv.wait_history(srv.queue(prompt))
    assert entry["status"]["status_str"] == "success", entry["status"]
    pid = entry["outputs"]["2"]["pid"][0]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "but stays" not in srv.log():
        time.sleep(0.2)
    assert "but stays: ComfyUI holds" in srv.log(), srv.log()[-3000:]
    assert _alive(pid)
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
    assert row["state"] == "exited", body["bulkhead"]
    assert _wait_gone(pid, 10)
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "again", "times": 1}}}))
    assert entry["status"]["status_str"] == "success" and entry["outputs"]["1"]["text"] == ["again"]
    second = entry["outputs"]["1"]["pid"][0]
    assert second != pid
    assert _wait_gone(second, 30), srv.log()[-2500:]
    deadline = time.monotonic() + 10      # the line is written once the worker has gone
    while time.monotonic() < deadline and f"its worker (pid {second}) exited after" not in srv.log():
        time.sleep(0.1)
    assert f"its worker (pid {second}) exited after" in srv.log()


def test_a_worker_at_work_of_its_own_is_not_stopped(comfyui, tmp_path):
    """#37: a worker running no node but working for its pack (a thread
    computing, a process of its own, or a thread inside
    bulkhead.working()) is stopped neither by its idle exit (1 s here:
    the sweeper looks every 0.5 s, five times while the job runs past it)
    nor, for the pack's busy context, by ComfyUI's "Free model and node
    cache"; in-process nothing stops a pack's own thread.  Once the work
    ends, the worker exits after its idle time.  (A 20 s job was cut at
    2-4 s.)"""
    srv = comfyui(env={"BH_E2E_IDLE_EXIT": "1"})
    for kind in ("cpu", "child", "context"):
        done = tmp_path / f"{kind}.done"
        entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EBackground",
                                                  "inputs": {"kind": kind, "seconds": 3.5, "done": str(done)}}}))
        assert entry["status"]["status_str"] == "success", entry["status"]
        pid = entry["outputs"]["1"]["pid"][0]
        time.sleep(2.5)                      # past twice its idle exit time
        if kind == "context":
            status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
            assert status == 200 and all(r["state"] != "exited" for r in body["bulkhead"]["processes"]
                                         if r["pid"] == pid), body
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            assert _alive(pid), (kind, srv.log()[-3000:])
            time.sleep(0.2)
        assert done.read_text() == str(pid), kind
        assert _wait_gone(pid, 30), (kind, srv.log()[-3000:])    # then idle: it exits
    assert "runs no node but stays" in srv.log()


# ComfyUI's execution values through an isolated pack (channel/nodes.py):
# a node's ExecutionBlocker, with a message and silent; a V1 node's hidden
# DYNPROMPT, at the top and inside an expansion; a GraphBuilder expansion,
# nested, whose node ids carry the prefix ComfyUI's executor sets.
FLOW_PROMPT = {
    "1": {"class_type": "E2EBlock", "inputs": {"text": "a", "block": True, "verbose": True}},
    "2": {"class_type": "E2EShow", "inputs": {"text": ["1", 0]}},
    "3": {"class_type": "E2EBlock", "inputs": {"text": "b", "block": True, "verbose": False}},
    "4": {"class_type": "E2EShow", "inputs": {"text": ["3", 0]}},
    "5": {"class_type": "E2EBlock", "inputs": {"text": "c", "block": False, "verbose": False}},
    "6": {"class_type": "E2EShow", "inputs": {"text": ["5", 0]}},
    "7": {"class_type": "E2EExpand", "inputs": {"text": "x", "depth": 2}},
    "8": {"class_type": "E2EShow", "inputs": {"text": ["7", 0]}},
    "9": {"class_type": "E2EWhere", "inputs": {}},
}


def _flow(srv):
    """What the user sees of FLOW_PROMPT on srv: its /history entry and its
    websocket messages node by node (differential.by_node), with the
    prompt id, timestamps and what follows the order of ComfyUI's sets (an
    error's `executed`) taken out."""
    from .differential import by_node, normal

    async def session(ws, sid):
        prompt_id = srv.queue(FLOW_PROMPT, client_id=sid)
        messages = []
        while True:
            msg = json.loads((await ws.receive()).data)
            if msg["type"] in ("status", "crystools.monitor"):
                continue
            if msg["type"] == "execution_error":
                # the nodes done before it: which depends on the order
                # ComfyUI ran the others in (its sets' order, a hash seed's)
                msg["data"].pop("executed", None)
            messages.append(msg)
            if msg["type"] == "executing" and msg["data"].get("node") is None \
                    and msg["data"].get("prompt_id") == prompt_id:
                return prompt_id, messages
    prompt_id, messages = srv.run_ws(session)
    history = normal(srv.wait_history(prompt_id), prompt_id)
    history["prompt"][-1].sort()   # the outputs to execute: a set's order in real ComfyUI
    return {"history": history, "messages": by_node(normal(messages, prompt_id))}


def test_blockers_dynprompt_and_expansions_are_what_they_are_in_process(comfyui):
    """The same prompt through the e2e pack isolated and imported in
    ComfyUI's process: the same /history (each output node's ui under the
    same node ids) and the same messages.  Before: the blocker reached the
    next node as a handle, E2EWhere's DYNPROMPT was refused, and the
    expansion's nodes were ".0.<n>.<k>"."""
    isolated = _flow(comfyui())
    in_process = _flow(comfyui(name="in_process", env={"BH_E2E_IN_PROCESS": "1"}))
    for key in in_process:
        assert isolated[key] == in_process[key], (f"{key} differs:\nisolated   {json.dumps(isolated[key])}\n"
                                                  f"in-process {json.dumps(in_process[key])}")
    # and what both show is what the nodes do
    assert in_process["history"]["status"]["status_str"] == "success"
    outputs = in_process["history"]["outputs"]
    assert outputs["6"]["text"] == ["c"] and "2" not in outputs and "4" not in outputs
    errors = [(m["data"]["node_id"], m["data"]["exception_message"]) for m in in_process["messages"]["prompt"]
              if m["type"] == "execution_error"]
    assert errors == [("2", "Execution Blocked: a is blocked")]
    assert outputs["8"]["text"] == ["x1"] and outputs["7.0.0.1"]["text"] == ["x2"]
    assert outputs["7.0.0.3.0.0.2"]["siblings"] == ["7.0.0.3.0.0.1", "7.0.0.3.0.0.2"]
    assert outputs["7.0.0.3.0.0.2"]["parent"] == ["7.0.0.3"] and outputs["9"]["original"] == sorted(FLOW_PROMPT)


def test_a_dropdown_a_pack_lists_itself_shows_a_file_added_since(comfyui):
    """#35: a list a pack builds with os.listdir (not folder_paths) is read
    again when the frontend asks for the node definitions, as in ComfyUI's
    own process, so a file added since is in /object_info's dropdown and a
    prompt naming it runs (it was served from the description: missing,
    and the prompt refused "value not in list").  Isolated and in-process,
    compared."""
    seen = {}
    for way, env in (("isolated", {}), ("in_process", {"BH_E2E_IN_PROCESS": "1"})):
        srv = comfyui(name=way, env=env)
        listed = os.path.join(srv.base, "custom_nodes", "e2e_pack", "listed")
        os.makedirs(listed, exist_ok=True)
        open(os.path.join(listed, "a.txt"), "w").close()
        options = lambda: srv.http("GET", "/object_info/E2EListed")[1]["E2EListed"]["input"]["required"]["name"][0]
        before = options()
        entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EListed", "inputs": {"name": "a.txt"}}}))
        assert entry["status"]["status_str"] == "success", (way, entry["status"])
        open(os.path.join(listed, "b.txt"), "w").close()
        deadline = time.monotonic() + 10    # the worker's answer is asked for at most every second
        while "b.txt" not in options() and time.monotonic() < deadline:
            time.sleep(0.3)
        after = options()
        entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EListed", "inputs": {"name": "b.txt"}}}))
        seen[way] = (before, after, entry["status"]["status_str"], entry["outputs"]["1"]["name"])
        srv.stop()
    assert seen["isolated"] == seen["in_process"] == (["a.txt"], ["a.txt", "b.txt"], "success", ["b.txt"]), seen


def _ram_tree(root, available_kib):
    """A /proc tree for the RAM probe (BULKHEAD_RAM_ROOT): 16 GiB, this
    much available."""
    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    tmp = os.path.join(root, "proc", "meminfo.tmp")
    with open(tmp, "w") as f:
        f.write(f"MemTotal: 16777216 kB\nMemFree: {available_kib} kB\nMemAvailable: {available_kib} kB\n")
    os.replace(tmp, os.path.join(root, "proc", "meminfo"))


def test_idle_workers_exit_first_under_machine_memory_pressure(comfyui, tmp_path):
    """#27: below BULKHEAD_IDLE_PRESSURE_PCT (10%) of RAM available, an idle
    worker exits whatever its idle exit time (600 s here), saying why; with
    memory back, the next prompt's worker starts and stays.  (The RAM the
    host sees is a /proc tree, BULKHEAD_RAM_ROOT, as the probe's tests use.)
    The sweeper looks every 0.5 s and a worker must be idle 1 s before
    pressure stops it (the e2e pack's BH_E2E_SWEEP_S and
    BH_E2E_PRESSURE_MIN_IDLE_S), not 5 s and 10 s: the same sweep on a
    shorter clock, on which the worker that stays is seen through six
    sweeps past its least idle time (the 12 s waited on the product's
    clock held one at most)."""
    ram = str(tmp_path / "ram")
    _ram_tree(ram, 1 << 20)                 # 1 GiB of 16: 6% available
    srv = comfyui(env={"BULKHEAD_RAM_ROOT": ram, "BH_E2E_SWEEP_S": "0.5", "BH_E2E_PRESSURE_MIN_IDLE_S": "1"})
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "p", "times": 1}}}))
    assert entry["status"]["status_str"] == "success", entry["status"]
    pid = entry["outputs"]["1"]["pid"][0]
    assert _wait_gone(pid, 30), srv.log()[-2500:]
    deadline = time.monotonic() + 10      # the line is written once the worker has gone
    while time.monotonic() < deadline and f"its worker (pid {pid}) exited under" not in srv.log():
        time.sleep(0.1)
    assert f"its worker (pid {pid}) exited under machine memory pressure" in srv.log()
    assert "of 10% of RAM available, BULKHEAD_IDLE_PRESSURE_PCT" in srv.log()
    _ram_tree(ram, 8 << 20)                 # 8 GiB of 16: no pressure
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "q", "times": 1}}}))
    second = entry["outputs"]["1"]["pid"][0]
    assert second != pid and not _wait_gone(second, 4)      # six sweeps past its least idle time: it stays
    assert f"its worker (pid {second}) exited" not in srv.log()


def test_a_second_instance_works_independently(comfyui):
    a = comfyui(name="a")
    b = comfyui(name="b")
    assert a.port != b.port
    pa = a.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "a", "times": 1}}})
    pb = b.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "b", "times": 2}}})
    ea, eb = a.wait_history(pa), b.wait_history(pb)
    assert ea["outputs"]["1"]["text"] == ["a"] and eb["outputs"]["1"]["text"] == ["bb"]
    wa, wb = ea["outputs"]["1"]["pid"][0], eb["outputs"]["1"]["pid"][0]
    assert wa != wb and wa in worker_pids(a) and wb in worker_pids(b)
    assert pb not in a.http("GET", "/history")[1] and pa not in b.http("GET", "/history")[1]
    a.stop()   # one instance ending leaves the other's worker serving
    again = b.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "c", "times": 1}}})
    assert b.wait_history(again)["outputs"]["1"]["pid"] == [wb]


def test_a_prompt_after_an_idle_worker_was_killed(comfyui):
    srv = comfyui()
    prompt = {"1": {"class_type": "E2EEcho", "inputs": {"text": "k", "times": 1}}}
    first = srv.wait_history(srv.queue(prompt))
    pid = first["outputs"]["1"]["pid"][0]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    prompt["1"]["inputs"]["times"] = 2   # not a cached result
    entry = srv.wait_history(srv.queue(prompt))
    assert entry["status"]["status_str"] == "success", entry["status"]["messages"]
    assert entry["outputs"]["1"]["text"] == ["kk"] and entry["outputs"]["1"]["pid"][0] != pid


def test_example_packs_run_in_their_own_environments(comfyui, example_envs):
    srv = comfyui(packs=(), example_packs=("old_numpy_pack", "new_numpy_pack"), bulkhead_home=example_envs)
    status, info = srv.http("GET", "/object_info")
    assert {"MakeGradient", "Stats"} <= set(info), srv.log()
    assert info["Stats"]["python_module"] == "custom_nodes.new_numpy_pack"
    prompt_id = srv.queue({"1": {"class_type": "MakeGradient", "inputs": {"width": 64, "height": 32}},
                           "2": {"class_type": "Stats", "inputs": {"image": ["1", 0], "levels": 16}}})
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", entry["status"]["messages"]
    assert "runs in-process" not in srv.log()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make chromium`)")
def test_the_panel_loads_from_the_server_and_shows_this_hosts_worker(comfyui, tmp_path):
    srv = comfyui(packs=("e2e_pack", "e2e_frontend"))
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EEcho", "inputs": {"text": "p", "times": 1}},
                                        "2": {"class_type": "E2EHoldRam", "inputs": {"name": "UNetP", "mib": 96}}}))
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log()[-3000:])
    worker = entry["outputs"]["1"]["pid"][0]
    assert entry["outputs"]["2"]["pid"][0] == worker
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--user-data-dir=" + str(tmp_path / "chromium"),
             "--virtual-time-budget=4000", "--window-size=400,760"]
    # the page presses "Free worker memory" after 2 s: the panel shows what this host's worker gave back
    dom = subprocess.run(flags + ["--dump-dom", srv.url + "/e2e/panel?press=2000"], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0 and "data-bh-panel" in dom.stdout, dom.stderr[-3000:]
    assert 'data-tabs="bulkhead:custom"' in dom.stdout
    assert f'data-pid="{worker}"' in dom.stdout and f'data-pid="{srv.proc.pid}"' in dom.stdout
    assert f'data-bh-freed="" data-freed-bytes="{96 << 20}"' in dom.stdout, srv.log()[-3000:]
    assert f'data-pid="{worker}" data-pack="e2e_pack" data-freed-bytes="{96 << 20}"' in dom.stdout
    assert "Freed <b>96.0 MiB</b> from 1 of 1 worker<" in dom.stdout


def test_a_node_object_outlives_its_worker_when_nothing_prewarms(comfyui):
    # ComfyUI keeps node objects per node id across prompts; the proxy's
    # object holds the real node's handle.  With nothing starting the
    # worker ahead of the node (prewarm off, no VALIDATE_INPUTS), the node
    # is the first to meet the dead worker: it runs on the next generation
    # with a new real node instead of failing with a HandleError.
    srv = comfyui(env={"BH_E2E_PREWARM": "off"})
    first = srv.wait_history(srv.queue({"1": {"class_type": "E2ESteps", "inputs": {"steps": 1}},
                                        "2": {"class_type": "E2EEcho", "inputs": {"text": "k", "times": 1}}}))
    assert first["status"]["status_str"] == "success", first["status"]["messages"]
    pid = first["outputs"]["2"]["pid"][0]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2ESteps", "inputs": {"steps": 2}}}))
    assert entry["status"]["status_str"] == "success", entry["status"]["messages"]
    assert "HandleError" not in srv.log()


def test_a_handle_producing_node_runs_again_after_its_worker_restarted(comfyui):
    # ComfyUI's output cache keeps what MakeThing returned: a handle into
    # the worker.  Once that worker has died the handle is dead, so the
    # node must run again (on the next generation) though its inputs did
    # not change; while the worker lives, its output stays cached.
    srv = comfyui()
    prompt = {"1": {"class_type": "E2EMakeThing", "inputs": {"label": "t"}},
              "2": {"class_type": "E2EUseThing", "inputs": {"thing": ["1", 0], "suffix": "-a"}}}
    first = srv.wait_history(srv.queue(prompt))
    assert first["status"]["status_str"] == "success", first["status"]["messages"]
    pid = first["outputs"]["2"]["pid"][0]
    assert first["outputs"]["2"]["made_in"] == [pid] and first["outputs"]["2"]["text"] == ["t-a"]
    prompt["2"]["inputs"]["suffix"] = "-b"   # the consumer runs again, the maker stays cached
    second = srv.wait_history(srv.queue(prompt))
    assert second["status"]["status_str"] == "success", second["status"]["messages"]
    assert [m for m in second["status"]["messages"] if m[0] == "execution_cached"][0][1]["nodes"] == ["1"]
    assert second["outputs"]["2"]["text"] == ["t-b"] and second["outputs"]["2"]["pid"] == [pid]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    for suffix in ("-b", "-c"):   # unchanged inputs, then the consumer's changed: both run on the new worker
        prompt["2"]["inputs"]["suffix"] = suffix
        entry = srv.wait_history(srv.queue(prompt))
        assert entry["status"]["status_str"] == "success", entry["status"]["messages"]
        out = entry["outputs"]["2"]
        assert out["text"] == ["t" + suffix] and out["pid"][0] != pid and out["made_in"] == out["pid"]


def test_a_slow_validate_inputs_on_an_idle_worker_does_not_freeze_the_server(comfyui):
    """#24 L2: VALIDATE_INPUTS runs on the server's event loop at POST
    /prompt; the pack's worker is idle and its validator takes 4 s.  The
    loop waits at most half a second for it (main waited the whole 4 s,
    and forever on a stopped worker): /queue answers meanwhile.  ComfyUI's
    executor awaits a task the validator returns, so its answer still
    refuses the prompt at queue time, as in-process (#41: it was accepted
    and the node failed when it ran)."""
    import threading
    srv = comfyui()
    warm = srv.queue({"1": {"class_type": "E2ESlowCheck", "inputs": {"seconds": 0.0, "text": "ok"}}})
    assert srv.wait_history(warm)["status"]["status_str"] == "success"
    answer = {}

    def post():
        t0 = time.monotonic()
        answer["r"] = srv.http("POST", "/prompt", {"prompt": {
            "1": {"class_type": "E2ESlowCheck", "inputs": {"seconds": 4.0, "text": "no thanks"}}}}, timeout=30)
        answer["s"] = time.monotonic() - t0
    t = threading.Thread(target=post)
    t.start()
    time.sleep(0.1)
    status, queue_s = _timed(srv, "GET", "/queue")
    t.join(30)
    # Answered before the 4 s validator ended: the loop was not held by it
    # (a bound between two behaviours, not a speed).
    assert status == 200 and queue_s < 3.0, queue_s
    status, bad = answer["r"]
    assert status == 400 and "no is no" in json.dumps(bad["node_errors"]["1"]), answer


def _timed(srv, method, path, body=None):
    t0 = time.monotonic()
    status, _ = srv.http(method, path, body, timeout=5)
    return status, time.monotonic() - t0


def test_the_server_answers_while_a_pack_validates_during_its_long_node(comfyui):
    # POST /prompt calls VALIDATE_INPUTS on the server's event loop; the
    # pack's worker is busy with a long node.  The server must not wait
    # for it: the prompt is accepted, /queue and /interrupt answer at once,
    # and the check runs when the node does (a refusal fails that node).
    import threading
    srv = comfyui()
    spin = _queue_spin(srv)
    answers = {}

    def post(name, text):
        answers[name] = srv.http("POST", "/prompt", {"prompt": {
            "1": {"class_type": "E2EEcho", "inputs": {"text": text, "times": 2}}}}, timeout=10)
    posts = [threading.Thread(target=post, args=("good", "v")), threading.Thread(target=post, args=("bad", "a\nb"))]
    for t in posts:
        t.start()
    time.sleep(0.2)
    status, queue_s = min((_timed(srv, "GET", "/queue") for _ in range(3)), key=lambda a: a[1])
    assert status == 200 and queue_s < 0.1, queue_s
    for t in posts:
        t.join(10)
    assert answers["good"][0] == 200 and answers["bad"][0] == 200, answers
    status, interrupt_s = _timed(srv, "POST", "/interrupt", {})
    assert status == 200 and interrupt_s < 0.1, interrupt_s
    assert srv.wait_history(spin, timeout_s=20)["status"]["status_str"] == "error"
    good = srv.wait_history(answers["good"][1]["prompt_id"])
    assert good["status"]["status_str"] == "success" and good["outputs"]["1"]["text"] == ["vv"], good["status"]
    bad = srv.wait_history(answers["bad"][1]["prompt_id"])
    assert bad["status"]["status_str"] == "error"
    error = [m for m in bad["status"]["messages"] if m[0] == "execution_error"][0][1]
    assert error["node_type"] == "E2EEcho" and "one line only" in error["exception_message"], error
