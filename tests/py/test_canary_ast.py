"""The canary's analyzer (python/bulkhead/cli/canary.py) in process: the
interface it derives from small model_management-like sources written here
(one per pattern upstream uses to read a ledger entry's patcher), the
is_dynamic() gating, call shapes against the StandIn's surface as the type
itself declares it, the verdicts a removed / renamed member or a new
keyword must produce, and any source text at all: a report or one of the
documented errors (CanaryError), never anything else (Hypothesis).

tests/py/test_canary.py runs the same analyzer as a program, through the C
`bulkhead canary` verb.
"""

import inspect
import json
import random
import textwrap

import pytest

from bulkhead import _native
from bulkhead.cli import canary
from bulkhead.cli.canary import ANSWERED, CALL, GATED, LACKING, NOT_MEMBER, PROBE, PROBED, READ

STANDIN = canary.standin_surface()

LOADED_MODEL = textwrap.dedent("""\
    import weakref
    current_loaded_models = []

    class LoadedModel:
        def __init__(self, model):
            self._set_model(model)
            self.device = model.load_device
            self.real_model = None

        def _set_model(self, model):
            self._model = weakref.ref(model)
            if model.parent is not None:
                self._parent_model = weakref.ref(model.parent)

        @property
        def model(self):
            return self._model()

        def model_memory(self):
            return self.model.model_size()

        def model_offloaded_memory(self):
            return self.model.model_size() - self.model.loaded_size()

        def model_memory_required(self, device):
            if device == self.model.current_loaded_device():
                return self.model_offloaded_memory()
            return self.model_memory()

        def model_load(self, lowvram_model_memory=0, force_patch_weights=False):
            self.model.model_patches_to(self.device)
            self.model.model_patches_to(self.model.model_dtype())
            self.model_use_more_vram(lowvram_model_memory, force_patch_weights=force_patch_weights)
            real_model = self.model.model
            self.real_model = weakref.ref(real_model)
            return real_model

        def should_reload_model(self, force_patch_weights=False):
            return force_patch_weights and self.model.lowvram_patch_counter() > 0

        def model_unload(self, memory_to_free=None, unpatch_weights=True):
            if memory_to_free is not None:
                if memory_to_free < self.model.loaded_size():
                    freed = self.model.partially_unload(self.model.offload_device, memory_to_free)
                    if freed >= memory_to_free:
                        return False
            self.model.detach(unpatch_weights)
            return True

        def model_use_more_vram(self, extra_memory, force_patch_weights=False):
            return self.model.partially_load(self.device, extra_memory, force_patch_weights=force_patch_weights)

        def __eq__(self, other):
            return self.model is other.model

""")

LOAD_AND_FREE = textwrap.dedent("""\
    def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False):
        can_unload = []
        for i in range(len(current_loaded_models) - 1, -1, -1):
            shift_model = current_loaded_models[i]
            if shift_model.device == device:
                can_unload.append((-shift_model.model_offloaded_memory(), i))
        for x in sorted(can_unload):
            i = x[-1]
            if current_loaded_models[i].model.is_dynamic() and for_dynamic:
                memory_required -= current_loaded_models[i].model.loaded_size()
                continue
            logging.debug(f"Unloading {current_loaded_models[i].model.model.__class__.__name__}")
            current_loaded_models[i].model_unload(memory_required)

    def load_models_gpu(models, memory_required=0, force_full_load=False):
        models_temp = set()
        for m in models:
            models_temp.add(m)
            for mm in m.model_patches_models():
                models_temp.add(mm)
        models = models_temp
        models_to_load = []
        for x in models:
            loaded_model = LoadedModel(x)
            if hasattr(x, "model"):
                logging.info(f"Requested to load {x.model.__class__.__name__}")
            models_to_load.append(loaded_model)
        for loaded_model in models_to_load:
            to_unload = []
            for i in range(len(current_loaded_models)):
                if loaded_model.model.is_clone(current_loaded_models[i].model):
                    to_unload = [i] + to_unload
            for i in to_unload:
                model_to_unload = current_loaded_models.pop(i)
                model_to_unload.model.detach(unpatch_all=False)
        for loaded_model in models_to_load:
            model = loaded_model.model
            torch_dev = model.load_device
            loaded_model.model_load(0.1)
            current_loaded_models.insert(0, loaded_model)

""")

