"""An empty `torchvision` for running tests against a real ComfyUI checkout
where the installed torchvision cannot load (PyPI's builds are CUDA builds;
the test venv has CPU torch).  ComfyUI's model code imports torchvision and
torchvision.transforms at module level but the memory manager never calls
them.  comfyenv and the e2e servers put this directory on sys.path only
when `import torchvision` fails."""

from . import transforms  # noqa: F401  (`from torchvision import transforms`)
