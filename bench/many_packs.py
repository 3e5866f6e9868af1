"""What N isolated packs cost in a ComfyUI-shaped server, each figure beside
its limit measured in the same run (issue #27).

    python bench/many_packs.py --out build/bench/many_packs.json [--counts 1,5,20] [--rounds 3]

N trivial packs are generated into a temporary directory, each its own
pack with its own comfy-env.toml declaring numpy only (as a published pack
does; bulkhead builds one environment per pack at the first start, with
uv where it is on PATH) and three nodes: an IMAGE shift (``image +
shift``: the pack never imports torch, the tensor that arrives does), a
node that holds 50 MiB of numpy and passes its IMAGE on, and a string
node.  The server is tests/comfyui's main.py (or COMFYUI_PATH's) with
bulkhead and a host pack of two in-process nodes: a 3 MiB IMAGE
(1 x 512 x 512 x 3 float32) and a sink.  The prompt is

    image -> [shift_k -> hold_k] x N -> sink

Rows, per N (medians over --rounds; set-ups alternate within a round):

  cold_first_prompt_ms   the prompt, queued on a fresh start (metadata
                         cached, no worker running): every worker starts
                         behind prewarm, bounded by the CPUs
  single_cold_max_ms     limit: the same server, every worker stopped
                         (POST /free), one pack's prompt (image -> shift_k
                         -> hold_k -> sink) cold, for a few k; the slowest
  cold_ratio             cold_first_prompt_ms / single_cold_max_ms   (#27: <= 1.5)
  first_prompt_in_process_ms
                         control: the same packs in-process, their first
                         prompt on a fresh start.  The packs' own first work
                         (each hold's 50 MiB, touched for the first time)
                         runs one node after another in either set-up; on a
                         small VM it alone can exceed 1.5 x one isolated
                         pack's cold start, so cold_ratio's limit bounds that
                         work as much as bulkhead
  cold_over_in_process    cold_first_prompt_ms / first_prompt_in_process_ms:
                         what isolation adds to a cold prompt, the packs'
                         own first work on both sides
  cold_workers_ready_ratio
                         the workers' side of it: when the last of the N
                         workers was ready (each logs 'started ahead of its
                         first node', ms from the queue) over the same for
                         the single packs' (the slowest)   (#27: <= 1.5)
  cold_again_ratio       the N packs' prompt cold again in that server (its
                         workers stopped, the host warm, as for the single
                         packs) / single_cold_max_ms
  warm_per_crossing_ms   (warm isolated prompt - the same prompt with the
                         same packs in-process) / 2N: each isolated node
                         call takes the 3 MiB IMAGE in and gives one back
                         (a warm prompt: a new image value, every node runs;
                         ComfyUI's execution_start to execution_success; the
                         in-process server runs beside the isolated one, a
                         prompt on each in turn: the median of the
                         WARM_PAIRS (21) paired differences)
  copy_3m_ms             limit: a numpy copy of 3 MiB into a touched
                         array, its source out of the CPU's caches (one
                         thread, as bulkhead's copy into a block), in this
                         process, each round; torch's copy_ beside it
  worker_rss_mib         each worker's VmRSS after its nodes (torch
                         arrived with the IMAGE; 50 MiB held)
  text_worker_rss_mib    the worker of a pack whose one node takes and
                         returns text (bench_text_only, numpy imported),
                         after that node (#27: <= 40); and its PSS
  tensor_pack_text_worker_rss_mib
                         pack 0's worker after only its string node: its
                         pack passes IMAGEs, so its zygote has torch, whose
                         pages it maps shared (its PSS beside)
  after_free_mib         the host's RSS plus every worker's after POST
                         /free with free_memory (its workers exit)
  n0_host_mib            limit: the server with no pack, after the same
                         image -> sink prompt and /free

And where a cold start's time goes, each part run alone in the N-th
pack's environment (spawn and interpreter, the environment's site, bulkhead's
worker modules, numpy, torch), its CPU seconds, and what one fork of a
started interpreter that has them all costs instead.

The exit status is 0 whether the targets are met or not (a report);
nonzero only when something failed to run.
"""

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from _server import server_env, start  # noqa: E402
from e2eenv import BUILD_PY, assemble  # noqa: E402

