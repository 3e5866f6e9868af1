"""#26: pack A's output into pack B's worker.

Worker A's reply lends the host a block of A's; the host's array is a
view of it.  Sent to worker B, that array goes one of two ways (#40):

- A block A sealed against writes before lending it (a torch tensor A
  keeps and sends again: tensors.SendCache's block, from its second
  crossing) goes as a forward (protocol 7): the host introduces A's block
  to B (its memfd, which a host keeps for such blocks of 1 MiB or more) as
  a block of its own channel with B, and B maps it copy-on-write.  The
  host copies nothing and makes no block; B's writes stay in B; A never
  reuses a block that was forwarded (protocol 10: B has its memfd for
  good), but retires it when it lets go; a block whose owner died stays
  readable to the holders.
- Any other block (A's pool reuses it for its next output) is copied by
  the host into a block of its channel with B, which B has mapped already
  from the last such copy: one memcpy, no page faulted afresh in B, and A
  gets its block back for its next output.  B never sees a block A reuses.

Every test ends with the fds, children and /dev/shm it started with
(conftest's no_leaks).
"""

import gc
import os
import select
import signal

import numpy as np
import pytest

N = 1 << 18  # float32: 1 MiB, a block of its own, forwarded


def _settle(*workers):
    """Drops what this process holds and carries the return and retire
    notes across (any call does), both ways, for each worker."""
    gc.collect()
    for w in workers:
        w.call("operator:add", 1, 1)
        w.call("operator:add", 1, 1)


def _pair(make_worker):
    a, b = make_worker(name="fwd-a"), make_worker(name="fwd-b")
    a.start()
    b.start()
    return a, b


def _sealed(a, n, fill=1.0):
    """A's cached torch tensor of n float32 as the host gets it on its
    second crossing: in the block A keeps for it, sealed (SendCache), which
    the host forwards."""
    pytest.importorskip("torch")
    a.call("bh_backrefs:cached", n, fill)  # the first crossing: copied
    t = a.call("bh_backrefs:cached", n, fill)
    assert a.call("bh_backrefs:stats")["sealed_blocks"] >= 1
    return t


def _sealed_bytes(a, n, fill):
    """A's kept uint8 tensor of n bytes `fill` on its second crossing (in
    its sealed block: what the host forwards)."""
    pytest.importorskip("torch")
    a.call("bh_fwdscope:kept", n, fill)
    return a.call("bh_fwdscope:kept", n, fill)


def test_a_workers_new_array_goes_to_another_worker_copied_once_by_the_host(make_worker):
    """A's array in a block of A's pool (not sealed: A's next output takes
    it again) is copied by the host into a block of its own for B, sealed
    against writes (B maps it copy-on-write, so an array B hands back as
    it arrived is the host's object, as with a forward); the host keeps no
    fd of A's block, and A, given its block back, reuses it for its next
    output (#40: forwarding it spent it, so each output took a fresh
    memfd)."""
    a, b = _pair(make_worker)
    x = a.call("bh_backrefs:make", N, "numpy", 2.0)
    assert a.stats()["peer_fds"] == 0  # not kept: never forwarded
    host_b, worker_a = b.stats(), a.call("bh_backrefs:stats")
    rows, _ = b.call("bh_backrefs:inspect", x)
    assert rows[0]["sum"] == 2.0 * N
    assert rows[0]["own"] is False  # the host's block, mapped in B
    after = b.stats()
    assert after["forwarded"] == host_b["forwarded"]
    assert after["created"] + after["reused"] == host_b["created"] + host_b["reused"] + 1
    assert after["sealed_blocks"] == host_b["sealed_blocks"] + 1
    assert b.call("bh_backrefs:copy_on_write", x)  # sealed: B's writes stay B's
    del x
    _settle(a, b)
    y = a.call("bh_backrefs:make", N, "numpy", 3.0)
    s = a.call("bh_backrefs:stats")
    assert s["created"] == worker_a["created"] and s["spent"] == 0  # the same block again
    assert b.call("bh_backrefs:inspect", y)[0][0]["sum"] == 3.0 * N
    del y
    _settle(a, b)


