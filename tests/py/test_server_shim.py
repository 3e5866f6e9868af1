"""`server.PromptServer` inside a worker, and previews (issue 16).

A fixture pack imports PromptServer at import, registers routes three
ways (decorators, a module-level ROUTES list, a prompt handler) and sends
events from its node, from its own thread and from a route handler.  It
runs isolated under the project venv's python, with the stub's
PromptServer (tests/comfyui/server.py) as the host's, its app served on
127.0.0.1 and driven over HTTP.
"""

import os
import textwrap

from comfyenv import run_comfy_script
from routes_env import HTTP_HELPERS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))

PACK_NODES = '''
import asyncio, os, threading, time
from aiohttp import web
from server import PromptServer, BinaryEventTypes

srv = PromptServer.instance
IMPORT_CLIENT = srv.client_id


@srv.routes.get("/shimpack/hello/{name}")
async def hello(request):
    return web.json_response({"hello": request.match_info["name"], "q": request.query.get("q"),
                              "pid": os.getpid()})


@srv.routes.post("/shimpack/echo")
async def echo(request):
    body = await request.json()
    PromptServer.instance.send_sync("shimpack.echo", body)
    return web.json_response({"got": body}, status=201)


@srv.routes.get("/shimpack/raise")
async def boom(request):
    raise ValueError("route exploded")


@srv.routes.get("/shimpack/hang")
async def hang(request):
    await asyncio.sleep(3600)


async def listed(request):
    return web.Response(text="from ROUTES")

ROUTES = [web.get("/shimpack/listed", listed)]


def on_prompt(json_data):
    json_data["prompt"]["seen_by"] = "shimpack"
    return json_data

srv.add_on_prompt_handler(on_prompt)


class Talk:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self, text):
        from PIL import Image
        import comfy.utils
        ps = PromptServer.instance
        ps.send_sync("shimpack.node", {"text": text, "client": ps.client_id,
                                       "prompt": ps.last_prompt_id}, ps.client_id)

        def later():
            time.sleep(0.3)
            PromptServer.instance.send_sync("shimpack.thread", {"text": text})
        threading.Thread(target=later, daemon=True).start()
        ps.send_progress_text("working", "7")
        ps.send_sync(BinaryEventTypes.UNENCODED_PREVIEW_IMAGE,
                     ("PNG", Image.new("RGB", (64, 32), (255, 0, 0)), 16))
        bar = comfy.utils.ProgressBar(2)
        bar.update_absolute(1, 2, ("JPEG", Image.new("RGB", (8, 6), (0, 255, 0)), 512))
        bar.update_absolute(2, 2)
        return (text.upper(),)


class Bad:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self):
        try:
            PromptServer.instance.send_sync("shimpack.bad", {"obj": object()})
        except TypeError as e:
            return (f"{type(e).__name__}: {e}",)
        return ("sent",)


class Sleep:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {})}}
    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "go"

    def go(self, seconds):
        time.sleep(seconds)
        return (seconds,)


NODE_CLASS_MAPPINGS = {"Talk": Talk, "Bad": Bad, "Sleep": Sleep}
'''

SCRIPT = '''
import asyncio, io, json, struct, threading, time, urllib.request, urllib.error
import comfy.utils
from aiohttp import web
import server as comfy_server
from bulkhead.host import nodes, states
PACK = {pack!r}

{http_helpers}
def events(name):
    return [d for e, d, s in srv.sent if e == name]

srv = comfy_server.PromptServer()
srv.client_id = "client-1"
srv.last_prompt_id = "prompt-9"
m, _ = nodes.load_pack(PACK, sys.executable, options={{"route_timeout_s": 1.5}})
srv.add_routes()
serve = Serve(srv.app)
port = serve.port
'''


def scenario(tmp_path, body):
    pack = tmp_path / "shimpack"
    pack.mkdir()
    (pack / "__init__.py").write_text("")
    (pack / "nodes.py").write_text(PACK_NODES)
    env = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(tmp_path / "home")}
    return run_comfy_script(SCRIPT.format(pack=str(pack), http_helpers=HTTP_HELPERS) + textwrap.dedent(body),
                            env=env, timeout=240)


