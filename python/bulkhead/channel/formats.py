"""The private formats of the host <-> worker crossing, each encoder beside
its decoder, under one version constant.

Everything here is imported by both processes (the host's proxies in
``bulkhead.host.nodes``, the worker's runner in ``bulkhead.worker.nodes``):

- the **error tags**: a worker node that stopped on an interrupt or ran out
  of memory raises ``NodeInterrupted`` / ``WorkerOutOfMemory`` there; the
  host reads the remote type name (``remote_name``) and raises ComfyUI's
  own exception for it;
- the **flag tags** (``encode_arg`` / ``decode_arg``): the host's mirrored
  ``comfy.cli_args`` values as JSON (enums, sets, lists tagged);
- the **folders** (``host_folders`` / ``apply_host_folders``): the host's
  ``folder_paths`` directories, read there and applied in the worker;
- the **metadata tags** (``Meta`` / ``decode_meta``): node metadata as
  JSON, tuples, non-str keys, "any type" strings and folder_paths file
  lists tagged ``{"__bh__": kind}`` so the host rebuilds them.

``FORMAT`` versions all of them: it is part of the metadata cache key, so
a change here invalidates cached metadata.
"""

import sys

from .peer import BulkheadError, type_name

FORMAT = 3  # 2: the description carries the routes and prompt handlers; 3: V3 nodes (their schema)


# --- the error tags ---

class NodeInterrupted(BulkheadError):
    """A worker node stopped on ComfyUI's interrupt.  Raised in the worker;
    the host raises ComfyUI's InterruptProcessingException for it, or this
    class in a host without ComfyUI."""


class WorkerOutOfMemory(BulkheadError):
    """A worker node ran out of memory.  Raised in the worker; the host
    raises its own comfy.model_management.OOM_EXCEPTION for it."""


def remote_name(cls):
    """The remote type name the host sees for an exception class of this module."""
    return f"{cls.__module__}.{cls.__qualname__}"


# --- the flag tags ---

