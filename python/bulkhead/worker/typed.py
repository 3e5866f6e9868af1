"""Typed values across packs: a pack's custom ``[types]`` carried by the
serializers its ``serialization.py`` registers (comfy-env's
``register_serializer(type_name, serialize, deserialize=None, tag=None)``;
``serialize(obj, recurse)`` -> a payload of what bulkhead's codec carries,
``deserialize(payload, recurse)`` -> the object).

The host names the serialization files a worker loads in
``BULKHEAD_SERIALIZERS`` (JSON: [[pack, path], ...]: the worker's own pack
and the packs its ``comfy-env-root.toml`` lists in ``[node_packs]`` /
``[node_reqs]`` that declare custom types), and this module runs them the
first time it is asked (a node's output to serialize, a typed map
decoded), with ``comfy_env`` standing for this registry while they run.
The worker's node policy (``Peer.node_serializer``, set by the
worker's main) calls ``serialize`` where the codec would otherwise hold an
object of a node's outputs (V1 ``run`` and V3 ``run_v3`` alike) as a
handle: an object whose class (or a base, by ``__name__``) is registered
crosses as a map::

    {b"__bulkhead_type__": tag, "type": type_name, "pack": pack, "value": payload}

whose payload the codec walks under the same policy (an object in it a
pack registered crosses by its own serializer, any other is held).  The
host holds the map as it is (arrays, maps, strings: no pickle) and passes
it on to any node.  A worker whose registry knows the tag turns such a map
back into the object as its channel decodes it (``decode_tagged``, the
channel's tagged hook: ``Channel.set_tagged``, set by the worker's main),
in the one pass that builds the value, so a node's inputs are not walked
again; one that does not gets the map.  Values are built innermost first:
a typed value inside another's payload is its object by the time the
outer deserializer gets the payload (its ``recurse`` has nothing left to
do and returns what it is given).  The deserializer runs while the
channel decodes: it may not call the host (``call_host``), and on a
worker's first call it may run before the pack's nodes are imported.  A
class nobody registered still stays in the worker as a handle.

The marker is a bytes key, which JSON cannot produce: a map of the same
shape written into a prompt by a web client (str keys) reaches the node as
the dict it is, never a pack's deserializer (a deserializer written for its
own serializer's output, using pickle or a path, is not web-reachable).
"""

import os
import sys
import types as _types

from ..channel.spec import SERIALIZERS
from ..channel.nodes import COMFY_TAGS, MARK, decode_comfy  # MARK: bytes, no prompt literal can carry it

_registry = {}      # type_name -> (tag, serialize, deserialize, pack, where)
_by_tag = {}        # tag -> the same
_loaded = False


class SerializerError(Exception):
    """A registered serializer that failed, naming the type and the pack."""


def _load():
    global _loaded
    if _loaded:
        return
    _loaded = True
    import json  # lazy: worker start
    try:
        files = json.loads(os.environ.get(SERIALIZERS) or "[]")
    except ValueError:
        files = []
    for pack, path in files:
        _run_file(pack, path)


def _run_file(pack, path):
    def register_serializer(type_name, serialize, deserialize=None, tag=None):
        f = sys._getframe(1)
        entry = (tag or type_name, serialize, deserialize, pack, f"{f.f_code.co_filename}:{f.f_lineno}")
        _registry.setdefault(type_name, entry)
        _by_tag.setdefault(entry[0], entry)

    # Every spelling a serialization.py imports it by: comfy_env's, and
    # the internal module it lived in (comfy-env 0.4.23+, as its own tests
    # import it), the real package's or none in this environment.
    saved = {n: sys.modules.get(n) for n in SHIM_MODULES}
    parent = None
    for n in SHIM_MODULES:
        shim = _types.ModuleType(n)
        shim.__path__ = []
        shim.register_serializer = register_serializer
        sys.modules[n] = shim
        if parent is not None:
            setattr(parent, n.rsplit(".", 1)[1], shim)
        parent = shim
    try:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
        exec(code, {"__name__": "_bulkhead_serialization", "__file__": path})
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


SHIM_MODULES = ("comfy_env", "comfy_env.isolation", "comfy_env.isolation.workers",
                "comfy_env.isolation.workers._ipc_shared")


def serialize(v):
    """The typed map for v, or None when no serializer is registered for
    its class.  Raises SerializerError when the serializer fails."""
    if not _loaded:
        _load()
    if not _registry:
        return None
    for cls in type(v).__mro__:
        entry = _registry.get(cls.__name__)
        if entry is not None:
            break
    else:
        return None
    tag, ser, _, pack, where = entry
    try:
        payload = ser(v, _recurse)
    except Exception as e:
        raise SerializerError(f"the serializer of type {cls.__name__!r} (pack {pack!r}, registered at {where}) "
                              f"raised {type(e).__name__}: {e}") from e
    return {MARK: tag, "type": cls.__name__, "pack": pack, "value": payload}


def _recurse(v, depth=0):
    """A serializer's ``recurse``: v with the registered objects in it as
    their typed maps (what else it holds the codec carries or holds)."""
    typed = serialize(v)
    if typed is not None:
        return typed
    if depth < 32 and isinstance(v, (list, tuple)):
        items = [_recurse(x, depth + 1) for x in v]
        return tuple(items) if isinstance(v, tuple) else items
    if depth < 32 and isinstance(v, dict):
        return {k: _recurse(x, depth + 1) for k, x in v.items()}
    return v


def _decoded(v):
    """A deserializer's ``recurse``: the payload it is given is decoded
    already, typed values in it included (see the module's doc)."""
    return v


def decode_tagged(m):
    """The channel's tagged hook (``Channel.set_tagged(MARK, ...)``): a map
    holding the MARK key, as the codec built it -> one of ComfyUI's values
    where bulkhead's own tag says so (channel/nodes.py ``decode_comfy``),
    else the object its tag's deserializer builds, or the map itself when
    the tag is not one this worker's registry knows (or has no
    deserializer for).  Raises
    SerializerError, naming the type and both packs, when the deserializer
    fails: the error of the call whose value held the map."""
    tag = m.get(MARK)
    if isinstance(tag, str) and tag in COMFY_TAGS:  # ComfyUI's own values (channel/nodes.py), never a pack's
        from . import nodes  # lazy: worker start (and a cycle: nodes imports this package)
        nodes.ready()  # ComfyUI on sys.path: the value may come with this worker's first call
        return decode_comfy(m)
    if not _loaded:
        _load()
    if not _by_tag or not isinstance(tag, str) or "value" not in m:
        return m
    entry = _by_tag.get(tag)
    if entry is None or entry[2] is None:
        return m
    try:
        return entry[2](m["value"], _decoded)
    except Exception as e:
        raise SerializerError(
            f"the deserializer of type {m.get('type')!r} (pack {entry[3]!r}, registered at "
            f"{entry[4]}) raised {type(e).__name__}: {e} on a value made by pack "
            f"{m.get('pack')!r}") from e
