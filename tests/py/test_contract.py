"""bulkhead's contract with ComfyUI (bulkhead.host.contract) and `bulkhead doctor`.

* The table lists every ComfyUI name the glue uses: an AST scan of
  python/bulkhead/*.py fails on one it does not list (and on a use on a side
  the row does not name).
* check() against modules made here: a missing FATAL name refuses isolation
  with one message naming it, a changed signature of a DEGRADED one is a
  warning naming the feature, fallbacks and OPTIONAL rows count for nothing.
* `python -m bulkhead doctor` and `bulkhead doctor` (the C command hands over
  to it) on the stub, on fixture copies of the stub with a removed function
  and a changed signature, and on a real checkout when COMFYUI_PATH names
  one (it must pass there: what that checkout lacks is DEGRADED at worst).
* comfy_pack on those fixtures: FATAL -> every pack falls back with the
  refusal; DEGRADED -> one warning per feature, once per process.
"""

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from bulkhead.host import contract
from comfyenv import SHIMS, STUB_ROOT, run_comfy_script, using_real_checkout

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))
TOOL = os.path.join(BUILD, "tools", "bulkhead")

MM = contract.MM
LOADED_MODEL = (MM, "LoadedModel")

# --- the AST scan ---

# Names the glue binds to a ComfyUI module by convention (parameters,
# attributes), besides what the imports and sys.modules look-ups bind.
CONVENTIONAL = {"mm": MM, "self.mm": MM, "utils": contract.UTILS, "self.utils": contract.UTILS,
                "cli": contract.CLI, "fp": contract.FP, "mem": contract.MEM, "lm": LOADED_MODEL}
from pkgsource import PY_SRC, WORKER_FILES, WORKER_FUNCTIONS, package_sources  # noqa: E402

NOT_SCANNED = {"host/contract.py"}   # the table itself: names as data
_MODULE_NAME = re.compile(r"^(comfy(\.\w+)*|folder_paths)$")

# Look-ups by a name the scan cannot resolve, with the names they can take
# (each must be in the table); None: the name is data from the same
# ComfyUI, not a name bulkhead depends on (the enum classes of the host's
# own flags, by the names the host's comfy.cli_args gave them).
_KINDS = ("output", "input", "temp", "user")   # the keys of formats.host_folders()["dirs"]
DYNAMIC_ALLOWED = {
    ("channel/formats.py", "comfy.cli_args", "value['enum']"): None,
    ("channel/formats.py", "folder_paths", "f'set_{kind}_directory'"): [f"set_{k}_directory" for k in _KINDS],
    ("channel/formats.py", "folder_paths", "f'{kind}_directory'"): [f"{k}_directory" for k in _KINDS],
    ("host/comfy_env.py", "folder_paths", "getter"): [f"get_{k}_directory" for k in _KINDS],
}


