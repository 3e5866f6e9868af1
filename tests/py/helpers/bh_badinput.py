"""Worker-side pieces of the bad-input catalogue (tests/py/test_bad_input.py)."""

import os


class PackModel:
    """Stands for an object only the worker can hold (a MODEL patcher)."""


def make_held():
    """An object the host gets as a handle (RemoteObject)."""
    from bulkhead import worker
    return worker._peer.hold(PackModel())


def takes(obj):
    return type(obj).__name__


def huge(kind, n):
    """A value of n bytes/characters: over what one message carries."""
    return "x" * n if kind == "str" else bytes(n)


def ledger_record():
    """This worker's own record in the ledger it joined, as the host reads it."""
    from bulkhead import _native
    with _native.Ledger(os.environ["BULKHEAD_LEDGER"]) as l:
        return l.read(os.getpid())
