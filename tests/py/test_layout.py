"""The package's layout: folders name the process a file runs in, and a
worker never imports host code (STYLE.md, "The Python glue").

  channel/  both processes (what crosses the channel)
  host/     the ComfyUI (host) process
  worker/   the worker process
  envs/     pack configs and environments (host, CLI, install.py)
  cli/      what runs only from the command line (python -m bulkhead)
  *.py      the top level: used by both processes

Checked twice: statically (every import statement of every worker-side
and shared file, relative ones resolved) and in a real worker process
(what its sys.modules holds after it served a node pack's calls).
"""

import ast
import json
import os
import subprocess
import sys

import bulkhead
from bulkhead.channel import targets

from pkgsource import PY_SRC, package_sources

FOLDERS = {"channel", "host", "worker", "envs", "cli"}
# What each side may import of the package's folders.
MAY_IMPORT = {
    "worker": {"channel", "worker", "top"},
    "channel": {"channel", "top"},
    "top": {"channel", "top"},        # the shared top-level modules
    "envs": {"channel", "envs", "top"},
    "host": {"channel", "host", "envs", "top"},
    "cli": {"channel", "host", "envs", "cli", "top"},
}
# Top-level modules that are not shared by both processes but are entry
# points of their own: `python -m bulkhead` (install, env; it imports
# cli/ for canary, doctor and uninstall) and the
# package face, whose host names are imported lazily (__getattr__).
ENTRY_POINTS = {"__main__.py"}


def _room(rel):
    """The folder a file (relative to the package root) lives in, or 'top'."""
    first = rel.split(os.sep)[0]
    return first if first in FOLDERS else "top"


def _imported_rooms(rel, source):
    """(line, room) for every bulkhead module the source imports, at any
    depth (function-local imports too)."""
    tree = ast.parse(source, rel)
    parts = ["bulkhead"] + rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        package = parts
    else:
        package = parts[:-1]
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = base + (node.module.split(".") if node.module else [])
                if node.module:
                    names = [".".join(mod)]
                else:  # from . import x, y: each name may be a module
                    names = [".".join(mod + [a.name]) for a in node.names]
            else:
                mod = node.module or ""
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for name in names:
            p = name.split(".")
            if p[0] != "bulkhead" or len(p) < 2:
                continue
            out.append((node.lineno, p[1] if p[1] in FOLDERS else "top"))
    return out


def test_the_package_is_laid_out_by_process():
    entries = {e for e in os.listdir(PY_SRC) if not e.startswith((".", "__pycache__"))}
    folders = {e for e in entries if os.path.isdir(os.path.join(PY_SRC, e))}
    assert folders == FOLDERS
    top = sorted(e for e in entries if e.endswith(".py"))
    assert top == ["__init__.py", "__main__.py", "_importwatch.py", "envlock.py", "packimport.py", "pager.py"]
    for folder in FOLDERS:
        assert os.path.isfile(os.path.join(PY_SRC, folder, "__init__.py")), folder


def test_no_side_imports_a_room_it_must_not():
    bad = []
    for rel in package_sources():
        if rel in ENTRY_POINTS or rel == "__init__.py":
            continue
        room = _room(rel)
        with open(os.path.join(PY_SRC, rel)) as f:
            for line, target in _imported_rooms(rel, f.read()):
                if target not in MAY_IMPORT[room]:
                    bad.append(f"{rel}:{line}: {room} code imports bulkhead.{target}")
    assert bad == []


def test_the_import_scan_sees_every_form():
    src = "from ..host import nodes\nfrom .. import envs\nimport bulkhead.host.workers\n" \
          "def f():\n    from ..host.memory import HostMemory\nfrom ..channel.peer import Peer\nfrom . import memory\n"
    assert sorted(_imported_rooms(os.path.join("worker", "nodes.py"), src)) == [
        (1, "host"), (2, "envs"), (3, "host"), (5, "host"), (6, "channel"), (7, "worker")]
    assert sorted(_imported_rooms(os.path.join("worker", "__init__.py"), "from .memory import X\nfrom .. import pager\n")) \
        == [(1, "worker"), (2, "top")]


def test_the_package_face_imports_no_host_code():
    r = subprocess.run([sys.executable, "-c", "import bulkhead.worker, bulkhead.worker.nodes, bulkhead.worker.memory, sys; "
                        "print(sorted(m for m in sys.modules if m.startswith('bulkhead')))"],
                       capture_output=True, text=True, check=True)
    loaded = eval(r.stdout)
    assert [m for m in loaded if m.startswith(("bulkhead.host", "bulkhead.envs"))] == [], loaded
    assert "bulkhead.worker.nodes" in loaded


