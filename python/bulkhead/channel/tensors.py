"""numpy arrays and torch CPU tensors <-> bulkhead tensor refs.

Sending copies the data once, straight into a pooled shared-memory block
(non-contiguous sources are made contiguous by that same copy).  Receiving
wraps the peer's block with no copy: numpy through the lease's
``__array_interface__``, torch through a DLPack capsule; the received
object keeps the block alive, and when it goes the block goes back to its
owner's pool.  A small tensor (at most ``_native.TENSOR_INLINE_MAX`` bytes,
64 KiB) needs no block, so no fd: its bytes travel inline in the value, and
the receiver's array owns a copy of them (a bytearray).  A list of a
thousand small arrays thus costs no fds at all.  One a little larger (at
most ``_native.ARENA_ITEM_MAX`` bytes, 256 KiB) shares blocks with the
message's other such arrays: ``chan.acquire`` during the encode hands it a
64-byte-aligned range of the message's arena (src/core/shm.c,
bh_arena_take), and the receiver's view of it keeps that block alone.
Neither library is imported here unless the process already
has it loaded or a tensor of it arrives.

A numpy array whose dtype no bulkhead code names -- a record (a PLY
vertex, ``[("x", "<f4"), ..., ("red", "u1")]``), ``datetime64[unit]`` or
``timedelta64[unit]``, a byte-swapped, bytes or str dtype -- crosses as
the same array: its bytes as a uint8 tensor of shape (..., itemsize),
copied, shared or sent back by reference as any other, with its dtype's
description beside them (an ARRAY value, protocol 8; src/core/codec.c).
The description is JSON (``dtype_description``): ``dtype.str`` for a
plain dtype ("<M8[ns]", ">f4", "<U3"), a map of names, formats, offsets,
itemsize (and titles, alignment) for a record, ``{"sub": ..., "shape":
...}`` for a subarray.  The receiver builds the dtype from it
(``dtype_from_description``), refusing anything that holds objects or is
not one of numpy's own types, and checks that its itemsize is the bytes'
last dimension; a numpy scalar of such a dtype (``np.datetime64``, a
record's ``np.void``) comes back a scalar.  Objects (``dtype=object``)
never cross as data.

A tensor that came from the peer crosses back by reference: if its bytes
(C-contiguous, at a 64-byte-aligned offset) lie in a block of the peer's
that a live view here still holds (``chan.peer_lease``), the value names
that block (a back ref, protocol 6) and nothing is copied; the peer gets a
view of its own block.  That view is read-only to numpy; torch has no
read-only tensors, so a torch view is writable, and a write there is seen
by the other side's view of the same block, as a write into a tensor
shared between two nodes is in one ComfyUI process.  The block is not
reused while any view of it lives on either side.

A view of ANOTHER channel's peer block goes on by reference too (a
forward, protocol 7) where its owner sealed that block against writes
before lending it (the block a SendCache keeps for a tensor sent again):
the host passes worker A's kept tensor to worker B by lending B A's block
itself (``chan.peer_lease`` finds it among the host's channels; a host
keeps the memfd of each such block of 1 MiB or more that a worker lends
it).  B maps it copy-on-write: a write there stays in B, and B sends it
back by reference only where it wrote nothing (else it is copied).  Any
other block of A's is one A's pool reuses for its next output: the host
copies a view of it into a block of its channel with B, which B maps
already from the last such copy, and A gets its block back (#40: a
forward spends its block, protocol 10, so a new output each call would
cost A a fresh memfd and B a fresh mapping).  That block is sealed
against writes (note_received), so B maps it copy-on-write as it would
a forward, and an input B hands back as it arrived is the host's object
again.  A node that returns one of its input tensors as it arrived
sends no tensor at all: the host takes back its own input object
(Peer.passes_back, channel/nodes.py passed_through), as one ComfyUI
process would pass the same object on.  A torch tensor sent again unchanged goes by reference from its
third crossing on (SendCache, below).  Everything else is copied once per
crossing.

A torch tensor's flags cross with it (protocol 9, in the ref's lib byte):
whether it requires grad, whether it is an inference tensor, and whether
it is a ``torch.nn.Parameter``.  The receiver makes its tensor under
``torch.inference_mode()`` where the sender's was an inference tensor and
out of it where not, whichever mode its own thread is in, sets
requires_grad where the sender's had it, and makes it a Parameter (over
the same bytes) where it was one:
the next node sees what it would have seen in one ComfyUI process (whose
executor runs every node under inference mode; a node may still return a
tensor made outside it, a leaf that requires grad).  The autograd graph
stays behind: what arrives is a leaf.
"""

