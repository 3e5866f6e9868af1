"""Real public packs, opt in: BULKHEAD_REAL_PACKS names a folder of packs
(fetched outside this repository, as their repositories hold them; never
committed).  They are copied unmodified into the custom_nodes/ of a
ComfyUI where bulkhead was installed through the Manager flow, ComfyUI
starts with nothing else done (their environments built at start), and
no pack is IMPORT FAILED because of bulkhead.  Each pack that asks for
isolation -- its __init__.py hands its nodes to comfy-env's
register_nodes (or bulkhead.comfy_pack) and it has a comfy-env.toml --
must load isolated: every part of it listed in /bulkhead/status,
isolated.  A part whose environment cannot be had on this machine (a
conda channel or host it cannot reach) is reported with bulkhead's one
line for it, which is what the test prints, and is not a failure; any
other part not isolated is.

Run three times: the folders under their own names (a real checkout's
os.listdir puts them anywhere; tests/comfyui sorts, so "ComfyUI-*"
come before "bulkhead"), renamed to sort after bulkhead, and with each
pack's requirements.txt installed in ComfyUI's Python as ComfyUI-Manager
installs them (the real comfy-env they pin among them).

    BULKHEAD_REAL_PACKS=/path/to/packs make check-py PYTEST_PATHS=tests/e2e/test_real_packs.py

In the first two, a pack's own requirements.txt is not installed: a pack
whose prestartup or __init__ imports one of them fails there whatever
bulkhead does, and is listed as such, not as a failure.

BULKHEAD_REAL_PACKS_NODES names nodes (comma separated) that need no
model weights: each is run over HTTP with its widgets' defaults, its
outputs summarized in the host by a probe node (values, dtypes, shapes),
and compared with what the same class returns called directly, without
bulkhead, under its environment's interpreter: what ComfyUI gets through
the worker must be what the code made.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from . import e2eenv

REAL = os.environ.get("BULKHEAD_REAL_PACKS")

pytestmark = pytest.mark.skipif(not REAL, reason="BULKHEAD_REAL_PACKS names no folder of real packs")

# A build that failed because this machine cannot reach where the pack's
# dependencies live: the pack's, not bulkhead's.
UNREACHABLE = ("cannot read the conda channel", "dns error", "Name or service not known",
               "failed to lookup address", "Temporary failure in name resolution", "Could not resolve host",
               "Network is unreachable",
               # another Python minor, whose build of the host's torch is on no index reachable here
               "which this Python has no build of here")


def _configs(pack):
    nodes = os.path.join(pack, "nodes")
    found = [p for p in (os.path.join(pack, "comfy-env.toml"), os.path.join(nodes, "comfy-env.toml"))
             if os.path.isfile(p)]
    if os.path.isdir(nodes):
        found += [os.path.join(nodes, d, "comfy-env.toml") for d in sorted(os.listdir(nodes))
                  if os.path.isfile(os.path.join(nodes, d, "comfy-env.toml"))]
    return found


def _asks_for_isolation(pack):
    """comfy-env isolates only what register_nodes serves: a pack that
    calls install() and imports its nodes itself, or ships a config its
    code never hands over, runs in ComfyUI's process with comfy-env too."""
    with open(os.path.join(pack, "__init__.py"), errors="replace") as f:
        init = f.read()
    code = "\n".join(line for line in init.splitlines() if not line.lstrip().startswith("#"))
    return bool(_configs(pack)) and re.search(r"\bregister_nodes\s*\(|\bcomfy_pack\s*\(", code) is not None


def _own_import_failure(log, name):
    """The module a pack's own import could not find, when ComfyUI says it
    cannot import the pack for a reason of the pack's own."""
    m = re.search(rf"Cannot import \S*{re.escape(name)} module for custom nodes: (.*)", log)
    return m.group(1).strip() if m else None


