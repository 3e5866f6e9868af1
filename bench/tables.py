"""The tables of measured figures in README.md and docs/performance.md,
written from the bench JSON in bench/results/, never typed.

    python bench/tables.py                   # rewrite both tables from bench/results
    python bench/tables.py --save build/bench  # first copy a `make bench` run's JSON there
    python bench/tables.py --check           # exit 1 where a table differs from its JSON

(`make bench-tables` and `make bench-save` run the first two.)  Each table
stands between two marker lines, `<!-- bench-table:NAME begin ... -->`
and `<!-- bench-table:NAME end -->`; everything between them is this
script's.  A row names the bench JSON and the keys its figure, its limit
and its ratio come from (ROWS); the line above the table says which run
that was: the machine, and per bench the date and the commit, from
bench/results/run.json, which --save writes beside the
copies (--commit names the commit where the run was not of this
checkout's HEAD, e.g. a bench-compare tree).  A figure
missing from the JSON (a bench not run, a machine without torch) is shown
as "not measured", not left out.  tests/py/test_bench_tables.py checks that
the committed tables are what this script writes from the committed JSON.
"""

import argparse
import datetime
import filecmp
import json
import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
BENCHES = ("ipc", "first_node", "spin", "memory", "failed_start", "many_packs", "six_packs")
DOCS = {"readme": os.path.join(ROOT, "README.md"), "performance": os.path.join(ROOT, "docs", "performance.md")}


def row(figure, bench, value, unit, limit=None, limit_label="", ratio=None, target="", docs=("readme", "performance"),
        limit_unit=None):
    """One row: value and limit are key paths into bench/results/<bench>.json
    (a.b for nested keys); ratio is a key path, "/" (value / limit), "-"
    (value - limit, in unit) or None.  The limit is in unit too, or in
    limit_unit where given (a 64 MiB return's ms against a round trip's
    µs; "/" then converts the value into limit_unit, SCALE)."""
    return {"figure": figure, "bench": bench, "value": value, "unit": unit, "limit": limit,
            "limit_label": limit_label, "ratio": ratio, "target": target, "docs": docs,
            "limit_unit": unit if limit_unit is None else limit_unit}


