"""Scenarios for bulkhead's ComfyUI routes: a host process with real
workers holding real RAM, the stub's PromptServer (tests/comfyui/server.py)
with bulkhead installed on it, and its aiohttp app served on an ephemeral
localhost port from a thread, so the script talks HTTP to it.

    out = routes_scenario(tmp_path, '''
        a = worker("pack-a")
        a.call("bh_mempack:load", "UNetA", 64 * MiB)
        status, doc = http("GET", "/bulkhead/status")
        out(doc)
        finish(a)
    ''')

Always against tests/comfyui: a real checkout's `server` needs its
frontend and app packages and an event loop it owns.  In scope besides
comfyenv's: `hm` (HostMemory on the scenario's ledger), `worker(name,
**env)`, `held(pid)` (ledger bytes), `resident(w)`, `srv` (the
PromptServer), `routes` (comfy_routes.install's BulkheadRoutes), `http(method,
path, body=None, raw=None) -> (status, JSON or text)`, `port`, `serve`,
`finish(*workers)`, `LEDGER`, `HELPERS`, `BUILD_PY`, `out = emit`.
"""

import os
import textwrap

from comfyenv import run_comfy_script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
BUILD_PY = os.path.join(BUILD, "python")
HELPERS = os.path.join(HERE, "helpers")

PREAMBLE = """
import asyncio, threading, time, urllib.request, urllib.error
import bulkhead
from bulkhead import _native
from bulkhead.host import routes as comfy_routes
from bulkhead.host.memory import HostMemory
from aiohttp import web
import server as comfy_server
import nodes
MiB = 1 << 20
LEDGER = {ledger!r}
HELPERS = {helpers!r}
BUILD_PY = {build_py!r}
hm = HostMemory(mm, ledger_path=LEDGER)
WORKER_PATH = os.pathsep.join([HELPERS, os.getcwd()])

def worker(name, **env):
    env.setdefault("PYTHONPATH", WORKER_PATH)
    return hm.attach(bulkhead.Worker(sys.executable, name=name, env=env))

def held(pid):
    rec = hm.ledger.read(pid)
    return sum(d["held_bytes"] for d in rec["devices"]) if rec else 0

def resident(w):
    return ledger_resident(hm.ledger, w.pid)

def rss(w):
    return rss_bytes(w.pid)

{http_helpers}
srv = comfy_server.PromptServer()
routes = comfy_routes.install(srv, hm, **{options!r})
{before_serve}
srv.add_routes()
serve = Serve(srv.app)
port = serve.port

def finish(*workers):
    serve.close()
    routes.unhook_prompt_boundary()
    hm.close()
    for w in workers:
        w.close()

out = emit
"""


# An aiohttp app served from a thread on 127.0.0.1:<ephemeral>, and a JSON
# client for it: `serve = Serve(app); port = serve.port; http(...)`
# (needs asyncio, threading, json, urllib.request/.error and aiohttp.web).
HTTP_HELPERS = '''
class Serve:
    # The app on 127.0.0.1:<ephemeral> from a thread with its own loop.
    def __init__(self, app):
        self.loop = asyncio.new_event_loop()
        self.app = app
        ready = threading.Event()
        def run():
            asyncio.set_event_loop(self.loop)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = self.runner.addresses[0][1]
            ready.set()
            self.loop.run_forever()
        self.thread = threading.Thread(target=run, name="test-http", daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test server did not start")

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        asyncio.run_coroutine_threadsafe(self.loop.shutdown_default_executor(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

def http(method, path, body=None, raw=None, timeout=120):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text

'''


def routes_scenario(tmp_path, body, monkeypatch, options=None, before_serve="", timeout=240):
    """Runs body after the preamble in a fresh host process against the
    stub (COMFYUI_PATH is ignored here); returns its last emit()."""
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    code = PREAMBLE.format(ledger=str(tmp_path / "ledger"), helpers=HELPERS, build_py=BUILD_PY,
                           options=dict(options or {}), http_helpers=HTTP_HELPERS,
                           before_serve=textwrap.dedent(before_serve)) \
        + textwrap.dedent(body)
    env = {"PYTHONPATH": os.pathsep.join([BUILD_PY, HELPERS])}
    return run_comfy_script(code, timeout=timeout, env=env)
