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
  ``hidden`` cross as {Hidden value: value} (``encode_hidden``, host;
  DYNPROMPT as data) and become the worker's clone's (``decode_hidden``,
  DYNPROMPT a read-only ``DynPrompt``);
- **inputs passed through**: a node's output that is one of its input
  tensors as it arrived crosses as the input's name (``passed_through``,
  worker), and the host puts its own input object there
  (``put_back``, host): a pass-through node (a reroute, a node that
  holds or looks at its image and hands it on) costs no copy.
"""

import logging
import sys

from .formats import decode_meta

log = logging.getLogger("bulkhead")


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
        from PIL import Image
        image = Image.frombytes(p["mode"], tuple(p["size"]), p["pixels"])
        return (p["format"], image, p.get("max_size"))
    except Exception as e:
        log.debug("bulkhead: a preview from a worker could not be rebuilt: %r", e)
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
    import dataclasses
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
    """{Hidden value: value} of a class clone's `hidden` (a HiddenHolder),
    DYNPROMPT as data (its nodes, original and added by expansions); io:
    the host's comfy_api io."""
    holder = getattr(clone, "hidden", None)
    out = {}
    if holder is None:
        return out
    for h in io.Hidden:
        v = getattr(holder, h.name, None)
        if v is None:
            continue
        if h.value == "DYNPROMPT":
            v = {"original": v.get_original_prompt(), "ephemeral": dict(getattr(v, "ephemeral_prompt", {}) or {}),
                 "parents": dict(getattr(v, "ephemeral_parents", {}) or {})}
        out[h.value] = v
    return out


class DynPrompt:
    """Hidden.dynprompt in a worker: the host's DynamicPrompt as data (its
    nodes, original and added by expansions), read-only, with the methods
    nodes call on it."""

    def __init__(self, data):
        self.original_prompt = data.get("original") or {}
        self.ephemeral_prompt = data.get("ephemeral") or {}
        self.ephemeral_parents = data.get("parents") or {}

    def get_node(self, node_id):
        if node_id in self.ephemeral_prompt:
            return self.ephemeral_prompt[node_id]
        return self.original_prompt[node_id]

    def has_node(self, node_id):
        return node_id in self.ephemeral_prompt or node_id in self.original_prompt

    def get_parent_node_id(self, node_id):
        return self.ephemeral_parents.get(node_id)

    def all_node_ids(self):
        return set(self.original_prompt) | set(self.ephemeral_prompt)

    def get_original_prompt(self):
        return self.original_prompt

def decode_hidden(hidden, io):
    """encode_hidden's {Hidden value: value} as {io.Hidden: value} for the
    worker's PREPARE_CLASS_CLONE, DYNPROMPT a DynPrompt."""
    values = {}
    for h in io.Hidden:
        if h.value in hidden:
            v = hidden[h.value]
            values[h] = DynPrompt(v) if h.value == "DYNPROMPT" and isinstance(v, dict) else v
    return values


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