import _thread   # not threading: its RLock is this one (a worker's start imports no threading: #40)
import os
import sys
import weakref

from .. import _native
from .._native import ENCODE_TENSOR  # encode_other's tag for a tensor (codec.c); a rename fails here

_CODES = {name: code for name, (code, _size) in _native.dtypes().items()}
_INLINE_MAX = _native.TENSOR_INLINE_MAX

# numpy dtype names that map directly; longdouble is platform-sized.
_NUMPY_NAMES = {
    "bool": "bool", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64", "float16": "float16", "float32": "float32",
    "float64": "float64", "complex64": "complex64", "complex128": "complex128",
}

_TORCH_NAMES = {
    "bool": "bool", "int8": "int8", "uint8": "uint8", "int16": "int16",
    "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64", "float16": "float16", "bfloat16": "bfloat16",
    "float32": "float32", "float64": "float64", "complex32": "complex32",
    "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
}


def _numpy_code(np, dtype):
    """The bulkhead code of a plain numpy dtype, or None: one that crosses
    by its description (an ARRAY)."""
    if dtype.fields is not None or dtype.subdtype is not None or not dtype.isnative:
        return None
    if dtype.kind == "f" and dtype.itemsize == 16:
        name = "longdouble"
    elif dtype.kind == "c" and dtype.itemsize == 32:
        name = "clongdouble"
    else:
        name = _NUMPY_NAMES.get(dtype.name)
    return None if name is None else _CODES[name]


# numpy's own type numbers (NPY_BOOL .. NPY_HALF, OBJECT 17 excluded by
# kind): a dtype of another number is a third party's (ml_dtypes' bfloat16,
# numpy 2's StringDType), whose bytes may hold pointers or mean nothing
# without its module.
_OWN_TYPE_NUMS = 24
_PLAIN_KINDS = frozenset("biufcmMSUV")
_DESC_DEPTH = 16     # records in records in subarrays...


def dtype_description(dtype, depth=0):
    """dtype -> the JSON-able description an ARRAY carries (see the
    module's docstring); TypeError for a dtype that cannot cross as data
    (objects, a third party's type), naming it."""
    if depth > _DESC_DEPTH:
        raise TypeError(f"cannot send a numpy array of dtype {dtype}: its records nest deeper "
                        f"than {_DESC_DEPTH} levels")
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return {"sub": dtype_description(base, depth + 1), "shape": list(shape)}
    if dtype.names is not None:
        names, formats, offsets, titles = [], [], [], []
        for name in dtype.names:
            field = dtype.fields[name]
            names.append(name)
            formats.append(dtype_description(field[0], depth + 1))
            offsets.append(field[1])
            titles.append(field[2] if len(field) > 2 else None)
        out = {"names": names, "formats": formats, "offsets": offsets, "itemsize": dtype.itemsize}
        if any(t is not None for t in titles):
            if not all(t is None or isinstance(t, str) for t in titles):
                raise TypeError(f"cannot send a numpy array of dtype {dtype}: a field's title is "
                                "not a str")
            out["titles"] = titles
        if dtype.isalignedstruct:
            out["aligned"] = True
        return out
    if dtype.hasobject or dtype.kind not in _PLAIN_KINDS or dtype.num >= _OWN_TYPE_NUMS:
        raise TypeError(f"cannot send a numpy array of dtype {dtype} as data: bulkhead carries numpy's "
                        "own numeric, bool, datetime64/timedelta64, bytes, str and record dtypes, "
                        "not objects or another library's dtypes (convert with .astype(...))")
    return dtype.str


