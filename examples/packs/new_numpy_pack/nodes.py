"""Nodes of the numpy-2.x demo pack (they run in the pack's own worker)."""
import os
import sys

import numpy as np


def _where():
    return {"pid": os.getpid(), "python": "%d.%d.%d" % sys.version_info[:3], "numpy": np.__version__}


class Stats:
    """Summarises an array with numpy 2.x (np.unique_counts is 2.x only)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("ARRAY",), "levels": ("INT", {"default": 8, "min": 2, "max": 256})}}

    RETURN_TYPES = ("STRING", "STRING")
    RETURN_NAMES = ("summary", "where")
    FUNCTION = "run"
    CATEGORY = "bulkhead demo"
    OUTPUT_NODE = True

    def run(self, image, levels):
        q = np.floor(np.asarray(image) * (levels - 1) + 0.5).astype(np.int32)
        counts = np.unique_counts(q)  # numpy >= 2.0
        summary = f"{image.shape[1]}x{image.shape[0]} image, {len(counts.values)} levels, mean {float(image.mean()):.3f}"
        return (summary, repr(_where()))


NODE_CLASS_MAPPINGS = {"Stats": Stats}
NODE_DISPLAY_NAME_MAPPINGS = {"Stats": "Array stats (numpy 2.x)"}
