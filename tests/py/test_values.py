"""set, frozenset, complex, range and numpy arrays of any numpy dtype
(records, datetime64/timedelta64, byte-swapped, bytes and str) across a
real worker, as bulkhead's own typed encoding (protocol 8, no pickle):
each comes back the same type and value, and what the worker receives
is what the same value is in this process (tests/py/helpers/bh_values.py
describes a value both sides compare).  Malformed values of the new tags
are named errors; nothing is left behind (conftest's no_leaks)."""

import math
import struct
import sys

import numpy as np
import pytest

import bulkhead
from bulkhead import _native

from conftest import HELPERS, WORKER_VENVS

sys.path.insert(0, HELPERS)
import bh_values  # noqa: E402  (the same helpers the worker imports)

PLY_VERTEX = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1")])


def _ply(n):
    a = np.zeros(n, PLY_VERTEX)
    a["x"] = np.arange(n, dtype=np.float32) * 0.5
    a["y"] = -a["x"]
    a["z"] = 3.25
    a["red"] = np.arange(n) % 256
    return a


def values():
    """Every kind, edge cases first, then nested in the containers."""
    nested = np.dtype([("p", "<f4", (3,)), ("q", [("a", ">i2"), ("b", "M8[D]")]), ("s", "S3")])
    padded = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 8], "itemsize": 16})
    titled = np.dtype({"names": ["a", "b"], "formats": ["<f8", "u1"], "titles": ["Alpha", None]})
    out = {
        "set": {1, "a", (2, None), b"\x00", 2.5, frozenset({3})},
        "set_empty": set(),
        "frozenset": frozenset({(1, 2), frozenset({"x"}), 1 + 2j, None}),
        "frozenset_empty": frozenset(),
        "complex": 1.5 - 2j,
        "complex_edges": [complex(0.0, -0.0), complex(math.inf, -math.inf), complex(math.nan, 1), 5e-324j],
        "range": range(3, -10, -2),
        "range_empty": range(0),
        "range_int64_ends": range(-2**63, 2**63 - 1, 2**62),
        "ply_small": _ply(5),                    # inline in the value
        "ply_arena": _ply(10_000),               # 130 KB: an arena range
        "ply_block": _ply(100_000),              # 1.3 MB: a block of its own
        "ply_view": _ply(40)[::3],               # not contiguous: copied
        "ply_2d": _ply(12).reshape(3, 4),
        "ply_0d": np.array(_ply(1)[0]),
        "ply_empty": np.zeros((0, 4), PLY_VERTEX),
        "ply_scalar": _ply(3)[1],                # np.void
        "nested_record": np.zeros(4, nested),
        "padded_record": np.zeros(3, padded),
        "titled_record": np.ones(2, titled),
        "aligned_record": np.zeros(2, np.dtype([("a", "u1"), ("b", "<f8")], align=True)),
        "empty_record": np.zeros(3, np.dtype([])),
        "subarray_dtype": np.zeros(2, np.dtype(("<i4", (2, 3)))),
    }
    for unit in ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"):
        out[f"datetime64[{unit}]"] = np.array([0, 1, -5, np.iinfo(np.int64).min], dtype=f"datetime64[{unit}]")
        out[f"timedelta64[{unit}]"] = np.array([7, -1], dtype=f"timedelta64[{unit}]")
    out["datetime64[10ms]"] = np.array([1, 2], dtype="datetime64[10ms]")
    out["datetime64_generic"] = np.array([], dtype="datetime64")
    out["datetime64_big"] = np.arange(200_000).astype("datetime64[s]")
    out["datetime64_scalar"] = np.datetime64("2021-03-04T05:06", "m")
    out["timedelta64_scalar"] = np.timedelta64(-3, "us")
    out["nat_scalar"] = np.datetime64("NaT", "ns")
    out["byteswapped"] = np.arange(6, dtype=">f4").reshape(2, 3)
    out["byteswapped_i8"] = np.array([1, -2], dtype=">i8")
    out["bytes_array"] = np.array([b"ab", b"", b"\x00\xff"])
    out["str_array"] = np.array(["héllo", "✓", ""])
    out["void_array"] = np.zeros(3, "V5")
    out["in_containers"] = {"s": {1, 2}, frozenset({1}): [range(2), 3j, (_ply(2), {"t": frozenset()})]}
    return out


def _same(a, b):
    assert bh_values.describe(a) == bh_values.describe(b)


@pytest.fixture(scope="module")
def cases():
    return values()


def _roundtrip_all(w, cases):
    for name, v in cases.items():
        # What the worker received is what the value is here ...
        assert w.call("bh_values:describe_received", v) == bh_values.describe(v), name
        # ... and what comes back is the same type and value.
        back = w.call("bh_values:echo", v)
        _same(back, v)
        assert type(back) is type(v), name
        if isinstance(v, np.ndarray):
            assert back.dtype == v.dtype and back.shape == v.shape, name
            assert back.dtype.isalignedstruct == v.dtype.isalignedstruct, name


def test_roundtrip_under_the_hosts_interpreter(make_worker, cases):
    w = make_worker(name="values")
    w.start()
    _roundtrip_all(w, cases)


