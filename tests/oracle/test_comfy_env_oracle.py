"""comfy-env as an oracle (opt in: ``make comfy-env-oracle``): every
release PyPI serves, installed under build/comfy-env-oracle
(comfy_env_releases.py), reads a corpus of configs with its own reader,
and bulkhead reads the same files; a difference in a use (comfy_env_oracle:
the release that would have read the file) that docs/comfy-env-differences.toml
does not list fails.  And every public name a release exports imports
under bulkhead's routed ``comfy_env`` -- with no comfy-env installed, and
with that release installed beside bulkhead -- served, or refused by a
callable naming releases that include this one.

Where BULKHEAD_COMFY_ENV_GIT names a clone of comfy-env's history, the
releases PyPI no longer serves are read too (0.0.1-0.2.83, from their
tags or the commits that set their versions).  The corpus is the repo's
fixtures (each compared with every release that reads its shape: 0.0.x's
for a 0.0.x file, the others for the rest), plus the folder
BULKHEAD_CONFIG_CORPUS names (public packs' configs fetched from their
histories, kept outside the repo).  The numbers (configs, releases, uses the same / different /
listed, and the whole matrix) are printed and kept in
build/comfy-env-oracle/report.json.
"""

import collections
import hashlib
import json
import os
import shutil
import sys

import pytest
from packaging.specifiers import SpecifierSet

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_env_oracle as oracle      # noqa: E402
import comfy_env_releases as rel       # noqa: E402


@pytest.fixture(scope="module")
def releases():
    """{version: folder} for every release PyPI serves that installs here,
    and {version: why not} for the others."""
    try:
        got = rel.install_all()
    except (OSError, RuntimeError) as e:
        pytest.skip(f"comfy-env's releases could not be listed or fetched from PyPI: {e}")
    ok = {v: d for v, (d, why) in got.items() if d}
    bad = {v: why for v, (d, why) in got.items() if not d}
    print(f"\ncomfy-env releases PyPI serves: {len(got)}; installed: {len(ok)}; not installable: {len(bad)}")
    for v, why in bad.items():
        print(f"  comfy-env {v}: not installable: {why}")
    return ok, bad


def upload_dates():
    with open(os.path.join(rel.ROOT, "pypi.json")) as f:
        data = json.load(f)
    return {v: min(x["upload_time_iso_8601"] for x in files)[:19] for v, files in data["releases"].items() if files}


def _place(tmp, path, i):
    """The file at path copied where both readers take its role from: a
    pack's root file, or the environment file of its nodes/."""
    role = oracle.role_of(path)
    d = os.path.join(str(tmp), "c%04d" % i, "ComfyUI-Oracle")
    dest = os.path.join(d, "comfy-env-root.toml") if role == "root" else os.path.join(d, "nodes", "comfy-env.toml")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(path, dest)
    return dest, role


