"""when_imported(name, callback): run a callback right after a module is
first imported, without importing it.  A worker uses it to set things up
only when the pack brings them in: the memory hooks and ComfyUI's flags
when ComfyUI's modules are imported, logging's configuration when logging
is (importing logging itself would cost every worker's start-up ~10 ms)."""

import sys


class _Watch:
    """A meta-path finder: when one of the named modules is imported, the
    real finders find it and the callback runs right after it executes."""

    def __init__(self):
        self.callbacks = {}

    def find_spec(self, fullname, path=None, target=None):
        callbacks = self.callbacks.pop(fullname, None)
        if not callbacks:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                for callback in callbacks:
                    callback(module)

            def __getattr__(self, name):  # get_source, is_package, ...
                return getattr(loader, name)
        spec.loader = Loader()
        return spec


_watch = _Watch()


def when_imported(name, callback):
    """Runs callback(module) right after `name` is first imported (at once
    if it already is).  Several callbacks per name run in order."""
    mod = sys.modules.get(name)
    if mod is not None:
        callback(mod)
        return
    _watch.callbacks.setdefault(name, []).append(callback)
    if _watch not in sys.meta_path:
        sys.meta_path.insert(0, _watch)