def dtype_from_description(np, desc, depth=0):
    """The description an ARRAY carried -> the dtype it names, or
    ValueError naming what is wrong with it (a peer's malformed value:
    never what dtype_description writes)."""
    if depth > _DESC_DEPTH:
        raise ValueError(f"the description nests deeper than {_DESC_DEPTH} levels")
    if isinstance(desc, str):
        if len(desc) > 64:
            raise ValueError(f"{desc[:64]!r}... is no numpy dtype string")
        try:
            dt = np.dtype(desc)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{desc!r} is no numpy dtype ({e})") from None
        if dt.hasobject or dt.kind not in _PLAIN_KINDS or dt.num >= _OWN_TYPE_NUMS \
                or dt.fields is not None or dt.subdtype is not None or dt.str != desc:
            raise ValueError(f"{desc!r} is not a plain dtype bulkhead sends ({dt})")
        return dt
    if isinstance(desc, dict) and set(desc) == {"sub", "shape"}:
        shape = desc["shape"]
        if not (isinstance(shape, list) and 0 < len(shape) <= 32 and
                all(type(n) is int and 0 <= n < 2**31 for n in shape)):
            raise ValueError(f"a subarray's shape {shape!r} is not a list of 1 to 32 sizes")
        base = dtype_from_description(np, desc["sub"], depth + 1)
        try:
            return np.dtype((base, tuple(shape)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"subarray {base} x {tuple(shape)}: {e}") from None
    if isinstance(desc, dict) and {"names", "formats", "offsets", "itemsize"} <= set(desc) <= \
            {"names", "formats", "offsets", "itemsize", "titles", "aligned"}:
        names, formats, offsets = desc["names"], desc["formats"], desc["offsets"]
        titles, itemsize, aligned = desc.get("titles"), desc["itemsize"], desc.get("aligned", False)
        n = len(names) if isinstance(names, list) else -1
        if not (n >= 0 and all(type(x) is str for x in names) and isinstance(formats, list)
                and len(formats) == n and isinstance(offsets, list) and len(offsets) == n
                and all(type(o) is int and o >= 0 for o in offsets) and type(itemsize) is int
                and itemsize >= 0 and type(aligned) is bool
                and (titles is None or (isinstance(titles, list) and len(titles) == n and
                                        all(t is None or type(t) is str for t in titles)))):
            raise ValueError("a record's names, formats, offsets, titles, itemsize or alignment "
                             "are not lists of one length, non-negative ints and a bool")
        spec = {"names": names, "formats": [dtype_from_description(np, f, depth + 1) for f in formats],
                "offsets": offsets, "itemsize": itemsize}
        if titles is not None:
            spec["titles"] = titles
        try:
            dt = np.dtype(spec, align=aligned)
        except (TypeError, ValueError) as e:
            raise ValueError(f"record {names!r}: {e}") from None
        if dt.hasobject:
            raise ValueError(f"record {names!r} holds objects")
        return dt
    raise ValueError(f"{desc!r:.80} is neither a dtype string, a record nor a subarray")


def _array_of_description(np, desc, shape, raw, scalar):
    """The array (or scalar) an ARRAY carried: raw, a uint8 array of shape
    (..., itemsize) over its bytes (None: it has none), viewed as the
    described dtype.  ProtocolError for a description that is not one
    dtype_description writes, or that does not fit the bytes."""
    try:
        import json  # lazy: worker start
        dtype = dtype_from_description(np, json.loads(desc))
        if dtype.itemsize != shape[-1]:
            raise ValueError(f"its itemsize is {dtype.itemsize} bytes, the array's are {shape[-1]}")
    except (ValueError, RecursionError) as e:
        raise _native.ProtocolError(f"decode: an array's dtype description is malformed "
                                    f"(BH_EBODY): {e}") from None
    if raw is None or dtype.itemsize == 0:
        out = np.zeros(shape[:-1], dtype=dtype)
    else:
        out = raw.view(dtype)[..., 0]   # the last axis is the itemsize, contiguous (codec.c checks)
    return out[()].copy() if scalar else out


_torch_by_code = None


def _torch_dtypes(torch):
    global _torch_by_code
    if _torch_by_code is None:
        table = {}
        for ours, attr in _TORCH_NAMES.items():
            dt = getattr(torch, attr, None)
            if dt is not None:
                table[_CODES[ours]] = dt
        _torch_by_code = table
    return _torch_by_code


def _torch_code(torch, dtype):
    for code, dt in _torch_dtypes(torch).items():
        if dt == dtype:
            return code
    raise TypeError(f"cannot send a torch tensor of dtype {dtype}: bulkhead has no code for it")


# What one channel's SendCache may hold in sealed blocks at once, and how
# many tensors it remembers.
SEND_CACHE_BYTES = 256 << 20
SEND_CACHE_ENTRIES = 4096


class SendCache:
    """torch CPU tensors of this process sent more than once unchanged on
    one channel (the host's to a worker, a worker's cached outputs to the
    host): copied on their first two crossings, by reference after.

    A tensor is unchanged while it is the same object with the same
    ``_version`` (torch bumps it on every in-place change, through any view
    of its storage), shape, strides, storage offset, dtype and address.
    Its first crossing is copied as any other (a pooled block) and
    remembered; the second copies it into a block kept for it, sealed
    against writes before the peer maps it (``chan.acquire_sealed``: the
    peer maps it copy-on-write, so a write there stays there and is
    dropped when the peer returns the block); from the third on, the value
    names that block again: no copy.  A change, a tensor that died (a
    weakref callback), or room wanted for another drops the kept block
    (back to the pool, sealed: the next tensor kept takes it, at the cost of
    the copy alone; only the first ever pays for a new block).
    Sent twice in one value, or while the peer still holds it from an
    earlier message, it is copied as before.  At most ``max_bytes`` are
    kept (least recently sent dropped first), counted in the channel's
    ``own_bytes``; ``clear()`` drops them all (memory pressure).
    numpy arrays and torch inference tensors (made under
    ``torch.inference_mode()``) have no version counter: they are never
    kept (those already in a block of the peer's go by reference anyway: a
    back ref; those in another channel's peer block are copied unless
    that block was kept, sealed, by its owner: a forward)."""

    def __init__(self, max_bytes=SEND_CACHE_BYTES, max_entries=SEND_CACHE_ENTRIES):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.held_bytes = 0
        self._entries = {}  # id(tensor) -> [ref, signature, lease, serial]; insertion = LRU order
        # Reentrant: a collection inside a locked section may run a dead
        # tensor's weakref callback (forget) on this very thread.
        self._lock = _thread.RLock()

    def __len__(self):
        return len(self._entries)

    def take(self, chan, obj, t, nbytes, torch):
        """The Lease to send obj (whose contiguous bytes are t) by, or None:
        copy it as ever."""
        if obj.is_inference():  # no version counter: a change would not be seen
            return None
        sig = (obj._version, tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype,
               obj.data_ptr())
        key = id(obj)
        with self._lock:
            e = self._entries.pop(key, None)
            if e is not None and e[0]() is not obj:  # another object at a reused id
                self._release(e)
                e = None
            if e is None:
                self._trim_entries()
                ref = weakref.ref(obj, _forget_later(weakref.ref(self), key))
                self._entries[key] = [ref, sig, None, 0]
                return None
            self._entries[key] = e  # most recently sent last
            if e[1] != sig:  # changed: copied again, from the start
                self._release(e)
                e[1] = sig
                return None
            serial = chan.encode_serial
            if e[2] is not None:
                if e[3] == serial or e[2].lent:
                    return None
                e[3] = serial
                return e[2]
            if nbytes > self.max_bytes:
                return None
            self._make_room(nbytes)
        lease = chan.acquire_sealed(nbytes)
        if lease is None:
            return None
        _copy_into(torch, lease, nbytes, t)
        with self._lock:
            if self._entries.get(key) is not e or e[2] is not None:
                return lease  # dropped meanwhile (a finalizer): sent once, not kept
            e[2], e[3] = lease, serial
            self.held_bytes += nbytes
        return lease

    def forget(self, key):
        """Drops the entry at key if its tensor died."""
        with self._lock:
            e = self._entries.get(key)
            if e is not None and e[0]() is None:
                del self._entries[key]
                self._release(e)

    def clear(self):
        """Drops every kept block (and what is remembered)."""
        with self._lock:
            for e in list(self._entries.values()):
                self._release(e)
            self._entries.clear()

    # lock held
    def _release(self, e):
        lease, e[2] = e[2], None
        if lease is not None:
            self.held_bytes -= lease.nbytes

    def _make_room(self, nbytes):
        for key in list(self._entries):
            if self.held_bytes + nbytes <= self.max_bytes:
                return
            e = self._entries.get(key)
            if e is not None and e[2] is not None:
                self._release(e)

    def _trim_entries(self):
        while len(self._entries) >= self.max_entries:
            self._release(self._entries.pop(next(iter(self._entries))))


def _forget_later(cache_ref, key):
    """The weakref callback that drops a dead tensor's entry (any thread)."""
    def forget(_ref):
        cache = cache_ref()
        if cache is not None:
            cache.forget(key)
    return forget


# Tensors of 1 MiB or more (shm.c's BH__FORWARD_MIN) received in a block
# of the peer's that the peer reuses (not sealed: never forwarded), id ->
# weakref (Peer.decode_tensor notes them, note_received): the host's view
# of worker A's new output.  Sent on to worker B it is copied (B must never
# see a block A reuses, #40), into a block sealed against writes, which B
# maps copy-on-write (reused as any block of this channel's: B's mapping
# and its pages stay): B's writes stay B's, so an input B hands back as it
# arrived is still the host's object (Peer.passes_back), as with a
# forward.  Any other copy goes into a plain block, as before.
_SEALED_COPY_MIN = 1 << 20
_received = {}
_received_lock = _thread.allocate_lock()


def note_received(obj, lease):
    """Notes obj (just decoded over lease) if it is such a tensor."""
    if lease.nbytes < _SEALED_COPY_MIN or lease.own or lease.copy_on_write:
        return
    key = id(obj)
    ref = weakref.ref(obj, lambda _r, key=key: _received_pop(key, _r))
    with _received_lock:
        _received[key] = ref


def _received_pop(key, ref):
    with _received_lock:
        if _received.get(key) is ref:
            del _received[key]


def _was_received(obj):
    ref = _received.get(id(obj))
    return ref is not None and ref() is obj


def _acquire_for(chan, obj, nbytes):
    """The lease a copy of obj's nbytes goes into: sealed where obj is a
    tensor noted received (above), else a plain block."""
    if nbytes >= _SEALED_COPY_MIN and _was_received(obj):
        lease = chan.acquire_sealed(nbytes)
        if lease is not None:
            return lease
    return chan.acquire(nbytes)


def encode(chan, obj, cache=None):
    """Copies obj into a block of chan's pool (or names a block it is in
    already, or, given a SendCache, the block kept for it).  Returns the
    tuple the C encoder expects, (ENCODE_TENSOR, lib, dtype, shape,
    lease-or-bytes) (src/python/codec.c's opener), or None if obj is
    neither a numpy array nor a torch tensor."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.generic):
        t = encode(chan, np.asarray(obj))
        return t[:1] + (_native.TENSOR_NUMPY_SCALAR,) + t[2:]
    if np is not None and isinstance(obj, np.ndarray):
        code = _numpy_code(np, obj.dtype)
        if code is None:  # a record, datetime64, ...: its bytes and its description
            return _encode_described(np, chan, obj)
        if 0 < obj.nbytes <= _INLINE_MAX:
            return (ENCODE_TENSOR, _native.TENSOR_NUMPY, code, obj.shape, obj.tobytes())  # C order
        lease = None
        if obj.base is not None and obj.flags.c_contiguous:  # a view: maybe of a peer's block
            lease = chan.peer_lease(obj.__array_interface__["data"][0], obj.nbytes)
            if lease is not None:
                return (ENCODE_TENSOR, _native.TENSOR_NUMPY, code, obj.shape, lease)
        if obj.nbytes:
            lease = _acquire_for(chan, obj, obj.nbytes)
            if obj.flags.c_contiguous:  # bh_copy, as a torch tensor's (_copy_into)
                lease.fill(obj.__array_interface__["data"][0], obj.nbytes, copy_threads(obj.nbytes))
            else:
                dst = np.asarray(lease)[: obj.nbytes].view(obj.dtype).reshape(obj.shape)
                np.copyto(dst, obj, casting="no")
                del dst
        return (ENCODE_TENSOR, _native.TENSOR_NUMPY, code, obj.shape, lease)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise TypeError(
                f"cannot send a torch tensor on device {obj.device}: bulkhead moves CPU "
                "tensors; call .cpu() first")
        if obj.layout != torch.strided:
            raise TypeError(f"cannot send a torch tensor with layout {obj.layout}; call .to_dense()")
        code = _torch_code(torch, obj.dtype)
        lib = _native.TENSOR_TORCH | _torch_flags(obj)
        t = obj.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        nbytes = t.numel() * t.element_size()
        np = sys.modules.get("numpy")  # torch's .numpy() needs it
        if 0 < nbytes <= _INLINE_MAX and np is not None:
            data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            return (ENCODE_TENSOR, lib, code, tuple(t.shape), data)
        lease = None
        if nbytes and t.is_contiguous():  # maybe a view of a peer's block
            lease = chan.peer_lease(t.data_ptr(), nbytes)
            if lease is not None:
                return (ENCODE_TENSOR, lib, code, tuple(t.shape), lease)
        if cache is not None and nbytes and t.data_ptr() == obj.data_ptr():  # not resolved (a copy)
            lease = cache.take(chan, obj, t, nbytes, torch)  # sent before, unchanged
            if lease is not None:
                return (ENCODE_TENSOR, lib, code, tuple(t.shape), lease)
        if nbytes:
            lease = _acquire_for(chan, obj, nbytes)
            _copy_into(torch, lease, nbytes, t)
        return (ENCODE_TENSOR, lib, code, tuple(t.shape), lease)
    return None


def _torch_flags(obj):
    """A torch tensor's flags on the wire: TENSOR_REQUIRES_GRAD,
    TENSOR_INFERENCE, TENSOR_PARAMETER (torch.nn.Parameter itself, not a
    subclass: an UninitializedParameter has no data to send)."""
    torch = sys.modules["torch"]
    return ((_native.TENSOR_REQUIRES_GRAD if obj.requires_grad else 0) |
            (_native.TENSOR_INFERENCE if obj.is_inference() else 0) |
            (_native.TENSOR_PARAMETER if type(obj) is torch.nn.Parameter else 0))


def _encode_described(np, chan, obj):
    """An array of a dtype no code names: the tuple for its bytes as uint8,
    shape (..., itemsize), with its description (an ARRAY).  A view of a
    peer's block stays one (by reference, as any array)."""
    import json  # lazy: worker start
    desc = json.dumps(dtype_description(obj.dtype), separators=(",", ":"))
    if len(desc.encode()) > _native.ARRAY_DESC_MAX:
        raise TypeError(f"cannot send a numpy array of dtype {obj.dtype}: its description takes "
                        f"{len(desc.encode())} bytes, over bulkhead's {_native.ARRAY_DESC_MAX}")
    isz = obj.dtype.itemsize
    if obj.ndim >= 16:  # the bytes take one dimension more
        raise TypeError(f"cannot send a numpy array of dtype {obj.dtype} with {obj.ndim} dimensions: "
                        "bulkhead carries such arrays with at most 15")
    if isz == 0 or obj.size == 0:
        raw = np.empty(obj.shape + (isz,), np.uint8)
    else:
        c = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj).reshape(obj.shape)
        raw = c.reshape(-1).view(np.uint8).reshape(obj.shape + (isz,))
    return encode(chan, raw) + (desc,)


