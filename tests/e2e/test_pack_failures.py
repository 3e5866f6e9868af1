"""Failures stay local, seen over HTTP: one comfy-env pack (register_nodes,
`nodes/<subdir>/` each with or without a comfy-env.toml) in a
Manager-installed ComfyUI, copied in as `git clone` puts it, whose
subdirectories fail in every way a published pack does -- a refused
config, a build pip cannot do, an import the worker's environment lacks --
beside one that runs isolated and one without a config.  Each failure
costs only its own nodes their isolation (one warning each, naming it,
and its state in /bulkhead/status), the rest runs as configured, and a
failed build is not paid again at the next start.  Since #36 fails
closed, the parts whose environment ComfyUI's process is not the same as
(a config that cannot be read, a requirement the host lacks) are refused
at their node rather than run in-process; the prompt through the others
succeeds."""

import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from localsources import HOST_MM, make_wheel, write  # noqa: E402

INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''

# One node per subdirectory: where it ran, and what it could import.
NODE = '''
import os, sys
{imports}


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{}}}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/failures"

    def run(self):
        return {{"ui": {{"pid": [os.getpid()], "prefix": [sys.prefix], "saw": [{saw}]}}}}


NODE_CLASS_MAPPINGS = {{"{cls}": {cls}}}
'''

SUBDIRS = {
    # isolated: its own environment, and what an in-process pack sees (ComfyUI's aiohttp)
    "good": ('python = "{mm}"\n[pypi-dependencies]\nbhplain = "*"\n',
             "import bhplain\nfrom aiohttp import web", "bhplain.VALUE + ' ' + web.__name__"),
    # refused: a python that is no version
    "bad": ('python = ["3.11"]\n', "", "'bad'"),
    # no config: imported in the host
    "plain": (None, "", "'plain'"),
    # built, but its nodes import what the environment lacks (the host has pytest)
    "noimport": ('python = "{mm}"\n', "import pytest", "'noimport'"),
    # a build pip cannot do
    "unbuildable": ('python = "{mm}"\n[pypi-dependencies]\nbh-nowhere-to-be-found = "*"\n', "", "'unbuildable'"),
}


