"""StandIn, the C type bulkhead puts into ComfyUI's ledger: exactly the 18
members of COMFY_SURFACE, live residency from the shared ledger, arguments
obeyed exactly, eviction paths that never raise.

Here this test process plays the worker: it joins a ledger of its own and
publishes a model, and a recording owner stands in for the host runtime.
"""

import gc
import sys
import weakref

import pytest

import bulkhead
from bulkhead import _native

MiB = 1 << 20

SURFACE = {
    "load_device", "offload_device", "parent", "model", "model_size", "loaded_size",
    "current_loaded_device", "model_dtype", "model_patches_to", "model_patches_models",
    "partially_load", "partially_unload", "detach", "lowvram_patch_counter", "is_dynamic",
    "is_clone", "clone_base_uuid", "get_nested_additional_models",
}


class Owner:
    """Records what a stand-in forwards; releases by rewriting the model's
    residency in the ledger, as a worker's census would."""

    def __init__(self, ledger, size):
        self.ledger = ledger
        self.size = size
        self.resident = size
        self.log = []
        self.fail = None
        self.publish()

    def publish(self):
        self.ledger.set_model(7, "UNetModel", "cpu", self.size, self.resident)

    def standin_release(self, model_id, nbytes):
        self.log.append(("release", model_id, nbytes))
        if self.fail:
            raise self.fail
        self.resident = 0 if nbytes is None else max(0, self.resident - nbytes)
        self.publish()

    def standin_load(self, model_id, nbytes):
        self.log.append(("load", model_id, nbytes))
        self.resident = min(self.size, self.resident + nbytes)
        self.publish()
        return nbytes

    def standin_pressure(self, model_id, nbytes):
        self.log.append(("pressure", model_id, nbytes))


@pytest.fixture
def ledger(tmp_path):
    led = _native.Ledger(str(tmp_path / "ledger"))
    led.join("worker", pack="test-pack", interpreter="3.11.7", generation=1)
    yield led
    led.close()


@pytest.fixture
def made(ledger):
    import os
    owner = Owner(ledger, 100 * MiB)
    model = type("UNetModel", (_native.RemoteModel,), {})()
    s = _native.standin(owner, ledger, os.getpid(), 7, generation=1, name="UNetModel",
                        size_bytes=100 * MiB, model=model, load_device="cpu:load",
                        offload_device="cpu:offload", dtype="float16", clone_base_uuid="uuid-1")
    return s, owner


def test_surface_is_exactly_comfy_surface(made):
    s, _ = made
    assert set(_native.COMFY_SURFACE) == SURFACE and len(_native.COMFY_SURFACE) == 18
    public = {n for n in dir(s) if not n.startswith("__")}
    assert public == SURFACE
    for name in SURFACE:
        getattr(s, name)


def test_other_members_name_the_member_and_comfy_surface(made):
    s, _ = made
    with pytest.raises(AttributeError, match=r"'model_lowvram'.*COMFY_SURFACE"):
        s.model_lowvram
    with pytest.raises(AttributeError, match="COMFY_SURFACE"):
        s.patch_model()
    assert not hasattr(s, "model_state_dict")
    with pytest.raises(AttributeError, match="read-only"):
        s.load_device = "cuda"


def test_identity_members(made):
    s, _ = made
    assert s.is_clone(s) is True
    assert s.is_dynamic() is False
    assert s.parent is None
    assert s.load_device == "cpu:load" and s.offload_device == "cpu:offload"
    assert s.clone_base_uuid == "uuid-1" and s.model_dtype() == "float16"
    assert s.lowvram_patch_counter() == 0
    assert s.model_patches_models() == [] and s.get_nested_additional_models() == []
    assert s.model_patches_to("cpu") is None
    assert hash(s) == hash(s) and {s: 1}[s] == 1
    r = weakref.ref(s)
    assert r() is s
    m = weakref.ref(s.model)
    assert m() is s.model and type(s.model).__name__ == "UNetModel"

    class Other:
        model = s.model
    assert s.is_clone(Other()) is True
    assert s.is_clone(object()) is False


