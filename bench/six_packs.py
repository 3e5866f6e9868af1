"""Six packs whose environments need building: how soon ComfyUI serves and
how soon every pack is ready, each figure beside its limit measured in the
same run (issue #36's "Done when").

    python bench/six_packs.py --out build/bench/six_packs.json [--rounds 1]

Opt-in (`make bench-six`), not part of `make bench`: each round builds
thirteen environments from the index pip is configured for.  Six packs are
generated, each its own comfy-env.toml with one small pure-Python
requirement of its own (PACKAGES: six distinct distributions, so each
environment really builds and installs something) and one node whose
module imports it.  The server is tests/comfyui's main.py (or
COMFYUI_PATH's) with bulkhead, started as tests/e2e's Server does.  Each
set-up gets a BULKHEAD_HOME and an installer cache (uv's, pip's) of its
own, both empty, so every build downloads.  Per round:

  start_without_s    the server's start (its process started) to its first
                     GET /system_stats answer, bulkhead and no pack
  start_with_s       the same with the six packs, none built: they build
                     in the background (host/building.py)
  start_extra_s      start_with_s - start_without_s           (#36: <= 2 s)
  ready_s            from the same start until every pack's node is in
                     GET /object_info (built and described), polled; and
                     each pack's own (pack_ready_s)
  build_s            limit: each pack's `bulkhead install` alone, one after
                     another, in a home and cache of their own (the build
                     only: outside ComfyUI it describes no node)
  slowest_build_s    the slowest of them; serial_build_s their sum
  single_ready_s     limit: the server with only the slowest pack, start to
                     its node in /object_info (its build and description)
  download_s         `pip download --no-deps` of the six requirements with
                     no cache, from the same index
  ready_over_slowest ready_s / slowest_build_s
  ready_over_single  ready_s / single_ready_s
  ready_over_serial  ready_s / serial_build_s  (side by side: well under 1)
  slowest_plus_download_s
                     single_ready_s + download_s
  ready_over_slowest_plus_download
                     ready_s / slowest_plus_download_s: #36's "about
                     the time of the slowest build plus the download time"
  builds_at_once     how many builds are at work at once (host/building.py
                     pool_size): one per CPU slot (cpu_slots: the CPUs, at
                     most 4) and one per download stream (one per index);
                     a build that waits holds neither
  cpu_s, host_cpu_s  per start (without, six, single): CPU seconds of the
                     server and of the processes it ran and reaped (the
                     builds' commands, its workers), and of ComfyUI's own
                     process alone, whose threads run Python one at a time
                     (one GIL): the builds' Python steps (hostmatch's plan,
                     the shared farm) and what the server does for them
  builds_cpu_s       six cpu_s - without cpu_s: the CPU the six builds and
                     descriptions cost; builds_host_cpu_s the same of
                     host_cpu_s
  builds_floor_s     start_with_s + max(builds_cpu_s / cpus,
                     builds_host_cpu_s): the soonest every pack could be
                     ready on this machine with its CPUs always busy (the
                     builds start before the server answers, so a little
                     under), to read ready_s and the #36 ratio against
  waves_s            limit for a pool of one build per CPU slot (the pool
                     before #36's download streams): single_ready_s +
                     (ceil(6 / cpu_slots) - 1) * slowest_build_s, six
                     builds in waves of cpu_slots, each as slow as the
                     slowest; ready_over_waves = ready_s / waves_s

Medians over --rounds where more than one.  Exit status 0 whether the
targets are met or not (a report); nonzero only when something failed to
run.
"""

import argparse
import json
import os
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

# (distribution, module): small, pure Python, no dependencies, none of
# them in the host's environment (so none comes from its matched set).
PACKAGES = (("humanize", "humanize"), ("boltons", "boltons"), ("cachelib", "cachelib"),
            ("appdirs", "appdirs"), ("tabulate", "tabulate"), ("termcolor", "termcolor"))
TARGET_EXTRA_S = 2.0
READY_TIMEOUT_S = 600
HOST_MM = "%d.%d" % sys.version_info[:2]

PACK_INIT = ("import bulkhead\n"
             "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)\n")
