"""The canary's analyzer (python/bulkhead/cli/canary.py) on any source text,
by Hypothesis: a report (status 0 or 1, both renderings, valid JSON) or a
CanaryError, the one documented error, never anything else.  This replaces
the libFuzzer target the C analyzer had (gone with it); its seeds are the
examples below.
"""

import textwrap

import pytest

from test_canary_ast import FULL, GATING, LOAD_AND_FREE, LOADED_MODEL, PROBES, UNLOAD_CLONES, VOCAB, check_any

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (make check-py installs it)")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

FUZZ = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text())
@example("")
@example(LOAD_AND_FREE)
def test_any_text(source):
    check_any(source)


@FUZZ
@given(st.binary())
def test_any_bytes(source):
    check_any(source)


@FUZZ
@given(st.lists(st.sampled_from(VOCAB), max_size=120).map("".join))
def test_token_soup(source):
    check_any(source)


@FUZZ
@given(st.sampled_from([FULL, LOADED_MODEL, UNLOAD_CLONES, GATING, PROBES]),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10**6), st.integers(0, 60), st.characters()),
                min_size=1, max_size=8))
# The former fuzz target's seeds (fuzz/corpus/canary).
@example(textwrap.dedent("""\
    current_loaded_models = []

    def free_memory(memory_required, device):
        for i in range(len(current_loaded_models) - 1, -1, -1):
            lm = current_loaded_models[i]
            if lm.model.loaded_size() > 0 and lm.device == device:
                lm.model.detach(unpatch_all=False)
                lm.model_unload(memory_required)
    """), [(4, 0, 0, "x")])
@example(textwrap.dedent("""\
    def load_models_gpu(models, memory_required=0):
        for x in models:
            p = x.model
            if p.is_dynamic():
                p.partially_load(x.device, extra_memory=memory_required)
            else:
                p.model_patches_to(x.device)
        return [m for m in current_loaded_models if m.model is not None]
    """), [(4, 0, 0, "x")])
@example(textwrap.dedent('''\
    class LoadedModel:
        def __init__(self, model):
            self._model = model
            self.device = model.load_device
        def model_memory(self):
            return self.model.model_size()  # comment ( [ {
        def __repr__(self):
            return f"<{self.model.model!r} {'x'} {{}}>" + \'\'\'
            still a string (\'\'\'
    x = getattr(e.model, 'current_loaded_device', None)
    if hasattr(e.model, "memory_required"):
        e.model.memory_required(*args, **kwargs)
    '''), [(4, 0, 0, "x")])
def test_mutations(seed, edits):
    """The fixtures with 1-8 edits: a character flipped or inserted, a
    range deleted or duplicated (op 4: none)."""
    s = seed
    for op, at, n, ch in edits:
        at = at % (len(s) + 1)
        if op == 0:
            s = s[:at] + ch + s[at + 1:]
        elif op == 1:
            s = s[:at] + ch + s[at:]
        elif op == 2:
            s = s[:at] + s[at + n:]
        elif op == 3:
            s = s[:at] + s[at:at + n] + s[at:]
    check_any(s)
