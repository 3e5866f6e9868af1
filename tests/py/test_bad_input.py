"""The bad-input catalogue: everything a pack, a worker, a config file or
another process on the machine can hand bulkhead that is wrong, one row
each.  Every row gets a NAMED error (a class and a message that says
what was wrong, where) and breaks nothing else: the host's worker serves
the next call, and the host's control socket answers the next client.

  configs      comfy-env.toml: a syntax error (with its line), a wrong
               type, an unknown [bulkhead] key
  frames       a worker writing malformed frames onto its channel: every
               header check and every codec check (BH_E* named)
  handles      an object handle passed to another pack's worker, or to the
               same pack after its worker restarted
  sizes        a value over what one message carries, from either side;
               a frame claiming more; a pack name over the ledger's field
  protocol     a worker speaking another bulkhead protocol
  uid          a process of another uid on a worker channel or on the
               control socket (root only: it must setuid() to try)
  ledger       a ledger file of another layout version, or of another owner
  control      a control-socket client sending garbage, or asking for
               something the socket does not serve
"""

import errno
import os
import socket
import struct
import sys
import time

import pytest

import bulkhead
from bulkhead import _native
from bulkhead.envs import config as packconfig

HERE = os.path.dirname(os.path.abspath(__file__))
HOOKS = os.path.join(HERE, "helpers", "hooks")
HELPERS = os.path.join(HERE, "helpers")
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(HERE, "..", "..", "build", "rel")))


def serves(w):
    """The host's worker answers the next call (a fresh generation if the
    bad input cost it its process)."""
    return w.call("operator:add", 2, 3) == 5


@pytest.fixture
def host_worker(make_worker):
    """A worker the host keeps using after every bad input."""
    w = make_worker(name="bystander")
    w.start()
    return w


# --- configs -----------------------------------------------------------

@pytest.mark.parametrize("text, line, named", [
    ("[bulkhead]\ncall_timeout_s = 1\n[tool\n", 3, "TOML syntax error"),
    ('python = "3.12"\nrequirements = "numpy"\n', 2, "requirements"),
    ('python = "3.12"\n\nrequirments = ["numpy"]\n', 3, "unknown key 'requirments' (did you mean 'requirements'?)"),
], ids=["syntax", "wrong-type", "misspelled-requirements"])
def test_config(tmp_path, host_worker, text, line, named):
    path = tmp_path / "comfy-env.toml"
    path.write_text(text)
    with pytest.raises(packconfig.PackConfigError) as ei:
        packconfig.load(str(path))
    e = ei.value
    assert e.line == line and f"{path}:{line}" in str(e) and named in str(e), str(e)
    assert serves(host_worker)


# --- frames ------------------------------------------------------------

@pytest.mark.parametrize("what, named", [
    ("garbage", "BH_EMAGIC"), ("version", "BH_EVERSION"), ("kind", "BH_EKIND"),
    ("cpu", "BH_EHEADER"), ("short", "BH_ESHORT"), ("oversized", "BH_E2BIG"),
    ("fdcount", "BH_EFDCOUNT"), ("badvalue", "BH_EBADTAG"), ("trailing", "BH_ETRAILING"),
    ("utf8", "BH_EUTF8"), ("overrun", "BH_EOVERRUN"), ("count", "BH_ECOUNT"),
    ("depth", "BH_EDEPTH"), ("toomany", "BH_ETOOMANY"),
])
def test_malformed_frame(make_worker, host_worker, what, named):
    liar = make_worker(name="liar")
    pid = liar.start().pid
    with pytest.raises(bulkhead.ProtocolError, match=named) as ei:
        liar.call("bh_testmod:send_raw", what)
    assert "worker 'liar'" in str(ei.value) and "it was killed" in str(ei.value)
    assert ei.value.__class__ is _native.ProtocolError
    assert liar.call("bh_testmod:pid") != pid   # the liar's next generation
    assert serves(host_worker)


