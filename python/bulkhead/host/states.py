"""Where each pack stands, and the in-process fallback.

Every pack (or part of one) bulkhead serves in this process is recorded
here: isolated (host/nodes.py ``load_pack``), building (``building``: its
environment builds in the background, host/building.py), in-process (``fallback``: the
pack imported in ComfyUI's process, with one warning per pack naming the
reason, a key of ``REASONS``: ``pack_line``, one short line, the whole
reason and the fix in its state) or failed (``failed``: it runs
nowhere).  ``pack_states`` is what GET /bulkhead/status and the panel's
Packs section list, and ``startup_line`` the one line logged when
ComfyUI's server starts.  Where a pack's ``[bulkhead] fallback`` or
BULKHEAD_FALLBACK (``FALLBACK_SWITCH``) says "error", a pack that cannot
run isolated is recorded failed instead of imported; where either says
"in-process", it is imported.  Where neither chooses, it is imported only
where ComfyUI's process is the same as its environment (the caller says
what differs, ``unlike``: host/pack.py ``host_differs``); otherwise it is
"refused" (``refuse``): its nodes are listed as in-process, and each
raises ``PackRefused`` with the reason and the fix when it would run, so
a prompt using one fails at that node, never computing in the wrong
environment.
"""

import logging
import os
import threading
import time

from .. import __version__
from ..channel import spec
from ..channel.peer import BulkheadError
from ..envs.errors import short     # states.short: building.py's, nodes.py's and pack.py's too
from ..packimport import import_nodes
from . import sandbox

log = logging.getLogger("bulkhead")

# Why a pack runs in-process: reason -> (what, fix).  {pack} is the pack
# directory, {detail} what the caller adds.
NO_COMFYUI = "no-comfyui"
NO_CONFIG = "no-config"
STAMP_REFUSED = "stamp-refused"
ENV_NOT_BUILT = "env-not-built"
BUILD_FAILED = "build-failed"
DIR_WITHOUT_CONFIG = "dir-without-config"
CONTRACT_REFUSED = "contract-refused"
WORKER_IMPORT_FAILED = "worker-import-failed"
CONFIG_REFUSED = "config-refused"
CUSTOM_NODE_GONE = "custom-node-gone"
REASONS = {
    NO_COMFYUI: ("no ComfyUI base was found (folder_paths / comfy are not imported here, "
                 "options['comfyui'] and COMFYUI_PATH are unset){detail}",
                 "load it from ComfyUI (or set COMFYUI_PATH=<ComfyUI dir>), then "
                 "`bulkhead install {pack}`"),
    NO_CONFIG: ("it has no comfy-env.toml{detail}",
                "add a comfy-env.toml to the pack, then `bulkhead install {pack}`"),
    STAMP_REFUSED: ("its environment's stamp was refused{detail}",
                    "rebuild the environment: `bulkhead install {pack}`"),
    ENV_NOT_BUILT: ("its environment is not built{detail}",
                    "build it: `bulkhead install {pack}`"),
    BUILD_FAILED: ("its environment could not be built{detail}",
                   "what that build error names (the requirement, index or conda channel it could not get, "
                   "and where to get it), then `bulkhead install {pack}` retries it"),
    DIR_WITHOUT_CONFIG: ("this directory has no comfy-env.toml of its own{detail}",
                         "to isolate it, add a comfy-env.toml to it and run `bulkhead install {pack}`"),
    WORKER_IMPORT_FAILED: ("it failed to import in its worker{detail}",
                           "give its environment what it lacks (its comfy-env.toml), then rebuild it with "
                           "`bulkhead install {pack}` (--force when nothing in the file changed); the worker's "
                           "whole traceback is in the log line before this one"),
    CONFIG_REFUSED: ("its comfy-env.toml is invalid{detail}",
                     "correct the file named above, then `bulkhead install {pack}`"),
    CUSTOM_NODE_GONE: ("bulkhead's custom node is not in ComfyUI's custom_nodes{detail}: its folder was deleted "
                       "(ComfyUI-Manager's Uninstall), which turns bulkhead off",
                       "to isolate it again, reinstall bulkhead's custom node (ComfyUI-Manager, or `git clone` it "
                       "into custom_nodes/ and run `python install.py` there) and restart ComfyUI; to remove "
                       "bulkhead, `bulkhead uninstall`, then `pip uninstall bulkhead`"),
    CONTRACT_REFUSED: ("bulkhead refuses isolation{detail}",
                       "run `bulkhead doctor` to see the contract; update bulkhead to a release that "
                       "fits this ComfyUI (or ComfyUI to one this bulkhead fits), then "
                       "`bulkhead install {pack}`"),
}


