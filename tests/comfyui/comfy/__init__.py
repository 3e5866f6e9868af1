"""A small stand-in for ComfyUI's `comfy` package (tests only; see ../README.md)."""
