"""Isolated node packs as ComfyUI sees them: proxy classes, metadata cache,
object handles, fallback, and (with torch) progress, interrupt, OOM, flag
and folder mirroring and logging.

Example packs are written into tmp dirs.  The first group runs the host
in this process (no ComfyUI here: a tmp directory stands for its base) and
the packs' workers under other interpreters; the torch group runs each
scenario as a fresh ComfyUI-shaped host (tests/comfyui, or the checkout
named by COMFYUI_PATH) with workers under the project venv's python.
"""

import enum
import gc
import importlib.util
import inspect
import json
import logging
import os
import sys
import textwrap
import time

import pytest

import bulkhead
from bulkhead.channel import targets
from bulkhead.host import metadata, nodes, runtime, states
from comfyenv import run_comfy_script
from conftest import WORKER_VENVS, other_interpreter
from nodepacks import LOAD_PACK_INIT, import_real, write_pack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(ROOT, "build", "rel")))


# A pack with every attribute ComfyUI reads, a model that cannot cross,
# a relative import, and the "any type" trick.
FULL_PACK = {
    "__init__.py": LOAD_PACK_INIT,
    "util.py": "def double(x):\n    return 2 * x\n",
    "nodes.py": '''
import enum, os, sys
from .util import double


class AnyType(str):
    def __ne__(self, other):
        return False


class Kind(enum.Enum):
    A = "a"


class Model:
    """A MODEL-like object: cannot cross to the host."""
    def __init__(self, size):
        self.size = size
        self.pid = os.getpid()
        self.calls = 0


class MakeModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"size": ("INT", {"default": 3, "min": 1, "max": 64}),
                             "kind": (["a", "b"], {"default": "a"})},
                "optional": {"anything": (AnyType("*"), {"forceInput": True})},
                "hidden": {"unique_id": "UNIQUE_ID"}}
    RETURN_TYPES = ("MODEL", "INT")
    RETURN_NAMES = ("model", "doubled")
    FUNCTION = "make"
    CATEGORY = "bulkhead/test"
    DESCRIPTION = "Makes a model that stays in the worker."
    OUTPUT_TOOLTIPS = ("the model", "twice the size")

    def make(self, size, kind="a", anything=None, unique_id=None):
        return (Model(size), double(size))

    @classmethod
    def VALIDATE_INPUTS(cls, size, input_types=None):
        return True if size <= 64 else "size must be at most 64"

    @classmethod
    def IS_CHANGED(cls, size, **kwargs):
        return f"size={size}"


class UseModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "add": ("INT", {"default": 0, "lazy": True})}}
    RETURN_TYPES = ("INT", "INT", "STRING")
    RETURN_NAMES = ("size", "pid", "python")
    FUNCTION = "use"
    OUTPUT_NODE = True
    INPUT_IS_LIST = False
    OUTPUT_IS_LIST = (False, False, False)

    def __init__(self):
        self.runs = 0

    def check_lazy_status(self, model=None, add=None):
        return ["add"] if add is None else []

    def use(self, model, add=0):
        self.runs += 1
        model.calls += 1
        return (model.size + add, model.pid, "%d.%d" % sys.version_info[:2])


class Counter:
    """Keeps state on its instance, as ComfyUI node objects may."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "count"

    def __init__(self):
        self.n = 0

    def count(self):
        self.n += 1
        return (self.n,)


class Odd:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"t": (int,), "k": (["x"], {"default": Kind.A}),
                             "o": ("STRING", {"default": object()})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"

    def run(self, **kw):
        return (repr(kw),)


class Lists:
    @classmethod
    def INPUT_TYPES(cls):
        import folder_paths
        return {"required": {"ckpt": (folder_paths.get_filename_list("checkpoints"),),
                             "fixed": (["one", "two"],)}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"

    def run(self, ckpt, fixed):
        return (ckpt,)


class Show:
    """An output node answering with a UI payload."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"multiline": True})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "show"
    OUTPUT_NODE = True

    def show(self, text):
        return {"ui": {"text": [text]}, "result": (text.upper(),)}


class Broken:
    @classmethod
    def INPUT_TYPES(cls):
        raise RuntimeError("INPUT_TYPES is broken")
    RETURN_TYPES = ()
    FUNCTION = "run"


NODE_CLASS_MAPPINGS = {"MakeModel": MakeModel, "UseModel": UseModel, "Counter": Counter,
                       "Odd": Odd, "Lists": Lists, "Show": Show, "Broken": Broken}
NODE_DISPLAY_NAME_MAPPINGS = {"MakeModel": "Make a model", "UseModel": "Use a model"}
''',
}

OTHER_PACK = {
    "__init__.py": LOAD_PACK_INIT,
    "nodes.py": '''
import sys


class Version:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "optional": {"model": ("MODEL",)}}
    RETURN_TYPES = ("STRING", "STRING")
    FUNCTION = "run"

    def run(self, model=None):
        import numpy
        return ("%d.%d" % sys.version_info[:2], numpy.__version__)


NODE_CLASS_MAPPINGS = {"Version": Version}
''',
}

# ComfyUI's top-level folder_paths, as small as load_pack's mirroring needs.
FOLDER_PATHS = '''
import os
base_path = os.path.dirname(os.path.realpath(__file__))
models_dir = os.path.join(base_path, "models")
folder_names_and_paths = {"checkpoints": ([os.path.join(models_dir, "checkpoints")], {".safetensors"})}
output_directory = os.path.join(base_path, "output")

def get_output_directory():
    return output_directory

def get_folder_paths(name):
    return list(folder_names_and_paths[name][0])

def get_filename_list(name):
    paths, exts = folder_names_and_paths[name]
    found = []
    for p in paths:
        if os.path.isdir(p):
            found += [f for f in os.listdir(p) if os.path.splitext(f)[1] in exts]
    return sorted(found)
'''


