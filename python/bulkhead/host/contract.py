"""The contract with ComfyUI: everything bulkhead reads or calls there, as
one table, checked before the first worker spawns and shown by
``bulkhead doctor``.

ComfyUI declares no API for what bulkhead uses: its memory manager's
globals, its ledger entries' members, the interrupt flag, the progress
hook, the flags and folders a worker mirrors.  Upstream moves without
notice, so bulkhead says what it depends on (``TABLE``) and checks it in
the running process before it trusts it, instead of failing by
AttributeError in the middle of ComfyUI's eviction loop.

A row names a module, a name in it (dotted for a class member), its kind
(module, function, global, class, method, attribute), every call shape
bulkhead uses (checked against ``inspect.signature``: ``"device,
torch_free_too="`` is one positional argument and one keyword), the side
that uses it (host, worker or both) and a tier:

FATAL     bulkhead cannot work without it.  Isolation is refused: every
          pack falls back in-process with one message naming what is
          missing (``Report.refusal``).
DEGRADED  a feature is off (the row says which); one warning per feature.
OPTIONAL  used when present, its absence costing nothing bulkhead
          promises (the proposed MemoryHolder registry, absent from
          upstream today): reported, never warned about.

The tier follows how the glue uses the name: a name used unguarded (its
absence raises inside a call, or inside ComfyUI's own loop) is FATAL; one
read through getattr/hasattr with a fallback is DEGRADED.  A row with a
``fallback`` (another row of the same module) does not count while that
one is present: ``set_output_directory`` falls back to assigning
``output_directory``.

Worker rows are checked in the host too: a worker imports the host's own
``comfy`` package from the host's ComfyUI directory, so what the host's
modules offer is what every worker gets.

tests/py/test_contract.py scans python/bulkhead/*.py (an AST walk) and
fails when the glue uses a ComfyUI name this table does not list.
"""

import ast
import importlib
import inspect
import logging
import os
import sys
import textwrap
import threading

log = logging.getLogger("bulkhead")

FATAL = "FATAL"
DEGRADED = "DEGRADED"
OPTIONAL = "OPTIONAL"
TIERS = (FATAL, DEGRADED, OPTIONAL)

OK = "ok"
MISSING = "missing"
CHANGED = "signature changed"

HOST, WORKER, BOTH = "host", "worker", "both"

MM = "comfy.model_management"
PATCHER = "comfy.model_patcher"
UTILS = "comfy.utils"
CLI = "comfy.cli_args"
MEM = "comfy.memory_management"
OPTIONS = "comfy.options"
FP = "folder_paths"

# Features, as the warnings name them.
F_CORE = "the memory manager bulkhead drives"
F_LEDGER = "stand-ins in ComfyUI's ledger (eviction reaching workers)"
F_ADMIT = "admission of a worker's loads"
F_ADMIT_RESIDENT = "admission counting what a model already holds on the device (its whole size is asked for)"
F_RELEASE = "release of a worker's models"
F_CENSUS = "the census of a process's models (a worker's, and the host's own)"
F_INTERRUPT = "interrupting a worker's node"
F_RESERVE = "the published reserve (bytes admitted for a worker held back from the host's own loads)"
F_VRAM_STATE = "workers following the host's VRAM state"
F_OOM = "a worker's out-of-memory raised as ComfyUI's OOM class"
F_OOM_CHECK = "ComfyUI's own is_oom in a worker"
F_PINS = "a worker's pinned-memory census"
F_PIN_RELEASE = "a worker's pins released on a full release"
F_CAST = "a worker's cast buffers released on a full release"
F_CAST_BOOK = "cast buffers booked in a worker's admission"
F_PROGRESS = "progress bars of isolated nodes"
F_ARGS = "dtype and memory flags mirrored into workers"
F_PAGER = "workers following the host's pager (comfy-aimdo)"
F_FOLDERS = "model folders and directories mirrored into workers"
F_FILE_LISTS = "file lists re-read from the host's folder_paths"
F_LIST_CACHE = "a worker's cached file lists dropped after mirroring"
F_FIND = "finding the ComfyUI directory a worker imports"
F_DOCTOR = "bulkhead doctor parsing ComfyUI's flags as main.py does"
F_CUSTOM_NODE = "bulkhead turning itself off where its custom node folder was deleted (ComfyUI-Manager's Uninstall)"
F_HOLDER = "the upstream MemoryHolder hook (without it: stand-ins in ComfyUI's ledger)"


