"""bulkhead's memory benchmark: what the stand-in, a release and a probe
cost, and how close ComfyUI's eviction walk through stand-ins stops to what
it asked for.

    python bench/memory.py --pingpong build/rel/bench/pingpong \
        --fake-nvml build/rel/tests/c/fake_nvml/libnvidia-ml.so.1 \
        --comfy tests/comfyui --out build/bench/memory.json

  standin_loaded_size_ns   one StandIn.loaded_size() (a ledger read)      <= 1000
  partial_unload_rtt_us    StandIn.partially_unload of one small chunk,
                           host -> worker release ladder -> receipt,
                           set against pingpong_median_us (same run)
  nvml_read_us             one device memory reading through the probe
                           (the fake driver the tests build)              <= 10
  evict_overshoot_ratio    bytes evicted / bytes asked when upstream's
                           free_memory walks four 2 GiB worker models (an
                           SDXL UNet is ~5 GiB) for 3 GiB of real RAM     <= 1.1
                           (also at 512 MiB models / 768 MiB asked)

Prints a table and writes every figure to --out as JSON.  Exit status 0
whether targets are met or not; nonzero only when something failed.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HELPERS = os.path.join(ROOT, "tests", "py", "helpers")
MIB = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pingpong", required=True)
    ap.add_argument("--fake-nvml", required=True, help="the tests' fake libnvidia-ml.so.1")
    ap.add_argument("--comfy", default=os.environ.get("COMFYUI_PATH") or os.path.join(ROOT, "tests", "comfyui"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=7, help="eviction scenarios run")
    return ap.parse_args(argv)


def per_call_ns(fn, batch=1000, samples=200):
    for _ in range(batch):
        fn()
    gc.collect()
    gc.disable()
    try:
        out = []
        clock = time.perf_counter_ns
        for _ in range(samples):
            t0 = clock()
            for _ in range(batch):
                fn()
            out.append((clock() - t0) / batch)
    finally:
        gc.enable()
    return statistics.median(out)


def bench_loaded_size(tmp):
    from bulkhead import _native
    led = _native.Ledger(os.path.join(tmp, "ledger-ls"))
    led.join("worker", pack="bench")
    led.set_model(1, "UNet", "cpu", 100 * MIB, 60 * MIB)
    s = _native.standin(object(), led, os.getpid(), 1, generation=1, name="UNet",
                        size_bytes=100 * MIB, model=_native.RemoteModel(), load_device="cpu",
                        offload_device="cpu")
    ns = per_call_ns(s.loaded_size)
    del s
    led.close()
    return ns


def bench_nvml(lib, tmp):
    from bulkhead import _native
    state = os.path.join(tmp, "nvml-state")
    with open(state, "w") as f:
        f.write('device GPU-00000000-1111-2222-3333-444444444444 "Fake" total=150000000000 free=100000000000 used=50000000000\n')
    os.environ["BH_FAKE_NVML"] = state
    g = _native.Gpu(lib)
    try:
        return per_call_ns(lambda: g.memory(0), batch=200, samples=100) / 1e3
    finally:
        g.close()


SCENARIO = r"""
import json, os, sys, time
sys.argv = ["main.py", "--cpu"]
import comfy.options
comfy.options.enable_args_parsing()
import comfy.model_management as mm
import bulkhead
from bulkhead import _native
from bulkhead.host.memory import HostMemory
MiB = 1 << 20
hm = HostMemory(mm, ledger_path=os.path.join(TMP, "ledger-sc"))
def worker(name, chunk):
    w = bulkhead.Worker(sys.executable, name=name,
                        env={"PYTHONPATH": HELPERS + os.pathsep + COMFY, "BH_MEMPACK_CHUNK": str(chunk)})
    return hm.attach(w)
def resident(w):
    rec = hm.ledger.read(w.pid)
    return sum(m["resident_bytes"] for m in rec["models"]) if rec else 0
