"""A pack's sandbox plan (host/sandbox.py) applied for real in a forked
child (as a zygote's child applies it): what each option opens or closes
is judged by trying it there, against the same try in a child without
the sandbox.  The end-to-end probe (a pack's worker, zygote-forked and
spawned, and its grandchild) is tests/e2e/test_sandbox.py."""

import json
import os
import socket

import pytest

from bulkhead.host import sandbox

pytestmark = pytest.mark.skipif(sandbox.abi() < 4, reason="this kernel has no Landlock with TCP rules (ABI 4)")


def _in_child(spec, tries):
    """{name: "ok" or the errno's name} of each try in a forked child,
    sandboxed by spec first (None: not)."""
    from bulkhead import _native
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if spec is not None:
                _native.sandbox_apply(spec)
            out = {}
            for name, fn in tries.items():
                try:
                    fn()
                    out[name] = "ok"
                except OSError as e:
                    out[name] = type(e).__name__
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    return got


def _write(d):
    def attempt():
        p = os.path.join(d, "probe")
        with open(p, "w") as f:
            f.write("x")
        os.remove(p)
    return attempt


def test_a_packs_options_open_and_close_what_they_say(tmp_path, monkeypatch):
    """`network = false` refuses TCP (the pack's, and BULKHEAD_NETWORK=0
    for every pack); `sandbox_write` (relative: in the pack's folder;
    BULKHEAD_SANDBOX_WRITE for every pack) opens a folder; a folder none
    names stays shut."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for k in ("XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME", "BULKHEAD_NETWORK", "BULKHEAD_SANDBOX",
              "BULKHEAD_SANDBOX_WRITE", "BULKHEAD_SANDBOX_READ"):
        monkeypatch.delenv(k, raising=False)
    pack, extra, every, shut = (tmp_path / n for n in ("pack", "extra", "every", "shut"))
    for d in (pack, pack / "cache", extra, every, shut):
        d.mkdir()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def connect():
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    tries = {"tcp": connect, "own": _write(pack), "cache": _write(pack / "cache"), "extra": _write(extra),
             "every": _write(every), "shut": _write(shut)}

    def plan(options):
        return sandbox.plan("p", str(pack), os.path.realpath(os.sys.executable), options, None).spec()
    try:
        bare = _in_child(None, tries)
        default = _in_child(plan({}), tries)
        opened = _in_child(plan({"network": False, "sandbox_write": ("cache", str(extra))}), tries)
        monkeypatch.setenv("BULKHEAD_NETWORK", "0")
        monkeypatch.setenv("BULKHEAD_SANDBOX_WRITE", str(every))
        machine = _in_child(plan({}), tries)
    finally:
        listener.close()
    assert set(bare.values()) == {"ok"}, bare            # each try can succeed
    assert default == dict(bare, extra="PermissionError", every="PermissionError", shut="PermissionError")
    assert opened == dict(default, tcp="PermissionError", extra="ok")
    assert machine == dict(default, tcp="PermissionError", every="ok")


def test_a_computed_path_that_would_open_the_home_is_dropped(tmp_path, monkeypatch):
    """ComfyUI started from the home directory (its base is home, and
    home is on the host's sys.path): the plan names neither home nor an
    ancestor, so ~/.ssh stays shut; what the user adds is taken as said."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.syspath_prepend(str(home))
    p = sandbox.plan("p", str(tmp_path / "pack"), os.path.realpath(os.sys.executable), {}, str(home),
                     {"dirs": {"output": str(tmp_path)}})
    assert str(home) not in p.read and str(tmp_path) not in p.write
    got = _in_child(p.spec(), {"ssh": lambda: open(home / ".ssh" / "id_ed25519").read()})
    assert got == {"ssh": "PermissionError"}