def _mixed_pack(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(str(wheels), "bhplain", "1.0", {"bhplain/__init__.py": "VALUE = 'plain wheel'\n"})
    pack = tmp_path / "repos" / "ComfyUI-Mixed"
    write(pack / "__init__.py", INIT)
    write(pack / "nodes" / "__init__.py", "")
    for sub, (config, imports, saw) in SUBDIRS.items():
        cls = "E2EFail" + sub.capitalize()
        write(pack / "nodes" / sub / "__init__.py", NODE.format(cls=cls, imports=imports, saw=saw))
        if config is not None:
            write(pack / "nodes" / sub / "comfy-env.toml", config.format(mm=HOST_MM))
    return str(pack), {"BULKHEAD_PIP_ARGS": f"--find-links {wheels}"}


# Refused (#36): ComfyUI's process is not the same as their environment.
REFUSED = ("bad", "unbuildable")


def _run_all(srv):
    runs = [sub for sub in SUBDIRS if sub not in REFUSED]
    prompt = {str(i): {"class_type": "E2EFail" + sub.capitalize(), "inputs": {}} for i, sub in enumerate(runs)}
    entry = srv.wait_history(srv.queue(prompt), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    out = {sub: entry["outputs"][str(i)] for i, sub in enumerate(runs)}
    for sub in REFUSED:    # each fails at its node, with the reason and the fix
        entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EFail" + sub.capitalize(), "inputs": {}}}))
        [err] = [m for kind, m in entry["status"]["messages"] if kind == "execution_error"]
        assert entry["status"]["status_str"] == "error" and err["node_id"] == "1", entry
        out[sub] = err["exception_message"]
    return out


def test_each_subdirectory_fails_alone(comfyui, manager_install, tmp_path):
    pack, env = _mixed_pack(tmp_path)
    home = str(tmp_path / "bulkhead-home")
    srv = comfyui(packs=(), pack_dirs=[pack], installed=manager_install, env=env, bulkhead_home=home)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    assert "(IMPORT FAILED)" not in log, log  # a custom node; comfy_extras lacking torchaudio print "IMPORT FAILED: nodes_....py"
    # one start-up line says where the packs stand, and again once the
    # environments that built in the background are built
    start, line = [l for l in log.splitlines() if "bulkhead " in l and " isolated" in l and "s loading them" in l]
    assert "3 building in the background" in start and "background builds done: " in line, (start, line)
    assert ": 1 pack isolated, 3 NOT isolated (ComfyUI-Mixed.bad: refused" in line, line
    # one short line each (#36), the name first; the whole reason and the fix in /bulkhead/status (below)
    not_isolated = [l for l in log.splitlines() if "runs in-process, NOT isolated" in l or "is refused, NOT run" in l]
    assert len(not_isolated) == 3 and all(len(l) <= 200 and "`bulkhead status`" in l for l in not_isolated), \
        not_isolated
    bad, noimport, unbuildable = (next(l for l in not_isolated if l.startswith(f"bulkhead: pack 'ComfyUI-Mixed.{s}'"))
                                  for s in ("bad", "noimport", "unbuildable"))
    assert "comfy-env.toml is invalid" in bad and "failed to import in its worker" in noimport, (bad, noimport)
    assert "bh-nowhere-to-be-found" in log and "its environment could not be built" in unbuildable, unbuildable
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and all("E2EFail" + s.capitalize() in info for s in SUBDIRS)
    out = _run_all(srv)
    host = srv.proc.pid
    assert out["good"]["pid"][0] != host and out["good"]["saw"] == ["plain wheel aiohttp.web"], out["good"]
    assert out["good"]["prefix"][0].startswith(home)
    for sub in ("plain", "noimport"):
        assert out[sub]["pid"] == [host], (sub, out[sub])
    assert "comfy-env.toml is invalid" in out["bad"] and "what it requires is not known" in out["bad"], out["bad"]
    assert "bh-nowhere-to-be-found (not installed in ComfyUI's Python)" in out["unbuildable"], out["unbuildable"]
    assert all("Fix: " in out[sub] and "bulkhead install" in out[sub] for sub in REFUSED), out
    # where people look: /bulkhead/status lists each part's state, those not isolated first
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200
    states = {p["name"]: p for p in doc["packs"]}
    assert [p["state"] for p in doc["packs"]] == ["refused"] * 2 + ["in-process", "isolated"], doc["packs"]
    assert states["ComfyUI-Mixed.good"]["pid"] == out["good"]["pid"][0]
    assert states["ComfyUI-Mixed.good"]["env"] == os.path.dirname(os.path.dirname(states["ComfyUI-Mixed.good"]["python"]))
    assert "No module named 'pytest'" in states["ComfyUI-Mixed.noimport"]["reason"]
    assert "nodes/bad/comfy-env.toml:1" in states["ComfyUI-Mixed.bad"]["reason"], states["ComfyUI-Mixed.bad"]
    assert "building it at start failed" in states["ComfyUI-Mixed.unbuildable"]["reason"]
    assert "bulkhead install" in states["ComfyUI-Mixed.unbuildable"]["fix"]
    # the next start does not pay for the failed build again, and says how to retry
    srv.stop()
    srv.start()
    second = srv.log_since_start()
    assert "building it in the background" not in second, second
    assert any("ComfyUI-Mixed.unbuildable'" in l and "is refused, NOT run" in l for l in second.splitlines()), second
    again = {p["name"]: p for p in srv.http("GET", "/bulkhead/status")[1]["packs"]}["ComfyUI-Mixed.unbuildable"]
    assert "is not retried at start" in again["reason"] and "bulkhead install" in again["reason"], again
    out = _run_all(srv)
    assert out["good"]["pid"][0] != srv.proc.pid and out["noimport"]["pid"] == [srv.proc.pid]
    assert "bh-nowhere-to-be-found" in out["unbuildable"], out["unbuildable"]


def test_fallback_error_makes_lost_isolation_an_error(comfyui, manager_install, tmp_path):
    """#25: `[bulkhead] fallback = "error"` in a config, or BULKHEAD_FALLBACK=error
    for the machine, makes a part that cannot run isolated load no nodes,
    with one error line naming the reason, the setting and the fix, and
    its state "failed" in /bulkhead/status, instead of running in
    ComfyUI's process; a prompt using it is refused at queue time."""
    pack = tmp_path / "repos" / "ComfyUI-Strict"
    write(pack / "__init__.py", INIT)
    write(pack / "nodes" / "__init__.py", "")
    unbuildable = 'python = "{mm}"\n[pypi-dependencies]\nbh-nowhere-to-be-found = "*"\n'.format(mm=HOST_MM)
    for sub, extra in (("strict", '[bulkhead]\nfallback = "error"\n'), ("lax", "")):
        cls = "E2EFail" + sub.capitalize()
        write(pack / "nodes" / sub / "__init__.py", NODE.format(cls=cls, imports="", saw=repr(sub)))
        write(pack / "nodes" / sub / "comfy-env.toml", unbuildable + extra)
    home = str(tmp_path / "bulkhead-home")
    srv = comfyui(packs=(), pack_dirs=[str(pack)], installed=manager_install, bulkhead_home=home,
                  env={"BULKHEAD_PIP_ARGS": "--no-index"})
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EFailLax" in info and "E2EFailStrict" not in info   # lax: listed, refused
    log = srv.log()
    [line] = [l for l in log.splitlines() if "ComfyUI-Strict.strict'" in l and "is NOT loaded" in l]
    assert 'its [bulkhead] fallback = "error"' in line and len(line) <= 200, line
    status, doc = srv.http("GET", "/bulkhead/status")
    states = {p["name"]: p for p in doc["packs"]}
    assert "bulkhead install" in states["ComfyUI-Strict.strict"]["fix"], states
    assert states["ComfyUI-Strict.strict"]["state"] == "failed", states
    assert states["ComfyUI-Strict.lax"]["state"] == "refused", states   # #36: the host lacks its requirement
    status, answer = srv.http("POST", "/prompt", {"prompt": {"1": {"class_type": "E2EFailStrict", "inputs": {}}}})
    assert status == 400, (status, answer)
    # the machine-wide switch: the lax part too
    srv.stop()
    srv.env["BULKHEAD_FALLBACK"] = "error"
    srv.start()
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EFailLax" not in info and "E2EFailStrict" not in info
    status, doc = srv.http("GET", "/bulkhead/status")
    lax = {p["name"]: p for p in doc["packs"]}["ComfyUI-Strict.lax"]
    assert lax["state"] == "failed" and "BULKHEAD_FALLBACK=error" in lax["reason"], lax