# --- where each pack stands: what /bulkhead/status and the panel show ---

_states = {}            # (pack_dir, module) -> {"name", "state", ...}; under _states_lock
_states_lock = threading.Lock()


def set_state(pack_dir, module, **state):
    with _states_lock:
        _states[(pack_dir, module)] = dict(state, directory=pack_dir)


def update(pack_dir, module, **fields):
    """Adds fields to the state of (pack_dir, module), where it has one
    (a build's phase, a rebuild's outcome: host/building.py)."""
    with _states_lock:
        row = _states.get((pack_dir, module))
        if row is not None:
            row.update(fields)


def state_of(pack_dir, module):
    """The state ("isolated", "building", ...) of (pack_dir, module), or None."""
    with _states_lock:
        return _states.get((pack_dir, module), {}).get("state")


def building(pack_dir, module, name, reason, phase="queued"):
    """Records a pack (its ``module``) whose environment builds in the
    background (host/building.py): it has no nodes until the build ends."""
    set_state(os.path.realpath(os.fspath(pack_dir)), module, name=name, state="building", phase=phase,
              reason=reason)


# The PackRuntime of each (pack directory, interpreter) that load_pack made
# (host/nodes.py), here beside the states that name their workers.
_runtimes = {}
_runtimes_lock = threading.Lock()


def runtime_for(pack_dir, python, make):
    """The runtime of (pack_dir, python), made by make() the first time."""
    with _runtimes_lock:
        rt = _runtimes.get((pack_dir, python))
        if rt is None:
            rt = _runtimes[(pack_dir, python)] = make()
        return rt


def runtime_of(pack_dir, python):
    """The runtime load_pack made for (pack_dir, python), or None."""
    with _runtimes_lock:
        return _runtimes.get((os.path.realpath(pack_dir), os.fspath(python)))


def runtimes():
    """Every PackRuntime of this host, in load order."""
    with _runtimes_lock:
        return list(_runtimes.values())


def runtime(pack_dir):
    """The PackRuntime load_pack made for pack_dir, or None."""
    pack_dir = os.path.realpath(pack_dir)
    with _runtimes_lock:
        return next((rt for (d, _py), rt in _runtimes.items() if d == pack_dir), None)


def forget_all():
    """Tests: forget every runtime and state (as a fresh ComfyUI start
    would); the caller has stopped the workers."""
    with _runtimes_lock:
        _runtimes.clear()
    with _states_lock:
        _states.clear()


def pack_states():
    """[{"name", "state", "directory", ...}] of every pack (or part of one)
    bulkhead served in this process, those not isolated first, then by
    name.  state: "isolated" (with "python", "env" and the worker's
    "pid", None while none runs; "python" and "env" are its worker's
    own once a rebuild moved it; "rebuild" where its changed config is
    being rebuilt, or was and failed; "warning" and "fix" where some of
    its nodes cannot run there: isolated without torch), "building" (with "phase" and
    "reason": its environment builds in the background, its nodes come
    when it ends), "in-process" (with "reason" and "fix": it runs in
    ComfyUI's process, not in its environment), "refused" (with "reason"
    and "fix": its nodes are listed, and refuse to run, since ComfyUI's
    process is not the same as its environment) or "failed" (with
    "reason": it runs nowhere)."""
    with _states_lock:
        rows = [dict(v) for v in _states.values()]
    with _runtimes_lock:
        by_key = dict(_runtimes)
    for r in rows:
        if r["state"] == "isolated":
            rt = by_key.get((r["directory"], r["python"]))      # one pack directory, one runtime per environment
            w = getattr(rt, "worker", None)
            r["pid"] = w.pid if w is not None else None
            if rt is not None:     # sandboxed or not, and why (host/sandbox.py)
                r["sandbox"] = sandbox.state_of(rt).describe()
            if w is not None and w.python != r["python"]:    # a rebuild moved it (envs.build.current_python)
                r["python"], r["env"] = w.python, os.path.dirname(os.path.dirname(w.python))
    order = {"failed": 0, "refused": 0, "in-process": 1, "building": 2, "isolated": 3}
    return sorted(rows, key=lambda r: (order.get(r["state"], 3), r["name"]))


