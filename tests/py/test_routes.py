"""bulkhead's routes on ComfyUI's server (python/bulkhead/host/routes.py):
the status document, POST /bulkhead/release and /bulkhead/free with
before/after bytes measured from the ledger, ComfyUI's own /free reaching
the workers, and the prompt boundary.

The status document is checked in this process against records written
through _native.Ledger; everything that acts runs as a scenario
(routes_env.py): a host process with real workers holding real RAM and the
stub's PromptServer served over HTTP on localhost.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bulkhead import _native
from bulkhead.host import routes as comfy_routes
from bulkhead.host import service as comfy_service
from routes_env import BUILD, BUILD_PY, routes_scenario

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_NVML = os.path.join(BUILD, "tests", "c", "fake_nvml", "libnvidia-ml.so.1")
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"

# A process that joins a ledger and waits for a line on stdin: a record of
# another pid, with the role and host the test names.
JOINER = r"""
import sys
from bulkhead import _native
l = _native.Ledger(sys.argv[1])
l.join(sys.argv[2], pack=sys.argv[3], interpreter="3.0.0", generation=int(sys.argv[4]),
       host_pid=int(sys.argv[5]))
l.set_device("cpu", held_bytes=int(sys.argv[6]), pinned_bytes=7)
if int(sys.argv[6]):
    l.set_model(1, "FakeModel", "cpu", int(sys.argv[6]) * 2, int(sys.argv[6]))
