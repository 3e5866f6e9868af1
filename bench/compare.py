"""Every bench run on two builds of bulkhead, alternately, round after
round: what a change did to each figure.

    python bench/compare.py --base fbd0e87 [--head WORKTREE|<rev>] [--rounds 4] \
        [--bench ipc,first_node] [--out build/bench-compare/<base>-<head>-<UTC time>.json]

(`make bench-compare BASE=<rev>` runs it.)  The base revision is checked out
beside the working tree (`git worktree add --detach` under
build/bench-compare/trees/<commit>) and built in its own meson build
directory there, with the main .venv's meson and ninja; the benches of both
trees run under the main .venv's Python and the same worker venvs.  The
head is the working tree as it stands (build/rel, built first) unless
--head names a revision, which is checked out and built like the base.

Each tree runs its own bench scripts (a figure a tree's bench does not
write is shown for the other alone), or with --scripts head both run the
head's, so a figure added with the change is measured on the base too.  In a round every bench runs for both
trees back to back, the order of the trees swapped every round, so a figure
is never compared with one taken minutes apart on a machine whose speed
drifts.  Per figure it prints the median over the rounds for each tree,
their ratio (head / base: below 1 is faster or smaller for a time), and
each tree's spread (lowest-highest over the rounds); every run's JSON is
kept under the --out file's directory, and the summary in --out.  The load
average at each round's start is printed and kept: on a loaded machine a
ratio whose spreads overlap says nothing.

The exit status is 0 whatever the figures (this is a report); nonzero only
when a tree could not be built or a bench failed to run.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv")
VPY = os.path.join(VENV, "bin", "python")

# What `make bench` runs, per bench: its script and arguments, with {build}
# the tree's meson build directory.  QUICK are the arguments that keep a
# round within a minute or so; --full drops them.
BENCHES = {
    "ipc": (["--pingpong", "{build}/bench/pingpong"],
            ["--calls", "5000", "--reps", "9", "--starts", "7", "--rounds", "3"]),
    "first_node": ([], ["--rounds", "3"]),
    "memory": (["--pingpong", "{build}/bench/pingpong",
                "--fake-nvml", "{build}/tests/c/fake_nvml/libnvidia-ml.so.1"], []),
    "spin": ([], []),
    "failed_start": ([], []),
    "many_packs": ([], []),
}
DEFAULT_BENCHES = "ipc,first_node"
# Keys that are not figures.
NOT_FIGURES = {"rounds", "targets", "worker_pool", "samples", "spin_env", "cpus", "cpus_allowed", "date", "bench_seconds", "small_count", "small_bytes"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare against (a commit, tag, branch)")
    ap.add_argument("--head", default="WORKTREE",
                    help="WORKTREE (default: the working tree, build/rel) or a revision to check out and build")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each running every bench for both trees")
    ap.add_argument("--bench", default=DEFAULT_BENCHES,
                    help=f"comma-separated, of {', '.join(BENCHES)} (default {DEFAULT_BENCHES})")
    ap.add_argument("--scripts", choices=("own", "head"), default="own",
                    help="own: each tree runs its own bench scripts; head: both run the head's (a figure "
                         "the base's scripts do not measure yet, measured on the base's build too)")
    ap.add_argument("--full", action="store_true", help="the benches' own default sizes, not the quick ones")
    ap.add_argument("--out", help="the summary JSON (default build/bench-compare/<base>-<head>-<UTC time>.json)")
    args = ap.parse_args(argv)
    args.bench = [b for b in args.bench.split(",") if b]
    unknown = [b for b in args.bench if b not in BENCHES]
    if unknown:
        ap.error(f"unknown bench {', '.join(unknown)}: pick from {', '.join(BENCHES)}")
    return args


def git(*argv):
    return subprocess.run(["git", "-C", ROOT, *argv], check=True, capture_output=True, text=True).stdout.strip()


def checkout(rev):
    """The source tree of `rev`, a detached worktree under build/ (made once
    per commit), built in its own build/rel.  Returns (commit, tree, build)."""
    commit = git("rev-parse", "--verify", rev + "^{commit}")
    tree = os.path.join(ROOT, "build", "bench-compare", "trees", commit[:12])
    if not os.path.exists(os.path.join(tree, ".git")):
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        git("worktree", "add", "--detach", tree, commit)
    build = os.path.join(tree, "build", "rel")
    ninja = os.path.join(VENV, "bin", "ninja")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        subprocess.run([os.path.join(VENV, "bin", "meson"), "setup", build, "-Dbuildtype=release",
                        "-Dtesting=true"], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([ninja, "-C", build], check=True, stdout=subprocess.DEVNULL)
    return commit, tree, build


def working_tree():
    build = os.path.join(ROOT, "build", "rel")
    subprocess.run([os.path.join(VENV, "bin", "ninja"), "-C", build], check=True, stdout=subprocess.DEVNULL)
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return git("rev-parse", "HEAD") + ("+dirty" if dirty else ""), ROOT, build


def run_bench(name, tree, build, out, full, scripts=None):
    args, quick = BENCHES[name]
    argv = [VPY, os.path.join(scripts or tree, "bench", name + ".py")] + [a.format(build=build) for a in args]
    argv += ([] if full else quick) + ["--out", out]
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), BULKHEAD_BUILD=build,
               PATH=os.path.join(VENV, "bin") + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("BULKHEAD_WORKER_VENVS", os.path.join(ROOT, "build", "venvs"))
    t0 = time.monotonic()
    run = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
        raise SystemExit(f"compare.py: bench {name} failed in {tree} (exit {run.returncode}); "
                         f"run it alone there to see why: {' '.join(argv)}")
    with open(out) as f:
        return json.load(f), time.monotonic() - t0


def figures(report, prefix=""):
    """The numeric figures of a bench's JSON, nested ones as a.b."""
    out = {}
    for k, v in report.items():
        if k in NOT_FIGURES:
            continue
        if isinstance(v, dict):
            out.update(figures(v, prefix + k + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


def fmt(x):
    if x is None:
        return "-"
    a = abs(x)
    return f"{x:.4g}" if a < 1000 else f"{x:.0f}"


def summarize(samples):
    """{bench: {figure: {tree: [values]}}} -> rows with medians, ratio, spreads."""
    rows = []
    for bench, figs in samples.items():
        for fig in sorted(figs):
            per = figs[fig]
            med = {t: statistics.median(v) if v else None for t, v in per.items()}
            spread = {t: [min(v), max(v)] if v else None for t, v in per.items()}
            b, h = med.get("base"), med.get("head")
            rows.append({"bench": bench, "figure": fig, "base_median": b, "head_median": h,
                         "ratio": (h / b if b and h is not None else None),
                         "base_spread": spread.get("base"), "head_spread": spread.get("head"),
                         "base_n": len(per.get("base", [])), "head_n": len(per.get("head", []))})
    return rows


def table(rows):
    lines = [f"{'figure':<44}{'base':>11}{'head':>11}{'head/base':>11}   base spread          head spread",
             "-" * 118]
    for r in rows:
        def sp(s):
            return "-" if s is None else f"{fmt(s[0])}-{fmt(s[1])}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"{r['bench'] + ':' + r['figure']:<44}{fmt(r['base_median']):>11}{fmt(r['head_median']):>11}"
                     f"{ratio:>11}   {sp(r['base_spread']):<20} {sp(r['head_spread'])}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    base = checkout(args.base)
    head = working_tree() if args.head == "WORKTREE" else checkout(args.head)
    trees = {"base": base, "head": head}
    # When, too: a second run on the same pair keeps the first's.
    name = f"{base[0][:10]}-{head[0][:10]}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    out = os.path.abspath(args.out or os.path.join(ROOT, "build", "bench-compare", name + ".json"))
    runs_dir = os.path.splitext(out)[0] + ".runs"
    os.makedirs(runs_dir, exist_ok=True)
    print(f"base {base[0]} ({base[1]})\nhead {head[0]} ({head[1]})\n"
          f"{args.rounds} rounds of {', '.join(args.bench)}, the trees' order swapped every round", flush=True)

    samples = {b: {} for b in args.bench}
    loads = []
    for rnd in range(args.rounds):
        order = ("head", "base") if rnd % 2 == 0 else ("base", "head")
        loads.append(os.getloadavg()[0])
        print(f"round {rnd + 1}/{args.rounds} (load {loads[-1]:.2f}): {' then '.join(order)}", flush=True)
        for bench in args.bench:
            for t in order:
                _, tree, build = trees[t]
                report, secs = run_bench(bench, tree, build, os.path.join(runs_dir, f"{bench}-{t}-{rnd}.json"),
                                         args.full, head[1] if args.scripts == "head" else None)
                print(f"  {bench} {t}: {secs:.0f} s", flush=True)
                for fig, v in figures(report).items():
                    samples[bench].setdefault(fig, {"base": [], "head": []})[t].append(v)

    rows = summarize(samples)
    print()
    print(table(rows))
    print(f"\nmedians over {args.rounds} rounds; load average at each round's start: "
          + ", ".join(f"{x:.2f}" for x in loads))
    summary = {"base": base[0], "head": head[0], "benches": args.bench, "rounds": args.rounds,
               "scripts": args.scripts,
               "full": args.full, "loadavg_at_rounds": loads, "figures": rows,
               "cpus": os.cpu_count(), "machine": platform.machine(), "host_python": platform.python_version(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(f"wrote {out} (every run's JSON under {runs_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
