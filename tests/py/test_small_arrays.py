"""#24 M1: many arrays past the inline size in one message.

Arrays of at most ARENA_ITEM_MAX bytes (past TENSOR_INLINE_MAX, which
travel inline) share shared-memory blocks within one message: each is an
aligned range of a block the message lends once, received as a zero-copy
view that keeps its block; the block goes back to its sender when the last
view of any range in it is gone.  So a reply of 1,000 arrays of 70 KB
lends some twenty blocks, not the 1,000 that passed the 256 a channel may
hold with their fds.  Every test here ends with the fds, children and
/dev/shm it started with (conftest's no_leaks).
"""

import gc

import numpy as np
import pytest

import bulkhead
from bulkhead import _native

N = 1000
SMALL = 70_000  # past the inline size (64 KiB), well under ARENA_ITEM_MAX


def _base(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def _returned(w):
    """Drops what this process holds and carries the return notes across
    (any call does), both ways."""
    gc.collect()
    w.call("operator:add", 1, 1)
    w.call("operator:add", 1, 1)


def test_the_sizes_that_share_blocks():
    assert _native.TENSOR_INLINE_MAX < SMALL <= _native.ARENA_ITEM_MAX
    assert _native.ARENA_ALIGN >= 64


def test_a_thousand_small_arrays_cross_both_ways(make_worker):
    w = make_worker(name="smallarrays")
    pid = w.start().pid

    # worker -> host: one reply of 1,000 arrays
    out = w.call("bh_testmod:small_arrays", N, SMALL)
    assert len(out) == N
    assert all(a.nbytes == SMALL and int(a[0]) == i % 251 and int(a[-1]) == i % 251
               for i, a in enumerate(out))
    assert all(type(_base(a)).__name__ == "Lease" for a in out)           # zero-copy views
    assert all(a.__array_interface__["data"][0] % 64 == 0 for a in out)   # aligned
    assert all(a.flags.writeable for a in out)
    peer = w.stats()["peer_blocks"]
    assert 1 <= peer <= 32, w.stats()   # a few arena blocks, not 1,000
    # views of one block do not alias: writing one leaves its neighbours
    out[0][:] = 7
    assert int(out[1][0]) == 1 and int(out[1][-1]) == 1

    # host -> worker: as many in one call, checked there
    sent = [np.full(SMALL, i % 251, dtype=np.uint8) for i in range(N)]
    assert w.call("bh_testmod:check_arrays", sent, SMALL) == N
    assert w.stats()["lent_blocks"] == 0   # the worker dropped its views: every block came back
    assert w.stats()["own_blocks"] <= 32, w.stats()

    # and back again, echoed: the worker's views are sent on as arrays
    back = w.call("bh_testmod:echo", sent)[0][0]
    assert len(back) == N and all(np.array_equal(a, b) for a, b in zip(sent, back))

    del out, back
    _returned(w)
    assert w.call("bh_testmod:pool_stats")["lent_blocks"] == 0   # the worker's blocks came back
    assert w.pid == pid and w.generation == 1


def test_a_kept_view_keeps_only_its_block(make_worker):
    """The host keeps one array of the reply: its block stays lent to the
    host (the view is valid, its data unchanged), every other block goes
    back to the worker; dropping the view returns the last one."""
    w = make_worker(name="keptview")
    w.start()
    out = w.call("bh_testmod:small_arrays", N, SMALL)
    kept = out[500]
    del out
    _returned(w)
    s = w.call("bh_testmod:pool_stats")
    assert s["lent_blocks"] == 1, s
    assert kept.nbytes == SMALL and int(kept[0]) == 500 % 251 and int(kept[-1]) == 500 % 251
    # the next reply reuses the blocks that came back
    again = w.call("bh_testmod:small_arrays", N, SMALL)
    assert int(again[999][0]) == 999 % 251 and int(kept[-1]) == 500 % 251
    del kept, again
    _returned(w)
    assert w.call("bh_testmod:pool_stats")["lent_blocks"] == 0


def test_replies_of_small_arrays_kept_by_the_host(make_worker):
    """ComfyUI's output cache keeps replies: eight replies of 1,000 arrays
    each, all kept, every one arrives (8,000 arrays in some 170 blocks)."""
    w = make_worker(name="keptreplies")
    w.start()
    kept = [w.call("bh_testmod:small_arrays", N, SMALL) for _ in range(8)]
    assert all(int(a[0]) == i % 251 for out in kept for i, a in enumerate(out))
    assert w.generation == 1
    del kept
    _returned(w)


def test_past_what_the_pools_lend_is_that_calls_error(make_worker):
    """Arrays past ARENA_ITEM_MAX keep a block each: 300 of them in one
    reply need more blocks holding an fd than a channel may have
    (BH_EPOOLFULL).  That call fails with the error, the same worker serves
    the next calls, 1,000 small arrays included, and both sides end with
    every block back."""
    w = make_worker(name="pastbound")
    pid = w.start().pid
    big = _native.ARENA_ITEM_MAX + 4096
    with pytest.raises(bulkhead.RemoteError) as ei:
        w.call("bh_testmod:many_arrays", 300, big)
    assert "BH_EPOOLFULL" in str(ei.value), str(ei.value)
    assert w.pid == pid
    out = w.call("bh_testmod:small_arrays", N, SMALL)
    assert len(out) == N and int(out[-1][0]) == (N - 1) % 251
    # the host's side of the same bound: its call fails before anything is sent
    with pytest.raises(_native.Error, match="BH_EPOOLFULL"):
        w.call("bh_testmod:echo", [np.zeros(big, np.uint8) for _ in range(300)])
    assert w.call("bh_testmod:check_arrays", out, SMALL) == N and w.pid == pid
    del out
    _returned(w)
    assert w.stats()["lent_blocks"] == 0
    assert w.call("bh_testmod:pool_stats")["lent_blocks"] == 0


@pytest.mark.torch
def test_torch_small_tensors_share_blocks(make_worker):
    torch = pytest.importorskip("torch")
    w = make_worker(name="smalltorch")
    w.start()
    sent = [torch.full((SMALL // 4,), float(i), dtype=torch.float32) for i in range(300)]
    back = w.call("bh_testmod:echo", sent)[0][0]
    assert len(back) == 300 and all(torch.equal(a, b) for a, b in zip(sent, back))
    assert all(t.data_ptr() % 64 == 0 for t in back)
    del back
    _returned(w)
    assert w.stats()["lent_blocks"] == 0
