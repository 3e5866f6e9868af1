"""Nodes of the numpy-1.x demo pack (they run in the pack's own worker)."""
import os
import sys

import numpy as np


def _where():
    return {"pid": os.getpid(), "python": "%d.%d.%d" % sys.version_info[:3], "numpy": np.__version__}


class MakeGradient:
    """Makes a float32 gradient image (numpy 1.x semantics)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"width": ("INT", {"default": 512, "min": 8, "max": 8192}),
                             "height": ("INT", {"default": 512, "min": 8, "max": 8192})}}

    RETURN_TYPES = ("ARRAY", "STRING")
    RETURN_NAMES = ("image", "where")
    FUNCTION = "make"
    CATEGORY = "bulkhead demo"
    DESCRIPTION = "A gradient, made under numpy 1.x."

    def make(self, width, height):
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        img = (x / max(width - 1, 1) + y / max(height - 1, 1)) / 2
        return (img, repr(_where()))


NODE_CLASS_MAPPINGS = {"MakeGradient": MakeGradient}
NODE_DISPLAY_NAME_MAPPINGS = {"MakeGradient": "Make gradient (numpy 1.x)"}