PACK_NODES = '''
import {module}


class {cls}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{}}}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "bench"

    def run(self):
        return ({module}.__name__,)


NODE_CLASS_MAPPINGS = {{"{cls}": {cls}}}
'''


def node_class(dist):
    return "BenchSix_" + dist.replace("-", "_")


def make_packs(root):
    out = {}
    for dist, module in PACKAGES:
        d = os.path.join(root, "bench_six_" + dist)
        os.makedirs(d)
        with open(os.path.join(d, "__init__.py"), "w") as f:
            f.write(PACK_INIT)
        with open(os.path.join(d, "nodes.py"), "w") as f:
            f.write(PACK_NODES.format(module=module, cls=node_class(dist)))
        with open(os.path.join(d, "comfy-env.toml"), "w") as f:
            f.write(f'python = "{HOST_MM}"\nrequirements = ["{dist}"]\n')
        out[dist] = d
    return out


def fresh_env(work, name, extra=None):
    """The environment of one set-up: its own BULKHEAD_HOME, ledger and
    empty installer caches."""
    home = os.path.join(work, "homes", name)
    os.makedirs(home)
    return server_env(home, UV_CACHE_DIR=os.path.join(home, "uv-cache"),
                      PIP_CACHE_DIR=os.path.join(home, "pip-cache"), **(extra or {}))