print("ready", flush=True)
sys.stdin.readline()
l.close()
"""


def _join(ledger, role, pack, host_pid=0, held=0, generation=1):
    p = subprocess.Popen([sys.executable, "-c", JOINER, str(ledger), role, pack, str(generation),
                          str(host_pid), str(held)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=BUILD_PY))
    assert p.stdout.readline().strip() == "ready"
    return p


# A process that takes the ledger's mutex (the BH_TESTING hook) and keeps it
# until a line on stdin.
MUTEX_HOLDER = r"""
import sys
from bulkhead import _native
l = _native.Ledger(sys.argv[1])
l._test_lock()
print("ready", flush=True)
sys.stdin.readline()
l._test_unlock()
l.close()
"""


class _Served:
    """An aiohttp app with `routes` on it and a trivial GET /ping, served on
    127.0.0.1 from a thread with its own loop (routes_env's Serve), and
    http(method, path, body) -> (status, JSON) against it.  middlewares:
    the app's (a test's own, before the routes)."""

    def __init__(self, routes, middlewares=()):
        from aiohttp import web
        from routes_env import HTTP_HELPERS
        import asyncio, threading, urllib.request, urllib.error
        self.ns = dict(asyncio=asyncio, threading=threading, json=json, urllib=urllib, web=web)
        exec(HTTP_HELPERS, self.ns)
        app = web.Application(middlewares=list(middlewares))

        async def ping(request):
            return web.json_response({"pong": True})

        app.router.add_get("/ping", ping)
        routes.add_to(app.router)
        self.serve = self.ns["Serve"](app)
        self.ns["port"] = self.serve.port

    def http(self, method, path, body=None, raw=None):
        return self.ns["http"](method, path, body, raw, timeout=60)

    def close(self):
        self.serve.close()


def _leave(*procs):
    for p in procs:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()


# ------------------------------------------------------ the status document


def test_status_document_reads_every_process_from_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    path = tmp_path / "ledger"
    ledger = _native.Ledger(str(path))
    ledger.join("host", pack="host", interpreter="3.12.1")
    ledger.set_device("cpu", held_bytes=3 * MiB)
    me = os.getpid()
    w1 = _join(path, "worker", 'pack "b"', host_pid=me, held=64 * MiB, generation=2)
    w0 = _join(path, "worker", "pack-a", host_pid=me, held=32 * MiB)
    orphan = _join(path, "worker", "orphan", host_pid=1, held=MiB)
    # a host with a pid above the orphan's (started after it), as where pids
    # wrapped past the orphan's host
    other = _join(path, "host", "host")
    try:
        doc = comfy_service.status_document(ledger)
        by_path = comfy_service.status_document(str(path))
    finally:
        _leave(w0, w1, orphan, other)
        ledger.close()
    assert doc["schema"] == 1 and doc["ledger"] == str(path) and doc["ledger_present"] is True
    assert doc["gpu_error"].startswith("no NVIDIA driver") and doc["ram_error"] is None
    cpu = doc["devices"][0]
    assert cpu["device"] == "cpu" and cpu["source"] in ("meminfo", "cgroup")
    assert 0 < cpu["free_bytes"] <= cpu["total_bytes"] and cpu["index"] is None
    procs = doc["processes"]
    # hosts by pid, each followed by its workers by pid, then the orphan (its
    # host has no record) after every host, whatever the pids (they wrap)
    hosts = {me: [me] + sorted([w0.pid, w1.pid]), other.pid: [other.pid]}
    expected = [pid for h in sorted(hosts) for pid in hosts[h]] + [orphan.pid]
    assert [p["pid"] for p in procs] == expected
    host = procs[[p["pid"] for p in procs].index(me)]
    assert host["role"] == "host" and host["host_pid"] is None and host["held_bytes"] == 3 * MiB
    b = next(p for p in procs if p["pid"] == w1.pid)
    assert b["pack"] == 'pack "b"' and b["role"] == "worker" and b["host_pid"] == me
    assert b["generation"] == 2 and b["interpreter"] == "3.0.0" and b["state"] == "idle"
    assert b["held_bytes"] == 64 * MiB and b["devices"] == [
        {"device": "cpu", "held_bytes": 64 * MiB, "pinned_bytes": 7, "pin_ceiling_bytes": 0,
         "pager_bytes": 0, "floor_bytes": 0, "reserve_bytes": 0}]
    assert b["models"] == [{"id": 1, "name": "FakeModel", "device": "cpu", "size_bytes": 128 * MiB,
                            "resident_bytes": 64 * MiB}]
    assert b["idle_s"] is None or b["idle_s"] >= 0
    assert set(b) == {"pid", "role", "pack", "interpreter", "generation", "host_pid", "state", "idle_s",
                      "held_bytes", "devices", "models", "release_count", "released_bytes"}
    assert [p["pid"] for p in by_path["processes"]] == expected
    json.dumps(doc)  # plain JSON all the way down


def test_status_document_without_a_ledger_file_creates_none(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/x.so")
    path = tmp_path / "never"
    doc = comfy_service.status_document(str(path))
    assert doc["ledger_present"] is False and doc["processes"] == [] and doc["devices"]
    assert not path.exists()


@pytest.mark.skipif(not os.path.exists(FAKE_NVML), reason=f"no fake NVML at {FAKE_NVML} (build first)")
def test_status_document_lists_every_nvml_device(tmp_path, monkeypatch):
    state = tmp_path / "nvml"
    state.write_text(f'device {UUID0} "Fake H200" total=150000000000 free=140000000000 used=10000000000\n'
                     'device GPU-66666666-7777-8888-9999-000000000000 "Fake A100" total=80000000000 '
                     'free=80000000000 used=0\n')
    monkeypatch.setenv("BH_FAKE_NVML", str(state))
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", FAKE_NVML)
    doc = comfy_service.status_document(str(tmp_path / "none"))
    assert doc["gpu_error"] is None
    gpus = [d for d in doc["devices"] if d["source"] == "nvml"]
    assert gpus == [
        {"device": "cuda:0", "total_bytes": 150000000000, "free_bytes": 140000000000, "source": "nvml",
         "index": 0, "uuid": UUID0, "name": "Fake H200"},
        {"device": "cuda:1", "total_bytes": 80000000000, "free_bytes": 80000000000, "source": "nvml",
         "index": 1, "uuid": "GPU-66666666-7777-8888-9999-000000000000", "name": "Fake A100"}]


@pytest.mark.skipif(not os.path.exists(FAKE_NVML), reason=f"no fake NVML at {FAKE_NVML} (build first)")
def test_status_route_reads_through_the_hosts_own_handles(tmp_path, monkeypatch):
    """GET /bulkhead/status reuses the ledger and the NVML handle the host
    already holds: no ledger open and no dlopen + nvmlInit per request.
    Proven by taking both away from the path: the ledger file is unlinked
    (a reopen by path would find nobody) and $BULKHEAD_NVML_LIBRARY names
    nothing (a fresh NVML open would fail)."""
    import types
    state = tmp_path / "nvml"
    state.write_text(f'device {UUID0} "Fake H200" total=150000000000 free=140000000000 used=0\n')
    monkeypatch.setenv("BH_FAKE_NVML", str(state))
    path = tmp_path / "ledger"
    ledger = _native.Ledger(str(path))
    ledger.join("host", pack="host", interpreter="3.12.1")
    gpu = _native.Gpu(FAKE_NVML)
    hm = types.SimpleNamespace(ledger=ledger, events=[], gpu_probe=lambda: gpu)
    try:
        os.unlink(path)
        monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
        doc = comfy_routes.BulkheadRoutes(hm).status()
        # both handles are still the host's, open and usable
        assert ledger.read(os.getpid()) is not None and gpu.count() == 1
    finally:
        ledger.close()
        gpu.close()
    assert doc["ledger"] == str(path) and doc["ledger_present"] is True
    assert [p["pid"] for p in doc["processes"]] == [os.getpid()] == [doc["host_pid"]]
    assert doc["gpu_error"] is None
    assert [d["uuid"] for d in doc["devices"] if d["source"] == "nvml"] == [UUID0]


def test_status_route_never_waits_on_the_ledger_mutex_and_answers_off_the_loop(tmp_path, monkeypatch):
    """GET /bulkhead/status while another process holds the ledger's mutex:
    the snapshot does not wait for it (it used to wait up to its 2 s
    bound) and is whole.  And a slow snapshot runs off the server's loop:
    another route answers within 100 ms meanwhile, and requests that come
    while one snapshot is in flight share it instead of queueing more."""
    import threading
    import time
    import types
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    path = tmp_path / "ledger"
    ledger = _native.Ledger(str(path))
    ledger.join("host", pack="host", interpreter="3.12.1")
    hm = types.SimpleNamespace(ledger=ledger, events=[], gpu_probe=lambda: None)
    routes = comfy_routes.BulkheadRoutes(hm)
    served = _Served(routes)
    holder = subprocess.Popen([sys.executable, "-c", MUTEX_HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=BUILD_PY))
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert served.http("GET", "/ping")[0] == 200   # the connection path is warm
        t0 = time.monotonic()
        held = served.http("GET", "/bulkhead/status")
        held_s = time.monotonic() - t0
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()
    snapshots = []
    real = comfy_service.status_document

    def slow(*a):
        snapshots.append(time.monotonic())
        time.sleep(1.0)
        return real(*a)
    monkeypatch.setattr(comfy_service, "status_document", slow)
    answers = []
    try:
        clients = [threading.Thread(target=lambda: answers.append(served.http("GET", "/bulkhead/status")))
                   for _ in range(3)]
        for t in clients:
            t.start()
        while not snapshots:
            time.sleep(0.01)
        time.sleep(0.3)     # the snapshot is in flight; every request has come
        t0 = time.monotonic()
        ping = served.http("GET", "/ping")
        ping_s = time.monotonic() - t0
        for t in clients:
            t.join(30)
    finally:
        served.close()
        ledger.close()
    status, doc = held
    assert status == 200 and [p["pid"] for p in doc["processes"]] == [os.getpid()], held
    assert held_s < 1.0, held_s
    assert ping == (200, {"pong": True}) and ping_s < 0.1, ping_s
    assert len(answers) == 3 and all(status == 200 for status, _ in answers), answers
    assert all([p["pid"] for p in doc["processes"]] == [os.getpid()] == [doc["host_pid"]]
               for _, doc in answers)
    assert len(snapshots) == 1, snapshots


def test_status_json_refuses_what_is_not_a_handle(tmp_path):
    with pytest.raises(TypeError, match="Gpu"):
        _native.status_json(None, "not a gpu")
    with pytest.raises(TypeError):
        _native.status_json(3)
    closed = _native.Ledger(str(tmp_path / "ledger"))
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        _native.status_json(closed)


@pytest.mark.parametrize("body, message", [
    ([], "must be a JSON object"),
    ({}, "exactly one worker"),
    ({"pid": 1, "pack": "a"}, "exactly one worker"),
    ({"pid": "12"}, '"pid" must be a positive integer'),
    ({"pid": True}, '"pid" must be a positive integer'),
    ({"pid": -3}, '"pid" must be a positive integer'),
    ({"pack": ""}, '"pack" must be a non-empty string'),
    ({"pack": 5}, '"pack" must be a non-empty string'),
    ({"pack": "a", "bytes": 0}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": 1.5}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": 2 ** 63}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": float("inf")}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": float("nan")}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": -1}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": True}, '"bytes" must be a positive integer or null'),
    ({"pack": "a", "bytes": "5"}, '"bytes" must be a positive integer or null'),
    ({"pid": 2 ** 63}, '"pid" must be a positive integer'),
])
def test_release_bodies_that_are_refused(body, message):
    with pytest.raises(comfy_service.RouteError) as e:
        comfy_routes._parse_release(body)
    assert e.value.status == 400 and message in str(e.value)


def test_release_bodies_that_are_accepted():
    assert comfy_routes._parse_release({"pid": 42}) == (42, None)
    assert comfy_routes._parse_release({"pack": "p", "bytes": 5}) == ("p", 5)
    assert comfy_routes._parse_release({"pack": "p", "bytes": None}) == ("p", None)
    assert comfy_routes._parse_release({"pack": "p", "bytes": 2 ** 63 - 1}) == ("p", 2 ** 63 - 1)


@pytest.mark.parametrize("body, message", [
    ([], "must be a JSON object"),
    ({"all_hosts": "yes"}, '"all_hosts" must be a boolean'),
    ({"all_hosts": 1}, '"all_hosts" must be a boolean'),
    ({"wait_s": float("inf")}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": float("nan")}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": 1e8}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": 10 ** 400}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": -1}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": True}, '"wait_s" must be a number of seconds from 0 to 60'),
    ({"wait_s": "5"}, '"wait_s" must be a number of seconds from 0 to 60'),
])
def test_free_bodies_that_are_refused(body, message):
    with pytest.raises(comfy_service.RouteError) as e:
        comfy_routes._parse_free(body)
    assert e.value.status == 400 and message in str(e.value)


def test_free_bodies_that_are_accepted():
    assert comfy_routes._parse_free({}) == (False, None)
    assert comfy_routes._parse_free({"all_hosts": True, "wait_s": 0}) == (True, 0.0)
    assert comfy_routes._parse_free({"wait_s": 60}) == (False, 60.0)


@pytest.mark.parametrize("remote, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("192.0.2.1", False), ("::ffff:192.0.2.1", False), ("2001:db8::1", False), ("", False), (None, False),
])
def test_which_clients_are_loopback(remote, loopback):
    import types
    assert comfy_routes.from_loopback(types.SimpleNamespace(remote=remote)) is loopback
    # forwarded by a proxy on this machine: from somewhere else
    for h in ("Forwarded", "X-Forwarded-For", "X-Real-IP"):
        assert comfy_routes.from_loopback(types.SimpleNamespace(remote=remote, headers={h: "x"})) is False


def _fake_host(tmp_path):
    """A joined host record on a fresh ledger and a stand-in HostMemory with
    no workers of its own: (ledger, hm)."""
    import collections
    import types
    ledger = _native.Ledger(str(tmp_path / "ledger"))
    ledger.join("host", pack="host", interpreter="3.12.1")
    return ledger, types.SimpleNamespace(ledger=ledger, events=collections.deque(), owners=[],
                                         gpu_probe=lambda: None)


def _remote_from_header():
    """A test middleware: a request with X-Test-Remote reaches the routes
    as if its client were that address (request.clone(remote=...)); no
    traffic leaves 127.0.0.1."""
    from aiohttp import web

    @web.middleware
    async def as_remote(request, handler):
        remote = request.headers.get("X-Test-Remote")
        return await handler(request.clone(remote=remote) if remote else request)

    return as_remote


def test_a_web_client_off_the_machine_cannot_reach_other_instances(tmp_path, monkeypatch):
    """{"all_hosts": true} and a release of another host's worker, from a
    client that is not on loopback: 403 naming the setting, and nothing is
    asked of the other host; from loopback, or with the setting, they run."""
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    monkeypatch.delenv("BULKHEAD_ALLOW_REMOTE_ALL_HOSTS", raising=False)
    ledger, hm = _fake_host(tmp_path)
    routes = comfy_routes.BulkheadRoutes(hm, free_wait_s=0.1, release_timeout_s=1.0)
    asked = []
    real_remote = routes.release_remote
    routes.release_remote = lambda target, nbytes=None: asked.append(target) or real_remote(target, nbytes)
    # another host (no control socket: unreachable) with an idle worker
    ghost = _join(tmp_path / "ledger", "host", "ghost-host")
    gw = _join(tmp_path / "ledger", "worker", "ghost-pack", host_pid=ghost.pid, held=MiB)
    served = _Served(routes, [_remote_from_header()])
    far = {"X-Test-Remote": "192.0.2.1"}

    def post(path, body, headers=None):
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{served.serve.port}{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        far_all = post("/bulkhead/free", {"all_hosts": True}, far)
        far_release = post("/bulkhead/release", {"pack": "ghost-pack"}, far)
        far_local = post("/bulkhead/free", {}, far)          # this instance's own: allowed
        # what a client off the machine sees: this host's records only (L4)
        import urllib.request
        def get_status(headers):
            req = urllib.request.Request(f"http://127.0.0.1:{served.serve.port}/bulkhead/status", headers=headers)
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        far_status, near_status = get_status(far), get_status({})
        # a loopback peer that is a local reverse proxy forwarding someone else
        proxied_all = post("/bulkhead/free", {"all_hosts": True}, {"X-Forwarded-For": "198.51.100.7"})
        asked_far = list(asked)
        near_all = post("/bulkhead/free", {"all_hosts": True})
        near_release = post("/bulkhead/release", {"pack": "ghost-pack"})
        monkeypatch.setenv("BULKHEAD_ALLOW_REMOTE_ALL_HOSTS", "1")
        allowed_release = post("/bulkhead/release", {"pack": "ghost-pack"}, far)
    finally:
        served.close()
        _leave(gw, ghost)
        ledger.close()
    for status, answer in (far_all, far_release):
        assert status == 403 and "192.0.2.1" in answer["error"], answer
        assert "BULKHEAD_ALLOW_REMOTE_ALL_HOSTS=1" in answer["error"] and "loopback" in answer["error"]
    assert "ghost-pack" in far_release[1]["error"] and "all_hosts" in far_all[1]["error"]
    assert proxied_all[0] == 403 and "loopback" in proxied_all[1]["error"], proxied_all
    assert {p["pid"] for p in near_status["processes"]} >= {ghost.pid, gw.pid}
    assert not {p["pid"] for p in far_status["processes"]} & {ghost.pid, gw.pid}, far_status["processes"]
    assert far_status["other_hosts_hidden"] is True and "other_hosts_hidden" not in near_status
    assert far_local[0] == 200 and far_local[1]["processes"] == []
    assert asked_far == []
    # from loopback the other host is asked (and is unreachable: no control socket)
    assert near_all[0] == 200 and [r["state"] for r in near_all[1]["processes"]] == ["unreachable"]
    assert near_release[0] == 502 and "unreachable" in near_release[1]["error"]
    assert allowed_release[0] == 502
    assert [t.pid for t in asked] == [gw.pid] * 3


def test_bad_numbers_are_400s_over_http(tmp_path, monkeypatch):
    """What JSON can carry that Python parses into numbers no release can
    take (Infinity, NaN, 2**63, 1e8 s): 400 naming the field, never a 500
    or a thread held for a day."""
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    ledger, hm = _fake_host(tmp_path)
    served = _Served(comfy_routes.BulkheadRoutes(hm))
    try:
        answers = {raw: served.http("POST", path, raw=raw) for path, raw in [
            ("/bulkhead/free", b'{"wait_s": Infinity}'),
            ("/bulkhead/free", b'{"wait_s": NaN}'),
            ("/bulkhead/free", b'{"wait_s": 1e8}'),
            ("/bulkhead/free", b'{"wait_s": -1}'),
            ("/bulkhead/free", b'{"all_hosts": "yes"}'),
            ("/bulkhead/release", b'{"pid": %d, "bytes": 9223372036854775808}' % os.getpid()),
            ("/bulkhead/release", b'{"pid": 9223372036854775808}'),
            ("/bulkhead/release", b'{"pid": %d, "bytes": Infinity}' % os.getpid()),
        ]}
    finally:
        served.close()
        ledger.close()
    for raw, (status, answer) in answers.items():
        field = "wait_s" if b"wait_s" in raw else "all_hosts" if b"all_hosts" in raw else \
            "bytes" if b"bytes" in raw else "pid"
        assert status == 400 and f'"{field}"' in answer["error"], (raw, status, answer)


def test_releases_in_progress_are_bounded(tmp_path, monkeypatch):
    """At most ACT_ADMITTED releases and frees at once, on threads of their
    own: one more is answered 429 at once, and the server answers other
    routes meanwhile."""
    import threading
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    ledger, hm = _fake_host(tmp_path)
    routes = comfy_routes.BulkheadRoutes(hm)
    gate, entered = threading.Event(), []
    real_free = routes.free
    routes.free = lambda *a: entered.append(threading.current_thread().name) or gate.wait(60) and real_free(*a)
    served = _Served(routes)
    n = comfy_routes.ACT_ADMITTED
    answers = []
    clients = [threading.Thread(target=lambda: answers.append(served.http("POST", "/bulkhead/free", {})))
               for _ in range(n)]
    try:
        for t in clients:
            t.start()
        for _ in range(3000):
            if routes._acting == n:
                break
            threading.Event().wait(0.01)
        extra = served.http("POST", "/bulkhead/free", {})
        ping = served.http("GET", "/ping")
    finally:
        gate.set()
        for t in clients:
            t.join(60)
        served.close()
        ledger.close()
    assert extra[0] == 429 and "in progress" in extra[1]["error"], extra
    assert ping == (200, {"pong": True})
    assert sorted(status for status, _ in answers) == [200] * n
    assert len(entered) == n and all(name.startswith("bulkhead-act") for name in entered), entered


def test_route_code_writes_nothing_into_comfy():
    """DESIGN.md 5 holds for the new host-side files too (test_memory's scan
    covers every file of the package; this names the ones added here)."""
    from pkgsource import PY_SRC, comfy_assignments
    for fn in ("host/routes.py", "__init__.py"):
        with open(os.path.join(PY_SRC, fn)) as f:
            assert comfy_assignments(f.read(), fn) == []


def test_the_package_loads_as_a_comfyui_custom_node(tmp_path):
    """What ComfyUI's load_custom_node does with the package: import its
    __init__ under a path-like module name while PromptServer.instance
    exists; WEB_DIRECTORY names a directory with the panel, NODE_CLASS_MAPPINGS
    exists, and the routes, the /free observer and the prompt hook are on
    the server."""
    pkg = os.path.join(BUILD_PY, "bulkhead")
    code = textwrap.dedent(f"""
        import importlib.util, json, os, sys
        sys.path[:0] = [{os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "comfyui")!r}]
        import server
        srv = server.PromptServer()
        name = {pkg!r}.replace(".", "_x_")
        spec = importlib.util.spec_from_file_location(name, os.path.join({pkg!r}, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        web = os.path.join({pkg!r}, module.WEB_DIRECTORY)
        routes = [(r.method, r.path) for r in srv.routes]
        from comfy_execution import cache_provider
        print(json.dumps(dict(web=sorted(os.listdir(web)), nodes=module.NODE_CLASS_MAPPINGS,
                              routes=routes, middlewares=len(srv.app.middlewares),
                              providers=[type(p).__name__ for p in cache_provider._get_cache_providers()])))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=""), cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert "bulkhead.js" in r["web"] and r["nodes"] == {}
    assert ["GET", "/bulkhead/status"] in r["routes"] and ["POST", "/bulkhead/release"] in r["routes"]
    assert ["POST", "/bulkhead/free"] in r["routes"] and ["POST", "/free"] in r["routes"]
    assert r["middlewares"] == 1 and r["providers"] == ["BulkheadPromptBoundary"]


# ------------------------------------------------------------- scenarios


@pytest.mark.torch
def test_status_and_release_routes(tmp_path, monkeypatch):
    r = routes_scenario(tmp_path, """
        import subprocess
        a, b = worker("pack-a"), worker("pack-b")
        a.call("bh_mempack:load", "UNetA", 64 * MiB)
        a.call("bh_mempack:load", "VAEA", 32 * MiB)
        b.call("bh_mempack:load", "ClipB", 64 * MiB)
        res = {}
        res["status"] = http("GET", "/bulkhead/status")
        res["api_status"] = http("GET", "/api/bulkhead/status")[0]
        # a host without a control socket, and its worker: reachable only in the ledger
        joiner = [sys.executable, "-c", JOINER]
        env = dict(os.environ, PYTHONPATH=BUILD_PY)
        ghost = subprocess.Popen(joiner + [LEDGER, "host", "ghost-host", "1", "0", "0"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ghost.stdout.readline()
        gw = subprocess.Popen(joiner + [LEDGER, "worker", "ghost-pack", "1", str(ghost.pid), str(8 * MiB)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        gw.stdout.readline()
        res["partial"] = http("POST", "/bulkhead/release", {"pack": "pack-a", "bytes": 16 * MiB})
        res["full"] = http("POST", "/api/bulkhead/release", {"pid": b.pid})
        res["b_after"] = dict(held=held(b.pid), worker_view=b.call("bh_mempack:resident"))
        res["no_pid"] = http("POST", "/bulkhead/release", {"pid": 2 ** 30})
        res["no_pack"] = http("POST", "/bulkhead/release", {"pack": "nope"})
        res["host_pid"] = http("POST", "/bulkhead/release", {"pid": os.getpid()})
        res["not_json"] = http("POST", "/bulkhead/release", raw=b"{pid")
        res["bad_body"] = http("POST", "/bulkhead/release", {"pid": 1, "pack": "x"})
        res["unreachable"] = http("POST", "/bulkhead/release", {"pack": "ghost-pack"})
        # a worker in a call: the release waits free_wait_s, then 409
        t = threading.Thread(target=a.call, args=("bh_mempack:sleep", 3.0))
        t.start()
        time.sleep(0.5)
        res["busy"] = http("POST", "/bulkhead/release", {"pack": "pack-a"})
        res["busy_free"] = http("POST", "/bulkhead/free", {})
        t.join()
        res["timeline"] = http("GET", "/bulkhead/status")[1]["timeline"]
        for p in (gw, ghost):
            p.stdin.close(); p.wait(); p.stdout.close()
        res["pids"] = dict(a=a.pid, b=b.pid, me=os.getpid(), ghost=ghost.pid, gw=gw.pid)
        out(res)
        finish(a, b)
    """.replace("JOINER", repr(JOINER)), monkeypatch, options={"free_wait_s": 0.5})
    pids = r["pids"]
    status, doc = r["status"]
    assert status == 200 and r["api_status"] == 200
    assert doc["host_pid"] == pids["me"] and isinstance(doc["timeline"], list)
    rows = {p["pid"]: p for p in doc["processes"]}
    assert [p["pid"] for p in doc["processes"]][:3] == [pids["me"], *sorted([pids["a"], pids["b"]])]
    assert rows[pids["a"]]["pack"] == "pack-a" and rows[pids["a"]]["held_bytes"] == 96 * MiB
    assert sorted(m["name"] for m in rows[pids["a"]]["models"]) == ["UNetA", "VAEA"]
    assert rows[pids["b"]]["held_bytes"] == 64 * MiB and rows[pids["b"]]["host_pid"] == pids["me"]

    status, partial = r["partial"]
    assert status == 200 and partial["pack"] == "pack-a" and partial["before_bytes"] == 96 * MiB
    # n bytes of a worker: its own upstream walk picks the victims and stops on
    # the machine's free figure, which other processes move too: some bytes
    assert partial["freed_bytes"] > 0 and partial["after_bytes"] == 96 * MiB - partial["freed_bytes"]
    status, full = r["full"]
    assert status == 200, full
    assert full == {"worker_pid": pids["b"], "pack": "pack-b", "host_pid": pids["me"],
                    "before_bytes": 64 * MiB, "after_bytes": 0, "freed_bytes": 64 * MiB,
                    "receipt": {"before_bytes": 64 * MiB, "after_bytes": 0, "freed_bytes": 64 * MiB}}
    assert r["b_after"] == {"held": 0, "worker_view": {"ClipB": 0}}

    assert r["no_pid"][0] == 404 and "no running bulkhead worker has pid" in r["no_pid"][1]["error"]
    assert r["no_pack"][0] == 404 and "pack-a, pack-b" in r["no_pack"][1]["error"]
    assert r["host_pid"][0] == 404
    assert r["not_json"][0] == 400 and "not JSON" in r["not_json"][1]["error"]
    assert r["bad_body"][0] == 400 and "exactly one worker" in r["bad_body"][1]["error"]
    status, unreachable = r["unreachable"]
    assert status == 502 and f"pid {pids['ghost']}" in unreachable["error"] and "unreachable" in unreachable["error"]
    status, busy = r["busy"]
    assert status == 409 and "stayed busy" in busy["error"], busy
    status, busy_free = r["busy_free"]
    assert status == 200
    state = {row["pack"]: row["state"] for row in busy_free["processes"]}
    assert state == {"pack-a": "busy", "pack-b": "released"}, busy_free
    kinds = [(e["kind"], e["process"]) for e in r["timeline"]]
    assert ("release", "pack-a") in kinds and ("release", "pack-b") in kinds


@pytest.mark.torch
def test_bulkhead_free_frees_worker_memory_with_before_after(tmp_path, monkeypatch):
    """POST /bulkhead/free: every worker of this host runs its full ladder
    and the answer, sent after the bytes moved, has per-process before and
    after bytes from the ledger; with all_hosts, the idle worker of a second
    ComfyUI instance is released through that instance's control socket."""
    from comfyenv import script_prelude
    from test_memory import PREAMBLE as MEMORY_PREAMBLE
    monkeypatch.delenv("COMFYUI_PATH", raising=False)  # the scenario below runs on the stub too
    ready, done = tmp_path / "b-ready", tmp_path / "b-done"
    other = script_prelude() + MEMORY_PREAMBLE.format(ledger=str(tmp_path / "ledger"),
                                                      helpers=os.path.join(HERE, "helpers")) + textwrap.dedent(f"""
        c = worker("pack-c")
        c.call("bh_mempack:load", "UNetC", 64 * MiB)
        open({str(ready)!r}, "w").close()
        for _ in range(4000):
            if os.path.exists({str(done)!r}):
                break
            time.sleep(0.05)
        out(dict(c_resident=resident(c), c_pid=c.pid))
        hm.close(); c.close()
    """)
    instance_b = subprocess.Popen([sys.executable, "-c", other], stdout=subprocess.PIPE, text=True,
                                  cwd=os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "comfyui"),
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join([BUILD_PY, HERE])))
    try:
        r = routes_scenario(tmp_path, f"""
            a, b = worker("pack-a"), worker("pack-b")
            a.call("bh_mempack:load", "UNetA", 256 * MiB)
            b.call("bh_mempack:load", "ClipB", 128 * MiB)
            for _ in range(4000):
                if os.path.exists({str(ready)!r}):
                    break
                time.sleep(0.05)
            rss_before = rss(a) + rss(b)
            res = {{}}
            res["local"] = http("POST", "/bulkhead/free", {{}})
            res["held_at_answer"] = [held(a.pid), held(b.pid)]
            res["rss_drop"] = rss_before - rss(a) - rss(b)
            res["worker_view"] = [a.call("bh_mempack:resident"), b.call("bh_mempack:resident")]
            a.call("bh_mempack:load", "VAEA", 32 * MiB)
            res["all"] = http("POST", "/bulkhead/free", {{"all_hosts": True}})
            res["bad"] = http("POST", "/bulkhead/free", {{"all_hosts": "yes"}})
            res["pids"] = dict(a=a.pid, b=b.pid)
            open({str(done)!r}, "w").close()
            out(res)
            finish(a, b)
        """, monkeypatch)
        b_out, _ = instance_b.communicate(timeout=240)
    finally:
        if instance_b.poll() is None:
            instance_b.kill()
            instance_b.wait()
    mark = "@@comfyenv-result@@"
    other_result = json.loads([line for line in b_out.splitlines() if line.startswith(mark)][-1][len(mark):])
    pids = r["pids"]
    status, local = r["local"]
    assert status == 200 and local["all_hosts"] is False
    rows = {row["pack"]: row for row in local["processes"]}
    assert set(rows) == {"pack-a", "pack-b"}
    assert rows["pack-a"] == {"pid": pids["a"], "pack": "pack-a", "host_pid": local["host_pid"],
                              "state": "released", "before_bytes": 256 * MiB, "after_bytes": 0,
                              "freed_bytes": 256 * MiB, "error": None}
    assert rows["pack-b"]["before_bytes"] == 128 * MiB and rows["pack-b"]["after_bytes"] == 0
    assert local["freed_bytes"] == 384 * MiB and local["after_bytes"] == 0
    assert r["held_at_answer"] == [0, 0]            # the answer came after the bytes moved
    assert r["rss_drop"] >= 384 * MiB * 0.9, r      # and they were real
    assert r["worker_view"] == [{"UNetA": 0}, {"ClipB": 0}]

    status, every = r["all"]
    assert status == 200 and every["all_hosts"] is True
    rows = {row["pack"]: row for row in every["processes"]}
    assert rows["pack-a"]["before_bytes"] == 32 * MiB and rows["pack-a"]["after_bytes"] == 0
    c = rows["pack-c"]
    assert c["host_pid"] != every["host_pid"] and c["pid"] == other_result["c_pid"]
    assert c["state"] == "released" and c["before_bytes"] == 64 * MiB and c["after_bytes"] == 0, c
    assert other_result["c_resident"] == 0
    assert r["bad"][0] == 400