UNLOAD_CLONES = textwrap.dedent("""\
    def unload_model_and_clones(model, unload_additional_models=True):
        extras = model.get_nested_additional_models() if unload_additional_models else []
        targets = [model.clone_base_uuid] + [m.clone_base_uuid for m in extras]
        keep_loaded = []
        for entry in current_loaded_models.copy():
            if entry.model is not None and entry.model.clone_base_uuid in targets:
                continue
            keep_loaded.append(entry)
        free_memory(1e30, model.load_device, keep_loaded)

""")

ALIASES = textwrap.dedent("""\
    def a():
        for x in current_loaded_models:
            m = x.model
            m.aliased_read
            m = None
            m.after_rebind
    def b():
        m.other_function
        p = current_loaded_models[0].model
        q = p
        q.alias_of_alias()
        n: LoadedModel = current_loaded_models[1]
        n.model.annotated_entry
        r, s = p, p
        r.tuple_target
        def inner():
            q.closure_read
        q.after_inner
""")

LOOPS = textwrap.dedent("""\
    def f():
        for x in current_loaded_models:
            x.model.loop_var
        for i, e in enumerate(current_loaded_models):
            e.model.enumerated
            i.model
        for e in reversed(current_loaded_models.copy()):
            e.model.reversed_copy
        sizes = [y.model.in_comprehension() for y in current_loaded_models]
        total = sum(z.model.in_generator for z in current_loaded_models[1:])
        e = current_loaded_models.pop(0)
        e.model.popped
        keep = []
        keep.append(current_loaded_models[0])
        for k in keep:
            k.model.appended
        for w in can_unload:
            w.not_an_entry
""")

GATING = textwrap.dedent("""\
    def f(device, for_dynamic):
        for entry in current_loaded_models:
            patcher = entry.model
            if patcher is None or not patcher.is_dynamic():
                continue
            patcher.after_early_exit()
        for i in range(len(current_loaded_models)):
            if current_loaded_models[i].model.is_dynamic() and for_dynamic:
                current_loaded_models[i].model.in_if_block()
            else:
                current_loaded_models[i].model.in_else()
            if not current_loaded_models[i].model.is_dynamic():
                current_loaded_models[i].model.in_not_block()
            else:
                current_loaded_models[i].model.in_else_of_not()
            p = current_loaded_models[i].model
            x = p.in_ternary() if p.is_dynamic() else p.ternary_else()
            y = p.is_dynamic() and p.after_and()
            z = [e.model.filtered() for e in current_loaded_models if e.model.is_dynamic()]
            if p.is_dynamic(): p.inline_body()
            if p.is_dynamic() or for_dynamic:
                p.in_or_block()
            if for_dynamic:
                pass
            elif not p.is_dynamic():
                return
            p.after_elif_exit()
            if for_dynamic:
                pass
            elif p.is_dynamic():
                p.in_elif()
            while (p.is_dynamic()):
                p.in_while()
            z = p.is_dynamic() or p.after_or()
            if not p.is_dynamic():
                return
            p.after_return()
""")

GATED_MEMBERS = textwrap.dedent("""\
    def f():
        for e in current_loaded_models:
            if e.model.is_dynamic():
                e.model.partially_unload_ram(5, subsets=1)
                e.model.detach(unpatch_all=False, hypothetical=True)
""")

CALL_SHAPES = textwrap.dedent("""\
    def f(device):
        for e in current_loaded_models:
            p = e.model
            p.detach()
            p.detach(False)
            p.detach(unpatch_all=False)
            p.partially_load(device, 1e32, force_patch_weights=True)
            p.partially_load(device_to=device, extra_memory=0.1)
            p.partially_unload(device, memory_to_free=5, force_patch_weights=False)
            p.is_clone(e.model)
            p.model_patches_to(device)
            p.detach(unpatch_all=False, unpatch_weights=True)
            p.partially_load(device, 1, False, 7)
            p.is_clone(other=e.model)
            p.partially_unload(memory_to_free=5)
            p.detach(True, unpatch_all=True)
            p.model_size(**kw)
            p.load_device(0)
            p.loaded_size
            p.offload_device = device
""")

