"""bulkhead demo: a small workflow through two packs that cannot share a
process.

examples/packs/old_numpy_pack needs numpy 1.x (Python 3.11);
examples/packs/new_numpy_pack needs numpy 2.x (Python 3.12).  Each
declares that in its comfy-env.toml and its __init__.py is one call,
``bulkhead.comfy_pack(__file__)``.  This script does what ComfyUI does:
imports both packs as custom nodes (after `bulkhead install` built their
environments), then runs   MakeGradient -> Stats   the way ComfyUI's
executor calls nodes, and prints which process ran which node, under which
interpreter and numpy, in what time, and what the memory ledger shows.

ComfyUI is COMFYUI_PATH when set, else the ComfyUI-shaped package in
tests/comfyui (the embedded default).  Run by `make demo`.
"""

import importlib.util
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKS = os.path.join(HERE, "packs")


def comfy_root():
    return os.environ.get("COMFYUI_PATH") or os.path.join(ROOT, "tests", "comfyui")


def import_custom_node(pack_dir):
    """What ComfyUI's load_custom_node does: import the pack's directory as a
    module by its name."""
    name = os.path.basename(pack_dir)
    spec = importlib.util.spec_from_file_location(name, os.path.join(pack_dir, "__init__.py"),
                                                  submodule_search_locations=[pack_dir])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_node(cls, **inputs):
    """ComfyUI's executor in one line: instantiate, call FUNCTION."""
    t0 = time.perf_counter()
    out = getattr(cls(), cls.FUNCTION)(**inputs)
    return out, (time.perf_counter() - t0) * 1e3


def main():
    sys.path.insert(0, comfy_root())
    sys.argv = ["main.py", "--cpu"]
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.model_management  # noqa: F401  (ComfyUI is up: the memory layer attaches)
    import numpy as np

    import bulkhead

    print(f"host: pid {os.getpid()}, Python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"ComfyUI from {comfy_root()}")
    from bulkhead.host import nodes, states
    mappings = {}
    for pack in ("old_numpy_pack", "new_numpy_pack"):
        t0 = time.perf_counter()
        mod = import_custom_node(os.path.join(PACKS, pack))
        mappings.update(mod.NODE_CLASS_MAPPINGS)
        rt = states.runtime(os.path.join(PACKS, pack))
        how = ("node metadata from the cache, no worker started" if rt.from_cache
               else "node metadata from a worker started for it")
        print(f"loaded {pack} in {(time.perf_counter() - t0) * 1e3:.0f} ms ({how}): "
              f"{', '.join(mod.NODE_DISPLAY_NAME_MAPPINGS.values())}")
    print()

    print("workflow: MakeGradient(640x480) -> Stats(levels=16)")
    for run in (1, 2):
        (image, where_a), ms_a = run_node(mappings["MakeGradient"], width=640, height=480)
        (summary, where_b), ms_b = run_node(mappings["Stats"], image=image, levels=16)
        label = "first run" if run == 1 else "second run (workers warm)"
        print(f"  {label}:")
        print(f"    MakeGradient  {ms_a:8.1f} ms  in {where_a}")
        print(f"    Stats         {ms_b:8.1f} ms  in {where_b}")
        print(f"    -> {summary}")
    print(f"  the image crossed as a numpy array: {type(image).__name__} {image.shape} {image.dtype}\n")

    hm = bulkhead.host_memory()
    cli = os.environ.get("BULKHEAD_CLI")
    if cli and os.access(cli, os.X_OK):
        print("bulkhead status (the machine-wide ledger):")
        sys.stdout.flush()
        subprocess.run([cli, "status", "--ledger", hm.ledger.path], check=False)
    nodes.close_all()
    hm.close()


if __name__ == "__main__":
    main()
