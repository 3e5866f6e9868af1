"""Every fixture node, isolated and in ComfyUI's own process, through the
same executor, compared (the harness: differential.py).  Both servers
start once for the module; the fixture nodes run in one prompt, queued
twice (the second run: what the cache gives), and the nodes that fail on
purpose in a prompt each."""

import json

import pytest

from . import differential as diff
from .e2eenv import _shm


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    shm_before = _shm()
    servers = diff.start_pair(str(tmp_path_factory.mktemp("differential")))
    try:
        yield servers
    finally:
        diff.stop_pair(servers)
    assert _shm() == shm_before, f"/dev/shm changed: {set(_shm()) ^ set(shm_before)}"


@pytest.fixture(scope="module")
def prompts(pair):
    status, info = pair["in-process"].http("GET", "/object_info")
    assert status == 200, (info, pair["in-process"].log())
    return diff.plan(info)


def _both(pair, prompt, volatile, times=1):
    """The records of `times` runs of prompt on each server."""
    return {way: [diff.mask_volatile_sinks(diff.run(srv, prompt), volatile) for _ in range(times)]
            for way, srv in pair.items()}


def _assert_same(records, what):
    problems = []
    for i, (a, b) in enumerate(zip(records["isolated"], records["in-process"])):
        problems += [f"[{what}, run {i + 1}] {d}" for d in diff.differences(a, b)]
    assert not problems, "isolated and in-process differ:\n" + "\n".join(problems)


def test_the_fixture_nodes_are_served_as_in_process(pair):
    infos = {}
    for way, srv in pair.items():
        status, info = srv.http("GET", "/object_info")
        assert status == 200, (way, info, srv.log())
        infos[way] = diff.fixture_nodes(info)
    assert len(infos["in-process"]) >= 30, sorted(infos["in-process"])   # every fixture pack's nodes
    for cls in sorted(set(infos["isolated"]) | set(infos["in-process"])):
        a, b = infos["isolated"].get(cls), infos["in-process"].get(cls)
        assert a == b, f"/object_info of {cls}:\n  isolated:   {json.dumps(a)}\n  in-process: {json.dumps(b)}"


def test_every_fixture_node_runs_as_in_process(pair, prompts):
    main, _alone, volatile = prompts
    records = _both(pair, main, volatile, times=2)
    _assert_same(records, "all fixture nodes")
    # the comparison compares something: in-process, every node ran, the
    # second run came from the cache, and the grad flags reached the next node
    first, second = records["in-process"]
    assert first["history"]["status"] == "success", first["history"]
    ran = {n for n, msgs in first["nodes"].items() if any(m.get("type") == "executing" for m in msgs)}
    assert {n for n in main if main[n]["class_type"] != "BHDiffSink"} - ran <= {"E2EBlock"} | {
        n for n in main if main[n]["inputs"].get("value", [""])[0] == "E2EBlock"}, sorted(ran)
    cached = [m for m in second["prompt"] if m["type"] == "execution_cached"]
    assert cached and diff.SOURCE in cached[0]["data"]["nodes"], second["prompt"]
    seen = first["history"]["outputs"]
    assert seen["sink-E2EGradLeaf-0"]["seen"][0]["requires_grad"] is True, seen["sink-E2EGradLeaf-0"]
    assert seen["sink-E2EGradLeaf-1"]["seen"][0]["inference"] is False
    assert seen["E2EGradSee"] == {"requires_grad": [True], "inference": [False], "class": ["Tensor"]}, \
        seen["E2EGradSee"]
    assert seen["sink-E2EGradLeaf-3"]["seen"][0]["tensor"] == "Parameter"
    # lists: a whole list to an INPUT_IS_LIST node, item by item to a sink
    assert seen["E2EListJoin"] == {"text": ["item0+item1+item2"], "images": [3], "sep": ["+"]}, seen["E2EListJoin"]
    assert seen["E2EListJoin-v1"]["text"] == ["text"] and len(seen["sink-E2EListMake-1"]["seen"]) == 3


def test_the_nodes_that_fail_fail_as_in_process(pair, prompts):
    _main, alone, volatile = prompts
    assert alone
    problems = []
    for name, prompt in sorted(alone.items()):
        records = _both(pair, prompt, volatile)
        try:
            _assert_same(records, name)
        except AssertionError as e:
            problems.append(str(e))
        got = records["in-process"][0]
        assert got.get("queued", {}).get("refused") or got.get("queued", {}).get("node_errors") \
            or "execution_error" in json.dumps(got), (name, got)   # it did fail in-process
    assert not problems, "\n".join(problems)