STRINGS = (
    '"""current_loaded_models[0].model.in_docstring()"""\n'  # 1
    'def f():\n'  # 2
    '    # current_loaded_models[0].model.in_comment()\n'  # 3
    "    s = 'current_loaded_models[0].model.in_string()'\n"  # 4
    "    t = '''\n"  # 5
    "current_loaded_models[0].model.in_triple()'''\n"  # 6
    '    u = "{current_loaded_models[0].model.not_an_fstring}"\n'  # 7
    '    v = f"{{current_loaded_models[0].model.doubled_braces}}"\n'  # 8
    '    w = f"{current_loaded_models[0].model.in_field!r:>{current_loaded_models[0].model.in_spec}}"\n'  # 9
    "    x = f'''\n"  # 10
    '{current_loaded_models[0].model.in_triple_field(\n'  # 11
    "    1)}'''\n"  # 12
    '    y = 1 + \\\n'  # 13
    '        current_loaded_models[0].model.after_continuation\n'  # 14
    '    z = (current_loaded_models[0]\n'  # 15
    '         .model\n'  # 16
    '         .across_lines)\n'  # 17
)

PROBES = textwrap.dedent("""\
    def f():
        for e in current_loaded_models:
            if hasattr(e.model, 'pin_state'):
                pass
            g = getattr(e.model, "maybe", None)
            h = getattr(e.model, 'needed')
            getattr(e.model, 'detach')(unpatch_all=False)
            hasattr(e.model, 'load_device')
            e.model.load_device
""")

FULL = LOADED_MODEL + LOAD_AND_FREE + UNLOAD_CLONES


def analyze(source, without=(), surface=None):
    return canary.analyze(source, without, surface or STANDIN, path="mm.py")


def assert_name(r, name, cls, line=0):
    """The entry for name has class cls and its first use on line (0: any)."""
    assert name in r.names, f"{name}: not derived at all ({sorted(r.names)})"
    n = r.names[name]
    assert n.cls == cls, f"{name}: {canary.CLASS_KEYS[n.cls]}, expected {canary.CLASS_KEYS[cls]}"
    got = n.gated_line if cls == GATED else n.line
    assert not line or got == line, f"{name}: first use on line {got}, expected {line}"


def count(r, cls):
    return sum(n.cls == cls for n in r.names.values())


def change_for(r, name, why):
    for c in r.changes:
        if c.name == name and why in c.reason:
            return c
    raise AssertionError(f"no change for {name} with {why!r}: {[(c.name, c.reason) for c in r.changes]}")


# ------------------------------------------------------------ the surface


def test_surface_is_read_off_the_standin():
    """Names, kinds and signatures come from _native.StandIn itself."""
    assert list(STANDIN) == list(_native.COMFY_SURFACE)
    attributes = {n for n, m in STANDIN.items() if not m.is_call}
    assert attributes == {"load_device", "offload_device", "parent", "model", "clone_base_uuid"}
    sig = {n: str(m.signature) for n, m in STANDIN.items() if m.is_call}
    assert sig["detach"] == "(unpatch_all=True)"
    assert sig["is_clone"] == "(other, /)"
    assert sig["partially_load"] == "(device_to, extra_memory=0, force_patch_weights=False)"
    assert sig["partially_unload"] == "(device_to, memory_to_free=0, force_patch_weights=False)"
    assert sig["model_patches_to"] == "(device)"
    assert sig["model_size"] == sig["is_dynamic"] == sig["get_nested_additional_models"] == "()"
    assert STANDIN["detach"].text() == "detach(unpatch_all=True)"
    assert STANDIN["load_device"].text() == "load_device (an attribute)"


def fake_standin(**changes):
    """A type with the StandIn's members, some of them replaced."""
    ns = {n: inspect.getattr_static(_native.StandIn, n) for n in _native.COMFY_SURFACE}
    ns.update(changes)
    return canary.surface_of(type("FakeStandIn", (), ns), _native.COMFY_SURFACE)


def test_a_changed_signature_changes_the_verdict():
    """The verdict follows the type: the same source judged against a
    StandIn whose methods are declared otherwise."""
    assert analyze(FULL).status == 0
    # detach() without unpatch_all: upstream's calls no longer fit.
    r = analyze(FULL, surface=fake_standin(detach=lambda self: None))
    assert r.status == 1
    assert change_for(r, "detach", "1 positional argument; the StandIn takes detach()").line == 47
    assert change_for(r, "detach", "keyword unpatch_all= is not accepted").line == 90
    # A new keyword upstream passes is fine once the type takes it.
    source = FULL.replace("detach(unpatch_all=False)", "detach(unpatch_all=False, keep_pins=True)")
    assert change_for(analyze(source), "detach", "keyword keep_pins=")
    assert analyze(source, surface=fake_standin(
        detach=lambda self, unpatch_all=True, keep_pins=False: None)).status == 0
    # An attribute turned method, a method turned attribute.
    r = analyze(FULL, surface=fake_standin(load_device=lambda self: None, model_size=property(lambda s: 0)))
    assert change_for(r, "load_device", "read without a call, but the StandIn's is a method: load_device()")
    assert change_for(r, "model_size", "called, but the StandIn's model_size (an attribute)")
    # A member the type drops is lacking.
    ns = {n: inspect.getattr_static(_native.StandIn, n) for n in _native.COMFY_SURFACE if n != "is_clone"}
    names = [n for n in _native.COMFY_SURFACE if n != "is_clone"]
    r = analyze(FULL, surface=canary.surface_of(type("Smaller", (), ns), names))
    assert_name(r, "is_clone", LACKING, 86)