@pytest.mark.parametrize("venv", sorted(WORKER_VENVS))
def test_roundtrip_under_another_interpreter(make_worker, cases, venv):
    """numpy 2.0 to 2.5 and Python 3.9 to 3.13: a dtype's description means
    the same dtype in each."""
    w = make_worker(WORKER_VENVS[venv], name=f"values-{venv}")
    w.start()
    _roundtrip_all(w, cases)


def test_a_received_set_is_a_set_here_too(make_worker):
    """What a node gets is usable as the value it is: set algebra, range
    indexing, record field access, datetime arithmetic, in the worker."""
    w = make_worker(name="values")
    w.start()
    assert w.call("operator:or_", {1, 2}, frozenset({3})) == {1, 2, 3}
    assert type(w.call("operator:or_", frozenset({1}), {3})) is frozenset
    assert w.call("operator:getitem", range(10, 0, -3), 2) == 4
    assert w.call("operator:mul", 2 + 1j, 1j) == -1 + 2j
    a = _ply(7)
    got = w.call("operator:getitem", a, "red")
    assert got.dtype == np.uint8 and np.array_equal(got, a["red"])
    d = np.array(["2020-01-01", "2020-03-01"], dtype="datetime64[D]")
    diff = w.call("numpy:diff", d)
    assert diff.dtype == np.dtype("timedelta64[D]") and diff[0] == np.timedelta64(60, "D")


def test_subclasses_and_objects_are_not_data(make_worker):
    """Only the exact types cross as data: a subclass of set or complex
    (numpy's complex128 among them) keeps its own crossing, and an object
    array is refused naming its dtype, as before."""
    w = make_worker(name="values")
    w.start()
    v = np.complex128(1 + 2j)
    r = w.call("bh_values:echo", v)
    assert type(r) is np.complex128 and r == v

    class MySet(set):
        pass
    with pytest.raises(TypeError, match="MySet"):
        w.call("bh_values:echo", MySet({1}))
    with pytest.raises(TypeError, match="dtype object"):
        w.call("bh_values:echo", np.array([object()], dtype=object))
    with pytest.raises(TypeError, match="dtype .*objects"):
        w.call("bh_values:echo", np.zeros(2, dtype=[("a", "O")]))
    with pytest.raises(OverflowError, match=r"range\(0, 18446744073709551616\)"):
        w.call("bh_values:echo", range(2**64))
    assert w.call("operator:add", 1, 2) == 3


def test_an_unhashable_set_item_is_named(make_worker):
    """A set whose item hashes in the sender but crosses as data that does
    not hash (a hashable list subclass: a plain list here) is a TypeError
    naming the item's type, either way; the worker lives on, and the block
    of a large array decoded before it goes back (no_leaks)."""
    w = make_worker(name="values")
    pid = w.start().pid
    with pytest.raises(TypeError, match=r"a set received holds an item of type list, which is unhashable"):
        w.call("bh_values:set_of_hashable_list")
    with pytest.raises(TypeError, match=r"a set received holds an item of type list"):
        w.call("bh_values:set_of_hashable_list", True)
    with pytest.raises(TypeError, match=r"a frozenset received holds an item of type list") as ei:
        w.call("bh_values:echo", frozenset({bh_values.HashableList([1])}))
    assert isinstance(ei.value, bulkhead.RemoteError)   # raised by the worker's decoder
    assert w.call("bh_testmod:pid") == pid


def _u16(n):
    return struct.pack("<H", n)


