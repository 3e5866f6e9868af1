"""What a request to a worker raises when the worker itself fails, not
the code it runs (that is a RemoteError, channel/peer.py): it could not
start (``WorkerStartError``), it died (``WorkerDied``), it stopped
answering (``CallTimeout``), it stayed in a call past a release's
deadline (``WorkerBusy``) or it sent a malformed frame
(``ProtocolError``, _native's); and the words for how a worker process
ended (``describe_status``), which those errors and the host's log lines
carry.  ``bulkhead`` offers them under its own name (its __init__.py)."""

import os
import signal

from .. import _native
from ..channel.peer import BulkheadError

ProtocolError = _native.ProtocolError


class WorkerStartError(BulkheadError):
    """The worker could not be started, or died before its HELLO."""


class WorkerDied(BulkheadError):
    """The worker died while a call waited on it."""

    def __init__(self, message, status=None, output=""):
        super().__init__(message)
        self.status = status
        self.output = output

    @property
    def signal(self):
        return os.WTERMSIG(self.status) if self.status is not None and os.WIFSIGNALED(self.status) else None

    @property
    def exit_code(self):
        return os.WEXITSTATUS(self.status) if self.status is not None and os.WIFEXITED(self.status) else None


class CallTimeout(BulkheadError):
    """A call did not finish in time; the worker was killed.  ``stopped``
    says whether it was stopped (SIGSTOP, a debugger) rather than busy."""

    def __init__(self, message, stopped=False):
        super().__init__(message)
        self.stopped = stopped


class WorkerBusy(BulkheadError):
    """A release asked with a deadline found the worker in a call past it;
    nothing was sent (the release does not run later)."""


def describe_status(status):
    """Words for a waitpid status."""
    if status is None:
        return "is still running"
    if status == _native.STATUS_UNREPORTED:   # its zygote stopped or hung (bh_proc_wait)
        return ("ended (its exit status is unknown: the zygote that forked it did not report it, stopped or "
                "hung; a new zygote forks the next worker)")
    if status < 0:   # a zygote's child whose zygote died first: no one could tell (bh_proc_wait)
        return "ended (its exit status is unknown: the zygote that forked it had gone)"
    if os.WIFSIGNALED(status):
        n = os.WTERMSIG(status)
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        return f"was killed by signal {n} ({name})"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status:#x}"