class Row:
    """One thing bulkhead reads or calls in ComfyUI."""

    __slots__ = ("module", "name", "kind", "calls", "side", "tier", "feature", "fallback")

    def __init__(self, module, name, kind, calls, side, tier, feature, fallback=None):
        self.module = module
        self.name = name
        self.kind = kind
        self.calls = tuple(calls)
        self.side = side
        self.tier = tier
        self.feature = feature
        self.fallback = fallback

    @property
    def qualname(self):
        return self.module if self.kind == "module" else f"{self.module}.{self.name}"

    def to_dict(self):
        return {"module": self.module, "name": self.name, "kind": self.kind, "calls": list(self.calls),
                "side": self.side, "tier": self.tier, "feature": self.feature, "fallback": self.fallback}

    def __repr__(self):
        return f"Row({self.qualname!r}, {self.kind}, {self.tier})"


def _r(module, name, kind, calls=(), side=BOTH, tier=FATAL, feature=F_CORE, fallback=None):
    return Row(module, name, kind, calls, side, tier, feature, fallback)


# Every name python/bulkhead/*.py uses in ComfyUI.  Grouped by module; the
# call shapes are exactly the ones the glue makes.
TABLE = (
    _r("comfy", "comfy", "module", feature=F_FIND),
    # --- comfy.model_management: the memory manager ---
    _r(MM, MM, "module", feature=F_CORE),
    _r(MM, "current_loaded_models", "global", feature=F_LEDGER),
    _r(MM, "LoadedModel", "class", ["model"], HOST, feature=F_LEDGER),
    _r(MM, "LoadedModel.model", "attribute", feature=F_LEDGER),
    _r(MM, "LoadedModel.device", "attribute", side=BOTH, feature=F_CENSUS),
    _r(MM, "LoadedModel.model_memory", "method", [""], BOTH, feature=F_CENSUS),
    _r(MM, "LoadedModel.model_loaded_memory", "method", [""], BOTH, feature=F_CENSUS),
    _r(MM, "LoadedModel.real_model", "attribute", side=HOST, feature=F_LEDGER),
    _r(MM, "LoadedModel.model_finalizer", "attribute", side=HOST, feature=F_LEDGER),
    _r(MM, "LoadedModel.currently_used", "attribute", side=HOST, feature=F_LEDGER),
    _r(MM, "LoadedModel.model_unload", "method", ["", "memory_to_free="], WORKER, feature=F_RELEASE),
    _r(MM, "LoadedModel.model_use_more_vram", "method", ["extra_memory"], WORKER, feature=F_RELEASE),
    _r(MM, "cleanup_models", "function", [""], HOST, feature=F_LEDGER),
    _r(MM, "get_free_memory", "function", ["device", "device, torch_free_too="], feature=F_ADMIT),
    _r(MM, "free_memory", "function", ["memory_required, device, keep_loaded=", "memory_required, device"],
       feature=F_ADMIT),
    _r(MM, "load_models_gpu", "function",
       ["models, memory_required=, force_patch_weights=, minimum_memory_required=, force_full_load="],
       WORKER, feature=F_ADMIT),
    _r(MM, "minimum_inference_memory", "function", [""], WORKER, feature=F_ADMIT),
    _r(MM, "extra_reserved_memory", "function", [""], WORKER, feature=F_ADMIT),
    _r(MM, "get_torch_device", "function", [""], WORKER, feature=F_ADMIT),
    _r(MM, "soft_empty_cache", "function", [""], WORKER, feature=F_RELEASE),
    _r(MM, "processing_interrupted", "function", [""], HOST, feature=F_INTERRUPT),
    _r(MM, "InterruptProcessingException", "class", [""], feature=F_INTERRUPT),
    _r(MM, "interrupt_current_processing", "function", ["value"], feature=F_INTERRUPT),
    _r(MM, "throw_exception_if_processing_interrupted", "function", [""], WORKER, feature=F_INTERRUPT),
    _r(MM, "EXTRA_RESERVED_VRAM", "global", side=HOST, tier=DEGRADED, feature=F_RESERVE),
    _r(MM, "vram_state", "global", tier=DEGRADED, feature=F_VRAM_STATE),
    _r(MM, "VRAMState", "class", side=WORKER, tier=DEGRADED, feature=F_VRAM_STATE),
    _r(MM, "VRAMState.DISABLED", "attribute", side=WORKER, tier=DEGRADED, feature=F_VRAM_STATE),
    _r(MM, "OOM_EXCEPTION", "global", tier=DEGRADED, feature=F_OOM),
    _r(MM, "is_oom", "function", ["e"], WORKER, DEGRADED, F_OOM_CHECK),
    _r(MM, "TOTAL_PINNED_MEMORY", "global", side=WORKER, tier=DEGRADED, feature=F_PINS),
    _r(MM, "MAX_PINNED_MEMORY", "global", side=WORKER, tier=DEGRADED, feature=F_PINS),
    _r(MM, "free_pins", "function", ["size"], WORKER, DEGRADED, F_PIN_RELEASE),
    _r(MM, "reset_cast_buffers", "function", [""], WORKER, DEGRADED, F_CAST),
    _r(MM, "NUM_STREAMS", "global", side=WORKER, tier=DEGRADED, feature=F_CAST_BOOK),
    _r(MM, "register_memory_holder", "function", ["holder"], HOST, OPTIONAL, F_HOLDER),
    _r(MM, "unregister_memory_holder", "function", ["holder"], HOST, OPTIONAL, F_HOLDER),
    # --- comfy.model_patcher: what a worker reads off the patchers packs load ---
    _r(PATCHER, PATCHER, "module", side=WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher", "class", side=WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher.model", "attribute", side=WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher.load_device", "attribute", side=WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher.model_size", "method", [""], WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher.loaded_size", "method", [""], WORKER, feature=F_CENSUS),
    _r(PATCHER, "ModelPatcher.current_loaded_device", "method", [""], WORKER, DEGRADED, F_ADMIT_RESIDENT),
    # --- comfy.utils: progress ---
    _r(UTILS, UTILS, "module", tier=DEGRADED, feature=F_PROGRESS),
    _r(UTILS, "ProgressBar", "class", ["total"], HOST, DEGRADED, F_PROGRESS),
    _r(UTILS, "ProgressBar.update_absolute", "method", ["value, total"], HOST, DEGRADED, F_PROGRESS),
    _r(UTILS, "set_progress_bar_global_hook", "function", ["function"], WORKER, DEGRADED, F_PROGRESS,
       fallback="PROGRESS_BAR_HOOK"),
    _r(UTILS, "PROGRESS_BAR_HOOK", "global", side=WORKER, tier=DEGRADED, feature=F_PROGRESS),
    # --- comfy.cli_args: the flags a worker mirrors ---
    _r(CLI, CLI, "module", tier=DEGRADED, feature=F_ARGS),
    _r(CLI, "args", "global", tier=DEGRADED, feature=F_ARGS),
    # --- comfy.memory_management: the pager's switch ---
    _r(MEM, MEM, "module", tier=DEGRADED, feature=F_PAGER),
    _r(MEM, "aimdo_enabled", "global", tier=DEGRADED, feature=F_PAGER),
    # --- comfy.options: how main.py has ComfyUI parse its flags ---
    _r(OPTIONS, OPTIONS, "module", side=HOST, tier=OPTIONAL, feature=F_DOCTOR),
    _r(OPTIONS, "enable_args_parsing", "function", [""], HOST, OPTIONAL, F_DOCTOR),
    # --- folder_paths: the directories a worker mirrors ---
    _r(FP, FP, "module", tier=DEGRADED, feature=F_FOLDERS),
    _r(FP, "folder_names_and_paths", "global", tier=DEGRADED, feature=F_FOLDERS),
    _r(FP, "get_filename_list", "function", ["folder_name"], BOTH, DEGRADED, F_FILE_LISTS),
    _r(FP, "filename_list_cache", "global", side=WORKER, tier=OPTIONAL, feature=F_LIST_CACHE),
    _r(FP, "models_dir", "global", tier=DEGRADED, feature=F_FOLDERS),
    _r(FP, "base_path", "global", tier=DEGRADED, feature=F_FOLDERS),
    # where bulkhead's custom node is (packimport.custom_node_missing)
    _r(FP, "get_folder_paths", "function", ["folder_name"], HOST, OPTIONAL, F_CUSTOM_NODE),
) + tuple(
    row for kind in ("output", "input", "temp", "user") for row in (
        _r(FP, f"get_{kind}_directory", "function", [""], BOTH if kind == "output" else HOST, DEGRADED, F_FOLDERS,
           fallback=f"{kind}_directory"),
        _r(FP, f"set_{kind}_directory", "function", ["path"], WORKER, DEGRADED, F_FOLDERS,
           fallback=f"{kind}_directory"),
        _r(FP, f"{kind}_directory", "global", tier=DEGRADED, feature=F_FOLDERS),
    ))


def modules():
    """The modules of the table, in table order."""
    seen = []
    for row in TABLE:
        if row.module not in seen:
            seen.append(row.module)
    return seen


# --- checking one row ---

def parse_call(shape):
    """``"a, b, c="`` -> (2 positional, ("c",))."""
    npos, kws = 0, []
    for tok in (t.strip() for t in shape.split(",")):
        if not tok:
            continue
        if tok.endswith("="):
            kws.append(tok[:-1])
        else:
            npos += 1
    return npos, tuple(kws)


def accepts(fn, shape, bound=False):
    """(True, None) when fn's signature accepts the call shape, (False,
    why) when it does not, (True, note) when it has no readable
    signature (a builtin type: nothing to check).  bound: fn is a plain
    function read off a class, called on an instance (self is added)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True, "no readable signature"
    npos, kws = parse_call(shape)
    args = [None] * (npos + (1 if bound else 0))
    try:
        sig.bind(*args, **{k: None for k in kws})
    except TypeError as e:
        return False, f"{sig} does not take ({shape}): {e}"
    return True, None


_source_attrs = {}


def _assigned_attrs(cls):
    """Names a class's own source assigns as ``self.<name>`` (instance
    attributes), or None when there is no source to read."""
    if cls in _source_attrs:
        return _source_attrs[cls]
    names = None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        tree = None
    if tree is not None:
        names = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                            and sub.value.id == "self":
                        names.add(sub.attr)
    _source_attrs[cls] = names
    return names


_ABSENT = object()


def _check_row(row, module):
    """(status, detail) of one row against the imported module (None when
    it could not be imported; its error is the detail's business)."""
    if row.kind == "module":
        return OK, getattr(module, "__file__", None)
    parts = row.name.split(".")
    owner, obj = module, module
    for i, part in enumerate(parts):
        owner = obj
        obj = getattr(obj, part, _ABSENT)
        if obj is _ABSENT:
            if row.kind == "attribute" and i == len(parts) - 1 and isinstance(owner, type):
                names = _assigned_attrs(owner)
                if names is None:
                    return OK, "an instance attribute; no source to verify it"
                if part in names:
                    return OK, "an instance attribute"
            where = ".".join(parts[:i]) or row.module
            return MISSING, f"{where} has no {part}"
    bound = row.kind == "method"
    for shape in row.calls:
        if not callable(obj):
            return CHANGED, f"{type(obj).__name__} is not callable"
        ok, why = accepts(obj, shape, bound=bound)
        if not ok:
            return CHANGED, why
    return OK, None


class Result:
    __slots__ = ("row", "status", "detail", "counts")

    def __init__(self, row, status, detail, counts):
        self.row = row
        self.status = status
        self.detail = detail
        self.counts = counts   # False when the row failed but its fallback stands

    @property
    def failed(self):
        return self.status != OK and self.counts

    def to_dict(self):
        d = self.row.to_dict()
        d.update(status=self.status, detail=self.detail, counts=self.counts)
        return d


class Report:
    """The table checked against this process's ComfyUI."""

    def __init__(self, results, side, comfyui=None, import_errors=None):
        self.results = results
        self.side = side
        self.comfyui = comfyui
        self.import_errors = dict(import_errors or {})

    def _failed(self, tier):
        return [r for r in self.results if r.failed and r.row.tier == tier]

    @property
    def fatal(self):
        """Failed FATAL rows: isolation is refused when there is one."""
        return self._failed(FATAL)

    @property
    def degraded(self):
        return self._failed(DEGRADED)

    @property
    def optional(self):
        return self._failed(OPTIONAL)

    @property
    def ok(self):
        return not self.fatal

    def row(self, qualname):
        for r in self.results:
            if r.row.qualname == qualname:
                return r
        raise KeyError(qualname)

    def refusal(self):
        """One message saying why isolation is refused, or None."""
        bad = self.fatal
        if not bad:
            return None
        where = f" at {self.comfyui}" if self.comfyui else ""
        names = "; ".join(f"{r.row.qualname} {r.status}" + (f" ({r.detail})" if r.status == CHANGED else "")
                          for r in bad)
        return f"this ComfyUI{where} lacks what bulkhead cannot work without: {names}"

    def features_off(self):
        """{feature: [failed DEGRADED rows]}, in table order."""
        out = {}
        for r in self.degraded:
            out.setdefault(r.row.feature, []).append(r)
        return out

    def warnings(self):
        """One line per feature that is off."""
        lines = []
        for feature, rows in self.features_off().items():
            names = ", ".join(f"{r.row.qualname} ({r.status})" for r in rows)
            lines.append(f"{feature} is off: this ComfyUI lacks {names}")
        return lines

    def to_dict(self):
        return {"comfyui": self.comfyui, "side": self.side, "ok": self.ok,
                "fatal": len(self.fatal), "degraded": len(self.degraded), "optional": len(self.optional),
                "refusal": self.refusal(), "warnings": self.warnings(),
                "import_errors": self.import_errors,
                "rows": [r.to_dict() for r in self.results]}

    def format(self):
        """The table for people: status, tier, side, kind, name with its
        call shapes; then what is off and whether bulkhead can run."""
        lines = []
        head = ("status", "tier", "side", "kind", "name")
        rows = []
        for r in self.results:
            status = r.status if r.counts else f"{r.status} (uses {r.row.fallback})"
            name = r.row.qualname
            if r.row.calls:
                name += " | ".join(f"({c})" for c in r.row.calls)
            rows.append((status, r.row.tier, r.row.side, r.row.kind, name))
            if r.status != OK and r.detail:
                rows.append(("", "", "", "", f"  {r.detail}"))
        widths = [max(len(x[i]) for x in rows + [head]) for i in range(4)]
        for x in [head] + rows:
            lines.append("  ".join(x[i].ljust(widths[i]) for i in range(4)) + "  " + x[4])
        lines.append("")
        for mod, err in self.import_errors.items():
            lines.append(f"cannot import {mod}: {err}")
        for w in self.warnings():
            lines.append(f"DEGRADED: {w}")
        for r in self.optional:
            lines.append(f"optional, absent: {r.row.qualname} ({r.row.feature})")
        n_ok = sum(1 for r in self.results if not r.failed)
        lines.append(f"{n_ok} of {len(self.results)} rows ok, {len(self.fatal)} FATAL, "
                     f"{len(self.degraded)} DEGRADED, {len(self.optional)} optional absent")
        lines.append(self.refusal() or "bulkhead can isolate packs on this ComfyUI")
        return "\n".join(lines)


def _sides(side):
    if side in (None, "all", BOTH):
        return (HOST, WORKER, BOTH)
    if side == HOST:
        return (HOST, BOTH)
    if side == WORKER:
        return (WORKER, BOTH)
    raise ValueError(f"side must be 'host', 'worker' or None (all), not {side!r}")


def _comfyui_dir():
    for name, up in (("folder_paths", 1), ("comfy", 2)):
        f = getattr(sys.modules.get(name), "__file__", None)
        if f:
            d = os.path.realpath(f)
            for _ in range(up):
                d = os.path.dirname(d)
            return d
    return None


def check(side=None, *, import_missing=True, table=TABLE):
    """Checks the table's rows used on `side` ('host', 'worker', or None:
    every row) against the ComfyUI modules of this process.  A module not
    imported yet is imported (import_missing), as ComfyUI would; one that
    cannot be makes each of its rows missing.  Returns a Report; never
    raises for what it finds."""
    sides = _sides(side)
    mods, errors = {}, {}
    for name in dict.fromkeys(r.module for r in table if r.side in sides):
        mod = sys.modules.get(name)
        if mod is None and import_missing:
            try:
                mod = importlib.import_module(name)
            except (Exception, SystemExit) as e:  # raising on import: as good as missing
                errors[name] = f"{type(e).__name__}: {e}"
                mod = None
        elif mod is None:
            errors[name] = "not imported"
        mods[name] = mod
    results = []
    for row in table:
        if row.side not in sides:
            continue
        mod = mods.get(row.module)
        if mod is None:
            status, detail = MISSING, f"{row.module} cannot be imported ({errors.get(row.module)})"
        else:
            try:
                status, detail = _check_row(row, mod)
            except Exception as e:  # a name whose lookup raises is as good as missing
                status, detail = MISSING, f"looking it up raised {type(e).__name__}: {e}"
        results.append(Result(row, status, detail, True))
    by_name = {(r.row.module, r.row.name): r for r in results}
    for r in results:
        if r.status != OK and r.row.fallback:
            alt = by_name.get((r.row.module, r.row.fallback))
            if alt is not None and alt.status == OK:
                r.counts = False
    return Report(results, side, _comfyui_dir(), errors)


# --- once per process ---

_startup = None
_startup_lock = threading.Lock()


def startup():
    """check() once per process (the host's, before its first isolated
    pack is served: a ComfyUI without one hears nothing of it): the
    features that are off are logged here in ONE line naming them and
    `bulkhead doctor` (what each lacks is at debug level, and in the
    doctor's table); the caller refuses isolation when ``refusal()`` is
    not None (each pack's fallback warning carries that message)."""
    global _startup
    with _startup_lock:
        if _startup is None:
            _startup = check(None)
            off = list(_startup.features_off())
            if off:
                # One line of at most 200 characters: as many names as fit, the doctor has them all
                head = (f"bulkhead: on this ComfyUI {len(off)} feature{'' if len(off) == 1 else 's'} of isolated "
                        f"packs {'is' if len(off) == 1 else 'are'} off: ")
                tail = " (`bulkhead doctor` names what this ComfyUI lacks for each)"
                shown = []
                for name in off:
                    if shown and len(head) + len("; ".join(shown + [name])) + len(tail) + 10 > 200:
                        break
                    shown.append(name)
                more = f"; {len(off) - len(shown)} more" if len(shown) < len(off) else ""
                log.warning("%s%s%s%s", head, "; ".join(shown), more, tail)
                for line in _startup.warnings():
                    log.debug("bulkhead: %s", line)
        return _startup


def _forget():
    """Tests: check again on the next startup()."""
    global _startup
    with _startup_lock:
        _startup = None
