"""Private directories: where a host keeps what another local user must
not touch (its control socket, the package root its workers import
bulkhead from).

/tmp is shared by every user, so ``/tmp/bulkhead-<uid>`` can be made
first by someone else; a directory they own (or one that lets them in)
would let them replace the ``bulkhead`` package a worker imports, and run
code as us.  Every directory here goes through ``private_dir``: made 0700
when missing, then checked with lstat -- a directory, not a link, owned by
our uid, no group or other bits -- by the C core's ``bh_private_dir``,
which the default ledger directory on /dev/shm goes through too.  A
directory that fails is refused with an error naming it, its owner and
mode, and the fix; bulkhead never falls back to using it.
"""

import os
import stat

from .. import _native


class PrivateDirError(PermissionError):
    """A directory bulkhead keeps private state in is not private (another
    owner, group/other bits, a link, not a directory)."""


def private_dir(path):
    """Makes `path` (its parent must exist) 0700 if missing and checks it.
    Returns path; raises PrivateDirError naming what is wrong and the fix."""
    try:
        _native.private_dir(path, True)
    except OSError as e:
        try:
            st = os.lstat(path)
            what = (f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
                    + (", a symbolic link" if stat.S_ISLNK(st.st_mode)
                       else "" if stat.S_ISDIR(st.st_mode) else ", not a directory"))
        except OSError as e2:
            what = e2.strerror
        raise PrivateDirError(
            e.errno,
            f"{path} must be a directory owned by uid {os.geteuid()} with mode 0700, and it is not "
            f"({what}: {e.strerror}); another local user may have made it first. Remove it (as "
            f"root if another user owns it), or set XDG_RUNTIME_DIR to a private directory of ours",
            path) from None
    return path


def runtime_dir():
    """This user's private bulkhead directory, made and checked:
    ``$XDG_RUNTIME_DIR/bulkhead`` when XDG_RUNTIME_DIR is a writable
    directory, else ``/tmp/bulkhead-<uid>``.  (The CLI's release.c looks in
    both, this one first.)"""
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and os.path.isdir(run) and os.access(run, os.W_OK):
        return private_dir(os.path.join(run, "bulkhead"))
    return private_dir(f"/tmp/bulkhead-{os.getuid()}")


def runtime_dirs():
    """Every directory a host of this user may have put its control socket
    in, the one ``runtime_dir`` picks here first (a host may have run in
    another environment: a systemd unit without XDG_RUNTIME_DIR).  Not
    created nor checked: a client checks the one it uses."""
    tmp = f"/tmp/bulkhead-{os.getuid()}"
    run = os.environ.get("XDG_RUNTIME_DIR")
    if not run or not os.path.isdir(run):
        return [tmp]
    xdg = os.path.join(run, "bulkhead")
    return [xdg, tmp] if os.access(run, os.W_OK) else [tmp, xdg]
