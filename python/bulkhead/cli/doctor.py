"""``bulkhead doctor [--json] [COMFYUI_DIR]``: bulkhead's contract with a
ComfyUI, checked in it.  Imports the ComfyUI in the directory as under
``--cpu`` (its own prints go to stderr, keeping stdout for the report)
and prints every name bulkhead reads or calls there, its tier and whether
this ComfyUI offers it: host/contract.py's table and check, which
``comfy_pack`` also runs inside ComfyUI before the first worker spawns.
``python -m bulkhead doctor`` (``__main__.py``, which the C ``bulkhead
doctor`` execs) parses the arguments and calls ``main``."""

import contextlib
import json
import os
import re
import sys

from ..host import contract


def _comfyui_version(base):
    try:
        with open(os.path.join(base, "comfyui_version.py"), encoding="utf-8") as f:
            m = re.search(r"""__version__\s*=\s*["']([^"']+)""", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def main(comfyui=None, as_json=False):
    """``bulkhead doctor [--json] [COMFYUI_DIR]`` (comfyui: the directory,
    default $COMFYUI_PATH, else the current one).  Prints the report on
    stdout (ComfyUI's own prints go to stderr) and returns the exit status:
    0 nothing FATAL fails, 1 something FATAL fails, 2 no ComfyUI there."""
    base = comfyui or os.environ.get("COMFYUI_PATH") or os.getcwd()
    base = os.path.realpath(base)
    if not os.path.isfile(os.path.join(base, "comfy", "model_management.py")):
        print(f"python -m bulkhead doctor: no ComfyUI in {base} (no comfy/model_management.py); "
              "name its directory, or set COMFYUI_PATH", file=sys.stderr)
        return 2
    sys.path.insert(0, base)
    sys.argv = ["main.py", "--cpu"]
    # ComfyUI prints while it imports: keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            import comfy.options  # comfyui: comfy.options
            getattr(comfy.options, "enable_args_parsing", lambda: None)()
        except Exception as e:
            print(f"python -m bulkhead doctor: comfy.options: {e}", file=sys.stderr)
        report = contract.check(None)
    if report.comfyui and report.comfyui != base:
        print(f"python -m bulkhead doctor: note: comfy was imported from {report.comfyui}, not {base}",
              file=sys.stderr)
    version = _comfyui_version(base)
    if as_json:
        doc = report.to_dict()
        doc["version"] = version
        print(json.dumps(doc, indent=1))
    else:
        print(f"bulkhead doctor: ComfyUI at {report.comfyui or base}" + (f" (version {version})" if version else ""))
        print(report.format())
    return 0 if report.ok else 1
