"""An empty `torchvision` for running tests against a real ComfyUI checkout
where the installed torchvision cannot load (PyPI's builds are CUDA builds;
the test venv has CPU torch).  ComfyUI's model code imports torchvision at
module level but the memory manager never calls it.  comfyenv puts this
directory on sys.path only when `import torchvision` fails."""

import types

transforms = types.ModuleType("torchvision.transforms")
