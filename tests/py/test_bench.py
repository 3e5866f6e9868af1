"""`make bench`'s IPC report (bench/ipc.py), run small: it must keep
writing every key the foundation issue names, with ratios that are the
ratios of its own figures.  No figure is judged here (timings are the
bench's business, not a test's)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
PINGPONG = os.path.join(BUILD, "bench", "pingpong")

pytestmark = pytest.mark.skipif(not os.path.exists(PINGPONG), reason=f"no {PINGPONG} (build first)")

KEYS = ["call_median_us", "pingpong_median_us", "call_ratio", "h2w_64m_ms", "w2h_64m_ms", "echo_64m_ms",
        "memcpy_64m_ms", "h2w_ratio", "w2h_ratio", "ready_ms", "bare_ready_ms", "rss_overhead_mib",
        # #26: a tensor crossing again, copied or by reference
        "same_h2w_64m_ms", "cached_w2h_64m_ms", "back_h2w_64m_ms", "back_w2h_64m_ms",
        "same_h2w_ratio", "cached_w2h_ratio", "back_h2w_ratio", "back_w2h_ratio",
        # #26: pack A's output into pack B's worker, against one torch copy_
        "copy_64m_ms", "a2b_64m_ms", "a2b_copy_ratio"]
# #40: a new torch tensor crossing each way, quiet and loaded, with limits
NEW_TENSOR_KEYS = ["new_h2w_torch_sum_ms", "copy_sum_64m_ms", "new_h2w_torch_sum_ratio", "new_w2h_torch_ms",
                   "new_w2h_torch_copy_ratio"]
# #40: the zero-copy paths against their limits (a round trip; the receiver's own work), torch's
ZERO_COPY_TORCH_KEYS = ["back_w2h_torch_64m_ms", "w_sum_64m_ms", "same_h2w_torch_sum_ms", "back_h2w_torch_sum_ms",
                        "b_sum_64m_ms", "cached_w2h_torch_rt_ratio", "back_w2h_torch_rt_ratio",
                        "same_h2w_torch_sum_ratio", "back_h2w_torch_sum_ratio", "a2b_torch_sum_own_ratio"]
LAYERS = ["pingpong_same_cpu_us", "pipe_same_cpu_us", "core_same_cpu_us", "binding_same_cpu_us",
          "chan_same_cpu_us", "call_same_cpu_us"]


def _transfer_warm_calls():
    """bench/ipc.py's time_transfer's warm-up calls (its ``warm``
    default), read from its source."""
    import ast
    with open(os.path.join(ROOT, "bench", "ipc.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "time_transfer"]
    names = [a.arg for a in fn.args.args]
    return fn.args.defaults[names.index("warm") - (len(names) - len(fn.args.defaults))].value


def test_ipc_bench_writes_every_named_key(tmp_path):
    out = tmp_path / "ipc.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ipc.py"), "--pingpong", PINGPONG,
                          "--out", str(out), "--calls", "200", "--reps", "2", "--starts", "2", "--rounds", "2"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    for key in KEYS + LAYERS:
        assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r.get(key))
    assert r["call_ratio"] == pytest.approx(r["call_median_us"] / r["pingpong_median_us"])
    assert r["call_ratio_same_cpu"] == pytest.approx(r["call_same_cpu_us"] / r["pingpong_same_cpu_us"])
    assert r["h2w_ratio"] == pytest.approx(r["h2w_64m_ms"] / r["memcpy_64m_ms"])
    assert r["back_h2w_ratio"] == pytest.approx(r["back_h2w_64m_ms"] / r["memcpy_64m_ms"])
    # #40: a return against the raw same-CPU round trip (ms over µs)
    assert r["back_w2h_rt_ratio"] == pytest.approx(r["back_w2h_64m_ms"] * 1e3 / r["pingpong_same_cpu_us"])
    assert r["targets"]["back_w2h_rt_ratio"] == (r["back_w2h_rt_ratio"] <= 5)
    assert r["a2b_copy_ratio"] == pytest.approx(r["a2b_64m_ms"] / r["copy_64m_ms"])
    # #40 (9ee6867): each new numpy output of A is copied by the host into a block for B, one per call
    # (time_transfer's warm-up calls and the --reps timed ones); a torch tensor A keeps is forwarded: none
    assert r["a2b_host_blocks"] == _transfer_warm_calls() + 2
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        for key in NEW_TENSOR_KEYS + ["loaded_" + k for k in NEW_TENSOR_KEYS] + ["loaded_copy_64m_ms"]:
            assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r.get(key))
        assert r["new_h2w_torch_sum_ratio"] == pytest.approx(r["new_h2w_torch_sum_ms"] / r["copy_sum_64m_ms"])
        assert r["loaded_new_w2h_torch_copy_ratio"] == pytest.approx(r["loaded_new_w2h_torch_ms"]
                                                                      / r["loaded_copy_64m_ms"])
        for key in ZERO_COPY_TORCH_KEYS:
            assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r.get(key))
        assert r["cached_w2h_torch_rt_ratio"] == pytest.approx(r["cached_w2h_torch_64m_ms"] * 1e3
                                                               / r["pingpong_same_cpu_us"])
        assert r["back_w2h_torch_rt_ratio"] == pytest.approx(r["back_w2h_torch_64m_ms"] * 1e3
                                                             / r["pingpong_same_cpu_us"])
        for key in ("same_h2w_torch_sum", "back_h2w_torch_sum"):
            assert r[key + "_ratio"] == pytest.approx(r[key + "_ms"] / r["w_sum_64m_ms"])
        assert r["a2b_torch_sum_own_ratio"] == pytest.approx(r["a2b_torch_sum_ms"] / r["b_sum_64m_ms"])
        # each against its own limit: <= 5 round trips for a return, <= 1.5x the receiver's work otherwise
        for key, limit in (("cached_w2h_torch_rt_ratio", 5), ("back_w2h_torch_rt_ratio", 5),
                           ("same_h2w_torch_sum_ratio", 1.5), ("back_h2w_torch_sum_ratio", 1.5),
                           ("a2b_torch_sum_own_ratio", 1.5)):
            assert r["targets"][key] == (r[key] <= limit), key
        assert "a2b_torch_sum_ratio" not in r["targets"]  # against the host's sum: informational
    else:
        assert all(r.get(key) is None for key in ZERO_COPY_TORCH_KEYS)
        assert all(r["targets"][key] is None for key in ZERO_COPY_TORCH_KEYS if key.endswith("_ratio"))
    assert len(r["rounds"]) == 2 and all("call_ratio_same_cpu" in x for x in r["rounds"])
    assert set(r["targets"]) >= {"call_ratio", "h2w_ratio", "w2h_ratio", "ready_ms", "rss_overhead_mib"}
    assert "call_ratio_same_cpu" in run.stdout  # the table was printed


@pytest.mark.torch
def test_first_node_bench_writes_its_figures(tmp_path):
    """bench/first_node.py, one round: cold, prewarmed and in-process
    first-node times of an isolated torch pack, and the ratio."""
    out = tmp_path / "first_node.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "first_node.py"), "--out", str(out),
                          "--rounds", "1"], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    ms = r["first_node_ms"]
    assert set(ms) == {"in_process", "cold", "prewarmed"} and all(v > 0 for v in ms.values())
    assert r["prewarmed_ratio"] == pytest.approx(ms["prewarmed"] / ms["in_process"])
    assert r["targets"]["prewarmed_ratio"]["limit"] == 1.1 and len(r["rounds"]) == 1
    assert "prewarmed" in run.stdout


def test_spin_bench_writes_its_figures(tmp_path):
    """bench/spin.py (the workers' OpenMP spin, #26), one round: every mode
    has every figure, and its ratios are the ratios of its figures."""
    pytest.importorskip("torch")
    out = tmp_path / "spin.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "spin.py"), "--out", str(out),
                          "--rounds", "1", "--chain", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    assert set(r["modes"]) == {"bulkhead", "default", "passive"} and (r["chain"], r["rounds"]) == (2, 1)
    assert 0 < int(r["spin_env"]["GOMP_SPINCOUNT"]) < 300_000 and r["relax_ns"] > 0
    for mode, m in r["modes"].items():
        for key in ("chain_ms", "chain_blas_ms", "h2w_64m_ms", "elementwise", "matmul", "conv", "gaps_50us",
                    "blas_50us"):
            assert m[key] > 0, (mode, key)
        # per node: over the workers the chain had (--chain), not over a number of the test's own
        assert m["per_node_ms"] == pytest.approx((m["chain_ms"] - r["in_process_chain_ms"]) / r["chain"])
        assert m["per_node_blas_ms"] == pytest.approx(
            (m["chain_blas_ms"] - r["in_process_chain_blas_ms"]) / r["chain"])
        assert m["h2w_over_copy"] == pytest.approx(m["h2w_64m_ms"] / r["copy_64m_ms"])
        assert m["compute_over_default"]["conv"] == pytest.approx(m["conv"] / r["modes"]["default"]["conv"])


def test_sandbox_bench_writes_its_figures(tmp_path):
    """bench/sandbox.py (#38), a few rounds: the plan, the restriction in
    a forked child and a sandboxed spawn's extra, each a time."""
    out = tmp_path / "sandbox.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sandbox.py"), "--out", str(out),
                          "--rounds", "5"], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    assert r["plan_ms"] > 0 and r["rules"] > 0 and r["target_ms"] == 1.0
    if r["abi"] > 0:
        assert r["apply_ms"] > 0 and isinstance(r["spawn_extra_ms"], float)