@pytest.mark.torch
def test_a_workers_sealed_tensor_goes_to_another_worker_without_a_copy(make_worker):
    """A's kept tensor (its sealed block) goes to B as a forward, and
    10,000 forwards of it (lent, returned, kept dormant, lent again) leave
    no fd, block or mapping more anywhere, nothing copied; when A lets it
    go, A retires the block and B unmaps it."""
    a, b = _pair(make_worker)
    x = _sealed(a, N, 2.0)
    host_b, worker_b = b.stats(), b.call("bh_backrefs:stats")
    assert a.stats()["peer_fds"] == 1  # kept, for a forward

    rows, during = b.call("bh_backrefs:inspect", x, x)
    assert [r["sum"] for r in rows] == [2.0 * N, 2.0 * N]
    after = b.stats()
    # the host made no block and copied nothing: one forward each, the
    # same block for both (lent once)
    assert after["created"] == host_b["created"] and after["reused"] == host_b["reused"]
    assert after["forwarded"] == host_b["forwarded"] + 2
    assert during["peer_blocks"] == worker_b["peer_blocks"] + 2
    # B counts none of it as its own (the ledger counts it on A)
    assert during["own_bytes"] == worker_b["own_bytes"]
    _settle(b)
    # B returned them: no forward is lent; B keeps one mapping of A's block
    # (a dormant forward, #40) for the next forward of it, the other unmapped
    assert b.stats()["forward_blocks"] == 0
    assert b.call("bh_backrefs:stats")["peer_blocks"] == worker_b["peer_blocks"] + 1
    assert float(x.sum()) == 2.0 * N

    fds, host_a, host_b = _fds(), a.stats(), b.stats()
    worker_b = b.call("bh_backrefs:stats")
    for _ in range(10_000):
        assert b.call("bh_backrefs:first", x) == 2.0
    _settle(b)
    assert _fds() == fds
    assert a.stats() == host_a
    after = b.stats()
    assert after["forwarded"] == host_b["forwarded"] + 10_000
    after.pop("forwarded"), host_b.pop("forwarded")
    assert after == host_b
    after = b.call("bh_backrefs:stats")
    for k in ("created", "own_blocks", "own_bytes", "peer_blocks", "peer_bytes"):
        assert after[k] == worker_b[k], (k, after, worker_b)

    del x
    _settle(a)
    assert a.call("bh_backrefs:stats")["lent_blocks"] == 0
    # A's block goes (forwarded, A retires it rather than reuse it: protocol
    # 10): the forward kept for it is retired with it, and B unmaps it
    a.call("bh_backrefs:forget_cached", N)
    _settle(a, b)
    assert a.call("bh_backrefs:stats")["spent"] == 1
    assert b.call("bh_backrefs:stats")["peer_blocks"] == worker_b["peer_blocks"] - 1


@pytest.mark.torch
def test_a_forwarded_tensor_is_copy_on_write_in_the_receiver(make_worker):
    """B writes into the tensor it got (torch has no read-only tensors):
    the write stays in B; A's block and the host's view keep A's bytes.
    B returning what it got names the block (a back ref to the host's
    forward: no copy) while B wrote nothing there; once B wrote into it
    (its bytes differ from A's), the reply is copied, once, in B."""
    torch = pytest.importorskip("torch")
    a, b = _pair(make_worker)
    t = _sealed(a, N, 3.0)
    taken, forwarded = b.call("bh_backrefs:stats"), b.stats()["forwarded"]
    y = b.call("bh_testmod:echo", t)[0][0]
    assert torch.equal(t, y)
    after = b.call("bh_backrefs:stats")
    assert after["created"] + after["reused"] == taken["created"] + taken["reused"]
    del y
    assert b.call("bh_backrefs:fill", t, 1.0) == float(N)
    assert b.stats()["forwarded"] == forwarded + 2
    assert float(t.sum()) == 3.0 * N
    created = a.stats()["created"]
    rows, _ = a.call("bh_backrefs:inspect", t)  # back to A: its own block, unchanged
    assert rows[0]["sum"] == 3.0 * N and a.stats()["created"] == created
    assert b.stats()["created"] == 0
    b.call("bh_backrefs:keep", t)
    assert b.call("bh_backrefs:fill", t, 1.0) == float(N)  # B's own copy of the pages now
    rows, _ = b.call("bh_backrefs:inspect", t)
    assert rows[0]["sum"] == 3.0 * N  # a new crossing: A's bytes
    b.call("bh_backrefs:drop")
    del t
    _settle(a, b)