# --- handles -----------------------------------------------------------

def test_handle_passed_to_another_pack(make_worker, host_worker):
    a = make_worker(name="pack-a")
    b = make_worker(name="pack-b")
    held = a.call("bh_badinput:make_held")
    assert isinstance(held, bulkhead.RemoteObject)
    with pytest.raises(bulkhead.HandleError, match=r"made by pack 'pack-a' is held by worker generation 1; "
                                                    r"it cannot be passed to pack 'pack-b'"):
        b.call("bh_badinput:takes", held)
    assert a.call("bh_badinput:takes", held) == "PackModel"   # its own worker takes it
    assert serves(b) and serves(host_worker)


def test_handle_after_its_worker_restarted(make_worker, host_worker):
    a = make_worker(name="pack-a")
    held = a.call("bh_badinput:make_held")
    a.close()
    with pytest.raises(bulkhead.HandleError, match="that worker has ended since"):
        a.call("bh_badinput:takes", held)
    assert serves(a) and serves(host_worker)


# --- sizes -------------------------------------------------------------

def test_value_over_the_message_limit_from_the_host(host_worker):
    big = bytes(_native.PAYLOAD_MAX)   # zero pages, never touched: refused before a copy
    t = time.monotonic()
    with pytest.raises(ValueError, match="larger than one message carries"):
        host_worker.call("bh_badinput:takes", big)
    assert time.monotonic() - t < 5
    del big
    assert serves(host_worker)


@pytest.mark.parametrize("kind", ["bytes", "str"])
def test_value_over_the_message_limit_from_the_worker(host_worker, kind):
    with pytest.raises(bulkhead.RemoteError, match="larger than one message carries") as ei:
        host_worker.call("bh_badinput:huge", kind, _native.PAYLOAD_MAX)
    assert isinstance(ei.value, ValueError)   # the builtin class still catches it
    assert serves(host_worker)


def test_pack_name_over_the_ledger_field(make_worker, tmp_path):
    """A long pack directory name still puts the worker under the budget
    (the ledger's pack field holds 63 bytes: the name is cut, not refused)."""
    name = "a-node-pack-with-a-directory-name-far-longer-than-the-ledger-holds-" + "é" * 20
    w = make_worker(name=name, env={"BULKHEAD_MEMORY": "1", "BULKHEAD_LEDGER": str(tmp_path / "ledger"),
                                    "PYTHONPATH": HELPERS})
    rec = w.call("bh_badinput:ledger_record")
    assert rec is not None and rec["role"] == "worker"
    assert rec["pack"].endswith("...") and name.startswith(rec["pack"][:-3])
    assert len(rec["pack"].encode()) <= _native.LEDGER_PACK_MAX - 1
    assert serves(w)


# --- protocol ----------------------------------------------------------

def test_worker_speaking_another_protocol(make_worker, host_worker):
    w = make_worker(name="future", env={"PYTHONPATH": os.pathsep.join([HELPERS, HOOKS]),
                                        "BH_TEST_HOOK": f"protocol:{_native.PROTOCOL_VERSION + 1}"})
    with pytest.raises(bulkhead.WorkerStartError,
                       match=rf"worker 'future'.*speaks bulkhead protocol {_native.PROTOCOL_VERSION + 1}, "
                             rf"this host speaks {_native.PROTOCOL_VERSION}"):
        w.start()
    assert serves(host_worker)


# --- another uid -------------------------------------------------------

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root: only root can setuid() to "
                                "another uid to try (as any other user the kernel refuses first)")
NOBODY = 65534


@needs_root
def test_foreign_uid_on_a_worker_channel(make_worker, host_worker):
    w = make_worker(name="intruded")
    w.start()
    with pytest.raises(bulkhead.ProtocolError, match="BH_EPEERCRED"):
        w.call("bh_testmod:send_raw", "uid")
    assert serves(w) and serves(host_worker)