def _copy_into(torch, lease, nbytes, t):
    """t's bytes into the leased block.  A contiguous tensor: bh_copy
    (Lease.fill) on up to copy_threads threads, which streams a large copy
    past the cache and hands its chunks to helper threads as they come, so
    a copy waits for no thread the machine has not scheduled: torch's
    copy_ splits every copy over its intra-op threads in fixed shares, and
    on a small, busy machine waits for whichever one is descheduled (a
    3 MiB copy_ took 4-8 ms in a worker beside the host, against 0.3 ms:
    docs/performance.md).  Strided: copy_."""
    if t.is_contiguous():
        lease.fill(t.data_ptr(), nbytes, copy_threads(nbytes))
        return
    dst = _torch_view(torch, lease, nbytes, t.dtype, tuple(t.shape))
    dst.copy_(t)


# A copy into a block is split over threads only in shares of at least
# _COPY_SHARE bytes (below, waking a helper costs more than it saves: a
# 3 MiB IMAGE is one memcpy) and over at most _COPY_THREADS_MAX threads
# (two or three cores saturate a machine's memory bandwidth).
_COPY_SHARE = 4 << 20
_COPY_THREADS_MAX = 4


def copy_threads(nbytes):
    """How many threads may copy nbytes into a block: one per _COPY_SHARE
    bytes, at most _COPY_THREADS_MAX and the CPUs this process may run
    on.  Not fewer where the machine is busy: bh_copy's helpers claim
    chunks as they get a CPU, so one that is not scheduled costs the copy
    nothing (the calling thread copies its chunks).  Measured on 2 CPUs at
    load 8, a new 64 MiB tensor each way: 0.8x (host -> worker, summed)
    and 0.7x (worker -> host) the time with one thread wherever
    /proc/loadavg showed no idle CPU, the rule before."""
    most = min(_COPY_THREADS_MAX, nbytes // _COPY_SHARE)
    if most <= 1:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        cpus = os.cpu_count() or 1
    return max(1, min(most, cpus))


def _torch_view(torch, lease, nbytes, dtype, shape):
    raw = torch.from_dlpack(lease.dlpack())
    if raw.numel() != nbytes:
        raw = raw[:nbytes]
    return raw.view(dtype).view(shape) if shape else raw.view(dtype).view(())


# A torch tensor sent to a process without torch: a pack's worker whose
# environment was built without the host's torch (no index reachable has
# that build for its Python; envs/build.py warned, and the pack's state says
# "isolated without torch").
_NO_TORCH = ("a torch tensor reached this worker, whose Python ({python}, {version}) has no torch ({why}): "
             "its environment was built without the host's torch, which no index reachable has for this "
             "Python, so the pack's nodes that take or return tensors cannot run isolated. Fix: give the pack "
             "the host's Python minor (python = in its comfy-env.toml), or name an index with a torch build "
             "for this Python (BULKHEAD_TORCH_INDEX), then `bulkhead install <pack>`")


def decode(lib, code, shape, strides, lease, desc=None):
    """Wraps a received tensor ref without copying.  lease: a Lease over
    the peer's block, None (an empty tensor) or a bytearray (an inline
    one: the codec's copy, which the result keeps).  desc: an ARRAY's
    dtype description (the ref is its uint8 bytes), or None."""
    inline = isinstance(lease, bytearray)
    if lib & _native.TENSOR_LIB_MASK == _native.TENSOR_TORCH:
        try:
            import torch  # optional: torch
        except ImportError as e:
            raise ModuleNotFoundError(_NO_TORCH.format(python=sys.executable, version=sys.version.split()[0],
                                                       why=e)) from None
        dtype = _torch_dtypes(torch).get(code)
        if dtype is None:
            raise TypeError(f"this torch has no dtype for bulkhead code {code}")
        # The sender's kind of tensor (an inference tensor or not), whatever
        # mode this thread is in; requires_grad set in the same mode (an
        # inference tensor's may be set only inside it).  The codec let
        # REQUIRES_GRAD through on floating-point and complex dtypes only.
        inference = bool(lib & _native.TENSOR_INFERENCE)
        if torch.is_inference_mode_enabled() == inference:  # the mode wanted already (1.5 us saved)
            return _torch_made(torch, lib, dtype, shape, strides, lease, inline)
        with torch.inference_mode(inference):
            return _torch_made(torch, lib, dtype, shape, strides, lease, inline)
    import numpy as np  # optional: numpy
    if desc is not None:  # an ARRAY: uint8 bytes, shape (..., itemsize)
        scalar = lib == _native.TENSOR_NUMPY_SCALAR
        raw = None if lease is None else decode(_native.TENSOR_NUMPY, code, shape, strides, lease)
        return _array_of_description(np, desc, shape, raw, scalar)
    name = _native_name(code)
    dtype = np.dtype(name if name not in ("longdouble", "clongdouble") else getattr(np, name))
    if lib == _native.TENSOR_NUMPY_SCALAR:
        if shape or lease is None:
            raise TypeError(f"a numpy scalar must be a 0-d tensor with data, not shape {shape}")
        flat = np.frombuffer(lease, dtype) if inline else np.asarray(lease).view(dtype)
        return flat[0].copy()
    if lease is None:
        return np.empty(shape, dtype=dtype)
    flat = np.frombuffer(lease, dtype) if inline else np.asarray(lease).view(dtype)
    if tuple(strides) == _contiguous(shape):
        return flat.reshape(shape)
    isz = dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * isz for s in strides))


