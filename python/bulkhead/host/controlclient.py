"""Asking a bulkhead host through its control socket: where the sockets
live (``control_dir``, ``control_path``), the client (``request``), and
``sweep`` of the sockets of hosts that are gone.  The server and the
protocol are host/control.py's (its module doc); this half stands apart so
that release.py, which the server calls, can ask another host without
importing the server.
"""

import os
import re
import socket

from .. import _native
from ..channel.peer import Peer
from . import rundir


def control_dir():
    """The directory control sockets live in (rundir.runtime_dir: made 0700
    if missing, refused unless it is a private directory of ours)."""
    return rundir.runtime_dir()


def control_path(pid):
    return os.path.join(control_dir(), f"host-{pid}.sock")


_SOCK_NAME = re.compile(r"host-(\d+)\.sock\Z")


def sweep(directory=None):
    """Removes the control sockets of hosts that are gone (killed before
    they could remove their own): every ``host-<pid>.sock`` in the control
    directory that refuses a connection.  A live host's socket accepts
    one, so it stays.  Returns the paths removed."""
    d = directory or control_dir()
    removed = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for name in names:
        m = _SOCK_NAME.match(name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        path = os.path.join(d, name)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.settimeout(1.0)
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
        except OSError:
            pass  # busy or not ours to judge: leave it
        finally:
            s.close()
    return removed


class ControlUnreachable(ConnectionError):
    """No host is listening at a control path (it exited, or never opted
    in to a control socket)."""


def request(host_pid, target, *args, timeout_s=30.0):
    """Calls `target` on host `host_pid`'s control socket and returns the
    result (raises what the host raised, as RemoteError; Timeout past
    `timeout_s` seconds; ControlUnreachable when nothing listens there)."""
    s, tried = None, []
    for d in rundir.runtime_dirs(host_pid):  # every place, as the CLI looks (release.c)
        path = os.path.join(d, f"host-{host_pid}.sock")
        try:
            _native.private_dir(d, False)  # never talk to a socket another user could have put there
        except OSError as e:
            tried.append(f"{path} ({e.strerror})")
            continue
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.connect(path)
            break
        except OSError as e:
            s.close()
            s = None
            tried.append(f"{path} ({e.strerror})")
            if not isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
                break  # it is there but broken: say so
    if s is None:
        raise ControlUnreachable(f"no bulkhead host {host_pid} listens at " + " or ".join(tried))
    peer = Peer(describe=f"bulkhead host {host_pid}", outgoing=_native.CALL)
    chan = _native.channel_open(s.detach(), peer, os.getuid(), 0, first_id=1)
    peer.channel = chan
    try:
        return chan.request(_native.CALL, (target, args, {}), timeout_s)
    finally:
        chan.close()
