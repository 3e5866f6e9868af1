"""What the sandbox (host/sandbox.py, src/core/sandbox.c) costs a worker's
start, measured here against the same start without it.

    python bench/sandbox.py --out build/bench/sandbox.json [--rounds 200]

  plan_ms         the host's Plan for one pack (the paths derived from
                  its interpreter, ComfyUI's folders, the caches): once
                  per worker start
  apply_ms        bh_sandbox_apply in a forked child, as a zygote's child
                  pays it (the ruleset built, its rules added, restrict)
  spawn_extra_ms  median spawn-and-reap of /bin/true through
                  bh_proc_spawn with the sandbox (on a thread restricted
                  first) minus without, alternating

Target: apply_ms and spawn_extra_ms under 1 ms.  Where the kernel has no
Landlock the figures are null.  Exit status 0 whether the target is met
or not.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bulkhead import _native
from bulkhead.host import sandbox


def _plan(comfyui):
    folders = {"folders": {"checkpoints": [[os.path.join(comfyui, "models", "checkpoints")], [".safetensors"]]},
               "dirs": {k: os.path.join(comfyui, k) for k in ("input", "output", "temp", "user")},
               "models_dir": os.path.join(comfyui, "models")}
    t0 = time.perf_counter()
    p = sandbox.plan("bench", os.path.join(comfyui, "custom_nodes", "bench"), sys.executable, {}, comfyui, folders)
    return (time.perf_counter() - t0) * 1e3, p


def _apply_ms(spec):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        t0 = time.perf_counter()
        _native.sandbox_apply(spec)
        os.write(w, repr((time.perf_counter() - t0) * 1e3).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return float(got)


def _spawn_ms(spec):
    t0 = time.perf_counter()
    proc, fd = _native.spawn("/bin/true", ["/bin/true"], [], None, -1, None, spec)
    proc.wait()
    proc.close()
    os.close(fd)
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        comfyui = os.path.join(root, "ComfyUI")
        for d in ("custom_nodes/bench", "models/checkpoints", "input", "output", "temp", "user"):
            os.makedirs(os.path.join(comfyui, d))
        plans = []
        for _ in range(20):
            ms, p = _plan(comfyui)
            plans.append(ms)
        out = {"abi": sandbox.abi(), "plan_ms": statistics.median(plans), "rules": len(p.read) + len(p.write),
               "apply_ms": None, "spawn_extra_ms": None, "target_ms": 1.0}
        if p.active:
            spec = p.spec()
            out["apply_ms"] = statistics.median(_apply_ms(spec) for _ in range(min(a.rounds, 50)))
            with_, without = [], []
            for _ in range(a.rounds):
                with_.append(_spawn_ms(spec))
                without.append(_spawn_ms(None))
            out["spawn_ms"] = statistics.median(without)
            out["spawn_extra_ms"] = statistics.median(with_) - statistics.median(without)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
