"""The product source's shape and words, checked over its text: no Python
function longer than a screenful or two (issue #39: envs/config.py's load
was 215 lines of one block per key), no comment, docstring or doc naming
a file the repository does not hold (comments that sent the reader to
files that had moved), and no import inside a function without its
reason in a word (223 said none)."""

import ast
import io
import os
import re
import tokenize

from pkgsource import PY_SRC, package_sources

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

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


# --- words that match the code ---

# Folders of the working tree that are no part of the repository's text.
SKIP_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__"}
# A file name as a comment or doc writes it: "host/comfy_env.py", "STYLE.md".
FILE_NAME = re.compile(r"(?<![\w./<>$-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:py|c|h|js|md))(?![\w/])")
# A name right after one of these words (or in a list that follows one:
# "libuv test/runner.c, test/runner-unix.c") is another project's file,
# not the repository's: ComfyUI's, comfy-env's, torch's and libuv's
# sources, and a node pack's own files.
OTHERS = re.compile(r"\b(ComfyUI's|comfy-env's|upstream(?:'s)?|torch's|libuv(?:'s)?|pack's)")


def _others(before):
    """Whether the text before a name ends in one of OTHERS and then only
    names, paths and a list's commas, quotes, parentheses, "and", "or"."""
    found = list(OTHERS.finditer(before))
    if not found:
        return False
    return all(not w or w in ("and", "or") or "/" in w or FILE_NAME.fullmatch(w)
               for w in re.split(r"[\s`'\"(),*]+", before[found[-1].end():]))


# Names of files that are not the repository's, each with why: the
# project's design and house-style documents, kept beside the repository;
# the file a pack's comfy-env-root.toml [types] names its serializers in.
ELSEWHERE = {
    "DESIGN.md": "the project's design document, beside the repository",
    "STYLE.md": "the project's house style, beside the repository",
    "serialization.py": "a node pack's serializer file (comfy-env-root.toml [types])",
}


def _tree_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
        for f in files:
            yield os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")


def _python_words(text):
    """(line, text) of every comment and docstring of a Python source."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                out.append((first.lineno, first.value.value))
    return out


def _c_words(text):
    """(line, text) of every comment of a C or JavaScript source."""
    return [(text.count("\n", 0, m.start()) + 1, m.group())
            for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S)]


def stale_names(root):
    """'path:line: name' for every file name a comment, docstring or doc
    (docs/, README.md) under root writes that no file of root's ends with,
    unless it is another project's (OTHERS, ELSEWHERE) or a placeholder's
    (COMFYUI_DIR/comfy/..., <pack>/...)."""
    files = sorted(_tree_files(root))
    tails = set()
    for f in files:
        parts = f.split("/")
        tails.update("/".join(parts[i:]) for i in range(len(parts)))
    out = []
    for f in files:
        if f.endswith(".py"):
            read = _python_words
        elif f.endswith((".c", ".h", ".js")):
            read = _c_words
        elif f.endswith(".md") and (f.startswith("docs/") or f == "README.md"):
            read = lambda text: [(1, text)]     # noqa: E731
        else:
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for line, words in read(text):
            for m in FILE_NAME.finditer(words):
                name = m.group(1)
                if name.lstrip("./") in tails or name.rsplit("/", 1)[-1] in ELSEWHERE:
                    continue
                if re.match(r"[A-Z][A-Z0-9_]*/", name) or _others(words[max(0, m.start() - 200):m.start()]):
                    continue
                out.append(f"{f}:{line + words.count(chr(10), 0, m.start())}: {name}")
    return out


def test_every_file_a_comment_or_doc_names_is_there():
    assert stale_names(ROOT) == []


def test_the_name_scan_sees_a_stale_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        '"""Reads pkg/b.py and gone/b.py."""\n'
        "x = 'gone/c.py'   # a string is no word; this comment names gone/d.py\n"
        "# ComfyUI's execution.py, libuv test/runner.c, test/task.h; DESIGN.md; COMFYUI_DIR/comfy/x.py\n")
    (tmp_path / "pkg" / "b.py").write_text("")
    (tmp_path / "pkg" / "c.c").write_text("/* see a.py and gone/e.c */\nint x; // and gone/f.h\n")
    (tmp_path / "docs" / "x.md").write_text("Text.\n\n`pkg/a.py`, `gone/g.js`, the pack's `nodes/h.py`\n")
    (tmp_path / "notes.md").write_text("gone/i.py: not a doc\n")
    assert sorted(stale_names(str(tmp_path))) == [
        "docs/x.md:3: gone/g.js",
        "pkg/a.py:1: gone/b.py",
        "pkg/a.py:2: gone/d.py",
        "pkg/c.c:1: gone/e.c",
        "pkg/c.c:2: gone/f.h",
    ]


# --- no re-export blocks ---

def unused_imports(path):
    """The names a module's top-level imports bind that its code never
    reads: kept only for others to import from it (a re-export)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    bound = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound[(a.asname or a.name).split(".")[0]] = node.lineno
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return sorted(name for name in bound if name not in used and name != "annotations")


