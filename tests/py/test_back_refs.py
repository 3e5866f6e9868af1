"""#26: a tensor that came from the peer crosses back by reference.

A worker's reply lends the host blocks of the worker's own; the host's
arrays and tensors are views of them.  Sent back to that worker, such a
value names the block it already lives in (a back ref, protocol 6): the
worker gets a view of its own block, no copy, no block made on either
side.  Blocks live while any view of them lives, on either side.  Every
test here ends with the fds, children and /dev/shm it started with
(conftest's no_leaks).
"""

import gc

import numpy as np
import pytest

N = 1 << 18  # float32: 1 MiB, a block of its own


def _returned(w):
    """Drops what this process holds and carries the return notes across
    (any call does), both ways."""
    gc.collect()
    w.call("operator:add", 1, 1)
    w.call("operator:add", 1, 1)


def test_a_worker_array_sent_back_is_a_view_of_its_block(make_worker):
    w = make_worker(name="backrefs")
    w.start()
    a = w.call("bh_backrefs:make", N, "numpy", 2.0)
    host, worker = w.stats(), w.call("bh_backrefs:stats")
    assert host["peer_blocks"] == 1 and worker["lent_blocks"] == 1

    # the array, itself again, and an aligned part of it: three back refs
    rows, after = w.call("bh_backrefs:inspect", a, a, a[16:])
    for row, n in zip(rows, (N, N, N - 16)):
        assert row == {"sum": 2.0 * n, "address": row["address"], "n": n,
                       "own": True, "readonly": True, "writeable": False}, row
    assert rows[0]["address"] == rows[1]["address"] == rows[2]["address"] - 64
    # nothing copied: no block made on either side, none mapped anew
    assert w.stats()["created"] == host["created"] == 0
    assert after["created"] == worker["created"] and after["peer_blocks"] == worker["peer_blocks"]
    assert after["own_blocks"] == worker["own_blocks"]

    # a part at an offset not 64-byte aligned is copied, as before
    rows, _ = w.call("bh_backrefs:inspect", a[1:])
    assert rows[0]["own"] is False and rows[0]["sum"] == 2.0 * (N - 1)
    assert w.stats()["created"] == 1

    # the host's own arrays are unchanged by all this and still its views
    assert a.flags.writeable and float(a.sum()) == 2.0 * N
    del a
    _returned(w)
    assert w.call("bh_backrefs:stats")["lent_blocks"] == 0


@pytest.mark.torch
def test_a_worker_tensor_sent_back_is_a_view_of_its_block(make_worker):
    torch = pytest.importorskip("torch")
    w = make_worker(name="backrefs")
    w.start()
    t = w.call("bh_backrefs:make", N, "torch", 3.0)
    assert isinstance(t, torch.Tensor)
    worker = w.call("bh_backrefs:stats")
    rows, after = w.call("bh_backrefs:inspect", t, t[16:], t.view(512, 512))
    assert [r["sum"] for r in rows] == [3.0 * N, 3.0 * (N - 16), 3.0 * N]
    assert rows[0]["address"] == rows[1]["address"] - 64 == rows[2]["address"] - 0
    assert w.stats()["created"] == 0
    assert after["created"] == worker["created"] and after["peer_blocks"] == worker["peer_blocks"]
    # torch has no read-only tensors: a write is seen by the host's view of
    # the same block, as it would be by a node sharing the tensor in-process
    assert w.call("bh_backrefs:write", t, 1.0) == float(N)
    assert float(t.sum()) == float(N)
    del t
    _returned(w)
    assert w.call("bh_backrefs:stats")["lent_blocks"] == 0


def test_a_block_outlives_the_return_while_the_worker_holds_a_view(make_worker):
    """The host sends a worker's array back and drops its own view: the
    block's return reaches the worker, but the view the worker keeps holds
    the block, so the worker's next arrays do not reuse it."""
    w = make_worker(name="backrefs")
    w.start()
    a = w.call("bh_backrefs:make", N, "numpy", 5.0)
    kept_at = w.call("bh_backrefs:keep", a)
    del a
    _returned(w)
    s = w.call("bh_backrefs:stats")
    assert s["lent_blocks"] == 0 and s["free_blocks"] == 0   # returned, but held
    others = [w.call("bh_backrefs:make", N, "numpy", 7.0) for _ in range(3)]
    assert w.call("bh_backrefs:kept_sum") == (5.0 * N, kept_at)
    assert all(float(o.sum()) == 7.0 * N for o in others)
    del others
    s = w.call("bh_backrefs:drop")
    _returned(w)
    s = w.call("bh_backrefs:stats")
    assert s["lent_blocks"] == 0 and s["free_blocks"] == s["own_blocks"]


def test_a_host_array_the_worker_sends_back_is_the_hosts_own(make_worker):
    """The other way: the worker echoes the host's array; the host gets a
    read-only view of its own block, and neither side made a block for the
    reply."""
    w = make_worker(name="backrefs")
    w.start()
    sent = np.full(N, 4.0, dtype=np.float32)
    back = w.call("bh_testmod:echo", sent)[0][0]
    created = w.stats()["created"]
    assert created == 1 and w.call("bh_backrefs:stats")["created"] == 0
    assert np.array_equal(back, sent) and not back.flags.writeable
    base = back
    while getattr(base, "base", None) is not None:
        base = base.base
    assert type(base).__name__ == "Lease" and base.own and base.readonly
    del back, base
    _returned(w)
    assert w.stats()["lent_blocks"] == 0


def test_re_sending_a_worker_result_makes_no_block(make_worker):
    """The pattern ComfyUI's output cache makes: the same result fed to the
    next call again and again.  Blocks, fds and mappings stay flat."""
    w = make_worker(name="backrefs")
    w.start()
    a = w.call("bh_backrefs:make", N, "numpy", 1.0)
    w.call("bh_backrefs:inspect", a)
    host, worker = w.stats(), w.call("bh_backrefs:stats")
    for _ in range(200):
        rows, _ = w.call("bh_backrefs:inspect", a, a)
        assert rows[0]["sum"] == float(N) and rows[0]["own"]
    assert w.stats() == host
    after = w.call("bh_backrefs:stats")
    for k in ("created", "own_blocks", "peer_blocks", "lent_blocks"):
        assert after[k] == worker[k], (k, after, worker)
    del a
    _returned(w)


def _fds():
    import os
    return len(os.listdir("/proc/self/fd"))


def test_ten_thousand_re_sends_leave_fds_and_blocks_flat(make_worker):
    """A worker's result sent back 10,000 times (the pool's lookup, the
    lease, the view on the worker's side each time): no fd, block or
    mapping more on either side."""
    w = make_worker(name="backrefs")
    w.start()
    a = w.call("bh_backrefs:make", N, "numpy", 1.0)
    w.call("numpy:ndim", a)
    fds, host, worker = _fds(), w.stats(), w.call("bh_backrefs:stats")
    for _ in range(10_000):
        assert w.call("numpy:ndim", a) == 1
    gc.collect()
    assert _fds() == fds
    assert w.stats() == host
    assert w.call("bh_backrefs:stats") == worker
    del a
    _returned(w)