@pytest.fixture
def base(tmp_path):
    """A tmp directory standing for ComfyUI's base (folder_paths only)."""
    b = tmp_path / "comfyui"
    b.mkdir()
    (b / "folder_paths.py").write_text(FOLDER_PATHS)
    return str(b)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A clean registry and a private metadata cache; every pack worker
    stopped afterwards."""
    monkeypatch.setenv("BULKHEAD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    nodes._forget_all()
    yield
    nodes._forget_all()


def test_proxies_carry_the_real_nodes_metadata(tmp_path, base, host):
    py = other_interpreter()
    pack = write_pack(tmp_path, "fullpack", FULL_PACK)
    mappings, display = nodes.load_pack(pack, py, options={"comfyui": base})
    real = import_real(pack)
    assert set(mappings) == {"MakeModel", "UseModel", "Counter", "Odd", "Lists", "Show"}  # Broken left out
    assert display == {"MakeModel": "Make a model", "UseModel": "Use a model"}
    for key in ("MakeModel", "UseModel", "Counter"):
        proxy, cls = mappings[key], real.NODE_CLASS_MAPPINGS[key]
        assert proxy.INPUT_TYPES() == cls.INPUT_TYPES()
        for attr in ("RETURN_TYPES", "RETURN_NAMES", "FUNCTION", "CATEGORY", "OUTPUT_NODE", "INPUT_IS_LIST",
                     "OUTPUT_IS_LIST", "DESCRIPTION", "OUTPUT_TOOLTIPS"):
            assert hasattr(proxy, attr) == hasattr(cls, attr), (key, attr)
            if hasattr(cls, attr):
                assert getattr(proxy, attr) == getattr(cls, attr), (key, attr)
                assert type(getattr(proxy, attr)) is type(getattr(cls, attr)), (key, attr)
        for method in ("IS_CHANGED", "VALIDATE_INPUTS", "check_lazy_status"):
            assert hasattr(proxy, method) == hasattr(cls, method), (key, method)
    M, U = mappings["MakeModel"], mappings["UseModel"]
    # ComfyUI inspects VALIDATE_INPUTS to decide what to pass it
    assert inspect.getfullargspec(M.VALIDATE_INPUTS).args == inspect.getfullargspec(
        real.MakeModel.VALIDATE_INPUTS).args == ["cls", "size", "input_types"]
    assert M.VALIDATE_INPUTS(size=65, input_types={"size": "INT"}) == "size must be at most 64"
    assert M.VALIDATE_INPUTS(size=3) is True
    assert M.IS_CHANGED(size=3, kind="a") == "size=3"
    # the "any type" string stays unequal to nothing
    any_type = M.INPUT_TYPES()["optional"]["anything"][0]
    assert any_type == "*" and not (any_type != "IMAGE")
    # ComfyUI runs getattr(obj, obj.FUNCTION)(**inputs) on an instance per node
    model, doubled = getattr(M(), M.FUNCTION)(size=5, kind="b", unique_id="7")
    assert doubled == 10
    u = U()
    assert u.check_lazy_status(model=model, add=None) == ["add"]
    size, pid, python = getattr(u, U.FUNCTION)(model=model, add=1)
    rt = states.runtime(pack)
    assert (size, pid) == (6, rt.worker.pid) and pid != os.getpid()
    assert python != "%d.%d" % sys.version_info[:2]  # really another interpreter
    c = mappings["Counter"]()
    assert [c.count()[0] for _ in range(3)] == [1, 2, 3]  # one worker instance per proxy instance
    assert mappings["Counter"]().count() == (1,)
    assert mappings["Show"]().show(text="hi") == {"ui": {"text": ["hi"]}, "result": ("HI",)}


def test_what_ComfyUI_cannot_take_is_converted_and_reported(tmp_path, base, host, caplog):
    pack = write_pack(tmp_path, "oddpack", FULL_PACK)
    with caplog.at_level(logging.WARNING, logger="bulkhead"):
        mappings, _ = nodes.load_pack(pack, other_interpreter(), options={"comfyui": base})
    odd = mappings["Odd"].INPUT_TYPES()["required"]
    assert odd["t"] == ("int",)
    assert odd["k"] == (["x"], {"default": "a"})  # an enum member crosses as its value
    assert odd["o"][1]["default"].startswith("<object object at")
    text = caplog.text
    assert "node 'Odd', INPUT_TYPES().required.t[0]: is the type object builtins.int" in text
    assert "node 'Odd', INPUT_TYPES().required.o[1].default: is a object" in text
    assert "node 'Broken' left out: RuntimeError: INPUT_TYPES is broken" in text


def test_folder_lists_are_read_from_the_host_every_time(tmp_path, base, host, monkeypatch):
    spec = importlib.util.spec_from_file_location("folder_paths", os.path.join(base, "folder_paths.py"))
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    extra = tmp_path / "more_ckpts"
    extra.mkdir()
    fp.folder_names_and_paths["checkpoints"][0].append(str(extra))  # the host's own folder
    (extra / "early.safetensors").write_bytes(b"")
    pack = write_pack(tmp_path, "listpack", FULL_PACK)
    mappings, _ = nodes.load_pack(pack, other_interpreter())  # ComfyUI base found from folder_paths
    assert states.runtime(pack).comfyui == os.path.realpath(base)
    lists = mappings["Lists"]
    assert lists.INPUT_TYPES()["required"]["ckpt"] == (["early.safetensors"],)  # the worker saw it
    nodes.close_all()
    (extra / "late.safetensors").write_bytes(b"")
    assert lists.INPUT_TYPES()["required"] == {"ckpt": (["early.safetensors", "late.safetensors"],),
                                               "fixed": (["one", "two"],)}
    assert states.runtime(pack).worker.pid is None  # no worker was asked


def _held(pack):
    return states.runtime(pack).worker.call(targets.HELD_COUNT)


def _wait_held(pack, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        held = _held(pack)
        if held == n or time.monotonic() > deadline:
            return held
        time.sleep(0.05)


def test_handles_resolve_in_their_own_worker_only(tmp_path, base, host):
    venvs = list(WORKER_VENVS.values())
    if len(venvs) < 2:
        pytest.skip("needs two worker venvs (make worker-venvs)")
    a = write_pack(tmp_path, "packa", FULL_PACK)
    b = write_pack(tmp_path, "packb", OTHER_PACK)
    ma, _ = nodes.load_pack(a, venvs[0], options={"comfyui": base})
    mb, _ = nodes.load_pack(b, venvs[-1], options={"comfyui": base})
    model, _ = ma["MakeModel"]().make(size=4)
    assert isinstance(model, bulkhead.RemoteObject)
    assert repr(model).startswith("<bulkhead.RemoteObject packa.nodes.Model #")
    assert "pack 'packa', worker generation 1" in repr(model)
    with pytest.raises(AttributeError, match="lives in the worker of pack 'packa'"):
        model.size
    user = ma["UseModel"]()
    assert user.use(model=model)[0] == 4
    assert user.use(model=model)[0] == 4  # the same object again, still there
    with pytest.raises(bulkhead.HandleError, match=r"packa\.nodes\.Model made by pack 'packa'.*"
                                                   r"cannot be passed to pack 'packb'"):
        mb["Version"]().run(model=model)
    wa = states.runtime(a).worker
    wa.kill()
    # Killed while idle: once the death is seen, the next call runs on
    # generation 2, where generation 1's handle is refused by name (before
    # the death lands the call would see it instead: WorkerDied).
    deadline = time.monotonic() + 10
    while wa.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert "killed by signal 9" in (wa.last_exit or "")
    with pytest.raises(bulkhead.HandleError, match=r"packa\.nodes\.Model made by pack 'packa' is held by "
                                                   r"worker generation 1; that worker has ended"):
        user.use(model=model)
    fresh, _ = ma["MakeModel"]().make(size=2)
    assert "generation 2" in repr(fresh)
    assert user.use(model=fresh)[0] == 2  # the proxy made a new instance in the new worker


def test_dropped_handles_are_released_in_the_worker(tmp_path, base, host):
    pack = write_pack(tmp_path, "relpack", FULL_PACK)
    mappings, _ = nodes.load_pack(pack, other_interpreter(), options={"comfyui": base})
    maker = mappings["MakeModel"]()
    base_count = _held(pack)  # nothing yet: instances are made on first run
    models = [maker.make(size=i + 1)[0] for i in range(50)]
    assert _held(pack) == base_count + 51  # 50 models and the maker's instance
    user = mappings["UseModel"]()
    for m in models[:5]:
        user.use(model=m)
    del models, m
    assert _wait_held(pack, base_count + 2) == base_count + 2  # the two node instances
    del maker, user
    assert _wait_held(pack, base_count) == base_count


def test_a_pack_worker_serves_only_the_words_of_the_crossing(tmp_path, base, host):
    """A pack's worker resolves the targets of channel/targets.py and
    nothing else: no "module:function" of the host's choosing runs there
    (a plain bulkhead.Worker, which is no pack's, still serves any)."""
    pack = write_pack(tmp_path, "verbpack", FULL_PACK)
    nodes.load_pack(pack, other_interpreter(), options={"comfyui": base})
    w = states.runtime(pack).worker
    assert w.call(targets.HELD_COUNT) == 0
    for target in ("os:getpid", "builtins:eval", "bulkhead.worker.nodes:_load"):
        with pytest.raises(PermissionError, match=f"serves only bulkhead's own calls .*{target}"):
            w.call(target)
    assert w.call(targets.HELD_COUNT) == 0   # and it serves on


def test_warm_cache_starts_no_worker(tmp_path, base, host):
    py = other_interpreter()
    pack = write_pack(tmp_path, "cachepack", FULL_PACK)
    first, _ = nodes.load_pack(pack, py, options={"comfyui": base})
    rt = states.runtime(pack)
    assert not rt.from_cache and rt.worker.pid is not None
    files = os.listdir(metadata.cache_dir())
    assert len(files) == 1
    nodes._forget_all()  # a new ComfyUI start
    again, _ = nodes.load_pack(pack, py, options={"comfyui": base})
    rt = states.runtime(pack)
    assert rt.from_cache and rt.worker.pid is None
    assert again["MakeModel"].INPUT_TYPES() == first["MakeModel"].INPUT_TYPES()
    assert rt.worker.pid is None
    assert again["MakeModel"]().make(size=3)[1] == 6  # the first run starts it
    assert rt.worker.pid is not None
    # a changed source, or another environment stamp, is a miss
    with open(os.path.join(pack, "util.py"), "a") as f:
        f.write("\n# changed\n")
    nodes._forget_all()
    nodes.load_pack(pack, py, options={"comfyui": base})
    assert not states.runtime(pack).from_cache
    nodes._forget_all()
    nodes.load_pack(pack, py, options={"comfyui": base, "stamp": "rebuilt"})
    assert not states.runtime(pack).from_cache
    assert len(os.listdir(metadata.cache_dir())) == 1  # older entries replaced


def test_pack_loaded_the_way_ComfyUI_loads_it(tmp_path, base, host, monkeypatch):
    pack = write_pack(tmp_path, "comfystyle.pack", FULL_PACK)
    monkeypatch.setenv("BH_TEST_PACK_PYTHON", other_interpreter())
    monkeypatch.setenv("BH_TEST_COMFYUI", base)
    # nodes.load_custom_node: the module is named after the path
    name = pack.replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(pack, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    assert module.NODE_CLASS_MAPPINGS["MakeModel"].__module__ == "bulkhead.nodes.comfystyle.pack"
    assert module.NODE_CLASS_MAPPINGS["MakeModel"]().make(size=2)[1] == 4
    assert module.NODE_DISPLAY_NAME_MAPPINGS["UseModel"] == "Use a model"


def test_a_pack_that_fails_to_import_is_a_clear_error(tmp_path, base, host):
    pack = write_pack(tmp_path, "badpack", {"__init__.py": LOAD_PACK_INIT, "nodes.py": "import no_such_module_xyz\n"})
    with pytest.raises(runtime.PackLoadError, match=r"(?s)pack 'badpack' .* failed to import in its worker.*"
                                                  r"No module named 'no_such_module_xyz'"):
        nodes.load_pack(pack, other_interpreter(), options={"comfyui": base})
    assert states.runtime(pack).worker.pid is None


def test_two_packs_under_different_interpreters_side_by_side(tmp_path, base, host):
    venvs = sorted(set(WORKER_VENVS.values()))
    if len(venvs) < 2:
        pytest.skip("needs two worker venvs (make worker-venvs)")
    one = write_pack(tmp_path, "one", OTHER_PACK)
    two = write_pack(tmp_path, "two", OTHER_PACK)
    m1, _ = nodes.load_pack(one, venvs[0], options={"comfyui": base})
    m2, _ = nodes.load_pack(two, venvs[-1], options={"comfyui": base})
    v1, v2 = m1["Version"]().run(), m2["Version"]().run()
    assert v1[0] != v2[0]
    assert states.runtime(one).worker.pid != states.runtime(two).worker.pid
    print(f"pack one: Python {v1[0]}, numpy {v1[1]}; pack two: Python {v2[0]}, numpy {v2[1]}")


@pytest.mark.parametrize("reason", sorted(states.REASONS))
def test_each_fallback_warns_once_and_imports_in_process(tmp_path, host, caplog, reason):
    pack = write_pack(tmp_path, "fb_" + reason.replace("-", "_"), FULL_PACK)
    with caplog.at_level(logging.WARNING, logger="bulkhead"):
        m1, d1 = nodes.fallback(pack, reason, detail="the detail")
        [row] = [r for r in states.pack_states() if r["name"] == os.path.basename(pack)]
        m2, _ = nodes.fallback(pack, reason)
    warnings = [r for r in caplog.records if "runs in-process" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    what = states.REASONS[reason][0].split("{")[0].split("(")[0].strip()
    # one line of at most 200 characters: the reason, cut to fit; the whole of it in the pack's state
    assert what in text and len(text) <= states.LINE_MAX and "the detail" in row["reason"]
    if reason == states.CUSTOM_NODE_GONE:   # bulkhead is off: the fix is its custom node, in the line
        assert "reinstall bulkhead's custom node" in text
    else:   # the line points at the pack's state, which holds the fix
        assert "`bulkhead status`" in text
        assert f"`bulkhead install {os.path.realpath(pack)}`" in row["fix"]
    assert m1["MakeModel"] is m2["MakeModel"]
    assert m1["MakeModel"].__module__.endswith(".nodes") and "bulkhead" not in m1["MakeModel"].__module__
    assert m1["MakeModel"]().make(size=3)[1] == 6  # the real class, in this process
    assert d1["MakeModel"] == "Make a model"


def test_a_pack_that_fails_in_process_too_is_one_failed_row(tmp_path, host):
    """Its fallback's import raises: the pack is not listed as in-process
    (it runs nowhere); recorded as failed, it is one row, not two."""
    pack = write_pack(tmp_path, "fb_broken", {"__init__.py": "", "nodes.py": "import no_such_module_xyz\n"})
    with pytest.raises(ImportError):
        nodes.fallback(pack, states.WORKER_IMPORT_FAILED, detail="x")
    assert [r["state"] for r in states.pack_states() if r["name"] == "fb_broken"] == ["failed"]
    states.failed(pack, "fb_broken", "No module named 'no_such_module_xyz'")
    [row] = [r for r in states.pack_states() if r["name"] == "fb_broken"]
    assert row["state"] == "failed"
    # why it was not isolated first, then why not in-process either: once each
    assert row["reason"].count("import in its worker: x") == 1 and row["reason"].endswith("'no_such_module_xyz'")


def test_load_pack_falls_back_without_ComfyUI_or_environment(tmp_path, base, host, caplog, monkeypatch):
    for mod in ("folder_paths", "comfy"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    nocomfy = write_pack(tmp_path, "nocomfy", FULL_PACK)
    noenv = write_pack(tmp_path, "noenv", FULL_PACK)
    with caplog.at_level(logging.WARNING, logger="bulkhead"):
        m, _ = nodes.load_pack(nocomfy, other_interpreter())
        nodes.load_pack(nocomfy, other_interpreter())
        m2, _ = nodes.load_pack(noenv, str(tmp_path / "nowhere" / "bin" / "python"), options={"comfyui": base})
    texts = [r.getMessage() for r in caplog.records if "runs in-process" in r.getMessage()]
    assert len(texts) == 2
    assert "no ComfyUI base was found" in texts[0]
    assert "its environment is not built (no interpreter at" in texts[1]
    assert "bulkhead" not in m["UseModel"].__module__ and "bulkhead" not in m2["UseModel"].__module__
    assert states.runtime(nocomfy) is None


# --- inside ComfyUI (torch) ---

TORCH_PACK = {
    "__init__.py": LOAD_PACK_INIT,
    "nodes.py": '''
import json, logging, time


class Progress:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"steps": ("INT", {"default": 5})}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "go"

    def go(self, steps):
        import comfy.utils
        bar = comfy.utils.ProgressBar(steps)
        for _ in range(steps):
            time.sleep(0.12)  # past upstream's throttle interval
            bar.update(1)
        return (steps,)


class Loop:
    """Runs `seconds` unless interrupted, checking ComfyUI's flag."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 30.0})}}
    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "go"

    def go(self, seconds):
        import comfy.model_management as mm
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            mm.throw_exception_if_processing_interrupted()
            sum(range(1000))
        return (time.monotonic() - t0,)


class Oom:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"kind": ("STRING", {"default": "cuda"})}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "go"

    def go(self, kind):
        import torch
        if kind == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        raise MemoryError("cannot allocate 64 GiB of RAM")


class State:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    def go(self):
        import comfy.model_management as mm
        import comfy.cli_args
        import folder_paths
        logging.info("pack says hello at info")
        logging.debug("pack says hello at debug")
        logging.warning("pack log done")
        a = comfy.cli_args.args
        return (json.dumps({
            "cpu": a.cpu, "force_fp32": a.force_fp32, "reserve_vram": a.reserve_vram,
            "disable_smart_memory": a.disable_smart_memory, "lowvram": a.lowvram,
            "mm_disable_smart_memory": mm.DISABLE_SMART_MEMORY, "cpu_state": mm.cpu_state.name,
            "checkpoints": folder_paths.get_folder_paths("checkpoints"),
            "output": folder_paths.get_output_directory(),
            "interrupted": mm.processing_interrupted()}),)


class Stubborn:
    """Sleeps `seconds` and never checks ComfyUI's flag."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 20.0})}}
    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "go"

    def go(self, seconds):
        t0 = time.monotonic()
        time.sleep(seconds)
        return (time.monotonic() - t0,)


NODE_CLASS_MAPPINGS = {"Progress": Progress, "Loop": Loop, "Oom": Oom, "State": State, "Stubborn": Stubborn}
''',
}

SCENARIO = '''
import logging, threading, time
import comfy.utils
from bulkhead.channel import targets
from bulkhead.host import nodes, states
PACK = {pack!r}
'''


def comfy_scenario(tmp_path, body, argv=()):
    pack = write_pack(tmp_path, "torchpack", TORCH_PACK)
    env = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(tmp_path / "home")}
    return run_comfy_script(SCENARIO.format(pack=pack) + textwrap.dedent(body), argv=argv, env=env,
                            timeout=240)


@pytest.mark.torch
def test_progress_drives_the_hosts_progress_bar(tmp_path):
    r = comfy_scenario(tmp_path, """
        seen = []
        comfy.utils.set_progress_bar_global_hook(lambda v, t, p, node_id=None, **kw: seen.append([v, t]))
        m, _ = nodes.load_pack(PACK, sys.executable)
        out = m["Progress"]().go(steps=5)
        nodes.close_all()
        emit({"out": out, "seen": seen})
    """)
    assert r["out"] == [5]
    assert r["seen"] == [[1, 5], [2, 5], [3, 5], [4, 5], [5, 5]]


@pytest.mark.torch
def test_interrupt_stops_a_worker_node_and_leaves_the_hosts_flag_set(tmp_path):
    r = comfy_scenario(tmp_path, """
        m, _ = nodes.load_pack(PACK, sys.executable)
        loop = m["Loop"]()
        loop.go(seconds=0.05)  # the worker is up and ComfyUI imported there
        set_at = []

        def click():
            time.sleep(0.5)
            set_at.append(time.perf_counter())
            mm.interrupt_current_processing(True)   # the stop button
        threading.Thread(target=click).start()
        t0 = time.perf_counter()
        try:
            loop.go(seconds=30.0)
            raised = None
        except mm.InterruptProcessingException as e:
            raised = type(e).__module__ + "." + type(e).__name__
        stopped = time.perf_counter()
        flag_after = mm.processing_interrupted()
        rt = states.runtime(PACK)
        # set before the next node: it does not even start, and stays set
        try:
            loop.go(seconds=30.0)
            before = "ran"
        except mm.InterruptProcessingException:
            before = "raised"
        still = mm.processing_interrupted()
        mm.interrupt_current_processing(False)   # ComfyUI clears it at the next prompt
        after = loop.go(seconds=0.1)[0]
        state = json.loads(m["State"]().go()[0])
        emit({"raised": raised, "ran_s": stopped - t0, "latency_ms": (stopped - set_at[0]) * 1000,
              "flag_after": flag_after, "before": before,
              "still": still, "after": after, "worker_flag": state["interrupted"],
              "generation": rt.worker.generation})
        nodes.close_all()
    """)
    print(f"\ninterrupt latency (host flag set -> host raised): {r['latency_ms']:.1f} ms")
    assert r["raised"] == "comfy.model_management.InterruptProcessingException"
    assert r["ran_s"] < 2.5  # stopped well before the node's natural 30 s
    assert r["flag_after"] is True and r["before"] == "raised" and r["still"] is True
    assert r["after"] >= 0.1 and r["worker_flag"] is False
    assert r["generation"] == 1  # the worker survived its interrupt


@pytest.mark.torch
def test_the_interrupt_watcher_starts_no_thread_per_call_and_reads_the_flag(tmp_path):
    """Node calls start no thread (one watcher for the host), and a flag
    set without interrupt_current_processing (straight into
    model_management) stops the node as the stop button does."""
    r = comfy_scenario(tmp_path, """
        m, _ = nodes.load_pack(PACK, sys.executable)
        loop = m["Loop"]()
        loop.go(seconds=0.05)  # the worker, its reader and the watcher are up
        started = []
        real_start = threading.Thread.start

        def counting_start(self):
            started.append(self.name)
            return real_start(self)
        threading.Thread.start = counting_start
        for _ in range(20):
            loop.go(seconds=0.0)
        threading.Thread.start = real_start
        set_at = []

        def click():
            time.sleep(0.3)
            set_at.append(time.perf_counter())
            with mm.interrupt_processing_mutex:
                mm.interrupt_processing = True   # not through interrupt_current_processing
        threading.Thread(target=click).start()
        try:
            loop.go(seconds=30.0)
            raised = False
        except mm.InterruptProcessingException:
            raised = True
        stop_ms = (time.perf_counter() - set_at[0]) * 1000
        mm.interrupt_current_processing(False)
        names = sorted(t.name for t in threading.enumerate() if t.name.startswith("bulkhead-interrupt"))
        nodes.close_all()
        emit({"started": started, "raised": raised, "stop_ms": stop_ms, "watchers": names})
    """)
    assert r["started"] == []
    # Stopped by the watcher, well before the node's 30 s would have ended
    # it: a bound between two behaviours, not a speed.
    assert r["raised"] is True and r["stop_ms"] < 15_000, r
    assert r["watchers"] == ["bulkhead-interrupt"]


@pytest.mark.torch
def test_a_node_that_never_checks_the_flag_is_stopped_after_its_grace(tmp_path):
    """The stop button on a node that never checks ComfyUI's flag: after
    interrupt_grace_s its worker is stopped, the host raises ComfyUI's own
    interrupt (the flag stays set), the log names the pack, and the next
    node runs on the next generation.  With grace 0 the node runs on."""
    r = comfy_scenario(tmp_path, """
        log = []
        logging.getLogger("bulkhead").addHandler(type("H", (logging.Handler,), {
            "emit": lambda self, rec: log.append(rec.getMessage())})())
        m, _ = nodes.load_pack(PACK, sys.executable, options={"interrupt_grace_s": 0.5})
        rt = states.runtime(PACK)
        m["Loop"]().go(seconds=0.05)  # the worker is up
        first_pid = rt.worker.pid
        set_at = []

        def click():
            time.sleep(0.3)
            set_at.append(time.perf_counter())
            mm.interrupt_current_processing(True)
        threading.Thread(target=click).start()
        try:
            m["Stubborn"]().go(seconds=20.0)
            raised = None
        except mm.InterruptProcessingException as e:
            raised = type(e).__module__ + "." + type(e).__name__
        stop_ms = (time.perf_counter() - set_at[0]) * 1000
        flag_after = mm.processing_interrupted()
        mm.interrupt_current_processing(False)
        after = m["Loop"]().go(seconds=0.05)[0]
        out = {"raised": raised, "stop_ms": stop_ms, "flag_after": flag_after, "after": after,
               "generation": rt.worker.generation, "first_pid_alive": os.path.exists(f"/proc/{first_pid}"),
               "log": [line for line in log if "interrupt" in line]}
        # grace 0: the node runs to its end
        nodes._forget_all()
        m, _ = nodes.load_pack(PACK, sys.executable, options={"interrupt_grace_s": 0})
        threading.Thread(target=lambda: (time.sleep(0.2), mm.interrupt_current_processing(True))).start()
        out["ran_on"] = m["Stubborn"]().go(seconds=1.0)[0]
        mm.interrupt_current_processing(False)
        out["generation_0"] = states.runtime(PACK).worker.generation
        nodes.close_all()
        emit(out)
    """)
    print(f"\nstop button -> raised on a node that never checks: {r['stop_ms']:.0f} ms (grace 500 ms)")
    assert r["raised"] == "comfy.model_management.InterruptProcessingException"
    assert 500 <= r["stop_ms"] < 500 + 500   # the grace, plus the kill and the EOF
    assert r["flag_after"] is True           # the click is not consumed
    assert r["after"] >= 0.05 and r["generation"] == 2 and r["first_pid_alive"] is False
    assert len(r["log"]) == 1 and "'torchpack'" in r["log"][0] and "interrupt_grace_s" in r["log"][0]
    assert r["ran_on"] >= 1.0 and r["generation_0"] == 1


@pytest.mark.torch
def test_worker_oom_raises_the_hosts_oom_class(tmp_path):
    r = comfy_scenario(tmp_path, """
        import traceback
        m, _ = nodes.load_pack(PACK, sys.executable)
        out = {}
        for kind in ("cuda", "ram"):
            try:
                m["Oom"]().go(kind=kind)
            except mm.OOM_EXCEPTION as e:
                out[kind] = {"is_oom_class": type(e) is mm.OOM_EXCEPTION, "text": str(e),
                             "logged": "".join(traceback.format_exception(e))}
        out["cls"] = mm.OOM_EXCEPTION.__module__ + "." + mm.OOM_EXCEPTION.__name__
        nodes.close_all()
        emit(out)
    """)
    assert r["cls"] in ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError")
    cuda, ram = r["cuda"], r["ram"]
    assert cuda["is_oom_class"] and ram["is_oom_class"]
    # CUDA's OOM says what it says in-process; the worker's traceback is its
    # cause, in ComfyUI's log (traceback.format_exc()), not in its message.
    assert cuda["text"] == "CUDA out of memory. Tried to allocate 20.00 GiB", cuda["text"]
    assert "worker 'torchpack'" in cuda["logged"] and ", in go" in cuda["logged"], cuda["logged"]
    # A RAM MemoryError is raised as ComfyUI's OOM class: its message names what it was.
    assert ram["text"] == "MemoryError: cannot allocate 64 GiB of RAM", ram["text"]
    assert "worker 'torchpack'" in ram["logged"] and ", in go" in ram["logged"], ram["logged"]


@pytest.mark.torch
def test_flags_folders_and_logging_are_mirrored(tmp_path):
    extra = str(tmp_path / "more_checkpoints")
    r = comfy_scenario(tmp_path, """
        import comfy.cli_args, folder_paths
        logging.getLogger().setLevel(logging.INFO)
        folder_paths.add_model_folder_path("checkpoints", {extra!r})
        comfy.cli_args.args.lowvram = True   # a VRAM-state flag: not mirrored
        m, _ = nodes.load_pack(PACK, sys.executable)
        state = json.loads(m["State"]().go()[0])
        rt = states.runtime(PACK)
        deadline = time.monotonic() + 10  # the supervisor drains the worker's output as it comes
        while "pack log done" not in rt.worker._proc.output_tail() and time.monotonic() < deadline:
            time.sleep(0.02)
        tail = rt.worker._proc.output_tail()
        host = {{"checkpoints": folder_paths.get_folder_paths("checkpoints"),
                 "output": folder_paths.get_output_directory()}}
        nodes.close_all()
        emit({{"state": state, "tail": tail, "host": host}})
    """.format(extra=extra), argv=["--force-fp32", "--reserve-vram", "1.5", "--disable-smart-memory"])
    s = r["state"]
    assert s["cpu"] is True and s["cpu_state"] == "CPU"
    assert s["force_fp32"] is True and s["reserve_vram"] == 1.5 and s["disable_smart_memory"] is True
    assert s["mm_disable_smart_memory"] is True  # set before the worker imported model_management
    assert s["lowvram"] is False
    assert s["checkpoints"] == r["host"]["checkpoints"] and extra in s["checkpoints"]
    assert s["output"] == r["host"]["output"]
    assert "INFO: pack says hello at info" in r["tail"]
    assert "pack says hello at debug" not in r["tail"]
    assert "WARNING: pack log done" in r["tail"]


# --- workers started ahead of their first node (host/prewarm.py) ---

def _cold_packs(tmp_path, base, *packs):
    """Packs loaded from a warm metadata cache, as at a new ComfyUI start:
    their workers not started.  packs: (name, options) pairs; returns a
    (PackRuntime, NODE_CLASS_MAPPINGS) pair for each."""
    py = other_interpreter()
    dirs = [write_pack(tmp_path, name, FULL_PACK) for name, _o in packs]
    for d in dirs:
        nodes.load_pack(d, py, options={"comfyui": base})
    nodes._forget_all()
    out = []
    for d, (_name, options) in zip(dirs, packs):
        mappings, _ = nodes.load_pack(d, py, options=dict({"comfyui": base}, **(options or {})))
        rt = states.runtime(d)
        assert rt.from_cache and rt.worker.pid is None
        out.append((rt, mappings))
    return out


def test_a_queued_prompt_starts_the_workers_of_its_packs(tmp_path, base, host, monkeypatch):
    from bulkhead.host import prewarm
    (rt, mappings), (off, _) = _cold_packs(tmp_path, base, ("warmpack", None), ("coldpack", {"prewarm": "off"}))
    # ComfyUI's own table decides which class a name is: here the pack's.
    comfy_nodes = type(sys)("nodes")
    comfy_nodes.NODE_CLASS_MAPPINGS = dict(mappings)
    monkeypatch.setitem(sys.modules, "nodes", comfy_nodes)
    prompt = {"prompt": {"1": {"class_type": "MakeModel", "inputs": {"size": 3}},
                         "2": {"class_type": "SomeCoreNode", "inputs": {}}, "3": "not a node"}}
    assert prewarm.on_prompt(prompt) is prompt
    assert prewarm.wait(60)
    assert rt.worker.alive and rt.worker.generation == 1
    assert not off.worker.alive  # prewarm = "off": its first node starts it
    # the pack was imported there: the first node runs on that worker
    pid = rt.worker.pid
    assert mappings["MakeModel"]().make(size=3)[1] == 6
    assert rt.worker.pid == pid and rt.worker.generation == 1
    # a running worker is not started again; an unknown name starts nothing
    assert prewarm.start(rt) is None
    assert prewarm.on_prompt({"prompt": {"1": {"class_type": "Nope"}}})["prompt"]
    assert prewarm.runtimes_for({"Nope"}) == []


def test_a_worker_alive_from_describing_its_pack_is_prewarmed_too(tmp_path, base, host, monkeypatch):
    """A metadata-cache miss (the first start after an install or a
    change) leaves the worker that described the nodes running: a queued
    prompt still warms it (the pack's node call rehearsed there), once."""
    from bulkhead.host import prewarm
    d = write_pack(tmp_path, "missedpack", FULL_PACK)
    mappings, _ = nodes.load_pack(d, other_interpreter(), options={"comfyui": base, "cache": False})
    rt = states.runtime(d)
    assert not rt.from_cache and rt.worker.alive and rt.warm_generation is None
    comfy_nodes = type(sys)("nodes")
    comfy_nodes.NODE_CLASS_MAPPINGS = dict(mappings)
    monkeypatch.setitem(sys.modules, "nodes", comfy_nodes)
    pid = rt.worker.pid
    assert prewarm.start(rt) is not None and prewarm.wait(60)
    assert rt.worker.pid == pid and rt.warm_generation == rt.worker.generation   # the same worker, warmed
    assert prewarm.start(rt) is None                                              # and only once


def test_prewarm_follows_comfyuis_table_and_the_startup_option(tmp_path, base, host, monkeypatch):
    from bulkhead.host import prewarm
    [(rt, mappings)] = _cold_packs(tmp_path, base, ("shadowed", None))
    comfy_nodes = type(sys)("nodes")
    comfy_nodes.NODE_CLASS_MAPPINGS = {"MakeModel": type("CoreMakeModel", (), {})}  # another pack won the name
    monkeypatch.setitem(sys.modules, "nodes", comfy_nodes)
    assert prewarm.runtimes_for({"MakeModel"}) == []
    prewarm.on_prompt({"prompt": {"1": {"class_type": "MakeModel"}}})
    assert prewarm.wait(60) and not rt.worker.alive
    monkeypatch.delitem(sys.modules, "nodes")
    [(early, _)] = _cold_packs(tmp_path, base, ("earlypack", {"prewarm": "startup"}))
    assert prewarm.wait(60)
    assert early.worker.alive and early.worker.generation == 1


def test_prewarm_will_run_walks_from_the_outputs_through_what_is_not_cached():
    from bulkhead.host.prewarm import will_run
    prompt = {"1": {"class_type": "A", "inputs": {}}, "2": {"class_type": "B", "inputs": {"x": ["1", 0]}},
              "3": {"class_type": "C", "inputs": {"y": ["2", 0], "s": "text"}},
              "4": {"class_type": "D", "inputs": {"z": ["1", 0]}}, "5": "not a node"}
    assert will_run(prompt, ["3"], set()) == {"1", "2", "3"}
    assert will_run(prompt, ["3"], {"2"}) == {"3"}           # a cached node's inputs do not run for it
    assert will_run(prompt, ["3"], {"1", "2", "3"}) == set()  # fully cached
    assert will_run(prompt, ["3", "4"], {"2", "3"}) == {"4", "1"}
    assert will_run(prompt, [], {"3"}) == {"1", "2", "4", "5"}   # no outputs named: every node not cached


def test_prewarm_follows_comfyuis_cache_where_the_executor_is_watched(tmp_path, base, host, monkeypatch):
    """Where ComfyUI's executor is watched, a queued prompt starts nothing;
    its execution_cached message (PromptExecutor.add_message, upstream's
    own method run first) starts the packs of the nodes that will run
    only: here the pack whose node the cache serves stays cold."""
    import types
    from bulkhead.host import prewarm
    (rx, mx), (ry, my) = _cold_packs(tmp_path, base, ("cachedpack", None), ("runpack", None))
    comfy_nodes = type(sys)("nodes")
    comfy_nodes.NODE_CLASS_MAPPINGS = {"MakeModel": mx["MakeModel"], "UseModel": my["UseModel"]}
    monkeypatch.setitem(sys.modules, "nodes", comfy_nodes)
    prompt = {"1": {"class_type": "MakeModel", "inputs": {"size": 2}},
              "2": {"class_type": "UseModel", "inputs": {"model": ["1", 0], "add": 1}}}
    sent = []

    class PromptExecutor:     # upstream's shape: add_message(event, data, broadcast)
        def __init__(self):
            queue = types.SimpleNamespace(get_current_queue_volatile=lambda: ([(0, "p1", prompt, {}, ["2"])], []))
            self.server = types.SimpleNamespace(prompt_queue=queue)

        def add_message(self, event, data, broadcast):
            sent.append(event)
    execution = type(sys)("execution")
    execution.PromptExecutor = PromptExecutor
    monkeypatch.setitem(sys.modules, "execution", execution)
    monkeypatch.setattr(prewarm, "_watched", [False])
    assert prewarm._watch_executor() and prewarm._watch_executor()    # wrapped once
    assert PromptExecutor.add_message.__wrapped__.__name__ == "add_message"
    prewarm._watched[0] = True
    assert prewarm.on_prompt({"prompt": prompt})["prompt"] is prompt
    assert prewarm.wait(60) and not rx.worker.alive and not ry.worker.alive   # queued: nothing yet
    PromptExecutor().add_message("execution_cached", {"nodes": ["1"], "prompt_id": "p1"}, False)
    assert sent == ["execution_cached"]
    assert prewarm.wait(60)
    assert ry.worker.alive and not rx.worker.alive
    # a prompt ComfyUI's queue does not hold starts nothing, and never raises into the executor
    PromptExecutor().add_message("execution_cached", {"nodes": [], "prompt_id": "other"}, False)
    PromptExecutor().add_message("execution_cached", None, False)
    assert prewarm.wait(60) and not rx.worker.alive and sent == ["execution_cached"] * 3


def test_prewarm_runs_from_comfyuis_post_prompt(tmp_path, base, host):
    """POST /prompt on ComfyUI's server (tests/comfyui's, which runs its
    on-prompt handlers as upstream does) starts the pack's worker."""
    import asyncio
    import threading
    import urllib.request
    from aiohttp import web
    from bulkhead.host import prewarm
    [(rt, mappings)] = _cold_packs(tmp_path, base, ("httppack", None))
    before = set(sys.modules)
    sys.path.insert(0, os.path.join(ROOT, "tests", "comfyui"))
    try:
        import server as comfy_server
    finally:
        sys.path.pop(0)
    srv = comfy_server.PromptServer()
    comfy_server.PromptServer.instance = None
    comfy_nodes = sys.modules["nodes"]          # ComfyUI's table: the pack is loaded
    comfy_nodes.NODE_CLASS_MAPPINGS.update(mappings)
    for name in set(sys.modules) - before:  # ComfyUI's server is this test's only
        del sys.modules[name]
    assert prewarm.install(srv) and not prewarm.install(srv)  # once per server
    srv.add_routes()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(srv.app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        body = json.dumps({"prompt": {"1": {"class_type": "MakeModel", "inputs": {"size": 2, "kind": "a"}},
                                      "2": {"class_type": "UseModel", "inputs": {"model": ["1", 0], "add": 0}}}
                           }).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/prompt", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        assert prewarm.wait(60)
        assert rt.worker.alive
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_host_object_input_is_refused_by_name(tmp_path, base, host):
    """The host's node policy (Peer.encode_other under a NodeValue): an
    input the host made that cannot cross is refused before anything is
    sent, naming where it sits; the worker still serves."""
    a = write_pack(tmp_path, "packa", FULL_PACK)
    ma, _ = nodes.load_pack(a, next(iter(WORKER_VENVS.values())), options={"comfyui": base})

    class HostThing:
        pass
    with pytest.raises(TypeError, match=r"^input 'model' of node 'UseModel' \(pack 'packa'\)\[1\]\['k'\] is a "
                                        r"test_nodes\..*HostThing made in the host process; an isolated node "
                                        r"takes plain values"):
        ma["UseModel"]().use(model=[1, {"k": HostThing()}])
    model, _ = ma["MakeModel"]().make(size=3)
    assert model.remote_type == "packa.nodes.Model"
    assert ma["UseModel"]().use(model=model)[0] == 3


# Nodes that hand on what they were given (#27: a pass-through costs no copy).
PASS_PACK = {
    "__init__.py": LOAD_PACK_INIT,
    "nodes.py": '''
import numpy as np


def _node(fn, n_out=1):
    return type(fn.__name__, (), {
        "INPUT_TYPES": classmethod(lambda cls: {"required": {"image": ("IMAGE",)}}),
        "RETURN_TYPES": ("IMAGE",) * n_out, "FUNCTION": "run", "CATEGORY": "bulkhead/test",
        "run": lambda self, image: fn(image)})


class Make:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 2.0})}}
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "run"

    def run(self, value):
        return (np.full(1 << 18, value, dtype=np.float32),)  # 1 MiB: a block of its own


def scale(image):
    if not image.flags.writeable:  # a view of this worker's own block, sent back: read-only
        return (image * 2,)
    image *= 2
    return (image,)


NODE_CLASS_MAPPINGS = {
    "Make": Make,
    "Pass": _node(lambda image: (image,)),
    "PassUi": _node(lambda image: {"ui": {"n": [image.size]}, "result": (image, image)}, 2),
    "Scale": _node(scale),
    "Pairs": _node(lambda image: (image.reshape(-1, 2),)),
}
''',
}


def _run(mappings, key, **inputs):
    cls = mappings[key]
    return getattr(cls(), cls.FUNCTION)(**inputs)


def test_a_node_that_hands_on_its_input_gives_the_host_its_own_object(tmp_path, base, host):
    """A worker's output that is one of its inputs, the same view of the
    same bytes the host's object shows, crosses as that input's name, and
    the host hands on its own object, as one ComfyUI process would: no
    copy, no block.  Where the bytes differ, or the view does, it is a
    value as before."""
    import numpy as np
    py = other_interpreter()
    a, _ = nodes.load_pack(write_pack(tmp_path, "passa", PASS_PACK), py, options={"comfyui": base})
    b, _ = nodes.load_pack(write_pack(tmp_path, "passb", PASS_PACK), py, options={"comfyui": base})
    x, = _run(a, "Make", value=2.0)                     # a view of a's block
    assert _run(a, "Pass", image=x)[0] is x             # a's own block, sent back by reference
    out = _run(a, "PassUi", image=x)
    assert out["result"][0] is x and out["result"][1] is x and out["ui"] == {"n": [1 << 18]}
    assert _run(b, "Pass", image=x)[0] is x             # forwarded to b, read only there
    y, = _run(b, "Scale", image=x)                      # b wrote into its copy-on-write mapping
    assert y is not x and float(y[0]) == 4.0 and float(x[0]) == 2.0
    z, = _run(a, "Scale", image=x)                      # read-only in a: a new array
    assert z is not x and float(z[0]) == 4.0 and float(x[0]) == 2.0
    p, = _run(a, "Pairs", image=x)                      # another view: a value
    assert p.shape == (1 << 17, 2) and float(p[0, 1]) == 2.0
    # the host's own array went in as a copy: a write there is not the
    # host's object's, so the node's array comes back as the block it wrote
    h = np.full(1 << 18, 3.0, dtype=np.float32)
    w, = _run(a, "Scale", image=h)
    assert w is not h and float(w[0]) == 6.0 and float(h[0]) == 3.0
    assert _run(a, "Pass", image=h)[0] is not h