def _as_nobody(fn):
    """Runs fn() in a forked child after setuid(nobody); returns what it
    wrote (its exit code and a line)."""
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            msg = fn()
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(wfd, msg.encode()[:4000])
        os._exit(0)
    os.close(wfd)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@needs_root
def test_foreign_uid_on_the_control_socket(tmp_path, host_worker, monkeypatch, caplog):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from bulkhead.host.control import ControlServer
    from bulkhead.host.controlclient import request
    srv = ControlServer(_Host([host_worker]), release_timeout_s=5)
    try:
        # Connecting as another uid: the directory (0700) and socket (0600) refuse.
        def connect():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(srv.path)
                return "connected"
            finally:
                s.close()
        assert _as_nobody(connect).startswith("PermissionError"), "another uid could connect"

        # Connected as us, then sending as another uid: the frame's
        # credentials are checked, the client is dropped and named in the log.
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s, \
                caplog.at_level("WARNING", logger="bulkhead"):
            s.connect(srv.path)
            pid = os.fork()
            if pid == 0:
                try:
                    os.setuid(NOBODY)
                    body = struct.pack("<IIII", 0, 0, 0, 0) + b"\x00"   # empty block section, nil
                    s.send(struct.pack("<IHHQIIII", 0x4B484C42, _native.PROTOCOL_VERSION, 2, 1, 0, len(body), 0, 0) + body)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            assert s.recv(1024) == b""   # dropped
            _wait_for(lambda: "BH_EPEERCRED" in caplog.text)
        assert "a client broke the protocol (BH_EPEERCRED)" in caplog.text
        assert request(os.getpid(), "workers", timeout_s=10)[0]["pack"] == "bystander"
    finally:
        srv.close()
    assert serves(host_worker)


# --- the ledger --------------------------------------------------------

def _ledger_of_version(path, version):
    with _native.Ledger(str(path)) as l:
        l.join("tool")
        with open(path, "r+b") as f:   # header: magic[8], u32 version
            f.seek(8)
            f.write(struct.pack("<I", version))
        l.leave()
        # closing would unlink it (no live record left): keep a copy instead
        data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def test_ledger_of_another_version(tmp_path, make_worker, host_worker):
    path = tmp_path / "ledger"
    _ledger_of_version(path, _native.LEDGER_VERSION + 1)
    with pytest.raises(_native.LedgerError, match="BH_ELEDGERVER") as ei:
        _native.Ledger(str(path))
    assert str(path) in str(ei.value)
    # A worker told to use it runs outside the budget and says why.
    w = make_worker(name="old-ledger", env={"BULKHEAD_MEMORY": "1", "BULKHEAD_LEDGER": str(path),
                                            "PYTHONPATH": HELPERS})
    assert serves(w)
    _wait_for(lambda: "BH_ELEDGERVER" in w._proc.output_tail())
    assert "not under the host's memory budget" in w._proc.output_tail()
    assert serves(host_worker)


@needs_root
def test_ledger_of_another_owner(tmp_path, host_worker):
    path = tmp_path / "ledger"
    with _native.Ledger(str(path)) as l:
        l.join("tool")
        os.chown(path, NOBODY, NOBODY)
        with pytest.raises(PermissionError, match="owned by another user") as ei:
            _native.Ledger(str(path))
        assert ei.value.filename == str(path)
        os.chown(path, 0, 0)
    assert serves(host_worker)


@pytest.mark.torch
def test_host_memory_on_an_unusable_ledger_warns_and_goes_on(tmp_path):
    """ComfyUI importing an isolated pack on a machine whose ledger is of
    another version: the pack still loads (outside the budget), one warning."""
    from comfyenv import run_comfy_script
    path = tmp_path / "ledger"
    _ledger_of_version(path, _native.LEDGER_VERSION + 1)
    r = run_comfy_script("""
        import io, logging
        buf = io.StringIO()
        logging.getLogger("bulkhead").addHandler(logging.StreamHandler(buf))
        from bulkhead.host import pack
        first, second = pack.host_memory(), pack.host_memory()
        emit(dict(first=first is None, second=second is None, log=buf.getvalue()))
    """, env={"BULKHEAD_LEDGER": str(path),
              "PYTHONPATH": os.path.join(BUILD, "python")})
    assert r["first"] and r["second"]
    assert r["log"].count("OUTSIDE the shared memory budget") == 1 and "BH_ELEDGERVER" in r["log"], r


