"""Both halves of the node crossing's own formats, under ``formats.FORMAT``
(the metadata tags, error tags and flags are channel/formats.py's):

- **previews**: a progress update's preview, a (format, PIL.Image,
  max_size) tuple in the worker, crosses as raw pixels
  (``encode_preview``, worker) and is rebuilt into the same tuple for the
  host's progress hook (``decode_preview``, host);
- **V3 schemas**: each input and output of a V3 node's finalised schema
  crosses as what it answers (``encode_io``, worker: its io class, plain
  attributes, as_dict, io type, a dynamic input's expansion), and the host
  rebuilds an io.Schema of its own comfy_api's classes that answers the
  same (``decode_schema``), so /object_info is what it would be in-process;
- **hidden values**: the values ComfyUI set on a V3 class clone's
  ``hidden`` cross as {Hidden value: value} (``encode_hidden``, host) and
  become the worker's clone's (``decode_hidden``); DYNPROMPT crosses as
  ComfyUI's values below do;
- **ComfyUI's execution values**: objects of ComfyUI's executor that a
  node's values carry cross as tagged maps of data (``encode_comfy``, both
  sides: the codec's node policy, ``Peer.execution_values``) and are
  rebuilt as the receiving process's own (``decode_comfy``, both sides:
  the channel's tagged hook): an ``ExecutionBlocker`` both ways, as the
  receiver's own class with the same message, so ComfyUI's executor
  blocks on a worker node's blocker as on its own; the host's
  ``DynamicPrompt`` (a V1 node's hidden DYNPROMPT input, a V3 node's
  Hidden.dynprompt) as a read-only ``DynPrompt`` in the worker;
- **the GraphBuilder prefix**: the default prefix ComfyUI's executor sets
  on its ``GraphBuilder`` before each call of a node (``graph_prefix``,
  host) is set on the worker's before the node runs
  (``set_graph_prefix``), so the nodes an expansion makes get the ids, and
  the cache signatures, they get in-process;
- **inputs passed through**: a node's output that is one of its input
  tensors as it arrived crosses as the input's name (``passed_through``,
  worker), and the host puts its own input object there
  (``put_back``, host): a pass-through node (a reroute, a node that
  holds or looks at its image and hands it on) costs no copy.
"""

import importlib
import sys

from .formats import decode_meta
from .spec import PACK_NAME, SERIALIZERS

# logging is imported where it is used: a worker imports this module at
# start, and its own logging is set up only when a pack imports logging
# (worker/__init__.py _setup_logging), which costs a worker's start the
# import of logging, traceback and string otherwise.


# --- previews ---