_serving_s = [0.0]      # seconds spent serving packs (builds at start included); under _states_lock


class serving:
    """``with states.serving():`` around one pack's load: its time counts in
    the start-up line (``startup_line``)."""

    def __enter__(self):
        self.t0 = time.monotonic()

    def __exit__(self, *exc):
        with _states_lock:
            _serving_s[0] += time.monotonic() - self.t0


def startup_line(lead=""):
    """The one short line bulkhead logs when ComfyUI's server starts (and
    again when the last background build ends: host/building.py), at most
    ``STARTUP_LINE_MAX`` characters with ``lead``: its version, how many packs run
    isolated, which build, which do not (each one's reason and fix are in
    its own line, the panel and `bulkhead status`), and the time spent
    loading them."""
    rows = pack_states()
    iso = [r for r in rows if r["state"] == "isolated"]
    lost = [f"{r['name']}: {r['state']}" for r in rows if r["state"] not in ("isolated", "building")]
    built = [r["name"] for r in rows if r["state"] == "building"]
    partial = [r["name"] for r in iso if r.get("warning")]
    bare = [r["name"] for r in iso if (r.get("sandbox") or {}).get("state") not in (None, "sandboxed")]
    with _states_lock:
        spent = _serving_s[0]
    tail = f"; {spent:.1f} s loading them; the panel and `bulkhead status` say more"
    parts = [(f"{lead}bulkhead {__version__}: {len(iso)} pack{'' if len(iso) == 1 else 's'} isolated", [])]
    if partial:
        parts.append((f", {len(partial)} without torch", partial))
    if built:
        parts.append((f", {len(built)} building in the background", built))
    if bare:    # isolated, its worker not sandboxed (host/sandbox.py): why is in its own line
        parts.append((f", {len(bare)} not sandboxed", bare))
    if lost:
        parts.append((f", {len(lost)} NOT isolated", lost))
    # the names, as many as fit: a start with many packs is one line still
    room = STARTUP_LINE_MAX - len(tail) - sum(len(head) + 3 for head, _ in parts)
    text = ""
    for head, names in parts:
        shown = []
        for n in names:
            if len(n) + 2 > room - 12:
                break
            shown.append(n)
            room -= len(n) + 2
        if len(shown) < len(names):
            shown.append(f"{len(names) - len(shown)} more")
        text += head + (f" ({', '.join(shown)})" if shown else "")
    return text + tail


STARTUP_LINE_MAX = 200

# One line of ComfyUI's log per pack and phase (#36): the pack's name
# first, its state and the reason cut to fit in LINE_MAX characters, and
# where the whole reason and the fix are (``WHOLE``: set_state's record).
LINE_MAX = 200
WHOLE = "whole reason and fix: `bulkhead status`, panel's Packs"
# Where bulkhead's custom node is gone, neither is served: the fix itself
WHOLE_WITHOUT = {CUSTOM_NODE_GONE: "fix: reinstall bulkhead's custom node, restart ComfyUI"}


def pack_line(name, state, why, whole=WHOLE):
    """"bulkhead: pack <name> <state>: <why> (<whole>)" in at most LINE_MAX
    characters, why cut where it does not fit (never below 20 of its own,
    so a name that long makes the line longer)."""
    head, tail = f"bulkhead: pack {name!r} {state}: ", f" ({whole})" if whole else ""
    return head + short(str(why), max(20, LINE_MAX - len(head) - len(tail))) + tail


