"""Soak: many calls of mixed payloads through two workers, watching for
anything that grows.

    python tests/py/soak.py [--calls 100000] [--out build/bench/soak.json]
                            [--python PY [--python PY]] [--seed N]

Each call goes to one of two workers (chosen at random) and is one of:

  small     a few plain values there and back          (70 %)
  1 MiB     a 1 MiB numpy array there and back          (25 %)
  callback  the worker calls a host function back       (4 %)
  64 MiB    a 64 MiB numpy array there and back         (1 %)

After a warm-up (every kind on both workers, then the first tenth of the
calls, at least 500) the script samples, every 1/50 of the run: the RSS of
the host and of each worker, their open fd counts, and each channel's
block pool (Worker.stats()).  The run passes when, across the samples
after warm-up:

  * every RSS stays within 2 MiB (max - min),
  * every fd count stays the same,
  * each pool's bytes stay the same and under its bound (the pool keeps at
    most 256 MiB of free blocks, plus what is in flight: two 64 MiB
    arrays), and no worker was restarted.

It prints a table and writes every figure, samples included, to --out as
JSON.  Exit status 0 when the run passes, 1 when a bound was broken, 2
when something failed to run.  A short version runs in `make check`
(tests/py/test_soak.py); the long one is `make soak`.
"""

import argparse
import datetime
import gc
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(HERE, "helpers")
MIB = 1 << 20

KINDS = (("small", 0.70), ("1 MiB", 0.25), ("callback", 0.04), ("64 MiB", 0.01))
RSS_BOUND = 2 * MIB
POOL_BOUND = 256 * MIB + 2 * 64 * MIB
SAMPLES = 50


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100_000, help="calls in all (default 100000)")
    ap.add_argument("--out", help="where to write the JSON report")
    ap.add_argument("--python", action="append", default=[],
                    help="a worker interpreter (needs numpy); give it twice for two different ones "
                         "(default: this interpreter for both)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the call mix")
    return ap.parse_args(argv)