def test_a_running_worker_holds_no_host_module(tmp_path):
    """A real worker process, after serving a node pack's describe and a
    node: its sys.modules has no bulkhead.host or bulkhead.envs module."""
    pack = tmp_path / "layoutpack"
    pack.mkdir()
    (pack / "nodes.py").write_text(
        "import json, sys\n"
        "class Echo:\n"
        "    @classmethod\n"
        "    def INPUT_TYPES(cls):\n"
        "        return {'required': {'x': ('INT', {'default': 1})}}\n"
        "    RETURN_TYPES = ('INT',)\n"
        "    FUNCTION = 'run'\n"
        "    def run(self, x):\n"
        "        return (x + 1,)\n"
        "class Probe:\n"
        "    @classmethod\n"
        "    def INPUT_TYPES(cls):\n"
        "        return {'required': {}}\n"
        "    RETURN_TYPES = ('STRING', 'STRING')\n"
        "    FUNCTION = 'run'\n"
        "    def run(self):\n"
        "        from bulkhead.channel import targets\n"
        "        loaded = sorted(m for m in sys.modules if m.startswith('bulkhead'))\n"
        "        missing = [t for t in targets.WORKER_TARGETS if not callable(getattr(\n"
        "            __import__(t.split(':')[0], fromlist=['x']), t.split(':')[1], None))]\n"
        "        return (json.dumps(loaded), json.dumps(missing))\n"
        "NODE_CLASS_MAPPINGS = {'Echo': Echo, 'Probe': Probe}\n")
    comfy = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comfyui")
    w = bulkhead.Worker(sys.executable, name="layout", cwd=comfy,
                        env={"BULKHEAD_PACK_DIR": str(pack), "BULKHEAD_COMFYUI": comfy})
    try:
        meta = w.call(targets.DESCRIBE)
        assert "Echo" in str(meta)
        assert w.call(targets.RUN, "Echo", {"x": 41}, None, None)["outputs"] == (42,)
        # what the worker has loaded, and every name the host calls in a
        # worker is a function there (channel/targets.py), asked of a node
        # (a pack's worker serves nothing but those names)
        loaded, missing = map(json.loads, w.call(targets.RUN, "Probe", {}, None, None)["outputs"])
    finally:
        w.close()
    assert [m for m in loaded if m.startswith(("bulkhead.host", "bulkhead.envs"))] == [], loaded
    assert "bulkhead.worker.nodes" in loaded
    assert missing == [], missing


def test_the_words_of_the_crossing_are_written_once():
    """Outside channel/targets.py no module writes a call target of the
    other side, or a release op, as a string literal (a rename must change
    one place)."""
    import re
    from bulkhead.channel import targets
    words = set(targets.WORKER_TARGETS + targets.HOST_TARGETS)
    found = []
    for root, _dirs, files in os.walk(PY_SRC):
        for n in files:
            if not n.endswith(".py") or os.path.join(root, n).endswith(os.path.join("channel", "targets.py")):
                continue
            with open(os.path.join(root, n)) as f:
                text = f.read()
            found += [f"{n}: {lit}" for lit in re.findall(r'"([a-z_.]+(?::[a-z_0-9]+)?)"', text) if lit in words]
            # a release op where one is asked for or told apart
            ops = "|".join(targets.RELEASE_OPS)
            found += [f"{n}: {m.group(0)}" for m in re.finditer(
                rf'(?:release\(\s*|\bop\s*(?:==|!=|=)\s*|"op":\s*)"(?:{ops})"', text)]
    assert found == [], found


def test_every_module_is_built_and_installed():
    """Each folder's meson.build lists every .py file in it (a file left
    out is missing from the build tree and from the wheel)."""
    import re
    for folder in [""] + sorted(FOLDERS):
        d = os.path.join(PY_SRC, folder)
        with open(os.path.join(d, "meson.build")) as f:
            listed = set(re.findall(r"'([^']+\.py)'", f.read()))
        present = {f for f in os.listdir(d) if f.endswith(".py")}
        assert listed == present, (folder or "bulkhead", sorted(present - listed), sorted(listed - present))


def _sources(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _dirs, files in os.walk(root) for f in files if f.endswith(".py"))


