"""The errors of building an environment.  Here, not in build.py, so
that the modules build.py drives (conda.py, cudawheels.py) raise them
without importing build.py back: build.py names them too, for its
callers.  And ``short``, how an error's text is cut to fit one line of
a log: build.py's ``brief`` cuts a failed build's that way, and the host
(host/states.py, which may import envs/ where envs/ may not import
host/) every pack's reason."""

from ..channel.peer import BulkheadError


def short(text, limit):
    """text on one line (its whitespace runs one space), cut to at most
    limit characters with "..." where it is longer."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
