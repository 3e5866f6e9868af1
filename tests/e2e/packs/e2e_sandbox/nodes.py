"""The probe node: probe.py's attempts in the worker itself and in a
grandchild (the worker's child starts it), with the targets the test
wrote into targets.json beside this file."""
import json
import os
import subprocess
import sys

from . import probe

HERE = os.path.dirname(os.path.abspath(__file__))


class Probe:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"run": ("INT", {"default": 0})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "probe"
    CATEGORY = "e2e"
    OUTPUT_NODE = True

    def probe(self, run):
        with open(os.path.join(HERE, "targets.json")) as f:
            targets = json.load(f)
        out = {"worker": probe.run(targets, trace=False)}
        script = os.path.join(HERE, "probe.py")
        child = ("import subprocess, sys; r = subprocess.run([sys.executable, sys.argv[1], sys.argv[2]], "
                 "capture_output=True, text=True); sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)")
        r = subprocess.run([sys.executable, "-c", child, script, os.path.join(HERE, "targets.json")],
                           capture_output=True, text=True, timeout=60)
        try:
            out["grandchild"] = json.loads(r.stdout)
        except ValueError:
            out["grandchild"] = {"failed": r.stderr[-2000:]}
        text = json.dumps(out, sort_keys=True)
        return {"ui": {"text": [text]}, "result": (text,)}


class Refused:
    """Opens a file the sandbox refuses, so the error reaches the host."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"path": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "write"
    CATEGORY = "e2e"
    OUTPUT_NODE = True

    def write(self, path):
        with open(path, "w") as f:
            f.write("x")
        return {"ui": {"text": [path]}, "result": (path,)}


NODE_CLASS_MAPPINGS = {"E2ESandboxProbe": Probe, "E2ESandboxRefused": Refused}
NODE_DISPLAY_NAME_MAPPINGS = {}