def _module_imports(root, top_name):
    """({module: source path}, {module: {(imported module, line, in a
    function)}}) over the package at root's own modules.  A submodule's
    import of its parent packages is left out (Python imports those
    first, whatever the source says)."""
    mods = {}
    for rel in _sources(root):
        name = top_name + "." + rel[:-3].replace(os.sep, ".")
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = rel
    out = {}
    for name, rel in mods.items():
        package = name if rel.endswith("__init__.py") else name.rsplit(".", 1)[0]
        with open(os.path.join(root, rel)) as f:
            tree = ast.parse(f.read(), rel)
        edges = out[name] = set()

        def walk(node, in_function):
            for child in ast.iter_child_nodes(node):
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[:len(package.split(".")) - child.level + 1]
                        base = ".".join(up + ([child.module] if child.module else []))
                    targets = [base] + [f"{base}.{a.name}" for a in child.names]
                for t in targets:
                    if t in mods and t != name and not name.startswith(t + "."):
                        edges.add((t, child.lineno, in_function))
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        walk(tree, False)
    return mods, out


def _reaches(graph, a, b):
    """Whether b is reached from a along graph's edges (graph[m]: what m
    leads to, a collection or a dict's keys)."""
    seen, todo = set(), [a]
    while todo:
        m = todo.pop()
        if m == b:
            return True
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return False


def _import_cycles(root, top_name, lazy_face=True, through_deferred=False):
    """'path:line: a -> b -> ... -> a' for every import that closes a
    cycle: a top-level one, or one deferred into a function to break it
    (a later top-level import there would be an ImportError).  lazy_face:
    the package face's own deferred imports are allowed (see below).
    through_deferred: the deferred imports that close a cycle through
    other deferred ones (two modules each importing the other inside a
    function: a cycle no top-level import shows)."""
    mods, imports = _module_imports(root, top_name)
    top = {m: {t for t, _line, deferred in e
               if not deferred or (through_deferred and not (lazy_face and m == top_name))}
           for m, e in imports.items()}
    return sorted(f"{mods[m]}:{line}: {m} -> {t} -> ... -> {m}"
                  for m, e in imports.items() for t, line, deferred in e
                  if _reaches(top, t, m) and not (lazy_face and deferred and m == top_name)
                  and (deferred or not through_deferred))


def test_no_import_cycles():
    """The package's modules import each other without a cycle, and no
    import is deferred into a function to break one.  The package face
    (bulkhead/__init__.py) loads its host names lazily on purpose: `import
    bulkhead` in a worker must not import host code."""
    assert _import_cycles(PY_SRC, "bulkhead") == []


def test_no_cycle_is_hidden_by_deferring_both_ends():
    """Nor do two modules import each other each inside a function (the
    worker's node runner and its server shim did: the runner imports the
    shim, and hands it the pack's routes)."""
    assert _import_cycles(PY_SRC, "bulkhead", through_deferred=True) == []


