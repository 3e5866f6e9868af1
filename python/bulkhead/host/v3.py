"""V3 nodes: the real node's schema, rebuilt in the host's comfy_api.

A V3 node's proxy (host/nodes.py ``PackRuntime._proxy_v3``) answers
define_schema with ``_v3_schema``: the io.Schema the worker captured
(worker/nodes.py ``_describe_v3``), made of the host's own io classes and
answering what the real one answered, so /object_info is what it would be
in-process.  ``_hidden_values`` is the hidden values ComfyUI set on the
class clone, as a call sends them to the worker.
"""

from ..channel.formats import decode_meta


# --- V3 nodes: the schema rebuilt in the host's comfy_api ---

def _v3_schema(io, node):
    """The io.Schema the worker captured (worker/nodes.py _describe_v3),
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
    if isinstance(io_type, str):
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
    """The host's own type-name string class (its "*" / comma matching)."""
    t = type(getattr(getattr(io, "Int", None), "io_type", ""))
    return t if issubclass(t, str) else str


def _hidden_values(clone):
    """{Hidden value: value} of a class clone's `hidden` (a HiddenHolder),
    DYNPROMPT as data (its nodes, original and added by expansions)."""
    from comfy_api.latest import io
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