def _str_consts(node):
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
            all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def scan(source, filename):
    """(uses, dynamic): uses are (module, name or None, side, line) for
    every ComfyUI name the source reads, calls or assigns (name None: the
    module itself); dynamic are (module, expression, line) for look-ups
    by a name this scan cannot resolve."""
    tree = ast.parse(source, filename)
    bound = dict(CONVENTIONAL)
    consts = {}      # module-level NAME = "str"
    loops = {}       # for NAME in ("a", "b"): NAME -> values
    uses, dynamic = [], []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    consts[t.id] = [node.value.value]
    worker_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (filename, node.name) in WORKER_FUNCTIONS:
            worker_nodes.update(id(n) for n in ast.walk(node))
    side_of_file = "worker" if filename in WORKER_FILES else "host"

    def side(node):
        return "worker" if id(node) in worker_nodes else side_of_file

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _MODULE_NAME.match(a.name):
                    uses.append((a.name, None, side(node), node.lineno))
                    if a.asname:
                        bound[a.asname] = a.name
                    else:
                        parts = a.name.split(".")
                        for i in range(1, len(parts) + 1):
                            bound[".".join(parts[:i])] = ".".join(parts[:i])
        elif isinstance(node, ast.ImportFrom) and node.module and _MODULE_NAME.match(node.module):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                uses.append((full, None, side(node), node.lineno))
                bound[a.asname or a.name] = full
        elif isinstance(node, ast.Assign):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Call) and "sys.modules" in ast.unparse(sub.func) and sub.args \
                        and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str) \
                        and _MODULE_NAME.match(sub.args[0].value):
                    for t in node.targets:
                        bound[ast.unparse(t)] = sub.args[0].value
        elif isinstance(node, (ast.For, ast.comprehension)):
            values = _str_consts(node.iter)
            if values is not None and isinstance(node.target, ast.Name):
                loops.setdefault(node.target.id, []).extend(values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.match(node.value):
            uses.append((node.value, None, side(node), node.lineno))

    def names_of(arg):
        """The attribute names a getattr-like second argument can be."""
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.Name):
            return consts.get(arg.id) or loops.get(arg.id)
        if isinstance(arg, ast.JoinedStr):
            out = [""]
            for part in arg.values:
                if isinstance(part, ast.Constant):
                    out = [o + part.value for o in out]
                elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and \
                        (consts.get(part.value.id) or loops.get(part.value.id)):
                    vals = consts.get(part.value.id) or loops.get(part.value.id)
                    out = [o + v for o in out for v in vals]
                else:
                    return None
            return out
        return None

    def record(base_node, name, node):
        key = ast.unparse(base_node)
        target = bound.get(key)
        if target is None:
            return
        if name.startswith("__") and name.endswith("__"):
            return
        if isinstance(target, str) and f"{target}.{name}" in bound.values():
            return   # comfy.options: a submodule, which has its own row
        if isinstance(target, tuple):            # an instance of a ComfyUI class
            uses.append((target[0], f"{target[1]}.{name}", side(node), node.lineno))
        else:
            uses.append((target, name, side(node), node.lineno))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            record(node.value, node.attr, node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2:
            base = ast.unparse(node.args[0])
            if base not in bound:
                continue
            names = names_of(node.args[1])
            if names is None:
                target = bound[base]
                dynamic.append((target if isinstance(target, str) else ".".join(target),
                                ast.unparse(node.args[1]), node.lineno))
                continue
            for n in names:
                record(node.args[0], n, node)
    return uses, dynamic


def _table_index():
    rows = {}
    for r in contract.TABLE:
        rows[(r.module, None if r.kind == "module" else r.name)] = r
    return rows


def _side_ok(row, side):
    return row.side == "both" or row.side == side


def test_the_glue_uses_no_comfyui_name_the_table_does_not_list():
    rows = _table_index()
    unlisted, wrong_side, dynamic = [], [], []
    for fn in package_sources():
        if fn in NOT_SCANNED:
            continue
        with open(os.path.join(PY_SRC, fn)) as f:
            uses, dyn = scan(f.read(), fn)
        for module, name, side, line in uses:
            row = rows.get((module, name))
            if row is None:
                unlisted.append(f"{fn}:{line}: {module}" + (f".{name}" if name else " (module)"))
            elif not _side_ok(row, side):
                wrong_side.append(f"{fn}:{line}: {row.qualname} is used on the {side} side; "
                                  f"the table says {row.side}")
        for module, expr, line in dyn:
            if (fn, module, expr) not in DYNAMIC_ALLOWED:
                dynamic.append(f"{fn}:{line}: getattr({module}, {expr})")
                continue
            for name in DYNAMIC_ALLOWED[(fn, module, expr)] or ():
                if (module, name) not in rows:
                    unlisted.append(f"{fn}:{line}: {module}.{name} (as {expr})")
    assert unlisted == [], "ComfyUI names the glue uses that bulkhead.host.contract.TABLE does not list"
    assert wrong_side == []
    assert dynamic == [], "look-ups of ComfyUI names the scan cannot check: list them or make them constant"


def test_the_scan_finds_what_it_checks():
    src = textwrap.dedent('''
        import sys
        import comfy.model_management as cmm
        import comfy.utils
        KEY = "free_pins"
        def f(mm, lm, data):
            x = sys.modules.get("folder_paths")
            cmm.free_memory(1, 2)
            mm.vram_state = 3
            comfy.utils.ProgressBar(3)
            getattr(mm, KEY, None)
            hasattr(x, "models_dir")
            for kind in ("output", "input"):
                getattr(x, f"get_{kind}_directory")()
            lm.real_model = None
            mm.__file__
            getattr(mm, data)
    ''')
    uses, dynamic = scan(src, "host/memory.py")
    found = set((m, n) for m, n, _s, _l in uses)
    assert found == ({
        ("comfy.model_management", None), ("comfy.utils", None), ("folder_paths", None),
        (MM, "free_memory"), (MM, "vram_state"), ("comfy.utils", "ProgressBar"), (MM, "free_pins"),
        ("folder_paths", "models_dir"), ("folder_paths", "get_output_directory"),
        ("folder_paths", "get_input_directory"), (MM, "LoadedModel.real_model")})
    assert dynamic == [(MM, "data", 17)]
    assert {s for *_x, s, _l in uses} == {"host"}
    assert {s for *_x, s, _l in scan(src, "worker/memory.py")[0]} == {"worker"}


def test_the_table_is_well_formed():
    seen = set()
    for r in contract.TABLE:
        assert r.tier in contract.TIERS and r.side in ("host", "worker", "both"), r
        assert r.kind in ("module", "function", "global", "class", "method", "attribute"), r
        assert r.feature, r
        key = (r.module, r.name)
        assert key not in seen, f"{r} twice"
        seen.add(key)
        if r.kind in ("function", "method"):
            assert r.calls, f"{r}: a function row names the calls bulkhead makes"
        for c in r.calls:
            contract.parse_call(c)
    names = {(r.module, r.name) for r in contract.TABLE}
    for r in contract.TABLE:
        if r.fallback:
            assert (r.module, r.fallback) in names, r
        if r.kind != "module":
            assert (r.module, r.module) in names, f"{r}: its module has no row"
    # the floor the seeds name: the non-consuming interrupt read is FATAL
    assert {r.name: r.tier for r in contract.TABLE}["processing_interrupted"] == contract.FATAL


# --- check() against modules made here ---

FAKE_MM = '''
class LoadedModel:
    def __init__(self, model):
        self.device = model.load_device
        self.real_model = None

def free_memory(memory_required, device, keep_loaded=[]):
    return []

def free_pins(*, size):
    return 0

def get_output_directory():
    return "/out"

output_directory = "/out"
'''


@pytest.fixture
def fake_module(tmp_path, monkeypatch):
    """A module `bh_fake_mm` made from FAKE_MM (a file, so its classes have
    source), imported fresh."""
    (tmp_path / "bh_fake_mm.py").write_text(FAKE_MM)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("bh_fake_mm", None)
    mod = importlib.import_module("bh_fake_mm")
    yield mod
    sys.modules.pop("bh_fake_mm", None)


def _row(name, kind, calls=(), tier=contract.FATAL, fallback=None, side="both"):
    return contract.Row("bh_fake_mm", name, kind, calls, side, tier, f"feature of {name}", fallback)


def test_check_reports_each_status(fake_module):
    table = (
        _row("bh_fake_mm", "module"),
        _row("free_memory", "function", ["memory_required, device, keep_loaded=", "a, b"]),
        _row("load_models_gpu", "function", ["models"]),
        _row("free_pins", "function", ["size"], tier=contract.DEGRADED),
        _row("LoadedModel", "class", ["model"]),
        _row("LoadedModel.real_model", "attribute"),
        _row("LoadedModel.currently_used", "attribute", tier=contract.DEGRADED),
        _row("set_output_directory", "function", ["path"], contract.DEGRADED, fallback="output_directory"),
        _row("output_directory", "global", tier=contract.DEGRADED),
        _row("register_memory_holder", "function", ["holder"], tier=contract.OPTIONAL),
    )
    rep = contract.check(None, table=table)
    status = {r.row.name: r.status for r in rep.results}
    assert status == {
        "bh_fake_mm": "ok", "free_memory": "ok", "load_models_gpu": "missing", "free_pins": "signature changed",
        "LoadedModel": "ok", "LoadedModel.real_model": "ok", "LoadedModel.currently_used": "missing",
        "set_output_directory": "missing", "output_directory": "ok", "register_memory_holder": "missing"}
    assert [r.row.name for r in rep.fatal] == ["load_models_gpu"]
    assert not rep.ok
    assert rep.refusal() == ("this ComfyUI lacks what bulkhead cannot work without: "
                             "bh_fake_mm.load_models_gpu missing")
    # the fallback stands in for set_output_directory; OPTIONAL never warns
    assert [r.row.name for r in rep.degraded] == ["free_pins", "LoadedModel.currently_used"]
    assert rep.warnings() == [
        "feature of free_pins is off: this ComfyUI lacks bh_fake_mm.free_pins (signature changed)",
        "feature of LoadedModel.currently_used is off: this ComfyUI lacks "
        "bh_fake_mm.LoadedModel.currently_used (missing)"]
    assert "does not take (size)" in rep.row("bh_fake_mm.free_pins").detail
    doc = json.loads(json.dumps(rep.to_dict()))
    assert doc["fatal"] == 1 and doc["degraded"] == 2 and doc["optional"] == 1
    text = rep.format()
    assert "missing (uses output_directory)" in text and "1 FATAL, 2 DEGRADED" in text


def test_check_by_side_and_a_module_that_cannot_be_imported(fake_module):
    table = (
        _row("bh_fake_mm", "module"),
        _row("free_memory", "function", ["a, b"], side="worker"),
        contract.Row("bh_no_such_module", "bh_no_such_module", "module", (), "host", contract.DEGRADED, "x"),
        contract.Row("bh_no_such_module", "thing", "global", (), "host", contract.DEGRADED, "x"),
    )
    host = contract.check("host", table=table)
    assert [r.row.name for r in host.results] == ["bh_fake_mm", "bh_no_such_module", "thing"]
    assert host.ok and len(host.degraded) == 2
    assert "No module named 'bh_no_such_module'" in host.import_errors["bh_no_such_module"]
    assert "cannot be imported" in host.row("bh_no_such_module.thing").detail
    assert [r.row.name for r in contract.check("worker", table=table).results] == ["bh_fake_mm", "free_memory"]
    with pytest.raises(ValueError):
        contract.check("sideways", table=table)


def test_accepts():
    def f(a, b, keep_loaded=None):
        pass

    assert contract.accepts(f, "a, b, keep_loaded=") == (True, None)
    assert contract.accepts(f, "a, b")[0]
    assert not contract.accepts(f, "a, b, c, d")[0]
    assert not contract.accepts(f, "a, b, torch_free_too=")[0]
    assert contract.accepts(lambda *a, **k: None, "a, b, c=, d=")[0]
    assert contract.accepts(ValueError, "x") == (True, None) or contract.accepts(ValueError, "x")[0]

    class C:
        def m(self, x):
            pass
    assert contract.accepts(C.m, "x", bound=True)[0]
    assert not contract.accepts(C.m, "x, y", bound=True)[0]
    assert contract.parse_call("") == (0, ())
    assert contract.parse_call("models, memory_required=, force_full_load=") == \
        (1, ("memory_required", "force_full_load"))


# --- bulkhead doctor ---

def _torchvision_ok():
    r = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    return r.returncode == 0


def _doctor_env(real=False):
    pp = [os.path.join(BUILD, "python")]
    if real and not _torchvision_ok():
        pp.append(SHIMS)  # as comfyenv does: an empty stand-in where the wheel cannot load
    return dict(os.environ, PYTHONPATH=os.pathsep.join(pp))


def doctor(*args, real=False, cwd=None):
    return subprocess.run([sys.executable, "-m", "bulkhead", "doctor", *args], capture_output=True, text=True,
                          env=_doctor_env(real), cwd=cwd or HERE, timeout=180)


def fixture(tmp_path, edit=None):
    """A copy of the stub, with `edit(source) -> source` applied to its
    comfy/model_management.py."""
    root = tmp_path / "comfyui"
    shutil.copytree(STUB_ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        p = root / "comfy" / "model_management.py"
        src = p.read_text()
        new = edit(src)
        assert new != src, "the fixture edit changed nothing"
        p.write_text(new)
    return root


def remove_interrupt_read(src):
    # the non-consuming read of the interrupt flag: FATAL (seed 001, row 39)
    return src.replace("def processing_interrupted(", "def processing_interrupted_gone(")


def change_free_pins(src):
    return re.sub(r"def free_pins\(size,", "def free_pins(*, size,", src)


@pytest.mark.torch
def test_doctor_on_the_stub():
    r = doctor("--json", STUB_ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["fatal"] == 0 and doc["degraded"] == 0, doc["warnings"]
    absent = sorted(x["name"] for x in doc["rows"] if x["status"] != "ok" and x["counts"])
    assert absent == ["filename_list_cache", "register_memory_holder", "unregister_memory_holder"]
    assert all(x["tier"] == "OPTIONAL" for x in doc["rows"] if x["name"] in absent)
    assert doc["comfyui"] == os.path.realpath(STUB_ROOT)
    assert len(doc["rows"]) == len(contract.TABLE)


@pytest.mark.torch
def test_doctor_refuses_on_a_removed_function(tmp_path):
    root = fixture(tmp_path, remove_interrupt_read)
    r = doctor(str(root))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    row = [l for l in lines if l.split()[:2] == ["missing", "FATAL"] and "processing_interrupted(" in l]
    assert len(row) == 1, r.stdout
    assert lines[-1] == (f"this ComfyUI at {os.path.realpath(root)} lacks what bulkhead cannot work without: "
                         "comfy.model_management.processing_interrupted missing"), lines[-1]
    doc = json.loads(doctor("--json", str(root)).stdout)
    assert not doc["ok"] and doc["fatal"] == 1 and "processing_interrupted missing" in doc["refusal"]


@pytest.mark.torch
def test_doctor_warns_on_a_changed_signature(tmp_path):
    root = fixture(tmp_path, change_free_pins)
    r = doctor(str(root))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("DEGRADED: a worker's pins released on a full release is off: this ComfyUI lacks "
            "comfy.model_management.free_pins (signature changed)") in r.stdout.splitlines()
    assert r.stdout.splitlines()[-1] == "bulkhead can isolate packs on this ComfyUI"
    row = [l for l in r.stdout.splitlines() if "free_pins(size)" in l]
    assert row and row[0].split()[:5] == ["signature", "changed", "DEGRADED", "worker", "function"], row


@pytest.mark.torch
def test_doctor_usage_and_the_command(tmp_path):
    r = doctor(str(tmp_path))
    assert r.returncode == 2 and "no ComfyUI in" in r.stderr
    r = doctor("--bogus")
    assert r.returncode == 2
    # default: $COMFYUI_PATH, else the current directory
    r = subprocess.run([sys.executable, "-m", "bulkhead", "doctor", "--json"], capture_output=True, text=True,
                       env=dict(_doctor_env(), COMFYUI_PATH=STUB_ROOT), cwd=str(tmp_path), timeout=180)
    assert r.returncode == 0 and json.loads(r.stdout)["comfyui"] == os.path.realpath(STUB_ROOT)
    if not os.path.exists(TOOL):
        pytest.skip(f"no {TOOL} (build first)")
    env = dict(os.environ, BULKHEAD_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)  # the command finds the package next to itself
    r = subprocess.run([TOOL, "doctor", STUB_ROOT], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"bulkhead doctor: ComfyUI at {os.path.realpath(STUB_ROOT)}")
    assert r.stdout.splitlines()[1].split() == ["status", "tier", "side", "kind", "name"]
    r = subprocess.run([TOOL, "doctor", str(fixture(tmp_path, remove_interrupt_read))], capture_output=True,
                       text=True, env=env, timeout=180)
    assert r.returncode == 1
    r = subprocess.run([TOOL, "help", "doctor"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout and "COMFYUI_DIR" in r.stdout
    r = subprocess.run([TOOL, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert "  doctor    check bulkhead's contract with a ComfyUI" in r.stdout


@pytest.mark.torch
def test_doctor_on_a_real_checkout():
    path = os.environ.get("COMFYUI_PATH")
    if not path or not using_real_checkout():
        pytest.skip("COMFYUI_PATH names no ComfyUI checkout: the contract was NOT checked against upstream")
    r = doctor("--json", path, real=True)
    doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    assert doc is not None, r.stderr
    failing = [(x["tier"], x["module"] if x["kind"] == "module" else f'{x["module"]}.{x["name"]}', x["status"])
               for x in doc["rows"]
               if x["status"] != "ok" and x["counts"]]
    print("what this checkout lacks:", *failing, sep="\n  ")
    assert r.returncode == 0 and doc["ok"], (doc["refusal"], failing)
    assert all(t != "FATAL" for t, _n, _s in failing), failing


# --- comfy_pack on the fixtures ---

NODES = '''
import os

class WhereAmI:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self):
        return (os.getpid(),)

NODE_CLASS_MAPPINGS = {"WhereAmI": WhereAmI}
'''


def _packs(tmp_path, names):
    out = []
    for name in names:
        d = tmp_path / name
        d.mkdir()
        (d / "__init__.py").write_text("import bulkhead\n"
                                       "NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = "
                                       "bulkhead.comfy_pack(__file__)\n")
        (d / "nodes.py").write_text(NODES)
        (d / "comfy-env.toml").write_text('python = "%d.%d"\n' % sys.version_info[:2])
        out.append(str(d))
    return out


HOST = '''
import io, logging
buf = io.StringIO()
logging.basicConfig(level=logging.WARNING, stream=buf, format="LOG %(message)s", force=True)
import bulkhead
from bulkhead.host import contract

pids = []
for pack in PACKS:
    mod = load_custom_node(pack)
    cls = mod.NODE_CLASS_MAPPINGS["WhereAmI"]
    pids.append(getattr(cls(), cls.FUNCTION)()[0])
first = contract._startup
load_custom_node(PACKS[0])
emit(dict(me=os.getpid(), pids=pids, log=buf.getvalue(), once=contract._startup is first,
          memory=bulkhead.host.pack._memory is not None, states=bulkhead.host.states.pack_states()))
'''


def _host(tmp_path, root, packs):
    env = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(tmp_path / "home"),
           "BULKHEAD_LEDGER": str(tmp_path / "ledger"), "BULKHEAD_BUILD_AT_START": "0"}
    return run_comfy_script(f"PACKS = {packs!r}\n" + HOST, timeout=180, env=env, root=str(root), real=False)


@pytest.mark.torch
def test_comfy_pack_refuses_isolation_when_a_fatal_name_is_missing(tmp_path):
    root = fixture(tmp_path, remove_interrupt_read)
    packs = _packs(tmp_path, ["pack_one", "pack_two"])
    r = _host(tmp_path, root, packs)
    assert r["pids"] == [r["me"], r["me"]]  # both in-process
    lines = [l for l in r["log"].splitlines() if l.startswith("LOG ")]
    assert len(lines) == 2, r["log"]   # one message per pack, nothing else
    for line, pack in zip(lines, packs):     # one short line (#36); the whole reason and fix in its state
        assert line.startswith(f"LOG bulkhead: pack {os.path.basename(pack)!r} runs in-process, NOT isolated: "
                               "bulkhead refuses isolation: this ComfyUI at ") and len(line) <= 4 + 200, line
    for state in r["states"]:
        assert state["reason"] == f"bulkhead refuses isolation: this ComfyUI at {os.path.realpath(root)} lacks " \
               "what bulkhead cannot work without: comfy.model_management.processing_interrupted missing", state
        assert state["fix"].startswith("run `bulkhead doctor`"), state
    assert r["once"] and not r["memory"]   # checked once; no memory runtime on a refused ComfyUI


@pytest.mark.torch
def test_comfy_pack_warns_once_per_degraded_feature(tmp_path):
    root = fixture(tmp_path, change_free_pins)
    packs = _packs(tmp_path, ["pack_one", "pack_two"])   # environments not built: they fall back
    r = _host(tmp_path, root, packs)
    lines = [l for l in r["log"].splitlines() if l.startswith("LOG ")]
    degraded = [l for l in lines if "is off" in l]
    # one line for every feature that is off, naming them and the doctor (#25)
    assert degraded == ["LOG bulkhead: on this ComfyUI 1 feature of isolated packs is off: a worker's pins "
                        "released on a full release (`bulkhead doctor` names what this ComfyUI lacks for each)"], \
        r["log"]
    assert sum("environment is not built" in l for l in lines) == 2, r["log"]
    assert r["once"] and r["memory"]


@pytest.mark.torch
def test_comfy_pack_on_the_stub_warns_nothing(tmp_path):
    packs = _packs(tmp_path, ["pack_one"])
    r = _host(tmp_path, STUB_ROOT, packs)
    lines = [l for l in r["log"].splitlines() if l.startswith("LOG ")]
    assert len(lines) == 1 and "environment is not built" in lines[0], r["log"]
