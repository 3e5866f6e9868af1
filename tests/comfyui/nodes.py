"""A skeleton of ComfyUI's top-level `nodes` module (tests only): the
registries node packs are merged into, and nothing built in."""

MAX_RESOLUTION = 16384

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
EXTENSION_WEB_DIRS = {}
LOADED_MODULE_DIRS = {}


def interrupt_processing(value=True):
    import comfy.model_management
    comfy.model_management.interrupt_current_processing(value)