def rss_bytes(pid="self"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fd_count(pid="self"):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _host_add(a, b):
    return a + b


class Soak:
    def __init__(self, pythons, seed):
        import numpy as np
        import bulkhead
        self.np = np
        pythons = (list(pythons) or [sys.executable]) * 2
        self.workers = [bulkhead.Worker(py, name=f"soak-{i}", env={"PYTHONPATH": HELPERS})
                        for i, py in enumerate(pythons[:2])]
        self.rng = random.Random(seed)
        # The host's arrays are made once: what is measured is bulkhead, not
        # numpy's allocations.
        self.arrays = {"1 MiB": np.arange(MIB // 4, dtype=np.float32),
                       "64 MiB": np.arange(64 * MIB // 4, dtype=np.float32)}
        self.counts = {k: 0 for k, _ in KINDS}
        self.callbacks = 0

    def close(self):
        for w in self.workers:
            w.close()

    def pick(self):
        x = self.rng.random()
        for kind, weight in KINDS:
            if x < weight:
                return kind
            x -= weight
        return KINDS[0][0]

    def one(self, w, kind):
        if kind == "small":
            r = w.call("bh_testmod:echo", 1, "two", [3.5, None, True], k=b"\x00\x01")
            assert r == ((1, "two", [3.5, None, True]), {"k": b"\x00\x01"}), r
        elif kind == "callback":
            r = w.call("bh_testmod:call_back", _host_add, 20, 22)
            assert r == 42, r
        else:
            a = self.arrays[kind]
            (back,), _ = w.call("bh_testmod:echo", a)
            # First and last element: the data crossed both ways (two pages
            # touched, not the whole array).
            assert back.shape == a.shape and back[0] == a[0] and back[-1] == a[-1]
            del back
        self.counts[kind] += 1

    def warm(self):
        for w in self.workers:
            w.start()
            for kind, _ in KINDS:
                for _ in range(3):
                    self.one(w, kind)

    def sample(self):
        # A small call on each worker first: return notes of the blocks the
        # last calls held ride on it, so every sample sees the pools at rest.
        for w in self.workers:
            self.one(w, "small")
        gc.collect()
        s = {"host_rss": rss_bytes(), "host_fds": fd_count()}
        for i, w in enumerate(self.workers):
            st = w.stats()
            s[f"w{i}_rss"] = rss_bytes(w.pid)
            s[f"w{i}_fds"] = fd_count(w.pid)
            s[f"w{i}_pool"] = st.get("own_bytes", 0) + st.get("peer_bytes", 0)
            s[f"w{i}_pid"] = w.pid
            s[f"w{i}_generation"] = w.generation
        return s


def run(calls=100_000, pythons=(), seed=7, progress=None, check_rss=True):
    """Runs the soak; returns the report (a dict; "ok" says whether every
    bound held).  check_rss=False reports RSS without bounding it (under
    ASan, whose quarantine keeps freed memory resident by design)."""
    soak = Soak(pythons, seed)
    t0 = time.monotonic()
    samples = []
    try:
        soak.warm()
        warmup = max(500, calls // 10)
        every = max(1, (calls - warmup) // SAMPLES)
        for n in range(calls):
            if n >= warmup and (n - warmup) % every == 0:
                samples.append(dict(soak.sample(), call=n, t=round(time.monotonic() - t0, 3)))
                if progress:
                    progress(n, calls)
            soak.one(soak.workers[soak.rng.random() < 0.5], soak.pick())
        samples.append(dict(soak.sample(), call=calls, t=round(time.monotonic() - t0, 3)))
    finally:
        soak.close()
    elapsed = time.monotonic() - t0
    checks = []

    def spread(key):
        vals = [s[key] for s in samples]
        return min(vals), max(vals), vals[0], vals[-1]

    for key, what, bound in (("host_rss", "host RSS", RSS_BOUND), ("w0_rss", "worker 0 RSS", RSS_BOUND),
                             ("w1_rss", "worker 1 RSS", RSS_BOUND), ("host_fds", "host fds", 0),
                             ("w0_fds", "worker 0 fds", 0), ("w1_fds", "worker 1 fds", 0),
                             ("w0_pool", f"pool 0 (max {POOL_BOUND // MIB})", 0),
                             ("w1_pool", f"pool 1 (max {POOL_BOUND // MIB})", 0)):
        lo, hi, first, last = spread(key)
        ok = hi - lo <= bound and (not key.endswith("_pool") or hi <= POOL_BOUND)
        if key.endswith("_rss") and not check_rss:
            ok, bound = True, None
        checks.append({"name": what, "key": key, "min": lo, "max": hi, "first": first, "last": last,
                       "spread": hi - lo, "bound": bound, "ok": ok})
    for i in (0, 1):
        gens = {s[f"w{i}_generation"] for s in samples}
        checks.append({"name": f"worker {i} generations", "key": f"w{i}_generation", "min": min(gens),
                       "max": max(gens), "first": min(gens), "last": max(gens), "spread": len(gens) - 1,
                       "bound": 0, "ok": len(gens) == 1})
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "calls": calls, "seconds": round(elapsed, 3), "calls_per_s": round(calls / elapsed, 1),
        "warmup_calls": max(500, calls // 10), "kinds": soak.counts,
        "pythons": [w.python for w in soak.workers], "rss_bound": RSS_BOUND, "pool_bound": POOL_BOUND,
        "checks": checks, "samples": samples, "ok": all(c["ok"] for c in checks),
    }


def table(report):
    def fmt(c, v):
        if v is None:
            return "-"
        return f"{v / MIB:.2f}" if c["key"].endswith(("_rss", "_pool")) else str(v)
    lines = [f"soak: {report['calls']} calls in {report['seconds']:.1f} s "
             f"({report['calls_per_s']:.0f} calls/s) through 2 workers, "
             f"{len(report['samples'])} samples after {report['warmup_calls']} warm-up calls",
             "  calls by kind (warm-up and samples included): "
             + ", ".join(f"{k} {v}" for k, v in report["kinds"].items()),
             f"  {'':24} {'first':>10} {'last':>10} {'min':>10} {'max':>10} {'spread':>10} {'bound':>8}  ok"]
    for c in report["checks"]:
        unit = " MiB" if c["key"].endswith(("_rss", "_pool")) else ""
        lines.append(f"  {c['name'] + unit:24} {fmt(c, c['first']):>10} {fmt(c, c['last']):>10} "
                     f"{fmt(c, c['min']):>10} {fmt(c, c['max']):>10} {fmt(c, c['spread']):>10} "
                     f"{fmt(c, c['bound']):>8}  {'yes' if c['ok'] else 'NO'}")
    lines.append("PASS" if report["ok"] else "FAIL: a bound was broken")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, HELPERS)
    try:
        report = run(args.calls, args.python, args.seed,
                     progress=lambda n, total: print(f"  {n}/{total} calls", file=sys.stderr, flush=True))
    except Exception as e:
        print(f"soak: failed to run: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(table(report))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