def _tensor_u8(shape, data, lib=0, strides=None):
    """A TENSOR value of uint8 (code 3) inline."""
    strides = strides or [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    head = struct.pack("<BBBBIQQ", 0x09, lib, 3, len(shape), 0xFFFFFFFE, 0, len(data))
    return head + b"".join(struct.pack("<q", d) for d in shape) + \
        b"".join(struct.pack("<q", s) for s in strides) + data


def _array(desc, shape, data, lib=0):
    d = desc.encode()
    return b"\x10" + _u16(len(d)) + d + _tensor_u8(shape, data, lib)


BAD_VALUES = {
    # the core's checks (src/core/codec.c): the frame itself is malformed
    "set_truncated": (b"\x0c" + struct.pack("<I", 3) + b"\x00\x00", "BH_ECOUNT"),
    "frozenset_oversized": (b"\x0d" + struct.pack("<I", 0xFFFFFFFF) + b"\x00" * 8, "BH_ECOUNT"),
    "complex_truncated": (b"\x0e" + b"\x00" * 12, "BH_EOVERRUN"),
    "range_truncated": (b"\x0f" + b"\x00" * 20, "BH_EOVERRUN"),
    "range_step_zero": (b"\x0f" + struct.pack("<qqq", 0, 10, 0), "BH_EBODY"),
    "array_truncated": (_array('"<M8[ns]"', [1, 8], bytes(8))[:-3], "BH_EOVERRUN"),
    "array_desc_empty": (b"\x10" + _u16(0) + _tensor_u8([1, 8], bytes(8)), "BH_EBODY"),
    "array_desc_oversized": (b"\x10" + _u16(0xFFFF) + b'"<M8[ns]"', "BH_EOVERRUN"),
    "array_desc_not_utf8": (b"\x10" + _u16(2) + b"\xc0\x80" + _tensor_u8([1, 8], bytes(8)), "BH_EUTF8"),
    "array_not_a_tensor": (b"\x10" + _u16(9) + b'"<M8[ns]"' + b"\x00", "BH_EBODY"),
    "array_bytes_strided": (b"\x10" + _u16(9) + b'"<M8[ns]"' + _tensor_u8([8, 1], bytes(8), strides=[1, 2]),
                            "BH_EBODY"),
    # the glue's (channel/tensors.py): the description names no dtype it sends
    "array_desc_not_json": (_array("{x", [1, 8], bytes(8)), r"description is malformed \(BH_EBODY\): Expecting"),
    "array_desc_object": (_array('"|O"', [1, 8], bytes(8)), r"BH_EBODY.*'\|O' is not a plain dtype"),
    "array_desc_object_field": (_array('{"names":["a"],"formats":["|O"],"offsets":[0],"itemsize":8}', [1, 8],
                                       bytes(8)), r"BH_EBODY.*'\|O' is not a plain dtype"),
    "array_desc_wrong_itemsize": (_array('"<M8[ns]"', [2, 4], bytes(8)), "BH_EBODY.*itemsize is 8 bytes"),
    "array_desc_deep": (_array("[" * 5000 + "]" * 5000, [1, 8], bytes(8)), "BH_EBODY"),
    "array_desc_nested_deep": (_array('{"sub":' * 40 + '"u1"' + ',"shape":[1]}' * 40, [1, 1], bytes(1)),
                               "BH_EBODY.*deeper than"),
}


@pytest.mark.parametrize("what", sorted(BAD_VALUES))
def test_malformed_value_of_a_new_tag(make_worker, what):
    """A worker that writes a malformed value of a new tag is a liar: the
    call fails with ProtocolError naming the code, the worker is killed,
    the next generation serves."""
    raw, named = BAD_VALUES[what]
    liar = make_worker(name="liar")
    pid = liar.start().pid
    with pytest.raises(bulkhead.ProtocolError, match=named) as ei:
        liar.call("bh_values:send_raw_value", raw.hex())
    assert "worker 'liar'" in str(ei.value) and "it was killed" in str(ei.value)
    assert liar.call("bh_testmod:pid") != pid



# --- as a node's values: a pack's node in-process and isolated ----------

PACK_INIT = '''\
import os
from bulkhead.host.nodes import load_pack
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = load_pack(
    os.path.dirname(os.path.abspath(__file__)), os.environ["BH_TEST_PACK_PYTHON"],
    options={"comfyui": os.environ.get("BH_TEST_COMFYUI")})
'''

PACK_NODES = '''\
import numpy as np
from bh_values import describe

PLY = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1")])


class Values:
    """Returns what it was given, as it saw it, and values of every new kind."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"given": ("*",)}}
    RETURN_TYPES = ("*", "*", "*", "*", "*", "*", "*")
    FUNCTION = "run"
    CATEGORY = "bulkhead/test"

    def run(self, given):
        ply = np.zeros(3000, PLY)
        ply["red"] = np.arange(3000) % 256
        return (describe(given), {1, "a", (2, 3)}, frozenset({frozenset({1})}), 2 - 1j, range(1, 9, 4),
                ply, np.array(["2024-02-29T12:00"], dtype="datetime64[m]"))


NODE_CLASS_MAPPINGS = {"Values": Values}
'''


def test_a_nodes_values_are_as_in_process(tmp_path, monkeypatch, cases):
    """The same node in ComfyUI's process and isolated under another
    Python: what it is given and what it returns describe the same (before
    protocol 8 the isolated node's sets and records came back handles)."""
    from conftest import other_interpreter
    from bulkhead.host import nodes
    import importlib.util
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    base = tmp_path / "comfyui"
    base.mkdir()
    (base / "folder_paths.py").write_text("def get_filename_list(name):\n    return []\n")
    pack = tmp_path / "valuespack"
    pack.mkdir()
    (pack / "__init__.py").write_text(PACK_INIT)
    (pack / "nodes.py").write_text(PACK_NODES)
    spec = importlib.util.spec_from_file_location("bh_real_valuespack.nodes", str(pack / "nodes.py"))
    real = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real)
    nodes._forget_all()
    try:
        mappings, _ = nodes.load_pack(str(pack), other_interpreter(), options={"comfyui": str(base)},
                                      env={"PYTHONPATH": HELPERS})
        isolated, in_process = mappings["Values"](), real.Values()
        for name in ("set", "frozenset", "range", "ply_block", "ply_scalar", "datetime64[ns]",
                     "in_containers"):
            got = getattr(isolated, isolated.FUNCTION)(given=cases[name])
            want = in_process.run(given=cases[name])
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert bh_values.describe(g) == bh_values.describe(w), name
    finally:
        nodes._forget_all()
