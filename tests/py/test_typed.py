"""Typed values decoded in one pass: a channel's tagged hook
(Channel.set_tagged, src/python/codec.c) builds the object a tagged map
stands for while the value is decoded, so a worker's node inputs are not
walked again (worker/typed.py's decode_tagged is the worker's hook).

  channel   two ends of a channel in this process: a hook building the
            value, one that raises (a clean error, nothing kept: no
            reference, no block lent), tagged maps nested, no hook set,
            a str key that looks like the mark, a hook that tries to
            receive or close on the channel it decodes for
  worker    a real worker with a registered type: a node's input arrives
            as its object, nested ones too, and a deserializer that raises
            is that call's error, named, with the worker serving on
"""

import gc
import json
import os
import socket
import sys
import textwrap

import numpy as np
import pytest

import bulkhead
from bulkhead import _native
from bulkhead.channel import targets
from bulkhead.channel.peer import NodeValue, Peer, RemoteError

MARK = b"__bulkhead_type__"
BIG = 1 << 20  # past the inline size: the array crosses in a block the frame lends


@pytest.fixture
def pair():
    """(sender, receiver): two ends of one channel in this process."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ends = []
    for s, name in ((a, "a"), (b, "b")):
        peer = Peer(describe=name)
        chan = _native.channel_open(s.detach(), peer, os.getuid(), 0, first_id=1 if name == "a" else 2)
        peer.channel = chan
        ends.append(chan)
    yield ends
    for chan in ends:
        chan.close()


def cross(pair, value):
    """value sent from one end and decoded at the other."""
    tx, rx = pair
    tx.notify(_native.CALL, value, 0)
    kind, _req, out = rx.recv(5.0)
    assert kind == _native.CALL
    return out


def tagged(tag, value):
    return {MARK: tag, "type": "Point", "pack": "p", "value": value}


class Point:
    def __init__(self, payload):
        self.payload = payload


def build(m):
    return Point(m["value"]) if m[MARK] == "POINT" else m


def test_a_hook_builds_the_value_in_its_place(pair):
    pair[1].set_tagged(MARK, build)
    out = cross(pair, {"seed": 3, "p": tagged("POINT", [1, 2]), "l": [tagged("POINT", "x"), 4]})
    assert isinstance(out["p"], Point) and out["p"].payload == [1, 2]
    assert isinstance(out["l"][0], Point) and out["l"][0].payload == "x" and out["l"][1] == 4
    assert out["seed"] == 3
    # a tag the hook does not take stays the map it answered
    assert cross(pair, tagged("OTHER", 1)) == tagged("OTHER", 1)
    # the whole value a tagged map: the hook's value is the value
    top = cross(pair, tagged("POINT", None))
    assert isinstance(top, Point) and top.payload is None


def test_tagged_values_nest_innermost_first(pair):
    seen = []

    def hook(m):
        seen.append(m["value"] if not isinstance(m["value"], dict) else dict(m["value"]))
        return Point(m["value"])

    pair[1].set_tagged(MARK, hook)
    out = cross(pair, tagged("POINT", {"inner": tagged("POINT", [tagged("POINT", 7)]), "n": 1}))
    assert isinstance(out, Point)
    inner = out.payload["inner"]
    assert isinstance(inner, Point) and isinstance(inner.payload[0], Point) and inner.payload[0].payload == 7
    # three calls, innermost first; the outer one saw the inner ones built
    assert seen[0] == 7 and isinstance(seen[1][0], Point) and isinstance(seen[2]["inner"], Point)
    assert len(seen) == 3


def test_no_hook_leaves_the_map(pair):
    value = {"p": tagged("POINT", [1, {MARK: "X"}]), "q": [tagged("Q", 1)]}
    assert cross(pair, value) == value
    pair[1].set_tagged(MARK, build)
    pair[1].set_tagged(MARK, None)  # unset again
    assert cross(pair, value) == value


def test_a_str_key_that_looks_like_the_mark_is_no_tag(pair):
    """What a web client can write (JSON: str keys) never reaches a hook."""
    calls = []
    pair[1].set_tagged(MARK, lambda m: calls.append(m) or m)
    forged = {"__bulkhead_type__": "POINT", "type": "Point", "pack": "p", "value": 1}
    assert cross(pair, {"x": forged}) == {"x": forged}
    assert calls == []
    # nor another bytes key, a longer one, or one sharing the prefix
    for key in (b"__bulkhead_type_", b"__bulkhead_type__x", b"other"):
        assert cross(pair, {key: 1}) == {key: 1}
    assert calls == []


def test_set_tagged_checks_its_arguments(pair):
    rx = pair[1]
    with pytest.raises(TypeError, match="non-empty bytes"):
        rx.set_tagged("__bulkhead_type__", build)
    with pytest.raises(TypeError, match="non-empty bytes"):
        rx.set_tagged(b"", build)
    with pytest.raises(TypeError, match="callable"):
        rx.set_tagged(MARK, 3)
    rx.set_tagged(MARK, None)  # clearing needs no mark
    rx.set_tagged(None, None)


class Boom(Exception):
    pass


def test_a_hook_that_raises_is_the_decode_error_and_keeps_nothing(pair):
    tx, rx = pair

    def hook(m):
        raise Boom(f"cannot build {m['type']}")

    rx.set_tagged(MARK, hook)
    refs = sys.getrefcount(hook)
    gc.collect()
    objects = len(gc.get_objects())
    # a tagged map holding an array in a lent block, then another array
    # the decode never reaches: both blocks go back to the sender
    value = [tagged("POINT", {"a": np.ones(BIG, np.uint8)}), np.zeros(BIG, np.uint8), "tail"]
    for _ in range(200):
        tx.notify(_native.CALL, value, 0)
        with pytest.raises(Boom, match="cannot build Point"):
            rx.recv(5.0)
    gc.collect()
    assert sys.getrefcount(hook) == refs
    assert len(gc.get_objects()) - objects < 50  # no map, list or array kept per failed decode
    # the receiver goes on: the next value decodes, and its frame carries
    # the returns of every block the failed ones lent
    rx.set_tagged(MARK, None)
    rx.notify(_native.CALL, "after", 0)
    assert tx.recv(5.0)[2] == "after"
    assert tx.stats()["lent_blocks"] == 0, tx.stats()
    out = cross(pair, value)
    assert out[0][MARK] == "POINT" and out[0]["value"]["a"].sum() == BIG
    assert out[1].sum() == 0 and out[2] == "tail"


def test_a_hook_cannot_receive_on_the_channel_it_decodes_for(pair):
    """The frame being decoded is the channel's memory: a hook's recv or
    request would overwrite it, so it is refused (the decode's error)."""
    tx, rx = pair
    rx.set_tagged(MARK, lambda m: rx.recv(0))
    tx.notify(_native.CALL, [tagged("POINT", 1), np.ones(BIG, np.uint8)], 0)
    with pytest.raises(RuntimeError, match="decode hook cannot call or receive"):
        rx.recv(5.0)
    rx.set_tagged(MARK, lambda m: rx.request(_native.CALL, ("operator:add", (1, 2), {}), 1.0))
    tx.notify(_native.CALL, tagged("POINT", 1), 0)
    with pytest.raises(RuntimeError, match="decode hook cannot call or receive"):
        rx.recv(5.0)
    rx.set_tagged(MARK, build)
    assert isinstance(cross(pair, tagged("POINT", 2)), Point)


def test_a_hook_that_closes_the_channel_closes_it_after_the_decode(pair):
    tx, rx = pair
    closed = []

    def hook(m):
        rx.close()
        closed.append(rx.closed)  # not yet: the frame is still being read
        return Point(m["value"])

    rx.set_tagged(MARK, hook)
    tx.notify(_native.CALL, [tagged("POINT", 1), np.ones(BIG, np.uint8), tagged("POINT", 2)], 0)
    _kind, _req, out = rx.recv(5.0)
    assert closed == [False, False]
    assert rx.closed
    assert [p.payload for p in (out[0], out[2])] == [1, 2] and out[1].sum() == BIG


def test_a_hook_may_replace_itself_while_it_runs(pair):
    rx = pair[1]

    def first(m):
        rx.set_tagged(MARK, None)  # the decode under way keeps the hook it started with
        return Point(m["value"])

    rx.set_tagged(MARK, first)
    out = cross(pair, [tagged("POINT", 1), tagged("POINT", 2)])
    assert [type(p) for p in out] == [Point, Point]
    assert cross(pair, tagged("POINT", 3)) == tagged("POINT", 3)


# --- in a worker: worker/typed.py's hook ---------------------------------

SERIALIZATION = '''
from comfy_env import register_serializer

class Mesh:
    def __init__(self, payload):
        self.payload = payload

def deserialize(payload, recurse):
    if payload.get("boom"):
        raise ValueError("no mesh today")
    return Mesh({k: recurse(v) for k, v in payload.items()})

register_serializer("Mesh", lambda o, r: o.payload, deserialize, tag="MESH")
'''

NODES = '''
class Describe:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mesh": ("MESH",)}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"

    def run(self, mesh, other=None):
        def desc(v):
            if type(v).__name__ == "Mesh":
                return {"Mesh": {k: desc(x) for k, x in v.payload.items()}}
            if isinstance(v, dict):
                return {k if isinstance(k, str) else repr(k): desc(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [desc(x) for x in v]
            return v
        return (desc({"mesh": mesh, "other": other}),)

NODE_CLASS_MAPPINGS = {"Describe": Describe}
'''


def mesh(pack, **payload):
    return {MARK: "MESH", "type": "Mesh", "pack": pack, "value": payload}


@pytest.fixture
def typed_worker(tmp_path, make_worker):
    pack = tmp_path / "meshpack"
    pack.mkdir()
    (pack / "nodes.py").write_text(textwrap.dedent(NODES))
    (pack / "serialization.py").write_text(SERIALIZATION)
    comfy = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comfyui")
    return make_worker(name="meshpack", cwd=comfy, env={
        "BULKHEAD_PACK_DIR": str(pack), "BULKHEAD_COMFYUI": comfy,
        "BULKHEAD_SERIALIZERS": json.dumps([["meshpack", str(pack / "serialization.py")]])})


def run(w, **kwargs):
    return w.call(targets.RUN, "Describe", NodeValue(kwargs), None, None)["outputs"][0]


def test_a_node_gets_its_typed_input_as_the_object(typed_worker):
    w = typed_worker
    out = run(w, mesh=mesh("geo", n=3, inner=mesh("geo", n=1)), other=[mesh("geo", n=2), {"k": 1}])
    assert out == {"mesh": {"Mesh": {"n": 3, "inner": {"Mesh": {"n": 1}}}},
                   "other": [{"Mesh": {"n": 2}}, {"k": 1}]}, out
    # an unknown tag, or the mark as a str key (a prompt's JSON), stays the dict it is
    unknown = {**mesh("geo", n=1), MARK: "NOPE"}
    forged = {"__bulkhead_type__": "MESH", "type": "Mesh", "pack": "geo", "value": {"n": 1}}
    out = run(w, mesh=unknown, other=forged)
    assert out["mesh"][repr(MARK)] == "NOPE" and out["other"] == forged, out


def test_a_deserializer_that_raises_is_that_calls_error(typed_worker):
    w = typed_worker
    assert run(w, mesh=mesh("geo", n=1))["mesh"] == {"Mesh": {"n": 1}}
    gen = w.generation
    with pytest.raises(RemoteError) as e:
        run(w, mesh=mesh("geo", n=1, inner=mesh("geo", boom=True)), other=np.ones(BIG, np.uint8))
    msg = str(e.value)
    assert type(e.value).__qualname__ == "SerializerError" and e.value.remote_type.endswith(".SerializerError")
    assert msg.startswith("the deserializer of type 'Mesh' (pack 'meshpack'"), msg
    assert "ValueError: no mesh today" in msg and "made by pack 'geo'" in msg, msg
    # the worker serves on, the same process, and holds none of the host's blocks
    assert run(w, mesh=mesh("geo", n=2))["mesh"] == {"Mesh": {"n": 2}}
    assert w.generation == gen and isinstance(w.call(targets.HELD_COUNT), int)
    assert w.stats()["lent_blocks"] == 0, w.stats()


def test_a_worker_with_no_types_registered_passes_maps_through(make_worker):
    w = make_worker(name="plain")
    m = mesh("geo", n=1)
    assert w.call("builtins:dict", m) == m


def test_a_pack_cannot_hand_another_pack_s_deserializer_a_payload(typed_worker, make_worker, caplog, tmp_path):
    """#37: a map marked as pack meshpack's type, made by another pack's
    worker (which runs no meshpack serializer), reaches the host as a plain
    dict without the marker, so meshpack's deserializer never runs on a
    payload another pack made up; meshpack's own typed values (its
    worker runs that serializer) still cross as typed values."""
    made = "{%r: 'MESH', 'type': 'Mesh', 'pack': 'meshpack', 'value': %r}"    # made in the worker
    evil = make_worker(name="evil", env={"BULKHEAD_PACK_NAME": "evil"})
    with caplog.at_level("WARNING", logger="bulkhead"):
        got = evil.call("builtins:eval", made % (MARK, {"n": 1, "boom": True}))
    assert MARK not in got and got == {"type": "Mesh", "pack": "meshpack", "value": {"n": 1, "boom": True}}
    assert "worker 'evil' sent a value marked as type 'Mesh' of pack 'meshpack'" in caplog.text
    out = run(typed_worker, mesh=got)
    assert out["mesh"] == got, out                   # a dict to the node, not a Mesh (nor its deserializer's error)
    # a worker that runs meshpack's serializer (its own, or one its root config names): passed on
    friend = make_worker(name="friend", env={"BULKHEAD_PACK_NAME": "friend", "BULKHEAD_SERIALIZERS": json.dumps(
        [["meshpack", str(tmp_path / "meshpack" / "serialization.py")]])})
    own = friend.call("builtins:eval", made % (MARK, {"n": 2}))
    assert own[MARK] == "MESH" and run(typed_worker, mesh=own)["mesh"] == {"Mesh": {"n": 2}}


def test_any_bytes_decode_to_a_value_or_an_error_with_a_hook_set(pair):
    """The extension's decoder with a tagged hook (the C fuzz targets reach
    the core decoder only): real encodings of values holding tagged maps,
    mutated (bytes flipped, cut, doubled), each sent as a frame.  Every
    one decodes, or fails with a ProtocolError or the hook's own error;
    the receiver serves on after each."""
    import random
    import struct
    tx, rx = pair
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sink = _native.channel_open(b.detach(), Peer(describe="sink"), os.getuid(), 0)
    raw_rx = socket.socket(fileno=os.dup(sink.fileno()))
    tx_raw = socket.socket(fileno=os.dup(tx.fileno()))
    calls = []

    def hook(m):
        calls.append(1)
        if m.get("type") == "Raise":
            raise Boom("refused")
        return Point(m.get("value"))

    rx.set_tagged(MARK, hook)
    try:
        values = [tagged("POINT", [1, 2]), {"a": tagged("POINT", {"b": tagged("POINT", "c")})},
                  [{**tagged("POINT", 1), "type": "Raise"}, "after", 3.5, None, True, b"xy"],
                  {MARK: 1, "value": np.arange(6, dtype=np.int16)}, (tagged("X", ()), {"k": [tagged("Y", 2)]})]
        frames = []
        for v in values:  # what the sending end's codec writes (its block section empty: all inline)
            sender = Peer(describe="raw")
            ch = _native.channel_open(os.dup(a.fileno()), sender, os.getuid(), 0)
            ch.notify(_native.CALL, v, 0)
            ch.close()
            frame = raw_rx.recv(1 << 16)
            assert struct.unpack_from("<IIII", frame, 32) == (0, 0, 0, 0)
            frames.append((frame[:32], frame[48:]))
        rng = random.Random(23)
        outcomes = {"value": 0, "ProtocolError": 0, "Boom": 0}
        for i in range(3000):
            head, value = frames[i % len(frames)]
            v = bytearray(value)
            for _ in range(rng.randint(1, 4)):
                op = rng.randrange(3)
                if op == 0 and v:
                    v[rng.randrange(len(v))] ^= 1 << rng.randrange(8)
                elif op == 1 and v:
                    del v[rng.randrange(len(v)):]
                else:
                    at = rng.randrange(len(v) + 1)
                    v[at:at] = v[at:at + rng.randint(1, 8)]
            body = struct.pack("<IIII", 0, 0, 0, 0) + bytes(v)
            magic, version, kind, req, flags, _n, fds, cpu = struct.unpack("<IHHQIIII", head)
            tx_raw.send(struct.pack("<IHHQIIII", magic, version, kind, req, flags, len(body), fds, cpu) + body)
            try:
                rx.recv(5.0)
                outcomes["value"] += 1
            except _native.ProtocolError:
                outcomes["ProtocolError"] += 1
            except Boom:
                outcomes["Boom"] += 1
        assert all(outcomes.values()), outcomes  # each outcome seen
        assert calls
        assert cross(pair, tagged("POINT", 5)).payload == 5
    finally:
        tx_raw.close()
        raw_rx.close()
        sink.close()
        a.close()
