"""A pack's own type strings (str subclasses with their own == / !=, the
"any type" trick and ComfyUI's testing pack's SmartType: packs/e2e_any)
as ComfyUI's validation sees them, the pack run isolated and in-process
in a ComfyUI each, driven over HTTP, and compared: what a literal on an
"any" input reaches the node as (validation converts it for each literal
type the input's type == in turn), whether a link of the wrong type is
refused at /prompt, whether a VALIDATE_INPUTS gets the pack's own type
objects in input_types, and the nodes' /object_info."""

import json

LINK = {"1": {"class_type": "E2EAnyImage", "inputs": {}}}

CASES = {
    # literals on "any" inputs: no conversion in-process (== is str's); 3 on a SmartType("FLOAT") is 3.0
    "numbers": {"9": {"class_type": "E2EAnyShow", "inputs": {"any": 0.1, "smart": 3.0, "number": 3}}},
    "text": {"9": {"class_type": "E2EAnyShow", "inputs": {"any": "value1", "smart": "value1"}}},
    # IMAGE into FLOAT,INT: refused; anything (AnyType("*")) takes it
    "wrong link": dict(LINK, **{"9": {"class_type": "E2EAnyTake",
                                      "inputs": {"value": ["1", 0], "anything": ["1", 2]}}}),
    "right link": dict(LINK, **{"9": {"class_type": "E2EAnyTake",
                                      "inputs": {"value": ["1", 1], "anything": ["1", 0]}}}),
    # VALIDATE_INPUTS(input_types): the pack's own SmartType, as in-process
    "input_types": dict(LINK, **{"9": {"class_type": "E2EAnyNumber", "inputs": {"value": ["1", 1]}}}),
}


def _outcome(srv, prompt):
    """What the user sees of one prompt: refused at /prompt (the error
    types per node), or run (its status and node 9's ui)."""
    status, answer = srv.http("POST", "/prompt", {"prompt": prompt})
    if status != 200:
        return {"refused": status, "errors": {n: sorted(e["type"] for e in v["errors"])
                                              for n, v in (answer.get("node_errors") or {}).items()}}
    entry = srv.wait_history(answer["prompt_id"])
    failed = [m[1].get("exception_message", "") for m in entry["status"]["messages"] if m[0] == "execution_error"]
    return {"ran": entry["status"]["status_str"], "ui": entry["outputs"].get("9"),
            "refused when run": [m for m in failed if "VALIDATE_INPUTS" in m]}


def _drive(srv):
    # a first prompt starts the isolated worker: a VALIDATE_INPUTS then
    # answers at queue time, as in-process
    warm = srv.queue({"9": {"class_type": "E2EAnyShow", "inputs": {"any": 1, "smart": 1}}})
    assert srv.wait_history(warm)["status"]["status_str"] == "success", srv.log()[-3000:]
    out = {name: _outcome(srv, prompt) for name, prompt in CASES.items()}
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    out["object_info"] = {k: v for k, v in info.items() if k.startswith("E2EAny")}
    return out


def test_a_packs_own_types_validate_as_in_process(comfyui):
    isolated = _drive(comfyui(packs=("e2e_any",), name="isolated"))
    in_process = _drive(comfyui(packs=("e2e_any",), name="in_process", env={"BH_E2E_IN_PROCESS": "1"}))
    assert json.dumps(isolated, indent=1, sort_keys=True) == json.dumps(in_process, indent=1, sort_keys=True)
    # the comparison compares something: the cases differ from each other as upstream's rules say
    assert in_process["numbers"]["ui"]["got"][:2] == [["0.1", "float"], ["3.0", "float"]]
    assert in_process["wrong link"]["errors"] == {"9": ["return_type_mismatch"]}
    assert in_process["right link"]["ran"] == in_process["input_types"]["ran"] == "success"
