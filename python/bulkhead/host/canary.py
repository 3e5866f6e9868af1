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

How it reads the source.  Python's own ``ast`` parses it; one pass in
source order walks the statements, keeping for each function body the
names bound to a patcher ("aliases") and, for each block, whether it is
reached only when ``is_dynamic()`` returned True ("gated").  Every member
read off a patcher is an event (its position, how it was used, gated or
not); the events are folded in source order at the end.

What is a patcher (the kinds).  ENTRY is a LoadedModel (a ledger entry),
PATCHER what its .model returns, INNER the patcher's own .model (the torch
module), ENTRIES / PATCHERS collections of them.  Sources:
  - current_loaded_models is ENTRIES; subscripts, .pop() of it are ENTRY,
    .copy(), slices, sorted()/reversed()/list()/... of it are ENTRIES,
    enumerate() of it gives (index, ENTRY);
  - LoadedModel(...) is an ENTRY; in a method of class LoadedModel the
    first parameter (self) is an ENTRY and a parameter named ``model`` (and
    __init__'s first argument) a PATCHER;
  - ENTRY.model is a PATCHER; and, as the seed's grep did, ``<x>.model`` on
    anything not known to be a patcher or a list is taken to be a ledger
    entry's, so ``.model.<name>`` counts wherever it appears;
  - load_models_gpu's first parameter is PATCHERS (the incoming models),
    unload_model_and_clones's first parameter a PATCHER; a patcher's
    model_patches_models() / get_nested_additional_models() are PATCHERS;
  - a name bound to one of these (``model = x.model``, ``for x in models``,
    comprehension variables, ``x := ...``, ``lst.append(entry)`` making lst
    a list of them) keeps the kind in its function until rebound: an alias
    lives in one function body (nested functions see it; a class body
    shares its function's).  Order is textual; values returned from other
    functions are not followed, except what a generator of the module
    yields: one whose every yield is an ENTRY (PATCHER) makes a call of it
    ENTRIES (PATCHERS), defined before the call; when every yield is gated
    (see below), a loop or comprehension over it is gated too, its body
    running only for dynamic patchers (upstream's models_for_pin_eviction).
Every ``.name`` read off a PATCHER is recorded: read, call (with its
positional count, *args or **kwargs, keyword names), or write (assigned or
deleted).  hasattr(p, "name") and getattr(p, "name", default) are probes (a
miss is no error); getattr(p, "name") is a read, or a call when called.

The is_dynamic() heuristic.  A condition "implies dynamic" when it being
True (or False) guarantees some ``<chain>.is_dynamic()`` returned True,
worked out over and / or / not (any other comparison or call is opaque).
Then a use is gated when it sits
  - in the body of ``if C:`` / ``while C:`` where C implies dynamic, or in
    an elif/else branch reached only when an earlier condition being False
    implies dynamic (``if not p.is_dynamic(): ... else: <gated>``);
  - after ``if C: return|continue|break|raise`` in the same block when C
    being False implies dynamic (``if p is None or not p.is_dynamic():
    continue``), provided every earlier branch of that if chain exits too;
  - in ``A if C else B`` (A when C implies dynamic, B when not-C does), in
    the element or later clauses of a comprehension after ``if C``, and in
    the right operand of ``and`` / ``or`` whose left side implies dynamic
    when True / False.
A function body is never gated by where the function is defined.  It does
not check that is_dynamic() was asked of the same object, and an exiting
``else:`` branch gates nothing.  The StandIn answers is_dynamic() False, so
gated reads never reach it: they are reported but do not fail the check.

Not members.  ``.model.model`` is the patcher's inner module (reported as
such; the StandIn answers ``.model`` with a RemoteModel), and dunders
(__class__, ...) every object has.  Reads off the inner module are not the
patcher's: they are listed as ``model.<name>`` in a class of their own
(answered or not by RemoteModel), gated like any other, and fail nothing.

free_memory.  The module's ``free_memory`` parameters are reported; one
not in FREE_MEMORY_KNOWN (what the StandIn's eviction scenarios cover)
fails the check, named.

Errors (CanaryError, exit status 2): the file cannot be read (errno named),
is larger than MAX_SOURCE_BYTES, or is not Python this interpreter parses
(a syntax error, NUL bytes, nesting deeper than the parser or this walk
follows).  Nothing else is raised for any source text.
"""

import ast
import errno
import inspect
import os
import stat
import sys
import warnings

MAX_SOURCE_BYTES = 4 << 20  # upstream's file is ~70 KiB

# The kinds of value a name or expression can hold.
UNKNOWN, ENTRY, PATCHER, INNER, ENTRIES, PATCHERS, ENUM_ENTRIES, ENUM_PATCHERS = range(8)
# What a generator of this module yields when its every yield is reached
# only where is_dynamic() returned True: iterating it runs the loop body
# only for dynamic patchers, so what the body reads is gated.
DYN_ENTRIES, DYN_PATCHERS = range(8, 10)

# free_memory's parameters the StandIn's scenarios cover (tests/comfyui and
# tests/py/test_comfy_stub.py, every upstream generation); a parameter
# beyond these is drift the report names.
FREE_MEMORY_KNOWN = ("memory_required", "device", "keep_loaded", "for_dynamic", "pins_required", "ram_required")
INNER_PREFIX = "model."  # a name read off the patcher's inner module: "model.<name>"

# How a member is used (bits; the JSON names them in this order).
READ, CALL, WRITE, PROBE = 1, 2, 4, 8
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

_PASSTHROUGH = frozenset(("sorted", "reversed", "list", "tuple", "set", "frozenset", "iter"))
_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_PY = "%d.%d" % sys.version_info[:2]
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SAME_OPS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


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
    from .. import _native
    return surface_of(_native.StandIn, _native.COMFY_SURFACE)


# ------------------------------------------------------------ the analysis


def _elem_of(k):
    return ENTRY if k in (ENTRIES, DYN_ENTRIES) else PATCHER if k in (PATCHERS, DYN_PATCHERS) else UNKNOWN


def _list_kind(k):
    return k in (ENTRIES, PATCHERS, DYN_ENTRIES, DYN_PATCHERS)


def _iter_kind(k):
    return k if k in (ENUM_ENTRIES, ENUM_PATCHERS) else _elem_of(k)


def _attr_kind(k, name, call):
    if k in (ENTRIES, PATCHERS, DYN_ENTRIES, DYN_PATCHERS):
        if call and name == "pop":
            return _elem_of(k)
        return k if call and name == "copy" else UNKNOWN
    if k == PATCHER:
        if not call and name == "model":
            return INNER
        if call and name in ("model_patches_models", "get_nested_additional_models"):
            return PATCHERS
        return UNKNOWN
    if k in (ENTRY, UNKNOWN):  # UNKNOWN: `<x>.model` is taken to be a ledger entry's
        return PATCHER if not call and name == "model" else UNKNOWN
    return UNKNOWN


def _is_chain(n):
    """A name followed by .attr, (call) and [subscript] trailers."""
    while True:
        if isinstance(n, ast.Name):
            return True
        if isinstance(n, (ast.Attribute, ast.Subscript)):
            n = n.value
        elif isinstance(n, ast.Call):
            n = n.func
        else:
            return False


def implies(n, pol):
    """Does ``n`` being True (pol) or False (not pol) guarantee that some
    ``<chain>.is_dynamic()`` returned True?"""
    if isinstance(n, ast.BoolOp):
        # `or` True / `and` False: every operand must; `or` False / `and` True: any.
        if isinstance(n.op, ast.Or) == bool(pol):
            return all(implies(v, pol) for v in n.values)
        return any(implies(v, pol) for v in n.values)
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
        return implies(n.operand, not pol)
    if (isinstance(n, ast.Call) and not n.args and not n.keywords and isinstance(n.func, ast.Attribute)
            and n.func.attr == "is_dynamic" and _is_chain(n.func.value)):
        return bool(pol)
    return False


def _shape_of(call):
    """(positional count, *args passed, **kwargs passed, keyword names)."""
    return (sum(not isinstance(a, ast.Starred) for a in call.args),
            any(isinstance(a, ast.Starred) for a in call.args),
            any(k.arg is None for k in call.keywords),
            tuple(k.arg for k in call.keywords if k.arg is not None))


def shape_text(name, shape):
    """``name(_, _, kw=..., **...)``"""
    positional, star, kwstar, keywords = shape
    parts = ["_"] * positional + (["*..."] if star else []) + [f"{k}=..." for k in keywords]
    return f"{name}({', '.join(parts + (['**...'] if kwstar else []))})"


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


class _Walk:
    """One pass over a module's AST in source order (see the module doc)."""

    def __init__(self):
        self.scopes = [{}]  # function scopes, innermost last: name -> kind
        self.comps = []     # comprehension scopes, innermost last
        self.events = []    # (position, name, how, gated, shape)
        self.yields = []    # per function being walked: [(kind, gated)] of its yields
        self.generators = {}  # generator function name -> the kind of its result (ENTRIES, DYN_PATCHERS, ...)
        self.free_memory = None  # (parameter names, line) of the module's free_memory
        self.compared = {}  # member name -> first line where two patchers' values are compared
        self.values_of = {}  # a name -> the members read off patchers in the value last assigned to it

    # ------------------------------------------------------- names

    def lookup(self, name):
        for scope in reversed(self.comps):
            if name in scope:
                return scope[name]
        k = self._bound(name)
        if k is not None:
            return k
        return ENTRIES if name == "current_loaded_models" else UNKNOWN

    def _bound(self, name):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def bind(self, name, kind):
        """Binds in the current function; an unknown value shadows only a
        known alias (so `current_loaded_models = []` keeps it ENTRIES)."""
        scope = self.scopes[-1]
        if name in scope or kind != UNKNOWN or self._bound(name) not in (None, UNKNOWN):
            scope[name] = kind

    def bind_names(self, target, bind=None):
        """Every plain name a target (tuple, list, starred) rebinds, as unknown."""
        bind = bind or self.bind
        if isinstance(target, ast.Name):
            bind(target.id, UNKNOWN)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for e in target.elts:
                self.bind_names(e, bind)
        elif isinstance(target, ast.Starred):
            self.bind_names(target.value, bind)

    def bind_target(self, target, k, bind):
        """A for target over values of kind k (ENUM_*: (index, value))."""
        enum = k in (ENUM_ENTRIES, ENUM_PATCHERS)
        if isinstance(target, ast.Name):
            bind(target.id, UNKNOWN if enum else k)
        elif (enum and isinstance(target, ast.Tuple) and len(target.elts) == 2
              and all(isinstance(e, ast.Name) for e in target.elts)):
            bind(target.elts[0].id, UNKNOWN)
            bind(target.elts[1].id, ENTRY if k == ENUM_ENTRIES else PATCHER)
        else:
            self.bind_names(target, bind)

    def use(self, name, node, how, gated, shape=None):
        if isinstance(node, ast.Attribute):  # where the member's name starts
            pos = (node.end_lineno, node.end_col_offset - len(node.attr))
        else:
            pos = (node.lineno, node.col_offset)
        self.events.append((pos, name, how, gated, shape))

    # -------------------------------------------------- statements

    def block(self, stmts, gated, loaded_model=False):
        rest = False  # an early exit gated the rest of the block
        for s in stmts:
            g = gated or rest
            if isinstance(s, ast.If):
                rest = self.if_chain(s, g) or rest
            else:
                self.stmt(s, g, loaded_model)

    def if_chain(self, node, g):
        """An if/elif.../else chain; returns whether the rest of the block
        is gated (an exiting branch whose condition False implies dynamic,
        every earlier branch exiting too)."""
        rest = False
        else_gated = False  # a later branch is reached only when dynamic
        all_exit = True
        cond_g = g
        while True:
            chain_ok = all_exit
            self.expr(node.test, cond_g)
            cf = implies(node.test, False)
            self.block(node.body, cond_g or implies(node.test, True))
            else_gated = else_gated or cf
            if not (node.body and isinstance(node.body[-1], _EXITS)):
                all_exit = False
            elif chain_ok and cf:
                rest = True
            orelse = node.orelse
            # `elif` is an If alone in orelse at the if's own column.
            if len(orelse) == 1 and isinstance(orelse[0], ast.If) and orelse[0].col_offset == node.col_offset:
                node = orelse[0]
                cond_g = g or rest or else_gated
                continue
            if orelse:
                self.block(orelse, g or rest or else_gated)
            return rest

    def function(self, node, g, loaded_model):
        for d in node.decorator_list:
            self.expr(d, g)
        a = node.args
        for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
            self.expr(d, g)
        if node.returns is not None:
            self.expr(node.returns, g)
        params = a.posonlyargs + a.args + ([a.vararg] if a.vararg else []) + a.kwonlyargs + (
            [a.kwarg] if a.kwarg else [])
        for p in params:
            if p.annotation is not None:
                self.expr(p.annotation, g)
        if node.name == "free_memory" and len(self.scopes) == 1:
            self.free_memory = ([p.arg for p in params], node.lineno)
        self.scopes.append({})
        self.yields.append([])
        role = {"load_models_gpu": PATCHERS, "unload_model_and_clones": PATCHER}.get(node.name)
        for i, p in enumerate(params):
            k = UNKNOWN
            if loaded_model and i == 0:
                k = ENTRY
            elif loaded_model and (p.arg == "model" or (node.name == "__init__" and i == 1)):
                k = PATCHER
            elif role is not None and i == 0:
                k = role
            self.bind(p.arg, k)
        self.block(node.body, False)
        self.scopes.pop()
        ys = self.yields.pop()
        kinds = {k for k, _ in ys}
        if ys and len(kinds) == 1 and kinds <= {ENTRY, PATCHER}:
            gated = all(gy for _, gy in ys)
            self.generators[node.name] = ((DYN_ENTRIES if gated else ENTRIES) if ENTRY in kinds
                                          else (DYN_PATCHERS if gated else PATCHERS))
        else:
            self.generators.pop(node.name, None)

    def stmt(self, s, g, loaded_model=False):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(s, g, loaded_model)
        elif isinstance(s, ast.ClassDef):
            for e in s.decorator_list + s.bases + [k.value for k in s.keywords]:
                self.expr(e, g)
            self.block(s.body, False, s.name == "LoadedModel")
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.expr(s.target, g)
            k = self.expr(s.iter, g)
            self.bind_target(s.target, _iter_kind(k), self.bind)
            self.block(s.body, g or k in (DYN_ENTRIES, DYN_PATCHERS))
            self.block(s.orelse, g)
        elif isinstance(s, ast.While):
            self.expr(s.test, g)
            self.block(s.body, g or implies(s.test, True))
            self.block(s.orelse, g)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                self.expr(item.context_expr, g)
                if item.optional_vars is not None:
                    self.expr(item.optional_vars, g)
                    self.bind_names(item.optional_vars)
            self.block(s.body, g)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            self.block(s.body, g)
            for h in s.handlers:
                if h.type is not None:
                    self.expr(h.type, g)
                if h.name:
                    self.bind(h.name, UNKNOWN)
                self.block(h.body, g)
            self.block(s.orelse, g)
            self.block(s.finalbody, g)
        elif type(s).__name__ == "Match":
            self.expr(s.subject, g)
            for case in s.cases:
                self.generic(case.pattern, g)
                if case.guard is not None:
                    self.expr(case.guard, g)
                self.block(case.body, g)
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                self.expr(t, g)
            first = len(self.events)
            k = self.expr(s.value, g)
            # `targets = [p.x] + [m.x for m in extras]`: the names the value
            # reads off patchers, for a later `q.x in targets`
            read = {e[1] for e in self.events[first:] if e[2] == READ}
            for t in s.targets:
                if isinstance(t, ast.Name):
                    self.bind(t.id, k)
                    self.values_of[t.id] = read
                else:
                    self.bind_names(t)
        elif isinstance(s, ast.AnnAssign):
            self.expr(s.target, g)
            self.expr(s.annotation, g)
            if s.value is not None:
                k = self.expr(s.value, g)
                if isinstance(s.target, ast.Name):
                    self.bind(s.target.id, k)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            for alias in s.names:
                if alias.asname:
                    self.bind(alias.asname, UNKNOWN)
        else:  # AugAssign, Expr, Return, Raise, Assert, Delete, ...: no bindings
            self.generic(s, g)

    # ------------------------------------------------- expressions

    def generic(self, node, g):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, g)
            elif not isinstance(child, (ast.expr_context, ast.stmt)):
                self.generic(child, g)

    def expr(self, n, g):
        """Records every member read off a patcher in n; returns n's kind."""
        if isinstance(n, ast.Name):
            return self.lookup(n.id)
        if isinstance(n, ast.Attribute):
            k = self.expr(n.value, g)
            if k in (PATCHER, INNER):
                self.use((INNER_PREFIX if k == INNER else "") + n.attr, n,
                         WRITE if isinstance(n.ctx, (ast.Store, ast.Del)) else READ, g)
            return _attr_kind(k, n.attr, False)
        if isinstance(n, (ast.Yield, ast.YieldFrom)):
            k = self.expr(n.value, g) if n.value is not None else UNKNOWN
            if self.yields:
                self.yields[-1].append((_elem_of(k) if isinstance(n, ast.YieldFrom) else k, g))
            return UNKNOWN
        if isinstance(n, ast.Call):
            return self.call(n, g)
        if isinstance(n, ast.Compare):
            self.compare(n, g)
            return UNKNOWN
        if isinstance(n, ast.Subscript):
            k = self.expr(n.value, g)
            self.expr(n.slice, g)
            s = n.slice
            is_slice = isinstance(s, ast.Slice) or (
                isinstance(s, ast.Tuple) and any(isinstance(e, ast.Slice) for e in s.elts))
            if is_slice:
                return k if _list_kind(k) else UNKNOWN
            return _elem_of(k)
        if isinstance(n, ast.BoolOp):
            acc = False
            for v in n.values:
                self.expr(v, g or acc)
                acc = acc or implies(v, isinstance(n.op, ast.And))
            return UNKNOWN
        if isinstance(n, ast.IfExp):
            self.expr(n.body, g or implies(n.test, True))
            self.expr(n.test, g)
            self.expr(n.orelse, g or implies(n.test, False))
            return UNKNOWN
        if isinstance(n, _COMPS):
            self.comprehension(n, g)
            return UNKNOWN
        if isinstance(n, ast.Lambda):
            a = n.args
            for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
                self.expr(d, g)
            self.scopes.append({})
            for p in a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]:
                self.bind(p.arg, UNKNOWN)
            self.expr(n.body, g)
            self.scopes.pop()
            return UNKNOWN
        if isinstance(n, ast.NamedExpr):
            k = self.expr(n.value, g)
            self.bind(n.target.id, k)
            return k
        self.generic(n, g)
        return UNKNOWN

    def compare(self, n, g):
        """A comparison, each operand walked as expr would.  A member is
        compared as an identity -- what tells two models apart, as
        upstream's clone_base_uuid -- in `a.x == b.x` (is, !=, is not: the
        same member of two patchers) and `p.x in xs` where xs was last
        assigned a value reading .x off patchers; the verdict checks that
        two stand-ins do not share it."""
        ops = [n.left] + n.comparators
        member = []   # per operand: the member read off a patcher, or None
        for v in ops:
            if isinstance(v, ast.Attribute):
                k = self.expr(v.value, g)
                if k in (PATCHER, INNER):
                    self.use((INNER_PREFIX if k == INNER else "") + v.attr, v, READ, g)
                member.append(v.attr if k == PATCHER else None)
            else:
                self.expr(v, g)
                member.append(None)
        for i, op in enumerate(n.ops):
            a, b, right = member[i], member[i + 1], ops[i + 1]
            if a is None:
                continue
            if isinstance(op, _SAME_OPS) and a == b:
                self.compared.setdefault(a, ops[i].lineno)
            elif (isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Name)
                  and a in self.values_of.get(right.id, ())):
                self.compared.setdefault(a, ops[i].lineno)

    def comprehension(self, n, g):
        scope = {}
        self.comps.append(scope)

        def bind(name, kind):
            scope[name] = kind

        filtered = False  # an `if` clause implied dynamic: what follows is gated
        for gen in n.generators:
            k = self.expr(gen.iter, g or filtered)
            self.expr(gen.target, g or filtered)
            self.bind_target(gen.target, _iter_kind(k), bind)
            filtered = filtered or k in (DYN_ENTRIES, DYN_PATCHERS)
            for c in gen.ifs:
                self.expr(c, g or filtered)
                filtered = filtered or implies(c, True)
        for part in ((n.key, n.value) if isinstance(n, ast.DictComp) else (n.elt,)):
            self.expr(part, g or filtered)
        self.comps.pop()

    def call(self, n, g, outer=None):
        """A call; ``outer`` is the call of its result (getattr(p, "x")(...))."""
        f = n.func
        base = None  # the method's object when it is a plain name: lst.append(x)
        if isinstance(f, ast.Attribute):
            k = self.expr(f.value, g)
            if k in (PATCHER, INNER):
                self.use((INNER_PREFIX if k == INNER else "") + f.attr, f, CALL, g, _shape_of(n))
            if isinstance(f.value, ast.Name):
                base = f.value.id
            kind = _attr_kind(k, f.attr, True)
        elif isinstance(f, ast.Call):
            self.call(f, g, outer=n)
            kind = UNKNOWN
        else:
            self.expr(f, g)
            kind = UNKNOWN
        kinds = []  # of the plain positional arguments
        for a in n.args:
            k = self.expr(a, g)
            if not isinstance(a, ast.Starred):
                kinds.append(k)
        for kw in n.keywords:
            self.expr(kw.value, g)
        arg = (lambda i: kinds[i] if i < len(kinds) else UNKNOWN)
        if isinstance(f, ast.Name) and self.lookup(f.id) == UNKNOWN:
            if f.id in self.generators:
                return self.generators[f.id]
            if f.id == "LoadedModel":
                return ENTRY
            if f.id == "enumerate":
                return {ENTRIES: ENUM_ENTRIES, PATCHERS: ENUM_PATCHERS}.get(arg(0), UNKNOWN)
            if f.id in _PASSTHROUGH:
                return arg(0) if _list_kind(arg(0)) else UNKNOWN
            if f.id in ("getattr", "hasattr"):
                self.probe(n, f.id, outer, kinds, g)
        if base is not None and f.attr in ("append", "add", "insert"):
            k = arg(1 if f.attr == "insert" else 0)
            if k in (ENTRY, PATCHER) and self.lookup(base) == UNKNOWN:
                self.bind(base, ENTRIES if k == ENTRY else PATCHERS)
        return kind

    def probe(self, n, fn, outer, kinds, g):
        """hasattr(p, "name") / getattr(p, "name"[, default]) on a patcher."""
        args = [a for a in n.args if not isinstance(a, ast.Starred)]
        if len(args) < 2 or kinds[0] != PATCHER:
            return
        s = args[1]
        if not (isinstance(s, ast.Constant) and isinstance(s.value, str) and s.value.isidentifier()):
            return
        if fn == "hasattr" or len(args) >= 3:
            self.use(s.value, s, PROBE, g)
        elif outer is not None:
            self.use(s.value, s, CALL, g, _shape_of(outer))
        else:
            self.use(s.value, s, READ, g)


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
    from .. import _native
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
    from .memory import standin_identity
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
    walk = _Walk()
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
    import json
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
