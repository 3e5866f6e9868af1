"""bulkhead as a user assembles it in ComfyUI: the package in custom_nodes/
(a link to the built package, imported by its path as upstream's
load_custom_node does, with nothing on PYTHONPATH), an isolated pack beside
it whose __init__ calls ``bulkhead.comfy_pack``, and the routes driven over
HTTP.  Nothing hands bulkhead a HostMemory: the routes and the pack's worker
must find the same one on their own (issue 14, "the assembled product is
wired").  Against tests/comfyui (a real checkout's server needs its
frontend)."""

import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from comfyenv import _MARK, script_prelude, STUB_ROOT
from routes_env import BUILD_PY, HELPERS, HTTP_HELPERS

pytestmark = pytest.mark.torch

HOST_VERSION = "%d.%d" % sys.version_info[:2]
MiB = 1 << 20

NODES = '''
import os

class Hold:
    """Loads a model of `mib` MiB of real RAM through the worker's
    load_models_gpu (bh_mempack) and says which process holds it."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "UNet"}), "mib": ("INT", {"default": 64})}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, name, mib):
        import bh_mempack
        bh_mempack.load(name, mib << 20)
        return (os.getpid(),)

NODE_CLASS_MAPPINGS = {"Hold": Hold}
'''

INIT = '''
import bulkhead
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
'''

# One ComfyUI instance: loads custom_nodes/ the way upstream does, serves
# the app, then runs the role's body.
INSTANCE = '''
import asyncio, importlib.util, threading, time, urllib.request, urllib.error
from aiohttp import web
import server as comfy_server
CUSTOM = {custom!r}
READY, DONE = {ready!r}, {done!r}
MiB = 1 << 20

def load_by_path(module_path):
    # upstream's load_custom_node: the module is named after its whole path
    name = module_path.replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(module_path, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

srv = comfy_server.PromptServer()
loaded = {{d: load_by_path(os.path.join(CUSTOM, d)) for d in sorted(os.listdir(CUSTOM))}}
'''

SERVE = HTTP_HELPERS + '''
srv.add_routes()
serve = Serve(srv.app)
port = serve.port
import bulkhead
hold_cls = loaded["held_pack"].NODE_CLASS_MAPPINGS["Hold"]

def hold(name, mib):
    return getattr(hold_cls(), hold_cls.FUNCTION)(name=name, mib=mib)[0]

def held(pid):
    rec = bulkhead.host_memory().ledger.read(pid)
    return sum(d["held_bytes"] for d in rec["devices"]) if rec else 0

def wait_for(path):
    for _ in range(4000):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    raise RuntimeError("waited too long for " + path)

def finish():
    from bulkhead.host import nodes, routes
    serve.close()
    routes.installed(srv).unhook_prompt_boundary()
    nodes.close_all()
    bulkhead.host_memory().close()
'''

INSTANCE_2 = '''
pid = hold("UNet2", 64)
open(READY, "w").close()
wait_for(DONE)
emit(dict(pid=pid, held=held(pid), host_pid=os.getpid()))
finish()
'''

INSTANCE_1 = '''
res = {"routes": [(r.method, r.path) for r in srv.routes], "middlewares": len(srv.app.middlewares)}
# before any pack's worker exists: the routes already have this host's memory
res["hm_before"] = bulkhead.host_memory() is not None
pid = hold("UNetA", 192)
res["pid"], res["me"] = pid, os.getpid()
wait_for(READY)
status, doc = http("GET", "/bulkhead/status")
res["other"] = [p for p in doc["processes"] if p["role"] == "worker" and p["host_pid"] != os.getpid()]
rss_before = rss_bytes(pid)
res["free"] = http("POST", "/free", {"unload_models": True, "free_memory": True})
# ("Free model and node cache" stops an idle worker that holds nothing
# ComfyUI references: its RSS is all back)
res["rss_drop"] = rss_before - (rss_bytes(pid) if os.path.exists("/proc/%d/status" % pid) else 0)
res["held_after_free"] = held(pid)
pid = res["pid_after_free"] = hold("VAEA", 64)   # the next worker, started by the node
res["release"] = http("POST", "/bulkhead/release", {"pid": pid})
res["held_after_release"] = held(pid)
# instance 2's worker, through instance 2's control socket
other_pid = res["other"][0]["pid"] if res["other"] else 0
res["release_other"] = http("POST", "/bulkhead/release", {"pid": other_pid, "bytes": 16 * MiB})
hold("ClipA", 32)
res["bh_free"] = http("POST", "/bulkhead/free", {})
res["timeline"] = http("GET", "/bulkhead/status")[1]["timeline"]
open(DONE, "w").close()
emit(res)
finish()
'''