IMAGE_SHAPE = (1, 512, 512, 3)          # float32: 3 MiB
HOLD_MIB = 50
# Warm prompts per set-up and round, each isolated one paired with the
# in-process twin's next: the machine's noise moves one pair by
# milliseconds a crossing, so the median needs a few.
WARM_PAIRS = 21
TARGETS = {"cold_ratio": 1.5, "cold_workers_ready_ratio": 1.5, "warm_per_crossing_ms": 2.0,
           "text_worker_rss_mib": 40.0}

PACK_NODES = '''
import numpy as np
{torch_import}
_held = []


class BenchShift{k}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"image": ("IMAGE",), "shift": ("FLOAT", {{"default": 0.01}})}}}}
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bench"

    def run(self, image, shift):
        return (image + shift,)


class BenchHold{k}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"image": ("IMAGE",)}}}}
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bench"

    def run(self, image):
        if not _held:
            _held.append(np.ones(({hold} << 20) // 8))
        return (image,)


class BenchText{k}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"text": ("STRING", {{"default": "ab"}})}}}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bench"

    def run(self, text):
        return {{"ui": {{"text": [text * 2]}}, "result": (text * 2,)}}


NODE_CLASS_MAPPINGS = {{"BenchShift{k}": BenchShift{k}, "BenchHold{k}": BenchHold{k}, "BenchText{k}": BenchText{k}}}
'''

ISOLATED_INIT = ("import bulkhead\n"
                 "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)\n")
IN_PROCESS_INIT = "from .nodes import NODE_CLASS_MAPPINGS\nNODE_DISPLAY_NAME_MAPPINGS = {}\n"
PACK_ENV = '[pypi-dependencies]\nnumpy = "*"\n'

# A pack whose nodes take and return no tensor (#27's light worker): its
# worker is forked from a zygote without torch.
TEXT_PACK_NODES = '''
import numpy as np


class BenchTextOnly:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "ab"})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bench"

    def run(self, text):
        return {"ui": {"text": [text * int(np.int64(2))]}, "result": (text * 2,)}


NODE_CLASS_MAPPINGS = {"BenchTextOnly": BenchTextOnly}
'''
TEXT_PACK = "bench_text_only"

HOST_NODES = '''
import torch


class BenchImage:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 0.5})}}
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"
    CATEGORY = "bench"

    def run(self, value):
        return (torch.full(%r, value, dtype=torch.float32),)


class BenchSink:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",)}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bench"

    def run(self, image):
        return {"ui": {"mean": [float(image.mean())]}}


NODE_CLASS_MAPPINGS = {"BenchImage": BenchImage, "BenchSink": BenchSink}
NODE_DISPLAY_NAME_MAPPINGS = {}
''' % (IMAGE_SHAPE,)


def pack_name(k):
    return "bench_pack_%02d" % k


def write_packs(root, count, torch_at_import=False):
    """count isolated packs under root/isolated, the same nodes as
    in-process packs under root/in_process, and the host pack; returns
    the three directories' lists.  torch_at_import: the packs import
    torch at their top (as torch packs do), so a worker's prewarm, which
    imports its pack, imports torch too."""
    isolated, in_process = [], []
    for k in range(count):
        for kind, init in (("isolated", ISOLATED_INIT), ("in_process", IN_PROCESS_INIT)):
            d = os.path.join(root, kind, pack_name(k))
            os.makedirs(d)
            with open(os.path.join(d, "__init__.py"), "w") as f:
                f.write(init)
            with open(os.path.join(d, "nodes.py"), "w") as f:
                f.write(PACK_NODES.format(k=k, hold=HOLD_MIB,
                                          torch_import="import torch  # noqa: F401\n" if torch_at_import else ""))
            if kind == "isolated":
                with open(os.path.join(d, "comfy-env.toml"), "w") as f:
                    f.write(PACK_ENV)
            (isolated if kind == "isolated" else in_process).append(d)
    host = os.path.join(root, "bench_host")
    os.makedirs(host)
    with open(os.path.join(host, "__init__.py"), "w") as f:
        f.write(HOST_NODES)
    text = os.path.join(root, "isolated", TEXT_PACK)
    os.makedirs(text)
    for name, body in (("__init__.py", ISOLATED_INIT), ("nodes.py", TEXT_PACK_NODES), ("comfy-env.toml", PACK_ENV)):
        with open(os.path.join(text, name), "w") as f:
            f.write(body)
    return isolated, in_process, host, text