@pytest.mark.torch
def test_the_source_block_is_not_reused_while_the_receiver_holds_it(make_worker):
    """The host drops its view while B keeps the forwarded tensor: A's
    block stays lent (the forward holds it) and A's next arrays take
    others; once B drops it, the block goes back to A, spent (protocol
    10), and goes when A lets its tensor go.  Then A is killed while B
    (and the host) hold another of its blocks: both still read A's bytes
    (every mapping keeps the pages); then it all goes."""
    a, b = _pair(make_worker)
    x = _sealed(a, N, 5.0)
    b.call("bh_backrefs:keep", x)
    del x
    _settle(a, b)
    assert a.call("bh_backrefs:stats")["lent_blocks"] == 1
    others = [a.call("bh_backrefs:make", N, "numpy", 7.0) for _ in range(3)]
    assert b.call("bh_backrefs:kept_sum")[0] == 5.0 * N
    del others
    b.call("bh_backrefs:drop")
    _settle(b, a)
    s = a.call("bh_backrefs:stats")
    assert s["lent_blocks"] == 0 and s["free_blocks"] == s["own_blocks"] - 1  # the kept one
    assert b.stats()["forward_blocks"] == 0
    a.call("bh_backrefs:forget_cached", N)
    _settle(a, b)
    s = a.call("bh_backrefs:stats")
    assert s["spent"] == 1 and s["free_blocks"] == s["own_blocks"]

    x = _sealed(a, N, 6.0)
    b.call("bh_backrefs:keep", x)
    assert b.stats()["forwarded"] == 2
    os.kill(a.pid, signal.SIGKILL)
    poller = select.poll()
    poller.register(a._chan.fileno(), select.POLLRDHUP)
    assert poller.poll(10_000), "the killed worker's socket never closed"
    assert float(x.sum()) == 6.0 * N
    assert b.call("bh_backrefs:kept_sum")[0] == 6.0 * N
    assert b.call("bh_backrefs:inspect", x)[0][0]["sum"] == 6.0 * N  # copied: A's channel is gone
    del x
    gc.collect()
    assert b.call("bh_backrefs:kept_sum")[0] == 6.0 * N
    b.call("bh_backrefs:drop")
    _settle(b)
    assert b.stats()["forward_blocks"] == 0


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_a_new_output_each_call_faults_no_page_in_the_receiver(make_worker):
    """A new array of A's to B on every call (#40), the host dropping it in
    between: the host copies each into the block it copied the last one
    into, which B maps still, so B reads it as it reads an array of its own
    a second time, and A reuses its one block.  The first crossing's
    reading is what a block mapped afresh costs (every page faulted),
    which each call cost while the host forwarded A's block: A then never
    reused a forwarded block (protocol 10), so every output was a fresh
    memfd and a fresh mapping in B."""
    a, b = _pair(make_worker)
    n = 8 * N  # 8 MiB
    faults = []
    for i in range(4):
        x = a.call("bh_backrefs:make", n, "numpy", float(i))
        total, f = b.call("bh_backrefs:sum_faults", x)
        assert total == float(i * n)
        faults.append(f)
        del x
        _settle(a, b)
        if i == 0:
            created_a, created_b = a.call("bh_backrefs:stats")["created"], b.stats()["created"]
    own_sum, own = b.call("bh_backrefs:own_sum_faults", n)
    assert own_sum == float(n)
    assert faults[0] > own + 64  # a fresh mapping faults (the sensitivity of this test)
    assert faults[-1] <= own + 4, faults  # the kept one as the receiver's own pages
    assert a.call("bh_backrefs:stats")["created"] == created_a  # A's block, reused
    assert b.stats()["created"] == created_b  # the host's block for B, reused
    _settle(a, b)


