"""Whether `comfy.cli_args` reads the real command line.

ComfyUI's `main.py` turns this on before anything imports `comfy.cli_args`;
a library that imports `comfy` without it gets the defaults of every flag.
"""

args_parsing = False


def enable_args_parsing(enable=True):
    global args_parsing
    args_parsing = enable
