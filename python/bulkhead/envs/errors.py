"""The errors of building an environment.  Here, not in build.py, so
that the modules build.py drives (conda.py, cudawheels.py) raise them
without importing build.py back: build.py names them too, for its
callers."""

from ..channel.peer import BulkheadError


class EnvBuildError(BulkheadError):
    """An environment could not be built.  ``output_tail`` holds the last
    lines of the failing command's output, ``returncode`` its status."""

    def __init__(self, message, output_tail="", returncode=None):
        super().__init__(message)
        self.output_tail = output_tail
        self.returncode = returncode


class InterpreterNotFound(EnvBuildError):
    """No interpreter of the requested version.  ``found`` lists
    ``(version, path, source)`` of every interpreter that was seen."""

    def __init__(self, message, found=()):
        super().__init__(message)
        self.found = list(found)
