"""bulkhead: run ComfyUI node packs in isolated worker processes under one
memory budget.  This package is the thin Python glue over the C core in
``bulkhead._native``."""

__version__ = "0.1.0"

from ._native import PeerClosed, ProtocolError, Timeout  # noqa: F401
from ._rpc import BulkheadError, HandleError, RemoteCallable, RemoteError, RemoteObject  # noqa: F401
from .host import CallTimeout, Worker, WorkerDied, WorkerStartError, describe_status  # noqa: F401
