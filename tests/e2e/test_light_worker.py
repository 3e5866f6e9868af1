"""#27 from the user's side: a worker imports what its pack needs, and an
idle one costs nothing.  A pack in its own bulkhead-built environment (a
comfy-env.toml declaring numpy only, as a published pack does) whose nodes
take and return no tensors -- strings, numbers, a numpy array one of them
makes -- runs a prompt over HTTP: after its nodes the worker costs at most
LIGHT_MIB (its PSS) and has neither torch nor ComfyUI loaded (asked of
the worker, and its mappings read from /proc), though a zygote forked it.  Then after its idle exit,
and after ComfyUI's "Free model and node cache" (/free with free_memory),
the worker is gone and has left nothing behind in the host: no process,
no fd, and no mapping of its shared-memory blocks once ComfyUI's cache
has let go of the output they hold (an idle exit leaves that cache as it
is, as it would be in-process; /free drops it).  The figure that makes
this worth having, measured: bench/many_packs.py (docs/performance.md)."""

import os
import re
import textwrap
import time

import psutil

# PSS, not RSS: RSS counts every page of the shared libraries the kernel
# maps around each fault, and how many it maps depends on what the page
# cache holds (a venv installed a minute ago: numpy's import 5 MiB more
# resident, the same process); PSS charges each shared page to its sharers.
LIGHT_MIB = 40
HEAVY = ("torch", "comfy", "comfy.model_management")

NODES = '''
import os
import sys

import numpy as np


class LightText:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "ab"}), "times": ("INT", {"default": 2})}}
    RETURN_TYPES = ("STRING", "INT", "FLOAT")
    FUNCTION = "run"
    CATEGORY = "e2e/light"

    def run(self, text, times):
        return (text * times, len(text) * times, times / 4)


class LightArray:
    """A numpy array past the arena size (1 MiB): it crosses in a block
    of the worker's, which the host maps."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 512})}}
    RETURN_TYPES = ("LIGHT_ARRAY",)
    FUNCTION = "run"
    CATEGORY = "e2e/light"

    def run(self, n):
        return (np.arange(n * n, dtype=np.float32).reshape(n, n),)


class LightReport:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"array": ("LIGHT_ARRAY",), "text": ("STRING",), "count": ("INT",),
                             "ratio": ("FLOAT",)}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/light"

    def run(self, array, text, count, ratio):
        return {"ui": {"last": [float(array[-1, -1])], "shape": list(array.shape), "text": [text],
                       "count": [count], "ratio": [ratio], "pid": [os.getpid()],
                       "loaded": sorted(m for m in %r if m in sys.modules)}}


NODE_CLASS_MAPPINGS = {"LightText": LightText, "LightArray": LightArray, "LightReport": LightReport}
''' % (HEAVY,)


def _prompt(n):
    return {"1": {"class_type": "LightText", "inputs": {"text": "ab", "times": 3}},
            "2": {"class_type": "LightArray", "inputs": {"n": n}},
            "3": {"class_type": "LightReport", "inputs": {"array": ["2", 0], "text": ["1", 0], "count": ["1", 1],
                                                            "ratio": ["1", 2]}}}


def _pack(root, idle_exit_s):
    d = root / "light_pack"
    d.mkdir()
    (d / "__init__.py").write_text("import bulkhead\n"
                                   "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)\n")
    (d / "nodes.py").write_text(NODES)
    (d / "comfy-env.toml").write_text(textwrap.dedent(f'''
        [pypi-dependencies]
        numpy = "*"

        [bulkhead]
        idle_exit_s = {idle_exit_s}
    '''))
    return str(d)


def _worker_pid(srv):
    status, doc = srv.http("GET", "/bulkhead/status")
    assert status == 200, doc
    [row] = [p for p in doc["packs"] if p["name"] == "light_pack"]
    assert row["state"] == "isolated", (row, srv.log())
    return row["pid"]


def _kib(pid, field, where="status"):
    with open(f"/proc/{pid}/{where}") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _mapped_inodes(pid):
    """The inodes of the shared-memory blocks (memfds) a process maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {int(line.split()[4]) for line in f if "memfd:bulkhead" in line}


def _fds(pid, but=()):
    """fd -> what it refers to, of a process, leaving out those of the
    inodes in `but`."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.stat(f"/proc/{pid}/fd/{fd}").st_ino not in but:
                out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


