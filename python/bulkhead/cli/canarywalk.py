"""The canary's reading of upstream's comfy/model_management.py (cli/canary.py
is the verdict and the command): what the memory manager reads off a
ledger entry's patcher, and whether each read is gated behind
is_dynamic().

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
"""

import ast

# The kinds of value a name or expression can hold.
UNKNOWN, ENTRY, PATCHER, INNER, ENTRIES, PATCHERS, ENUM_ENTRIES, ENUM_PATCHERS = range(8)
# What a generator of this module yields when its every yield is reached
# only where is_dynamic() returned True: iterating it runs the loop body
# only for dynamic patchers, so what the body reads is gated.
DYN_ENTRIES, DYN_PATCHERS = range(8, 10)

INNER_PREFIX = "model."  # a name read off the patcher's inner module: "model.<name>"

# How a member is used (bits).
READ, CALL, WRITE, PROBE = 1, 2, 4, 8

_PASSTHROUGH = frozenset(("sorted", "reversed", "list", "tuple", "set", "frozenset", "iter"))
_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SAME_OPS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


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


class Walk:
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