def encode_preview(preview):
    """("JPEG"|"PNG", PIL.Image, max_size) -> {"format", "mode", "size",
    "pixels", "max_size"} (the image as it is: the host's hook contains it
    in max_size when it sends it), or None for anything else."""
    try:
        fmt, image, max_size = preview
        if image.mode not in ("RGB", "RGBA", "L"):
            image = image.convert("RGB")
        return {"format": str(fmt), "mode": image.mode, "size": list(image.size),
                "pixels": image.tobytes(), "max_size": max_size}
    except Exception as e:  # a preview must never break the node
        print(f"bulkhead: preview not sent: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def decode_preview(p):
    """A PROGRESS frame's preview (encode_preview) as the
    (format, PIL.Image, max_size) tuple ComfyUI's progress hook takes."""
    if not isinstance(p, dict):
        return None
    try:
        from PIL import Image  # optional: PIL
        image = Image.frombytes(p["mode"], tuple(p["size"]), p["pixels"])
        return (p["format"], image, p.get("max_size"))
    except Exception as e:
        import logging  # lazy: worker start
        logging.getLogger("bulkhead").debug("bulkhead: a preview from a worker could not be rebuilt: %r", e)
        return None


# --- V3 schemas ---

def _io_class(x, io):
    """(qualname in io, kind) of an Input/Output object: the first class of
    its MRO defined in the io module (e.g. "Int.Input")."""
    for c in type(x).__mro__:
        found = io
        for part in c.__qualname__.split("."):
            found = getattr(found, part, None)
        if found is c:
            return c.__qualname__
    return None


def _plain_attr(v):
    return v is None or isinstance(v, (bool, int, float, str)) and type(v) in (bool, int, float, str)


def encode_io(x, meta, where, io, output):
    """One schema input or output: what it answers (as_dict, get_io_type,
    io_type), its plain attributes (id, optional, lazy...), the io class it
    is, and a dynamic input's expansion.  Its type crosses as the class it
    is: io's own type string (io_str; the host makes it its io's), a plain
    str, or a pack's own type string (meta tags it, formats.TypeTable)."""
    io_type = x.io_type if output else x.get_io_type()
    io_str = type(io_type) is _io_str(io)
    out = {
        "class": _io_class(x, io),
        "attrs": {k: v for k, v in vars(x).items() if not k.startswith("_") and _plain_attr(v)},
        "as_dict": meta(x.as_dict(), f"{where}.as_dict()"),
        "io_type": meta(plain_str(io_type) if io_str else io_type, f"{where} type"),
        "io_str": io_str,
    }
    dynamic = getattr(io, "DynamicOutput" if output else "DynamicInput", None)
    if dynamic is not None and isinstance(x, dynamic):
        out["dynamic"] = [encode_io(d, meta, f"{where} dynamic[{i}]", io, output)
                          for i, d in enumerate(x.get_dynamic())]
    return out


def plain_str(v):
    return str.__str__(v) if isinstance(v, str) else v


def decode_schema(io, node):
    """The io.Schema the worker captured (worker/nodes.py _describe_v3, each io by encode_io),
    made of the host's own classes: each input and output an instance of
    (a subclass of) the io class the real one is, answering exactly what
    the real one answered (as_dict, its type, a dynamic input's
    expansion); the schema's fields as they were (a field this ComfyUI's
    Schema lacks is an error naming it)."""
    import dataclasses  # lazy: worker start
    known = {f.name for f in dataclasses.fields(io.Schema)}
    fields = {}
    for k, v in node["schema"].items():
        v = decode_meta(v)
        if k not in known:
            default = next((f.default for f in dataclasses.fields(io.Schema) if f.name == k), None)
            if v in (None, False, "", [], default):
                continue   # a newer flag, unset: nothing is lost
            raise TypeError(f"schema field {k}={v!r} has no place in this ComfyUI's io.Schema "
                            "(the worker's ComfyUI is newer?)")
        fields[k] = v
    fields["inputs"] = [_v3_io(io, d, False) for d in node["inputs"]]
    fields["outputs"] = [_v3_io(io, d, True) for d in node["outputs"]]
    fields["hidden"] = [io.Hidden(h) for h in node["hidden"]]
    return io.Schema(**fields)


def _io_lookup(io, qualname):
    found = io
    for part in (qualname or "").split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _v3_io(io, d, output):
    plain = io.Output if output else io.Input
    base = _io_lookup(io, d.get("class"))
    if base is None or not issubclass(base, plain):
        base = plain
    dynamic = None
    if "dynamic" in d:
        dyn_base = getattr(io, "DynamicOutput" if output else "DynamicInput", None)
        if dyn_base is None:
            raise TypeError(f"{'output' if output else 'input'} {d['attrs'].get('id')!r} is dynamic, and "
                            "this ComfyUI's io has no dynamic inputs")
        if not issubclass(base, dyn_base):
            base = dyn_base
        dynamic = [_v3_io(io, c, output) for c in d["dynamic"]]
    io_type = decode_meta(d["io_type"])
    if d.get("io_str"):
        io_type = _io_str(io)(io_type)
    as_dict = d["as_dict"]
    ns = {"__module__": __name__, "__qualname__": base.__qualname__,
          "as_dict": lambda self: decode_meta(as_dict),
          "get_io_type": lambda self: io_type,
          "io_type": property(lambda self: io_type)}
    if dynamic is not None:
        ns["get_dynamic"] = lambda self: list(dynamic)
    obj = object.__new__(type(base.__name__, (base,), ns))
    obj.__dict__.update(d["attrs"])
    return obj


def _io_str(io):
    """io's own type-name string class (its "*" / comma matching): the
    worker's in encode_io, the host's in _v3_io."""
    t = type(getattr(getattr(io, "Int", None), "io_type", ""))
    return t if issubclass(t, str) else str


# --- hidden values ---

def encode_hidden(clone, io):
    """{Hidden value: value} of a class clone's `hidden` (a HiddenHolder);
    io: the host's comfy_api io.  The DynamicPrompt stays itself: the call
    sends these as a node's value (NodeValue), and the codec's node policy
    carries it (encode_comfy), as it carries a V1 node's DYNPROMPT."""
    holder = getattr(clone, "hidden", None)
    out = {}
    if holder is None:
        return out
    for h in io.Hidden:
        v = getattr(holder, h.name, None)
        if v is not None:
            out[h.value] = v
    return out


def decode_hidden(hidden, io):
    """encode_hidden's {Hidden value: value} as {io.Hidden: value} for the
    worker's PREPARE_CLASS_CLONE (DYNPROMPT a DynPrompt by now: the
    channel's tagged hook built it)."""
    return {h: hidden[h.value] for h in io.Hidden if h.value in hidden}


# --- ComfyUI's execution values ---

# A tagged map's key (bytes: no prompt literal, which JSON makes, can carry
# it), for these and for a pack's registered types (worker/typed.py); the
# tags below are bulkhead's own, looked at before any pack's.
MARK = b"__bulkhead_type__"
BLOCKER = "bulkhead:ExecutionBlocker"      # {MARK: BLOCKER, "message": str or None}
DYNPROMPT = "bulkhead:DynamicPrompt"       # {MARK: DYNPROMPT, "original", "ephemeral", "parents", "display"}
COMFY_TAGS = frozenset((BLOCKER, DYNPROMPT))


def _comfy_class(module, name, load=False):
    """ComfyUI's class module.name in this process: from sys.modules (an
    object of it can exist only once its module is imported), or, where
    load, imported (a receiver may not have imported it yet); None when
    there is none."""
    mod = sys.modules.get(module)
    if mod is None and load:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            return None
    cls = getattr(mod, name, None)
    return cls if isinstance(cls, type) else None


def encode_comfy(obj):
    """The tagged map obj crosses as, where it is one of ComfyUI's execution
    values (an ExecutionBlocker, the host's DynamicPrompt), or None.  The
    map's values are walked as a node's value (the prompt's literal inputs:
    tensors cross, what cannot cross is held or refused as any input's)."""
    blocker = _comfy_class("comfy_execution.graph_utils", "ExecutionBlocker")
    if blocker is not None and isinstance(obj, blocker):
        message = obj.message
        # the executor only formats it into its "Execution Blocked: ..." error
        return {MARK: BLOCKER, "message": message if message is None or type(message) is str else str(message)}
    prompt = _comfy_class("comfy_execution.graph", "DynamicPrompt")
    if prompt is not None and isinstance(obj, prompt):
        return {MARK: DYNPROMPT, "original": obj.get_original_prompt(),
                "ephemeral": dict(getattr(obj, "ephemeral_prompt", None) or {}),
                "parents": dict(getattr(obj, "ephemeral_parents", None) or {}),
                "display": dict(getattr(obj, "ephemeral_display", None) or {})}
    return None


def typed_packs(env):
    """The packs whose typed values a worker with this environment may
    send: those whose serializers it runs (BULKHEAD_SERIALIZERS, set by
    host/pack.py: its own and those its comfy-env-root.toml names), or None
    for a worker that is no pack's (any)."""
    import json  # lazy: worker start
    if PACK_NAME not in env and SERIALIZERS not in env:
        return None
    try:
        return frozenset(str(p) for p, _ in json.loads(env.get(SERIALIZERS) or "[]"))
    except (ValueError, TypeError):
        return frozenset()


_forged = set()     # (producer, pack) said once


def decode_comfy(m, typed_packs=None, producer=None):
    """The channel's tagged hook on the host (the worker's: worker/typed.py
    decode_tagged, which calls this first): a map encode_comfy made -> this
    process's own object; any other tagged map (a pack's registered type,
    which the host holds as it is) -> the map itself, where the worker that
    sent it runs that pack's serializer (typed_packs; None: any).  One
    claiming another pack's type -> a plain dict without the marker, so no
    pack's deserializer ever gets a payload another pack made up."""
    tag = m.get(MARK)
    if tag == BLOCKER:
        cls = _comfy_class("comfy_execution.graph_utils", "ExecutionBlocker", load=True)
        if cls is None:
            raise TypeError("an ExecutionBlocker reached a process where ComfyUI's comfy_execution.graph_utils "
                            "cannot be imported; run the node under a ComfyUI (or its worker under one)")
        return cls(m.get("message"))
    if tag == DYNPROMPT:
        return DynPrompt(m)
    if typed_packs is not None and m.get("pack") not in typed_packs:
        if (producer, str(m.get("pack"))) not in _forged:
            _forged.add((producer, str(m.get("pack"))))
            import logging  # lazy: worker start
            logging.getLogger("bulkhead").warning(
                "bulkhead: worker %r sent a value marked as type %r of pack %r, whose serializer it does not "
                "run; it is passed on as a plain dict, never to a deserializer", producer, m.get("type"),
                m.get("pack"))
        return {k: v for k, v in m.items() if k != MARK}
    return m


class DynPrompt:
    """A DynamicPrompt in a worker (a V1 node's DYNPROMPT input, a V3
    node's Hidden.dynprompt): the host's, as data (its nodes, original and
    added by expansions, as they were when the node was called),
    read-only, with the methods nodes call on it."""

    def __init__(self, data):
        self.original_prompt = data.get("original") or {}
        self.ephemeral_prompt = data.get("ephemeral") or {}
        self.ephemeral_parents = data.get("parents") or {}
        self.ephemeral_display = data.get("display") or {}

    def get_node(self, node_id):
        if node_id in self.ephemeral_prompt:
            return self.ephemeral_prompt[node_id]
        if node_id in self.original_prompt:
            return self.original_prompt[node_id]
        raise KeyError(f"Node {node_id} not found")

    def has_node(self, node_id):
        return node_id in self.ephemeral_prompt or node_id in self.original_prompt

    def get_real_node_id(self, node_id):
        while node_id in self.ephemeral_parents:
            node_id = self.ephemeral_parents[node_id]
        return node_id

    def get_parent_node_id(self, node_id):
        return self.ephemeral_parents.get(node_id)

    def get_display_node_id(self, node_id):
        while node_id in self.ephemeral_display:
            node_id = self.ephemeral_display[node_id]
        return node_id

    def all_node_ids(self):
        return set(self.original_prompt) | set(self.ephemeral_prompt)

    def get_original_prompt(self):
        return self.original_prompt


# --- the GraphBuilder prefix ---

def graph_prefix():
    """[root, call index, graph index]: the default prefix of the host's
    GraphBuilder now (what ComfyUI's executor set before this call of the
    node: execution.py's pre_execute_cb), or None where no GraphBuilder is
    imported.  Host side; read only."""
    builder = _comfy_class("comfy_execution.graph_utils", "GraphBuilder")
    if builder is None:
        return None
    return [getattr(builder, "_default_prefix_root", ""), getattr(builder, "_default_prefix_call_index", 0),
            getattr(builder, "_default_prefix_graph_index", 0)]


def set_graph_prefix(prefix):
    """Worker side of graph_prefix: sets it on this process's GraphBuilder
    (imported for it: a node may import GraphBuilder only when it runs)
    before the node runs.  What the node's GraphBuilders then allocate is
    not carried back: the executor sets the prefix again before every
    call."""
    if not prefix:
        return
    builder = _comfy_class("comfy_execution.graph_utils", "GraphBuilder", load=True)
    setter = getattr(builder, "set_default_prefix", None)
    if setter is not None:
        setter(*prefix)


# --- inputs passed through ---

def _result(out):
    """The tuple of a node's outputs inside out (its FUNCTION's return,
    or its "result" in a {"ui", "result"} dict), or None."""
    result = out.get("result") if isinstance(out, dict) else out
    return result if isinstance(result, (tuple, list)) else None


def _with_result(out, result):
    return dict(out, result=result) if isinstance(out, dict) else result


def passed_through(peer, kwargs, out):
    """(out with None where an output is one of kwargs' tensors that the
    host sees as it is here (Peer.passes_back), [[position, input name],
    ...]).  Worker side; the host's put_back undoes it."""
    result = _result(out)
    if result is None or not peer.received:
        return out, []
    names = {id(v): k for k, v in kwargs.items()}
    same = [[i, names[id(v)]] for i, v in enumerate(result)
            if id(v) in names and peer.passes_back(v)]
    if not same:
        return out, []
    return _with_result(out, _replaced(result, {i: None for i, _ in same})), same


def put_back(outputs, same, kwargs):
    """Host side of passed_through: each listed output is the host's own
    input object again, as in one ComfyUI process."""
    return _with_result(outputs, _replaced(_result(outputs), {i: kwargs[name] for i, name in same}))


def _replaced(result, at):
    """result (a tuple or list) with the values at the positions in at."""
    new = [at[i] if i in at else v for i, v in enumerate(result)]
    return new if isinstance(result, list) else tuple(new)
