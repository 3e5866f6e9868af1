"""``bulkhead canary COMFYUI_DIR``: the drift canary (seed 000, "How we know
it still fits").

Reads upstream's comfy/model_management.py, derives what its memory manager
reads off a ledger entry's patcher, and checks that against what bulkhead's
StandIn answers.  The C ``bulkhead canary`` verb execs
``<python> -m bulkhead canary ...`` (tools/bulkhead.c, as for ``doctor``).

The StandIn's surface comes from the type itself (``surface_of``): the names
are ``_native.COMFY_SURFACE``; a name the type answers with a method is a
call whose parameters are ``inspect.signature`` of that method (the
``__text_signature__`` standin.c writes in each method's docstring, which
its argument parsing obeys), any other name an attribute.  So the guard and
the type cannot disagree: change a signature in standin.c and the verdict
changes with it.

How it reads the source is cli/canarywalk.py's (its module doc): one
pass of Python's ``ast`` in source order, the kinds of patcher values, the
is_dynamic() heuristic that gates a use.

Not members.  ``.model.model`` is the patcher's inner module (reported as
such; the StandIn answers ``.model`` with a RemoteModel), and dunders
(__class__, ...) every object has.  Reads off the inner module are not the
patcher's: they are listed as ``model.<name>`` in a class of their own
(answered or not by RemoteModel), gated like any other, and fail nothing.

free_memory.  The module's ``free_memory`` parameters are reported; one
not in FREE_MEMORY_KNOWN (what the StandIn's eviction scenarios cover)
fails the check, named.

Identities.  A member upstream compares between two patchers (``a.x ==
b.x``, or ``p.x in xs`` where xs holds .x read off patchers: newest
upstream's unload_model_and_clones and clone_base_uuid) tells models
apart: two stand-ins the host makes (memory.standin_identity) must not
share it, or one worker model's unload would take the others'.  Each is
listed (``compared``); one they share fails the check, named.

Errors (CanaryError, exit status 2): the file cannot be read (errno named),
is larger than MAX_SOURCE_BYTES, or is not Python this interpreter parses
(a syntax error, NUL bytes, nesting deeper than the parser or this walk
follows).  Nothing else is raised for any source text.
"""

import ast
import errno
import inspect
import json
import os
import stat
import sys
import warnings

from .. import _native
from .canarywalk import CALL, INNER_PREFIX, PROBE, READ, WRITE, Walk, shape_text

MAX_SOURCE_BYTES = 4 << 20  # upstream's file is ~70 KiB

# free_memory's parameters the StandIn's scenarios cover (tests/comfyui and
# tests/py/test_comfy_stub.py, every upstream generation); a parameter
# beyond these is drift the report names.
FREE_MEMORY_KNOWN = ("memory_required", "device", "keep_loaded", "for_dynamic", "pins_required", "ram_required")

# How a member is used: canarywalk's bits, named (the JSON's order).
USE_NAMES = ((READ, "attribute"), (CALL, "call"), (WRITE, "write"), (PROBE, "probe"))

# The classes a derived name falls in: JSON key and report title.
ANSWERED, LACKING, GATED, NOT_MEMBER, PROBED, INNER_READ = range(6)
CLASS_KEYS = ("answered", "lacking", "gated", "not_members", "probed", "inner")
CLASS_TITLES = (
    "answered by the StandIn", "lacking (the StandIn does not answer them)",
    "gated behind is_dynamic() (never reached: the StandIn answers False)",
    "not members (subtracted)", "probed only (hasattr / getattr with a default: a miss is no error)",
    "read off .model, the patcher's torch module (not a patcher member; the StandIn's .model is a "
    "RemoteModel, which answers only what it says)")

MAX_SHAPES = 64  # distinct call shapes kept per name

_PY = "%d.%d" % sys.version_info[:2]


class CanaryError(Exception):
    """The source cannot be checked: unreadable, too large or not Python.
    ``errno`` is set for a file that cannot be read, ``line`` (or None)
    for source that does not parse."""

    def __init__(self, message, errno=None, line=None):
        super().__init__(message)
        self.errno = errno
        self.line = line


# ------------------------------------------------------------- the surface