def _with_pack_requirements(tmp_path, packs):
    """A ComfyUI Python where bulkhead was Manager-installed and then each
    pack's requirements.txt installed as ComfyUI-Manager installs a pack's
    (line by line, a line that fails left out): the real comfy-env the
    packs pin among them, where PyPI has that version; then each pack's
    install.py run in its folder (a copy: it may clone the packs it names
    beside itself), with that comfy-env, HOME and COMFY_ENV_ROOT in tmp.
    Its own venv, so the session's is left as it was.  Returns (python,
    clone, the installed copies)."""
    import sys
    import sysconfig
    venv = tmp_path / "comfy-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "comfyui-requirements.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    clone = e2eenv.clone_into(str(tmp_path / "manager" / "custom_nodes"))
    with open(tmp_path / "install.log", "w") as log:
        e2eenv.run_manager_flow(clone, python, log)
        for pack in packs:
            req = os.path.join(pack, "requirements.txt")
            lines = open(req, errors="replace").read().splitlines() if os.path.isfile(req) else []
            for line in lines:
                line = line.split("#", 1)[0].strip()
                if line and not line.startswith("-"):
                    subprocess.run([python, "-m", "pip", "install", "-q", line], stdout=log,
                                   stderr=subprocess.STDOUT, timeout=900)
        copies = tmp_path / "installed"
        copies.mkdir()
        env = dict(os.environ, HOME=str(tmp_path / "home"), COMFY_ENV_ROOT=str(tmp_path / "ce"))
        for pack in packs:
            shutil.copytree(pack, copies / os.path.basename(pack), symlinks=True)
            if os.path.isfile(copies / os.path.basename(pack) / "install.py"):
                subprocess.run([python, "install.py"], cwd=copies / os.path.basename(pack), env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=900)
    real = subprocess.run([python, "-m", "pip", "show", "comfy-env"], capture_output=True, text=True).stdout
    print("the real comfy-env in ComfyUI's Python: " + (re.search(r"Version: (\S+)", real).group(1) if real
                                                         else "none (no pinned version is on PyPI)"))
    return python, clone, sorted(str(copies / os.path.basename(p)) for p in packs)