def test_host_nodes_and_routes_re_export_nothing():
    """host/nodes.py kept 20 names of runtime, states and metadata, and
    host/routes.py 7 of service, "for the code and tests that use them"
    (#39): each reader imports a name from where it lives."""
    for rel in ("host/nodes.py", "host/routes.py"):
        assert unused_imports(os.path.join(PY_SRC, rel)) == [], rel


# Modules whose unread imports are their face: the package's public names
# (__init__.py files), and the ``server`` module a worker gives its pack in
# place of ComfyUI's, on which packs find these names.
FACES = {"worker/server.py": {"UnsendableEvent", "describe_routes"}}


def test_no_module_re_exports():
    """Every name a module imports, it reads (the re-exports of nodes.py,
    routes.py, control.py, release.py and envs/build.py went, #39): a
    reader imports a name from where it lives."""
    found = {}
    for rel in package_sources():
        rel = rel.replace(os.sep, "/")
        if os.path.basename(rel) == "__init__.py":
            continue
        unused = set(unused_imports(os.path.join(PY_SRC, rel))) - FACES.get(rel, set())
        if unused:
            found[rel] = sorted(unused)
    assert found == {}, found


def test_the_re_export_scan_sees_one(tmp_path):
    (tmp_path / "m.py").write_text("from __future__ import annotations\nimport os, sys as system\n"
                                   "from .x import a, b as c  # noqa: F401\nprint(os.sep, c)\n")
    assert unused_imports(str(tmp_path / "m.py")) == ["a", "system"]


# --- why an import stands in a function ---

# The reasons a function-body import of the package may give: a word of a
# comment on its line, a colon and what it is about ("# lazy: worker
# start").  Without one of these there is no reason, and the import belongs
# at the top of its module.  docs/architecture.md ("Imports inside
# functions") says the same.
REASONS = {
    "cycle": "the module named imports this one (or its package) while it loads: at the top the import "
             "would be circular",
    "lazy": "kept out of a start, named next (worker start, ComfyUI start, prestartup, CLI start): only "
            "some calls need it, and it costs there (a worker's start is measured: test_worker_start.py)",
    "optional": "the module named may be missing where this runs (another interpreter, an environment "
                "without it), and the code copes without it",
    "comfyui": "one of ComfyUI's own modules, importable only in a process with ComfyUI on its path",
    "host-only": "host code, from a module a worker imports too, on a path only the host takes (a worker "
                 "never imports host code: test_layout.py)",
}
REASON = re.compile(r"#.*?(?<![\w-])(" + "|".join(map(re.escape, REASONS)) + r"): \S")


def unexplained_imports(root):
    """'path:line: import ...' for every import statement inside a function
    (methods and nested functions too) of the .py files under root whose
    lines carry no comment giving a reason of REASONS."""
    out = []
    for path in sorted(os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files if f.endswith(".py")):
        with open(path) as fh:
            text = fh.read()
        comments = {}
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type == tokenize.COMMENT:
                comments[t.start[0]] = t.string
        lines = text.splitlines()

        def walk(node, in_function):
            for child in ast.iter_child_nodes(node):
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    said = " ".join(comments.get(n, "") for n in range(child.lineno, child.end_lineno + 1))
                    if not REASON.search(said):
                        out.append(f"{os.path.relpath(path, root)}:{child.lineno}: {lines[child.lineno - 1].strip()}")
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        walk(ast.parse(text, path), False)
    return out


def test_every_function_body_import_says_why():
    """An import inside a function says why it is not at the top of its
    module, in a word of REASONS (STYLE.md: "A lazy import says why in one
    word where it stands"): cycle (the module named imports this one),
    lazy (kept out of a start: worker start, ComfyUI start, prestartup, CLI
    start), optional (may be missing: torch, aiohttp, tomli...), comfyui
    (ComfyUI's own module), host-only (host code in a module a worker
    imports too).  One with no reason is at the top (223 said none)."""
    assert unexplained_imports(PY_SRC) == []


def test_the_import_reason_scan_sees_one(tmp_path):
    (tmp_path / "m.py").write_text(
        "import json\n"
        "def f():\n"
        "    import re\n"
        "    import torch  # optional: torch\n"
        "    from . import (a,   # cycle: p.a\n"
        "                   b)\n"
        "    import socket  # only sometimes\n"
        "    import enum  # noqa: F401; lazy: worker start\n"
        "    import zlib  # relazy: x\n"
        "    class C:\n"
        "        def g(self):\n"
        "            import ssl\n"
        "    return lambda: __import__('x')\n")
    assert unexplained_imports(str(tmp_path)) == [
        "m.py:3: import re",
        "m.py:7: import socket  # only sometimes",
        "m.py:9: import zlib  # relazy: x",
        "m.py:12: import ssl",
    ]
