"""The hooks a channel calls for what its C loop cannot decide, and the
exceptions a caller sees.  One ``Peer`` per channel end, host or worker.

Handles: a callable passed as an argument crosses as a handle to an entry
in the sender's export table; the receiver gets a ``RemoteCallable`` that
sends a CALLBACK when called.  A handle carries the OWNED_BY_RECEIVER bit
when it goes back to the process that exported it, so each side can tell
its own objects from the peer's.
"""

import builtins
import importlib
import itertools
import sys
import traceback

from . import _native, _tensors

OWNED_BY_RECEIVER = 0x80


class BulkheadError(Exception):
    """Base of the errors bulkhead raises itself."""


class RemoteError(BulkheadError):
    """An exception raised in the peer.  ``remote_type`` is its qualified
    type name, ``remote_message`` its message and ``remote_traceback`` the
    peer's formatted traceback.  For a builtin type the raised object is
    also an instance of that builtin (``except ValueError`` works)."""

    def __init__(self, remote_type, message, remote_traceback="", worker=None):
        super().__init__(f"{remote_type}: {message}" + (f" [in {worker}]" if worker else ""))
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = remote_traceback
        self.worker = worker

    def __str__(self):
        text = super().__str__()
        if self.remote_traceback:
            text += "\n--- remote traceback ---\n" + self.remote_traceback.rstrip()
        return text


_remote_subclasses = {}


def remote_error_class(builtin_name):
    """RemoteError mixed with a builtin exception type, cached."""
    base = getattr(builtins, builtin_name, None) if builtin_name else None
    if not (isinstance(base, type) and issubclass(base, Exception)) or base is Exception:
        return RemoteError
    cls = _remote_subclasses.get(base)
    if cls is None:
        try:
            cls = type(f"Remote{base.__name__}", (RemoteError, base), {
                "__init__": RemoteError.__init__, "__str__": RemoteError.__str__})
        except TypeError:  # a builtin with an incompatible layout
            cls = RemoteError
        _remote_subclasses[base] = cls
    return cls


def format_exception(exc):
    """The ERROR payload for an exception."""
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
        tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    except Exception:  # a broken __str__ must not break the report
        tb = f"{name}: <unprintable>"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return {"type": name, "message": message, "traceback": tb, "builtin": builtin}


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


class Peer:
    """Hooks for one channel end.  ``exports`` maps handle ids to local
    callables sent to the peer; ``outgoing`` is the frame kind a call to a
    peer callable travels as."""

    def __init__(self, describe="peer", outgoing=_native.CALLBACK, resolve=None):
        self.channel = None
        self.exports = {}
        self._export_ids = {}
        self._ids = itertools.count(1)
        self._describe = describe
        self.outgoing = outgoing
        self._resolve = resolve
        self.frame_handlers = {}
        self.request_handlers = {}
        self.timeout = None

    def describe(self):
        return self._describe() if callable(self._describe) else self._describe

    # --- hooks called by the C loop ---

    def encode_other(self, obj):
        t = _tensors.encode(self.channel, obj)
        if t is not None:
            return t
        if isinstance(obj, RemoteCallable):
            if obj._peer is not self:
                raise TypeError(f"{obj!r} belongs to another worker; it cannot be sent to {self.describe()}")
            return (1, _native.HANDLE_CALLABLE | OWNED_BY_RECEIVER, obj._id)
        if callable(obj) and not isinstance(obj, type):
            key = id(obj)
            ident = self._export_ids.get(key)
            if ident is None or self.exports.get(ident) is not obj:
                ident = next(self._ids)
                self._export_ids[key] = ident
                self.exports[ident] = obj
            return (1, _native.HANDLE_CALLABLE, ident)
        raise TypeError(
            f"cannot send an object of type {type(obj).__module__}.{type(obj).__qualname__} "
            f"to {self.describe()}: bulkhead carries None, bool, int, float, str, bytes, "
            "list, tuple, dict, numpy arrays, torch CPU tensors and callables (no pickle)")

    def decode_tensor(self, lib, code, shape, strides, lease):
        return _tensors.decode(lib, code, shape, strides, lease)

    def decode_handle(self, space, ident):
        if space == _native.HANDLE_CALLABLE | OWNED_BY_RECEIVER:
            fn = self.exports.get(ident)
            if fn is None:
                raise LookupError(f"callable #{ident} is no longer exported (its call has ended)")
            return fn
        if space == _native.HANDLE_CALLABLE:
            return RemoteCallable(self, ident)
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
        cls = remote_error_class(payload.get("builtin"))
        return cls(str(payload.get("type")), str(payload.get("message")),
                   str(payload.get("traceback") or ""), self.describe())

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