@pytest.mark.parametrize("order", ["as-named", "after-bulkhead", "with-their-requirements"])
def test_real_packs_run_isolated(comfyui, manager_install, monkeypatch, tmp_path, order):
    # Their environments are built while ComfyUI starts: pip's downloads,
    # not bulkhead, set how long that takes.
    monkeypatch.setattr(e2eenv, "START_TIMEOUT_S", int(os.environ.get("BULKHEAD_REAL_PACKS_START_S", "1800")))
    packs = sorted(os.path.join(REAL, d) for d in os.listdir(REAL)
                   if os.path.isfile(os.path.join(REAL, d, "__init__.py")))
    assert packs, f"no packs (folders with an __init__.py) in {REAL}"
    if order == "after-bulkhead":
        renamed = tmp_path / "renamed"
        renamed.mkdir()
        for p in packs:
            shutil.copytree(p, renamed / ("zz-" + os.path.basename(p)), symlinks=True)
        packs = sorted(str(p) for p in renamed.iterdir())
    installed, env = manager_install, None
    if order == "with-their-requirements":
        python, clone, packs = _with_pack_requirements(tmp_path, packs)
        installed, env = (python, clone), {"COMFY_ENV_ROOT": str(tmp_path / "ce")}
    srv = comfyui(packs=(), pack_dirs=packs + [_probe_pack(tmp_path)], installed=installed, env=env)
    with open(srv.log_path, errors="replace") as f:
        log = f.read()
    status, info = srv.http("GET", "/object_info")
    assert status == 200
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200
    report, problems = [], []
    elsewhere = set()       # parts that cannot be had on this machine: not isolated, for this machine's reason
    for pack in packs:
        name = os.path.basename(pack)
        failed = re.search(rf"IMPORT FAILED.*{re.escape(name)}\s*$|{re.escape(name)}.*IMPORT FAILED", log, re.M)
        own = _own_import_failure(log, name)
        asks = _asks_for_isolation(pack)
        parts = [p for p in doc["packs"] if p["name"] == name or p["name"].startswith(name + ".")]
        if not asks:
            states = ", ".join(f"{p['name']}: {p['state']}" for p in parts) or "no part served by bulkhead"
            if failed and (not own or "bulkhead" in own or "comfy_env" in own):
                problems.append(f"{name}: IMPORT FAILED ({own})")
            else:
                report.append(f"{name}: asks for no isolation (comfy-env runs it in ComfyUI's process too); "
                              + (f"IMPORT FAILED for its own reason: {own}" if failed else states))
            continue
        if not parts:
            problems.append(f"{name}: asks for isolation, and bulkhead served no part of it"
                            + (f" (IMPORT FAILED: {own})" if failed else ""))
        unreachable = 0
        for p in parts:
            if p["state"] == "isolated":
                report.append(f"{p['name']}: isolated ({p['env']})")
                continue
            # the log's line is one short line (#36): the whole reason is the state's
            line = p.get("reason") or next((line for line in log.splitlines() if f"'{p['name']}'" in line and
                                            ("NOT isolated" in line or "NOT loaded" in line)), "")
            if any(u in line for u in UNREACHABLE):
                unreachable += 1
                elsewhere.add(p["name"])
                report.append(f"{p['name']}: cannot be had on this machine: {line.strip()[:700]}")
            else:
                problems.append(f"{p['name']}: {p['state']}: {line.strip()}")
        if failed and parts and unreachable == len(parts):
            report.append(f"{name}: IMPORT FAILED, as no part of it can be had here ({own})")
        elif failed:
            problems.append(f"{name}: IMPORT FAILED ({own})")
    print(f"\n--- {order} ---\n" + "\n".join(report + problems))
    assert not problems, "\n".join(problems) + "\n--- log ---\n" + log[-6000:]

    nodes = [n.strip() for n in os.environ.get("BULKHEAD_REAL_PACKS_NODES", "").split(",") if n.strip()]
    ran = []
    for node in nodes:
        if node not in info:
            continue
        inputs = _defaults(info[node])
        if inputs is None:
            print(f"{node}: not run: a required input is not a widget")
            continue
        part = _part_of(doc["packs"], srv, node)
        if part is not None and part["name"] in elsewhere:
            print(f"{node}: not run: its part {part['name']} cannot be had on this machine (above)")
            continue
        n_out = len(info[node].get("output", []))
        prompt = {"1": {"class_type": node, "inputs": inputs}}
        for i in range(n_out):
            prompt[str(10 + i)] = {"class_type": "BHRealProbe", "inputs": {"value": ["1", i]}}
        entry = srv.wait_history(srv.queue(prompt), timeout_s=300)
        assert entry["status"]["status_str"] == "success", (node, entry["status"], srv.log())
        got = [json.loads(entry["outputs"][str(10 + i)]["summary"][0]) for i in range(n_out)]
        assert part is not None and part["state"] == "isolated", (node, part)
        want = _reference(part, srv, node, inputs)
        assert got == want, (node, got, want)
        print(f"{node}: {json.dumps(got)[:400]}")
        ran.append(node)
    print(f"nodes run isolated, outputs as the code made them without bulkhead: {ran or 'none'}")
    if order != "as-named":
        return
    # The next start builds nothing again (a failed build is remembered, a
    # built one reused) and serves each part as the first did.
    before = {p["name"]: p["state"] for p in doc["packs"]}
    srv.stop()
    srv.start()
    second = srv.log_since_start()
    rebuilt = [line for line in second.splitlines()
               if "building it in the background" in line or ": building " in line]
    assert not rebuilt, "\n".join(rebuilt)
    status, doc = srv.http("GET", "/bulkhead/status")
    assert {p["name"]: p["state"] for p in doc["packs"]} == before, doc["packs"]
    print("second start: nothing built again, every part as before")


