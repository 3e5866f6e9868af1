"""Empty: see the package's docstring (`import torchvision.transforms as transforms`)."""
