"""What the first node of an isolated torch pack costs, cold and prewarmed,
next to the same node in-process, measured in the same run.

    python bench/first_node.py --out build/bench/first_node.json [--rounds 11]

The pack imports torch and ComfyUI's model_management at import (as real
torch packs do) and its node does a fixed amount of torch work.  Each
figure is one node call timed in a fresh ComfyUI-shaped host
(tests/comfyui, or the checkout named by COMFYUI_PATH):

  in_process   the pack imported in-process at start-up (untimed, as
               ComfyUI does), then its first node

In every mode the host has run a small torch op before the timed node,
as a ComfyUI that ran earlier nodes has (torch's thread pool up, its
first op paid): the in-process figure is a warm host's, not one paying
torch's first-op set-up that a prewarmed worker has paid already.
  cold         the pack isolated, its metadata cached, no worker yet: the
               first node pays the spawn, the pack's import (torch,
               ComfyUI) and the node
  prewarmed    the same, after a queued prompt started the worker
               (host/prewarm.py's on-prompt handler) and the host's earlier
               nodes gave it time to finish: the first node pays the node

  prewarmed_ratio   median prewarmed / median in_process     <= 1.1

Each mode runs --rounds times (medians reported, every round kept in the
JSON).  The exit status is 0 whether the target is met or not (this is a
report); nonzero only when something failed to run.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

from comfyenv import run_comfy_script  # noqa: E402

TARGET = 1.1

PACK_NODES = '''
import torch
import comfy.model_management  # noqa: F401  (what a torch pack imports at its top)


class Work:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 256})}}
    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "go"

    def go(self, n):
        x = torch.full((n, n), 1.0 / n)
        for _ in range(16):
            x = torch.tanh(x @ x + 0.5)
        return (float(x.sum()),)


NODE_CLASS_MAPPINGS = {"Work": Work}
'''

SCENARIO = '''
import time
from bulkhead.host import nodes, prewarm, states
PACK, MODE = {pack!r}, {mode!r}
# The host's earlier prompts (a model loaded, a prompt encoded) have run
# torch in ComfyUI's process before a pack's node runs: its thread pool is
# up and its first op paid, in every mode alike.
import torch
torch.tanh(torch.full((64, 64), 0.5) @ torch.full((64, 64), 0.5)).sum()
if MODE == "in_process":
    m, _ = nodes.fallback(PACK, "the bench's in-process baseline")
else:
    nodes.load_pack(PACK, sys.executable)          # fills the metadata cache
    nodes._forget_all()                            # a new ComfyUI start: cached, no worker
    m, _ = nodes.load_pack(PACK, sys.executable)
    assert states.runtime(PACK).worker.pid is None
    if MODE == "prewarmed":
        prewarm.on_prompt({{"prompt": {{"1": {{"class_type": "Work", "inputs": {{"n": 256}}}}}}}})
        prewarm.wait(120)                          # the host's earlier nodes ran meanwhile
node = m["Work"]()
t0 = time.perf_counter()
node.go(n=256)
ms = (time.perf_counter() - t0) * 1000
nodes.close_all()
emit(ms)
'''

MODES = ("in_process", "cold", "prewarmed")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--rounds", type=int, default=11, help="fresh hosts per mode (medians reported)")
    return ap.parse_args(argv)


def measure(pack, mode, home):
    path = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"BULKHEAD_HOME": home, "PYTHONPATH": os.pathsep.join(path)}  # the host runs in ComfyUI's directory
    return run_comfy_script(SCENARIO.format(pack=pack, mode=mode), env=env, timeout=300)


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bulkhead-bench-") as tmp:
        pack = os.path.join(tmp, "torchbench")
        os.makedirs(pack)
        with open(os.path.join(pack, "nodes.py"), "w") as f:
            f.write(textwrap.dedent(PACK_NODES))
        with open(os.path.join(pack, "__init__.py"), "w") as f:
            f.write("# the host-side glue is the bench's own\n")
        rounds = []
        for i in range(args.rounds):
            r = {mode: measure(pack, mode, os.path.join(tmp, f"home-{i}-{mode}")) for mode in MODES}
            r["prewarmed_ratio"] = r["prewarmed"] / r["in_process"]
            rounds.append(r)
            print(f"round {i + 1}: " + ", ".join(f"{m} {r[m]:.1f} ms" for m in MODES)
                  + f", prewarmed/in-process {r['prewarmed_ratio']:.2f}", flush=True)
    med = {m: statistics.median(r[m] for r in rounds) for m in MODES}
    report = {
        "first_node_ms": med,
        "prewarmed_ratio": med["prewarmed"] / med["in_process"],
        "cold_ratio": med["cold"] / med["in_process"],
        "targets": {"prewarmed_ratio": {"limit": TARGET, "met": med["prewarmed"] / med["in_process"] <= TARGET}},
        "rounds": rounds,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"\nfirst node of an isolated torch pack (medians of {args.rounds} rounds)")
    print(f"  in-process   {med['in_process']:9.1f} ms")
    print(f"  cold         {med['cold']:9.1f} ms   ({report['cold_ratio']:.1f}x in-process)")
    print(f"  prewarmed    {med['prewarmed']:9.1f} ms   ({report['prewarmed_ratio']:.2f}x in-process, "
          f"target <= {TARGET}: {'met' if report['targets']['prewarmed_ratio']['met'] else 'NOT met'})")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