def image_prompt(packs, value):
    prompt = {"img": {"class_type": "BenchImage", "inputs": {"value": value}}}
    last = ["img", 0]
    for k in packs:
        prompt[f"s{k}"] = {"class_type": f"BenchShift{k}", "inputs": {"image": last, "shift": 0.01}}
        prompt[f"h{k}"] = {"class_type": f"BenchHold{k}", "inputs": {"image": [f"s{k}", 0]}}
        last = [f"h{k}", 0]
    prompt["out"] = {"class_type": "BenchSink", "inputs": {"image": last}}
    return prompt


# --- a server and what it is asked ---

class Bench:
    """One ComfyUI base directory (kept across its restarts, so the
    metadata cache and the environments stay warm) and its server."""

    def __init__(self, work, name, pack_dirs, home):
        self.base = os.path.join(work, name)
        self.path = assemble(self.base, pack_dirs=pack_dirs)
        self.env = server_env(home, PYTHONPATH=os.pathsep.join(self.path))
        self.srv = None

    def start(self):
        self.srv, t0 = start(self.base, self.env)
        return time.monotonic() - t0

    def stop(self):
        if self.srv is not None:
            self.srv.stop()
            self.srv = None

    def run(self, prompt, timeout_s=300, executed=False):
        """Queues prompt; returns ms from the POST to ComfyUI's
        execution_success (its own timestamp, ms: a cold prompt's workers
        start when it is queued), or with executed from ComfyUI's
        execution_start to it (a warm prompt: not the queue's pick-up)."""
        t0_ms = time.time() * 1000
        prompt_id = self.srv.queue(prompt)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, h = self.srv.http("GET", "/history/" + prompt_id)
            if h and prompt_id in h:
                status = h[prompt_id]["status"]
                if status["status_str"] != "success":
                    raise RuntimeError(f"prompt failed: {status}\n{self.srv.log()[-3000:]}")
                stamps = {kind: m["timestamp"] for kind, m in status["messages"]}
                return stamps["execution_success"] - (stamps["execution_start"] if executed else t0_ms)
            time.sleep(0.01)
        raise RuntimeError(f"prompt {prompt_id} did not finish in {timeout_s} s:\n{self.srv.log()[-3000:]}")

    def workers(self):
        status, doc = self.srv.http("GET", "/bulkhead/status")
        if status != 200:
            raise RuntimeError(f"/bulkhead/status: {status} {doc}")
        return {p["name"]: p["pid"] for p in doc["packs"] if p.get("pid")}

    def free(self):
        """POST /free with free_memory; waits until no worker is left."""
        status, body = self.srv.http("POST", "/free", {"unload_models": True, "free_memory": True})
        if status != 200:
            raise RuntimeError(f"/free: {status} {body}")
        deadline = time.monotonic() + 30
        while self.workers() or children(self.srv.proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers left after /free: {self.workers()}\n{self.srv.log()[-3000:]}")
            time.sleep(0.05)

    def starts_logged(self, since):
        """ms of each 'started ahead of its first node' line after offset since."""
        with open(self.srv.log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [float(ms) for ms in re.findall(r"started ahead of its first node.*\((?:\d+) nodes, (\d+) ms\)", text)]

    def log_size(self):
        return os.path.getsize(self.srv.log_path)


def _proc_mib(pid, name, field):
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024
    except (OSError, AttributeError):
        return 0.0


def rss_mib(pid):
    return _proc_mib(pid, "status", "VmRSS")


def pss_mib(pid):
    return _proc_mib(pid, "smaps_rollup", "Pss")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def copy_ms():
    """Medians of a 3 MiB copy into an already-touched destination, in
    this process: torch (``copy_``) and numpy (``copyto``), each source
    one of 32 (96 MiB: out of the CPU's caches, as a crossing's source
    is); and the same source again and again (cache-hot), for scale."""
    import numpy as np
    import torch
    torch_src = [torch.rand(IMAGE_SHAPE) for _ in range(32)]
    numpy_src = [t.numpy().copy() for t in torch_src]
    t_dst, n_dst = torch.empty(IMAGE_SHAPE), np.empty(IMAGE_SHAPE, dtype=np.float32)
    out = {}
    for name, fn in (("torch", lambda i: t_dst.copy_(torch_src[i % 32])),
                     ("numpy", lambda i: np.copyto(n_dst, numpy_src[i % 32])),
                     ("torch_hot", lambda i: t_dst.copy_(torch_src[0]))):
        times = []
        for i in range(161):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = statistics.median(times[1:])
    return out


def sample(n):
    """The packs whose single cold start is measured: first, middle, last."""
    return sorted({0, n // 2, n - 1})


# --- the measurements ---

def measure_isolated(bench, twin, n, round_no):
    """The isolated set-up's round; twin (the same packs in-process) runs
    beside it for the warm prompts, one prompt on each in turn, so that
    the two are compared under the same load (it is noisy here).  Returns
    the two rounds' figures."""
    r = {"start_s": bench.start()}
    try:
        assert not bench.workers(), f"a worker runs before the first prompt: {bench.workers()}"
        host = bench.srv.proc.pid
        r["host_start_mib"] = rss_mib(host)
        packs = list(range(n))
        mark = bench.log_size()
        r["cold_first_prompt_ms"] = bench.run(image_prompt(packs, 0.1 + round_no))
        r["cold_worker_starts_ms"] = bench.starts_logged(mark)
        twin.start()
        try:
            t = {"first_prompt_ms": twin.run(image_prompt(packs, 0.1 + round_no))}
            pairs = [(bench.run(image_prompt(packs, 0.2 + i), executed=True),
                      twin.run(image_prompt(packs, 0.2 + i), executed=True)) for i in range(WARM_PAIRS)]
        finally:
            twin.stop()
        r["warm_prompt_ms"] = statistics.median(a for a, _ in pairs)
        t["warm_prompt_ms"] = statistics.median(b for _, b in pairs)
        r["warm_over_in_process_ms"] = statistics.median(a - b for a, b in pairs)
        pids = bench.workers()
        r["worker_rss_mib"] = sorted(rss_mib(p) for p in pids.values())
        r["host_after_use_mib"] = rss_mib(host)
        # the same prompt cold again, its workers stopped, the host warm:
        # the state the single packs below are measured in
        bench.free()
        mark = bench.log_size()
        r["cold_again_ms"] = bench.run(image_prompt(packs, 0.15 + round_no))
        r["cold_again_worker_starts_ms"] = bench.starts_logged(mark)
        singles = {}
        for k in sample(n):
            bench.free()
            mark = bench.log_size()
            singles[k] = bench.run(image_prompt([k], 0.3 + k))
            r.setdefault("single_worker_start_ms", {})[k] = bench.starts_logged(mark)
        r["single_cold_ms"] = singles
        bench.free()
        bench.run({"t": {"class_type": "BenchText0", "inputs": {"text": "ab%d" % round_no}}})
        pid = bench.workers()[pack_name(0)]
        # pack 0 passes IMAGEs too: its worker, forked from a zygote that
        # has torch, maps torch's pages (shared: its PSS is what it costs)
        r["tensor_pack_text_worker_rss_mib"], r["tensor_pack_text_worker_pss_mib"] = rss_mib(pid), pss_mib(pid)
        bench.free()
        bench.run({"t": {"class_type": "BenchTextOnly", "inputs": {"text": "ab%d" % round_no}}})
        pid = bench.workers()[TEXT_PACK]
        r["text_worker_rss_mib"], r["text_worker_pss_mib"] = rss_mib(pid), pss_mib(pid)
        bench.free()
        time.sleep(0.5)
        r["after_free_mib"] = rss_mib(host) + sum(rss_mib(p) for p in bench.workers().values())
    finally:
        bench.stop()
    return r, t


def measure_n0(bench, round_no):
    """The server with no pack: its host's RSS after the image -> sink
    prompt and /free."""
    bench.start()
    try:
        r = {"first_prompt_ms": bench.run(image_prompt([], 0.1 + round_no))}
        r["warm_prompt_ms"] = statistics.median(bench.run(image_prompt([], 0.2 + i), executed=True)
                                                for i in range(9))
        bench.free()
        time.sleep(0.5)
        r["host_after_free_mib"] = rss_mib(bench.srv.proc.pid)
        return r
    finally:
        bench.stop()


def first_start(bench):
    """The first start of an isolated set-up: builds the environments
    that are not built (logged, with their times), describes the nodes;
    then stops."""
    took = bench.start()
    with open(bench.srv.log_path, errors="replace") as f:
        log = f.read()
    bench.stop()
    builds = [float(s) for s in re.findall(r"environment built in ([\d.]+) s", log)]
    return {"start_s": took, "envs_built": len(builds), "env_build_s": builds}


def cpu_run(argv, env):
    """Wall ms and CPU s (user + sys) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


FORK_PROBE = '''
import os, sys, time
import numpy, torch
import bulkhead.worker, bulkhead.worker.nodes
times = []
for _ in range(20):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    times.append((time.perf_counter() - t0) * 1000)
times.sort()
print(times[len(times) // 2])
'''


def where_the_time_goes(home, rounds):
    """Each part of a worker's cold start alone, in one pack's environment:
    medians over rounds of (wall ms, CPU s), cumulative."""
    envs = sorted(d for d in os.listdir(os.path.join(home, "envs")) if not d.startswith("."))
    python = os.path.join(home, "envs", envs[0], "bin", "python")
    base = os.path.realpath(python)
    env = dict(os.environ, PYTHONPATH=BUILD_PY)
    steps = [("interpreter (no site)", [base, "-S", "-c", "pass"]),
             ("+ the environment's site", [python, "-c", "pass"]),
             ("+ bulkhead's worker modules", [python, "-c", "import bulkhead.worker, bulkhead.worker.nodes"]),
             ("+ numpy (the pack's import)", [python, "-c", "import bulkhead.worker, bulkhead.worker.nodes, numpy"]),
             ("+ torch (the first IMAGE crossing)",
              [python, "-c", "import bulkhead.worker, bulkhead.worker.nodes, numpy, torch"])]
    out = []
    for label, argv in steps:
        runs = [cpu_run(argv, env) for _ in range(rounds)]
        out.append({"step": label, "wall_ms": statistics.median(w for w, _ in runs),
                    "cpu_s": statistics.median(c for _, c in runs)})
    fork = [float(subprocess.run([python, "-c", FORK_PROBE], env=env, capture_output=True, text=True,
                                 check=True).stdout) for _ in range(rounds)]
    return out, statistics.median(fork)


def env_dirs(home):
    d = os.path.join(home, "envs")
    names = sorted(x for x in os.listdir(d) if not x.startswith("."))
    du = subprocess.run(["du", "-sk", d], capture_output=True, text=True).stdout.split()
    return {"count": len(names), "distinct_hashes": len({n.rsplit("-", 1)[-1] for n in names}),
            "total_kib": int(du[0]) if du else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--counts", default="1,5,20", help="numbers of packs (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    ap.add_argument("--torch-at-import", action="store_true",
                    help="the packs import torch at import, so prewarm imports it side by side (not numpy-only)")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    t_all = time.monotonic()
    work = tempfile.mkdtemp(prefix="bh-many-packs-")
    try:
        home = os.path.join(work, "home")
        os.makedirs(home)
        isolated, in_process, host, text = write_packs(os.path.join(work, "packs"), max(counts), args.torch_at_import)
        n0 = Bench(work, "n0", [host], home)
        iso = {n: Bench(work, f"isolated{n}", [host, text] + isolated[:n], home) for n in counts}
        inp = {n: Bench(work, f"in_process{n}", [host] + in_process[:n], home) for n in counts}
        firsts = {}
        for n in sorted(counts, reverse=True):      # the largest set builds every environment
            firsts[n] = first_start(iso[n])
            print(f"first start, {n} packs: {firsts[n]['start_s']:.1f} s, {firsts[n]['envs_built']} environments "
                  f"built ({sum(firsts[n]['env_build_s']):.1f} s)", flush=True)
        envs = env_dirs(home)
        rounds = []
        for i in range(args.rounds):
            r = {"copy_3m_ms": copy_ms(), "n0": measure_n0(n0, i), "isolated": {}, "in_process": {}}
            for n in counts:
                r["isolated"][n], r["in_process"][n] = measure_isolated(iso[n], inp[n], n, i)
                one = r["isolated"][n]
                print(f"round {i + 1}, {n} packs: cold {one['cold_first_prompt_ms']:.0f} ms (single, slowest "
                      f"{max(one['single_cold_ms'].values()):.0f} ms), warm {one['warm_prompt_ms']:.0f} ms "
                      f"(in-process {r['in_process'][n]['warm_prompt_ms']:.0f}), after /free "
                      f"{one['after_free_mib']:.0f} MiB (N=0 {r['n0']['host_after_free_mib']:.0f})", flush=True)
            rounds.append(r)
        parts, fork_ms = where_the_time_goes(home, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(fn):
        return statistics.median(fn(r) for r in rounds)

    def spread(fn):
        vals = [fn(r) for r in rounds]
        return [min(vals), max(vals)]

    copy = med(lambda r: r["copy_3m_ms"]["numpy"])
    n0_mib = med(lambda r: r["n0"]["host_after_free_mib"])
    rows = {}
    for n in counts:
        def iso_(key, n=n):
            return lambda r: r["isolated"][n][key]
        cold = med(iso_("cold_first_prompt_ms"))
        ready = med(lambda r, n=n: max(r["isolated"][n]["cold_worker_starts_ms"] or [0]))
        single_ready = med(lambda r, n=n: max(
            [ms for starts in r["isolated"][n]["single_worker_start_ms"].values() for ms in starts] or [1]))
        single = med(lambda r, n=n: max(r["isolated"][n]["single_cold_ms"].values()))
        warm_over = med(lambda r, n=n: r["isolated"][n]["warm_over_in_process_ms"] / (2 * n))
        after = med(iso_("after_free_mib"))
        rows[n] = {
            "cold_first_prompt_ms": cold, "cold_first_prompt_spread_ms": spread(iso_("cold_first_prompt_ms")),
            "single_cold_max_ms": single,
            "cold_ratio": cold / single,
            "cold_again_ms": med(iso_("cold_again_ms")),
            "cold_again_ratio": med(iso_("cold_again_ms")) / single,
            "first_prompt_in_process_ms": med(lambda r, n=n: r["in_process"][n]["first_prompt_ms"]),
            "cold_over_in_process": med(lambda r, n=n: r["isolated"][n]["cold_first_prompt_ms"]
                                        / r["in_process"][n]["first_prompt_ms"]),
            "cold_worker_start_ms_median": med(lambda r, n=n: statistics.median(
                r["isolated"][n]["cold_worker_starts_ms"] or [0])),
            "cold_workers_ready_ms": ready,
            "single_workers_ready_ms": single_ready,
            "cold_workers_ready_ratio": ready / single_ready,
            "warm_prompt_ms": med(iso_("warm_prompt_ms")),
            "warm_prompt_in_process_ms": med(lambda r, n=n: r["in_process"][n]["warm_prompt_ms"]),
            "warm_per_crossing_ms": warm_over,
            "warm_per_crossing_spread_ms": spread(lambda r, n=n: r["isolated"][n]["warm_over_in_process_ms"] / (2 * n)),
            "copy_3m_ms": copy,
            "warm_per_crossing_over_copy": warm_over / copy,
            "worker_rss_mib_median": med(lambda r, n=n: statistics.median(r["isolated"][n]["worker_rss_mib"])),
            "text_worker_rss_mib": med(iso_("text_worker_rss_mib")),
            "text_worker_pss_mib": med(iso_("text_worker_pss_mib")),
            "tensor_pack_text_worker_rss_mib": med(iso_("tensor_pack_text_worker_rss_mib")),
            "tensor_pack_text_worker_pss_mib": med(iso_("tensor_pack_text_worker_pss_mib")),
            "after_free_mib": after, "n0_host_mib": n0_mib, "after_free_over_n0": after / n0_mib,
            "start_s": med(iso_("start_s")),
        }
    report = {
        "counts": counts, "rounds_n": args.rounds, "torch_at_import": args.torch_at_import, "rows": rows,
        "copy_3m_ms": {k: med(lambda r, k=k: r["copy_3m_ms"][k]) for k in ("torch", "numpy", "torch_hot")},
        "first_starts": firsts, "envs": envs,
        "cold_start_parts": parts, "fork_of_a_started_interpreter_ms": fork_ms,
        "targets": {k: {"limit": v} for k, v in TARGETS.items()},
        "bench_s": time.monotonic() - t_all,
        "rounds": rounds,
    }
    big = rows[max(counts)]
    for key, limit in TARGETS.items():
        report["targets"][key]["met"] = big[key] <= limit
    report["targets"]["after_free_back_to_n0"] = {"met": big["after_free_mib"] <= n0_mib * 1.05,
                                                  "limit": "N=0 host + 5 %"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)

    print(f"\nN isolated numpy-only packs (medians of {args.rounds} rounds; 3 MiB numpy copy {copy:.2f} ms)")
    print("  N  cold ms  single ms  ratio  in-process ms  /in-process  ready ratio  again ratio  "
          "warm/crossing ms  /copy  worker MiB  text-only MiB  after /free MiB (N=0)")
    for n in counts:
        w = rows[n]
        print(f"{n:3d} {w['cold_first_prompt_ms']:8.0f} {w['single_cold_max_ms']:10.0f} {w['cold_ratio']:6.2f} "
              f"{w['first_prompt_in_process_ms']:14.0f} {w['cold_over_in_process']:12.2f} "
              f"{w['cold_workers_ready_ratio']:12.2f} "
              f"{w['cold_again_ratio']:12.2f} "
              f"{w['warm_per_crossing_ms']:17.2f} {w['warm_per_crossing_over_copy']:6.1f} "
              f"{w['worker_rss_mib_median']:11.1f} {w['text_worker_rss_mib']:14.1f} "
              f"{w['after_free_mib']:10.0f} ({n0_mib:.0f})")
    print("where a worker's cold start goes (alone, cumulative):")
    for p in parts:
        print(f"  {p['step']:40s} {p['wall_ms']:7.0f} ms wall {p['cpu_s']:6.2f} s CPU")
    print(f"  one fork of a started interpreter with all of it: {fork_ms:.2f} ms")
    print(f"environments: {envs['count']} directories, {envs['distinct_hashes']} distinct config hash(es), "
          f"{(envs['total_kib'] or 0) / 1024:.0f} MiB; bench {report['bench_s']:.0f} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
