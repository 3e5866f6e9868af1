"""docs/comfy-env-differences.toml, the differences the comfy-env oracle
(tests/oracle, ``make comfy-env-oracle``) lets pass: it parses, each entry
names only keys and fields the oracle has, a release specifier and
patterns that read, and the row of docs/comfy-env-dialects.md that gives
its reason; and an entry lists only what it says (its field, its
releases).  The oracle itself is opt in: it installs every comfy-env
release from PyPI."""

import os
import re
import sys

import pytest
from packaging.specifiers import SpecifierSet

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "oracle"))
import comfy_env_oracle as oracle      # noqa: E402


def test_every_listed_difference_names_real_keys_and_its_reason():
    entries = oracle.load_listed()
    assert entries, f"{oracle.DIFFERENCES} lists no [[difference]]"
    with open(oracle.DIALECTS, encoding="utf-8") as f:
        dialects = f.read()
    for i, e in enumerate(entries):
        where = f"{oracle.DIFFERENCES}: [[difference]] #{i + 1} ({e.get('field')})"
        assert set(e) <= oracle.ENTRY_KEYS, f"{where}: unknown key(s) {sorted(set(e) - oracle.ENTRY_KEYS)}"
        assert {"field", "releases", "row", "reason"} <= set(e), f"{where}: needs field, releases, row, reason"
        assert e["field"] in oracle.ALL_FIELDS or (e["field"] == "*" and "shape" in e), \
            f"{where}: field {e['field']!r} is none of {oracle.ALL_FIELDS} (or \"*\" with a shape)"
        if "shape" in e:
            assert e["shape"] in oracle.SHAPES, f"{where}: shape {e['shape']!r} is none of {oracle.SHAPES}"
        if "role" in e and e["field"] != "*":
            assert e["field"] in oracle.FIELDS[e["role"]], f"{where}: a {e['role']} file has no {e['field']}"
        SpecifierSet(e["releases"])
        for k in ("only_release", "only_bulkhead", "release", "bulkhead", "config"):
            if k in e:
                re.compile(e[k])
        assert e["reason"].strip(), where
        assert e["row"] in dialects, f"{where}: row {e['row']!r} is no text of {oracle.DIALECTS}"


def test_an_entry_lists_only_its_field_and_releases():
    entries = [{"field": "cuda", "role": "env", "releases": ">=0.3.0", "only_release": "^torch$",
                "row": "r", "reason": "r"}]
    torch = {"field": "cuda", "release": ["torch"], "bulkhead": [], "only_release": ["torch"], "only_bulkhead": []}
    assert oracle.listed(torch, "0.3.24", "env", entries) is entries[0]
    assert oracle.listed(torch, "0.2.9", "env", entries) is None            # outside its releases
    other = dict(torch, release=["spconv"], only_release=["spconv"])
    assert oracle.listed(other, "0.3.24", "env", entries) is None           # another item
    extra = dict(torch, bulkhead=["x"], only_bulkhead=["x"])
    assert oracle.listed(extra, "0.3.24", "env", entries) is None           # bulkhead's side unlisted


@pytest.mark.parametrize("text", [
    'python = "3.11"\n[cuda]\npackages = "nvdiffrast"\n[env_vars]\nA = "1"\n'
    '[pypi-dependencies]\n"trimesh[easy]" = "*"\nnumpy = "1.26.4"\nscipy = { version = ">=1.10", extras = ["x"] }\n',
])
def test_the_two_views_agree_where_the_readers_do(tmp_path, text):
    """The views' spelling: pixi's table as a release hands it on, and
    bulkhead's requirement strings, come out the same for the same ask."""
    p = tmp_path / "ComfyUI-V" / "nodes" / "comfy-env.toml"
    p.parent.mkdir(parents=True)
    p.write_text(text)
    release = {"config": {"python": "3.11", "cuda_packages": "nvdiffrast", "env_vars": {"A": "1"},
                          "pixi_passthrough": {"pypi-dependencies": {
                              "trimesh[easy]": "*", "numpy": "1.26.4",
                              "scipy": {"version": ">=1.10", "extras": ["x"]}}}}}
    rv, bv = oracle.release_view(release, "env"), oracle.bulkhead_view(str(p), "env")
    assert oracle.differences(rv, bv, "env") == [], (rv, bv)
