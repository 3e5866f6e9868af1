"""A pack's own type strings -- str subclasses with their own == / != (the
classic "any type", ComfyUI's testing pack's SmartType, io's comma
matching) -- as the host sees them: the answers the worker computes
(channel/formats.py TypeTable) and the host's PackType answering from
them, compared with the real objects; a type whose comparison raises; the
types crossing back to the worker; and a pack described in a worker under
another interpreter.  ComfyUI's validation compares these types
(`input_type == "INT"`, `received_type != input_type`), so every answer
must be the pack's own."""

import copy
import itertools
import json
import logging
import operator

import pytest

from bulkhead.channel.formats import (TYPE_MARK, Meta, PackType, TypeTable, decode_meta, link_types,
                                      types_from_host, types_to_worker)
from bulkhead.host import nodes
from conftest import other_interpreter
from nodepacks import LOAD_PACK_INIT, import_real, write_pack


class AnyType(str):
    def __ne__(self, other):
        return False


class SmartType(str):
    def __ne__(self, other):
        if self == "*" or other == "*":
            return False
        return not set(self.split(",")).issubset(set(other.split(",")))


class IOType(str):   # comfy_api's _StringIOType
    def __ne__(self, other):
        if self == "*" or other == "*":
            return False
        if not isinstance(other, str):
            return True
        a, b = frozenset(self.split(",")), frozenset(other.split(","))
        return not (b.issubset(a) or a.issubset(b))

    __hash__ = str.__hash__


