"""What a worker's idle OpenMP threads cost the crossings, and what bounding
their spin costs the worker's own compute, measured in the same run.

    python bench/spin.py --out build/bench/spin.json [--rounds 7]

After a parallel region, libgomp's idle threads (torch's) spin before they
sleep: 300,000 steps of x86's `pause` by default, 8-15 ms on current CPUs;
OpenBLAS's (numpy's) 2**28 TSC ticks, about 0.1 s.  After every node a
worker's pool threads spin that long; on a small machine they hold the CPUs
the host and the next worker need.  bulkhead bounds both to about 200 us
(host/spin.py, spin_env).  Three kinds of worker, side by side, each in
its own workers (torch and numpy from this interpreter):

  bulkhead   what bulkhead gives a worker (from BULKHEAD_OMP_SPIN_US,
             default 200 us)
  default    the runtimes' own defaults (GOMP_SPINCOUNT=300000,
             OPENBLAS_THREAD_TIMEOUT=28)
  passive    threads sleep at once (OMP_WAIT_POLICY=PASSIVE,
             OPENBLAS_THREAD_TIMEOUT=4, its least)

Figures, each the median over --rounds rounds (the modes interleaved, their
order turned each round; min and every sample kept in the JSON):

  chain_ms        a 3 MiB IMAGE through --chain workers (a node each: two
                  elementwise torch ops), host in between, as a warm
                  prompt does
  per_node_ms     (chain_ms - the same nodes in-process) / --chain: what a
                  node's crossing adds; limit: a torch copy_ of 3 MiB
  chain_blas_ms, per_node_blas_ms
                  the same with a numpy node (a 256 x 256 matrix product,
                  then the image times 0.5) and a numpy image
  h2w_64m_ms      a 64 MiB tensor, changed since it last crossed (so
                  copied), to a worker right after its node; limit: a
                  torch copy_ of 64 MiB
  compute_ms      the worker's own work (elementwise, matmul, conv, and a
                  loop with 50 us of Python between its parallel regions),
                  timed inside the worker; ratio to the default's

The exit status is 0 whether targets are met or not (this is a report).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
MODES = {
    "bulkhead": {},
    "default": {"GOMP_SPINCOUNT": "300000", "OPENBLAS_THREAD_TIMEOUT": "28"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"},
}
COMPUTE = {  # name: (function, args)
    "elementwise": ("_spin_worker:elementwise", (400,)),
    "matmul": ("_spin_worker:matmul", (400,)),
    "conv": ("_spin_worker:conv", (60,)),
    "gaps_50us": ("_spin_worker:gaps", (400, 50)),
    "blas_50us": ("_spin_worker:blas", (200, 50)),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--rounds", type=int, default=7, help="rounds, every mode in each (medians reported)")
    ap.add_argument("--chain", type=int, default=5, help="workers in the chain (one node each)")
    return ap.parse_args(argv)


def median(xs):
    return statistics.median(xs) if xs else None


def timed(fn, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def chain_once(workers, img, node="_spin_worker:shift"):
    x = img
    for w in workers:
        x = w.call(node, x)
    return x


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    import torch
    import bulkhead
    import _spin_worker
    from bulkhead.host import spin as bh_spin

    img = torch.rand(1, 512, 512, 3)  # 3 MiB, as ComfyUI's IMAGE
    img_np = img.numpy().copy()
    big = torch.full((64 * MIB // 4,), 1.5)
    pools = {}
    try:
        for mode, extra in MODES.items():
            env = {"PYTHONPATH": HERE, **extra}
            pools[mode] = [bulkhead.Worker(sys.executable, name=f"spin-{mode}-{i}", env=env)
                           for i in range(args.chain)]
            for w in pools[mode]:
                w.start()
                w.call("_spin_worker:elementwise", 5)  # torch imported, pool threads up
        samples = {m: {"chain_ms": [], "chain_blas_ms": [], "h2w_64m_ms": [], **{c: [] for c in COMPUTE}}
                   for m in MODES}
        inproc, inproc_blas, copy3, copy64 = [], [], [], []
        dst3, dst64 = torch.empty_like(img), torch.empty_like(big)
        order = list(MODES)
        for rnd in range(args.rounds):
            for mode in order[rnd % len(order):] + order[:rnd % len(order)]:
                ws, s = pools[mode], samples[mode]
                time.sleep(0.05)  # the last mode's threads are asleep by now, whatever their spin
                for name, (fn, fargs) in COMPUTE.items():
                    s[name].append(ws[0].call(fn, *fargs) * 1e3)
                    time.sleep(0.02)
                chain_once(ws, img)
                s["chain_ms"] += timed(lambda: chain_once(ws, img))
                time.sleep(0.05)
                chain_once(ws, img_np, "_spin_worker:blas_node")
                s["chain_blas_ms"] += timed(lambda: chain_once(ws, img_np, "_spin_worker:blas_node"))
                time.sleep(0.05)
                for _ in range(5):
                    ws[0].call("_spin_worker:shift", img)
                    big[0] += 1  # changed in place: copied again, not sent by reference
                    t0 = time.perf_counter()
                    ws[0].call("_spin_worker:numel", big)
                    s["h2w_64m_ms"].append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.05)
            inproc += timed(lambda: [_spin_worker.shift(img) for _ in range(args.chain)])
            inproc_blas += timed(lambda: [_spin_worker.blas_node(img_np) for _ in range(args.chain)])
            copy3 += timed(lambda: dst3.copy_(img))
            copy64 += timed(lambda: dst64.copy_(big))
    finally:
        for ws in pools.values():
            for w in ws:
                w.close()

    r = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "machine": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                     "torch": torch.__version__, "threads": torch.get_num_threads()},
         "spin_us": float(os.environ.get("BULKHEAD_OMP_SPIN_US") or bh_spin.SPIN_US),
         "spin_env": bh_spin.spin_env(),
         "relax_ns": bulkhead._native.relax_ns(),
         "chain": args.chain, "rounds": args.rounds,
         "in_process_chain_ms": median(inproc), "in_process_chain_blas_ms": median(inproc_blas),
         "copy_3m_ms": median(copy3), "copy_64m_ms": median(copy64),
         "modes": {}, "samples": samples}
    for mode, s in samples.items():
        m = {k: median(v) for k, v in s.items()}
        m["min"] = {k: min(v) for k, v in s.items()}
        m["per_node_ms"] = (m["chain_ms"] - r["in_process_chain_ms"]) / args.chain
        m["per_node_over_copy"] = m["per_node_ms"] / r["copy_3m_ms"]
        m["per_node_blas_ms"] = (m["chain_blas_ms"] - r["in_process_chain_blas_ms"]) / args.chain
        m["h2w_over_copy"] = m["h2w_64m_ms"] / r["copy_64m_ms"]
        r["modes"][mode] = m
    for mode, m in r["modes"].items():
        m["compute_over_default"] = {c: m[c] / r["modes"]["default"][c] for c in COMPUTE}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(r, f, indent=2)
    print(table(r))
    return 0


def table(r):
    lines = [f"OpenMP spin after a node ({r['machine']['cpus']} CPUs, torch {r['machine']['torch']}, "
             f"{r['machine']['threads']} threads; bulkhead: {r['spin_us']:g} us = GOMP_SPINCOUNT "
             f"{r['spin_env']['GOMP_SPINCOUNT']} at {r['relax_ns']:.1f} ns a step, "
             f"OPENBLAS_THREAD_TIMEOUT {r['spin_env']['OPENBLAS_THREAD_TIMEOUT']})",
             f"  in-process chain of {r['chain']}: {r['in_process_chain_ms']:.2f} ms; "
             f"numpy {r['in_process_chain_blas_ms']:.2f} ms; "
             f"copy_ 3 MiB {r['copy_3m_ms']:.3f} ms, 64 MiB {r['copy_64m_ms']:.2f} ms",
             f"  {'mode':9} {'chain ms':>9} {'per node':>9} {'/copy':>6} {'numpy':>7} {'per node':>9} "
             f"{'64M h2w':>8} {'/copy':>6}  "
             + "  ".join(f"{c} (x default)" for c in COMPUTE)]
    for mode, m in r["modes"].items():
        lines.append(f"  {mode:9} {m['chain_ms']:9.2f} {m['per_node_ms']:9.2f} {m['per_node_over_copy']:6.1f} "
                     f"{m['chain_blas_ms']:7.2f} {m['per_node_blas_ms']:9.2f} {m['h2w_64m_ms']:8.2f} {m['h2w_over_copy']:6.2f}  "
                     + "  ".join(f"{m[c]:.1f} ms ({m['compute_over_default'][c]:.2f})" for c in COMPUTE))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