@pytest.mark.torch
def test_comfyui_free_stops_idle_workers_for_a_local_client_only(tmp_path, monkeypatch):
    """ComfyUI's "Free model and node cache" (/free free_memory) stops
    idle workers when its client is on this machine; from elsewhere (any
    web client can post it: ComfyUI has no authentication) the workers
    release and go on (exit_idle false)."""
    import asyncio
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    monkeypatch.setenv("BULKHEAD_NVML_LIBRARY", "/nonexistent/libnvml.so")
    ledger, hm = _fake_host(tmp_path)
    routes = comfy_routes.BulkheadRoutes(hm, free_wait_s=0.1, release_timeout_s=1.0)
    asked = []
    routes.held_now = lambda: {}
    routes.free_after_comfyui = lambda before, exit_idle: asked.append(exit_idle) or {"processes": []}

    async def upstream_free(request):      # upstream's handler: its flags, an empty 200
        return web.Response(status=200)

    async def run():
        app = web.Application(middlewares=[_remote_from_header(), routes.free_observer()])
        app.router.add_post("/free", upstream_free)
        async with TestClient(TestServer(app)) as client:
            for remote in (None, "192.0.2.1", "::1"):
                headers = {"X-Test-Remote": remote} if remote else {}
                r = await client.post("/free", json={"free_memory": True}, headers=headers)
                assert r.status == 200 and (await r.json()) == {"bulkhead": {"processes": []}}
    try:
        asyncio.run(run())
    finally:
        ledger.close()
    assert asked == [True, False, True]


