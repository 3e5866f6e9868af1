"""API presence and the one-binary-for-every-interpreter promise."""

import glob
import os
import subprocess
import sys

import pytest

import bulkhead
from bulkhead import _native

from conftest import WORKER_VENVS


def test_public_api():
    for name in ("Worker", "WorkerDied", "WorkerStartError", "CallTimeout", "RemoteError",
                 "BulkheadError", "ProtocolError", "PeerClosed", "Timeout", "RemoteCallable",
                 "RemoteObject", "HandleError"):
        assert hasattr(bulkhead, name), name
    assert issubclass(bulkhead.WorkerDied, bulkhead.BulkheadError)
    assert issubclass(bulkhead.ProtocolError, _native.Error)
    for name in ("channel_open", "spawn", "strerror", "dtypes", "Channel", "Lease", "Proc"):
        assert hasattr(_native, name), name
    assert _native.PROTOCOL_VERSION >= 1
    # The idle sweep is each worker's own timer (worker_memory.on_idle); no
    # process decides it for several workers, so policy.c's rule has no
    # binding to drift from.
    assert not hasattr(_native, "policy_idle_sweep")


def test_pack_environment_api():
    # exported lazily: `import bulkhead` (every worker start) does not load them
    r = subprocess.run([sys.executable, "-c", "import bulkhead, sys; "
                        "print(sorted(m for m in sys.modules if m in ('bulkhead.envs', 'bulkhead.packconfig')))"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
    for name in ("install", "env_status", "EnvStatus", "EnvBuildError", "PackConfig", "PackConfigError",
                 "PackConfigWarning"):
        assert hasattr(bulkhead, name) and name in dir(bulkhead), name
    assert issubclass(bulkhead.PackConfigError, bulkhead.BulkheadError)
    assert issubclass(bulkhead.PackConfigError, ValueError)
    assert issubclass(bulkhead.EnvBuildError, bulkhead.BulkheadError)
    assert issubclass(bulkhead.PackConfigWarning, UserWarning)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bulkhead.nope


def test_native_is_one_abi3_binary():
    assert _native.__file__.endswith(".abi3.so")
    d = os.path.dirname(_native.__file__)
    assert [os.path.basename(p) for p in glob.glob(os.path.join(d, "_native*.so"))] == ["_native.abi3.so"]


def _interpreters():
    found = set(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    found.add("/usr/bin/python3")
    out = []
    for p in sorted(found):
        try:
            v = subprocess.run([p, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if v and tuple(map(int, v.split("."))) >= (3, 9):
            out.append(p)
    return out


@pytest.mark.parametrize("python", _interpreters())
def test_native_imports_under_every_interpreter(python):
    root = os.path.dirname(os.path.dirname(_native.__file__))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([python, "-c", "import bulkhead._native as n, sys; print(n.PROTOCOL_VERSION, sys.version_info[:2])"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(_native.PROTOCOL_VERSION))


def test_strerror_names_codes():
    assert "magic" in _native.strerror(10001)
    assert _native.strerror(2)  # errno values too


def test_worker_venvs_cover_other_interpreters():
    if not WORKER_VENVS:
        pytest.skip("no worker venvs built (run `make worker-venvs`)")
    host = "%d.%d." % sys.version_info[:2]
    assert any(host not in name for name in WORKER_VENVS), WORKER_VENVS


# --- the encode hook's tags (src/python/codec.c, Peer.encode_other) -----

class _Tagging:
    """Stands for what a pack sends that is not plain data: the test's
    encode hook answers for it with the tuple it carries."""

    def __init__(self, answer):
        self.answer = answer


def _pair_with_hook():
    """(sender, receiver) of one channel in this process; the sender's
    encode hook answers _Tagging's tuple as it is."""
    import socket
    from bulkhead.channel.peer import Peer

    class Answering(Peer):
        def encode_other(self, obj, node=False):
            return obj.answer if isinstance(obj, _Tagging) else super().encode_other(obj, node)

    ends = []
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s, name, cls in ((a, "a", Answering), (b, "b", Peer)):
        peer = cls(describe=name)
        peer.channel = _native.channel_open(s.detach(), peer, os.getuid(), 0, first_id=1 if name == "a" else 2)
        ends.append(peer.channel)
    return ends


def test_the_encode_hooks_tags_are_named_and_a_stray_one_is_refused():
    """The tuple the encode hook answers starts with one of _native's
    ENCODE_* names, not an unnamed 0/1/2: each crosses as its shape says,
    and any other first item is a TypeError naming the three (it was read
    as a tensor's tuple)."""
    assert len({_native.ENCODE_TENSOR, _native.ENCODE_HANDLE, _native.ENCODE_VALUE}) == 3
    tx, rx = _pair_with_hook()
    try:
        value = [_Tagging((_native.ENCODE_VALUE, {"k": (1, 2)})),
                 _Tagging((_native.ENCODE_TENSOR, _native.TENSOR_NUMPY, _native.dtypes()["uint8"][0], (3,),
                           b"abc"))]
        tx.notify(_native.CALL, value, 0)
        kind, _req, out = rx.recv(5.0)
        assert kind == _native.CALL
        assert out[0] == {"k": (1, 2)}
        assert out[1].tolist() == list(b"abc")
        stray = max(_native.ENCODE_TENSOR, _native.ENCODE_HANDLE, _native.ENCODE_VALUE) + 1
        with pytest.raises(TypeError) as e:
            tx.notify(_native.CALL, _Tagging((stray, _native.TENSOR_NUMPY, 0, (0,), None)), 0)
        for name in ("ENCODE_TENSOR", "ENCODE_HANDLE", "ENCODE_VALUE", "_Tagging"):
            assert name in str(e.value), str(e.value)
    finally:
        tx.close()
        rx.close()


def test_the_python_side_answers_the_encode_hook_with_named_tags():
    """No tuple the Python side returns starts with an int literal: the
    hook's answers (channel/peer.py, channel/tensors.py) name their tag, so
    a renamed tag fails at import, never first at run time."""
    import ast
    root = os.path.dirname(bulkhead.__file__)
    unnamed = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name in ("encode_other", "encode"):
                    for r in ast.walk(node):
                        if (isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and r.value.elts
                                and isinstance(r.value.elts[0], ast.Constant)
                                and type(r.value.elts[0].value) is int):
                            unnamed.append(f"{os.path.relpath(path, root)}:{r.lineno}")
    assert unnamed == [], unnamed


# --- python/bulkhead/_native.pyi: the extension's types ------------------

# Annotated in the stub, set on each instance where C raises it (common.c
# bh_py_raise), so no class holds them.
_PER_INSTANCE = {("ProtocolError", "code"), ("ProtocolError", "errname"), ("LedgerError", "code"),
                 ("LedgerError", "errname"), ("ProbeError", "code"), ("ProbeError", "errname")}


def _stub_names(body, top):
    """Names a stub's body (a module's or a class's) defines; with top, a
    module's private helpers (_Hooks, _EncodeAnswer, ...) left out."""
    import ast
    out = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return {n: v for n, v in out.items()
            if not (top and n.startswith("_")) and (not n.startswith("__") or n in ("__enter__", "__exit__"))}


def test_the_native_stub_names_every_export_and_nothing_else():
    """python/bulkhead/_native.pyi lies beside the extension in the built
    package (meson copies and installs it) and names exactly what
    dir(_native) has: every function, constant and class, and each class's
    methods and attributes; the encode hook's tags with their values."""
    import ast
    path = os.path.join(os.path.dirname(_native.__file__), "_native.pyi")
    assert os.path.isfile(path), f"{path} is missing: list _native.pyi in python/bulkhead/meson.build's top_files"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    stub = _stub_names(tree.body, top=True)
    exported = {n for n in dir(_native) if not n.startswith("__")}
    assert sorted(exported - set(stub)) == [], "exported by _native, missing from _native.pyi"
    assert sorted(set(stub) - exported) == [], "in _native.pyi, not exported by _native"
    for name in ("ENCODE_TENSOR", "ENCODE_HANDLE", "ENCODE_VALUE"):
        assert ast.literal_eval(stub[name].value) == getattr(_native, name), name
    for name, node in stub.items():
        cls = getattr(_native, name)
        assert isinstance(node, ast.ClassDef) == isinstance(cls, type), name
        if not isinstance(cls, type):
            continue
        has = {n for n in vars(cls) if not n.startswith("__") or n in ("__enter__", "__exit__")}
        said = set(_stub_names(node.body, top=False)) - {m for c, m in _PER_INSTANCE if c == name}
        assert sorted(has - said) == [], f"_native.{name}'s members missing from _native.pyi"
        assert sorted(said - has) == [], f"_native.pyi's {name} names members the class lacks"
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        assert [c.__name__ for c in cls.__bases__ if c is not object] == bases, name