def test_surface_of_refuses_a_type_without_the_member():
    with pytest.raises(ValueError, match="no member 'detach'"):
        canary.surface_of(type("Empty", (), {}), ["detach"])


# ---------------------------------------------------- derived patterns


def test_direct_model_access():
    """LoadedModel's self.model.<name>, incl. the parameter reads in
    __init__ and _set_model; the inner module is not a member."""
    r = analyze(LOADED_MODEL)
    for name, line in [("load_device", 7), ("parent", 12), ("model_size", 20), ("loaded_size", 23),
                       ("current_loaded_device", 26), ("model_patches_to", 31), ("model_dtype", 32),
                       ("lowvram_patch_counter", 39), ("partially_unload", 44), ("offload_device", 44),
                       ("detach", 47), ("partially_load", 51)]:
        assert_name(r, name, ANSWERED, line)
    assert_name(r, "model", NOT_MEMBER, 34)
    assert "inner module" in r.names["model"].why
    # LoadedModel's own members and the entry's weakref are not the patcher's.
    for absent in ("_model", "model_offloaded_memory", "device", "ref"):
        assert absent not in r.names
    # Call shapes as written.
    pl = r.names["partially_load"]
    assert [s for s, _ in pl.shapes] == [(2, False, False, ("force_patch_weights",))]
    assert pl.uses == CALL
    assert r.names["offload_device"].uses == READ
    assert r.changes == [] and r.status == 0
    assert "is_clone" in r.unread
    # A dunder read off the patcher itself is not a member either.
    r = analyze("p = current_loaded_models[0].model\nname = p.__class__.__name__\n")
    assert_name(r, "__class__", NOT_MEMBER, 2)
    assert r.status == 0


def test_alias_through_local():
    """model = x.model, then model.<name>: within its function only, and
    until rebound."""
    r = analyze(ALIASES)
    for name, line in [("aliased_read", 4), ("alias_of_alias", 11), ("annotated_entry", 13),
                       ("closure_read", 17), ("after_inner", 18)]:
        assert_name(r, name, LACKING, line)
    for absent in ("after_rebind", "other_function", "tuple_target"):
        assert absent not in r.names
    assert r.status == 1


def test_loop_variable():
    """Entries from current_loaded_models: loop variables, enumerate,
    sorted, subscripts, pop, copy, comprehensions, appended lists."""
    r = analyze(LOOPS)
    for name, line in [("loop_var", 3), ("enumerated", 5), ("reversed_copy", 8), ("in_comprehension", 9),
                       ("in_generator", 10), ("popped", 12), ("appended", 16)]:
        assert_name(r, name, LACKING, line)
    assert "not_an_entry" not in r.names
    assert len(r.names) == 7


def test_incoming_models():
    """load_models_gpu: members read off the incoming models, off
    loaded_model.model and through the alias; x.model there is the inner
    module, and hasattr(x, "model") a probe."""
    r = analyze(LOADED_MODEL + LOAD_AND_FREE)
    assert_name(r, "model_patches_models", ANSWERED, 74)
    assert_name(r, "is_clone", ANSWERED, 86)
    assert [s for s, _ in r.names["is_clone"].shapes] == [(1, False, False, ())]
    d = r.names["detach"]
    assert len(d.shapes) == 2  # detach(unpatch_weights), detach(unpatch_all=False)
    assert d.shapes[1] == [(0, False, False, ("unpatch_all",)), 90]
    assert_name(r, "load_device", ANSWERED, 7)
    assert r.names["load_device"].uses == READ
    # Only through the alias in load_models_gpu (55 lines fewer than in FULL):
    r = analyze(LOAD_AND_FREE)
    assert_name(r, "load_device", ANSWERED, 93 - 55)
    assert_name(r, "is_dynamic", ANSWERED, 64 - 55)
    assert "__class__" not in r.names  # read off the inner module, not the patcher
    assert_name(r, "model", NOT_MEMBER, 67 - 55)
    assert r.names["model"].uses == READ | PROBE
    assert r.status == 0
    # A member read off an incoming model the StandIn lacks.
    r = analyze("def load_models_gpu(requested, memory_required=0):\n"
                "    for m in requested:\n"
                "        if m.wants_pins():\n"
                "            pass\n")
    assert_name(r, "wants_pins", LACKING, 3)
    assert r.status == 1