def test_configs_resolve_as_the_release_that_read_them(tmp_path, releases, monkeypatch):
    ok, _bad = releases
    ok = dict(ok)
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "bh-home"))
    # 0.0.x's {var}s: the torch and CUDA its reader is told it detected
    monkeypatch.setenv("BULKHEAD_TORCH_VERSION", "2.8.0+cu128")
    monkeypatch.setenv("BULKHEAD_CUDA_VERSION", "12.8")
    dates = upload_dates()
    history = os.environ.get("BULKHEAD_COMFY_ENV_GIT")
    from_git = {}
    if history:
        # the releases PyPI no longer serves, from the tags of comfy-env's history
        from_git = rel.git_releases(history, set(ok))
        for v, (d, date) in from_git.items():
            ok[v], dates[v] = d, date
    served = sorted(ok, key=rel.version_key)
    # distinct configs (role and text), each with the uses it has
    distinct = {}       # digest -> {"path", "role", "sources": [...], "uses": set(), "why_not": [...]}
    for p in oracle.fixture_configs():
        digest = hashlib.sha256((oracle.role_of(p) + open(p, "rb").read().decode("utf-8", "replace")).encode()).hexdigest()
        e = distinct.setdefault(digest, {"src": p, "sources": [], "uses": set(), "why_not": [], "fixture": True})
        e["sources"].append(os.path.relpath(p, oracle.REPO))
        e["uses"] |= {"*"}
    corpus = os.environ.get("BULKHEAD_CONFIG_CORPUS")
    n_corpus_files = 0
    if corpus:
        assert os.path.isdir(corpus), f"BULKHEAD_CONFIG_CORPUS={corpus}: not a folder; name one holding configs"
        for p, meta in oracle.corpus_configs(corpus):
            n_corpus_files += 1
            digest = hashlib.sha256((oracle.role_of(p) + open(p, "rb").read().decode("utf-8", "replace")).encode()).hexdigest()
            e = distinct.setdefault(digest, {"src": p, "sources": [], "uses": set(), "why_not": [], "fixture": False})
            e["sources"].append(f"{meta.get('repo', '?')}@{meta.get('commit', '?')[:10]}:{meta.get('path', p)}")
            v, why = oracle.release_in_use(meta, set(served), dates, rel.version_key)
            if v:
                e["uses"].add(v)
            else:
                e["why_not"].append(why)
            if oracle.shape_of(p) == "d1":
                # and the last release that read its shape, at that commit
                d1 = {x for x in served if SpecifierSet(oracle.D1_RELEASES).contains(x, prereleases=True)}
                v, _ = oracle.release_in_use(dict(meta, comfy_env=""), d1, dates, rel.version_key)
                if v:
                    e["uses"].add(v)
    placed = {}
    for i, (digest, e) in enumerate(sorted(distinct.items())):
        placed[digest] = _place(tmp_path, e["src"], i)
    paths = [placed[d][0] for d in sorted(distinct)]
    deps = rel.deps_dir()
    answers = {}
    unread = {}
    for v in list(served):
        try:
            answers[v] = oracle.run_release(ok[v], deps, paths)
        except RuntimeError as e:     # a reader of the history that does not run here: said, not compared
            unread[v] = str(e)[-300:]
            served.remove(v)
    bh = {d: oracle.bulkhead_view(placed[d][0], placed[d][1]) for d in distinct}
    shapes = {d: oracle.shape_of(placed[d][0]) for d in distinct}
    texts = {}
    for d in distinct:
        with open(placed[d][0], encoding="utf-8", errors="replace") as f:
            texts[d] = f.read()
    entries = oracle.load_listed()

    counts = {"fixtures": collections.Counter(), "corpus": collections.Counter()}
    matrix = collections.Counter()
    unlisted = []
    listed_by = collections.Counter()
    report = []
    for d, e in sorted(distinct.items()):
        path, role = placed[d]
        uses = set(e["uses"])
        kind = counts["fixtures" if e["fixture"] else "corpus"]
        kind["configs"] += 1
        for v in served:
            rv = oracle.release_view(answers[v][path], role)
            d1 = SpecifierSet(oracle.D1_RELEASES).contains(v, prereleases=True)
            diffs = oracle.differences(rv, oracle.merged_view(bh[d]) if d1 else bh[d], role)
            accepted = rv.get("refused") is None
            matrix["read" if accepted else "refused by the release"] += 1
            if accepted:
                matrix["same" if not diffs else "different"] += 1
            # a fixture: every release that reads its shape
            in_use = v in uses or ("*" in uses and accepted and d1 == (shapes[d] == "d1"))
            if not in_use:
                continue
            if not accepted and "*" not in uses:
                kind["refused by the release in use" + (", and by bulkhead" if bh[d].get("refused") else "")] += 1
                report.append(dict(config=e["sources"][0], release=v, refused_by_release=rv["refused"],
                                   bulkhead=bh[d]))
                continue
            kinds = []
            for diff in diffs:
                entry = oracle.listed(diff, v, role, entries, shapes[d], texts[d])
                if entry is None:
                    unlisted.append((e["sources"][0], v, role, diff))
                    kinds.append("unlisted")
                else:
                    listed_by[entry["row"]] += 1
                    kinds.append("listed")
            kind["uses"] += 1
            kind["same" if not diffs else ("different, unlisted" if "unlisted" in kinds else "different, listed")] += 1
            report.append(dict(config=e["sources"][0], release=v, differences=diffs))
        if not (uses & set(served)) and "*" not in uses:
            why = e["why_not"][0] if e["why_not"] else "no release reads it"
            kind["configs not compared: " + ("pinned a release not here" if why.startswith("pinned")
                                             else why)] += 1
    summary = {
        "releases served": len(served) - len(from_git) + len(_bad), "releases installed": len(served) - len(from_git),
        "releases from comfy-env's git history (not on PyPI)": len(from_git),
        "distinct configs": len(distinct), "fixture configs": sum(1 for e in distinct.values() if e["fixture"]),
        "corpus files": n_corpus_files, "fixtures": dict(counts["fixtures"]), "corpus": dict(counts["corpus"]), "listed differences by row": dict(listed_by),
        "matrix (every release x every config)": dict(matrix),
        "releases whose reader does not run here": unread,
    }
    with open(os.path.join(rel.ROOT, "report.json"), "w") as f:
        json.dump(dict(summary=summary, uses=report), f, indent=1, default=list)
    print(json.dumps(summary, indent=1))
    lines = []
    for src, v, role, diff in unlisted[:40]:
        lines.append(f"  {src} under comfy-env {v} ({role} file): {diff['field']}: release {diff['release']!r}, "
                     f"bulkhead {diff['bulkhead']!r}")
    assert not unlisted, (
        f"{len(unlisted)} difference(s) between comfy-env's own reader and bulkhead's are not listed in "
        f"{os.path.relpath(oracle.DIFFERENCES, oracle.REPO)}; fix bulkhead's reader, or list each with the row of "
        f"docs/comfy-env-dialects.md that gives its reason:\n" + "\n".join(lines))