ROWS = [
    row("trivial call, `w.call(\"operator:add\", 1, 2)`, host and worker pinned to one CPU", "ipc",
        "call_same_cpu_us", "µs", "pingpong_same_cpu_us", "raw ping-pong", "call_ratio_same_cpu", "≤ 1.3"),
    row("the same call, pinned to two CPUs", "ipc", "call_cross_cpu_us", "µs", "pingpong_cross_cpu_us",
        "raw ping-pong", "call_ratio_cross_cpu", "≤ 1.3"),
    row("64 MiB numpy array host → worker (`h2w_64m_ms`)", "ipc", "h2w_64m_ms", "ms", "memcpy_64m_ms", "memcpy",
        "h2w_ratio", "≤ 1.3"),
    row("64 MiB numpy array worker → host (`w2h_64m_ms`)", "ipc", "w2h_64m_ms", "ms", "memcpy_64m_ms", "memcpy",
        "w2h_ratio", "≤ 1.3"),
    row("a new 64 MiB torch tensor host → worker, summed there (`new_h2w_torch_sum_ms`)", "ipc",
        "new_h2w_torch_sum_ms", "ms", "copy_sum_64m_ms", "torch `copy_` + the sum", "new_h2w_torch_sum_ratio",
        "≤ 1.2"),
    row("a new 64 MiB torch tensor worker → host (`new_w2h_torch_ms`)", "ipc", "new_w2h_torch_ms", "ms",
        "copy_64m_ms", "torch `copy_`", "new_w2h_torch_copy_ratio", "≤ 1.2"),
    row("the same two with one busy process per CPU: host → worker, summed", "ipc",
        "loaded_new_h2w_torch_sum_ms", "ms", "loaded_copy_sum_64m_ms", "`copy_` + sum, as loaded",
        "loaded_new_h2w_torch_sum_ratio", "≤ 1.2"),
    row("worker → host, loaded", "ipc", "loaded_new_w2h_torch_ms", "ms", "loaded_copy_64m_ms", "`copy_`, as loaded",
        "loaded_new_w2h_torch_copy_ratio", "≤ 1.2"),
    row("the same torch tensor sent again unchanged (`same_h2w_torch_64m_ms`)", "ipc", "same_h2w_torch_64m_ms", "ms",
        "copy_64m_ms", "torch `copy_`", "same_h2w_torch_copy_ratio", "≤ 0.1"),
    row("a worker's cached torch tensor returned (`cached_w2h_torch_64m_ms`)", "ipc", "cached_w2h_torch_64m_ms",
        "ms", "copy_64m_ms", "torch `copy_`", "cached_w2h_torch_copy_ratio", "≤ 0.1"),
    row("the same return against a round trip (a return: a round trip and the handle's bookkeeping)", "ipc",
        "cached_w2h_torch_64m_ms", "ms", "pingpong_same_cpu_us", "raw ping-pong, one CPU", "/", "≤ 5",
        limit_unit="µs"),
    row("the host's torch tensor kept by the worker, handed back (`back_w2h_torch_64m_ms`)", "ipc",
        "back_w2h_torch_64m_ms", "ms", "pingpong_same_cpu_us", "raw ping-pong, one CPU", "/", "≤ 5",
        limit_unit="µs"),
    row("the same for a numpy array (`back_w2h_64m_ms`)", "ipc", "back_w2h_64m_ms", "ms", "pingpong_same_cpu_us",
        "raw ping-pong, one CPU", "/", "≤ 5", limit_unit="µs"),
    row("the same host torch tensor sent again unchanged, summed there (`same_h2w_torch_sum_ms`)", "ipc",
        "same_h2w_torch_sum_ms", "ms", "w_sum_64m_ms", "the worker's sum of its own, in a call",
        "same_h2w_torch_sum_ratio", "≤ 1.5"),
    row("a worker's cached torch tensor handed back to it, summed there (`back_h2w_torch_sum_ms`)", "ipc",
        "back_h2w_torch_sum_ms", "ms", "w_sum_64m_ms", "the worker's sum of its own, in a call",
        "back_h2w_torch_sum_ratio", "≤ 1.5"),
    row("64 MiB torch tensor from pack A's worker into pack B's (`a2b_torch_64m_ms`)", "ipc", "a2b_torch_64m_ms",
        "ms", "copy_64m_ms", "torch `copy_`", "a2b_torch_copy_ratio", "≤ 1.2"),
    row("the same, B summing it (`a2b_torch_sum_ms`: every page of A's block read in B)", "ipc",
        "a2b_torch_sum_ms", "ms", "b_sum_64m_ms", "B's sum of its own, in a call", "a2b_torch_sum_own_ratio",
        "≤ 1.5"),
    row("the same against the host's sum alone (no call)", "ipc", "a2b_torch_sum_ms", "ms", "sum_64m_ms",
        "that sum alone", "a2b_torch_sum_ratio"),
    row("1,000 arrays of 70 KB in one call, host → worker (`h2w_small_ms`)", "ipc", "h2w_small_ms", "ms",
        docs=("performance",)),
    row("the same, worker → host (`w2h_small_ms`)", "ipc", "w2h_small_ms", "ms", docs=("performance",)),
    row("spawn to first result, no torch (`ready_ms`)", "ipc", "ready_ms", "ms", "bare_ready_ms",
        "`python -c pass`", "-", "≤ +10 ms"),
    row("idle worker RSS over a bare interpreter (`rss_overhead_mib`)", "ipc", "rss_overhead_mib", "MiB",
        target="≤ 5 MiB"),
    row("first node of a torch pack, isolated, prewarmed by the queued prompt", "first_node",
        "first_node_ms.prewarmed", "ms", "first_node_ms.in_process", "in-process", "prewarmed_ratio", "≤ 1.1"),
    row("the same node cold (spawn, torch import, node)", "first_node", "first_node_ms.cold", "ms",
        "first_node_ms.in_process", "in-process", "cold_ratio", docs=("performance",)),
    row("a 3 MiB IMAGE through five torch workers: a node's crossing over in-process (`per_node_ms`)", "spin",
        "modes.default.per_node_ms", "ms", "copy_3m_ms", "torch `copy_` of 3 MiB", "/"),
    row("a later start with two packs whose builds failed", "failed_start", "median_s.failed", "s",
        "median_s.without", "without them", "-", "< +1 s"),
    row("six packs needing builds: ComfyUI's start to its first `/system_stats`", "six_packs", "start_with_s", "s",
        "start_without_s", "without them", "-", "≤ +2 s"),
    row("the same start until every pack's node is in `/object_info` (`make bench-six`)", "six_packs", "ready_s",
        "s", "serial_build_s", "the six built one after another", "/", "side by side"),
    row("the same against the slowest pack alone (its server start to its node) plus the download", "six_packs",
        "ready_s", "s", "slowest_plus_download_s", "slowest alone + download", "/", "about 1"),
    row("the same against six builds in waves of one per CPU (the pool before download streams)", "six_packs", "ready_s", "s",
        "waves_s", "waves of the slowest", "/", "about 1"),
    row("20 isolated numpy-only packs: cold first prompt", "many_packs", "rows.20.cold_first_prompt_ms", "ms",
        "rows.20.single_cold_max_ms", "the slowest single pack's", "rows.20.cold_ratio", "≤ 1.5"),
    row("20 packs cold: the last worker ready, from the queue", "many_packs", "rows.20.cold_workers_ready_ms", "ms",
        "rows.20.single_workers_ready_ms", "a single pack's worker", "rows.20.cold_workers_ready_ratio", "≤ 1.5"),
    row("20 packs: warm overhead per 3 MiB IMAGE crossing over in-process", "many_packs",
        "rows.20.warm_per_crossing_ms", "ms", "rows.20.copy_3m_ms", "3 MiB numpy copy",
        "rows.20.warm_per_crossing_over_copy", "≤ 2 ms"),
    row("a worker whose pack takes and returns no tensor, RSS after its node", "many_packs",
        "rows.20.text_worker_rss_mib", "MiB", target="≤ 40 MiB"),
    row("20 packs: host + workers RSS after `POST /free`", "many_packs", "rows.20.after_free_mib", "MiB",
        "rows.20.n0_host_mib", "the host with no pack", "rows.20.after_free_over_n0", "≤ 1.05"),
    row("`StandIn.loaded_size()` (a seqlocked ledger read and one syscall)", "memory", "standin_loaded_size_ns", "ns",
        target="≤ 1000 ns"),
    row("bytes evicted / bytes asked, upstream's `free_memory` over four 2 GiB worker models", "memory",
        "evict_overshoot_ratio", "", target="≤ 1.1"),
]