def test_residency_is_a_live_ledger_reading(made):
    s, owner = made
    assert s.model_size() == 100 * MiB and s.loaded_size() == 100 * MiB
    assert s.current_loaded_device() == "cpu:load"
    owner.resident = 30 * MiB  # the worker released on its own (idle sweep, another host)
    owner.publish()
    assert s.loaded_size() == 30 * MiB
    owner.resident = 0
    owner.publish()
    assert s.loaded_size() == 0 and s.current_loaded_device() == "cpu:offload"


def test_partially_unload_asks_exactly_n_and_returns_what_was_freed(made):
    s, owner = made
    assert s.partially_unload("cpu", 10 * MiB) == 10 * MiB
    assert owner.log == [("release", 7, 10 * MiB)]  # freed it all: no pressure
    owner.log.clear()
    assert s.partially_unload("cpu", 1.5) == 2  # a float: rounded up to whole bytes
    assert owner.log[-1] == ("release", 7, 2)
    owner.log.clear()
    assert s.partially_unload("cpu", 1e32) == 90 * MiB - 2  # never more than resident
    assert s.loaded_size() == 0
    owner.log.clear()
    assert s.partially_unload("cpu", 5 * MiB) == 0  # nothing resident: nothing sent
    assert owner.log == []


def test_what_the_worker_could_not_free_goes_to_the_pressure_hook(made):
    s, owner = made
    owner.release_cap = 4 * MiB
    real = owner.standin_release

    def capped(model_id, nbytes):
        owner.log.append(("release", model_id, nbytes))
        owner.resident -= min(nbytes, owner.release_cap)
        owner.publish()
    owner.standin_release = capped
    assert s.partially_unload("cpu", 10 * MiB) == 4 * MiB
    assert owner.log == [("release", 7, 10 * MiB), ("pressure", 7, 6 * MiB)]
    owner.standin_release = real


def test_partially_load_obeys_its_argument(made):
    s, owner = made
    owner.resident = 0
    owner.publish()
    assert s.partially_load("cpu", 0.1) == 0  # upstream's "essentially nothing"
    assert s.partially_load("cpu", 0) == 0
    assert owner.log == []
    assert s.partially_load("cpu", 4 * MiB + 0.5) == 4 * MiB
    assert s.partially_load("cpu", 1e32) == 96 * MiB
    assert owner.log == [("load", 7, 4 * MiB), ("load", 7, 96 * MiB)]
    assert s.partially_load("cpu", extra_memory=10**40) == 0  # an int beyond a double: all, none left


def test_detach(made):
    s, owner = made
    assert s.detach(unpatch_all=False) is s.model
    assert s.detach(False) is s.model
    assert owner.log == []  # bookkeeping: sends nothing
    assert s.detach() is s.model
    assert owner.log == [("release", 7, None)]
    assert s.loaded_size() == 0


def test_eviction_paths_never_raise(made):
    s, owner = made
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u)
    try:
        owner.fail = RuntimeError("worker went away badly")
        assert s.partially_unload("cpu", 10 * MiB) == 0
        assert s.detach() is s.model
    finally:
        sys.unraisablehook = old
    assert len(seen) == 2 and "worker went away badly" in str(seen[0].exc_value)
    assert owner.log[-2] == ("pressure", 7, 10 * MiB)  # nothing freed: all of it posted


def test_retired_standin_reads_zero_and_sends_nothing(made):
    s, owner = made
    _native.standin_retire(s)
    assert s.loaded_size() == 0 and s.model_size() == 100 * MiB
    assert s.partially_unload("cpu", 10 * MiB) == 0
    s.detach()
    assert s.partially_load("cpu", 1e32) == 0
    assert owner.log == []
    info = _native.standin_info(s)
    assert info["retired"] is True and info["model_id"] == 7


def test_retired_standin_drops_its_owner(ledger):
    """standin_retire's promise: the stand-in keeps no reference to its
    owner (a retired stand-in upstream still lists keeps no pool alive)."""
    import os
    import weakref
    owner = Owner(ledger, 100 * MiB)
    s = _native.standin(owner, ledger, os.getpid(), 7, generation=1, name="UNetModel",
                        size_bytes=100 * MiB, model=_native.RemoteModel(), load_device="cpu",
                        offload_device="cpu")
    assert _native.standin_info(s)["owner"] is owner
    gone = weakref.ref(owner)
    _native.standin_retire(s)
    del owner
    assert gone() is None  # freed by refcount alone, with no GC pass
    assert _native.standin_info(s)["owner"] is None
    assert s.partially_unload("cpu", 1e32) == 0 and s.partially_load("cpu", 1e32) == 0
    assert s.detach() is s.model


