"""Run ComfyUI-side test scenarios in a fresh interpreter.

bulkhead's memory tests run against `tests/comfyui/` (a small package
shaped like ComfyUI that follows upstream's memory manager) or, when
COMFYUI_PATH names a checkout, against the real thing.  Each scenario runs
as a script in its own subprocess, so the manager's module state (the
ledger, the interrupt flag, the parsed flags) never leaks between tests.

    out = run_comfy_script('''
        a = SpyPatcher("a", 100)
        mm.load_models_gpu([a])
        emit(len(mm.current_loaded_models))
    ''')

The script starts with ComfyUI's start-up order done: sys.argv is
['main.py', '--cpu', *argv], args parsing enabled, then `comfy`, `torch`
and `comfy.model_management as mm` imported.  In scope: `mm`, `torch`,
`json`, `sys`, `REAL` (True against a real checkout), `GEN_DYNAMIC` (the
manager has the dynamic-model generation of free_memory: for_dynamic,
pins), everything in comfy_spies, and `emit(value)`, whose last call's
JSON value run_comfy_script returns.  A non-zero exit, a timeout or no
emit() fails the test with the script's output.
"""

import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
STUB_ROOT = os.path.join(REPO, "tests", "comfyui")
SHIMS = os.path.join(HERE, "shims")
_MARK = "@@comfyenv-result@@"


def comfy_root():
    """The ComfyUI tree tests run against: $COMFYUI_PATH, else the stub."""
    return os.path.abspath(os.environ.get("COMFYUI_PATH") or STUB_ROOT)


def using_real_checkout():
    return comfy_root() != os.path.abspath(STUB_ROOT)


_PRELUDE = '''\
import json, os, sys
sys.path[:0] = [{root!r}, {here!r}]
sys.argv = ["main.py", "--cpu"] + {argv!r}
REAL = {real!r}
if REAL:
    try:
        import torchvision  # noqa: F401
    except Exception:
        for _k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[_k]
        sys.path.insert(0, {shims!r})
import comfy.options
comfy.options.enable_args_parsing()
import torch
import comfy.model_management as mm
import inspect as _inspect
GEN_DYNAMIC = "for_dynamic" in _inspect.signature(mm.free_memory).parameters
from comfy_spies import *
import comfy_spies

def emit(value):
    sys.stdout.write("\\n{mark}" + json.dumps(value) + "\\n")
    sys.stdout.flush()

def load_custom_node(pack_dir):
    # What ComfyUI's load_custom_node does: import the pack's directory as
    # a module by its name.
    import importlib.util
    name = os.path.basename(pack_dir)
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(pack_dir, "__init__.py"), submodule_search_locations=[pack_dir])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

'''


def script_prelude(argv=(), root=None, real=None):
    root = root or comfy_root()
    real = using_real_checkout() if real is None else real
    return _PRELUDE.format(root=root, here=HERE, argv=list(argv), real=real,
                           shims=SHIMS, mark=_MARK)


def run_comfy_script(code, timeout=120, argv=(), env=None, root=None, real=None):
    """Run `code` (dedented) after the prelude; return the value of its
    last emit().  `argv` adds ComfyUI flags after --cpu.  root: another
    ComfyUI tree (a patched copy, a fixture; default comfy_root()), real:
    whether it is a real checkout (default: whether comfy_root() is)."""
    root = root or comfy_root()
    source = script_prelude(argv, root, real) + textwrap.dedent(code)
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", source], cwd=root, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    results = [line[len(_MARK):] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not results:
        raise AssertionError("comfy script failed (rc=%d, root %s)\n--- stdout\n%s\n--- stderr\n%s"
                             % (proc.returncode, root, proc.stdout[-4000:], proc.stderr[-6000:]))
    return json.loads(results[-1])