def encode_arg(v):
    import enum
    if isinstance(v, enum.Enum):
        return {"enum": type(v).__name__, "value": v.value}
    if isinstance(v, (set, frozenset)):
        return {"set": [encode_arg(x) for x in v]}
    if isinstance(v, (list, tuple)):
        return {"list": [encode_arg(x) for x in v]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(type(v).__name__)


def decode_arg(value, cli):
    if isinstance(value, dict):
        if "enum" in value:
            enum = getattr(cli, value["enum"], None)
            if enum is None:
                raise LookupError(f"comfy.cli_args has no {value['enum']}")
            return enum(value["value"])
        if "set" in value:
            return set(decode_arg(v, cli) for v in value["set"])
        if "list" in value:
            return [decode_arg(v, cli) for v in value["list"]]
    return value


# --- the folders ---

def host_folders():
    """This process's folder_paths directories (JSON-able), or None."""
    fp = sys.modules.get("folder_paths")
    table = getattr(fp, "folder_names_and_paths", None)
    if not isinstance(table, dict):
        return None
    folders = {}
    for name, entry in table.items():
        try:
            paths, exts = entry
            folders[str(name)] = [[str(p) for p in paths], sorted(str(e) for e in exts)]
        except (TypeError, ValueError):
            continue
    dirs = {}
    for kind in ("output", "input", "temp", "user"):
        getter = getattr(fp, f"get_{kind}_directory", None)
        try:
            value = getter() if getter is not None else getattr(fp, f"{kind}_directory", None)
        except Exception:
            value = None
        if isinstance(value, str):
            dirs[kind] = value
    out = {"folders": folders, "dirs": dirs}
    for attr in ("models_dir", "base_path"):
        if isinstance(getattr(fp, attr, None), str):
            out[attr] = getattr(fp, attr)
    return out


def apply_host_folders(fp, folders):
    """Replaces this process's folder_paths directories with the host's."""
    table = getattr(fp, "folder_names_and_paths", None)
    if isinstance(table, dict) and isinstance(folders.get("folders"), dict):
        table.clear()
        for name, (paths, exts) in folders["folders"].items():
            table[name] = (list(paths), set(exts))
    cache = getattr(fp, "filename_list_cache", None)
    if isinstance(cache, dict):
        cache.clear()
    for kind, path in (folders.get("dirs") or {}).items():
        setter = getattr(fp, f"set_{kind}_directory", None)
        if setter is not None:
            setter(path)
        else:
            setattr(fp, f"{kind}_directory", path)
    for attr in ("models_dir", "base_path"):
        if folders.get(attr):
            setattr(fp, attr, folders[attr])


# --- the metadata tags ---

class AnyType(str):
    """ComfyUI packs' "any type" string: equal to every type (the pack's
    own class of that kind, rebuilt on this side)."""

    def __ne__(self, other):
        return False

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def _folder_list(name, files):
    fp = sys.modules.get("folder_paths")
    getter = getattr(fp, "get_filename_list", None)
    if getter is not None:
        try:
            return getter(name)
        except Exception:
            pass
    return list(files)


class Meta:
    """Node metadata as JSON: tuples, non-str dict keys, ComfyUI's "any
    type" strings and folder_paths file lists are tagged ({"__bh__": kind})
    so the host rebuilds them; what cannot be carried is converted to a
    string and reported."""

    def __init__(self, node, problems, folder_lists=None):
        self.node = node
        self.problems = problems
        self.folder_lists = folder_lists or {}

    def problem(self, where, what):
        self.problems.append(f"node {self.node!r}, {where}: {what}")

    def __call__(self, v, where, depth=0):
        if depth > 40:
            self.problem(where, "nests too deep; cut")
            return None
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, str):
            t = type(v)
            if t is not str and (t.__ne__ is not str.__ne__ or t.__eq__ is not str.__eq__):
                return {"__bh__": "any", "value": str.__str__(v)}
            return str.__str__(v)
        if isinstance(v, int):  # IntEnum members too
            return int(v)
        if isinstance(v, float):
            return float(v)
        enum_value = _enum_value(v)
        if enum_value is not _NO:
            return self(enum_value, where, depth + 1)
        if isinstance(v, list):
            hit = self.folder_lists.get(id(v))
            items = [self(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
            if hit is not None and hit[1] is v:
                return {"__bh__": "folder", "name": hit[0], "files": items}
            return items
        if isinstance(v, tuple):
            return {"__bh__": "tuple", "items": [self(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]}
        if isinstance(v, dict):
            if all(isinstance(k, str) and type(k) is str for k in v) and "__bh__" not in v:
                return {k: self(x, f"{where}.{k}", depth + 1) for k, x in v.items()}
            return {"__bh__": "dict", "items": [[self(k, f"{where} key", depth + 1),
                                                 self(x, f"{where}[{k!r}]", depth + 1)] for k, x in v.items()]}
        if isinstance(v, (set, frozenset)):
            items = [self(x, f"{where} item", depth + 1) for x in v]
            try:
                items.sort()
            except TypeError:
                pass
            return items
        if isinstance(v, type):
            self.problem(where, f"is the type object {v.__module__}.{v.__qualname__}, which ComfyUI "
                                f"does not accept; sent as the string {v.__name__!r}")
            return v.__name__
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.generic):
            return self(v.item(), where, depth + 1)
        text = str(v)
        self.problem(where, f"is a {type_name(v)}, which cannot cross to the host; sent as the string {text!r}")
        return text


_NO = object()


def _enum_value(v):
    import enum
    if isinstance(v, enum.Enum):
        return v.value
    return _NO


def decode_meta(v):
    """The tagged JSON of Meta -> Python values."""
    if isinstance(v, list):
        return [decode_meta(x) for x in v]
    if isinstance(v, dict):
        tag = v.get("__bh__")
        if tag is None:
            return {k: decode_meta(x) for k, x in v.items()}
        if tag == "tuple":
            return tuple(decode_meta(x) for x in v["items"])
        if tag == "any":
            return AnyType(v["value"])
        if tag == "folder":
            return _folder_list(v["name"], decode_meta(v["files"]))
        if tag == "dict":
            out = {}
            for k, x in v["items"]:
                k = decode_meta(k)
                out[tuple(k) if isinstance(k, list) else k] = decode_meta(x)
            return out
        raise ValueError(f"unknown metadata tag {tag!r}")
    return v