class Member:
    """One name the StandIn answers: an attribute, or a method whose
    parameters (self left out) are ``signature``."""

    def __init__(self, name, signature=None):
        self.name = name
        self.signature = signature
        self.is_call = signature is not None

    def text(self):
        """How the report names it: ``detach(unpatch_all=True)``."""
        return f"{self.name}{self.signature}" if self.is_call else f"{self.name} (an attribute)"


def surface_of(cls, names):
    """{name: Member} for each of ``names`` (in order) as the type ``cls``
    answers it.  A callable descriptor (a method) is a call with its
    signature; a property or getset descriptor an attribute.  Raises
    ValueError for a name the type does not have or a method without a
    signature (a C method needs a ``__text_signature__``)."""
    surface = {}
    for name in names:
        try:
            d = inspect.getattr_static(cls, name)
        except AttributeError:
            raise ValueError(f"{cls.__name__} has no member {name!r} of its surface") from None
        if not callable(d):
            surface[name] = Member(name)
            continue
        try:
            sig = inspect.signature(getattr(cls, name))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{cls.__name__}.{name} has no signature ({e}): give its C docstring a "
                             f"__text_signature__, \"{name}($self, ...)\\n--\\n\\n...\"") from None
        params = list(sig.parameters.values())[1:]  # the object itself
        surface[name] = Member(name, sig.replace(parameters=params))
    return surface


def standin_surface():
    """The StandIn's surface, read off bulkhead._native.StandIn."""
    return surface_of(_native.StandIn, _native.COMFY_SURFACE)


class Name:
    """Everything derived about one member name."""

    def __init__(self, name):
        self.name = name
        self.uses = 0        # bits of the ungated uses
        self.gated_uses = 0  # ... and of the uses behind is_dynamic()
        self.line = 0        # first ungated use (a real use outranks a probe); 0: none
        self.gated_line = 0  # first gated use; 0: none
        self.shapes = []     # [shape, line]: distinct ungated call shapes, first-use order
        self.cls = None
        self.in_surface = False
        self.why = None


# ------------------------------------------------------------- the verdict


class Change:
    """A use the StandIn would refuse."""

    def __init__(self, name, line, shape, reason):
        self.name, self.line, self.shape, self.reason = name, line, shape, reason


class Report:
    """What ``analyze`` found: ``names`` (first-use order), ``changes``
    (by line), ``unread`` and ``without`` (surface order)."""

    def __init__(self, surface, without, inner=()):
        self.surface = surface
        self.without = without
        self.inner = frozenset(inner)  # what the StandIn's .model (a RemoteModel) answers
        self.names = {}
        self.changes = []
        self.unread = []
        self.free_memory = None        # (parameter names, line) of upstream's free_memory
        self.free_memory_new = []      # of them, those not in FREE_MEMORY_KNOWN
        self.compared = {}             # member name -> line: compared between two patchers
        self.shared = []               # Changes: of those, the ones two stand-ins would share

    def answers(self, name):
        return name in self.surface and name not in self.without

    @property
    def status(self):
        """0 when the StandIn covers every member and call shape, else 1."""
        return 1 if (self.changes or self.free_memory_new or self.shared
                     or any(r.cls == LACKING for r in self.names.values())) else 0

    def section(self, cls):
        """The names of one class, by first use."""
        return sorted((r for r in self.names.values() if r.cls == cls), key=lambda r: r.line or r.gated_line)