def test_record_gone_reads_zero(tmp_path):
    led = _native.Ledger(str(tmp_path / "ledger"))
    try:
        model = _native.RemoteModel()
        s = _native.standin(object(), led, 999999, 1, generation=1, name="X", size_bytes=5,
                            model=model, load_device="cpu", offload_device="cpu")
        assert s.loaded_size() == 0 and s.model_size() == 5
    finally:
        led.close()


def test_bad_construction(ledger):
    with pytest.raises(TypeError, match="RemoteModel"):
        _native.standin(object(), ledger, 1, 1, generation=1, name="X", size_bytes=5,
                        model=object(), load_device="cpu", offload_device="cpu")
    with pytest.raises(TypeError):
        _native.standin(object(), object(), 1, 1, generation=1, name="X", size_bytes=5,
                        model=_native.RemoteModel(), load_device="cpu", offload_device="cpu")
    with pytest.raises(ValueError, match="pid"):
        _native.standin(object(), ledger, 0, 1, generation=1, name="X", size_bytes=5,
                        model=_native.RemoteModel(), load_device="cpu", offload_device="cpu")


def test_no_leak_on_repeated_calls(made):
    import resource
    s, owner = made
    for _ in range(2000):
        s.loaded_size()
        s.partially_unload("cpu", 0.5)
        owner.resident = owner.size
        owner.publish()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(20000):
        s.loaded_size()
        s.model_size()
        s.partially_load("cpu", 0.1)
        s.detach(False)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 2048  # KiB


def test_methods_parse_as_their_text_signatures_say(made):
    """Each method's __text_signature__ (what inspect.signature and the
    canary read) is what its argument parsing obeys: the required
    arguments by position are accepted, one positional more or a keyword
    it does not name is refused."""
    import inspect
    s, owner = made
    values = {"device": "cpu", "device_to": "cpu", "other": s, "extra_memory": 0, "memory_to_free": 0,
              "unpatch_all": False, "force_patch_weights": False}
    checked = 0
    for name in _native.COMFY_SURFACE:
        if not callable(inspect.getattr_static(_native.StandIn, name)):
            continue
        params = list(inspect.signature(getattr(_native.StandIn, name)).parameters.values())[1:]
        method = getattr(s, name)
        every = [values[p.name] for p in params]
        method(*every)
        method(*[values[p.name] for p in params if p.default is inspect.Parameter.empty])
        with pytest.raises(TypeError):
            method(*every, None)
        with pytest.raises(TypeError):
            method(*every, not_a_parameter=1)
        for p in params:
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                method(**{q.name: values[q.name] for q in params})
            elif p.kind is inspect.Parameter.POSITIONAL_ONLY:
                with pytest.raises(TypeError):
                    method(**{p.name: values[p.name]})
        checked += 1
    assert checked == 13
    # Asked of the worker: only detach()'s default, unpatch_all=True (every
    # other call asked for 0 bytes or passed unpatch_all=False).
    assert owner.log == [("release", 7, None)]


def test_a_dead_workers_standin_reads_zero_before_any_reap(tmp_path):
    """The worker is SIGKILLed and not yet reaped (a zombie; its record is
    still in the ledger): its stand-in reads 0 resident at once (issue 14,
    fault 4), and its size stays what it was."""
    import os
    import signal
    import subprocess
    path = str(tmp_path / "ledger")
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys; from bulkhead import _native\n"
        f"led = _native.Ledger({path!r}); led.join('worker', pack='p', interpreter='3', generation=1)\n"
        f"led.set_model(7, 'UNetModel', 'cpu', {64 * MiB}, {64 * MiB})\n"
        "print('ready', flush=True); sys.stdin.read()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    led = _native.Ledger(path)
    try:
        assert child.stdout.readline().strip() == "ready"
        s = _native.standin(object(), led, child.pid, 7, generation=1, name="UNetModel",
                            size_bytes=64 * MiB, model=_native.RemoteModel(), load_device="cpu",
                            offload_device="cpu")
        assert s.loaded_size() == 64 * MiB
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)   # dead, not reaped
        assert s.loaded_size() == 0 and s.model_size() == 64 * MiB
        assert s.current_loaded_device() == "cpu"
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
        led.close()