class EqualToAll(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


class Raises(str):
    def __eq__(self, other):
        raise RuntimeError("no comparing")

    __hash__ = str.__hash__


REAL = [AnyType("*"), SmartType("*"), SmartType("IMAGE,FLOAT"), SmartType("FLOAT"), SmartType("INT,FLOAT"),
        IOType("*"), IOType("FLOAT"), IOType("MY_MESH"), EqualToAll("*"), AnyType("MY_MESH")]
# strings ComfyUI compares types with: literal and core names, the pack's
# own (MY_MESH, its types' values), and names the worker never compared
# them with (as which these types answer as for any such name)
OTHERS = ["*", "INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "IMAGE", "MASK", "IMAGE,FLOAT", "INT,FLOAT",
          "MY_MESH", "", "SOMETHING_NEW", "NEW_TYPE_A"]
OPS = [operator.eq, operator.ne]


def _cross(values, names=(), pack="pack"):
    """values as the host gets them: Meta in the 'worker' (this process),
    JSON, link_types, decode_meta.  Returns (host values, problems)."""
    problems, types = [], TypeTable()
    meta = Meta("Node", problems, types=types)
    encoded = meta(values, "INPUT_TYPES()")
    described = json.loads(json.dumps({"nodes": {"Node": encoded}, "types": types.entries(names, problems)}))
    link_types(described, pack)
    return decode_meta(described["nodes"]["Node"]), problems


def test_the_host_answers_as_the_packs_own_types():
    host, problems = _cross(tuple(REAL))
    assert problems == []
    assert all(type(h) is PackType for h in host)
    for real, h in zip(REAL, host):
        for other, op in itertools.product(OTHERS, OPS):
            # both orders: a str on the left defers to the subclass's method, as in-process
            assert (op(h, other), op(other, h)) == (op(real, other), op(other, real)), (real, op, other)
        for (real2, h2), op in itertools.product(zip(REAL, host), OPS):
            assert op(h, h2) == op(real, real2), (type(real).__name__, real, op, type(real2).__name__, real2)
        assert hash(h) == hash(str(real)) and str(h) == str(real) and json.dumps(h) == json.dumps(str(real))
        copied = copy.deepcopy(h)
        assert [op(copied, o) for o in OTHERS for op in OPS] == [op(real, o) for o in OTHERS for op in OPS]
    # what ComfyUI's validation does with them
    any_, smart = host[0], host[1]
    assert not any(any_ == t for t in ("INT", "FLOAT", "STRING", "BOOLEAN"))   # a literal is not converted
    assert not (smart != "IMAGE") and host[3] == "FLOAT" and host[2] != "FLOAT"


def test_names_the_worker_is_given_are_compared_exactly():
    unseen = "MY_MESH,IMAGE"
    assert (SmartType("IMAGE") != unseen) is False            # a superset: fits
    host, _ = _cross((SmartType("IMAGE"),))
    assert (host[0] != unseen) is True                         # never compared: as for any unseen name
    host, _ = _cross((SmartType("IMAGE"),), names=[unseen])
    assert (host[0] != unseen) is False


def test_an_operand_that_is_not_a_str():
    host, _ = _cross((AnyType("*"), SmartType("IMAGE"), IOType("IMAGE")))
    combo = ["a", "b"]
    assert (host[0] != combo) is (AnyType("*") != combo) is False
    assert (host[2] != combo) is (IOType("IMAGE") != combo) is True
    with pytest.raises(AttributeError):
        SmartType("IMAGE") != combo
    with pytest.raises(TypeError, match=r"test_pack_types\.SmartType\('IMAGE'\) != a list: in its pack's worker "
                                        r"this raised AttributeError: 'list' object has no attribute 'split'"):
        host[1] != combo


def test_a_type_whose_comparison_raises_crosses_as_a_str():
    host, problems = _cross({"a": (Raises("BAD"), {}), "b": (SmartType("*"), {})})
    assert type(host["a"][0]) is str and host["a"][0] == "BAD"
    assert type(host["b"][0]) is PackType and not (host["b"][0] != "IMAGE")
    assert problems == ["type test_pack_types.Raises('BAD'): comparing it with a type name raised RuntimeError: "
                        "no comparing; it crosses to the host as a plain str (compared as str there), so fix its "
                        "__eq__/__ne__ to compare with any str"]


def test_another_packs_types_compare_as_strings():
    mine, _ = _cross((SmartType("*"), SmartType("FLOAT")), pack="mine")
    theirs, _ = _cross((SmartType("FLOAT"),), pack="theirs")
    assert (mine[1] != theirs[0]) is False and (mine[1] == theirs[0]) is True
    assert (theirs[0] != mine[0]) is False


def test_input_types_cross_back_as_the_packs_own_objects():
    real = SmartType("IMAGE,FLOAT")
    host, _ = _cross((real, AnyType("*")), pack="mine")
    theirs, _ = _cross((SmartType("IMAGE,FLOAT"),), pack="theirs")
    sent = types_to_worker({"a": host[0], "b": host[1], "c": theirs[0], "d": "IMAGE"}, "mine")
    assert sent["a"] == {TYPE_MARK: ["test_pack_types.SmartType", "IMAGE,FLOAT"]}
    assert type(sent["c"]) is PackType and sent["d"] == "IMAGE"   # the codec sends these as their str
    own = {("test_pack_types.SmartType", "IMAGE,FLOAT"): real}
    got = types_from_host(sent, own)
    assert got["a"] is real
    assert type(got["b"]) is str and got["b"] == "*"              # the pack has no such object here
    assert types_from_host({"x": {"prompt": "text"}}, own) == {"x": {"prompt": "text"}}


PACK = {
    "__init__.py": LOAD_PACK_INIT,
    "nodes.py": '''
class AnyType(str):
    def __ne__(self, other):
        return False


class SmartType(str):
    def __ne__(self, other):
        if self == "*" or other == "*":
            return False
        return not set(self.split(",")).issubset(set(other.split(",")))


class Raises(str):
    def __eq__(self, other):
        raise RuntimeError("no comparing")
    __hash__ = str.__hash__


class Typed:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"any": (AnyType("*"),), "smart": (SmartType("FLOAT,INT"),), "bad": (Raises("BAD"),)}}
    RETURN_TYPES = (SmartType("IMAGE"), AnyType("*"))
    FUNCTION = "run"

    def run(self, **kw):
        return (None, None)


NODE_CLASS_MAPPINGS = {"Typed": Typed}
''',
}


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    nodes._forget_all()
    yield
    nodes._forget_all()


def test_a_pack_described_in_its_worker(tmp_path, host, caplog):
    pack = write_pack(tmp_path, "typespack", PACK)
    base = tmp_path / "comfyui"
    base.mkdir()
    with caplog.at_level(logging.WARNING, logger="bulkhead"):
        mappings, _ = nodes.load_pack(pack, other_interpreter(), options={"comfyui": str(base)})
    assert "node 'Typed'" not in caplog.text   # described, not left out
    assert "type typespack.nodes.Raises('BAD'): comparing it with a type name raised RuntimeError" in caplog.text
    real = import_real(pack).Typed
    proxy = mappings["Typed"]
    want = [t[0] for t in real.INPUT_TYPES()["required"].values()] + list(real.RETURN_TYPES)
    got = [t[0] for t in proxy.INPUT_TYPES()["required"].values()] + list(proxy.RETURN_TYPES)
    assert [type(t).__name__ for t in got] == ["PackType", "PackType", "str", "PackType", "PackType"]
    for r, h in zip(want[:2] + want[3:], got[:2] + got[3:]):
        for other, op in itertools.product([o for o in OTHERS if "," not in o] + ["FLOAT,INT"], OPS):
            assert op(h, other) == op(r, other), (r, op, other)
        for (r2, h2), op in itertools.product(zip(want[:2] + want[3:], got[:2] + got[3:]), OPS):
            assert op(h, h2) == op(r, r2), (r, op, r2)
