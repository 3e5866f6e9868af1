"""#26: a host torch tensor sent again unchanged is copied once more, then
goes by reference.

The host's Peer keeps a SendCache (channel/tensors.py): a tensor's first
crossing is copied as any other, its second into a block kept for it,
sealed against writes before the worker maps it (copy-on-write there),
and from the third on the value names that block: no copy, no block.  An
in-place change (torch's ``_version``) is seen and copied again; a write
in the worker stays there; a tensor that dies drops its block.  Every test
ends with the fds, children and /dev/shm it started with (conftest's
no_leaks).
"""

import gc
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

N = 1 << 18  # float32: 1 MiB


def _settle(w):
    gc.collect()
    w.call("operator:add", 1, 1)
    w.call("operator:add", 1, 1)


def _blocks_taken(w):
    s = w.stats()
    return s["created"] + s["reused"]


def test_an_unchanged_tensor_is_copied_twice_then_sent_by_reference(make_worker):
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 2.0)
    assert w.call("bh_backrefs:first", t) == 2.0   # first crossing: a pooled block, as ever
    assert w.call("bh_backrefs:first", t) == 2.0   # second: copied into a sealed block, kept
    s, worker = w.stats(), w.call("bh_backrefs:stats")
    assert s["sealed_blocks"] == 1 and w.peer.sent.held_bytes == 4 * N
    for _ in range(20):
        rows, _ = w.call("bh_backrefs:inspect", t)
        assert rows[0]["sum"] == 2.0 * N
    after = w.stats()
    assert after["created"] == s["created"] and after["reused"] == s["reused"]  # no copy
    assert w.call("bh_backrefs:stats")["peer_blocks"] == worker["peer_blocks"]
    # the tensor dies: its block goes back to the pool, a sealed one that
    # the next tensor sent twice takes (no new block)
    del t
    _settle(w)
    s = w.stats()
    assert w.peer.sent.held_bytes == 0 and s["free_blocks"] == s["own_blocks"]
    u = torch.full((N,), 3.0)
    assert w.call("bh_backrefs:first", u) == 3.0
    assert w.call("bh_backrefs:first", u) == 3.0
    assert w.call("bh_backrefs:inspect", u)[0][0]["sum"] == 3.0 * N
    assert w.stats()["created"] == s["created"] and w.stats()["sealed_blocks"] == 1
    del u
    _settle(w)


def test_a_changed_tensor_is_copied_again(make_worker):
    """An in-place change bumps _version: the kept block is not named; the
    tensor is copied again (and kept again after a second unchanged send)."""
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 1.0)
    for _ in range(3):
        assert w.call("bh_backrefs:first", t) == 1.0
    taken = _blocks_taken(w)
    t.add_(1.0)
    assert w.call("bh_backrefs:first", t) == 2.0
    assert _blocks_taken(w) == taken + 1
    assert w.peer.sent.held_bytes == 0         # the stale copy was dropped
    t[7] = 5.0                                 # through an index: also a new version
    assert w.call("bh_backrefs:inspect", t)[0][0]["sum"] == 2.0 * N + 3.0
    view = t.view(512, 512)                    # a view: its own entry, its own version check
    view.mul_(0.5)
    assert w.call("bh_backrefs:first", t) == 1.0
    del t, view
    _settle(w)
    assert w.peer.sent.held_bytes == 0


def test_a_write_in_the_worker_stays_there(make_worker):
    """torch has no read-only tensors: the worker may write into the
    tensor it got.  The kept block is copy-on-write there: the host's
    tensor and the next crossing still have the host's bytes."""
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 3.0)
    w.call("bh_backrefs:first", t)
    w.call("bh_backrefs:first", t)
    taken = _blocks_taken(w)
    assert w.call("bh_backrefs:fill", t, 9.0) == 9.0 * N
    assert float(t.sum()) == 3.0 * N
    assert w.call("bh_backrefs:inspect", t)[0][0]["sum"] == 3.0 * N
    assert _blocks_taken(w) == taken
    del t
    _settle(w)


def test_twice_in_one_call_or_still_held_it_is_copied(make_worker):
    """A block goes out once until the worker returns it: the same tensor
    twice in one value, or again while the worker keeps it, is copied."""
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 4.0)
    w.call("bh_backrefs:first", t)
    w.call("bh_backrefs:first", t)
    taken = _blocks_taken(w)
    assert w.call("bh_backrefs:first_two", t, t) == (4.0, 4.0)
    assert _blocks_taken(w) == taken + 1
    w.call("bh_backrefs:keep", t)               # by reference, and the worker keeps it
    taken = _blocks_taken(w)
    assert w.call("bh_backrefs:first", t) == 4.0
    assert _blocks_taken(w) == taken + 1        # still lent: copied
    w.call("bh_backrefs:drop")
    _settle(w)
    taken = _blocks_taken(w)
    assert w.call("bh_backrefs:first", t) == 4.0
    assert _blocks_taken(w) == taken            # returned: by reference again
    del t
    _settle(w)


