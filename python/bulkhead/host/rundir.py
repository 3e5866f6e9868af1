"""Private directories: where a host keeps what another local user must
not touch (its control socket, the package root its workers import
bulkhead from).

/tmp is shared by every user, so ``/tmp/bulkhead-<uid>`` can be made
first by someone else; a directory they own (or one that lets them in)
would let them replace the ``bulkhead`` package a worker imports, and run
code as us, and one refused would disable every isolated pack.  So under
/tmp each process makes its own, of a name nobody can guess
(``runtime_dir``).  Every directory here goes through ``private_dir``: made 0700
when missing, then checked with lstat -- a directory, not a link, owned by
our uid, no group or other bits -- by the C core's ``bh_private_dir``,
which the default ledger directory on /dev/shm goes through too.  A
directory that fails is refused with an error naming it, its owner and
mode, and the fix; bulkhead never falls back to using it.
"""

import atexit
import os
import shutil
import stat
import tempfile
import threading

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


def _xdg_runtime():
    """$XDG_RUNTIME_DIR when it is set and a private directory of ours (as
    the C core's check judges it: the login manager makes it 0700), else
    None: a directory another user could enter is never used."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    if not run or not os.path.isabs(run):
        return None
    try:
        _native.private_dir(run, False)
    except OSError:
        return None
    return run


TMP = "/tmp"
_mine = None               # (pid, path): this process's directory under /tmp
_mine_lock = threading.Lock()


def tmp_prefix(pid=None):
    return f"bulkhead-{os.getuid()}-" + ("" if pid is None else f"{pid}-")


# What follows a host's prefix in a pack's private TMPDIR under /tmp
# (host/sandbox.py private_tmp), never in a runtime directory: mkdtemp's
# random part has no "-".  The socket finders here and in the CLI's
# release.c skip those; the sweep of a dead host's leftovers takes both.
SANDBOX_TMP = "sandbox-"


def runtime_dir():
    """This user's private bulkhead directory, made and checked:
    ``$XDG_RUNTIME_DIR/bulkhead`` when XDG_RUNTIME_DIR is a private
    directory of ours, else one of this process's own under /tmp,
    ``/tmp/bulkhead-<uid>-<pid>-<random>``, made atomically 0700 by
    mkdtemp: a name nobody can guess nor make first, so another user who
    makes ``/tmp/bulkhead-<uid>`` (or any name) first disables nothing.
    It goes at exit; those of processes that are gone go when the next one
    is made (an owner check first: only directories of ours).  (The CLI's
    release.c looks in the same places.)"""
    run = _xdg_runtime()
    if run:
        return private_dir(os.path.join(run, "bulkhead"))
    global _mine
    with _mine_lock:
        if _mine is not None and _mine[0] == os.getpid():
            return _mine[1]
        sweep_tmp()
        path = private_dir(tempfile.mkdtemp(prefix=tmp_prefix(os.getpid()), dir=TMP))
        atexit.register(_remove_tmp, path, os.getpid())
        _mine = (os.getpid(), path)
        return path


def _remove_tmp(path, pid):
    if pid == os.getpid():  # not a forked child exiting: the directory is its parent's
        shutil.rmtree(path, ignore_errors=True)


def _tmp_dirs(pid=None):
    """This user's process directories under /tmp (of `pid` only, when
    given) that pass the private-directory check, sorted."""
    prefix = tmp_prefix(pid)
    try:
        names = sorted(n for n in os.listdir(TMP) if n.startswith(prefix))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(TMP, name)
        try:
            _native.private_dir(path, False)
        except OSError:
            continue  # another user's, or not a directory: never ours to use or remove
        out.append(path)
    return out


def owner_gone(name, prefix):
    """Whether ``name`` is ``<prefix><pid>-...`` of a process, not this one,
    that is gone: a leftover to sweep.  A pid alive (or another user's
    now) is left for a later sweep."""
    pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def sweep_tmp():
    """Removes this user's /tmp directories whose process is gone.
    Returns the paths removed."""
    removed = [path for path in _tmp_dirs() if owner_gone(os.path.basename(path), tmp_prefix())]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _sandbox_tmp(name):
    """Whether /tmp's ``name`` is a pack's private TMPDIR
    (``<prefix><pid>-sandbox-...``), not a host's runtime directory."""
    rest = name[len(tmp_prefix()):]
    return rest.partition("-")[2].startswith(SANDBOX_TMP)


def runtime_dirs(pid=None):
    """Every directory a host of this user (host `pid`, when given) may
    have put its control socket in, the one ``runtime_dir`` picks here
    first (a host may have run in another environment: a systemd unit
    without XDG_RUNTIME_DIR), then ``/tmp/bulkhead-<uid>`` where an older
    bulkhead put them.  Not created; the /tmp ones checked."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    xdg = [os.path.join(run, "bulkhead")] if run and os.path.isabs(run) else []
    tmp = [d for d in _tmp_dirs(pid) if not _sandbox_tmp(os.path.basename(d))]
    tmp.append(os.path.join(TMP, f"bulkhead-{os.getuid()}"))
    return xdg + tmp if _xdg_runtime() else tmp + xdg
