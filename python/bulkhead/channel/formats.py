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
  JSON, tuples, non-str keys, a pack's own type strings and folder_paths
  file lists tagged ``{"__bh__": kind}`` so the host rebuilds them;
- the **type tables** (``TypeTable`` / ``link_types``, ``PackType``): what
  a pack's own type strings answer to == and !=, computed in the worker
  and answered by the host's PackType as the pack's class would; and a
  VALIDATE_INPUTS's input_types crossing back (``types_to_worker`` /
  ``types_from_host``) as the pack's own objects.

``FORMAT`` versions all of them: it is part of the metadata cache key, so
a change here invalidates cached metadata.
"""

import operator
import sys

from .peer import BulkheadError, type_name

FORMAT = 4  # 2: the description carries the routes and prompt handlers; 3: V3 nodes (their schema);
# 4: a pack's own type strings answer from the worker's type tables ("types"; V3 io types' "io_str")


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


def _is_enum(v):
    """Whether v is a member of an Enum.  enum is not imported for it
    (about 1.5 ms of every worker's start, #40): no value is one where no
    code has imported enum."""
    enum = sys.modules.get("enum")
    return enum is not None and isinstance(v, enum.Enum)


# --- the flag tags ---

def encode_arg(v):
    if _is_enum(v):
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

# A pack's own type strings: a str subclass with its own == or != (the
# "any type" trick, `class AnyType(str)` whose != is always False; ComfyUI's
# testing pack's SmartType, "*" and comma sets; ...).  ComfyUI compares them
# as it validates a prompt (`input_type == "INT"` for each literal
# conversion in turn, `received_type != input_type` for a link), and the
# pack's code must not run in the host.  So the worker, which has the real
# objects, answers == and != for each one against a vocabulary (TypeTable,
# into the description's "types"), and the host's PackType answers from
# those answers.

# What every pack's types are compared with: "*", ComfyUI's literal type
# names (validate_inputs converts a literal for each one the input's type
# equals) and its core types.  The worker adds the names in the pack's own
# metadata and the names the host's registered nodes return.
TYPE_VOCABULARY = ("*", "INT", "FLOAT", "STRING", "BOOLEAN", "COMBO",
                   "IMAGE", "LATENT", "MASK", "MODEL", "CLIP", "VAE", "CONDITIONING", "CONTROL_NET",
                   "CLIP_VISION", "CLIP_VISION_OUTPUT", "STYLE_MODEL", "GLIGEN", "UPSCALE_MODEL", "NOISE",
                   "SAMPLER", "SIGMAS", "GUIDER", "AUDIO", "VIDEO", "HOOKS", "LORA_MODEL", "PHOTOMAKER",
                   "WEBCAM", "LOAD_3D", "MESH", "VOXEL", "SVG", "TIMESTEPS_RANGE", "LATENT_OPERATION",
                   "WAN_CAMERA_EMBEDDING", "AUDIO_ENCODER_OUTPUT", "MODEL_PATCH", "VAE_ENCODER")

# Two strings no pack names a type: what a type answers for them is what
# the host answers for a string the worker never compared it with.
_UNSEEN = ("bulkhead: a type name no pack uses", "BULKHEAD_UNSEEN_TYPE")
# What a type is compared with for an operand that is not a str (ComfyUI
# compares a link's type with a combo input's list of values).
_NOT_STR = ["bulkhead: not a str"]


def own_type(v):
    """Whether v is a str whose class has its own == or != (a pack's type
    string, compared as its class says)."""
    t = type(v)
    return isinstance(v, str) and t is not str and (t.__ne__ is not str.__ne__ or t.__eq__ is not str.__eq__)


def own_type_name(v):
    t = type(v)
    return f"{t.__module__}.{t.__qualname__}"


_OPS = (("eq", operator.eq), ("ne", operator.ne))


class TypeTable:
    """Worker side: the pack's own type strings met while its metadata is
    described (Meta tags each as {"__bh__": "any", "value", "type": its
    index}), one per class and value, and, once every node is described,
    what each answers (entries)."""

    def __init__(self):
        self.objects = []
        self._index = {}

    def tag(self, v):
        value = str.__str__(v)
        key = (type(v), value)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.objects)
            self.objects.append(v)
        return {"__bh__": "any", "value": value, "type": i}

    def entries(self, names, problems):
        """The description's "types": for each type string tagged, in tag
        order,

            {"class": module.qualname, "value": the str,
             "eq": {"unseen": what == answers for a string not compared,
                    "except": [the strings it answers otherwise for],
                    "types": [indices of the pack's types it is == to],
                    "not_str": what it answers for a list, or the error
                               that raised, as "Type: message"},
             "ne": the same for !=}

        compared with TYPE_VOCABULARY, names (the type names of the pack's
        metadata and of the host's nodes), each one's comma-separated parts
        and the pack's own types themselves (the real objects).  None for a
        type whose comparison with a str raised or answered what has no
        truth value: it crosses as a plain str, and problems says so."""
        vocabulary = set(TYPE_VOCABULARY)
        for name in list(names) + [str.__str__(o) for o in self.objects]:
            vocabulary.add(name)
            for part in name.split(","):
                vocabulary.update((part, part.strip()))
        vocabulary = sorted(vocabulary)
        out = []
        for o in self.objects:
            try:
                out.append(self._entry(o, vocabulary, problems))
            except Exception as e:
                self._crosses_as_str(o, e, problems)
                out.append(None)
        for i, (o, entry) in enumerate(zip(self.objects, out)):
            if entry is None:
                continue
            try:   # with the pack's other types (those compared as str by the host are not asked)
                for name, op in _OPS:
                    entry[name]["types"] = [j for j, p in enumerate(self.objects)
                                            if out[j] is not None and bool(op(o, p))]
            except Exception as e:
                self._crosses_as_str(o, e, problems)
                out[i] = None
        return out

    @staticmethod
    def _crosses_as_str(o, e, problems):
        problems.append(f"type {own_type_name(o)}({str.__str__(o)!r}): comparing it with a type name raised "
                        f"{type(e).__name__}: {e}; it crosses to the host as a plain str (compared as str "
                        "there), so fix its __eq__/__ne__ to compare with any str")

    def _entry(self, o, vocabulary, problems):
        entry = {"class": own_type_name(o), "value": str.__str__(o)}
        for name, op in _OPS:
            unseen = [bool(op(o, s)) for s in _UNSEEN]
            if unseen[0] != unseen[1]:
                problems.append(f"type {entry['class']}({entry['value']!r}) answers {name} differently for two "
                                f"type names it was not described with; the host answers {unseen[0]} for every "
                                "name the worker did not compare it with")
            try:
                not_str = bool(op(o, _NOT_STR))
            except Exception as e:
                not_str = f"{type(e).__name__}: {e}"
            entry[name] = {
                "unseen": unseen[0],
                "except": [s for s in vocabulary if bool(op(o, s)) != unseen[0]],
                "types": [],   # entries fills it in
                "not_str": not_str,
            }
        return entry


class PackType(str):
    """Host side: a pack's own type string (TypeTable), answering == and !=
    as the pack's object answered in its worker: for a str it was compared
    with, that answer; for another of the same pack's types, the answer
    the real pair gave; for any other str, what it answered for strings it
    never saw; for an operand that is not a str, what it answered for a
    list (an error it raised is raised here, as a TypeError naming it).
    One class for every pack's types; hashed as its str."""

    __hash__ = str.__hash__

    def __eq__(self, other):
        return self._answer("eq", other)

    def __ne__(self, other):
        return self._answer("ne", other)

    def _answer(self, op, other):
        table = self._bh_table
        answers = table[op]
        if isinstance(other, PackType) and other._bh_table["pack"] == table["pack"]:
            return other._bh_table["index"] in answers["types"]
        if isinstance(other, str):
            return answers["unseen"] != (str.__str__(other) in answers["except"])
        if isinstance(answers["not_str"], str):
            raise TypeError(f"{table['class']}({table['value']!r}) {'==' if op == 'eq' else '!='} a "
                            f"{type(other).__qualname__}: in its pack's worker this raised {answers['not_str']}")
        return answers["not_str"]


def link_types(description, pack):
    """Host side: each type tag of a pack's description (TypeTable.tag) gets
    its entry of the description's "types", as PackType reads it, so that
    decode_meta rebuilds it as a PackType (a plain str where the entry is
    None).  pack names the pack: its types answer for each other from the
    entries, another pack's are compared as str."""
    tables = []
    for i, e in enumerate(description.get("types") or ()):
        if e is None:
            tables.append(None)
            continue
        table = {"pack": pack, "index": i, "class": e["class"], "value": e["value"]}
        for op in ("eq", "ne"):
            a = e[op]
            table[op] = {"unseen": bool(a["unseen"]), "except": frozenset(a["except"]),
                         "types": frozenset(a["types"]), "not_str": a["not_str"]}
        tables.append(table)

    def walk(v):
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            if v.get("__bh__") == "any":
                i = v.get("type")
                v["table"] = tables[i] if isinstance(i, int) and 0 <= i < len(tables) else None
                return
            for x in v.values():
                walk(x)
    walk(description.get("nodes"))


# A VALIDATE_INPUTS's input_types crossing to the worker: a type of the
# node's own pack as {TYPE_MARK: [class, value]} (a bytes key: no prompt
# can write one), which the worker turns back into the pack's own object.
TYPE_MARK = b"__bulkhead_pack_type__"


def types_to_worker(types, pack):
    """Host side: input_types ({input: type}) for a node of pack: each
    PackType of that pack marked; any other type crosses as its str."""
    if not isinstance(types, dict):
        return types
    return {k: {TYPE_MARK: [t._bh_table["class"], str.__str__(t)]}
            if isinstance(t, PackType) and t._bh_table["pack"] == pack else t for k, t in types.items()}


def types_from_host(types, own):
    """Worker side of types_to_worker: each marked type the pack's own
    object, from own ({(class, value): object}), or its str where the
    pack has no such object."""
    if not isinstance(types, dict):
        return types
    out = {}
    for k, t in types.items():
        if isinstance(t, dict) and TYPE_MARK in t:
            name, value = t[TYPE_MARK]
            t = own.get((name, value), value)
        out[k] = t
    return out

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
    """Node metadata as JSON: tuples, non-str dict keys, a pack's own type
    strings (own_type: entered in types, a TypeTable, one for the whole
    pack) and folder_paths file lists are tagged ({"__bh__": kind}) so the
    host rebuilds them; what cannot be carried is converted to a string
    and reported."""

    def __init__(self, node, problems, folder_lists=None, types=None):
        self.node = node
        self.problems = problems
        self.folder_lists = folder_lists or {}
        self.types = types if types is not None else TypeTable()

    def problem(self, where, what):
        self.problems.append(f"node {self.node!r}, {where}: {what}")

    def __call__(self, v, where, depth=0):
        if depth > 40:
            self.problem(where, "nests too deep; cut")
            return None
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, str):
            return self.types.tag(v) if own_type(v) else str.__str__(v)
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
    if _is_enum(v):
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
            table = v.get("table")   # link_types's; none: not linked, or a type that crosses as str
            if table is None:
                return str(v["value"])
            t = PackType(v["value"])
            t._bh_table = table
            return t
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