# How many of the second unit make one of the first (row's limit_unit).
SCALE = {("ms", "µs"): 1000.0}


def load_results(results=RESULTS):
    out = {}
    for b in BENCHES + ("run",):
        path = os.path.join(results, b + ".json")
        if os.path.exists(path):
            with open(path) as f:
                out[b] = json.load(f)
    return out


def lookup(doc, path):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc if isinstance(doc, (int, float)) and not isinstance(doc, bool) else None


def num(x):
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def with_unit(x, unit):
    return num(x) + (f" {unit}" if unit else "")


def render_row(r, results):
    doc = results.get(r["bench"], {})
    value = lookup(doc, r["value"])
    src = f"`bench/results/{r['bench']}.json`"
    if value is None:
        return f"| {r['figure']} | not measured | | | {r['target']} | {src} |"
    limit = lookup(doc, r["limit"]) if r["limit"] else None
    lim = "" if limit is None else f"{r['limit_label']} {with_unit(limit, r['limit_unit'])}"
    ratio = ""
    if r["ratio"] == "/" and limit:
        scale = 1.0 if r["limit_unit"] == r["unit"] else SCALE[r["unit"], r["limit_unit"]]
        ratio = num(value * scale / limit)
    elif r["ratio"] == "-" and limit is not None:
        d = value - limit
        ratio = ("+" if d >= 0 else "−") + with_unit(abs(d), r["unit"])
    elif r["ratio"] not in (None, "/", "-"):
        x = lookup(doc, r["ratio"])
        ratio = "" if x is None else num(x)
    return f"| {r['figure']} | {with_unit(value, r['unit'])} | {lim} | {ratio} | {r['target']} | {src} |"