def _cpu_s(pid=None):
    """CPU seconds (user and system) of the processes this one reaped, or
    of process pid alone (its threads; not its children)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(base, env, nodes, cpu=None):
    """Starts the server at base: (seconds to the first /system_stats
    answer, seconds until each of nodes is in /object_info).  cpu, a
    dict, gets "cpu_s" and "host_cpu_s" (see above) of the start up to
    then, the server stopped."""
    before = _cpu_s()
    srv, t0 = start(base, env, wait_for_builds=False)     # returns once GET /prompt answers
    try:
        while srv.http("GET", "/system_stats", timeout=5)[0] != 200:
            time.sleep(0.02)
        up = time.monotonic() - t0
        ready = {}
        deadline = t0 + READY_TIMEOUT_S
        while len(ready) < len(nodes):
            status, info = srv.http("GET", "/object_info", timeout=30)
            now = time.monotonic() - t0
            if status == 200 and isinstance(info, dict):
                for n in nodes:
                    if n in info and n not in ready:
                        ready[n] = now
            if len(ready) < len(nodes):
                if time.monotonic() > deadline:
                    raise SystemExit(f"six_packs: {sorted(set(nodes) - set(ready))} not in /object_info "
                                     f"after {READY_TIMEOUT_S} s:\n{srv.log()}")
                time.sleep(0.1)
        if cpu is not None:
            cpu["host_cpu_s"] = _cpu_s(srv.proc.pid)
        return up, ready
    finally:
        srv.stop()
        if cpu is not None:
            cpu["cpu_s"] = _cpu_s() - before


def build_alone(pack, env):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bulkhead", "install", pack], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"six_packs: bulkhead install {pack} failed:\n{r.stdout[-4000:]}")
    return took


def download_s(work, env):
    dest = os.path.join(work, "download")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir", "-d", dest]
                       + [d for d, _ in PACKAGES], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    took = time.monotonic() - t0
    shutil.rmtree(dest, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"six_packs: pip download failed:\n{r.stdout[-4000:]}")
    return took


def one_round(work, k, packs, path):
    rw = os.path.join(work, f"round{k}")
    os.makedirs(rw)
    extra = {"PYTHONPATH": os.pathsep.join(path)}
    nodes = {dist: node_class(dist) for dist in packs}
    # the server without packs, then with the six (each start a fresh home)
    cpu = {"without": {}, "six": {}, "single": {}}
    without, _ = serve(os.path.join(work, "without"), fresh_env(rw, "without", extra), [], cpu["without"])
    with_s, ready = serve(os.path.join(work, "six"), fresh_env(rw, "six", extra), list(nodes.values()), cpu["six"])
    # each pack built alone, one after another
    builds = {dist: build_alone(pack, fresh_env(rw, "alone-" + dist, extra)) for dist, pack in packs.items()}
    slowest = max(builds, key=builds.get)
    _, single = serve(os.path.join(work, "single-" + slowest), fresh_env(rw, "single", extra), [nodes[slowest]],
                      cpu["single"])
    dl = download_s(rw, fresh_env(rw, "download", extra))
    shutil.rmtree(rw, ignore_errors=True)
    return {"start_without_s": without, "start_with_s": with_s, "start_extra_s": with_s - without,
            "ready_s": max(ready.values()),
            "pack_ready_s": {dist: ready[n] for dist, n in nodes.items()},
            "build_s": builds, "slowest_pack": slowest, "slowest_build_s": builds[slowest],
            "serial_build_s": sum(builds.values()), "single_ready_s": single[nodes[slowest]],
            "download_s": dl, "cpu": cpu,
            "builds_cpu_s": cpu["six"]["cpu_s"] - cpu["without"]["cpu_s"],
            "builds_host_cpu_s": cpu["six"]["host_cpu_s"] - cpu["without"]["host_cpu_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bh-six-packs-")
    try:
        packs = make_packs(os.path.join(work, "packs"))
        path = assemble(os.path.join(work, "without"))
        assemble(os.path.join(work, "six"), pack_dirs=list(packs.values()))
        # the single-pack server for each pack, so the slowest's is at hand
        for dist, pack in packs.items():
            assemble(os.path.join(work, "single-" + dist), pack_dirs=[pack])
        rounds = [one_round(work, k, packs, path) for k in range(args.rounds)]
        doc = {k: statistics.median(r[k] for r in rounds)
               for k in rounds[0] if isinstance(rounds[0][k], float)}
        doc["ready_over_slowest"] = doc["ready_s"] / doc["slowest_build_s"]
        doc["ready_over_single"] = doc["ready_s"] / doc["single_ready_s"]
        doc["ready_over_serial"] = doc["ready_s"] / doc["serial_build_s"]
        doc["slowest_plus_download_s"] = doc["single_ready_s"] + doc["download_s"]
        doc["ready_over_slowest_plus_download"] = doc["ready_s"] / doc["slowest_plus_download_s"]
        from bulkhead.host.building import cpu_slots, pool_size
        doc["builds_at_once"], doc["cpu_slots"] = pool_size(), cpu_slots()
        doc["waves_s"] = doc["single_ready_s"] + (-(-len(PACKAGES) // cpu_slots()) - 1) * doc["slowest_build_s"]
        doc["ready_over_waves"] = doc["ready_s"] / doc["waves_s"]
        doc["builds_floor_s"] = doc["start_with_s"] + max(doc["builds_cpu_s"] / (os.cpu_count() or 1),
                                                          doc["builds_host_cpu_s"])
        doc.update(target_extra_s=TARGET_EXTRA_S, packages=[d for d, _ in PACKAGES], rounds=rounds,
                   cpus=os.cpu_count(), loadavg=list(os.getloadavg()), build_py=BUILD_PY)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"start to /system_stats: without packs {doc['start_without_s']:.2f} s, with six needing builds "
              f"{doc['start_with_s']:.2f} s ({doc['start_extra_s']:+.2f} s, target <= +{TARGET_EXTRA_S:.0f} s); "
              f"every pack in /object_info {doc['ready_s']:.1f} s from start: slowest build alone "
              f"{doc['slowest_build_s']:.1f} s (x{doc['ready_over_slowest']:.2f}), slowest pack's server alone "
              f"{doc['single_ready_s']:.1f} s (x{doc['ready_over_single']:.2f}), six built serially "
              f"{doc['serial_build_s']:.1f} s (x{doc['ready_over_serial']:.2f}), in waves of {doc['cpu_slots']} "
              f"{doc['waves_s']:.1f} s (x{doc['ready_over_waves']:.2f}), download {doc['download_s']:.2f} s; "
              f"the six builds' CPU {doc['builds_cpu_s']:.1f} s ({doc['builds_host_cpu_s']:.1f} s in ComfyUI's "
              f"process), so at best {doc['builds_floor_s']:.1f} s on {os.cpu_count()} CPU(s) "
              f"[{args.rounds} round(s), load {doc['loadavg'][0]:.1f}; {args.out}]")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
