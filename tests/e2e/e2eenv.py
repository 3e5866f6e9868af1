"""What the e2e fixtures are made of (conftest.py): a ComfyUI server process
with bulkhead and isolated packs in its custom_nodes/, driven only over
HTTP and the websocket.

The ComfyUI is tests/comfyui (its main.py is a server), or the checkout
named by COMFYUI_PATH.  Either way a fresh base directory is assembled in
tmp: every top-level entry of the ComfyUI tree symlinked into it except
custom_nodes/, models/, input/, output/, temp/ and user/, and the server
started with --base-directory pointing at it, so nothing is written into
the tree itself.  bulkhead goes into custom_nodes/ through ONE function,
`install_bulkhead`; the packs are copied in.  The server runs in its own
session; teardown sends SIGINT (upstream's KeyboardInterrupt stop), then
SIGKILL after a grace period, and checks that no process of that session
(its workers) is left and /dev/shm is as it was.
"""

import asyncio
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import textwrap
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PACKS = os.path.join(HERE, "packs")
EXAMPLE_PACKS = os.path.join(REPO, "examples", "packs")
STUB_ROOT = os.path.join(REPO, "tests", "comfyui")
SHIMS = os.path.join(REPO, "tests", "py", "shims")
HELPERS = os.path.join(REPO, "tests", "py", "helpers")
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(REPO, "build", "rel")))
BUILD_PY = os.path.join(BUILD, "python")
CLI = os.path.join(BUILD, "tools", "bulkhead")
START_TIMEOUT_S = 90
BUILD_TIMEOUT_S = 600      # a pack's environment built in the background (uv, local sources)

if os.path.join(REPO, "tests", "py") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "tests", "py"))
from localsources import BACKEND, HOST_MM, write  # noqa: E402  (tests/py's local package sources)

# What a base directory gets of its own rather than the tree's.
OWN = {"custom_nodes", "models", "input", "output", "temp", "user", "__pycache__"}


# A test pack's __init__.py that serves its nodes.py from a worker under
# the host's own interpreter, with the host's memory attached (what
# bulkhead.comfy_pack does, minus building an environment): for the tests
# whose subject is what crosses between processes (blocks, references),
# not the pack's environment.
HOST_INTERPRETER_INIT = '''
import os
import sys

from bulkhead.host import nodes, pack

_hm = pack.host_memory()
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = nodes.load_pack(
    os.path.dirname(os.path.abspath(__file__)), sys.executable,
    options={"cache": False}, memory=_hm)
'''


# A pack's __init__.py as a user writes it (README): one call.
PACK_INIT = '''
import bulkhead
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)
'''

_OUTPUT_NODE = '''{imports}


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {inputs!r}}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = {category!r}

    def run(self, {args}):
{body}


NODE_CLASS_MAPPINGS = {{{cls!r}: {cls}}}
'''


def output_node(cls, inputs, run, imports="import os", category="e2e", display=None):
    """The nodes.py of a pack with one node class, ``cls``: an output node
    (no outputs) whose required inputs are ``inputs`` (name -> ComfyUI's
    input spec) and whose run method, taking them by name, has the body
    ``run`` (source, ending with its return); ``imports`` are the
    module's, ``display`` the display name where the pack gives one."""
    body = textwrap.indent(textwrap.dedent(run).strip("\n"), " " * 8)
    text = _OUTPUT_NODE.format(imports=imports, cls=cls, inputs=inputs, category=category,
                               args=", ".join(inputs), body=body)
    if display is not None:
        text += f"NODE_DISPLAY_NAME_MAPPINGS = {{{cls!r}: {display!r}}}\n"
    return text


def write_pack(path, nodes, config, init=PACK_INIT):
    """A pack at ``path`` as a user lays one out: __init__.py (``init``),
    nodes.py (``nodes``) and comfy-env.toml (``config``); returns the path
    as a str."""
    path = str(path)
    os.makedirs(path, exist_ok=True)
    for name, text in (("__init__.py", init), ("nodes.py", nodes), ("comfy-env.toml", config)):
        with open(os.path.join(path, name), "w") as f:
            f.write(textwrap.dedent(text).lstrip("\n"))
    return path


def host_config(rest=""):
    """A comfy-env.toml naming ComfyUI's own Python version (this test's),
    then ``rest``."""
    return f'python = "{HOST_MM}"\n' + rest


def env_config(requirement):
    """host_config with one PyPI requirement line (``name = "spec"``)."""
    return host_config(f"[pypi-dependencies]\n{requirement}\n")


# BACKEND's build_wheel, first waiting for the gate file (at most 300 s):
# a build the test holds until it creates that file (no timing).
_BUILD_WHEEL = "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
GATED_BACKEND = BACKEND.replace(_BUILD_WHEEL, '''
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import time
    deadline = time.monotonic() + 300
    while not os.path.exists(GATE) and time.monotonic() < deadline:
        time.sleep(0.05)
''')
assert GATED_BACKEND != BACKEND