def test_comfyui_free_reaches_the_workers(tmp_path, monkeypatch):
    """ComfyUI's own POST /free: upstream's handler sets its flags (the
    prompt worker unloads and resets its cache later, as before); bulkhead's
    observer answers only after this host's workers released, with their
    figures.  An empty request stays upstream's empty 200."""
    r = routes_scenario(tmp_path, """
        import main
        stop = threading.Event()
        pw = threading.Thread(target=main.prompt_worker, args=(srv.prompt_queue, srv, stop), daemon=True)
        pw.start()
        a, b = worker("pack-a"), worker("pack-b")
        a.call("bh_mempack:load", "UNetA", 96 * MiB)
        b.call("bh_mempack:load", "ClipB", 64 * MiB)
        res = {}
        res["nothing"] = http("POST", "/free", {})
        res["held_after_nothing"] = [held(a.pid), held(b.pid)]
        res["free_memory"] = http("POST", "/api/free", {"free_memory": True})
        res["held_at_answer"] = [held(a.pid), held(b.pid)]
        for _ in range(100):            # the prompt worker consumes the flags
            if not srv.prompt_queue.get_flags(reset=False):
                break
            time.sleep(0.05)
        res["flags_left"] = srv.prompt_queue.get_flags(reset=False)
        stop.set(); pw.join()   # its unload ran on its own thread: done before this one loads
        a.call("bh_mempack:load", "UNetA", 96 * MiB)
        res["unload_models"] = http("POST", "/free", {"unload_models": True})
        res["timeline"] = [e["kind"] for e in http("GET", "/bulkhead/status")[1]["timeline"]]
        out(res)
        finish(a, b)
    """, monkeypatch)
    assert r["nothing"] == [200, None]
    assert r["held_after_nothing"] == [96 * MiB, 64 * MiB]
    status, body = r["free_memory"]
    assert status == 200 and set(body) == {"bulkhead"}
    rows = {row["pack"]: row for row in body["bulkhead"]["processes"]}
    assert rows["pack-a"]["before_bytes"] == 96 * MiB and rows["pack-a"]["after_bytes"] == 0
    assert rows["pack-b"]["before_bytes"] == 64 * MiB and rows["pack-b"]["after_bytes"] == 0
    assert body["bulkhead"]["freed_bytes"] == 160 * MiB
    assert r["held_at_answer"] == [0, 0]
    assert r["flags_left"] == {}
    status, body = r["unload_models"]
    rows = {row["pack"]: row for row in body["bulkhead"]["processes"]}
    assert status == 200 and rows["pack-a"]["freed_bytes"] == 96 * MiB
    assert r["timeline"].count("free") == 2


