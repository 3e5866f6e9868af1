"""The package's Python sources, for the tests that read them (test_memory,
test_layout, test_contract, test_routes): where they are, every file, and
the scan for assignments to a comfy module with its worker-side
exemptions."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_SRC = os.path.join(ROOT, "python", "bulkhead")


# Host-side code may assign exactly one thing in a comfy module.  Worker-
# side code (its own process, where bulkhead is every caller) is exempt:
# these files, and these functions in shared files.
WORKER_FILES = {"worker/__init__.py", "worker/__main__.py", "worker/memory.py", "worker/nodes.py"}
WORKER_FUNCTIONS = {("pager.py", "bring_up"), ("channel/formats.py", "apply_host_folders"),
                    ("channel/formats.py", "decode_arg")}


def package_sources():
    """Every .py file of the package, as a path relative to its root
    ("host/nodes.py"), sorted."""
    out = []
    for d, _dirs, files in os.walk(PY_SRC):
        out += [os.path.relpath(os.path.join(d, f), PY_SRC) for f in files if f.endswith(".py")]
    return sorted(out)


ALLOWED = {"EXTRA_RESERVED_VRAM"}


def comfy_assignments(source, filename):
    """'file:line: target' for every assignment to an attribute of a comfy
    module: names bound by `import comfy...`, `from comfy... import`,
    `x = sys.modules.get("comfy...")`, and the conventional `mm`/`self.mm`."""
    tree = ast.parse(source, filename)
    comfy_names = {"mm", "self.mm"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "comfy":
                    comfy_names.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "comfy":
            comfy_names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = ast.unparse(node.value)
            if "sys.modules" in call and "comfy" in call:
                comfy_names.update(ast.unparse(t) for t in node.targets)
    exempt = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (filename, node.name) in WORKER_FUNCTIONS:
            exempt.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr=ast.unparse(node.args[1])
                                     if len(node.args) > 1 else "?")]
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr not in ALLOWED:
                base = ast.unparse(t.value)
                if base in comfy_names or base.split(".")[0] == "comfy":
                    found.append((node.lineno, f"{filename}:{node.lineno}: {base}.{t.attr}"))
    return [text for _, text in sorted(found)]