def gated_source(root, version, gate, fail=False):
    """bhgate <version> as a source tree whose build waits for ``gate``
    (then fails, where ``fail``)."""
    d = os.path.join(str(root), f"bhgate-{version}")
    write(os.path.join(d, "NAME"), f"bhgate {version}\n")
    backend = GATED_BACKEND.replace("        time.sleep(0.05)\n", "        time.sleep(0.05)\n" + (
        "    raise RuntimeError('bhgate: this build fails on purpose')\n" if fail else ""), 1)
    write(os.path.join(d, "bhbackend.py"), f"GATE = {str(gate)!r}\n" + backend)
    write(os.path.join(d, "pyproject.toml"), '''
        [build-system]
        requires = []
        build-backend = "bhbackend"
        backend-path = ["."]
    ''')
    write(os.path.join(d, "bhgate", "__init__.py"), f"VALUE = 'bhgate {version}'\n")
    return d


def gated_pack(tmp_path, name, requirement, cls="E2EGateWhere"):
    """A pack under tmp_path/repos whose one node, ``cls`` (input n),
    answers its pid, sys.prefix and bhgate.VALUE: where it runs and which
    bhgate its environment has; ``requirement`` its comfy-env.toml's."""
    nodes = output_node(cls, {"n": ("INT", {"default": 0})}, '''
        import bhgate
        return {"ui": {"pid": [os.getpid()], "prefix": [sys.prefix], "value": [bhgate.VALUE]}}
    ''', imports="import os, sys", category="e2e/builds")
    return pathlib.Path(write_pack(tmp_path / "repos" / name, nodes, env_config(requirement)))


# pip finds nothing on an index: a build gets only the local sources a test names.
NO_INDEX = {"BULKHEAD_PIP_ARGS": "--no-index"}


def pack_state(srv, name):
    """The pack's row of the server's GET /bulkhead/status."""
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200, doc
    return next(p for p in doc["packs"] if p["name"] == name)


def run_gated(srv, n, cls="E2EGateWhere"):
    """Runs a prompt of one gated_pack node, ``cls`` with input n, to its
    success: (the pid it ran in, its bhgate.VALUE, its sys.prefix)."""
    entry = srv.wait_history(srv.queue({"1": {"class_type": cls, "inputs": {"n": n}}}), timeout_s=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], srv.log())
    out = entry["outputs"]["1"]
    return out["pid"][0], out["value"][0], out["prefix"][0]


def built_gated_pack(comfyui, tmp_path, name):
    """gated_pack ``name``, its requirement bhgate 1.0 from a source tree
    under tmp_path/src whose gate is open, built and served: (the server,
    the gate file, the source tree)."""
    gate = tmp_path / "gate"
    gate.write_text("open")
    source = gated_source(tmp_path / "src", "1.0", gate)
    pack = gated_pack(tmp_path, name, f'bhgate = {{ path = "{source}" }}')
    return comfyui(packs=(), pack_dirs=[str(pack)], env=NO_INDEX), gate, source


def wait_pack_state(srv, name, ok, timeout_s=300):
    """Polls pack ``name``'s row (pack_state) until ok(row); returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = pack_state(srv, name)
        if ok(state):
            return state
        assert time.monotonic() < deadline, (state, srv.log())
        time.sleep(0.2)


def make_foreign(srv, name):
    """Stops srv and leaves pack ``name``'s environment as a bulkhead
    update that changed its protocol does, "foreign" (its stamp's protocol
    -1): the next start rebuilds it in the background.  Returns the
    environment's path."""
    env = pack_state(srv, name)["env"]
    srv.stop()
    stamp = os.path.join(env, "bulkhead-stamp.json")
    with open(stamp) as f:
        doc = json.load(f)
    doc["protocol"] = -1
    with open(stamp, "w") as f:
        json.dump(doc, f)
    return env


def unbuilt_server(comfyui, pack, **kw):
    """The server with the pack at ``pack`` and no build at start
    (BULKHEAD_BUILD_AT_START=0): the pack is not isolated, nothing
    describes its nodes.  kw: more of comfyui's arguments."""
    srv = comfyui(packs=(), pack_dirs=[str(pack)], env={"BULKHEAD_BUILD_AT_START": "0"}, **kw)
    assert "metadata " not in srv.log_since_start(), srv.log()
    return srv


def described_line(srv, name):
    """The line srv's last start logged for pack ``name``'s one node: it
    ends "metadata cached" (read from the node metadata cache) or says
    " metadata from worker pid N" (described in a worker)."""
    [line] = [l for l in srv.log_since_start().splitlines() if f"bulkhead: pack {name!r}: 1 node, " in l]
    return line