def run_line(results):
    run = results.get("run")
    if not run:
        return "Measured: no run recorded (bench/results/run.json is missing; `make bench-save` writes it)."
    runs = {}
    for name in BENCHES:
        b = run["benches"].get(name)
        if b:
            runs.setdefault(b["commit"], []).append(f"{name} {b['date']}")
    said = "; ".join(f"at {commit}: {', '.join(names)}" for commit, names in runs.items())
    return (f"Written by `make bench-tables` (bench/tables.py) from `make bench` runs on {run['machine']}: "
            f"{said}. Each ratio is to the limit measured in the same run.")


def render(name, results):
    lines = [run_line(results), "",
             "| figure | measured | limit (same run) | ratio | target | from |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [render_row(r, results) for r in ROWS if name in r["docs"]]
    return "\n".join(lines)


def markers(name):
    return (f"<!-- bench-table:{name} begin: written by bench/tables.py from bench/results/*.json; "
            "do not edit by hand -->", f"<!-- bench-table:{name} end -->")


def between(text, name):
    """(before, inside, after) of the marked table in text, or None."""
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        return None
    return text[:i + len(begin)], text[i + len(begin):j], text[j:]


def write(name, path, results, check=False):
    with open(path) as f:
        text = f.read()
    parts = between(text, name)
    if parts is None:
        begin, end = markers(name)
        raise SystemExit(f"tables.py: {path} has no table markers; put these two lines where its table "
                         f"goes:\n{begin}\n{end}")
    want = "\n" + render(name, results) + "\n"
    if check:
        return parts[1] == want
    if parts[1] != want:
        with open(path, "w") as f:
            f.write(parts[0] + want + parts[2])
    return True


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({model or platform.processor() or 'unknown'}), {platform.machine()}, "
            f"Linux {platform.release()}, host CPython {platform.python_version()}")


def save(src, commit=None):
    """Copies src's bench JSON into bench/results and records, for each,
    the date it was written and the commit it measured (commit, or this
    checkout's HEAD); benches not in src keep what run.json said, and so
    does one whose JSON there is the one saved already (an opt-in bench
    such as six_packs left in build/bench by an earlier run: its commit
    is the one it measured, not this HEAD)."""
    os.makedirs(RESULTS, exist_ok=True)
    found, copied = [], []
    for b in BENCHES:
        path = os.path.join(src, b + ".json")
        if not os.path.exists(path):
            continue
        found.append(b)
        dst = os.path.join(RESULTS, b + ".json")
        if os.path.exists(dst) and filecmp.cmp(path, dst, shallow=False):
            continue
        shutil.copyfile(path, dst)
        copied.append(b)
    if not found:
        raise SystemExit(f"tables.py: no bench JSON in {src} (run `make bench` first)")
    commit = commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=10", "HEAD"],
                                      capture_output=True, text=True).stdout.strip() or "unknown"
    path = os.path.join(RESULTS, "run.json")
    run = {"benches": {}}
    if os.path.exists(path):
        with open(path) as f:
            run = json.load(f)
    run["machine"] = machine()
    for b in copied:  # the date the bench wrote its JSON
        when = datetime.datetime.fromtimestamp(os.path.getmtime(os.path.join(src, b + ".json")),
                                               datetime.timezone.utc)
        run["benches"][b] = {"date": when.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit}
    with open(path, "w") as f:
        json.dump(run, f, indent=2)
        f.write("\n")
    return copied


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", metavar="DIR", help="copy DIR's bench JSON (a `make bench` run) into bench/results first")
    ap.add_argument("--commit", help="with --save: the commit the run measured (default: this checkout's HEAD)")
    ap.add_argument("--check", action="store_true", help="only check the tables; exit 1 where one differs")
    args = ap.parse_args(argv)
    if args.save:
        print(f"saved {', '.join(save(args.save, args.commit)) or 'nothing new'} into {RESULTS}")
    results = load_results()
    stale = [path for name, path in DOCS.items() if not write(name, path, results, check=args.check)]
    if stale:
        print("tables.py: out of date with bench/results: " + ", ".join(stale) + " (run `make bench-tables`)")
        return 1
    print("tables " + ("match" if args.check else "written from") + " bench/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
