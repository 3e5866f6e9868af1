"""An environment's in-use lock, shared by both processes.

Every worker running on an environment bulkhead built (its ``STAMP`` in
``sys.prefix``) holds a shared flock on the environment's ``IN_USE`` file
for its whole life (``hold``, from the worker's main; the kernel drops it
when the process ends).  The host reads who holds it (``holders``: the
pids /proc/locks lists on that file) to know which processes use an
environment however they were started: a worker a zygote forked runs the
zygote's interpreter (its argv[0] names another environment, or none), so
the argv scan alone let a rebuild delete an environment under its
workers (envs/build.py ``users``)."""

import os

STAMP = "bulkhead-stamp.json"   # what makes a directory an environment of bulkhead's (envs/build.py)
IN_USE = ".bulkhead-in-use"

_held = None                    # the fd of this process's lock (a worker's), kept open


def hold(prefix):
    """Takes this process's shared lock on the environment at prefix (a
    worker's sys.prefix) where it is one of bulkhead's; nothing
    otherwise, nor where it cannot (a read-only environment: the host then
    knows its workers by argv alone).  Returns whether it holds one."""
    global _held
    if _held is not None or not os.path.exists(os.path.join(prefix, STAMP)):
        return _held is not None
    import fcntl  # lazy: worker start (one in an environment not bulkhead's)
    try:
        fd = os.open(os.path.join(prefix, IN_USE), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return False
    _held = fd
    return True


def holders(directory):
    """The pids holding a lock on the IN_USE file of the environment at
    directory (read from /proc/locks), or [] when it has none."""
    try:
        st = os.stat(os.path.join(directory, IN_USE))
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    pids = []
    for line in lines:
        fields = line.split()
        for i, field in enumerate(fields[1:], 1):   # "<pid> <major>:<minor>:<inode>" (hex, hex, decimal)
            parts = field.split(":")
            if len(parts) != 3:
                continue
            try:
                if (int(parts[0], 16), int(parts[1], 16), int(parts[2])) == want:
                    pids.append(int(fields[i - 1]))
            except ValueError:
                pass
            break
    return sorted(set(pids))
