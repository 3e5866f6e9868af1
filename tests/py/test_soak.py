"""The soak, short: 3,000 mixed calls through two workers (soak.py; the
100,000-call run is `make soak`).  After warm-up, host and worker RSS stay
within 2 MiB, fd counts and the block pools do not move, and neither
worker is restarted."""

import os

import soak


def test_soak_short():
    # Under ASan (make check-asan) RSS is reported, not bounded: its
    # quarantine keeps freed memory resident on purpose.  fds, pools and
    # restarts are checked either way.
    report = soak.run(calls=3000, check_rss=not os.environ.get("BULKHEAD_ASAN"))
    assert report["ok"], soak.table(report)
    assert all(report["kinds"][k] > 0 for k in ("small", "1 MiB", "callback", "64 MiB")), report["kinds"]
    assert len(report["samples"]) > 10