def test_the_deferred_cycle_scan_sees_one(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def face():\n    from . import f\n")
    (pkg / "f.py").write_text("def run():\n    from . import g\n")
    (pkg / "g.py").write_text("import p\ndef serve():\n    from .f import run\n")
    (pkg / "h.py").write_text("def lazy():\n    from . import g\n")   # deferred, no cycle: fine
    assert _import_cycles(str(pkg), "p") == []
    assert _import_cycles(str(pkg), "p", through_deferred=True) == [
        "f.py:2: p.f -> p.g -> ... -> p.f",
        "g.py:3: p.g -> p.f -> ... -> p.g",
    ]


def test_the_cycle_scan_sees_one(tmp_path):
    """The scan above can fail: a cycle closed at the top level, and one
    broken by a function-body import, are both named with their lines."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\nfrom . import b\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from .. import a\n")
    (pkg / "d.py").write_text("from .e import x\n")
    (pkg / "e.py").write_text("from . import d\nx = 1\n")
    # a -> b -> c is no cycle at the top level: c's deferred import closes one
    assert _import_cycles(str(pkg), "p") == [
        "d.py:1: p.d -> p.e -> ... -> p.d",
        "e.py:1: p.e -> p.d -> ... -> p.e",
        "sub/c.py:2: p.sub.c -> p.a -> ... -> p.sub.c",
    ]


def _private_imports(root, top_name, modules=()):
    """'path:line: from a import _b' for every import of a _-prefixed name
    from another of the package's modules (a module's private name is its
    own: what another module needs is public).  A _-prefixed module of the
    package (bulkhead._native, bulkhead._importwatch) is a module, not a
    name, and dunders (__version__) are public."""
    mods, _imports = _module_imports(root, top_name)
    known = set(mods) | set(modules)
    found = []
    for name, rel in mods.items():
        package = name if rel.endswith("__init__.py") else name.rsplit(".", 1)[0]
        with open(os.path.join(root, rel)) as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base != top_name and not base.startswith(top_name + "."):
                continue
            for a in node.names:
                n = a.name
                if n.startswith("_") and not n.startswith("__") and f"{base}.{n}" not in known:
                    found.append(f"{rel}:{node.lineno}: from {base} import {n}")
    return sorted(found)


def test_no_module_imports_another_ones_private_names():
    """What one module takes from another is that module's public surface:
    no product module imports a _-prefixed name from another bulkhead
    module."""
    assert _private_imports(PY_SRC, "bulkhead", modules=("bulkhead._native",)) == []


def test_the_private_import_scan_sees_one(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '1'\n")
    (pkg / "_util.py").write_text("def helper():\n    pass\n")
    (pkg / "a.py").write_text("def _own():\n    pass\n_table = {}\nclass _Reader:\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from .. import _util, __version__\n"           # a module and a dunder: fine
        "from .._util import helper as _helper\n"       # a public name, aliased: fine
        "from ..a import _own, _Reader\n"               # two private names
        "def f():\n    from p.a import _table\n")     # one more, deferred, absolute
    assert _private_imports(str(pkg), "p") == [
        "sub/b.py:3: from p.a import _Reader",
        "sub/b.py:3: from p.a import _own",
        "sub/b.py:5: from p.a import _table",
    ]


def test_the_worker_lock_has_one_owner():
    """Outside host/workers.py the worker lock is taken through
    Worker.holding, never as the private attribute."""
    import re
    found = []
    for rel in package_sources():
        if rel == os.path.join("host", "workers.py"):
            continue
        with open(os.path.join(PY_SRC, rel)) as f:
            for n, line in enumerate(f, 1):
                if re.search(r"\b(?!self\b)\w+\._lock\b", line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], found


def test_the_architecture_page_lists_every_module():
    """docs/architecture.md's module map names every module of the package
    (a row naming it, host/nodes.py in backquotes), and no module that is
    gone."""
    import re
    with open(os.path.join(os.path.dirname(os.path.dirname(PY_SRC)), "docs", "architecture.md")) as f:
        page = f.read()
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", page, re.M))
    present = set(package_sources())
    assert listed == present, (sorted(present - listed), sorted(listed - present))


# --- the C core: src/core/*.c call each other without a circle ---------

def _core_calls(archive):
    """{file: {file it calls: [symbols]}} among the objects of the core's
    static library (nm: what each defines and what it leaves undefined)."""
    import collections
    import re
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True, check=True).stdout
    defined, wanted = {}, collections.defaultdict(set)
    for line in out.splitlines():
        m = re.match(r"[^:]*:(?:.*/)?([\w.]+?)\.o:\s*(?:[0-9a-f]+\s+)?([A-Za-z])\s+(\S+)$", line)
        if not m:
            continue
        obj, kind, sym = m.groups()
        if kind == "U":
            wanted[obj].add(sym)
        elif kind in "TDBRVWC":
            defined.setdefault(sym, obj)
    calls = collections.defaultdict(dict)
    for obj, syms in wanted.items():
        for sym in syms:
            to = defined.get(sym)
            if to is not None and to != obj:
                calls[obj].setdefault(to, []).append(sym)
    return calls


def _circles(calls):
    """'a -> b -> ... -> a' for each call that closes a circle."""
    return sorted(f"{a} -> {b} ({', '.join(sorted(syms))}) -> ... -> {a}"
                  for a, to in calls.items() for b, syms in to.items() if _reaches(calls, b, a))


def test_the_c_core_has_no_call_circle():
    """Each src/core/*.c builds on others without a circle (the channel on
    the pool, never the pool on the channel: bh_arena_take takes a
    bh_pool *), read from what each object of the built core defines and
    needs."""
    import shutil
    build = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(os.path.dirname(os.path.dirname(PY_SRC)),
                                                                           "build", "rel")))
    archive = os.path.join(build, "src", "core", "libbulkhead_core.a")
    if shutil.which("nm") is None or not os.path.isfile(archive):
        import pytest
        pytest.skip(f"needs nm and the built core ({archive}: make build)")
    calls = _core_calls(archive)
    assert "error.c" in calls.get("shm.c", {}), calls  # the scan read the objects (bh__close)
    assert _circles(calls) == []


def test_the_c_circle_scan_sees_one():
    calls = {"shm.c": {"channel.c": ["bh_channel_block_acquire"], "error.c": ["bh__close"]},
             "channel.c": {"shm.c": ["bh__pool_acquire"]}}
    assert _circles(calls) == ["channel.c -> shm.c (bh__pool_acquire) -> ... -> channel.c",
                               "shm.c -> channel.c (bh_channel_block_acquire) -> ... -> shm.c"]
