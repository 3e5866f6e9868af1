"""The hooks a channel calls for what its C loop cannot decide, and the
exceptions a caller sees.  One ``Peer`` per channel end, host or worker.

Handles: a callable passed as an argument crosses as a handle to an entry
in the sender's export table; the receiver gets a ``RemoteCallable`` that
sends a CALLBACK when called.  A handle carries the OWNED_BY_RECEIVER bit
when it goes back to the process that exported it, so each side can tell
its own objects from the peer's.

Object handles (HANDLE_OBJECT): an object the codec cannot carry (a model a
node pack made, say) stays in the process that made it, in that peer's
object table, when it is sent wrapped in ``Held`` (see ``Peer.hold``) or
inside a ``NodeValue`` from a worker (a node's outputs: the codec's one walk
holds what it cannot carry); the other side gets a ``RemoteObject``, named
by the type name the handle ref carries.  Sent back to the same peer it resolves
to the original; sent anywhere else (another worker, or the same worker
after a restart: another Peer) it is a ``HandleError`` naming the object's
type and its owner.  The table counts how many times each entry was sent;
the receiver keeps one RemoteObject per entry (counting what it received)
and, once it drops that RemoteObject, queues a release of that count,
which its owner (host.Worker) sends in batches.  An entry is gone when the
releases have matched the sends.
"""

import _thread   # not threading: a worker's start needs only its lock (threading, with functools, ~1.5 ms: #40)
import builtins
import importlib
import itertools
import sys
import weakref

from .. import _native
from .._native import ENCODE_HANDLE, ENCODE_VALUE  # encode_other's tags (codec.c); a rename fails here
from . import tensors as _tensors

OWNED_BY_RECEIVER = 0x80


class BulkheadError(Exception):
    """Base of the errors bulkhead raises itself."""


class RemoteError(BulkheadError):
    """An exception raised in the peer, raised here as it was there.
    ``remote_type`` is its qualified type name, ``remote_message`` its
    message (``str()`` of it, exactly) and ``remote_traceback`` the peer's
    formatted traceback; ``detail`` says all three and where, for bulkhead's
    own logs.  What make_error raises is an instance of a class named as the
    original (its ``__module__`` and ``__qualname__``: ComfyUI's executor
    reports an isolated node's error as it does in-process) and, where the
    original is or derives from a builtin exception type, an instance of
    that builtin too (``except ValueError`` works); its ``args`` are the
    original's where they crossed.  The peer's traceback is its
    ``__cause__`` (a ``RemoteTraceback``), so that a log of the traceback
    (``traceback.format_exc()``) shows it above this process's own."""

    def __init__(self, remote_type, message, remote_traceback="", worker=None, args=None):
        super().__init__(*(args if args is not None else (message,)))
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.worker = worker
        if remote_traceback:
            self.__cause__ = RemoteTraceback(remote_traceback, worker)

    def __str__(self):
        return self.remote_message

    @property
    def detail(self):
        """The type, the message, where it was raised and the peer's
        traceback: what bulkhead's own logs and errors say of it."""
        text = f"{self.remote_type}: {self.remote_message}" + (f" [in {self.worker}]" if self.worker else "")
        if self.remote_traceback:
            text += "\n--- remote traceback ---\n" + self.remote_traceback.rstrip()
        return text


class RemoteTraceback(Exception):
    """The peer's formatted traceback, as the ``__cause__`` of the
    RemoteError raised for it (as concurrent.futures does for a process
    pool's)."""

    def __init__(self, text, worker=None):
        super().__init__(text)
        self.worker = worker

    def __str__(self):
        where = f" in {self.worker}" if self.worker else ""
        return f"raised{where}:\n{self.args[0].rstrip()}"


def error_detail(e):
    """``e.detail`` for a RemoteError, else ``str(e)``: what a log of
    bulkhead's says of an error that may have come from the peer."""
    return e.detail if isinstance(e, RemoteError) else str(e)


_remote_classes = {}