def pcp_bytes():
    # Free pages parked on the kernel's per-CPU lists ("count:" under each
    # zone's pagesets in /proc/zoneinfo, world-readable): free, but not in
    # MemAvailable, which is upstream's cpu reading.
    try:
        with open("/proc/zoneinfo") as f:
            return sum(int(l.split()[1]) for l in f if l.split()[:1] == ["count:"]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
out = {}
if MODE == "rtt":
    a = worker("bench-a", 256 * 1024)
    a.call("bh_mempack:load", "UNet", 256 * MiB)   # 1024 chunks: each 1-byte ask frees one
    hm.reconcile()
    s = hm.standins(a)[0]
    dev = s.offload_device
    for _ in range(24):
        s.partially_unload(dev, 1)
    ts = []
    for _ in range(1000):
        t0 = time.perf_counter_ns()
        s.partially_unload(dev, 1)
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    out["rtt_us"] = ts[len(ts) // 2] / 1e3
    a.close()
else:
    ws = [worker("bench-a", 8 * MiB), worker("bench-b", 8 * MiB)]
    for i, w in enumerate(ws):
        w.call("bh_mempack:load", "M%da" % i, MODEL)
        w.call("bh_mempack:load", "M%db" % i, MODEL)
    hm.reconcile()
    before = sum(resident(w) for w in ws)
    dev = mm.get_torch_device()
    ask = ASK
    free0, pcp0 = mm.get_free_memory(dev), pcp_bytes()
    mm.free_memory(free0 + ask, dev)
    out["evicted"] = before - sum(resident(w) for w in ws)
    out["seen_gain"] = mm.get_free_memory(dev) - free0
    pcp1 = pcp_bytes()
    out["pcp_parked"] = None if pcp0 is None or pcp1 is None else pcp1 - pcp0
    time.sleep(3)
    out["settled_gain"] = mm.get_free_memory(dev) - free0
    out["ask"] = ask
    for w in ws:
        w.close()
hm.close()
print("RESULT " + json.dumps(out), flush=True)
"""


def run_scenario(mode, comfy, tmp, model=512 * MIB, ask=768 * MIB):
    code = (f"MODE={mode!r}\nTMP={tmp!r}\nHELPERS={HELPERS!r}\nCOMFY={comfy!r}\n"
            f"MODEL={model}\nASK={ask}\n" + SCENARIO)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), comfy) if x)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        raise RuntimeError(f"scenario {mode} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(line[-1][7:])


def main(argv=None):
    a = parse_args(argv)
    import bulkhead  # noqa: F401  (fail early if the build is not on the path)
    base = json.loads(subprocess.run([a.pingpong, "20000"], check=True, capture_output=True,
                                     text=True, timeout=120).stdout)
    with tempfile.TemporaryDirectory(prefix="bh-bench-mem-") as tmp:
        r = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
             "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
             "pingpong_median_us": base["pingpong_median_us"],
             "standin_loaded_size_ns": round(bench_loaded_size(tmp), 1),
             "nvml_read_us": round(bench_nvml(a.fake_nvml, tmp), 3)}
        r["partial_unload_rtt_us"] = round(run_scenario("rtt", a.comfy, tmp)["rtt_us"], 1)
        ratios, lags, corrected, small, parked = [], [], [], [], []
        for _ in range(a.reps):
            sc = run_scenario("evict", a.comfy, tmp, model=2048 * MIB, ask=3072 * MIB)
            ratios.append(sc["evicted"] / sc["ask"])
            lag = max(0, sc["evicted"] - sc["seen_gain"])
            lags.append(lag / MIB)
            if sc["pcp_parked"] is not None:
                parked.append(sc["pcp_parked"] / MIB)
            corrected.append(sc["seen_gain"] / sc["ask"])
            sc = run_scenario("evict", a.comfy, tmp, model=512 * MIB, ask=768 * MIB)
            small.append(sc["evicted"] / sc["ask"])
    r["partial_unload_ratio"] = round(r["partial_unload_rtt_us"] / r["pingpong_median_us"], 2)
    r["evict_overshoot_ratio"] = round(statistics.median(ratios), 3)
    r["evict_overshoot_ratios"] = [round(x, 3) for x in ratios]
    # The same walk over four 512 MiB models for 768 MiB: the kernel's lag
    # (below) is a larger share of a smaller ask.
    r["evict_overshoot_ratio_512m"] = round(statistics.median(small), 3)
    # What the kernel's free figure (MemAvailable, upstream's cpu reading)
    # had not yet shown of the freed bytes when the walk re-measured.
    r["free_figure_lag_mib"] = round(statistics.median(lags), 1)
    # Where those bytes were: free pages the walk's frees parked on the
    # kernel's per-CPU lists (Linux >= 6.7 grows them to hundreds of MiB
    # after an allocation burst, and drains them at ~8 MiB/s or under
    # pressure), measured from /proc/zoneinfo around the walk.
    r["pcp_parked_mib"] = round(statistics.median(parked), 1) if parked else None
    # What the free figure showed gained when the walk stopped, over the
    # ask: about 1.0 means the walk stopped the moment upstream's reading
    # showed enough, so the overshoot is the reading's lag, not the walk's.
    r["walk_stop_seen_ratio"] = round(statistics.median(corrected), 3)
    r["targets"] = {"standin_loaded_size_ns": r["standin_loaded_size_ns"] <= 1000,
                    "nvml_read_us": r["nvml_read_us"] <= 10,
                    "evict_overshoot_ratio": r["evict_overshoot_ratio"] <= 1.1}
    for k in ("pingpong_median_us", "standin_loaded_size_ns", "partial_unload_rtt_us",
              "partial_unload_ratio", "nvml_read_us", "evict_overshoot_ratio", "free_figure_lag_mib",
              "pcp_parked_mib", "walk_stop_seen_ratio", "evict_overshoot_ratio_512m"):
        t = r["targets"].get(k)
        print(f"  {k:28s} {r[k]:>10}  {'' if t is None else ('ok' if t else 'MISSED')}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(r, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