def test_every_name_a_release_exports_imports_under_bulkhead(releases):
    from bulkhead.host import comfy_env_legacy as legacy
    ok, _bad = releases
    ok = dict(ok)
    history = os.environ.get("BULKHEAD_COMFY_ENV_GIT")
    if history:
        ok.update({v: d for v, (d, _) in rel.git_releases(history, set(ok)).items()
                   if os.path.isfile(os.path.join(d, "comfy_env", "__init__.py"))})
    by_release = {v: oracle.exported(d) for v, d in ok.items()}
    signposts = {v: oracle.exported(d, ("_INTERNAL",)) for v, d in ok.items()}
    everything = set().union(*by_release.values(), *signposts.values())
    problems = []
    bare = oracle.routed_names(everything)
    for v in sorted(ok, key=rel.version_key):
        beside = oracle.routed_names(by_release[v] | signposts[v], real=[ok[v], rel.deps_dir()])
        for n in sorted(signposts[v] - by_release[v]):
            # a name this release no longer exported: a pack of an older one imports it
            for how, got in (("without comfy-env", bare[n]), (f"with comfy-env {v} installed", beside[n])):
                if got not in ("served", "refused"):
                    problems.append(f"comfy-env {v} signposts {n} (exported before); `from comfy_env import {n}` "
                                    f"{how}: {got}")
        for n in sorted(by_release[v]):
            for how, got in (("without comfy-env", bare[n]), (f"with comfy-env {v} installed", beside[n])):
                if got not in ("served", "refused"):
                    problems.append(f"comfy-env {v} exports {n}; `from comfy_env import {n}` {how}: {got}")
            if bare[n] == "refused" and not oracle.covers(legacy.NAMES.get(n, "0.0.0"), v, rel.version_key):
                problems.append(f"comfy-env {v} exports {n}; bulkhead refuses it naming releases "
                                f"{legacy.NAMES.get(n)!r}, which leave {v} out (comfy_env_legacy.NAMES)")
            if n not in legacy.NAMES and n not in ("register_nodes",):
                problems.append(f"comfy-env {v} exports {n}, which comfy_env_legacy.NAMES does not list")
    print(f"\npublic names: {len(everything)} over {len(ok)} releases "
          f"({len(set().union(*by_release.values()))} in an __all__)")
    assert not problems, "\n".join(sorted(set(problems))[:60])