def test_unload_model_and_clones():
    r = analyze(UNLOAD_CLONES)
    assert_name(r, "get_nested_additional_models", ANSWERED, 2)
    assert_name(r, "clone_base_uuid", ANSWERED, 3)
    assert_name(r, "load_device", ANSWERED, 9)
    r = analyze(FULL)
    assert_name(r, "get_nested_additional_models", ANSWERED, 98)
    assert_name(r, "clone_base_uuid", ANSWERED, 99)
    # Everything the StandIn answers is read in FULL; it covers it all.
    assert r.unread == [] and count(r, ANSWERED) == 17 and count(r, LACKING) == 0
    assert r.changes == [] and r.status == 0
    text = canary.to_text(r, "mm.py")
    assert "OK: the StandIn answers every member" in text and "mm.py:98" in text


def test_a_member_compared_between_patchers_is_checked_per_model():
    """#24 L7: upstream tells models apart by clone_base_uuid (compared
    with `in`, `==`, `is`); the canary checks what the host gives two
    stand-ins (memory.standin_identity), not only that the member exists."""
    r = analyze(UNLOAD_CLONES)
    assert r.compared == {"clone_base_uuid": 6} and r.shared == [] and r.status == 0
    assert "each stand-in its own" in canary.to_text(r, "mm.py")
    assert '"compared": [\n    {"name": "clone_base_uuid", "line": 6, "per_model": true}' \
        in canary.to_json(r, "mm.py")
    same = "x"
    for identity, what in ((lambda: {}, "no stand-in a clone_base_uuid of its own"),
                           (lambda: {"clone_base_uuid": None}, "share its value (None)"),
                           (lambda: {"clone_base_uuid": same}, "share its value ('x')")):
        r = canary.analyze(UNLOAD_CLONES, (), STANDIN, path="mm.py", identity=identity)
        assert r.status == 1 and [c.name for c in r.shared] == ["clone_base_uuid"]
        assert what in r.shared[0].reason and r.shared[0].line == 6
        text = canary.to_text(r, "mm.py")
        assert "shared between stand-ins" in text
        assert "FAIL: stand-ins share what upstream compares: clone_base_uuid" in text
        assert '"per_model": false' in canary.to_json(r, "mm.py")
    # the same member of two patchers (==, !=, is, is not), or one in a
    # list of them; a member beside a constant or another member is not
    r = analyze("def f():\n    x = current_loaded_models[0].model\n    y = current_loaded_models[1].model\n"
                "    if x.clone_base_uuid != y.clone_base_uuid: pass\n"
                "    if x.load_device is not y.offload_device and x.parent is not None: pass\n"
                "    devs = [m.model.load_device for m in current_loaded_models]\n"
                "    return x.model_size() > 0 and x.load_device in devs and x.parent in (None, 1)\n")
    assert r.compared == {"clone_base_uuid": 4, "load_device": 7}
    # load_device is the same for two stand-ins on one device: a host whose
    # stand-ins share it is refused only where upstream compares it that way
    assert [c.name for c in canary.analyze("def f():\n    q = current_loaded_models[0].model\n"
                                           "    p = current_loaded_models[1].model\n"
                                           "    return q.load_device == p.load_device\n", (), STANDIN,
                                           identity=lambda: {}).shared] == ["load_device"]


def test_is_dynamic_gating():
    """Reads reached only when is_dynamic() is True are gated; every other
    shape of condition is not."""
    r = analyze(GATING)
    assert_name(r, "is_dynamic", ANSWERED, 4)
    gated = [("after_early_exit", 6), ("in_if_block", 9), ("in_else_of_not", 15), ("in_ternary", 17),
             ("after_and", 18), ("filtered", 19), ("inline_body", 20), ("in_elif", 31), ("in_while", 33),
             ("after_return", 37)]
    lacking = [("in_else", 11), ("in_not_block", 13), ("ternary_else", 17), ("in_or_block", 22),
               ("after_elif_exit", 27), ("after_or", 34)]
    for name, line in gated:
        assert_name(r, name, GATED, line)
    for name, line in lacking:
        assert_name(r, name, LACKING, line)
    assert count(r, GATED) == 10 and count(r, LACKING) == 6
    # A gated read of a member the StandIn has is listed but changes
    # nothing; one it lacks does not fail the check.
    r = analyze(GATED_MEMBERS)
    assert_name(r, "partially_unload_ram", GATED, 4)
    assert_name(r, "detach", GATED, 5)
    assert r.changes == [] and r.status == 0
    assert "detach" in r.unread


