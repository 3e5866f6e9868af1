"""comfy-env.toml: where configs are found, what is read, every error and
warning, and the config hash."""

import hashlib
import json
import os
import sys
import textwrap
import types
import warnings

import pytest

import bulkhead
from bulkhead.envs import config as packconfig
from bulkhead.envs.config import PackConfigError, PackConfigWarning


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def load_text(tmp_path, text, name="pack", warn=False):
    return packconfig.load(write(os.path.join(tmp_path, name, "comfy-env.toml"), text), warn=warn)


def error_of(tmp_path, text):
    with pytest.raises(PackConfigError) as ei:
        load_text(tmp_path, text)
    return ei.value


# --- discovery ---

def test_discovery_order_names_and_roots(tmp_path):
    pack = tmp_path / "MyPack"
    for d in ("", "nodes", "nodes/b", "nodes/a"):
        write(os.path.join(pack, d, "comfy-env.toml"), "")
    write(os.path.join(pack, "nodes/a/deeper/comfy-env.toml"), "")   # too deep: not a config
    write(os.path.join(pack, "nodes/.hidden/comfy-env.toml"), "")
    write(os.path.join(pack, "nodes/c/other.toml"), "")
    write(os.path.join(pack, "other/comfy-env.toml"), "")            # not one of the three places
    found = packconfig.find_configs(pack)
    assert found == [os.path.join(pack, p, "comfy-env.toml") for p in ("", "nodes", "nodes/a", "nodes/b")]
    configs = packconfig.load_configs(pack)
    assert [c.name for c in configs] == ["MyPack", "MyPack", "MyPack.a", "MyPack.b"]
    assert {c.root for c in configs} == {str(pack)}
    # load() on its own infers the same root from where the file lies
    assert [packconfig.load(p).root for p in found] == [str(pack)] * 4
    assert [c.directory for c in configs] == [os.path.dirname(p) for p in found]


def test_config_for_picks_the_deepest(tmp_path):
    pack = tmp_path / "p"
    for d in ("", "nodes/a"):
        write(os.path.join(pack, d, "comfy-env.toml"), "")
    root, a = packconfig.load_configs(pack)
    assert packconfig.config_for([root, a], pack / "nodes" / "a" / "x.py") is a
    assert packconfig.config_for([root, a], pack / "nodes" / "a") is a
    assert packconfig.config_for([root, a], pack / "nodes" / "ab" / "x.py") is root
    assert packconfig.config_for([root, a], pack / "__init__.py") is root
    assert packconfig.config_for([a], pack / "__init__.py") is None


