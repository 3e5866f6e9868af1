"""A skeleton of ComfyUI's `comfy_api` package (tests only): the V3 node
API under `comfy_api.latest` (see latest/__init__.py).  Written for
bulkhead from a reading of upstream's behaviour; no upstream code."""