GENERATORS = textwrap.dedent("""\
    def dynamic_ones(active):
        for entry in current_loaded_models:
            patcher = entry.model
            if patcher is None or not patcher.is_dynamic():
                continue
            state = patcher.model.dynamic_pins[patcher.load_device]
            yield patcher
    def every_one():
        for entry in current_loaded_models:
            yield entry.model
    def free_pins(size):
        for patcher in dynamic_ones(True):
            patcher.partially_unload_ram(size)
        for patcher in every_one():
            patcher.read_on_all()
        names = [p.in_comprehension for p in dynamic_ones(None)]
        for i, p in enumerate(current_loaded_models):
            p.model.model.eval()
""")


def test_what_a_generator_yields_is_a_patcher_and_its_gating_goes_with_it():
    """#24 L7: members read on patchers a generator of the module yields
    (upstream's models_for_pin_eviction) are seen; when its every yield
    is reached only past is_dynamic(), what a loop over it reads is gated
    (main saw none of them).  Reads off the patcher's inner module
    (.model.<name>: dynamic_pins) are listed in a class of their own,
    answered or not by the StandIn's RemoteModel, and fail nothing."""
    r = analyze(GENERATORS)
    assert_name(r, "partially_unload_ram", GATED, 13)
    assert_name(r, "in_comprehension", GATED, 16)
    assert_name(r, "read_on_all", LACKING, 15)
    assert_name(r, "model.dynamic_pins", GATED, 6)
    assert_name(r, "model.eval", canary.INNER_READ, 18)
    assert not r.names["model.eval"].in_surface
    assert r.status == 1 and [n.name for n in r.names.values() if n.cls == LACKING] == ["read_on_all"]
    text = canary.to_text(r, "mm.py")
    assert "model.dynamic_pins" in text and "model.eval" in text and "the StandIn lacks read_on_all" in text


def test_free_memory_parameters_are_named_and_new_ones_fail():
    """#24 L7: the report names free_memory's parameters; one the StandIn's
    eviction scenarios do not cover fails the check, named."""
    r = analyze("def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False,\n"
                "                pins_required=0, ram_required=0):\n    pass\n")
    assert r.free_memory == (list(canary.FREE_MEMORY_KNOWN), 1) and r.free_memory_new == [] and r.status == 0
    r = analyze("def free_memory(memory_required, device, keep_loaded=[], vram_budget=None):\n    pass\n")
    assert r.free_memory_new == ["vram_budget"] and r.status == 1
    text = canary.to_text(r, "mm.py")
    assert "free_memory(memory_required, device, keep_loaded, vram_budget)  mm.py:1" in text
    assert "FAIL: free_memory takes new parameters: vram_budget" in text, text
    doc = json.loads(canary.to_json(r, "mm.py"))
    assert doc["free_memory"] == {"line": 1, "parameters": ["memory_required", "device", "keep_loaded",
                                                            "vram_budget"], "new": ["vram_budget"]}


def test_exiting_else_and_nested_if_gate_nothing_outside():
    """An `else:` holding an if is not an elif: its early exit gates the
    rest of the else block only."""
    r = analyze("def f(p, x):\n"
                "    if x:\n"
                "        return\n"
                "    else:\n"
                "        if not p.model.is_dynamic():\n"
                "            return\n"
                "        p.model.inside_else()\n"
                "    p.model.after_chain()\n")
    assert_name(r, "inside_else", GATED, 7)
    assert_name(r, "after_chain", LACKING, 8)


