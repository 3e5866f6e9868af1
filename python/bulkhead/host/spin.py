"""How long idle OpenMP and BLAS threads spin before they sleep, bounded
in every worker's environment (``spin_env``, which host/workerenv.py's
build_env gives a worker) and in ComfyUI's own process
(``bound_host_spin``, from bulkhead's prestartup script)."""

import math
import os

from .. import _native
from ..channel import spec
from ..channel.peer import BulkheadError


# How long a worker's idle OpenMP and BLAS threads spin after their work
# before they sleep.  libgomp's default, 300,000 steps of `pause`, is 8-15 ms
# on current x86 CPUs; OpenBLAS's (numpy's BLAS) is 2**28 TSC ticks, about
# 0.1 s.  After every node a worker's pool threads spin that long, and on a
# small machine they take the CPUs the host and the next worker need (a
# 3 MiB IMAGE through five workers, bench/spin.py).  200 us still covers the
# gaps between a node's own parallel regions, so its compute keeps the
# default's speed, where OMP_WAIT_POLICY=PASSIVE (sleep at once) costs it
# up to 3x.  docs/performance.md has the figures.
SPIN_US = 200.0
_spin = None


def spin_env():
    """What a worker's environment gets to bound that spin:
    GOMP_SPINCOUNT ($BULKHEAD_OMP_SPIN_US, default SPIN_US, over what one
    spin step costs on this CPU, measured once in ~1 ms; at most libgomp's
    default) and OPENBLAS_THREAD_TIMEOUT (log2 of the same time in TSC
    ticks, taken as 3 a ns; 4 to 28, OpenBLAS's own range and default).
    workerenv.build_env sets each unless the host's or the pack's
    environment tunes it (GOMP_SPINCOUNT or OMP_WAIT_POLICY;
    OPENBLAS_THREAD_TIMEOUT)."""
    global _spin
    if _spin is None:
        raw = os.environ.get(spec.OMP_SPIN_US, "")
        try:
            us = float(raw) if raw else SPIN_US
            if not 0 <= us < math.inf:      # nan and inf too: no count of steps
                raise ValueError(raw)
        except ValueError:
            raise BulkheadError(f"{spec.OMP_SPIN_US}={raw!r} is not a number of microseconds (0 or more); "
                                f"unset it for the default ({SPIN_US:g})") from None
        steps = min(300_000, round(us * 1000 / max(_native.relax_ns(), 0.1)))
        ticks_log2 = max(4, min(28, round(math.log2(max(us * 3000, 1)))))
        _spin = {"GOMP_SPINCOUNT": str(steps), "OPENBLAS_THREAD_TIMEOUT": str(ticks_log2)}
    return _spin


def bound_host_spin():
    """The same bound for ComfyUI's own process, from bulkhead's prestartup
    script: the host's torch runs parallel regions too (an EmptyImage's
    fill, a preview's conversion), and its idle pool thread then spins
    libgomp's default 8-15 ms on a CPU that the worker running the next
    node needs (a 3 MiB IMAGE through five workers: half the warm prompt's
    time here, bench/many_packs.py).  Each variable is set in this process's
    environment only while the library that reads it is not loaded yet (it
    reads it once, as it loads: ComfyUI imports torch after the prestartup
    scripts) and unless it or what replaces it is set already
    (GOMP_SPINCOUNT or OMP_WAIT_POLICY; OPENBLAS_THREAD_TIMEOUT).  Workers
    inherit the same values.  Returns {variable: value} for what it set."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return {}  # cannot tell what is loaded: leave it all as it is
    done = {k: v for k, v in spin_untuned(os.environ).items() if _SPIN_VARS[k][0] not in maps}
    os.environ.update(done)
    return done


# Each variable spin_env gives: the library that reads it (once, as it
# loads) and the variables that, set, say the thread spin is tuned already.
_SPIN_VARS = {"GOMP_SPINCOUNT": ("libgomp", ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")),
              "OPENBLAS_THREAD_TIMEOUT": ("openblas", ("OPENBLAS_THREAD_TIMEOUT",))}


def spin_untuned(env):
    """spin_env's variables for what env does not tune itself."""
    return {k: v for k, v in spin_env().items() if not any(t in env for t in _SPIN_VARS[k][1])}
