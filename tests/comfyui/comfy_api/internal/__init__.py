"""What upstream's execution and server code reach into: the base classes
they test V3 nodes and outputs against, and `first_real_override` (the
node's own validate_inputs / fingerprint_inputs / check_lazy_status, or
None where only the base class's placeholder is there)."""


class _ComfyNodeInternal:
    """Every V3 node class derives from this; execution.py and server.py
    test `issubclass(cls, _ComfyNodeInternal)`."""

    @classmethod
    def GET_NODE_INFO_V1(cls):
        raise NotImplementedError


class _NodeOutputInternal:
    """Every V3 node output (io.NodeOutput) derives from this."""


class classproperty:
    def __init__(self, f):
        self.f = f

    def __get__(self, obj, owner):
        return self.f(owner)


def prune_dict(d):
    return {k: v for k, v in d.items() if v is not None}


def is_class(obj):
    return isinstance(obj, type)


def first_real_override(cls, name, *, base=None):
    """The function `name` of the first class in cls's MRO above `base`
    (default cls.GET_BASE_CLASS()) that defines it, or None when only the
    base's placeholder is there."""
    if base is None:
        base = cls.GET_BASE_CLASS()
    placeholder = getattr(base, name, None)
    if placeholder is None:
        return None
    for c in cls.__mro__:
        if c is base:
            return None
        if name in c.__dict__:
            fn = getattr(c, name)
            fn = getattr(fn, "__func__", fn)
            return None if fn is getattr(placeholder, "__func__", placeholder) else fn
    return None


def shallow_clone_class(cls, new_name=None):
    """A subclass of cls (what execution sets per run, `hidden`, lands
    on it, never on cls)."""
    return type(new_name or f"{cls.__name__}Clone", (cls,), {})