def test_what_is_kept_is_bounded_and_cleared(make_worker):
    w = make_worker(name="sendcache")
    w.start()
    cache = w.peer.sent
    cache.max_bytes = 3 * 4 * N                 # room for three
    ts = [torch.full((N,), float(i)) for i in range(5)]
    for _ in range(2):
        for i, t in enumerate(ts):
            assert w.call("bh_backrefs:first", t) == float(i)
    assert cache.held_bytes == 3 * 4 * N
    cache.clear()
    assert cache.held_bytes == 0 and len(cache) == 0
    _settle(w)
    s = w.stats()
    assert s["free_blocks"] == s["own_blocks"]
    del ts, t
    _settle(w)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_ten_thousand_re_sends_leave_fds_and_blocks_flat(make_worker):
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 1.0)
    for _ in range(3):
        w.call("bh_backrefs:first", t)
    _settle(w)
    fds, host, worker = _fds(), w.stats(), w.call("bh_backrefs:stats")
    for _ in range(10_000):
        assert w.call("builtins:len", t) == N
    _settle(w)
    assert _fds() == fds
    assert w.stats() == host
    assert w.call("bh_backrefs:stats") == worker
    del t
    _settle(w)


def test_a_worker_returning_its_cached_tensor_copies_it_twice_then_not(make_worker):
    """The other way (the worker's Peer keeps a SendCache too): a tensor
    the worker returns unchanged is copied on its first two returns, then
    names the block kept for it; the host maps it copy-on-write, and its
    write stays in the host; sent back to the worker untouched, it is a
    back ref, no copy."""
    w = make_worker(name="sendcache")
    w.start()
    for _ in range(2):
        assert float(w.call("bh_backrefs:cached", N, 2.0).sum()) == 2.0 * N
    worker = w.call("bh_backrefs:stats")
    assert worker["sealed_blocks"] == 1
    got = [w.call("bh_backrefs:cached", N, 2.0) for _ in range(3)]  # one view each: lent once
    after = w.call("bh_backrefs:stats")
    assert after["created"] + after["reused"] == worker["created"] + worker["reused"] + 2
    del got
    _settle(w)
    worker = w.call("bh_backrefs:stats")
    for _ in range(20):
        t = w.call("bh_backrefs:cached", N, 2.0)
        assert float(t[0]) == 2.0
        del t
    after = w.call("bh_backrefs:stats")
    assert after["created"] + after["reused"] == worker["created"] + worker["reused"]
    # sent back untouched: the worker's own block
    t = w.call("bh_backrefs:cached", N, 2.0)
    taken = _blocks_taken(w)
    assert w.call("bh_backrefs:inspect", t)[0][0]["sum"] == 2.0 * N
    assert _blocks_taken(w) == taken
    # written in the host: its own pages; sent back, copied
    t.fill_(5.0)
    assert w.call("bh_backrefs:inspect", t)[0][0]["sum"] == 5.0 * N
    assert _blocks_taken(w) == taken + 1
    del t
    _settle(w)
    assert float(w.call("bh_backrefs:cached", N, 2.0)[0]) == 2.0  # the worker's bytes
    # changed in the worker: copied again
    w.call("bh_backrefs:cached_add", N, 1.0)
    assert float(w.call("bh_backrefs:cached", N, 2.0)[0]) == 3.0
    _settle(w)


def test_a_full_release_drops_what_both_sides_keep(make_worker):
    """Worker.release() (the full ladder, as memory pressure asks) drops
    the host's kept blocks for that worker; the worker's ladder step for
    its blocks (worker/memory.py's _trim_shm) drops its own and counts
    them freed."""
    w = make_worker(name="sendcache")
    w.start()
    t = torch.full((N,), 1.0)
    for _ in range(2):
        w.call("bh_backrefs:first", t)
        w.call("bh_backrefs:cached", N, 2.0)
    _settle(w)
    assert w.peer.sent.held_bytes == 4 * N and w.call("bh_backrefs:stats")["sealed_blocks"] == 1
    with pytest.raises(NotImplementedError):  # a bare worker has no ladder; the host's part ran
        w.release()
    _settle(w)
    s = w.stats()
    assert w.peer.sent.held_bytes == 0 and s["free_blocks"] == s["own_blocks"]
    assert w.call("bulkhead.worker.memory:_trim_shm") >= 4 * N
    assert w.call("bh_backrefs:stats")["sealed_blocks"] == 0
    del t
    _settle(w)


def test_an_inference_tensor_is_copied_every_time(make_worker):
    """A tensor made under torch.inference_mode() (as ComfyUI runs its
    nodes) has no version counter, so a change could not be seen: it is
    copied on every crossing, and a change in place always arrives."""
    w = make_worker(name="sendcache")
    w.start()
    with torch.inference_mode():
        t = torch.full((N,), 1.0)
    for i in range(4):
        taken = _blocks_taken(w)
        assert w.call("bh_backrefs:first", t) == 1.0 + i
        assert _blocks_taken(w) == taken + 1
        with torch.inference_mode():
            t.add_(1.0)
    assert w.peer.sent.held_bytes == 0 and len(w.peer.sent) == 0
    del t
    _settle(w)