def _torch_made(torch, lib, dtype, shape, strides, lease, inline):
    """decode's torch tensor, made in the inference mode its flags say."""
    t = _torch_of(torch, dtype, shape, strides, lease, inline)
    grad = bool(lib & _native.TENSOR_REQUIRES_GRAD)
    if lib & _native.TENSOR_PARAMETER:
        t = torch.nn.Parameter(t, requires_grad=grad)
    elif grad:
        t.requires_grad_()
    return t


def _torch_of(torch, dtype, shape, strides, lease, inline):
    if lease is None:
        return torch.empty(shape, dtype=dtype)
    contiguous = tuple(strides) == _contiguous(shape)
    if inline:
        t = torch.frombuffer(lease, dtype=torch.uint8).view(dtype)
        return t.view(shape) if contiguous else t.as_strided(shape, strides)
    t = _torch_view(torch, lease, lease.nbytes, dtype, shape if contiguous else (-1,))
    return t if contiguous else t.as_strided(shape, strides)


def layout(obj):
    """(address, nbytes, shape, strides, dtype, contiguous) of a numpy
    array or torch tensor, else None: what says a tensor is still the
    bytes and the view it arrived as (Peer.passes_back)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return (obj.__array_interface__["data"][0], obj.nbytes, obj.shape, obj.strides, obj.dtype,
                obj.flags.c_contiguous)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
        return (obj.data_ptr(), obj.numel() * obj.element_size(), tuple(obj.shape), obj.stride(), obj.dtype,
                obj.is_contiguous())
    return None


def _contiguous(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


_NAMES = {code: name for name, code in _CODES.items()}


def _native_name(code):
    name = _NAMES.get(code)
    if name is None or (name not in _NUMPY_NAMES and name not in ("longdouble", "clongdouble")):
        raise TypeError(f"numpy has no dtype for bulkhead code {code} ({name})")
    return name