def _shape_problem(member, shape):
    """Why the StandIn's method refuses this call shape, or None."""
    positional, star, kwstar, keywords = shape
    sig = member.text()
    if star or kwstar:
        return f"passes *args or **kwargs, which the canary cannot check against the StandIn's {sig}"
    params = list(member.signature.parameters.values())
    P = inspect.Parameter
    takes = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    if positional > len(takes) and not any(p.kind == P.VAR_POSITIONAL for p in params):
        return f"{positional} positional argument{'' if positional == 1 else 's'}; the StandIn takes {sig}"
    given = {p.name for p in takes[:positional]}
    by_name = {p.name: p for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    var_kw = any(p.kind == P.VAR_KEYWORD for p in params)
    for k in keywords:
        if k not in by_name and not var_kw:
            return f"keyword {k}= is not accepted; the StandIn takes {sig}"
        if k in given:
            return f"{k} is given twice; the StandIn takes {sig}"
        given.add(k)
    for p in params:
        if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and p.name not in given:
            return f"argument {p.name} is missing; the StandIn takes {sig}"
    return None


def _check_uses(report, r):
    member = report.surface[r.name]
    out = report.changes
    if not member.is_call and r.uses & CALL:
        shape = shape_text(r.name, r.shapes[0][0]) if r.shapes else f"{r.name}(...)"
        out.append(Change(r.name, r.shapes[0][1] if r.shapes else r.line, shape,
                          f"called, but the StandIn's {member.text()}"))
    if member.is_call and r.uses & READ:
        out.append(Change(r.name, r.line, r.name,
                          f"read without a call, but the StandIn's is a method: {member.text()}"))
    if r.uses & WRITE:
        out.append(Change(r.name, r.line, f"{r.name} = ...", "assigned, but the StandIn's members are read-only"))
    for shape, line in (r.shapes if member.is_call else ()):
        why = _shape_problem(member, shape)
        if why:
            out.append(Change(r.name, line, shape_text(r.name, shape), why))


def _parse(source, path):
    try:
        with warnings.catch_warnings():  # upstream's invalid escapes are not ours to report
            warnings.simplefilter("ignore")
            return ast.parse(source, filename=path)
    except SyntaxError as e:
        raise CanaryError(f"not Python (to Python {_PY}'s parser): {e.msg}", line=e.lineno) from None
    except ValueError as e:  # NUL bytes before 3.12
        raise CanaryError(f"not Python (to Python {_PY}'s parser): {e}") from None
    except (RecursionError, MemoryError):
        raise CanaryError(f"nested deeper than Python {_PY}'s parser follows") from None


def inner_surface():
    """What the StandIn's ``.model`` answers: a RemoteModel's own names."""
    return {n for n in dir(_native.RemoteModel) if not n.startswith("__")}


def _dunder(name):
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _check_identities(report, compared, identity):
    """A member upstream compares between two patchers (``a.x == b.x``,
    ``p.x in xs``) tells models apart: two stand-ins the host makes
    (``identity()``: the fields it gives a new one) must not share it."""
    report.compared = dict(compared)
    for name, line in sorted(compared.items(), key=lambda kv: kv[1]):
        if not report.answers(name) or report.surface[name].is_call:
            continue
        a, b = identity(), identity()
        if name not in a:
            why = (f"compared between patchers, but the host gives no stand-in a {name} of its own "
                   "(every one answers the StandIn's default): two worker models would match")
        elif a[name] is None or a[name] == b[name]:
            why = (f"compared between patchers, but two stand-ins the host makes share its value "
                   f"({a[name]!r}): two worker models would match")
        else:
            continue
        report.shared.append(Change(name, line, f"{name} == <another patcher's>", why))


def _host_identity():
    from ..host.memory import standin_identity  # lazy: CLI start (host.memory and what it imports)
    return standin_identity()


def analyze(source, without=(), surface=None, path="<source>", inner=None, identity=None):
    """Derives the interface ``source`` (a model_management.py, str or
    bytes) demands of a ledger entry's patcher and checks it against
    ``surface`` ({name: Member}, default: the StandIn's) less the names in
    ``without``.  identity: what gives a new stand-in its identity fields
    (default: the host's, memory.standin_identity).  Returns a Report;
    raises CanaryError for source that is not Python, ValueError for a
    ``without`` name the surface lacks."""
    if surface is None:
        surface = standin_surface()
    if inner is None:
        inner = inner_surface()
    if identity is None:
        identity = _host_identity
    without = list(dict.fromkeys(without))
    for w in without:
        if w not in surface:
            raise ValueError(f"--without {w}: the StandIn has no member of that name")
    tree = _parse(source, path)
    walk = Walk()
    try:
        walk.block(tree.body, False)
    except RecursionError:
        raise CanaryError("nested deeper than the canary follows") from None
    report = Report(surface, without, inner)
    if walk.free_memory is not None:
        report.free_memory = walk.free_memory
        report.free_memory_new = [p for p in walk.free_memory[0] if p not in FREE_MEMORY_KNOWN]
    walk.events.sort(key=lambda e: e[0])
    for (line, _), name, how, gated, shape in walk.events:
        r = report.names.get(name)
        if r is None:
            r = report.names[name] = Name(name)
        if gated:
            r.gated_uses |= how
            r.gated_line = r.gated_line or line
            continue
        if not r.line or (how != PROBE and r.uses == PROBE):
            r.line = line
        r.uses |= how
        if shape is not None and len(r.shapes) < MAX_SHAPES and all(s != shape for s, _ in r.shapes):
            r.shapes.append([shape, line])
    for r in report.names.values():
        real = r.uses & ~PROBE
        inner_name = r.name.startswith(INNER_PREFIX)
        attr = r.name[len(INNER_PREFIX):] if inner_name else r.name
        r.in_surface = attr in report.inner if inner_name else report.answers(r.name)
        if not real:
            r.cls = GATED if r.gated_uses & ~PROBE else PROBED
        elif _dunder(attr):
            r.cls, r.why = NOT_MEMBER, "every object has it (not a patcher member)"
        elif r.name == "model" and r.in_surface:
            r.cls, r.why = NOT_MEMBER, "inner module: the patcher's torch module (the StandIn answers .model)"
        elif inner_name:
            r.cls = INNER_READ
        else:
            r.cls = ANSWERED if r.in_surface else LACKING
        if r.in_surface and real and not inner_name:
            _check_uses(report, r)
    report.changes.sort(key=lambda c: (c.line, c.shape))
    for name in surface:
        r = report.names.get(name)
        if report.answers(name) and not (r and r.uses & ~PROBE):
            report.unread.append(name)
    _check_identities(report, walk.compared, identity)
    return report


# ---------------------------------------------------------------- output


def _js(s):
    """A JSON string: UTF-8 as is; a path that is not UTF-8 (surrogate
    escapes) as \\u escapes."""
    try:
        s.encode("utf-8")
        return json.dumps(s, ensure_ascii=False)
    except UnicodeEncodeError:
        return json.dumps(s)


def _uses_json(u):
    return "[" + ", ".join(f'"{n}"' for bit, n in USE_NAMES if u & bit) + "]"


def to_json(report, path):
    """The report as one JSON object (the text ``--json`` prints)."""
    st = report.status
    out = [f"{{\n  \"file\": {_js(path)},\n  \"ok\": {'false' if st else 'true'},\n  \"status\": {st},\n"]
    out.append("  \"surface\": [" + ", ".join(f'"{n}"' for n in report.surface if report.answers(n)) + "],\n")
    out.append("  \"without\": [" + ", ".join(f'"{n}"' for n in report.without) + "]")
    for cls, key in enumerate(CLASS_KEYS):
        rows = report.section(cls)
        gated = cls == GATED
        items = []
        for r in rows:
            e = (f"{{\"name\": {_js(r.name)}, \"line\": {r.gated_line if gated else r.line}, "
                 f"\"uses\": {_uses_json(r.gated_uses if gated else r.uses)}, "
                 f"\"answered\": {'true' if r.in_surface else 'false'}")
            if r.why:
                e += f", \"why\": {_js(r.why)}"
            if not gated and r.shapes:
                e += ", \"calls\": [" + ", ".join(_js(shape_text(r.name, s)) for s, _ in r.shapes) + "]"
            items.append("\n    " + e + "}")
        out.append(f",\n  \"{key}\": [" + ",".join(items) + ("\n  " if rows else "") + "]")
    items = [f"\n    {{\"name\": {_js(c.name)}, \"line\": {c.line}, \"call\": {_js(c.shape)}, "
             f"\"reason\": {_js(c.reason)}}}" for c in report.changes]
    out.append(",\n  \"changed\": [" + ",".join(items) + ("\n  " if items else "") + "],\n")
    out.append("  \"unread\": [" + ", ".join(f'"{n}"' for n in report.unread) + "]")
    shared = {c.name: c.reason for c in report.shared}
    items = [f"\n    {{\"name\": {_js(n)}, \"line\": {line}, \"per_model\": {'false' if n in shared else 'true'}"
             + (f", \"reason\": {_js(shared[n])}" if n in shared else "") + "}"
             for n, line in report.compared.items()]
    out.append(",\n  \"compared\": [" + ",".join(items) + ("\n  " if items else "") + "]")
    if report.free_memory is not None:
        params, line = report.free_memory
        out.append(",\n  \"free_memory\": {\"line\": %d, \"parameters\": [%s], \"new\": [%s]}"
                   % (line, ", ".join(_js(p) for p in params), ", ".join(_js(p) for p in report.free_memory_new)))
    out.append("\n}\n")
    return "".join(out)


def _uses_text(r, gated):
    u = r.gated_uses if gated else r.uses
    parts = []
    if u & READ:
        parts.append("attribute")
    if u & CALL:
        if gated or not r.shapes:
            parts.append("call")
        else:
            parts.extend(shape_text(r.name, s) for s, _ in r.shapes)
    if u & WRITE:
        parts.append("assigned")
    if u & PROBE:
        parts.append("probed")
    return ", ".join(parts)


def to_text(report, path):
    """The report for humans: sections, each name at file:line, the verdict."""
    def row(name, what, line):
        return f"  {name:<28} {what:<44} {path}:{line}\n"

    nsurface = len(report.surface) - len(report.without)
    members = sum(r.cls in (ANSWERED, LACKING) for r in report.names.values())
    out = [f"bulkhead canary: {path}\n",
           f"upstream reads {members} member{'' if members == 1 else 's'} off a ledger entry's patcher "
           f"(the StandIn answers {nsurface}"]
    if report.without:
        out.append("; left out with --without: " + " ".join(report.without))
    out.append(")\n")
    lacking = [r.name for r in report.names.values() if r.cls == LACKING]
    for cls, title in enumerate(CLASS_TITLES):
        rows = report.section(cls)
        if cls in (PROBED, INNER_READ) and not rows:
            continue
        gated = cls == GATED
        out.append(f"\n{title} ({len(rows)}){':' if rows else ''}\n")
        for r in rows:
            what = r.why or _uses_text(r, gated)
            if gated or cls == INNER_READ:
                what += "; answered" if r.in_surface else "; not answered"
            out.append(row(r.name, what, r.gated_line if gated else r.line))
        if cls == LACKING:  # call shapes right after what is missing: both fail the check
            out.append(f"\nchanged call shapes ({len(report.changes)}){':' if report.changes else ''}\n")
            for c in report.changes:
                out.append(row(c.name, c.shape, c.line))
                out.append(f"      {c.reason}\n")
    out.append(f"\nStandIn members upstream does not read ({len(report.unread)})"
               f"{':' if report.unread else ''}" + "".join(f" {n}" for n in report.unread) + "\n")
    if report.compared:
        out.append(f"\ncompared between patchers ({len(report.compared)}):\n")
        shared = {c.name: c.reason for c in report.shared}
        for n, line in report.compared.items():
            out.append(row(n, "shared between stand-ins" if n in shared else
                           ("each stand-in its own" if report.answers(n) else "not answered"), line))
            if n in shared:
                out.append(f"      {shared[n]}\n")
    if report.free_memory is not None:
        params, line = report.free_memory
        out.append(f"\nfree_memory({', '.join(params)})  {path}:{line}\n")
        if report.free_memory_new:
            out.append("  new parameters the StandIn's eviction scenarios do not cover: "
                       + " ".join(report.free_memory_new) + "\n")
    out.append("\n")
    if not report.status:
        out.append("OK: the StandIn answers every member upstream reads, in every call shape.\n")
        return "".join(out)
    out.append("FAIL:")
    if lacking:
        out.append(" the StandIn lacks " + " ".join(lacking) + (";" if report.changes else ""))
    if report.changes:
        out.append(" call shapes changed: " + " ".join(c.shape for c in report.changes)
                   + (";" if report.free_memory_new else ""))
    if report.free_memory_new:
        out.append(" free_memory takes new parameters: " + " ".join(report.free_memory_new)
                   + (";" if report.shared else ""))
    if report.shared:
        out.append(" stand-ins share what upstream compares: " + " ".join(c.name for c in report.shared))
    out.append("\n")
    return "".join(out)


# ------------------------------------------------------------------ main

USAGE = """\
usage: bulkhead canary [--json] [--without NAME]... COMFYUI_DIR

Reads COMFYUI_DIR/comfy/model_management.py (or COMFYUI_DIR itself when it is
that file), derives the members ComfyUI's memory manager reads off a ledger
entry's patcher, and checks them against what bulkhead's StandIn answers.

  --json          one JSON object instead of the report
  --without NAME  check against the StandIn without member NAME (repeatable):
                  what would fail if it were dropped

Exit: 0 the StandIn covers everything, 1 it lacks a member or a call shape
changed (listed), 2 the file cannot be read, is not Python, or a usage error.
"""


def read_source(path):
    """The file's bytes; CanaryError (with errno) when it cannot be read or
    is larger than MAX_SOURCE_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise CanaryError(os.strerror(e.errno), errno=e.errno) from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise CanaryError(os.strerror(errno.EISDIR), errno=errno.EISDIR)
        chunks, n = [], 0
        while n <= MAX_SOURCE_BYTES:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_SOURCE_BYTES:
            raise CanaryError("larger than the canary reads (4 MiB)", errno=errno.EFBIG)
        return b"".join(chunks)
    except OSError as e:
        raise CanaryError(os.strerror(e.errno), errno=e.errno) from None
    finally:
        os.close(fd)


def _usage(status, why=None):
    if why:
        sys.stderr.write(f"bulkhead canary: {why}\n")
    (sys.stdout if status == 0 else sys.stderr).write(USAGE)
    return status


def _write(text):
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()


def main(argv):
    """``bulkhead canary [--json] [--without NAME]... COMFYUI_DIR``; argv
    without the verb.  Returns the exit status: 0 the StandIn covers
    everything, 1 it does not (the report says what), 2 the file cannot be
    read or parsed (path named), or a usage error."""
    without, target, json_out, rest = [], None, False, False
    try:
        surface = standin_surface()
    except ValueError as e:  # a StandIn built without its signatures
        sys.stderr.write(f"bulkhead canary: cannot read the StandIn's surface: {e}\n")
        return 2
    i = 0
    while i < len(argv):
        a, w = argv[i], None
        i += 1
        if not rest and a == "--":
            rest = True
            continue
        if not rest and a in ("-h", "--help"):
            return _usage(0)
        if not rest and a == "--json":
            json_out = True
            continue
        if not rest and a == "--without":
            if i >= len(argv):
                return _usage(2, "--without needs a member name")
            w = argv[i]
            i += 1
        elif not rest and a.startswith("--without="):
            w = a[len("--without="):]
        elif not rest and a.startswith("-") and len(a) > 1:
            sys.stderr.write(f"bulkhead canary: unknown option {a}\n")
            return _usage(2)
        else:
            if target is not None:
                return _usage(2, "one COMFYUI_DIR only")
            target = a
            continue
        if w not in surface:
            sys.stderr.write(f"bulkhead canary: --without {w}: the StandIn has no member of that name\n")
            return _usage(2)
        without.append(w)
    if not target:
        return _usage(2, "which ComfyUI checkout? (COMFYUI_DIR)")
    if os.path.exists(target) and not os.path.isdir(target):
        path = target
    else:
        path = target + ("" if target.endswith("/") else "/") + "comfy/model_management.py"
    try:
        report = analyze(read_source(path), without, surface, path)
    except CanaryError as e:
        if e.errno is not None:
            sys.stderr.write(f"bulkhead canary: cannot read {path}: {e} (errno {e.errno})\n")
        else:
            where = f"{path}:{e.line}" if e.line else path
            sys.stderr.write(f"bulkhead canary: {where}: {e}\n")
        if json_out:
            doc = f"{{\"file\": {_js(path)}, \"ok\": false, \"status\": 2"
            if e.errno is not None:
                doc += f", \"errno\": {e.errno}, \"error\": {_js(os.strerror(e.errno))}"
            else:
                doc += f", \"line\": {e.line or 'null'}, \"error\": {_js(str(e))}"
            _write(doc + "}\n")
        return 2
    _write(to_json(report, path) if json_out else to_text(report, path))
    return report.status