def failed(pack_dir, name, reason, *, module="auto"):
    """Records a pack (its ``module``, as fallback names it) that could be
    served neither isolated nor in-process.  What its row said before
    (why it is not isolated, and the fix: ``fallback``'s, ``refuse``'s)
    stays in front of reason, where the log's one line points."""
    pack_dir = os.path.realpath(os.fspath(pack_dir))
    with _states_lock:
        before = dict(_states.get((pack_dir, module), {}))
    fix = {"fix": before["fix"]} if before.get("fix") else {}
    if before.get("reason") and before.get("state") in ("in-process", "refused", "failed") \
            and not before["reason"].startswith(reason) and not before["reason"].endswith(f"; {reason}"):
        reason = f"{before['reason']}; {reason}"
    set_state(pack_dir, module, name=name, state="failed", reason=reason, **fix)


# BULKHEAD_FALLBACK=error: every pack that cannot run isolated is an
# error instead of running in ComfyUI's process (as a pack's own
# ``[bulkhead] fallback = "error"`` makes it for that pack);
# BULKHEAD_FALLBACK=in-process: every such pack runs in ComfyUI's process,
# the same as its environment or not.  Unset: in-process only where it is
# the same, else refused.
FALLBACK_SWITCH = spec.FALLBACK


def fallback_choice(policy=None):
    """(choice, source) for a pack that cannot run isolated: "error" where
    its own ``[bulkhead] fallback`` (policy) or the machine's
    BULKHEAD_FALLBACK says so, else "in-process" where either says that,
    else (None, None): the default, in-process only where that is the
    same as its environment.  source names the setting that chose."""
    switch = os.environ.get(FALLBACK_SWITCH, "").strip().lower()
    for choice in ("error", "in-process"):
        if policy == choice:
            return choice, f'its [bulkhead] fallback = "{choice}"'
        if switch == choice:
            return choice, f"{FALLBACK_SWITCH}={choice}"
    return None, None


def fallback_is_error(policy=None):
    """Whether a pack that cannot run isolated is an error rather than run
    in-process: its own ``[bulkhead] fallback`` (policy), or the machine's
    BULKHEAD_FALLBACK, says "error"."""
    return fallback_choice(policy)[0] == "error"


class PackRefused(BulkheadError, RuntimeError):
    """A node of a pack that cannot run isolated and whose environment
    ComfyUI's process is not the same as: raised where it would run, with
    the reason and the fix."""


def fallback(pack_dir, reason, *, detail=None, name=None, module="auto", policy=None, unlike=None):
    """Imports the pack in this process and returns its own
    (NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS), after ONE warning
    per pack naming the reason (a key of REASONS, or any text), one line
    (``pack_line``) pointing at its state, which holds the whole reason and
    the fix.  detail is added to the reason (e.g. what the stamp check said).
    Where the pack's ``[bulkhead] fallback`` (policy) or BULKHEAD_FALLBACK
    says "error", nothing is imported: one error line, the pack (its part)
    recorded failed, and no nodes, so a prompt using them fails instead of
    running in the wrong environment.  Where neither chooses and unlike
    (what makes ComfyUI's process not the same as the pack's environment:
    a requirement it lacks or holds at a version the pack's pins refuse)
    is given, the pack is refused (``refuse``)."""
    pack_dir = os.path.realpath(os.fspath(pack_dir))
    name = name or os.path.basename(pack_dir)
    what, fix = REASONS.get(reason, (str(reason) + "{detail}", "`bulkhead install {pack}`"))
    detail = f": {detail}" if detail and not detail.startswith((" ", ":")) else (detail or "")
    why, how = what.format(detail=detail, pack=pack_dir), fix.format(pack=pack_dir, detail=detail)
    choice, source = fallback_choice(policy)
    if choice == "error":
        log.error("%s", pack_line(name, f"is NOT loaded ({source})", why, WHOLE_WITHOUT.get(reason, WHOLE)))
        set_state(pack_dir, module, name=name, state="failed", reason=f"{why} (not run in-process: {source})",
                   fix=how)
        return {}, {}
    if choice is None and unlike:
        return refuse(pack_dir, module, name, why, how, unlike, WHOLE_WITHOUT.get(reason, WHOLE))
    with _states_lock:     # once per pack and module: a pack's subdirectories fall back one by one
        first = _states.get((pack_dir, module), {}).get("state") != "in-process"
    if first:
        log.warning("%s", pack_line(name, "runs in-process, NOT isolated", why, WHOLE_WITHOUT.get(reason, WHOLE)))
    mod = _import(pack_dir, module, name, "in-process", why, how)
    # in-process once imported: one that fails here too is the caller's to record (``failed``)
    set_state(pack_dir, module, name=name, state="in-process", reason=why, fix=how)
    return (dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}),
            dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {}))


