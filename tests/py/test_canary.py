"""`bulkhead canary COMFYUI_DIR` (a verb of the bulkhead command, which execs
`<python> -m bulkhead canary`: python/bulkhead/cli/canary.py), run as a program.

Each test writes a small model_management-like source into a ComfyUI-shaped
directory (<tmp>/comfy/model_management.py) and checks the exit status (0
covered, 1 lacking or changed, 2 unreadable or usage) and the --json report.
The same command then runs on tests/comfyui (the stub of the generation with
dynamic models) and, when COMFYUI_PATH names a checkout, on the real
upstream: that test SKIPS, saying so, when there is none -- a canary that did
not run never passes.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bulkhead import _native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
TOOL = os.path.join(BUILD, "tools", "bulkhead")
STUB = os.path.join(ROOT, "tests", "comfyui")

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL), reason=f"no {TOOL} (build first)")

SURFACE = set(_native.COMFY_SURFACE)

# A ledger entry and the three functions that read patchers, as upstream
# writes them (no upstream code: the reading patterns only).
FULL = textwrap.dedent('''\
    import weakref
    current_loaded_models = []

    class LoadedModel:
        def __init__(self, model):
            self._set_model(model)
            self.device = model.load_device

        def _set_model(self, model):
            self._model = weakref.ref(model)
            if model.parent is not None:
                self._parent_model = weakref.ref(model.parent)

        @property
        def model(self):
            return self._model()

        def model_offloaded_memory(self):
            return self.model.model_size() - self.model.loaded_size()

        def model_memory_required(self, device):
            if device == self.model.current_loaded_device():
                return self.model_offloaded_memory()
            return self.model.model_size()

        def model_load(self, lowvram_model_memory=0, force_patch_weights=False):
            self.model.model_patches_to(self.device)
            self.model.model_patches_to(self.model.model_dtype())
            self.model.partially_load(self.device, lowvram_model_memory, force_patch_weights=force_patch_weights)
            return self.model.model

        def should_reload_model(self, force_patch_weights=False):
            return force_patch_weights and self.model.lowvram_patch_counter() > 0

        def model_unload(self, memory_to_free=None, unpatch_weights=True):
            if memory_to_free is not None and memory_to_free < self.model.loaded_size():
                freed = self.model.partially_unload(self.model.offload_device, memory_to_free)
                if freed >= memory_to_free:
                    return False
            self.model.detach(unpatch_weights)
            return True

    def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False):
        for i in range(len(current_loaded_models) - 1, -1, -1):
            if current_loaded_models[i].model.is_dynamic() and for_dynamic:
                memory_required -= current_loaded_models[i].model.loaded_size()
                continue
            logging.debug(f"Unloading {current_loaded_models[i].model.model.__class__.__name__}")
            current_loaded_models[i].model_unload(memory_required)

    def load_models_gpu(models, memory_required=0):
        wanted = {}
        for m in models:
            wanted[m] = None
            for extra in m.model_patches_models():
                wanted[extra] = None
        to_load = [LoadedModel(p) for p in wanted]
        for entry in to_load:
            for i in range(len(current_loaded_models)):
                if entry.model.is_clone(current_loaded_models[i].model):
                    old = current_loaded_models.pop(i)
                    old.model.detach(unpatch_all=False)
        for entry in to_load:
            patcher = entry.model
            dev = patcher.load_device
            entry.model_load(0.1)

    def unload_model_and_clones(model, unload_additional_models=True):
        extras = model.get_nested_additional_models() if unload_additional_models else []
        targets = [model.clone_base_uuid] + [m.clone_base_uuid for m in extras]
        keep = [e for e in current_loaded_models if e.model is None or e.model.clone_base_uuid not in targets]
        free_memory(1e30, model.load_device, keep)
    ''')


def line_of(text, needle):
    """1-based line of the first line containing needle."""
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n
    raise AssertionError(f"{needle!r} not in the fixture")


@pytest.fixture
def checkout(tmp_path):
    """checkout(source) -> a ComfyUI-shaped directory holding it."""

    def make(source):
        (tmp_path / "comfy").mkdir(exist_ok=True)
        (tmp_path / "comfy" / "model_management.py").write_text(source)
        return str(tmp_path)

    return make


def canary(*args, timeout=60):
    # The verb runs the analyzer in BULKHEAD_PYTHON: this interpreter.
    env = dict(os.environ, BULKHEAD_PYTHON=sys.executable)
    return subprocess.run([TOOL, "canary", *args], capture_output=True, text=True, timeout=timeout, env=env)


def canary_json(*args):
    r = canary("--json", *args)
    return r.returncode, json.loads(r.stdout) if r.stdout else None, r


def names(report, section):
    return {e["name"] for e in report[section]}


def entry(report, section, name):
    for e in report[section]:
        if e["name"] == name:
            return e
    raise AssertionError(f"{name} not in {section}: {report[section]}")


# ----------------------------------------------------------- the baseline


def test_baseline_is_the_standins_surface(checkout):
    """The canary's surface is the StandIn's: the same 18."""
    rc, rep, _ = canary_json(checkout("x = 1\n"))
    assert rc == 0
    assert set(rep["surface"]) == SURFACE and len(rep["surface"]) == 18
    assert set(rep["unread"]) == SURFACE


# --------------------------------------------------------------- fixtures


def test_fixture_covered(checkout):
    path = checkout(FULL)
    rc, rep, r = canary_json(path)
    assert rc == 0, r.stdout + r.stderr
    assert rep["ok"] is True and rep["status"] == 0
    assert names(rep, "answered") == SURFACE - {"model"}
    assert entry(rep, "not_members", "model")["why"].startswith("inner module")
    assert rep["lacking"] == [] and rep["changed"] == [] and rep["unread"] == []
    assert entry(rep, "answered", "load_device")["line"] == line_of(FULL, "model.load_device")
    detach = entry(rep, "answered", "detach")
    assert detach["calls"] == ["detach(_)", "detach(unpatch_all=...)"]
    assert entry(rep, "answered", "is_clone")["calls"] == ["is_clone(_)"]
    # The human report: sections, file:line, the verdict.
    r = canary(path)
    assert r.returncode == 0
    mm = os.path.join(path, "comfy", "model_management.py")
    assert f"{mm}:{line_of(FULL, 'self.model.detach(unpatch_weights)')}" in r.stdout
    for title in ("answered by the StandIn (17):", "lacking (", "gated behind is_dynamic()",
                  "changed call shapes (0)", "not members (subtracted)"):
        assert title in r.stdout
    assert r.stdout.rstrip().endswith("in every call shape.")
    # what upstream compares between patchers is each stand-in's own (#24 L7)
    assert rep["compared"] == [{"name": "clone_base_uuid", "line": line_of(FULL, "e.model.clone_base_uuid not in"),
                                "per_model": True}]
    assert "compared between patchers (1):" in r.stdout


PATTERNS = [
    # (what, source, name derived, section)
    ("direct .model.<name>", "def f(i):\n    current_loaded_models[i].model.new_member()\n",
     "new_member", "lacking"),
    ("alias through a local",
     "def f():\n    for x in current_loaded_models:\n        m = x.model\n        m.aliased\n",
     "aliased", "lacking"),
    ("loop variable", "def f():\n    for x in current_loaded_models:\n        x.model.looped\n",
     "looped", "lacking"),
    ("incoming model in load_models_gpu",
     "def load_models_gpu(models):\n    for x in models:\n        x.incoming()\n", "incoming", "lacking"),
    ("unload_model_and_clones",
     "def unload_model_and_clones(model):\n    return model.clone_family\n", "clone_family", "lacking"),
    ("LoadedModel's patcher argument",
     "class LoadedModel:\n    def __init__(self, model):\n        self.device = model.load_device\n",
     "load_device", "answered"),
    ("is_dynamic gate",
     "def f(p):\n    for e in current_loaded_models:\n        if e.model.is_dynamic():\n"
     "            e.model.paged_only()\n", "paged_only", "gated"),
    ("early exit before a gated read",
     "def f():\n    for e in current_loaded_models:\n        p = e.model\n"
     "        if p is None or not p.is_dynamic():\n            continue\n        p.pins()\n",
     "pins", "gated"),
    ("inner module", "def f():\n    return current_loaded_models[0].model.model\n", "model", "not_members"),
    ("probe", "def f():\n    return hasattr(current_loaded_models[0].model, 'maybe')\n", "maybe", "probed"),
]


@pytest.mark.parametrize("what,source,name,section", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_pattern(checkout, what, source, name, section):
    rc, rep, r = canary_json(checkout(source))
    assert name in names(rep, section), f"{what}: {json.dumps(rep, indent=1)}"
    assert rc == (1 if section == "lacking" else 0), r.stdout
    assert entry(rep, section, name)["line"] == line_of(source, name)


def test_removed_member_fails_naming_it(checkout):
    path = checkout(FULL)
    r = canary("--without", "partially_unload", path)
    assert r.returncode == 1, r.stdout
    assert "FAIL: the StandIn lacks partially_unload" in r.stdout
    rc, rep, _ = canary_json("--without=partially_unload", path)
    assert rc == 1 and rep["ok"] is False
    assert names(rep, "lacking") == {"partially_unload"}
    assert entry(rep, "lacking", "partially_unload")["line"] == line_of(FULL, "self.model.partially_unload(")
    assert "partially_unload" not in rep["surface"] and rep["without"] == ["partially_unload"]


def test_renamed_member_fails_naming_the_new_one(checkout):
    source = FULL.replace("lowvram_patch_counter()", "lowvram_patches_pending()")
    rc, rep, r = canary_json(checkout(source))
    assert rc == 1
    assert names(rep, "lacking") == {"lowvram_patches_pending"}
    assert "lowvram_patch_counter" in rep["unread"]
    assert "FAIL: the StandIn lacks lowvram_patches_pending" in canary(checkout(source)).stdout


def test_new_keyword_is_a_changed_call_shape(checkout):
    source = FULL.replace("old.model.detach(unpatch_all=False)", "old.model.detach(unpatch_all=False, keep_pins=True)")
    rc, rep, _ = canary_json(checkout(source))
    assert rc == 1 and rep["lacking"] == []
    (change,) = rep["changed"]
    assert change["name"] == "detach"
    assert change["call"] == "detach(unpatch_all=..., keep_pins=...)"
    assert change["line"] == line_of(source, "keep_pins")
    assert "keep_pins= is not accepted" in change["reason"] and "detach(unpatch_all=True)" in change["reason"]


def test_extra_positional_is_a_changed_call_shape(checkout):
    source = FULL.replace("self.model.detach(unpatch_weights)", "self.model.detach(unpatch_weights, True)")
    rc, rep, _ = canary_json(checkout(source))
    assert rc == 1
    assert [c["name"] for c in rep["changed"]] == ["detach"]
    assert "2 positional arguments" in rep["changed"][0]["reason"]


# ------------------------------------------------------ errors and usage


def test_unreadable_file_exits_2(tmp_path):
    missing = tmp_path / "nowhere"
    r = canary(str(missing))
    assert r.returncode == 2
    assert f"cannot read {missing}/comfy/model_management.py" in r.stderr
    assert "(errno 2)" in r.stderr
    rc, rep, _ = canary_json(str(missing))
    assert rc == 2 and rep["errno"] == 2 and rep["ok"] is False
    (tmp_path / "comfy" / "model_management.py").mkdir(parents=True)
    r = canary(str(tmp_path))
    assert r.returncode == 2 and "(errno 21)" in r.stderr


def test_file_named_directly(tmp_path):
    """A file of another name is read as it is, and named on every line."""
    plain = tmp_path / "renamed.py"
    plain.write_text("def f():\n    current_loaded_models[0].model.renamed_size()\n")
    r = canary(str(plain))
    assert r.returncode == 1
    assert "renamed_size" in r.stdout and f"{plain}:2" in r.stdout
    r = canary("--without=is_clone", "--json", checkout_of(tmp_path, FULL))
    assert r.returncode == 1
    assert '"lacking": [\n    {"name": "is_clone"' in r.stdout


def checkout_of(root, source):
    (root / "co" / "comfy").mkdir(parents=True, exist_ok=True)
    (root / "co" / "comfy" / "model_management.py").write_text(source)
    return str(root / "co")


def test_utf8_path_in_json_and_text(tmp_path):
    """A checkout under a non-ASCII path is named as it is: UTF-8 in the
    JSON (which json.loads reads back to the same path) and in the text."""
    root = tmp_path / "Comfy·UI-äöü-検証"
    path = checkout_of(root, FULL.replace("lowvram_patch_counter()", "lowvram_patches_pending()"))
    mm = os.path.join(path, "comfy", "model_management.py")
    rc, rep, r = canary_json(path)
    assert rc == 1
    assert rep["file"] == mm
    assert json.dumps(mm, ensure_ascii=False) in r.stdout  # the bytes themselves, not \u escapes
    r = canary(path)
    assert f"{mm}:{line_of(FULL, 'lowvram_patch_counter')}" in r.stdout


def test_not_python_exits_2_naming_the_line(checkout):
    path = checkout("def ok():\n    pass\ndef broken(:\n    pass\n")
    r = canary(path)
    assert r.returncode == 2
    assert "model_management.py:3: not Python" in r.stderr
    rc, rep, _ = canary_json(path)
    assert rc == 2 and rep["status"] == 2 and rep["ok"] is False and rep["line"] == 3
    assert "not Python" in rep["error"]


@pytest.mark.parametrize("args", [[], ["--bogus", "x"], ["a", "b"], ["--without"], ["--without", "nope", "x"]])
def test_usage_errors_exit_2(args):
    r = canary(*args)
    assert r.returncode == 2
    assert "usage: bulkhead canary" in r.stderr


def test_help():
    r = canary("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: bulkhead canary")
    r = subprocess.run([TOOL, "help", "canary"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, BULKHEAD_PYTHON=sys.executable))
    assert r.returncode == 0 and r.stdout.startswith("usage: bulkhead canary")


# -------------------------------------------------------- ComfyUI trees


def test_stub_checkout():
    """tests/comfyui follows the generation with dynamic models: every
    member of the surface is read there, and its paged-only reads are
    gated."""
    rc, rep, r = canary_json(STUB)
    assert rc == 0, canary(STUB).stdout
    assert names(rep, "answered") == SURFACE - {"model"}
    assert "model" in names(rep, "not_members")
    assert "loaded_ram_size" in names(rep, "gated")
    assert rep["unread"] == []
    # #24 L7: what the pin-eviction generator yields, and the inner module's
    # dynamic_pins, are read past is_dynamic(); free_memory's new arguments
    # are named and covered
    assert {"model.dynamic_pins", "unregister_inactive_pins", "partially_unload_ram"} <= names(rep, "gated")
    assert rep["free_memory"]["parameters"] == ["memory_required", "device", "keep_loaded", "for_dynamic",
                                                "pins_required", "ram_required"]
    assert rep["free_memory"]["new"] == []


def test_real_checkout():
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        pytest.skip("the canary did not run against upstream: COMFYUI_PATH is not set "
                    "(point it at a ComfyUI checkout)")
    r = canary(root)
    print(r.stdout)  # the derived surface, for the log
    assert r.returncode == 0, f"upstream moved:\n{r.stdout}{r.stderr}"
    rc, rep, _ = canary_json(root)
    assert rc == 0
    answered = names(rep, "answered")
    # Every generation reads at least these off a ledger entry.
    assert {"model_size", "loaded_size", "partially_load", "partially_unload", "detach",
            "offload_device", "load_device", "is_clone"} <= answered
    assert "model" in names(rep, "not_members")