def start_from_cache(srv, name, node):
    """Starts the stopped srv after an install described pack ``name``'s
    node ``node``: the start registers it from the node metadata cache and
    starts no worker to describe it.  Returns (the start's line for the
    pack, the node's /object_info entry)."""
    srv.start()
    line = described_line(srv, name)
    assert line.endswith("metadata cached"), line
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and node in info, srv.log()
    row = pack_state(srv, name)
    assert row["state"] == "isolated" and not row.get("pid"), row     # no worker runs yet
    return line, info[node]


def start_describing(srv, name, node):
    """Stops srv and starts it again with the node metadata cache emptied:
    the start describes pack ``name``'s node ``node`` in a worker.
    Returns the node's /object_info entry."""
    srv.stop()
    shutil.rmtree(os.path.join(srv.env["BULKHEAD_HOME"], "cache", "nodes"))
    srv.start()
    line = described_line(srv, name)
    assert " metadata from worker pid " in line, line
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and node in info, srv.log()
    return info[node]


def worker_pids(srv):
    """The server's workers in GET /bulkhead/status, by pid."""
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200, doc
    return {p["pid"]: p for p in doc["processes"] if p.get("role") == "worker" and p.get("host_pid") ==
            srv.proc.pid}


def rss(pid):
    """A process's resident bytes (/proc/<pid>/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def comfy_root():
    return os.path.abspath(os.environ.get("COMFYUI_PATH") or STUB_ROOT)


def using_real_checkout():
    return comfy_root() != os.path.abspath(STUB_ROOT)


def install_bulkhead(custom_nodes_dir):
    """Puts bulkhead into a ComfyUI's custom_nodes/ and returns the
    PYTHONPATH entries the server needs for it.  For now: the built package
    stays in the build tree (on the server's PYTHONPATH) and
    ComfyUI's custom_nodes/bulkhead/__init__.py is a loader importing it once and
    re-exporting what ComfyUI reads, beside the repository's
    prestartup_script.py and a link python/ -> the build
    tree's python/, as a clone has the package at python/bulkhead/ (which
    tells bulkhead its custom node is there: packimport.custom_node_missing;
    delete the folder and bulkhead is off).  (The Manager flow -- the
    repository root's install.py -- replaces this one function.)"""
    d = os.path.join(custom_nodes_dir, "bulkhead")
    os.makedirs(d, exist_ok=True)
    os.symlink(BUILD_PY, os.path.join(d, "python"))
    shutil.copy(os.path.join(REPO, "prestartup_script.py"), d)  # as a clone has it
    with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write("import os, bulkhead\n"
                "bulkhead._comfyui_server()  # the prestartup script imported it before the server existed\n"
                "WEB_DIRECTORY = os.path.join(os.path.dirname(bulkhead.__file__), bulkhead.WEB_DIRECTORY)\n"
                "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.NODE_CLASS_MAPPINGS, "
                "bulkhead.NODE_DISPLAY_NAME_MAPPINGS\n")
    return [BUILD_PY]


def clone_into(custom_nodes_dir):
    """What `git clone` of this repository into custom_nodes/ gives (the
    tracked files and the untracked ones git does not ignore, as they are
    in the working tree: a run with uncommitted edits tests those edits);
    returns the clone's directory."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    d = os.path.join(custom_nodes_dir, "bulkhead")
    for rel in filter(None, files):
        src = os.path.join(REPO, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(d, rel))
    return d


def run_manager_flow(clone, python, log):
    """ComfyUI-Manager's flow in a clone: `pip install -r requirements.txt`,
    then `python install.py`, with ComfyUI's own Python; output to `log`
    (a file object).  Raises AssertionError with the output on failure."""
    for argv in ([python, "-m", "pip", "install", "-q", "-r", "requirements.txt"], [python, "install.py"]):
        r = subprocess.run(argv, cwd=clone, stdout=log, stderr=subprocess.STDOUT, timeout=900)
        if r.returncode != 0:
            log.flush()
            with open(log.name, errors="replace") as f:
                raise AssertionError(f"{' '.join(argv[1:])} failed ({r.returncode}):\n{f.read()[-6000:]}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_members(sid):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(pid))
    return out


def _shm():
    try:
        return sorted(os.listdir("/dev/shm"))
    except OSError:
        return []


_torchvision_loads = None


def _needs_torchvision_shim():
    """A real checkout's main.py imports torchvision; PyPI's cannot load
    beside the CPU torch here, so the server gets tests/py/shims first on
    its path (as tests/py/comfyenv.py does) when the real one fails."""
    global _torchvision_loads
    if _torchvision_loads is None:
        _torchvision_loads = subprocess.run([sys.executable, "-c", "import torchvision"],
                                            capture_output=True).returncode == 0
    return not _torchvision_loads


class Server:
    """One ComfyUI server process on a free port."""

    def __init__(self, base, env, ledger, python=None):
        self.base = base
        self.env = env
        self.ledger = ledger
        self.python = python or sys.executable
        self.port = None
        self.proc = None
        self.log_path = os.path.join(base, "server.log")
        # start() returns once no pack is "building" (environments built in
        # the background: host/building.py), unless this is False.
        self.wait_for_builds = True

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        self.port = _free_port()
        argv = [self.python, os.path.join(self.base, "main.py"), "--cpu", "--listen", "127.0.0.1",
                "--port", str(self.port), "--base-directory", self.base]
        self._log = open(self.log_path, "ab")
        self.started_at = self._log.tell()     # where this start's lines begin (log_since_start)
        self.proc = subprocess.Popen(argv, cwd=self.base, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.http("GET", "/prompt", timeout=2)[0] == 200:
                    if self.wait_for_builds:
                        self.wait_built()
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the server did not listen within {START_TIMEOUT_S} s:\n{self.log()}")

    def building(self):
        """The packs /bulkhead/status lists as "building" (none where
        bulkhead's routes are not on the server)."""
        status, doc = self.http("GET", "/bulkhead/status")
        if status != 200 or not isinstance(doc, dict):
            return []
        return [p for p in doc.get("packs", []) if p["state"] == "building"]

    def wait_built(self, timeout_s=BUILD_TIMEOUT_S):
        """Waits until no pack's environment builds in the background."""
        deadline = time.monotonic() + timeout_s
        while self.building():
            if time.monotonic() > deadline:
                raise AssertionError(f"packs still building after {timeout_s} s: {self.building()}\n{self.log()}")
            time.sleep(0.2)
        return self

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-8000:]

    def log_since_start(self):
        """Everything the server wrote since its last start (a restarted
        server appends to the same log)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.started_at)
            return f.read().decode(errors="replace")

    def http(self, method, path, body=None, timeout=60):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, (json.loads(text) if text else None)
        except ValueError:
            return status, text

    def queue(self, prompt, client_id=None):
        body = {"prompt": prompt}
        if client_id:
            body["client_id"] = client_id
        status, answer = self.http("POST", "/prompt", body)
        assert status == 200, (answer, self.log())
        return answer["prompt_id"]

    def wait_history(self, prompt_id, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, h = self.http("GET", "/history/" + prompt_id)
            if h and prompt_id in h:
                return h[prompt_id]
            time.sleep(0.05)
        raise AssertionError(f"prompt {prompt_id} did not finish in {timeout_s} s:\n{self.log()}")

    def run_ws(self, coro_fn, timeout_s=60):
        """Runs coro_fn(ws, sid) with a websocket connected as a client;
        returns its result."""
        import aiohttp

        async def main():
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(self.url + "/ws?clientId=e2e-client") as ws:
                    return await asyncio.wait_for(coro_fn(ws, "e2e-client"), timeout_s)
        return asyncio.run(main())

    def stop(self):
        if self.proc is None:
            return
        sid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 10
        while _session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _session_members(sid)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        self.proc = None
        assert not left, f"processes left behind by the server: {left}\n{self.log()}"


def assemble(base, packs=(), example_packs=(), clone=None, pack_dirs=()):
    """A ComfyUI base directory at `base` with bulkhead and `packs` (names
    under tests/e2e/packs; pack_dirs: more, by path) in custom_nodes/;
    returns the PYTHONPATH entries the server needs.  clone: a
    Manager-installed clone of bulkhead to copy in (its package is
    installed in the server's Python: no PYTHONPATH), instead of
    install_bulkhead's build-tree loader."""
    root = comfy_root()
    os.makedirs(base)
    for entry in os.listdir(root):
        if entry not in OWN:
            os.symlink(os.path.join(root, entry), os.path.join(base, entry))
    custom = os.path.join(base, "custom_nodes")
    os.makedirs(custom)
    for d in ("models", "input", "output", "user"):
        os.makedirs(os.path.join(base, d))
    if clone is not None:
        shutil.copytree(clone, os.path.join(custom, "bulkhead"), symlinks=True)
        path = []
    else:
        path = install_bulkhead(custom)
    for name in packs:
        shutil.copytree(os.path.join(PACKS, name), os.path.join(custom, name))
    for name in example_packs:
        shutil.copytree(os.path.join(EXAMPLE_PACKS, name), os.path.join(custom, name))
    for d in pack_dirs:
        shutil.copytree(d, os.path.join(custom, os.path.basename(d)))
    if using_real_checkout() and _needs_torchvision_shim():
        path.insert(0, SHIMS)
    return path