@pytest.mark.torch
def test_prompt_end_soft_releases_and_reconciles_on_the_execution_thread(tmp_path, monkeypatch):
    """The prompt boundary through upstream's cache-provider lifecycle: at
    the end of each prompt every idle worker that ran anything since its
    last one gets its soft release (models stay loaded) and the stand-ins
    are reconciled, on the execution thread.  A worker that ran nothing
    since is not asked again."""
    r = routes_scenario(tmp_path, """
        import main
        a = worker("pack-a")
        b = worker("pack-b")
        b.call("os:getpid")
        seen = []
        released = []
        for w in (a, b):
            def counted(*args, _w=w, _release=w.release, **kw):
                released.append((len(seen), _w.name))
                return _release(*args, **kw)
            w.release = counted
        real_end = routes.prompt_end
        def prompt_end(prompt_id=None):
            seen.append((prompt_id, threading.current_thread().name,
                         sum(1 for lm in mm.current_loaded_models if lm.model in hm.standins())))
            return real_end(prompt_id)
        routes.prompt_end = prompt_end

        class LoadInWorker:
            FUNCTION = "run"
            def run(self, name, mib):
                return (a.call("bh_mempack:load", name, mib * MiB),)
        nodes.NODE_CLASS_MAPPINGS["LoadInWorker"] = LoadInWorker

        stop = threading.Event()
        pw = threading.Thread(target=main.prompt_worker, args=(srv.prompt_queue, srv, stop),
                              name="prompt-worker", daemon=True)
        pw.start()
        res = {}
        res["queued"] = http("POST", "/prompt", {"prompt_id": "p1", "prompt": {
            "1": {"class_type": "LoadInWorker", "inputs": {"name": "UNetA", "mib": 48}}}})
        for _ in range(400):
            if "p1" in srv.prompt_queue.history and seen:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        res["seen"] = seen
        res["listed_after"] = sum(1 for lm in mm.current_loaded_models if lm.model in hm.standins())
        res["resident_after"] = resident(a)
        res["state_after"] = hm.ledger.read(a.pid)["run"]
        res["hook"] = routes.prompt_hook
        http("POST", "/prompt", {"prompt_id": "p2", "prompt": {
            "1": {"class_type": "LoadInWorker", "inputs": {"name": "UNetA2", "mib": 8}}}})
        for _ in range(400):
            if len(seen) == 2:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        res["released"] = released
        stop.set(); pw.join()
        out(res)
        finish(a, b)
    """, monkeypatch)
    assert r["queued"][0] == 200 and r["hook"] == "comfy_execution.cache_provider"
    # the first prompt's end asks both (b ran before it), the second's only a
    assert sorted(r["released"]) == [[1, "pack-a"], [1, "pack-b"], [2, "pack-a"]], r["released"]
    r["seen"] = r["seen"][:1]
    prompt_id, thread, listed_before = r["seen"][0]
    assert prompt_id == "p1" and thread == "prompt-worker"
    # the model the node loaded in the worker is listed in ComfyUI's ledger
    # once the boundary reconciled, and it stayed loaded (a soft release)
    assert listed_before == 0 and r["listed_after"] == 1
    assert r["resident_after"] == 48 * MiB and r["state_after"] == "idle"


@pytest.mark.torch
def test_release_route_honours_the_packs_release_timeout(tmp_path, monkeypatch):
    """POST /bulkhead/release runs under the worker's own release timeout (a
    pack's release_timeout_s), not the route's default: a worker stopped in
    its release is found hung and killed after 1.5 s, where the route's own
    deadline is 120 s."""
    r = routes_scenario(tmp_path, """
        w = hm.attach(bulkhead.Worker(sys.executable, name="pack-slow", release_timeout_s=1.5,
                                      env={"PYTHONPATH": WORKER_PATH}))
        w.call("bh_mempack:load", "UNetS", 32 * MiB)
        w.call("bh_killpoints:arm", "release", "SIGSTOP")
        t = time.monotonic()
        res = {"release": http("POST", "/bulkhead/release", {"pack": "pack-slow"})}
        res["elapsed"] = time.monotonic() - t
        out(res)
        finish(w)
    """, monkeypatch, options={"release_timeout_s": 120.0})
    status, body = r["release"]
    assert status == 200 and "error" in body and body["after_bytes"] == 0, body
    assert r["elapsed"] < 60, r