def remote_error_class(builtin_name, module=None, qualname=None):
    """The class raised for a peer's exception: RemoteError mixed with the
    builtin exception type `builtin_name` (where it is one and its layout
    allows), named `module`.`qualname` (None: the builtin's own name).
    Cached."""
    base = getattr(builtins, builtin_name, None) if builtin_name else None
    if not (isinstance(base, type) and issubclass(base, Exception)) or base is Exception:
        base = None
    if qualname is None:
        if base is None:
            return RemoteError
        module, qualname = "builtins", base.__qualname__
    key = (base, module, qualname)
    cls = _remote_classes.get(key)
    if cls is None:
        name = qualname.rpartition(".")[2] or qualname
        attrs = {"__module__": module, "__qualname__": qualname, "__doc__": RemoteError.__doc__,
                 "__init__": RemoteError.__init__, "__str__": RemoteError.__str__}
        try:
            cls = type(name, (RemoteError, base) if base is not None else (RemoteError,), attrs)
        except TypeError:  # a builtin with an incompatible layout
            cls = type(name, (RemoteError,), attrs)
        _remote_classes[key] = cls
    return cls


def renamed(exc, module):
    """A RemoteError as `exc` (its message, args, traceback, bases) whose
    class is named `module`.`qualname`: the host names a pack's class by
    the module ComfyUI imported the pack under (host/runtime.py)."""
    t = type(exc)
    builtin = next((b.__name__ for b in t.__mro__ if b.__module__ == "builtins" and issubclass(b, Exception)
                    and b is not Exception), None)
    cls = remote_error_class(builtin, module, t.__qualname__)
    try:
        new = cls(f"{module}.{t.__qualname__}", exc.remote_message, exc.remote_traceback, exc.worker, args=exc.args)
    except Exception:  # args the builtin's own __init__ refuses
        new = cls(f"{module}.{t.__qualname__}", exc.remote_message, exc.remote_traceback, exc.worker)
    if isinstance(exc, OSError) and isinstance(new, OSError):
        new.filename, new.filename2 = exc.filename, exc.filename2
    return new


# Called with each exception that crosses (a sandboxed worker sets it:
# worker/sandbox.py names what its sandbox refused); None elsewhere.
on_error = None

_INT64 = range(-2**63, 2**63)


def _plain_arg(a):
    """Whether an exception's argument crosses in its ERROR payload: a
    scalar the codec carries as it is (anything else stays behind, and
    the receiver's args are the message)."""
    if a is None or type(a) in (bool, float, bytes):
        return True
    if type(a) is int:
        return a in _INT64
    if type(a) is str:
        try:
            a.encode("utf-8")
        except UnicodeError:
            return False
        return True
    return False


def format_exception(exc):
    """The ERROR payload for an exception: its type (qualified name, and
    module and qualname apart), message, traceback, nearest builtin type
    and, where every one is a plain scalar, its args."""
    if on_error is not None:
        on_error(exc)
    t = type(exc)
    mod = t.__module__
    name = t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"
    builtin = t.__name__ if mod == "builtins" else None
    if builtin is None:  # the nearest builtin base, so `except OSError` still works
        for base in t.__mro__:
            if base.__module__ == "builtins" and issubclass(base, Exception):
                builtin = base.__name__
                break
    try:
        import traceback  # lazy: worker start (~14 ms; only when an error crosses)
        tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    except Exception:  # a broken __str__ must not break the report
        tb = f"{name}: <unprintable>"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    payload = {"type": name, "message": message, "traceback": tb, "builtin": builtin,
               "module": mod if isinstance(mod, str) else "builtins", "qualname": t.__qualname__}
    args = getattr(exc, "args", None)
    if isinstance(args, tuple) and all(_plain_arg(a) for a in args):
        payload["args"] = list(args)
    if isinstance(exc, OSError):  # what str() says of it beside its args
        names = [n for n in ("filename", "filename2") if _plain_arg(getattr(exc, n, None))]
        payload["attrs"] = {n: getattr(exc, n) for n in names}
    return payload


class HandleError(BulkheadError, TypeError):
    """An object handle used where it does not resolve: passed to another
    worker than the one holding the object, used after that worker was
    restarted, or released."""