@pytest.mark.torch
def test_a_tensor_the_owner_sends_again_faults_no_page_in_the_receiver(make_worker):
    """A's cached output (the same torch tensor every call) goes on to B
    every call, the host dropping it in between (a new prompt).  From its
    third crossing A sends the block kept for it (tensors.SendCache), and
    the host forwards that block to B.  A never reuses a forwarded block
    for other bytes (protocol 10), so B keeps its mapping between forwards
    and reads the tensor as it reads its own pages, as a node in one
    process reads the same tensor again; 2d328c7 had B unmap it whenever
    the host dropped A's array, so every call faulted B's pages afresh."""
    pytest.importorskip("torch")
    a, b = _pair(make_worker)
    n = 8 * N  # 8 MiB
    faults = []
    for _ in range(5):
        t = a.call("bh_backrefs:cached", n)
        total, f = b.call("bh_backrefs:sum_faults", t)
        assert total == float(n)
        faults.append(f)
        del t
        _settle(a, b)
    own_sum, own = b.call("bh_backrefs:own_sum_faults", n)
    assert own_sum == float(n)
    assert faults[0] > own + 64  # a fresh mapping faults (the sensitivity of this test)
    assert faults[-1] <= own + 4, faults  # the kept one as the receiver's own pages
    _settle(a, b)


def test_small_blocks_are_copied_and_keep_no_fd(make_worker):
    """A block under 1 MiB keeps no fd in the host: an array in it goes to
    another worker copied, as before."""
    a, b = _pair(make_worker)
    x = a.call("bh_backrefs:make", 100_000, "numpy", 1.0)  # 400 KB
    assert a.stats()["peer_fds"] == 0
    created = b.stats()["created"] + b.stats()["reused"]
    assert b.call("bh_backrefs:first", x) == 1.0
    assert b.stats()["created"] + b.stats()["reused"] == created + 1
    assert b.stats()["forwarded"] == 0
    del x
    _settle(a, b)


def _fresh(b):
    """The host's pool for B holds no free block: a copy to B takes a new
    one (zero but for the array), so what B reads past its array is
    nothing the host sent it before."""
    _settle(b)
    b._chan.trim_pool(0)
    _settle(b)


def test_the_receiver_reads_no_byte_of_the_owners_it_was_not_sent(make_worker):
    """#37: B maps a forwarded block whole, so a forward of a range of a
    larger block showed B the owner's other bytes: the other arrays of A's
    message (an arena block of 1 MiB or more), the rest of the array a view
    was cut from, and A's older bytes past a tensor in a reused block.  As
    in one process, where a node sees only the array it got, B now reads
    nothing but its array's bytes and zeros in the mapping that holds it
    (#40: an array of A's pool is copied by the host; a tensor A keeps, in
    a sealed block of its own, is forwarded:
    test_a_kept_forward_shows_the_receiver_none_of_the_owners_new_bytes)."""
    a, b = _pair(make_worker)
    # one message of eight 200 KB arrays: the arena's third block (1 MiB)
    # holds the last five
    xs = a.call("bh_fwdscope:several", [200_000] * 8, list(range(0x11, 0x19)))
    for x in (xs[5], xs[7], xs[0]):
        _fresh(b)
        seen, size = b.call("bh_fwdscope:around", x)
        assert seen in ([], [0]), (int(x[0]), seen, size)
    del xs, x
    # a view that does not span its array
    y = a.call("bh_fwdscope:one", 2 << 20, 0x5A)
    for v in (y[4096:], y[:-4096], y[65536:65536 + 300_000]):
        _fresh(b)
        assert b.call("bh_fwdscope:around", v)[0] in ([], [0])
    del y, v
    _settle(a, b)
    # A's block of 2 MiB, freed, is reused for 1.5 MiB: its second half
    # holds the 2 MiB array's bytes
    a.call("bh_fwdscope:trim")
    a.call("bh_fwdscope:one", 2 << 20, 0x77)
    _settle(a)
    z = a.call("bh_fwdscope:one", 3 << 19, 0x33)
    _fresh(b)
    assert b.call("bh_fwdscope:around", z)[0] in ([], [0])
    del z
    _settle(a, b)
    # reused for a size that ends inside its last page: copied (#40: A's
    # pool reuses it), the host's block for B shows nothing else either
    a.call("bh_fwdscope:trim")
    a.call("bh_fwdscope:one", (1 << 20) + 8192, 0x66)
    _settle(a)
    forwarded = b.stats()["forwarded"]
    w = a.call("bh_fwdscope:one", (1 << 20) + 4096 + 100, 0x44)
    _fresh(b)
    seen, size = b.call("bh_fwdscope:around", w)
    assert seen in ([], [0]), (seen, size)
    assert b.stats()["forwarded"] == forwarded
    del w
    _settle(a, b)