def _wait(what, cond, srv, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s} s:\n{srv.log()[-4000:]}")


def _run_light_prompt(srv, n):
    """Runs the prompt, its array n x n; checks what the worker loaded and
    holds; returns its pid and the inodes of the blocks it maps."""
    entry = srv.wait_history(srv.queue(_prompt(n)), timeout_s=60)
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{srv.log()[-3000:]}"
    out = entry["outputs"]["3"]
    assert out["text"] == ["ababab"] and out["count"] == [6] and out["ratio"] == [0.75], out
    assert out["shape"] == [n, n] and out["last"] == [n * n - 1.0], out
    pid = out["pid"][0]
    assert pid != srv.proc.pid and _worker_pid(srv) == pid
    assert out["loaded"] == [], f"the worker imported {out['loaded']} for nodes that need none of it"
    with open(f"/proc/{pid}/maps") as f:
        libs = {line.split()[-1] for line in f if ".so" in line}
    assert not [lib for lib in libs if "libtorch" in lib or "/torch/" in lib], sorted(libs)
    pss_mib, rss_mib = _kib(pid, "Pss", "smaps_rollup") / 1024, _kib(pid, "VmRSS") / 1024
    assert pss_mib <= LIGHT_MIB, f"the worker is {pss_mib:.1f} MiB (PSS; {rss_mib:.1f} MiB resident) after its nodes"
    blocks = _mapped_inodes(pid)
    assert blocks, "the 1 MiB array crossed in no block of the worker's"
    return pid, blocks


def _assert_nothing_left(srv, pid, fds_before, cached=(), blocks=()):
    """The worker is gone; the host has no child process, maps none of
    `blocks`, and has no more fds than before the worker started, leaving
    out those of `cached`: the worker's blocks that hold an output
    ComfyUI's cache still has (mapped, their fds kept for a forward to
    another worker; the output would stay in-process too, until the cache
    lets go)."""
    host = srv.proc.pid
    _wait(f"worker {pid} gone", lambda: not psutil.pid_exists(pid) and _worker_pid(srv) is None, srv)
    assert psutil.Process(host).children(recursive=True) == []
    assert not set(blocks) & _mapped_inodes(host), "the host still maps the gone worker's blocks"
    _wait(f"the host's fds back to {fds_before} (now {_fds(host, cached)})",
          lambda: len(_fds(host, cached)) <= len(fds_before), srv, 10)


def test_a_no_tensor_worker_stays_light_and_leaves_nothing_when_idle(comfyui, tmp_path):
    srv = comfyui(packs=(), pack_dirs=[_pack(tmp_path, idle_exit_s=3)])
    log = srv.log_since_start()
    assert "pack 'light_pack': environment built" in log, log
    assert "NOT isolated" not in log, log
    host = srv.proc.pid
    # the worker that described the nodes at this first start: ComfyUI's
    # "Free model and node cache" stops it; what the host has then is the
    # figure with no worker
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200, body
    _wait("the describing worker gone", lambda: _worker_pid(srv) is None, srv)
    assert psutil.Process(host).children(recursive=True) == []
    fds_before = _fds(host)

    # its nodes, then its idle exit (3 s): gone, nothing left -- the
    # zygote that forked it too (host/zygote.py: a child of the host, with
    # no torch for a pack whose nodes pass none, so neither has the worker)
    pid, blocks = _run_light_prompt(srv, 512)
    zygote = psutil.Process(pid).parent()
    assert zygote.pid != host and zygote.parent().pid == host, (zygote, srv.log()[-3000:])
    _wait(f"the idle exit of worker {pid}", lambda: f"its worker (pid {pid}) exited after" in srv.log(), srv)
    assert blocks <= _mapped_inodes(host), "the array ComfyUI's cache holds is not mapped"
    _assert_nothing_left(srv, pid, fds_before, cached=blocks)

    # a new input: its nodes run in a worker started again, then /free with
    # free_memory stops it at once, saying so, and ComfyUI drops its cache
    pid2, blocks2 = _run_light_prompt(srv, 600)
    assert pid2 != pid
    status, body = srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
    assert status == 200, body
    [row] = [r for r in body["bulkhead"]["processes"] if r["pid"] == pid2]
    assert row["state"] == "exited", body["bulkhead"]
    # ComfyUI dropped its cache: no block of either worker is mapped
    _assert_nothing_left(srv, pid2, fds_before, blocks=blocks | blocks2)