def test_only_subdirs_and_none(tmp_path):
    pack = tmp_path / "p"
    write(os.path.join(pack, "nodes/z/comfy-env.toml"), "")
    write(os.path.join(pack, "nodes/y/comfy-env.toml"), "")
    assert [c.name for c in packconfig.load_configs(pack)] == ["p.y", "p.z"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert packconfig.find_configs(empty) == []
    with pytest.raises(FileNotFoundError):
        packconfig.find_configs(tmp_path / "nope")
    with pytest.raises(NotADirectoryError):
        packconfig.find_configs(write(os.path.join(tmp_path, "f"), ""))


# --- what is read ---

def test_full_config(tmp_path):
    c = load_text(tmp_path, """
        python = "3.12"
        requirements = ["Pillow>=9", "  scipy   <2 ", "numpy<2", "Foo_Bar [X] >= 1 ; python_version  <  '3.13'"]

        [env_vars]
        OMP_NUM_THREADS = "1"
        LEVEL = 3

        [pypi-dependencies]
        numpy = "<2"
        Trimesh = { version = ">=4", extras = ["easy"] }
        any_thing = "*"
        exact = "1.2.3"
        local = { path = "wheels/local-1.0-py3-none-any.whl" }
        fromgit = { git = "https://example.org/x.git", rev = "abc123" }
        fromurl = { url = "https://example.org/y-1.0.tar.gz" }

        [bulkhead]
        idle_release_s = 30
        call_timeout_s = 1.5
        release_timeout_s = 10
        start_timeout_s = 120
    """)
    d = os.path.join(tmp_path, "pack")
    assert c.path == os.path.join(d, "comfy-env.toml") and c.root == d and c.name == "pack"
    assert c.python == "3.12"
    assert dict(c.env_vars) == {"OMP_NUM_THREADS": "1", "LEVEL": "3"}
    assert c.requirements == tuple(sorted([
        "numpy<2", "pillow>=9", "scipy<2", "trimesh[easy]>=4", "any-thing", "exact==1.2.3",
        "foo-bar[X]>=1; python_version < '3.13'",
        f"local @ file://{d}/wheels/local-1.0-py3-none-any.whl",
        "fromgit @ git+https://example.org/x.git@abc123",
        "fromurl @ https://example.org/y-1.0.tar.gz"]))
    assert dict(c.options) == {"idle_release_s": 30.0, "call_timeout_s": 1.5,
                               "release_timeout_s": 10.0, "start_timeout_s": 120.0}
    assert c.warnings == ()
    # frozen and read-only all the way down, yet usable as a dict key
    with pytest.raises(Exception):
        c.name = "x"
    with pytest.raises(TypeError):
        c.env_vars["X"] = "1"
    assert {c: 1}[c] == 1
    assert isinstance(c, bulkhead.PackConfig)


def test_python_forms(tmp_path):
    assert load_text(tmp_path, "").python is None
    assert load_text(tmp_path, 'python = "3.11.7"').python == "3.11.7"
    assert load_text(tmp_path, 'python = "../py/bin/python3"').python == os.path.join(tmp_path, "py/bin/python3")
    assert load_text(tmp_path, 'python = "/opt/x/bin/python"').python == "/opt/x/bin/python"
    assert load_text(tmp_path, 'python = "~/bin/python3"').python == os.path.expanduser("~/bin/python3")


def test_empty_file_is_a_valid_config(tmp_path):
    c = load_text(tmp_path, "# nothing\n")
    assert c.requirements == () and dict(c.env_vars) == {} and dict(c.options) == {} and c.warnings == ()


# --- errors ---

def test_syntax_error_names_file_line_and_column(tmp_path):
    e = error_of(tmp_path, """
        python = "3.12"

        [env_vars]
        A = "1"
        B = = 2
    """)
    assert e.path.endswith("comfy-env.toml") and e.line == 5 and e.column == 5
    assert str(e).startswith(f"{e.path}:5:5: TOML syntax error: ")
    assert "(at line" not in str(e)
    assert isinstance(e, bulkhead.PackConfigError) and isinstance(e, ValueError)


def test_nesting_too_deep_names_file_and_line(tmp_path):
    """Arrays nested past what the TOML reader can recurse into: a
    PackConfigError naming the file and the line (a bare RecursionError)."""
    e = error_of(tmp_path, 'python = "3.12"\n# a [ in a comment\ns = "[[["\n\n[env_vars]\nA = '
                 + "[" * 5000 + "]" * 5000 + "\n")
    assert e.line == 6 and "nest deeper than a TOML reader can follow" in str(e)
    assert str(e).startswith(f"{e.path}:6: ")


def test_unterminated_table_header(tmp_path):
    e = error_of(tmp_path, 'python = "3.12"\n[bulkhead\n')
    assert e.line == 2 and ":2:" in str(e)


@pytest.mark.parametrize("text, key, line, expected", [
    ('python = [3]\n', "python", 1, "must be a string"),
    ('# x\n\nrequirements = "numpy"\n', "requirements", 3, "must be an array of pip requirement strings"),
    ('requirements = ["a",\n  7]\n', "requirements", 1, "must be an array of strings (item 1)"),
    ('[env_vars]\nA = "1"\nB = [1]\n', "env_vars.B", 3, "must be a string, not an array"),
    ('[env_vars]\nA = { x = 1 }\n', "env_vars.A", 2, "must be a string, not a table"),
    ('[pypi-dependencies]\nnumpy = 2\n', "pypi-dependencies.numpy", 2, "a version spec string or a table"),
    ('[pypi-dependencies]\nx = { version = 2 }\n', "pypi-dependencies.x.version", 2, "must be a string"),
    ('[pypi-dependencies]\nx = { extras = "a" }\n', "pypi-dependencies.x.extras", 2, "an array of extra names"),
    ('[bulkhead]\nidle_release_s = "30"\n', "bulkhead.idle_release_s", 2, "must be a number of seconds, not a string"),
    ('[bulkhead]\n\ncall_timeout_s = true\n', "bulkhead.call_timeout_s", 3, "not a boolean"),
    ('env_vars = 3\n', "env_vars", 1, "must be a table"),
    ('bulkhead = []\n', "bulkhead", 1, "must be a table"),
])
def test_type_errors_name_key_type_and_line(tmp_path, text, key, line, expected):
    e = error_of(tmp_path, text)
    assert e.key == key and e.line == line, str(e)
    assert expected in str(e)
    assert str(e).startswith(f"{e.path}:{line}: ")
    assert key.split(".")[-1] in str(e)


def test_unknown_bulkhead_key_is_a_warning_naming_key_file_line(tmp_path):
    """A tuning key misspelled costs its default, never the isolation."""
    c = load_text(tmp_path, """
        python = "3.12"
        [bulkhead]
        idle_release_s = 3
        idle_relase_s = 4
    """)
    assert c.options == {"idle_release_s": 3.0}
    [w] = c.warnings
    assert w.startswith(f"{c.path}:4: [bulkhead] unknown key 'idle_relase_s' (did you mean 'idle_release_s'?): "
                        "ignored, its default kept"), w
    assert "call_timeout_s" in w           # the known keys are listed


def test_interrupt_grace_and_prewarm(tmp_path):
    c = load_text(tmp_path, """
        [bulkhead]
        interrupt_grace_s = 0
        prewarm = "startup"
    """)
    assert c.options == {"interrupt_grace_s": 0.0, "prewarm": "startup"}
    e = error_of(tmp_path, """
        [bulkhead]
        prewarm = "soon"
    """)
    assert e.line == 2 and e.key == "bulkhead.prewarm"
    assert str(e).startswith(f"{e.path}:2: [bulkhead] prewarm = 'soon': must be one of 'prompt', 'startup', 'off'")
    e = error_of(tmp_path, "[bulkhead]\nprewarm = 1\n")
    assert e.line == 2 and "must be one of" in str(e)
    e = error_of(tmp_path, "[bulkhead]\ninterrupt_grace_s = -1\n")
    assert e.line == 2 and "interrupt_grace_s = -1: must be >= 0" in str(e)
    [w] = load_text(tmp_path, "[bulkhead]\nprewarn = 'off'\n").warnings
    assert "known keys:" in w and "(did you mean 'prewarm'?)" in w and "interrupt_grace_s" in w


def test_sandbox_keys(tmp_path):
    """The sandbox's keys (host/sandbox.py): a mode word, a flag, path
    arrays; a wrong type names the key and what it takes."""
    c = load_text(tmp_path, """
        [bulkhead]
        sandbox = "required"
        network = false
        sandbox_read = ["~/datasets"]
        sandbox_write = ["cache", "/mnt/models"]
    """)
    assert c.options == {"sandbox": "required", "network": False, "sandbox_read": ("~/datasets",),
                         "sandbox_write": ("cache", "/mnt/models")}
    e = error_of(tmp_path, "[bulkhead]\nnetwork = 0\n")
    assert e.line == 2 and e.key == "bulkhead.network" and "true or false" in str(e), str(e)
    e = error_of(tmp_path, "[bulkhead]\nsandbox_write = \"/tmp\"\n")
    assert e.line == 2 and "an array of paths" in str(e), str(e)
    e = error_of(tmp_path, "[bulkhead]\nsandbox = \"strict\"\n")
    assert "must be one of 'on', 'off', 'required'" in str(e), str(e)


def test_bulkhead_key_as_dotted_and_inline(tmp_path):
    [w] = load_text(tmp_path, 'python = "3.12"\nbulkhead.nope = 1\n').warnings
    assert ":2: [bulkhead] unknown key 'nope'" in w
    [w] = load_text(tmp_path, 'python = "3.12"\n\nbulkhead = { idle_release_s = 1, nope = 2 }\n').warnings
    assert ":3: [bulkhead] unknown key 'nope'" in w


@pytest.mark.parametrize("text, line, expected", [
    ('python = "three"\n', 1, 'expected a version like "3.12"'),
    ('# c\npython = "3.8"\n', 2, "needs Python 3.9 or newer"),
    ('[bulkhead]\ncall_timeout_s = 0\n', 2, "must be > 0"),
    ('[bulkhead]\nidle_release_s = -1\n', 2, "must be >= 0"),
    ('[bulkhead]\nrelease_timeout_s = nan\n', 2, "must be > 0"),
    ('requirements = ["--index-url=http://x"]\n', 1, "not pip options"),
    ('requirements = [" "]\n', 1, "is empty"),
    ('[env_vars]\nBULKHEAD_FD = "9"\n', 2, "set by bulkhead itself"),
    ('[env_vars]\n"A-B" = "1"\n', 2, "not a valid environment variable name"),
    ('[pypi-dependencies]\nnumpy = "two"\n', 2, "is not a version specifier"),
    ('[pypi-dependencies]\nx = { path = "a", git = "b" }\n', 2, "give one of path, url, git"),
    ('[pypi-dependencies]\nx = { version = "1", wat = 1 }\n', 2, "unknown key 'wat'"),
    ('[pypi-dependencies]\nx = { path = "a", editable = true }\n', 2, "editable installs are not supported"),
])
def test_value_errors(tmp_path, text, line, expected):
    e = error_of(tmp_path, text)
    assert e.line == line and expected in str(e), str(e)


def test_not_utf8(tmp_path):
    p = os.path.join(tmp_path, "pack", "comfy-env.toml")
    os.makedirs(os.path.dirname(p))
    with open(p, "wb") as f:
        f.write(b'python = "3.12"\n# caf\xe9\n')
    with pytest.raises(PackConfigError, match=r":2: not UTF-8"):
        packconfig.load(p)


def test_without_a_toml_parser(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(PackConfigError, match=r"no tomllib \(3.11\+\) and no tomli; install it with: .* -m pip install tomli"):
        load_text(tmp_path, 'python = "3.12"\n')


def test_tomli_fallback(tmp_path, monkeypatch):
    tomllib = pytest.importorskip("tomllib")
    calls = []

    def loads(text):
        calls.append(text)
        return tomllib.loads(text)
    fake = types.ModuleType("tomli")
    fake.loads, fake.TOMLDecodeError = loads, tomllib.TOMLDecodeError
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", fake)
    assert load_text(tmp_path, 'python = "3.12"\n').python == "3.12" and calls
    e = error_of(tmp_path, 'python = \n')
    assert e.line == 1


# --- warnings ---

def test_unimplemented_tables_warn_once_each(tmp_path):
    text = """
        python = "3.12"
        channels = ["conda-forge"]

        [dependencies]
        ffmpeg = "*"
        python = "3.12.*"

        [tasks]
        start = "python x.py"

        [cuda]
        packages = ["nvdiffrast"]

        [[feature.gpu.tasks]]
        x = 1

        [pypi-dependencies]
        numpy = "*"
    """
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        c = load_text(tmp_path, text, warn=True)
    got = [str(w.message) for w in rec if issubclass(w.category, PackConfigWarning)]
    assert got == list(c.warnings)
    assert len(got) == 3, got
    by = {}
    for w in got:
        assert w.startswith(c.path + ":")
        for t in ("tasks", "feature"):
            if f"table [{t}]" in w:
                by[t] = w
    assert set(by) == {"tasks", "feature"}
    assert f"{c.path}:8: table [tasks]" in by["tasks"] and "NOT run" in by["tasks"]
    assert [w for w in got if "'channels'" in w and "has no effect" in w and ":2:" in w]
    # conda [dependencies] and [cuda] are read now (envs/conda.py, envs/cudawheels.py); python there is
    # the venv's interpreter, pinned in the solve, not a conda package
    assert c.conda == ("ffmpeg",) and c.channels == ("conda-forge",) and c.cuda == ("nvdiffrast",)
    # still read: the parts it implements
    assert c.requirements == ("numpy",) and c.python == "3.12"


def test_warning_once_per_process_by_default(tmp_path):
    text = '[tasks]\nx = "y"\n'
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(3):
            load_text(tmp_path, text, name="once", warn=True)
    assert len([w for w in rec if issubclass(w.category, PackConfigWarning)]) == 1


def test_known_tables_do_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = load_text(tmp_path, """
            python = "3.11"
            requirements = []
            [env_vars]
            [pypi-dependencies]
            [bulkhead]
        """, warn=True)
    assert c.warnings == ()


# --- the hash ---

BASE = """
    python = "3.12"
    requirements = ["scipy"]
    [pypi-dependencies]
    numpy = "<2"
    pillow = "*"
"""

def test_hash_is_stable_under_formatting_and_runtime_keys(tmp_path):
    h = load_text(tmp_path, BASE).config_hash
    # reordered, re-spaced, commented, names in another case, another pack
    # name, and the run-time tables changed: the same environment
    c = load_text(tmp_path, """
        # a comment
        python = "3.12"
        requirements = ["  SciPy "]
        [pypi-dependencies]
        Pillow="*"
        NumPy   =   " <2 "
        [env_vars]
        X = "1"
        [bulkhead]
        idle_release_s = 5
        [tasks]
        t = "warned about, not hashed"
    """, name="other-name")
    assert c.config_hash == h and len(h) == 64 and c.hash12 == h[:12]
    # a requirement listed in either place, or twice, is the same requirement
    c2 = load_text(tmp_path, 'python = "3.12"\nrequirements = ["numpy<2", "pillow", "scipy", "scipy"]\n', name="x2")
    assert c2.config_hash == h


@pytest.mark.parametrize("change", [
    BASE.replace('"3.12"', '"3.11"'),
    BASE.replace('"<2"', '">=2"'),
    BASE.replace('"scipy"', '"scipy", "torch"'),
    BASE.replace('python = "3.12"\n', ""),
])
def test_hash_changes_with_the_environment(tmp_path, change):
    assert load_text(tmp_path, change, name="b").config_hash != load_text(tmp_path, BASE, name="a").config_hash


def test_hash_is_the_documented_digest(tmp_path):
    # The hash names every environment's directory: a change to the
    # normalisation must bump packconfig.HASH_FORMAT (and this value).
    c = load_text(tmp_path, BASE)
    want = hashlib.sha256(json.dumps({
        "format": packconfig.HASH_FORMAT, "protocol": bulkhead._native.PROTOCOL_VERSION, "python": "3.12",
        "requirements": ["numpy<2", "pillow", "scipy"]}, sort_keys=True).encode()).hexdigest()
    assert c.config_hash == want
    if packconfig.HASH_FORMAT == 1 and bulkhead._native.PROTOCOL_VERSION == 1:
        assert want == GOLDEN


GOLDEN = "19ebc1c90d35fc11e70c36de7171a4e13c205594ce7fdd6fd3e3998b4e551ddc"
