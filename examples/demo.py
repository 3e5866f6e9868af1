"""bulkhead demo: two workers under two different interpreters.

Starts a worker in each of two worker venvs (different Python versions),
calls into both, moves a 64 MiB array through each and back, and prints
what happened with timings.  Run by `make demo`.
"""

import os
import sys
import time

import numpy as np

import bulkhead


def pick_two(venv_root):
    found = []
    if os.path.isdir(venv_root):
        for name in sorted(os.listdir(venv_root)):
            py = os.path.join(venv_root, name, "bin", "python")
            if os.access(py, os.X_OK):
                found.append((name, py))
    # prefer two different minor versions, newest first
    by_minor = {}
    for name, py in reversed(found):
        minor = ".".join(name.split("-")[-1].split(".")[:2])
        by_minor.setdefault(minor, (name, py))
    picks = list(by_minor.values())[:2]
    if len(picks) < 2:
        sys.exit(f"demo needs worker venvs for two Python versions under {venv_root}; "
                 "run `make worker-venvs` (it builds one per pyenv CPython 3.9-3.13)")
    return picks


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


def main():
    venv_root = sys.argv[1] if len(sys.argv) > 1 else "build/venvs"
    host = "%d.%d.%d" % sys.version_info[:3]
    print(f"host: Python {host} (pid {os.getpid()})")
    big = np.random.default_rng(0).random(8 << 20)  # 8M float64 = 64 MiB
    workers = []
    for name, py in pick_two(venv_root):
        t0 = time.perf_counter()
        w = bulkhead.Worker(py, name=name).start()
        workers.append(w)
        print(f"\n[{name}] started pid {w.pid} under Python {w.info['python']} "
              f"({w.info['executable']}) in {ms(t0):.1f} ms")
        t0 = time.perf_counter()
        v = w.call("sys:version.split")[0]
        print(f"[{name}] call sys.version -> {v!r} in {ms(t0):.2f} ms")
        t0 = time.perf_counter()
        npv = w.call("numpy:__version__.__str__")
        print(f"[{name}] its numpy is {npv} (host numpy {np.__version__}) in {ms(t0):.2f} ms")
        for attempt in ("first", "warm"):
            t0 = time.perf_counter()
            back = w.call("numpy:negative", big)
            took = ms(t0)
            ok = np.array_equal(back, -big)
            print(f"[{name}] 64 MiB float64 there and back ({attempt}, negated in the worker): "
                  f"{took:.1f} ms, result {'correct' if ok else 'WRONG'}")
            if not ok:
                sys.exit(1)
            del back
        t0 = time.perf_counter()
        s = w.call("numpy:sum", big)
        print(f"[{name}] 64 MiB to the worker, sum back: {s:.3f} in {ms(t0):.1f} ms "
              f"(host sum {big.sum():.3f})")
        calls = 2000
        t0 = time.perf_counter()
        for i in range(calls):
            w.call("operator:add", i, 1)
        print(f"[{name}] {calls} trivial calls: {ms(t0) / calls * 1000:.1f} us each")
    for w in workers:
        status = w.close()
        print(f"\n[{w.name}] closed: {bulkhead.describe_status(status)}")


if __name__ == "__main__":
    main()
