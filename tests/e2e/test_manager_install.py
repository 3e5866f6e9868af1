"""bulkhead installed the way ComfyUI users install custom nodes (the
Manager flow: a clone in custom_nodes/, `pip install -r requirements.txt`,
`python install.py` with ComfyUI's own Python), then ComfyUI started with
nothing else done -- no PYTHONPATH, no build tree -- and driven over HTTP."""

import os

from .e2eenv import rss


def _maps(pid):
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_a_manager_install_works_on_first_start(comfyui, manager_install):
    python, _clone = manager_install
    srv = comfyui(installed=manager_install)
    log = srv.log()
    # no custom node failed ("(IMPORT FAILED)" in ComfyUI's import times; a
    # real checkout's own comfy_extras may fail here for the torchvision
    # stand-in, which ComfyUI reports as "IMPORT FAILED: nodes_....py")
    assert "(IMPORT FAILED)" not in log, log
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EEcho" in info and "E2EHoldRam" in info
    # the panel is served from the installed package
    status, js = srv.http("GET", "/extensions/bulkhead/bulkhead.js")
    assert status == 200 and "bulkhead" in js
    # a node runs isolated, in a worker of the installed package
    prompt_id = srv.queue({"1": {"class_type": "E2EHoldRam", "inputs": {"name": "UNetManager", "mib": 128}}})
    entry = srv.wait_history(prompt_id)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    pid = entry["outputs"]["1"]["pid"][0]
    site = os.path.dirname(os.path.dirname(python))
    native = [line.split()[-1] for line in _maps(pid).splitlines() if "_native" in line]
    assert native and all(p.startswith(os.path.realpath(site)) or p.startswith(site) for p in native), native
    host_native = [line.split()[-1] for line in _maps(srv.proc.pid).splitlines() if "_native" in line]
    assert host_native and all(site in p or os.path.realpath(site) in p for p in host_native), host_native
    # the memory routes act on this host's worker
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200
    assert any(p["pid"] == pid and p.get("host_pid") == srv.proc.pid for p in doc["processes"]), doc
    rss_before = rss(pid)
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200 and body["bulkhead"]["freed_bytes"] >= 128 << 20, body
    # "Free model and node cache" stops the idle worker, which holds nothing ComfyUI references
    [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid]
    assert row["state"] in ("released", "exited"), row
    if row["state"] == "released":
        assert rss(pid) < rss_before - (100 << 20)
