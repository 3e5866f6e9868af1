"""ImportWatch: run a callback right after a module is first imported,
without importing it.  A worker uses it to set things up only when the
pack brings them in: the memory hooks when ComfyUI's memory manager is
imported, logging's configuration when logging is (importing logging
itself would cost every worker's start-up ~10 ms)."""

import sys


class ImportWatch:
    """A meta-path finder that lets the real finders find
    ``comfy.model_management`` and runs a callback right after the module
    executes, so the load_models_gpu wrap is in place before the pack's
    first call into it (the pack imports ComfyUI inside its own call)."""

    def __init__(self, name, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callback

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                callback(module)
        spec.loader = Loader()
        return spec