@pytest.mark.torch
def test_a_kept_forward_shows_the_receiver_none_of_the_owners_new_bytes(make_worker):
    """B returned a forward of A's kept block, the host dropped A's tensor
    and A let it go.  The mapping B kept of the block (#40, for the next
    forward of it) is retired with the block, which A retires rather than
    reuse (protocol 10), so B reads nothing of A's new bytes there (in a
    tensor A keeps next, a sealed block again, or in its next output):
    471c5c9 kept the mapping while A reused the block, and B read them
    (0x99).  Nor does B through the block's fd, kept as a pack's code
    could keep the fd it was sent: A's next kept tensor of that size takes
    a fresh block."""
    a, b = _pair(make_worker)
    # a kept tensor that ends inside its block's last page: forwarded, and
    # the mapping B gets shows nothing but it and zeros (#37)
    k = _sealed_bytes(a, (1 << 20) + 4096 + 100, 0x44)
    seen, size = b.call("bh_fwdscope:around", k.numpy())
    assert seen in ([], [0]) and size == (1 << 20) + 8192, (seen, size)
    assert b.stats()["forwarded"] == 1
    del k
    x = _sealed_bytes(a, 4 * N, 0x11)  # 1 MiB, forwarded
    size = b.call("bh_fwdpeek:keep_fd", x)  # notes the mapping too
    assert size in (None, 4 * N)  # None: the worker may not open its map_files
    del x
    a.call("bh_fwdscope:drop_kept")
    _settle(a, b, a, b)
    y = _sealed_bytes(a, 4 * N, 0x99)  # bytes B never gets
    z = a.call("bh_fwdscope:one", 4 * N, 0x99)
    seen = b.call("bh_fwdpeek:peek")
    assert seen is None or set(seen) <= {0, 0x11}, f"B read {seen} of A's"
    if size is not None:
        seen = b.call("bh_fwdpeek:read_kept")
        assert 0x99 not in seen, f"B read {seen} of A's through the fd it kept"
    assert b.stats()["forwarded"] == 2
    assert a.call("bh_backrefs:stats")["spent"] == 2  # the forwarded blocks, retired
    del y, z
    a.call("bh_fwdscope:drop_kept")
    _settle(a, b)


def test_a_receiver_that_keeps_the_fd_reads_none_of_the_owners_next_output(make_worker):
    """B's code keeps the fd of the block an array it got came in: in one
    process a node holding its input never sees what another node makes
    next, and through that fd B reads nothing of A's next output either.
    A's new output is copied by the host into a block of its channel with
    B (#40), so B never gets the fd of a block A reuses: A takes the same
    block for its next output, and B reads none of it.  Before protocol
    10, A reused a forwarded block and B read A's next output (0x99)
    through the fd it kept."""
    a, b = _pair(make_worker)
    x = a.call("bh_fwdscope:one", 4 * N, 0x11)  # uint8: 1 MiB
    created = a.call("bh_backrefs:stats")["created"]
    size = b.call("bh_fwdpeek:keep_fd", x)
    if size is None:
        pytest.skip("the worker may not open /proc/self/map_files (needs CAP_CHECKPOINT_RESTORE)")
    assert size == 4 * N
    del x
    _settle(a, b, a, b)
    y = a.call("bh_fwdscope:one", 4 * N, 0x99)  # A's next output, bytes B never gets
    seen = b.call("bh_fwdpeek:read_kept")
    assert 0x99 not in seen, f"B read {seen} of A's through the fd it kept"
    s = a.call("bh_backrefs:stats")
    assert s["spent"] == 0 and s["created"] == created  # A's block, reused
    del y
    _settle(a, b)
