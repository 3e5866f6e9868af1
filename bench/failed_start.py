"""What packs whose environment builds failed cost a later ComfyUI start,
measured in the same run against the same ComfyUI without them.

    python bench/failed_start.py --out build/bench/failed_start.json [--rounds 5]

A ComfyUI-shaped server (tests/comfyui's main.py, or the checkout named by
COMFYUI_PATH) with bulkhead in custom_nodes/ is started until it answers
GET /prompt, in two set-ups that alternate round by round:

  without   bulkhead and nothing else
  failed    bulkhead and two isolated packs whose builds cannot succeed
            (a requirement no index has), after one start that tried and
            failed them: the builds are remembered (envs.build.failed_before)
            and not tried again; the packs are imported in-process

  extra_s   median failed - median without     (target: under 1 s)

The first start of the failed set-up (the one that pays the builds) is
reported too, as first_failed_s.  Exit status 0 whether the target is met
or not; nonzero only when a server fails to start.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

from _server import server_env, start  # noqa: E402
from e2eenv import assemble  # noqa: E402

PACK_INIT = ("import bulkhead\n"
             "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = bulkhead.comfy_pack(__file__)\n")
PACK_NODES = ("class N:\n    @classmethod\n    def INPUT_TYPES(cls):\n        return {'required': {}}\n"
              "    RETURN_TYPES = ()\n    FUNCTION = 'run'\n    def run(self):\n        return ()\n"
              "NODE_CLASS_MAPPINGS = {'%s': N}\n")


def _packs(root):
    out = []
    for name in ("failing_pack_a", "failing_pack_b"):
        d = os.path.join(root, name)
        os.makedirs(d)
        with open(os.path.join(d, "__init__.py"), "w") as f:
            f.write(PACK_INIT)
        with open(os.path.join(d, "nodes.py"), "w") as f:
            f.write(PACK_NODES % ("Bench" + name))
        with open(os.path.join(d, "comfy-env.toml"), "w") as f:
            f.write('requirements = ["bh-no-index-has-this-one"]\n')
        out.append(d)
    return out


def _start_s(base, home, env):
    srv, t0 = start(base, server_env(home, **env))
    took = time.monotonic() - t0
    srv.stop()
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bh-failed-start-")
    try:
        home = os.path.join(work, "home")
        packs = _packs(os.path.join(work, "packs"))
        env = {"PYTHONPATH": os.pathsep.join(assemble(os.path.join(work, "without"))),
               "BULKHEAD_PIP_ARGS": "--no-index"}
        assemble(os.path.join(work, "failed"), pack_dirs=packs)
        first = _start_s(os.path.join(work, "failed"), home, env)
        rounds = {"without": [], "failed": []}
        for _ in range(args.rounds):
            for mode in ("without", "failed"):
                rounds[mode].append(_start_s(os.path.join(work, mode), home, env))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        doc = {"rounds": rounds, "median_s": med, "first_failed_s": first,
               "extra_s": med["failed"] - med["without"], "target_extra_s": 1.0}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"start without the packs {med['without']:.2f} s, with two packs whose builds failed before "
              f"{med['failed']:.2f} s: +{doc['extra_s']:.2f} s (target < 1 s); the start that tried the "
              f"builds: {first:.2f} s  [{args.rounds} rounds, medians; {args.out}]")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