SUMMARY = """
def summary(v):
    if hasattr(v, "tolist") and hasattr(v, "shape") and hasattr(v, "dtype"):
        return {"array": type(v).__name__, "dtype": str(v.dtype), "shape": list(v.shape), "values": v.tolist()}
    if isinstance(v, dict):
        return {"dict": {str(k): summary(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}}
    if isinstance(v, (list, tuple)):
        return [summary(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"object": type(v).__name__}
"""

PROBE = SUMMARY + """
import json


class BHRealProbe:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*",)}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bulkhead/tests"

    def run(self, value):
        return {"ui": {"summary": [json.dumps(summary(value))]}}


NODE_CLASS_MAPPINGS = {"BHRealProbe": BHRealProbe}
"""

# The node's class called directly, without bulkhead, under the
# environment's interpreter: the pack's package made without running its
# __init__ (which hands the nodes to register_nodes), then its nodes
# package (or each nodes/<subdir>) searched for the class.
REFERENCE = SUMMARY + """
import asyncio, importlib, inspect, json, os, sys, types
pack_dir, node, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
name = os.path.basename(pack_dir).replace("-", "_") + "_bhref"
pkg = types.ModuleType(name)
pkg.__path__ = [pack_dir]
sys.modules[name] = pkg
cls = None
nodes_dir = os.path.join(pack_dir, "nodes")
for mod in ["nodes"] + ["nodes." + d for d in sorted(os.listdir(nodes_dir))
                        if os.path.isfile(os.path.join(nodes_dir, d, "__init__.py"))]:
    try:
        m = importlib.import_module(name + "." + mod)
    except ImportError:
        continue
    cls = (getattr(m, "NODE_CLASS_MAPPINGS", {}) or {}).get(node)
    if cls is not None:
        break
if hasattr(cls, "define_schema"):
    out = cls.execute(**inputs)
    if inspect.isawaitable(out):
        out = asyncio.run(out)
    values = out.args
else:
    values = getattr(cls(), cls.FUNCTION)(**inputs)
    if isinstance(values, dict):
        values = values.get("result", ())
print("BHREF " + json.dumps([summary(v) for v in values]))
"""


def _probe_pack(tmp_path):
    d = tmp_path / "probe" / "zz_bh_real_probe"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(PROBE)
    return str(d)


def _defaults(node_info):
    """The node's required inputs at their widgets' defaults, or None when
    one of them is not a widget (a link it would need)."""
    out = {}
    for key, spec in (node_info.get("input", {}).get("required", {}) or {}).items():
        kind = spec[0]
        opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
        if isinstance(kind, list):
            out[key] = opts.get("default", kind[0] if kind else None)
        elif kind in ("INT", "FLOAT", "STRING", "BOOLEAN"):
            out[key] = opts.get("default", {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}[kind])
        elif kind == "COMBO":
            out[key] = opts.get("default", (opts.get("options") or [None])[0])
        else:
            return None
    return out


def _part_of(parts, srv, node):
    """The /bulkhead/status row of the pack part serving `node`."""
    status, info = srv.http("GET", "/object_info/" + node)
    module = (info or {}).get(node, {}).get("python_module", "")
    folder = module.split(".", 1)[1] if module.startswith("custom_nodes.") else module
    rows = [p for p in parts if p["name"] == folder or p["name"].startswith(folder + ".")]
    return rows[0] if len(rows) == 1 else next((p for p in rows if p["state"] == "isolated"), None)


def _reference(part, srv, node, inputs):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONNOUSERSITE": "1",
           "PYTHONPATH": os.pathsep.join([e2eenv.comfy_root(), os.path.join(srv.base, "custom_nodes")])}
    r = subprocess.run([part["python"], "-c", REFERENCE, part["directory"], node, json.dumps(inputs)],
                       cwd=part["directory"], env=env, capture_output=True, text=True, timeout=300)
    line = next((line for line in r.stdout.splitlines() if line.startswith("BHREF ")), None)
    assert r.returncode == 0 and line, (node, r.stdout[-3000:], r.stderr[-3000:])
    return json.loads(line[len("BHREF "):])