# --- the control socket ------------------------------------------------

def _hooks():
    """What channel_open reads off its hooks object (none is called here)."""
    import types
    return types.SimpleNamespace(**{name: None for name in (
        "encode_other", "decode_tensor", "decode_handle", "resolve", "format_exc", "make_error",
        "on_frame", "on_request")})


def test_channel_open_failure_names_the_call_and_consumes_the_fd():
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as e:
            _native.channel_open(r, _hooks(), os.getuid(), 0)  # a pipe is no socket
        assert e.value.errno == errno.ENOTSOCK and "channel_open" in str(e.value), str(e.value)
        with pytest.raises(OSError) as gone:
            os.fstat(r)  # taken over and closed, even though it raised
        assert gone.value.errno == errno.EBADF
    finally:
        os.close(w)


def test_control_server_never_closes_an_fd_channel_open_consumed(tmp_path, host_worker, monkeypatch):
    """A failed channel_open has already closed the accepted fd; in a
    threaded host its number may be another thread's file by the time the
    server looks again, and the server must leave it alone."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from bulkhead.host.control import ControlServer
    from bulkhead.host.controlclient import request
    real = _native.channel_open
    victim = []

    def failing(fd, *args, **kw):
        os.close(fd)  # what channel_open does with fd on every failure
        victim.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))  # another thread's, same number
        raise OSError(errno.EMFILE, "channel_open: injected")

    monkeypatch.setattr(_native, "channel_open", failing)
    srv = ControlServer(_Host([host_worker]), release_timeout_s=5)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(srv.path)
            _wait_for(lambda: victim)
        monkeypatch.setattr(_native, "channel_open", real)
        # served after the failed one: the server is past its except branch
        assert request(os.getpid(), "workers", timeout_s=10)[0]["pack"] == "bystander"
        os.fstat(victim[0])  # still open: nobody closed it behind its owner's back
    finally:
        srv.close()
        for fd in victim:
            os.close(fd)


class _Host:
    """The part of HostMemory a ControlServer uses."""

    def __init__(self, workers):
        self.owners = {w: None for w in workers}

    def note_release(self, w):
        pass


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cond()


@pytest.mark.parametrize("garbage, named", [
    (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", "BH_EMAGIC"),
    (b"\x00" * 7, "BH_ESHORT"),
    (struct.pack("<IHHQIIII", 0x4B484C42, _native.PROTOCOL_VERSION + 1, 2, 1, 0, 0, 0, 0), "BH_EVERSION"),
    (struct.pack("<IHHQIIII", 0x4B484C42, _native.PROTOCOL_VERSION, 2, 1, 0, 17, 0, 0) + struct.pack("<IIII", 0, 0, 0, 0) + b"\xee",
     "BH_EBADTAG"),
], ids=["http", "short", "version", "badvalue"])
def test_control_client_sending_garbage(tmp_path, host_worker, monkeypatch, caplog, garbage, named):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    from bulkhead.host.control import ControlServer
    from bulkhead.host.controlclient import request
    srv = ControlServer(_Host([host_worker]), release_timeout_s=5)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s, \
                caplog.at_level("WARNING", logger="bulkhead"):
            s.connect(srv.path)
            s.send(garbage)
            reply = s.recv(4096)
            if reply:
                # A well-framed request whose value is bad: answered with
                # an ERROR naming it (the connection could go on).
                assert struct.unpack_from("<IHH", reply)[2] == _native.ERROR, reply
                assert named.encode() in reply, reply
            else:
                # Not even a frame: the client is dropped, and the log says why.
                _wait_for(lambda: named in caplog.text)
                assert f"a client broke the protocol ({named})" in caplog.text
        # The next client is served.
        assert request(os.getpid(), "workers", timeout_s=10)[0]["pack"] == "bystander"
        with pytest.raises(bulkhead.RemoteError, match="serves.*not 'format_disk'"):
            request(os.getpid(), "format_disk", timeout_s=10)
    finally:
        srv.close()
    assert serves(host_worker)


@pytest.mark.parametrize("call", [
    lambda: _native.policy_pending(-1, 0, 0),
    lambda: _native.policy_pending(1 << 63, 0, 0),
    lambda: _native.policy_reserve(-5, []),
    lambda: _native.policy_admission_need(0, -1, 0, 0),
    lambda: _native.policy_ask_target(-1, 0, 0, 0, True),
    lambda: _native.policy_release_plan([(True, 0, -1, 0)], 1),
], ids=["pending", "pending_huge", "reserve", "admission_need", "ask_target", "release_plan_row"])
def test_policy_bindings_refuse_what_would_wrap(call):
    """"K" parsed -1 as 2**64 - 1: every byte count and time is an int in
    [0, 2**63) now, or OverflowError."""
    with pytest.raises(OverflowError):
        call()


def test_encoder_refuses_more_items_than_a_frame_may_carry(worker):
    """The sender names the limit itself (the peer's decoder would refuse
    the frame as BH_ETOOMANY)."""
    with pytest.raises(ValueError, match=r"more than 1048576 items"):
        worker.call("operator:length_hint", [None] * (1 << 20))
    n = (1 << 20) - 16  # room for the request around it: (target, args, kwargs)
    assert worker.call("operator:length_hint", [None] * n) == n


# --- a reply past the shared-memory block bound -----------------------

def test_replies_the_host_keeps_do_not_count_against_the_block_bound(make_worker):
    """#24 M1: the host keeps what eight calls answered (ComfyUI's output
    cache, an OUTPUT_IS_LIST of frames), 40 arrays past ARENA_ITEM_MAX each
    (a block each: smaller ones share blocks): 320 blocks lent to the host,
    more than the 256 a channel may hold with their fds.  A lent block
    holds no fd (the host has its own), so every call succeeds (main
    failed the seventh with BH_EPOOLFULL), and the data is what was
    sent."""
    w = make_worker(name="keptblocks")
    big = _native.ARENA_ITEM_MAX + 4096
    kept = [w.call("bh_testmod:many_arrays", 40, big) for _ in range(8)]
    assert [int(a[0]) for out in kept for a in out] == list(range(40)) * 8
    assert all(a.nbytes == big and int(a[-1]) == int(a[0]) for out in kept for a in out)
    assert w.generation == 1
    del kept

def test_a_reply_past_the_block_bound_is_that_calls_error(make_worker):
    """257 arrays past ARENA_ITEM_MAX in one reply (each a block of its own;
    smaller ones share blocks, tests/py/test_small_arrays.py) need more
    blocks than a channel may hold (BH_EPOOLFULL): that call fails with an
    error naming the bound, nothing was sent, and the same worker -- its
    models kept -- serves the next call, a reply within the bound
    included."""
    w = make_worker(name="manyblocks")
    pid = w.start().pid
    big = _native.ARENA_ITEM_MAX + 4096
    with pytest.raises(bulkhead.RemoteError) as ei:
        w.call("bh_testmod:many_arrays", 257, big)
    assert "BH_EPOOLFULL" in str(ei.value) or "too many shared-memory blocks" in str(ei.value), str(ei.value)
    assert w.pid == pid and w.call("bh_testmod:pid") == pid
    out = w.call("bh_testmod:many_arrays", 8, big)
    assert [int(a[0]) for a in out] == list(range(8)) and w.pid == pid
