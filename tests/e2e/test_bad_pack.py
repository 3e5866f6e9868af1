"""A pack that misbehaves towards ComfyUI's server (tests/e2e/packs/e2e_bad)
run isolated in ComfyUI, driven over HTTP and the websocket as the web UI
drives it: a route that raises, one that hangs, one asked while the
worker runs a long node, a node whose send_sync payload JSON cannot carry,
and a V3 schema that cannot leave the worker.  Each is a named error; the
server answers meanwhile, and the same worker process serves throughout."""

import asyncio
import json
import time


def _pid(srv):
    entry = srv.wait_history(srv.queue({"1": {"class_type": "E2EBadPid", "inputs": {"seconds": 0.0}}}))
    assert entry["status"]["status_str"] == "success", entry
    return entry["outputs"]["1"]["pid"][0]


def test_a_misbehaving_pack_gets_named_errors_and_the_server_keeps_serving(comfyui):
    import aiohttp
    srv = comfyui(packs=("e2e_bad",))
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2EBadTalk" in info and "E2EBadPid" in info
    assert "E2EBadUnsendable" not in info
    log = srv.log()
    assert "E2EBadUnsendable" in log and "left out" in log and "as_dict().thing" in log, log
    pid = _pid(srv)
    assert srv.http("GET", "/e2e_bad/hello") == (200, {"pid": pid})

    status, text = srv.http("GET", "/e2e_bad/raise")
    assert status == 500 and "'e2e_bad'" in text and "ValueError: route exploded" in text, text

    async def session(ws, sid):
        out = {}
        async with aiohttp.ClientSession() as http:
            async def timed(path):
                t0 = time.monotonic()
                async with http.get(srv.url + path) as r:
                    return r.status, await r.text(), time.monotonic() - t0

            async def answers_meanwhile():
                await asyncio.sleep(0.3)
                return await timed("/queue")
            # a route that never answers: 504 at the route timeout (1.5 s),
            # and the server answers other requests meanwhile
            out["hang"], out["queue_during_hang"] = await asyncio.gather(timed("/e2e_bad/hang"),
                                                                         answers_meanwhile())
            # the worker busy with a 4 s node: 503 after the route timeout
            async with http.post(srv.url + "/prompt", json={"prompt": {
                    "1": {"class_type": "E2EBadPid", "inputs": {"seconds": 4.0}}}, "client_id": sid}) as r:
                long_id = (await r.json())["prompt_id"]
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg["type"] == "executing" and msg["data"].get("node") == "1":
                    break
            # ... and eight requests to its route at once (#24 M2): none waits
            # past a second, and ComfyUI's own static files answer meanwhile
            # (main ran them on aiohttp's default executor, which FileResponse
            # uses, each waiting up to the route timeout)
            async def static_meanwhile():
                await asyncio.sleep(0.3)
                return await timed("/extensions/bulkhead/bulkhead.js")
            *out["busy"], out["queue_during_busy"], out["static_during_busy"] = await asyncio.gather(
                *(timed("/e2e_bad/hello") for _ in range(8)), answers_meanwhile(), static_meanwhile())
            # a node whose event cannot be sent
            async with http.post(srv.url + "/prompt", json={"prompt": {
                    "1": {"class_type": "E2EBadTalk", "inputs": {}}}, "client_id": sid}) as r:
                talk_id = (await r.json())["prompt_id"]
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg["type"] in ("execution_error", "execution_success") and msg["data"]["prompt_id"] == talk_id:
                    out["talk"] = msg
                    break
        return long_id, talk_id, out
    long_id, talk_id, out = srv.run_ws(session)

    status, text, took = out["hang"]
    assert status == 504 and "'e2e_bad'" in text and "1.5 s" in text, out["hang"]
    assert out["queue_during_hang"][0] == 200 and out["queue_during_hang"][2] < 1.0, out["queue_during_hang"]
    for status, text, took in out["busy"]:
        assert status == 503 and "'e2e_bad'" in text and took < 3.0, out["busy"]
    texts = [text for _, text, _ in out["busy"]]
    assert any("busy running a node" in t for t in texts) and any("in flight" in t for t in texts), texts
    assert out["queue_during_busy"][0] == 200 and out["queue_during_busy"][2] < 1.0, out["queue_during_busy"]
    assert out["static_during_busy"][0] == 200 and out["static_during_busy"][2] < 1.0, out["static_during_busy"]
    assert srv.wait_history(long_id)["outputs"]["1"]["pid"] == [pid]
    talk = out["talk"]
    assert talk["type"] == "execution_error", talk
    message = talk["data"]["exception_message"]
    assert "send_sync('e2e_bad.talk'" in message and "'e2e_bad'" in message, message
    assert "not JSON serializable" in message, message
    assert srv.wait_history(talk_id)["status"]["status_str"] == "error"
    # nothing above cost the worker its life
    assert _pid(srv) == pid
    assert srv.http("GET", "/e2e_bad/hello") == (200, {"pid": pid})