def test_keyword_call_shapes():
    """Calls against the surface: what the StandIn accepts, and every way
    a shape can change."""
    r = analyze(CALL_SHAPES)
    c = change_for(r, "detach", "keyword unpatch_weights= is not accepted")
    assert c.line == 12 and c.shape == "detach(unpatch_all=..., unpatch_weights=...)"
    assert "detach(unpatch_all=True)" in c.reason
    assert change_for(r, "partially_load", "4 positional arguments").line == 13
    assert change_for(r, "is_clone", "keyword other= is not accepted").line == 14
    assert change_for(r, "partially_unload", "argument device_to is missing").line == 15
    assert change_for(r, "detach", "given twice").line == 16
    assert change_for(r, "model_size", "cannot check").line == 17
    assert change_for(r, "load_device", "called, but").line == 18
    assert change_for(r, "loaded_size", "read without a call").line == 19
    assert change_for(r, "offload_device", "read-only").line == 20
    assert len(r.changes) == 9
    assert [c.line for c in r.changes] == sorted(c.line for c in r.changes)
    assert count(r, LACKING) == 0 and r.status == 1
    text = canary.to_text(r, "mm.py")
    assert "changed call shapes (9):" in text and "mm.py:12" in text and "FAIL:" in text


def test_removed_member():
    """Issue 6: on a fixture with a removed member the canary fails naming
    it (removed from the StandIn with --without)."""
    r = analyze(FULL, ["detach", "is_clone"])
    assert_name(r, "detach", LACKING, 47)
    assert_name(r, "is_clone", LACKING, 86)
    assert count(r, LACKING) == 2
    assert r.changes == []  # shapes are checked only for what it answers
    assert r.without == ["detach", "is_clone"] and r.status == 1
    text = canary.to_text(r, "mm.py")
    assert "FAIL: the StandIn lacks detach is_clone" in text
    assert "left out with --without: detach is_clone" in text
    doc = canary.to_json(r, "mm.py")
    assert '"ok": false' in doc and '"without": ["detach", "is_clone"]' in doc
    assert '{"name": "detach", "line": 47' in doc
    # Without the inner module's member, `.model.model` is lacking too.
    assert_name(analyze(FULL, ["model"]), "model", LACKING, 34)
    with pytest.raises(ValueError, match="no_such_member: the StandIn has no member"):
        analyze("x", ["no_such_member"])


def test_renamed_member():
    """Issue 6: a renamed member fails naming the new name (and the old one
    shows as no longer read)."""
    r = analyze(FULL.replace("loaded_size(", "resident_sz("))
    assert_name(r, "resident_sz", LACKING, 23)
    assert "loaded_size" not in r.names and "loaded_size" in r.unread
    assert count(r, LACKING) == 1 and r.status == 1
    assert "FAIL: the StandIn lacks resident_sz" in canary.to_text(r, "mm.py")


def test_new_keyword():
    """Issue 6: a new keyword is a changed call shape."""
    r = analyze(LOADED_MODEL + "def unload(e):\n"
                "    e.model.partially_unload(e.model.offload_device, 5, force_patch_weights=True, ram_only=True)\n")
    c = change_for(r, "partially_unload", "keyword ram_only= is not accepted")
    assert c.line == 57 and c.shape == "partially_unload(_, _, force_patch_weights=..., ram_only=...)"
    assert len(r.changes) == 1 and count(r, LACKING) == 0 and r.status == 1
    doc = canary.to_json(r, "mm.py")
    assert '"changed": [\n    {"name": "partially_unload", "line": 57' in doc
    assert json.loads(doc)["changed"][0]["call"] == c.shape


def test_strings_and_comments():
    """Comments, strings and docstrings are not code; f-string fields are,
    and so are continuations and chains across lines."""
    r = analyze(STRINGS)
    for name, line in [("in_field", 9), ("in_spec", 9), ("in_triple_field", 11), ("after_continuation", 14),
                       ("across_lines", 17)]:
        assert_name(r, name, LACKING, line)
    assert len(r.names) == 5


def test_probes():
    """hasattr / getattr with a default are probes; getattr without one is
    a read (or, called, a call)."""
    r = analyze(PROBES)
    assert_name(r, "pin_state", PROBED)
    assert_name(r, "maybe", PROBED)
    assert_name(r, "needed", LACKING, 6)
    assert_name(r, "detach", ANSWERED, 7)
    assert_name(r, "load_device", ANSWERED, 9)
    assert r.names["load_device"].uses == READ | PROBE
    assert r.names["detach"].shapes == [[(0, False, False, ("unpatch_all",)), 7]]
    assert count(r, PROBED) == 2 and r.changes == []
    assert "probed only" in canary.to_text(r, "mm.py")


def test_writes_and_walrus():
    r = analyze("def f():\n"
                "    for e in current_loaded_models:\n"
                "        e.model.offload_device = 1\n"
                "        e.model.new_flag += 1\n"
                "        if (p := e.model) is not None:\n"
                "            p.walrus_read\n")
    assert change_for(r, "offload_device", "read-only").line == 3
    assert r.names["new_flag"].uses & canary.WRITE
    assert_name(r, "walrus_read", LACKING, 6)