def test_events_previews_and_routes_reach_the_hosts_server(tmp_path):
    r = scenario(tmp_path, """
        seen = []
        def hook(v, t, p, node_id=None, **kw):
            seen.append([v, t, None if p is None else [p[0], list(p[1].size), list(p[1].getpixel((0, 0))), p[2]]])
        comfy.utils.set_progress_bar_global_hook(hook)
        out = {"talk": m["Talk"]().go(text="hi")}
        out["node_events"] = events("shimpack.node")
        # the pack thread's event arrives with no further request to the worker
        deadline = time.monotonic() + 20
        while not events("shimpack.thread") and time.monotonic() < deadline:
            time.sleep(0.02)
        out["thread_events"] = events("shimpack.thread")
        text = events(3)
        out["text"] = [text[0][:4].hex(), text[0][4:].decode()] if text else None
        png = events(1)
        out["preview"] = None
        if png:
            from PIL import Image
            img = Image.open(io.BytesIO(png[0][4:]))
            out["preview"] = [struct.unpack(">I", png[0][:4])[0], img.format, list(img.size)]
        out["progress"] = seen
        out["hello"] = http("GET", "/shimpack/hello/bob?q=1")
        out["api_hello"] = http("GET", "/api/shimpack/hello/ann")
        out["echo"] = http("POST", "/shimpack/echo", {"x": [1, 2]})
        out["echo_events"] = events("shimpack.echo")
        out["listed"] = http("GET", "/shimpack/listed")
        out["prompt"] = srv.trigger_on_prompt({"prompt": {"1": {}}})
        out["pid"] = states.runtime(PACK).worker.pid
        serve.close()
        nodes.close_all()
        emit(out)
    """)
    assert r["talk"] == ["HI"]
    assert r["node_events"] == [{"text": "hi", "client": "client-1", "prompt": "prompt-9"}]
    assert r["thread_events"] == [{"text": "hi"}]
    assert r["text"] == ["00000001", "7working"]
    assert r["preview"] == [2, "PNG", [16, 8]]  # contained in max_size 16, as upstream's send_image
    assert r["progress"] == [[1, 2, ["JPEG", [8, 6], [0, 255, 0], 512]], [2, 2, None]]
    assert r["hello"] == [200, {"hello": "bob", "q": "1", "pid": r["pid"]}]
    assert r["api_hello"][0] == 200 and r["api_hello"][1]["hello"] == "ann"
    assert r["echo"] == [201, {"got": {"x": [1, 2]}}]
    assert r["echo_events"] == [{"x": [1, 2]}]
    assert r["listed"] == [200, "from ROUTES"], r["listed"]
    assert r["prompt"] == {"prompt": {"1": {}, "seen_by": "shimpack"}}


def test_failing_hanging_and_busy_routes_and_unsendable_events(tmp_path):
    r = scenario(tmp_path, """
        out = {"raise": http("GET", "/shimpack/raise")}
        out["hang"] = http("GET", "/shimpack/hang")
        out["after_hang"] = http("GET", "/shimpack/hello/again")
        out["bad"] = m["Bad"]().go()
        out["bad_events"] = events("shimpack.bad")
        runner = threading.Thread(target=lambda: m["Sleep"]().go(seconds=4.0))
        runner.start()
        time.sleep(0.5)
        out["busy"] = http("GET", "/shimpack/hello/busy")
        runner.join()
        out["after_busy"] = http("GET", "/shimpack/hello/idle")
        out["talk"] = m["Talk"]().go(text="still")
        out["generation"] = states.runtime(PACK).worker.generation
        serve.close()
        nodes.close_all()
        emit(out)
    """)
    status, text = r["raise"]
    assert status == 500 and "'shimpack'" in text and "ValueError: route exploded" in text, r["raise"]
    status, text = r["hang"]
    assert status == 504 and "'shimpack'" in text and "1.5 s" in text, r["hang"]
    assert r["after_hang"][0] == 200 and r["after_hang"][1]["hello"] == "again"
    assert r["bad"][0].startswith("UnsendableEvent: PromptServer.send_sync('shimpack.bad', ...) in pack "
                                  "'shimpack'"), r["bad"]
    assert "not JSON serializable" in r["bad"][0]
    assert r["bad_events"] == []
    status, text = r["busy"]
    assert status == 503 and "'shimpack'" in text and "busy" in text, r["busy"]
    assert r["after_busy"][0] == 200
    assert r["talk"] == ["STILL"]
    assert r["generation"] == 1  # nothing above cost the worker its life


def test_prompt_handlers_never_wait_on_the_event_loop(tmp_path):
    """Upstream runs prompt handlers on the server's loop: an isolated
    pack's run there only when its worker is idle; while it runs a node,
    or when it is not running, they are skipped for that prompt with one
    line -- the loop never waits for the node, never starts a worker."""
    r = scenario(tmp_path, """
        import logging
        lines = []
        class Keep(logging.Handler):
            def emit(self, rec):
                lines.append(rec.getMessage())
        logging.getLogger("bulkhead").addHandler(Keep())
        out = {"idle": srv.trigger_on_prompt({"prompt": {"1": {}}})}
        node = threading.Thread(target=lambda: m["Sleep"]().go(seconds=4.0))
        node.start()
        time.sleep(0.8)                                     # the node is running in the worker
        out["busy"] = srv.trigger_on_prompt({"prompt": {"2": {}}})
        out["node_still_running"] = node.is_alive()         # the handler did not wait for the node
        node.join()
        w = states.runtime(PACK).worker
        nodes.close_all()
        out["stopped"] = srv.trigger_on_prompt({"prompt": {"3": {}}})
        out["started_one"] = w.alive
        out["lines"] = [l for l in lines if "prompt handlers" in l]
        serve.close()
        emit(out)
    """)
    assert r["idle"] == {"prompt": {"1": {}, "seen_by": "shimpack"}}, r["lines"]
    assert r["busy"] == {"prompt": {"2": {}}} and r["node_still_running"] is True
    assert r["stopped"] == {"prompt": {"3": {}}} and r["started_one"] is False
    busy, stopped = r["lines"]
    assert "skipped for this prompt: the pack's worker is running a node" in busy, r["lines"]
    assert "skipped for this prompt: the pack's worker is not running" in stopped, r["lines"]
