"""System RAM as the memory manager sees it: psutil's figures, clamped to the
memory cgroup the process runs in (when it has a limit below physical RAM).

/proc/meminfo is not namespaced, so inside a limited container psutil alone
reports the host.  The limit is probed once (it does not change while we
run); usage is read every time, as the working set: the cgroup's current
charge less its inactive page cache, which the kernel reclaims first.
Swap is never counted as available.  Without a limit every function returns
psutil's number untouched.
"""

import os
import sys

import psutil

_V2_ROOT = "/sys/fs/cgroup"
_V1_ROOT = "/sys/fs/cgroup/memory"
_V1_NO_LIMIT = 1 << 62          # cgroup v1 writes "unlimited" as a huge number

_limit_probe = None             # None: not probed; else a 1-tuple (limit or None)
_dirs = None
_usage_dir = None


def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def _read_number(path):
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _stat_value(path, key):
    text = _read_text(path)
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _cgroup_dirs():
    """The roots (a private cgroup namespace mounts ours there), then this
    process's own memory cgroup from /proc/self/cgroup."""
    global _dirs
    if _dirs is None:
        found = [_V2_ROOT, _V1_ROOT]
        for line in (_read_text("/proc/self/cgroup") or "").splitlines():
            fields = line.split(":", 2)
            if len(fields) != 3 or not fields[2].lstrip("/"):
                continue
            rel = fields[2].lstrip("/")
            if fields[1] == "":
                found.append(os.path.join(_V2_ROOT, rel))
            elif "memory" in fields[1].split(","):
                found.append(os.path.join(_V1_ROOT, rel))
        _dirs = found
    return _dirs


def _dir_limit(d):
    text = _read_text(os.path.join(d, "memory.max"))
    if text is not None and text != "max":
        try:
            return int(text)
        except ValueError:
            pass
    v1 = _read_number(os.path.join(d, "memory.limit_in_bytes"))
    if v1 is not None and v1 < _V1_NO_LIMIT:
        return v1
    return None


def cgroup_memory_limit():
    """The memory cgroup's limit in bytes, or None when there is none that
    is lower than physical RAM."""
    global _limit_probe
    if _limit_probe is None:
        limit = None
        if sys.platform.startswith("linux"):
            for d in _cgroup_dirs():
                limit = _dir_limit(d)
                if limit is not None:
                    break
            if limit is not None and limit >= psutil.virtual_memory().total:
                limit = None
        _limit_probe = (limit,)
    return _limit_probe[0]


def _dir_usage(d):
    for current, inactive in (("memory.current", "inactive_file"),
                              ("memory.usage_in_bytes", "total_inactive_file")):
        used = _read_number(os.path.join(d, current))
        if used is not None:
            return max(0, used - (_stat_value(os.path.join(d, "memory.stat"), inactive) or 0))
    return None


def cgroup_memory_usage():
    """The cgroup's non-reclaimable usage in bytes, or None."""
    global _usage_dir
    if _usage_dir is not None:
        return _dir_usage(_usage_dir)
    for d in _cgroup_dirs():
        used = _dir_usage(d)
        if used is not None:
            _usage_dir = d
            return used
    return None


def virtual_memory_total():
    total = psutil.virtual_memory().total
    limit = cgroup_memory_limit()
    return total if limit is None else min(total, limit)


def virtual_memory_available():
    available = psutil.virtual_memory().available
    limit = cgroup_memory_limit()
    if limit is None:
        return available
    used = cgroup_memory_usage()
    if used is None:
        return min(available, limit)
    return max(0, min(available, limit - used))
