"""The package's layout: folders name the process a file runs in, and a
worker never imports host code (STYLE.md, "The Python glue").

  channel/  both processes (what crosses the channel)
  host/     the ComfyUI (host) process
  worker/   the worker process
  envs/     pack configs and environments (host, CLI, install.py)
  *.py      the top level: used by both processes

Checked twice: statically (every import statement of every worker-side
and shared file, relative ones resolved) and in a real worker process
(what its sys.modules holds after it served a node pack's calls).
"""

import ast
import os
import subprocess
import sys

import bulkhead

from test_memory import PY_SRC, package_sources

FOLDERS = {"channel", "host", "worker", "envs"}
# What each side may import of the package's folders.
MAY_IMPORT = {
    "worker": {"channel", "worker", "top"},
    "channel": {"channel", "top"},
    "top": {"channel", "top"},        # the shared top-level modules
    "envs": {"channel", "envs", "top"},
    "host": {"channel", "host", "envs", "top"},
}
# Top-level modules that are not shared by both processes but are entry
# points of their own: `python -m bulkhead` (install, env, doctor) and the
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
    assert top == ["__init__.py", "__main__.py", "_importwatch.py", "packimport.py", "pager.py"]
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
        "class Echo:\n"
        "    @classmethod\n"
        "    def INPUT_TYPES(cls):\n"
        "        return {'required': {'x': ('INT', {'default': 1})}}\n"
        "    RETURN_TYPES = ('INT',)\n"
        "    FUNCTION = 'run'\n"
        "    def run(self, x):\n"
        "        return (x + 1,)\n"
        "NODE_CLASS_MAPPINGS = {'Echo': Echo}\n")
    comfy = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comfyui")
    w = bulkhead.Worker(sys.executable, name="layout", cwd=comfy,
                        env={"BULKHEAD_PACK_DIR": str(pack), "BULKHEAD_COMFYUI": comfy})
    try:
        meta = w.call("bulkhead.worker.nodes:describe")
        assert "Echo" in str(meta)
        assert w.call("bulkhead.worker.nodes:run", "Echo", {"x": 41}, None, None)["outputs"] == (42,)
        loaded = w.call("builtins:eval", "sorted(m for m in __import__('sys').modules if m.startswith('bulkhead'))")
        # every name the host calls in a worker is a function there (channel/targets.py)
        missing = w.call("builtins:eval", "[t for t in __import__('bulkhead.channel.targets', fromlist=['x'])"
                                          ".WORKER_TARGETS if not callable(getattr(__import__(t.split(':')[0], "
                                          "fromlist=['x']), t.split(':')[1], None))]")
    finally:
        w.close()
    assert [m for m in loaded if m.startswith(("bulkhead.host", "bulkhead.envs"))] == [], loaded
    assert "bulkhead.worker.nodes" in loaded
    assert missing == [], missing


def test_the_words_of_the_crossing_are_written_once():
    """Outside channel/targets.py no module writes a call target of the
    other side as a string literal (a rename must change one place)."""
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
