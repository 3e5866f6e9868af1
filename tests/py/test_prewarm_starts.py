"""host/prewarm.py's cold starts side by side (#27), in process: a
prompt's packs start at once, as many at a time as this process may use
CPUs, not one after another and not more than that."""

import threading
import time
import types

from bulkhead.host import prewarm


class _Runtime:
    """What prewarm.start needs of a PackRuntime."""

    def __init__(self, name, warm):
        self.name, self.prewarm = name, warm
        self.worker = types.SimpleNamespace(alive=False, generation=0, pid=None)


def test_cold_workers_start_side_by_side_bounded_by_the_cpus():
    lock = threading.Lock()
    running, peak = [0], [0]

    def warm():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return 1

    n = prewarm.STARTS_AT_ONCE + 3
    rts = [_Runtime(f"p{i}", warm) for i in range(n)]
    threads = [prewarm.start(rt) for rt in rts]
    assert all(t is not None for t in threads)
    for t in threads:
        t.join(30)
    # as many at once as there are CPUs, never more, all of them started
    assert peak[0] == min(n, prewarm.STARTS_AT_ONCE)
    assert not prewarm._warming
