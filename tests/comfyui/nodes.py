"""A skeleton of ComfyUI's top-level `nodes` module (tests only): the
registries node packs are merged into, nothing built in, and the loading of
custom node packages as upstream does it.

`init_extra_nodes()` (main.py awaits it once the PromptServer exists) walks
every `custom_nodes` folder (folder_paths): each entry that is a folder or
a `.py` file, not `__pycache__` and not `*.disabled`, is imported by
`load_custom_node`: a folder's `__init__.py` is executed as a module whose
name is the folder's PATH (dots replaced by `_x_`, as upstream) and put in
sys.modules under it; its `WEB_DIRECTORY` (relative to the folder) is served
under /extensions/<folder name>/; its NODE_CLASS_MAPPINGS and
NODE_DISPLAY_NAME_MAPPINGS are merged (a name already built in is kept);
each class gets RELATIVE_PYTHON_MODULE "custom_nodes.<name>".  A package
that raises is logged with its traceback and listed "(IMPORT FAILED)" in
the import-times table, and the server starts anyway.  A package without
NODE_CLASS_MAPPINGS but with a V3 `comfy_entrypoint()` is loaded through
its ComfyExtension (on_load, get_node_list; each node under its schema's
node_id).  Not here: pyproject `[tool.comfy] web` folders and the API
nodes.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import importlib.util
import inspect
import logging
import os
import sys
import time
import traceback

MAX_RESOLUTION = 16384

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
EXTENSION_WEB_DIRS = {}
LOADED_MODULE_DIRS = {}


def interrupt_processing(value=True):
    import comfy.model_management
    comfy.model_management.interrupt_current_processing(value)


def get_module_name(module_path):
    """The pack's name: its folder's (or file's, without .py) base name."""
    base = os.path.basename(os.path.normpath(module_path))
    return os.path.splitext(base)[0] if os.path.isfile(module_path) else base


async def load_custom_node(module_path, ignore=set(), module_parent="custom_nodes"):
    """Imports one custom node package; True when it brought nodes."""
    module_name = get_module_name(module_path)
    if os.path.isfile(module_path):
        sys_module_name = os.path.splitext(module_path)[0]
        init, module_dir = module_path, os.path.dirname(module_path)
    else:
        sys_module_name = module_path.replace(".", "_x_")
        init, module_dir = os.path.join(module_path, "__init__.py"), module_path
    try:
        spec = importlib.util.spec_from_file_location(sys_module_name, init)
        module = importlib.util.module_from_spec(spec)
        sys.modules[sys_module_name] = module
        spec.loader.exec_module(module)
        LOADED_MODULE_DIRS[module_name] = os.path.abspath(module_dir)

        web = getattr(module, "WEB_DIRECTORY", None)
        if web is not None:
            web_dir = os.path.abspath(os.path.join(module_dir, web))
            if os.path.isdir(web_dir):
                EXTENSION_WEB_DIRS[module_name] = web_dir

        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if mappings is None and hasattr(module, "comfy_entrypoint"):
            return await _load_extension(module, module_path, module_name, ignore, module_parent)
        if mappings is None:
            logging.warning(f"Skip {module_path} module for custom nodes due to the lack of "
                            "NODE_CLASS_MAPPINGS or NODES_LIST (need one).")
            return False
        for name, node_cls in mappings.items():
            if name not in ignore:
                NODE_CLASS_MAPPINGS[name] = node_cls
                node_cls.RELATIVE_PYTHON_MODULE = f"{module_parent}.{module_name}"
        NODE_DISPLAY_NAME_MAPPINGS.update(getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None) or {})
        return True
    except Exception as e:
        logging.warning(traceback.format_exc())
        logging.warning(f"Cannot import {module_path} module for custom nodes: {e}")
        return False


async def _load_extension(module, module_path, module_name, ignore, module_parent):
    """A V3 pack: comfy_entrypoint() (awaited when a coroutine function)
    must give a ComfyExtension; its on_load() is awaited (as upstream does
    since after v0.3.64, which never calls it), then each class of its
    get_node_list() registered under its schema's node_id, with the
    schema's display name.  Anything wrong is one warning and no nodes."""
    from comfy_api.latest import ComfyExtension
    entrypoint = module.comfy_entrypoint
    if not callable(entrypoint):
        logging.warning(f"comfy_entrypoint in {module_path} is not callable, skipping.")
        return False
    try:
        extension = await entrypoint() if inspect.iscoroutinefunction(entrypoint) else entrypoint()
        if not isinstance(extension, ComfyExtension):
            logging.warning(f"comfy_entrypoint in {module_path} did not return a ComfyExtension, skipping.")
            return False
        await extension.on_load()
        node_list = await extension.get_node_list()
        if not isinstance(node_list, list):
            logging.warning(f"comfy_entrypoint in {module_path} did not return a list of nodes, skipping.")
            return False
        for node_cls in node_list:
            schema = node_cls.GET_SCHEMA()
            if schema.node_id not in ignore:
                NODE_CLASS_MAPPINGS[schema.node_id] = node_cls
                node_cls.RELATIVE_PYTHON_MODULE = f"{module_parent}.{module_name}"
            if schema.display_name is not None:
                NODE_DISPLAY_NAME_MAPPINGS[schema.node_id] = schema.display_name
        return True
    except Exception as e:
        logging.warning(f"Error while calling comfy_entrypoint in {module_path}: {e}")
        return False


async def init_external_custom_nodes():
    import folder_paths
    from comfy.cli_args import args
    base_node_names = set(NODE_CLASS_MAPPINGS)
    times = []
    for custom_node_path in folder_paths.get_folder_paths("custom_nodes"):
        if not os.path.isdir(custom_node_path):
            continue
        for entry in sorted(os.listdir(os.path.realpath(custom_node_path))):
            module_path = os.path.join(custom_node_path, entry)
            if entry == "__pycache__" or module_path.endswith(".disabled"):
                continue
            if os.path.isfile(module_path) and not module_path.endswith(".py"):
                continue
            if args.disable_all_custom_nodes and entry not in args.whitelist_custom_nodes:
                logging.info(f"Skipping {entry} due to disable_all_custom_nodes and whitelist_custom_nodes")
                continue
            t0 = time.perf_counter()
            ok = await load_custom_node(module_path, base_node_names)
            times.append((time.perf_counter() - t0, module_path, ok))
    if times:
        logging.info("\nImport times for custom nodes:")
        for seconds, path, ok in sorted(times):
            logging.info("{:6.1f} seconds{}: {}".format(seconds, "" if ok else " (IMPORT FAILED)", path))
        logging.info("")


async def init_extra_nodes(init_custom_nodes=True, init_api_nodes=True):
    """Upstream loads its comfy_extras and API nodes here too; the skeleton
    has none, so only the custom nodes."""
    if init_custom_nodes:
        await init_external_custom_nodes()
    else:
        logging.info("Skipping loading of custom nodes")