def _make_custom_nodes(tmp_path):
    custom = tmp_path / "custom_nodes"
    custom.mkdir()
    os.symlink(os.path.join(BUILD_PY, "bulkhead"), custom / "bulkhead")
    pack = custom / "held_pack"
    pack.mkdir()
    (pack / "__init__.py").write_text(INIT)
    (pack / "nodes.py").write_text(NODES)
    # The worker's bh_mempack comes from the tests' helpers; torch from the
    # host's site-packages.
    worker_path = os.pathsep.join([HELPERS, sysconfig.get_paths()["purelib"]])
    (pack / "comfy-env.toml").write_text(textwrap.dedent(f'''\
        python = "{HOST_VERSION}"
        [env_vars]
        PYTHONPATH = "{worker_path}"
    '''))
    return custom, pack


def _instance(tmp_path, custom, body, env):
    code = script_prelude(root=STUB_ROOT, real=False) + INSTANCE.format(
        custom=str(custom), ready=str(tmp_path / "ready"), done=str(tmp_path / "done")) + SERVE + body
    return subprocess.Popen([sys.executable, "-c", code], cwd=STUB_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    results = [line[len(_MARK):] for line in out.splitlines() if line.startswith(_MARK)]
    assert proc.returncode == 0 and results, f"rc={proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
    return json.loads(results[-1])


@pytest.mark.parametrize("installed", ["linked", "on_sys_path"])
def test_the_assembled_product_frees_this_hosts_workers(tmp_path, installed):
    """Two ComfyUI instances, each with bulkhead and the same isolated pack
    in custom_nodes/: POST /free reports the bytes this host's worker gave
    back (and its RSS fell), /bulkhead/release and /bulkhead/free act on
    this host's worker and reach the other instance's through its control
    socket, the timeline records it all, and the routes are installed
    once.  installed: the package only linked into custom_nodes/ (nothing
    on PYTHONPATH), or also importable as ``bulkhead`` (a pip install),
    where upstream's by-path import must not make a second copy."""
    custom, pack = _make_custom_nodes(tmp_path)
    env = dict(os.environ, PYTHONPATH="" if installed == "linked" else BUILD_PY, BULKHEAD_HOME=str(tmp_path / "home"),
               BULKHEAD_LEDGER=str(tmp_path / "ledger"))
    env.pop("COMFYUI_PATH", None)
    build = subprocess.run([sys.executable, "-m", "bulkhead", "install", str(pack)], capture_output=True,
                           text=True, timeout=300, env=dict(env, PYTHONPATH=BUILD_PY))
    assert build.returncode == 0, build.stdout + build.stderr
    two = _instance(tmp_path, custom, INSTANCE_2, env)
    try:
        one = _result(_instance(tmp_path, custom, INSTANCE_1, env))
    finally:
        (tmp_path / "done").touch()
        other = _result(two)
    pid, me = one["pid"], one["me"]
    assert pid != me and one["hm_before"]
    assert one["routes"].count(["POST", "/bulkhead/release"]) == 1 and one["middlewares"] == 1
    assert [p["pid"] for p in one["other"]] == [other["pid"]]

    status, body = one["free"]
    assert status == 200, body
    rows = body["bulkhead"]["processes"]
    assert [(r["pid"], r["host_pid"], r["state"]) for r in rows] == [(pid, me, "exited")], body
    assert rows[0]["before_bytes"] == 192 * MiB and rows[0]["after_bytes"] == 0
    assert body["bulkhead"]["freed_bytes"] == 192 * MiB
    assert one["rss_drop"] >= 192 * MiB * 0.9, one["rss_drop"]
    assert one["held_after_free"] == 0

    status, rel = one["release"]
    assert status == 200, rel
    pid = one["pid_after_free"]
    assert pid != one["pid"]
    assert (rel["worker_pid"], rel["host_pid"], rel["freed_bytes"]) == (pid, me, 64 * MiB)
    assert one["held_after_release"] == 0

    status, rel = one["release_other"]
    assert status == 200, rel
    assert rel["worker_pid"] == other["pid"] and rel["host_pid"] == other["host_pid"]
    assert rel["freed_bytes"] > 0
    # instance 1's own /free and releases left instance 2's worker alone
    assert other["held"] == 64 * MiB - rel["freed_bytes"]

    status, free = one["bh_free"]
    assert status == 200 and [(r["pid"], r["freed_bytes"]) for r in free["processes"]] == [(pid, 32 * MiB)]
    kinds = [e["kind"] for e in one["timeline"]]
    assert "free" in kinds and "release" in kinds, one["timeline"]
