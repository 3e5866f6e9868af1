"""The tables of measured figures in README.md and docs/performance.md are
bench/tables.py's rendering of the bench JSON committed in bench/results,
not typed: each marked table must be exactly what the script writes from
that JSON (a bench not committed shows as "not measured"), run.json must
describe the JSON that is there, and a figure changed in the JSON must
change the table (so the table is read from it)."""

import copy
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tables():
    spec = importlib.util.spec_from_file_location("bench_tables", os.path.join(ROOT, "bench", "tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_and_performance_tables_are_the_committed_json_rendered():
    tables = _tables()
    results = tables.load_results()
    assert "run" in results, "bench/results/run.json is missing: run `make bench` then `make bench-save`"
    for name, path in tables.DOCS.items():
        with open(path) as f:
            parts = tables.between(f.read(), name)
        assert parts is not None, f"{path} lost its bench-table:{name} markers"
        assert parts[1] == "\n" + tables.render(name, results) + "\n", (
            f"{path}'s table differs from bench/results: run `make bench-tables` (never edit it by hand)")
    # the run named above the table is the run of the JSON committed
    saved = {b for b in tables.BENCHES if b in results}
    assert saved == set(results["run"]["benches"]), "bench/results/run.json names other runs than the JSON there"


def test_a_figure_changed_in_the_json_changes_the_table():
    tables = _tables()
    results = tables.load_results()
    changed = copy.deepcopy(results)
    changed["ipc"]["h2w_64m_ms"] = results["ipc"]["h2w_64m_ms"] * 3 + 1
    assert tables.render("readme", changed) != tables.render("readme", results)


def test_a_row_in_ms_against_a_limit_in_us_is_converted():
    """A 64 MiB return (ms) set against a round trip (µs): the limit is
    shown in its own unit and the ratio is of like units."""
    tables = _tables()
    [r] = [x for x in tables.ROWS if x["value"] == "back_w2h_64m_ms" and x["limit"] == "pingpong_same_cpu_us"]
    line = tables.render_row(r, {"ipc": {"back_w2h_64m_ms": 0.05, "pingpong_same_cpu_us": 8.0}})
    assert "8.00 µs" in line and "| 6.25 |" in line, line


def test_save_keeps_the_commit_of_a_bench_json_it_has_already(tmp_path, monkeypatch):
    """`--save build/bench` after a `make bench` that left an older opt-in
    bench's JSON there (six_packs, from an earlier run): that bench keeps
    the commit and date it was saved with; the benches run anew take
    this HEAD."""
    tables = _tables()
    results, src = tmp_path / "results", tmp_path / "run"
    results.mkdir()
    src.mkdir()
    monkeypatch.setattr(tables, "RESULTS", str(results))
    (results / "six_packs.json").write_text('{"start_with_s": 1.5}\n')
    (results / "run.json").write_text(
        '{"benches": {"six_packs": {"date": "2026-12-01 09:00 UTC", "commit": "0ld"}}}\n')
    (src / "six_packs.json").write_text('{"start_with_s": 1.5}\n')   # the same run's JSON
    (src / "ipc.json").write_text('{"h2w_64m_ms": 3.0}\n')            # a new run
    assert tables.save(str(src), commit="n3w") == ["ipc"]
    import json
    run = json.loads((results / "run.json").read_text())
    assert run["benches"]["six_packs"] == {"date": "2026-12-01 09:00 UTC", "commit": "0ld"}
    assert run["benches"]["ipc"]["commit"] == "n3w"
    assert (results / "ipc.json").read_text() == '{"h2w_64m_ms": 3.0}\n'