class Held:
    """Marks an object to be sent by handle (it stays here, in the peer's
    object table).  Made by ``Peer.hold``."""

    __slots__ = ("ident",)

    def __init__(self, ident):
        self.ident = ident


class NodeValue:
    """Marks a value that crosses as a node's input or output: the codec
    walks it (once, in C) under the sending peer's node policy
    (``Peer.holds_for_nodes``): what cannot cross is held as a handle
    (a worker) or refused with ``HostObject`` (the host), and torch tensors
    on a device are copied to host memory.  A worker's object whose class a
    pack registered a serializer for crosses as that serializer's tagged
    map instead (``Peer.node_serializer``), and one of ComfyUI's execution
    values (an ExecutionBlocker, the host's DynamicPrompt), from either
    side, as its tagged map of data (``Peer.execution_values``)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class HostObject(TypeError):
    """A node's input the host made that cannot cross (the host's node
    policy).  ``obj`` is the object, for the caller to say where it was."""

    def __init__(self, obj):
        t = type(obj)
        super().__init__(
            f"input is a {t.__module__}.{t.__qualname__} made in the host process; an isolated "
            "node takes plain values, tensors and objects its own pack made (none of another pack's "
            "or ComfyUI's own objects)")
        self.obj = obj


def type_name(obj):
    t = type(obj)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"


def _clip(name, limit=_native.TYPE_NAME_MAX):
    """name in at most limit UTF-8 bytes (what a handle ref carries)."""
    b = name.encode("utf-8", "replace")
    return name if len(b) <= limit else b[:limit].decode("utf-8", "ignore")


class RemoteObject:
    """An object held by a worker, seen from the host.  Opaque: pass it to
    a node (or a call) of the same worker, which gets the original object;
    anything else fails with a HandleError naming the type and the pack."""

    __slots__ = ("_peer", "_id", "_type", "_count", "__weakref__")

    def __init__(self, peer, ident, count):
        self._peer = peer
        self._id = ident
        self._type = None
        self._count = count  # a one-item list shared with the finalizer

    @property
    def remote_type(self):
        """The qualified type name of the object in the worker, when known."""
        return self._type or "object"

    def _where(self):
        p = self._peer
        return f"pack {p.name!r}, worker generation {p.generation}"

    def __repr__(self):
        return f"<bulkhead.RemoteObject {self.remote_type} #{self._id} of {self._where()}>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self!r} has no attribute {name!r} here: the {self.remote_type} lives in the "
            f"worker of pack {self._peer.name!r} and the host holds only a handle to it; "
            "pass it to a node of the same pack")

    def __reduce__(self):
        raise TypeError(f"{self!r} cannot be pickled or copied: it is a handle to an object in a worker")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _release_later(peer_ref, ident, count):
    peer = peer_ref()
    if peer is not None:
        peer.queue_release(ident, count[0])


class RemoteCallable:
    """A callable of the peer.  Calling it sends a CALLBACK (or a CALL from
    the host) and waits, serving nested calls meanwhile."""

    __slots__ = ("_peer", "_id", "__weakref__")

    def __init__(self, peer, ident):
        self._peer = peer
        self._id = ident

    def __call__(self, *args, **kwargs):
        return self._peer.call_remote(self, args, kwargs)

    def __repr__(self):
        return f"<bulkhead.RemoteCallable #{self._id} of {self._peer.describe()}>"


# Received tensors kept for passes_back at most (a worker's requests that
# are not node calls have no end that clears them).
_RECEIVED_MAX = 256


class Peer:
    """Hooks for one channel end.  ``exports`` maps handle ids to local
    callables sent to the peer; ``outgoing`` is the frame kind a call to a
    peer callable travels as."""

    def __init__(self, describe="peer", outgoing=_native.CALLBACK, resolve=None, cache_sends=False):
        self.channel = None
        # torch tensors of this side sent again unchanged go by reference
        # after their second crossing (tensors.SendCache): host and worker
        self.sent = _tensors.SendCache() if cache_sends else None
        self.exports = {}
        self._export_ids = {}
        self._ids = itertools.count(1)
        self._describe = describe
        self.outgoing = outgoing
        self._resolve = resolve
        self.frame_handlers = {}
        self.request_handlers = {}
        self.timeout = None
        # what the object handles say about their owner
        self.name = "?"
        self.generation = 0
        # objects held here for the peer: ident -> [object, times sent]
        self.objects = {}
        self._object_ids = {}
        self._object_lock = _thread.allocate_lock()   # threading.Lock
        # the peer's objects seen here: ident -> RemoteObject
        self.remote_objects = weakref.WeakValueDictionary()
        self.pending_releases = []   # (ident, count) to tell the owner
        self.on_release_queued = None
        # The node policy (NodeValue): True, a worker's: what cannot cross is
        # held here as a handle; False, the host's: it is refused.
        self.holds_for_nodes = False
        # A worker's node policy for the classes its packs registered a
        # serializer for (worker/typed.py): obj -> a value to encode in
        # obj's place, or None to hold obj as a handle.
        self.node_serializer = None
        # Both sides' node policy for ComfyUI's execution values (channel/
        # nodes.py encode_comfy, which the host and the worker set): obj ->
        # the tagged map it crosses as, or None.
        self.execution_values = None
        # A worker's: the tensors decoded from its own block or a forward,
        # id -> (weakref, own block, tensors.layout), until its node call
        # ends (passes_back); None: not kept.
        self.received = None

    # --- object handles ---

    def hold(self, obj):
        """Enters obj into this side's object table (once per object) and
        returns a Held to send in its place."""
        with self._object_lock:
            ident = self._object_ids.get(id(obj))
            if ident is None or self.objects.get(ident, (None,))[0] is not obj:
                ident = next(self._ids)
                self._object_ids[id(obj)] = ident
                self.objects[ident] = [obj, 0, _clip(type_name(obj))]
        return Held(ident)

    def held_object(self, ident):
        entry = self.objects.get(ident)
        return entry[0] if entry is not None else None

    def release_objects(self, pairs):
        """Drops (ident, count) sends the peer no longer holds; an entry
        goes when every send is released."""
        with self._object_lock:
            for ident, count in pairs:
                entry = self.objects.get(ident)
                if entry is None:
                    continue
                entry[1] -= count
                if entry[1] <= 0:
                    del self.objects[ident]
                    self._object_ids.pop(id(entry[0]), None)

    def drop_unsent(self):
        """Forgets entries held for a send that never happened (the reply
        that would have carried them failed to encode)."""
        with self._object_lock:
            for ident in [i for i, e in self.objects.items() if e[1] <= 0]:
                entry = self.objects.pop(ident)
                self._object_ids.pop(id(entry[0]), None)

    def queue_release(self, ident, count):
        self.pending_releases.append((ident, count))
        hook = self.on_release_queued
        if hook is not None:
            hook(self)

    def take_releases(self):
        out, self.pending_releases = self.pending_releases, []
        return out

    def describe(self):
        return self._describe() if callable(self._describe) else self._describe

    # --- hooks called by the C loop ---

    def encode_other(self, obj, node=False):
        """Hook (src/python/codec.c calls it for what is not a plain value,
        node=True inside a NodeValue): answers a tensor (ENCODE_TENSOR,
        ...: channel/tensors.py encode), a handle (ENCODE_HANDLE, space, id,
        type_name) or a value to encode in obj's place (ENCODE_VALUE,
        value), or raises TypeError.  The tags are _native's, named in
        codec.c's opener with each tuple's shape."""
        if type(obj) is NodeValue:
            return (ENCODE_VALUE, obj.value)
        if node:
            torch = sys.modules.get("torch")
            if (torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu"
                    and obj.layout == torch.strided):
                obj = obj.detach().cpu()  # device tensors cross in host memory
        try:
            t = _tensors.encode(self.channel, obj, self.sent)
        except TypeError:
            if not (node and self.holds_for_nodes):
                raise
            t = None  # an array the codec cannot carry (objects, records): held below
        else:
            if t is not None:
                return t
        if isinstance(obj, Held):
            entry = self.objects.get(obj.ident)
            if entry is None:
                raise HandleError(f"object #{obj.ident} is no longer held by {self.describe()}")
            entry[1] += 1
            return (ENCODE_HANDLE, _native.HANDLE_OBJECT, obj.ident, entry[2])
        if isinstance(obj, RemoteObject):
            mine = obj._peer
            if mine is not self:
                if mine.name == self.name:
                    why = (f"that worker has ended since (this is generation {self.generation}); "
                           "run the node that made it again")
                else:
                    why = (f"it cannot be passed to pack {self.name!r}: an object a worker "
                           "holds stays in that worker")
                raise HandleError(f"the {obj.remote_type} made by pack {mine.name!r} is held by "
                                  f"worker generation {mine.generation}; {why}")
            return (ENCODE_HANDLE, _native.HANDLE_OBJECT | OWNED_BY_RECEIVER, obj._id, "")
        if node:
            comfy = self.execution_values(obj) if self.execution_values is not None else None
            if comfy is not None:  # ComfyUI's execution values (a blocker): data, either way
                return (ENCODE_VALUE, comfy)
            if not self.holds_for_nodes:
                raise HostObject(obj)
            if self.node_serializer is not None:
                typed = self.node_serializer(obj)
                if typed is not None:  # a registered class: its payload, walked as a node's value
                    return (ENCODE_VALUE, typed)
            held = self.hold(obj)
            return self.encode_other(held)
        if isinstance(obj, RemoteCallable):
            if obj._peer is not self:
                raise TypeError(f"{obj!r} belongs to another worker; it cannot be sent to {self.describe()}")
            return (ENCODE_HANDLE, _native.HANDLE_CALLABLE | OWNED_BY_RECEIVER, obj._id, "")
        if callable(obj) and not isinstance(obj, type):
            key = id(obj)
            ident = self._export_ids.get(key)
            if ident is None or self.exports.get(ident) is not obj:
                ident = next(self._ids)
                self._export_ids[key] = ident
                self.exports[ident] = obj
            return (ENCODE_HANDLE, _native.HANDLE_CALLABLE, ident, "")
        raise TypeError(
            f"cannot send an object of type {type(obj).__module__}.{type(obj).__qualname__} "
            f"to {self.describe()}: bulkhead carries None, bool, int, float, str, bytes, "
            "list, tuple, dict, set, frozenset, complex, range, numpy arrays, torch CPU tensors "
            "and callables (no pickle)")

    def decode_tensor(self, lib, code, shape, strides, lease, desc=None):
        """Hook (codec.c): a tensor ref (with an ARRAY's dtype description,
        desc) -> the array or tensor."""
        obj = _tensors.decode(lib, code, shape, strides, lease, desc)
        if lease is not None and not isinstance(lease, bytearray) and lib != _native.TENSOR_NUMPY_SCALAR:
            _tensors.note_received(obj, lease)  # sent on to a third process: a sealed copy
        rec = self.received
        if rec is not None and lease is not None and not isinstance(lease, bytearray) \
                and lib != _native.TENSOR_NUMPY_SCALAR:
            if len(rec) >= _RECEIVED_MAX:  # requests that are not node calls: nothing ends them
                rec.clear()
            if lease.own or lease.copy_on_write:
                rec[id(obj)] = (weakref.ref(obj), lease.own, _tensors.layout(obj))
        return obj

    def passes_back(self, obj):
        """True where obj is a tensor that arrived here as a view of the
        peer's object's own bytes, and the peer sees them as they are
        here: the same view (layout), of this side's own block sent back
        by reference (both map it shared: a write here is the peer's too),
        or of a block the peer sealed against writes that this side wrote
        nothing into (copy-on-write; peer_lease's check): one the peer
        forwarded from a third process, or the peer's copy of a third
        process's tensor (tensors.note_received).  The peer's own object
        then stands for it.  A view of the peer's plain block is not one:
        a write here would be in the peer's copy, not in its object."""
        entry = self.received.get(id(obj)) if self.received else None
        if entry is None or entry[0]() is not obj:
            return False
        now = _tensors.layout(obj)
        if now != entry[2]:
            return False
        if entry[1]:
            return True
        if not now[5]:
            return False
        lease = self.channel.peer_lease(now[0], now[1])
        if lease is None:
            return False
        lease.release()
        return True

    def decode_handle(self, space, ident, type_name=""):
        """Hook (codec.c): a handle ref -> the object it stands for."""
        if space == _native.HANDLE_CALLABLE | OWNED_BY_RECEIVER:
            fn = self.exports.get(ident)
            if fn is None:
                raise LookupError(f"callable #{ident} is no longer exported (its call has ended)")
            return fn
        if space == _native.HANDLE_CALLABLE:
            return RemoteCallable(self, ident)
        if space == _native.HANDLE_OBJECT | OWNED_BY_RECEIVER:
            entry = self.objects.get(ident)
            if entry is None:
                raise HandleError(f"object #{ident} is no longer held by this process "
                                  "(its handle was released)")
            return entry[0]
        if space == _native.HANDLE_OBJECT:
            ro = self.remote_objects.get(ident)
            if ro is not None:
                ro._count[0] += 1
                ro._type = ro._type or type_name or None
                return ro
            count = [1]
            ro = RemoteObject(self, ident, count)
            ro._type = type_name or None
            fin = weakref.finalize(ro, _release_later, weakref.ref(self), ident, count)
            fin.atexit = False
            self.remote_objects[ident] = ro
            return ro
        raise TypeError(f"unknown handle space {space:#x} from {self.describe()}")

    def resolve(self, target):
        if self._resolve is None:
            raise PermissionError(f"{self.describe()} does not serve calls by name ({target!r})")
        return self._resolve(target)

    def format_exc(self, exc):
        return format_exception(exc)

    def make_error(self, payload):
        if not isinstance(payload, dict):
            return RemoteError("bulkhead.ProtocolError", f"malformed error payload {payload!r}", "", self.describe())
        name = str(payload.get("type"))
        module, qualname = payload.get("module"), payload.get("qualname")
        if not (isinstance(module, str) and isinstance(qualname, str) and qualname):
            # A peer of a protocol before module and qualname crossed apart.
            module, _, qualname = name.rpartition(".")
            module = module or "builtins"
        cls = remote_error_class(payload.get("builtin"), module, qualname)
        args = payload.get("args")
        args = tuple(args) if isinstance(args, list) else None
        message = str(payload.get("message"))
        try:
            exc = cls(name, message, str(payload.get("traceback") or ""), self.describe(), args=args)
        except Exception:  # args the builtin's own __init__ refuses (it took others)
            exc = cls(name, message, str(payload.get("traceback") or ""), self.describe())
        attrs = payload.get("attrs")
        if isinstance(attrs, dict) and isinstance(exc, OSError):
            for n in ("filename", "filename2"):
                if n in attrs:
                    setattr(exc, n, attrs[n])
        return exc

    def on_frame(self, kind, value):
        handler = self.frame_handlers.get(kind)
        if handler is not None:
            handler(value)

    def on_request(self, kind, value):
        handler = self.request_handlers.get(kind)
        if handler is None:
            raise NotImplementedError(f"{self.describe()} does not handle frame kind {kind}")
        return handler(value)

    # --- used by RemoteCallable ---

    def call_remote(self, rc, args, kwargs):
        # rc itself is the target: encode_other sends it as OWNED_BY_RECEIVER
        return self.channel.request(self.outgoing, (rc, args, kwargs), self.timeout)


def resolve_target(target):
    """'pkg.mod:attr.path' or 'pkg.mod.func' -> the object, importing."""
    if ":" in target:
        mod_name, _, path = target.partition(":")
    else:
        mod_name, _, path = target.rpartition(".")
    if not mod_name or not path:
        raise ValueError(f"call target {target!r} must be 'module:function' or 'module.function'")
    obj = importlib.import_module(mod_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def interpreter_info():
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "implementation": sys.implementation.name,
        "executable": sys.executable,
        "prefix": sys.prefix,
    }