def refuse(pack_dir, module, name, why, how, unlike, whole=WHOLE):
    """The nodes of a pack that cannot run isolated (why; how: the fix)
    and whose environment ComfyUI's process is not the same as (unlike):
    the pack's own classes, read by importing its module in this process
    as ComfyUI imports any pack (their names, INPUT_TYPES and display
    names are what in-process would list: nothing else tells them without
    a worker), each wrapped so that running it raises PackRefused with the
    reason and the fix.  Its IS_CHANGED is not run either.  Recorded
    "refused", with one warning (its end: whole).  An import that fails here is the
    caller's to record, as ``fallback``'s is."""
    fix = (f"{how}; or, to run it in ComfyUI's process as it is, set [bulkhead] fallback = \"in-process\" in "
           f"its comfy-env.toml ({FALLBACK_SWITCH}=in-process for every pack)")
    reason = f"{why}; not run in ComfyUI's process, which is not the same as its environment: {unlike}"
    with _states_lock:     # once per pack and module, as fallback's warning
        first = _states.get((pack_dir, module), {}).get("state") != "refused"
    if first:
        log.warning("%s", pack_line(name, "is refused, NOT run", why, whole))
    mod = _import(pack_dir, module, name, "refused", reason, fix)
    message = f"bulkhead: pack {name!r} does not run: {reason}. Fix: {fix}"
    classes = {key: _refusing(cls, message) if isinstance(cls, type) else cls
               for key, cls in dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}).items()}
    set_state(pack_dir, module, name=name, state="refused", reason=reason, fix=fix)
    return classes, dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {})


def _import(pack_dir, module, name, state, reason, fix):
    """The pack's module imported in this process; where that raises, its
    row says "failed" (it runs nowhere: never listed as state, which it
    did not reach) with the reason and the fix, for the caller's ``failed`` to
    keep in front of the import's error (the log's one line pointed
    there)."""
    try:
        return import_nodes(pack_dir, module, unique_name=True)
    except BaseException:
        set_state(pack_dir, module, name=name, state="failed", reason=reason, fix=fix)
        raise


def _refusing(cls, message):
    """A subclass of the node class cls whose run raises PackRefused
    (message): its FUNCTION (a V1 node) or its ``execute`` (a V3 node),
    sync or async alike, since the raise comes before anything is
    awaited.  IS_CHANGED answers "changed" without running the pack's."""
    def refuse_run(*args, **kwargs):
        raise PackRefused(message)
    ns = {"__module__": cls.__module__, "__doc__": cls.__doc__, "__qualname__": cls.__qualname__}
    if callable(getattr(cls, "GET_SCHEMA", None)):          # V3: comfy_api's ComfyNode
        ns["execute"] = classmethod(refuse_run)
    else:
        function = getattr(cls, "FUNCTION", None)
        if isinstance(function, str):
            ns[function] = refuse_run
        if hasattr(cls, "IS_CHANGED"):
            ns["IS_CHANGED"] = classmethod(lambda c, *a, **k: float("nan"))
    return type(cls.__name__, (cls,), ns)