# ------------------------------------------------------ any source text

# Inputs the C tokenizer once had to survive; to ast they are not Python.
NOT_PYTHON = ["x = 'abc\ny = 1\n", "x = '''abc\n", "x = f'{a\ny\n", 'f"{', "\\", "'", "(((", ")))",
              "def f(:\n", "x = 1\n\0\n", b"x = '\xff'\n", "if x:\n\tpass\n        pass\n"]


@pytest.mark.parametrize("source", NOT_PYTHON)
def test_not_python_is_a_canary_error(source):
    with pytest.raises(canary.CanaryError, match="not Python") as e:
        analyze(source)
    assert e.value.errno is None


def check_any(source):
    """A report (status 0 or 1, both renderings, valid JSON) or a
    CanaryError: nothing else."""
    try:
        r = analyze(source)
    except canary.CanaryError as e:
        assert str(e)
        return None
    assert r.status in (0, 1)
    canary.to_text(r, "fuzz.py")
    assert json.loads(canary.to_json(r, "fuzz.py"))["status"] == r.status
    return r


# Python-shaped token soup: reaches the walker, the gating and the chains
# far more often than random text.
VOCAB = ["current_loaded_models", ".", "model", "is_dynamic", "(", ")", "[", "]", "{", "}", "if ", "not ",
         " and ", " or ", "else", "elif ", "for ", " in ", ":", "\n", "    ", "        ", "return", "continue",
         'f"{', '}"', "f'{", "'", '"', "'''", " = ", ",", "x", "e", "p", "def ", "current_loaded_models[0].model",
         "e.model", ".model.", "p = e.model\n", "for e in current_loaded_models:\n", ".detach(", ".loaded_size()",
         "x.model.is_dynamic()", "p.", "e.model.partially_load(", "extra_memory=",
         "def load_models_gpu(models):\n", "for m in models:\n", "m.", "load_models_gpu",
         "unload_model_and_clones", "class LoadedModel", "self", "lambda ", "\\\n", "#", "detach",
         "unpatch_all=", "*", "**", "LoadedModel(", "enumerate(", "sorted(", ".append(", ".pop(", "getattr(",
         "hasattr(", "!r", "while ", ";", " as ", "0", "1e32", "yield ", "\t", "\r\n", "@", "async ", " if ",
         " else ", ":=", "match ", "case "]

# The deep-nesting units: prefix repeated, middle once, suffix repeated.
DEEP = [("(", "current_loaded_models[0].model.deep()", ")"), ("(", "", ""), ('f"{', "x", '}"'),
        ("f'{x:{", "y", "}}'"), ("not ", "current_loaded_models[0].model.is_dynamic()", ""),
        ("a if current_loaded_models[0].model.is_dynamic() else ", "b", ""),
        ("if x: ", "current_loaded_models[0].model.inline()", ""), ("sorted(", "current_loaded_models", ")"),
        ("[y for y in ", "current_loaded_models", "]"),
        ("current_loaded_models[0].model.is_dynamic() and ", "x", ""), ("x", ".model", ""),
        ("lambda: ", "x", ""), ("\\\n", "x", ""), ("x.model.", "y", ".z"), ("-", "x", "")]


@pytest.mark.parametrize("prefix,middle,suffix", DEEP, ids=[d[0].strip() or repr(d[0]) for d in DEEP])
def test_deep_nesting(prefix, middle, suffix):
    """No recursion follows nesting unbounded: a report or a CanaryError."""
    for reps in (10, 150, 20000):
        check_any(prefix * reps + middle + suffix * reps + "\n")


def test_line_mutations_of_the_fixtures():
    """The fixtures with lines deleted, duplicated and swapped: most still
    parse, and every one that does gives a report."""
    rnd = random.Random(13)
    reports = 0
    for i in range(300):
        lines = rnd.choice([FULL, LOADED_MODEL, UNLOAD_CLONES, GATING]).splitlines(True)
        for _ in range(rnd.randint(1, 6)):
            a, b = rnd.randrange(len(lines)), rnd.randrange(len(lines))
            op = rnd.randrange(3)
            if op == 0:
                del lines[a]
            elif op == 1:
                lines.insert(a, lines[b])
            else:
                lines[a], lines[b] = lines[b], lines[a]
            if not lines:
                lines = ["\n"]
        reports += check_any("".join(lines)) is not None
    assert reports > 30
