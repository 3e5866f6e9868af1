"""The product source's shape, checked over its text: no Python function
longer than a screenful or two (issue #39: envs/config.py's load was 215
lines of one block per key)."""

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY_SRC = os.path.join(ROOT, "python", "bulkhead")

# The longest a function of the package may be, in lines from its def to
# its last line (docstring and comments included).
MAX_FUNCTION_LINES = 100


def long_functions(root, limit=MAX_FUNCTION_LINES):
    """'path:line: name is N lines' for every function (methods and nested
    functions too) of the .py files under root longer than limit."""
    out = []
    for d, _dirs, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            with open(path) as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        out.append(f"{os.path.relpath(path, root)}:{node.lineno}: {node.name} is {n} lines")
    return sorted(out)


def test_no_function_is_over_100_lines():
    assert os.path.isfile(os.path.join(PY_SRC, "__init__.py")), PY_SRC
    assert long_functions(PY_SRC) == []


def test_the_length_scan_sees_one(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(100))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\nclass C:\n    def long(self):\n{body}")
    assert long_functions(str(tmp_path)) == ["m.py:5: long is 101 lines"]
