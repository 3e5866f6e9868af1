"""Where models, inputs and outputs live: a skeleton of ComfyUI's
`folder_paths` (tests only).

Every folder kind maps to (list of directories, set of file extensions);
directories that do not exist are listed but contribute no files.  The base
is --base-directory when the flags were parsed (main.py), else
COMFYUI_STUB_BASE, else this directory; the set_*_directory functions move
one folder, as upstream's.
"""

import os
import sys

supported_pt_extensions = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}

# main.py parses the flags before it imports this module; anything else
# that imports it (a worker, a test) gets the other two.
_args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
if getattr(_args, "base_directory", None):
    base_path = os.path.abspath(_args.base_directory)
else:
    base_path = os.environ.get("COMFYUI_STUB_BASE", os.path.dirname(os.path.realpath(__file__)))
models_dir = os.path.join(base_path, "models")

folder_names_and_paths = {
    name: ([os.path.join(models_dir, name)], set(supported_pt_extensions))
    for name in ("checkpoints", "configs", "loras", "vae", "text_encoders", "diffusion_models",
                 "clip_vision", "embeddings", "upscale_models", "controlnet")
}
folder_names_and_paths["custom_nodes"] = ([os.path.join(base_path, "custom_nodes")], set())

output_directory = os.path.join(base_path, "output")
input_directory = os.path.join(base_path, "input")
temp_directory = os.path.join(base_path, "temp")
user_directory = os.path.join(base_path, "user")


def set_output_directory(output_dir):
    global output_directory
    output_directory = output_dir


def set_input_directory(input_dir):
    global input_directory
    input_directory = input_dir


def set_temp_directory(temp_dir):
    global temp_directory
    temp_directory = temp_dir


def set_user_directory(user_dir):
    global user_directory
    user_directory = user_dir


def get_output_directory():
    return output_directory


def get_input_directory():
    return input_directory


def get_temp_directory():
    return temp_directory


def get_user_directory():
    return user_directory


def add_model_folder_path(folder_name, full_folder_path, is_default=False):
    paths, _ = folder_names_and_paths.setdefault(folder_name, ([], set()))
    if full_folder_path in paths:
        paths.remove(full_folder_path)
    if is_default:
        paths.insert(0, full_folder_path)
    else:
        paths.append(full_folder_path)


def get_folder_paths(folder_name):
    return list(folder_names_and_paths[folder_name][0])


def get_filename_list(folder_name):
    """Files (relative paths, '/'-separated) under every directory of the kind
    whose extension is accepted (an empty extension set accepts all)."""
    paths, extensions = folder_names_and_paths[folder_name]
    found = set()
    for root in paths:
        for dirpath, _dirs, files in os.walk(root, followlinks=True):
            for f in files:
                if extensions and os.path.splitext(f)[1].lower() not in extensions:
                    continue
                found.add(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(found)


def get_full_path(folder_name, filename):
    if folder_name not in folder_names_and_paths:
        return None
    for root in folder_names_and_paths[folder_name][0]:
        candidate = os.path.join(root, os.path.normpath("/" + filename).lstrip("/"))
        if os.path.isfile(candidate):
            return candidate
    return None


def get_full_path_or_raise(folder_name, filename):
    path = get_full_path(folder_name, filename)
    if path is None:
        raise FileNotFoundError(f"Model in folder '{folder_name}' with filename '{filename}' not found.")
    return path
