"""ComfyUI's own execution tests, with their testing pack isolated by
bulkhead (opt in: COMFYUI_PATH names a ComfyUI checkout; `make
upstream-execution`).

ComfyUI's tests/execution (test_execution.py, test_async_nodes.py,
test_progress_isolation.py) start real `main.py` servers that load
tests/execution/testing_nodes/testing-pack through
tests/execution/extra_model_paths.yaml, and judge what its nodes do over
HTTP and the websocket.  Here that suite runs twice, each time in a copy
of the checkout in tmp (never in the checkout, never in this repository),
under `python -m pytest` in a subprocess with --junitxml, its test files
and assertions unchanged, its timing checks on:

- in-process: the original pack, in ComfyUI's process;
- isolated: the pack turned into a bulkhead pack without a change to any
  node's code -- its modules moved into nodes/, an __init__.py calling
  ``bulkhead.comfy_pack(__file__)``, a comfy-env.toml with no requirements
  and ``fallback = "error"`` (a pack that cannot run isolated loads no node
  at all, so no test passes by running in-process).  Its environment is
  built before the suite starts (`python -m bulkhead install`), as a
  user's install does.

In both, the pack sits beside bulkhead installed as ComfyUI-Manager
installs it (tests/e2e's manager_install), in one folder the copy's
rewritten extra_model_paths.yaml names as custom_nodes: the one thing
that differs is the pack's isolation.  (bulkhead on the host changes
ComfyUI's own timing: it bounds the spin of ComfyUI's idle OpenMP threads,
and the suite's tightest check, 0.5 s for 0.3 s of sleep, failed in
ComfyUI's process without bulkhead in 3 runs of 3 on a loaded 2-core VM,
1 test of 185 each time, and passed isolated.)

Each copy is started once before its suite (--quick-test-for-ci, as a
user's first start after an install): the isolated pack's worker imports
it once and its node metadata is cached, so no server of the suite pays
for that within upstream's connect window (5 tries 4 s apart); that
start's time, both ways, is in summary.json.

The answer is ComfyUI's own: the test fails listing every upstream test
whose outcome differs between the two runs, with the isolated run's
failure message, and when a run leaves processes behind (upstream stops
each server with SIGKILL; its workers must go with it).  Both runs'
servers are the same Python (the Manager-installed one), with the empty
torchvision stand-in first on their path where the real one cannot import
beside this torch (tests/e2e/e2eenv.py), and each run's output, junit XML
and a summary.json stay in the test's tmp directory, named on failure.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# tests/: the e2e package (its Manager install, server assembly and session
# helpers) imports as `e2e`, as pytest imports it for tests/e2e itself.
sys.path.insert(0, os.path.dirname(HERE))

from e2e import e2eenv  # noqa: E402
from e2e.conftest import manager_install  # noqa: E402,F401  (a fixture, used by name)

COMFYUI = os.environ.get("COMFYUI_PATH")
SUITE = os.path.join("tests", "execution")
PACK = os.path.join(SUITE, "testing_nodes", "testing-pack")
# The whole suite once, on 2 cores: seven server starts and their sleeps.
RUN_TIMEOUT_S = 3600
# A warm start (warm_start): ComfyUI's own start, the pack's first import in
# its worker and the exit.
START_TIMEOUT_S = 300
# How long a run's leftover processes (the workers of a SIGKILLed server)
# get to exit on their own before they count as left behind.
LEFTOVER_GRACE_S = 15

pytestmark = pytest.mark.skipif(
    not COMFYUI or not os.path.isdir(os.path.join(COMFYUI, PACK)),
    reason="COMFYUI_PATH does not name a ComfyUI checkout with tests/execution "
           "(COMFYUI_PATH=<checkout> make upstream-execution)")

ISOLATED_INIT = '''\
import bulkhead

NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
'''

ISOLATED_CONFIG = '''\
# ComfyUI's testing pack (its tests/execution), its modules unchanged under
# nodes/: no requirements (torch and ComfyUI's own modules come from the
# host's matched set), and no in-process fallback, so a pack that cannot
# run isolated loads no node instead of passing in ComfyUI's process.
[bulkhead]
fallback = "error"
'''

# Where the real torchvision cannot import beside this torch (the host gets
# tests/py/shims' stand-in on PYTHONPATH), the worker gets the same through
# its own: a worker never gets the host's PYTHONPATH, and its environment's
# torchvision is the host's real one, from the matched set.  A worker's
# PYTHONPATH comes before its site-packages.
SHIM_CONFIG = '''
# The tests' torchvision stand-in (tests/upstream/test_comfyui_execution.py).
[env_vars]
PYTHONPATH = {shims}
'''


def copy_checkout(dst):
    """The checkout's tree at dst (its .git and bytecode left out): the
    servers write their user, temp and output folders beside main.py."""
    shutil.copytree(COMFYUI, dst, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
    return dst


def isolate_pack(src, dst):
    """The pack at src as an isolated bulkhead pack at dst: every module
    of it, its own __init__.py included, moved unchanged into nodes/ (its
    relative imports hold there), the package's __init__.py the one call,
    and a comfy-env.toml."""
    shutil.copytree(src, os.path.join(dst, "nodes"), ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(dst, "__init__.py"), "w") as f:
        f.write(ISOLATED_INIT)
    with open(os.path.join(dst, "comfy-env.toml"), "w") as f:
        f.write(ISOLATED_CONFIG)
        if e2eenv._needs_torchvision_shim():
            f.write(SHIM_CONFIG.format(shims=json.dumps(e2eenv.SHIMS)))
    return dst


def server_env(python, tmp_path):
    """The environment of a run: the Manager-installed Python first on
    PATH (upstream starts `python main.py`), .venv's tools (uv) after it,
    bulkhead's state in tmp, nothing of the build tree's; the torchvision
    stand-in on PYTHONPATH where the real one cannot import."""
    env = dict(os.environ)
    for name in ("COMFYUI_PATH", "BULKHEAD_BUILD", "PYTHONPATH", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    env.update({"PATH": os.pathsep.join([os.path.dirname(python), os.path.dirname(sys.executable),
                                         env.get("PATH", "")]),
                "BULKHEAD_HOME": str(tmp_path / "bulkhead-home"),
                "BULKHEAD_LEDGER": str(tmp_path / "ledger"),
                "PYTHONUNBUFFERED": "1"})
    if e2eenv._needs_torchvision_shim():
        env["PYTHONPATH"] = e2eenv.SHIMS
    return env


def run_in_session(argv, cwd, env, out, timeout_s):
    """Runs argv in a session of its own, its output to the file out;
    returns (exit status, processes it left behind, killed now: pid and
    command line each).  One still running after timeout_s is killed whole
    and reported as such."""
    with open(out, "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            proc.wait()
            raise AssertionError(f"{' '.join(argv[:4])}... did not finish in {timeout_s} s in {cwd}; "
                                 f"its output: {out}")
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while e2eenv._session_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc.returncode, _kill_session(proc.pid)


def warm_start(root, python, env, out):
    """One start of the ComfyUI copy at root that loads its custom nodes and
    exits (ComfyUI's own --quick-test-for-ci), as a user's first start
    after installing a pack: the isolated pack's worker imports it once
    and its node metadata is cached, so no server of the suite pays for
    that within upstream's connect window (5 tries 4 s apart).  Returns
    (seconds it took, processes it left behind)."""
    t0 = time.monotonic()
    rc, left = run_in_session([python, "main.py", "--quick-test-for-ci", "--cpu", "--extra-model-paths-config",
                               os.path.join(SUITE, "extra_model_paths.yaml")], root, env, out, START_TIMEOUT_S)
    assert rc == 0, f"ComfyUI's start with --quick-test-for-ci in {root} exited with {rc}; its output: {out}"
    return time.monotonic() - t0, left


def run_suite(root, env, out_dir):
    """ComfyUI's tests/execution in the copy at root, under this Python's
    pytest (the one running this test: .venv's); returns (junit XML path,
    output path, processes left behind)."""
    os.makedirs(out_dir)
    xml = os.path.join(out_dir, "junit.xml")
    out = os.path.join(out_dir, "pytest.log")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", SUITE, "--junitxml", xml,
            "--port", str(e2eenv._free_port())]
    rc, left = run_in_session(argv, root, env, out, RUN_TIMEOUT_S)
    assert os.path.isfile(xml), f"ComfyUI's {SUITE} wrote no junit XML (rc {rc}); its output: {out}"
    return xml, out, left


def _kill_session(sid):
    """SIGKILLs every process of session sid; returns their pids and command lines."""
    left = []
    for pid in e2eenv._session_members(sid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        left.append(f"{pid} {cmd[:200]}")
    return left


def outcomes(xml):
    """{test id: (outcome, first line of its message)} from a junit XML:
    passed, failed, error (a fixture's: a server that did not start, a
    teardown) or skipped; a failure outweighs an error in one test."""
    out = {}
    for case in ET.parse(xml).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        for kind, outcome in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if kind in kinds:
                text = kinds[kind].get("message") or (kinds[kind].text or "")
                out[test] = (outcome, (text.strip().splitlines() or [""])[0][:300])
                break
        else:
            out[test] = ("passed", "")
    return out


def counts(results):
    c = {}
    for outcome, _ in results.values():
        c[outcome] = c.get(outcome, 0) + 1
    return c


def test_comfyui_execution_suite_isolated_as_in_process(tmp_path, manager_install):  # noqa: F811
    python, clone = manager_install

    # Each copy's extra_model_paths.yaml names, instead of testing_nodes
    # (gone from the copy, so nothing loads the original by accident), a
    # custom_nodes folder holding bulkhead (the Manager's clone) and the
    # pack: as it is for the in-process run, isolated for the other.
    roots = {}
    for name in ("isolated", "in-process"):
        roots[name] = copy_checkout(str(tmp_path / name / "ComfyUI"))
        custom = tmp_path / name / "custom_nodes"
        custom.mkdir()
        shutil.copytree(clone, custom / "bulkhead", symlinks=True)
        dst = str(custom / os.path.basename(PACK))
        if name == "isolated":
            pack = isolate_pack(os.path.join(COMFYUI, PACK), dst)
        else:
            shutil.copytree(os.path.join(COMFYUI, PACK), dst, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.rmtree(os.path.join(roots[name], SUITE, "testing_nodes"))
        with open(os.path.join(roots[name], SUITE, "extra_model_paths.yaml"), "w") as f:
            f.write(f"# Config for testing nodes: bulkhead and the testing pack, {name}\n"
                    f"testing:\n    custom_nodes: {custom}\n")

    env = server_env(python, tmp_path)
    built = subprocess.run([python, "-m", "bulkhead", "install", pack],
                           env=dict(env, COMFYUI_PATH=roots["isolated"]),
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, f"`bulkhead install {pack}` failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"

    runs = {}
    for name, root in roots.items():
        warm_s, warm_left = warm_start(root, python, env, str(tmp_path / name / "warm-start.log"))
        xml, out, left = run_suite(root, env, str(tmp_path / name / "run"))
        runs[name] = {"results": outcomes(xml), "output": out, "left": warm_left + left, "warm_start_s": warm_s}

    base, iso = runs["in-process"]["results"], runs["isolated"]["results"]
    differ = sorted(t for t in set(base) | set(iso)
                    if base.get(t, ("absent", ""))[0] != iso.get(t, ("absent", ""))[0])
    summary = {name: {"counts": counts(r["results"]), "output": r["output"], "left_behind": r["left"],
                      "warm_start_s": round(r["warm_start_s"], 1)}
               for name, r in runs.items()}
    summary["differ"] = {t: {"in-process": list(base.get(t, ("absent", ""))),
                             "isolated": list(iso.get(t, ("absent", "")))} for t in differ}
    with open(tmp_path / "summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nComfyUI's {SUITE}: in-process {counts(base)}, isolated {counts(iso)}; summary: "
          f"{tmp_path / 'summary.json'}")

    assert base, f"the in-process run collected no test; its output: {runs['in-process']['output']}"
    problems = [f"{t}: in-process {base.get(t, ('absent',))[0]}, isolated {iso.get(t, ('absent', ''))[0]}"
                + (f" -- {iso[t][1]}" if t in iso and iso[t][1] else "") for t in differ]
    if problems:
        problems.insert(0, f"{len(differ)} of ComfyUI's {SUITE} tests differ with the testing pack isolated "
                           f"(in-process {counts(base)}, isolated {counts(iso)}; outputs: "
                           f"{runs['in-process']['output']}, {runs['isolated']['output']}):")
    problems += [f"the {name} run left processes behind (killed now): {r['left']}"
                 for name, r in runs.items() if r["left"]]
    assert not problems, "\n".join(problems)
