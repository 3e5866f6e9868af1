"""The host's control socket: how the ``bulkhead`` command (and anything
else on the machine running as this user) asks a host to act on its
workers.

Reading needs no host: everything a process holds is in the shared ledger.
Acting does, because only the host holds a worker's channel.  Each host
listens on ``control_path(pid)`` — ``$XDG_RUNTIME_DIR/bulkhead/host-<pid>.sock``
when that directory is a private one of ours, else
``/tmp/bulkhead-<uid>-<pid>-<random>/host-<pid>.sock`` (directory 0700 and
ours, checked: rundir; socket 0600; a client tries every place, as the CLI
does) — a ``SOCK_SEQPACKET`` socket speaking the
same frames as a worker channel, with the peer's uid checked on every
frame.  A client sends CALL frames ``(target, args, kwargs)``:

    release(who, nbytes=None, wait_s=None) -> {"worker_pid", "pack",
                        "before_bytes", "after_bytes", "freed_bytes"}
        who: a worker pid or a pack name; nbytes None: the full ladder;
        the figures are the worker's held bytes in the ledger before and
        after, as `bulkhead status` shows them (the worker's receipt where
        the host has no ledger).
    workers() -> [{"pid", "pack", "generation", "busy"}...]
    packs() -> [{"name", "state", "reason", "fix", "pid", "log", "actions",
                 "command", "sandbox"}...]
        where each pack the host serves stands (GET /bulkhead/status
        "packs"); `bulkhead status` shows them.
    built(config_paths) -> [line...]
        `bulkhead install` built these configs' environments: each pack
        the host serves from one and does not run isolated there yet is
        served again (host/building.py ``picked_up``); one line per
        config says what the host does with it.

        wait_s (optional): how long to wait for a call the worker is in,
        at most (and by default) the worker's release timeout.

and gets a RESULT, or an ERROR whose message says what went wrong.  The
release is ``release.release``: a worker in a call is waited for up to
that deadline and then refused (``WorkerBusy``: "stayed busy"); nothing
runs after the answer.  Each connection is served on a thread of its own
(at most ``MAX_CLIENTS`` at once; one past that is closed at once), so a
client waiting for a busy worker never holds up ``workers()`` or another
release.  A client that breaks the protocol (garbage, a frame from
another uid) is logged with the error's name and dropped; nothing else is
affected.

A host killed with SIGKILL cannot remove its socket; the next host to
start a control server removes every socket in the directory that nothing
listens on any more (``sweep``).
"""

import logging
import os
import socket
import threading

from .. import _native
from ..channel.peer import Peer
from . import building, release as _release, states
# The client side (where sockets live, request, sweep) is controlclient's:
# release.py asks other hosts through it, and this module calls release.
from .controlclient import control_path, sweep

log = logging.getLogger("bulkhead")

MAX_CLIENTS = 8      # connections served at once


class ControlServer:
    """Listens on this host's control socket and serves requests against a
    HostMemory's workers.  close() stops it and removes the socket."""

    def __init__(self, host_memory, release_timeout_s=30.0):
        self.hm = host_memory
        self.release_timeout_s = release_timeout_s
        self.path = control_path(os.getpid())
        try:
            os.unlink(self.path)  # a previous process with our pid
        except FileNotFoundError:
            pass
        sweep(os.path.dirname(self.path))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # Credentials on every message from the first: set on the listener,
        # so what a client sends before accept() returns carries them too.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        # Bound under a name sweep() ignores and renamed once listening: a
        # sweeping host never sees this socket between bind and listen
        # (when it would refuse a connection and look stale).
        tmp = os.path.join(os.path.dirname(self.path), f".host-{os.getpid()}.sock.new")
        try:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            old = os.umask(0o177)
            try:
                self.sock.bind(tmp)
            finally:
                os.umask(old)
            self.sock.listen(4)
            os.rename(tmp, self.path)
        except BaseException:
            self.sock.close()
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self._stop = False
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._clients = set()
        self._clients_lock = threading.Lock()
        self._calls = {"release": self.release, "workers": self.workers, "packs": self.packs, "built": self.built}
        self._thread = threading.Thread(target=self._serve, name="bulkhead-control", daemon=True)
        self._thread.start()

    # --- requests ---

    def _workers(self):
        return [w for w in self.hm.owners if w.alive]

    def release(self, who, nbytes=None, wait_s=None):
        try:
            w = _release.find(who, self._workers(), remote=False).worker
        except LookupError as e:
            raise LookupError(str(e)) from None  # what clients match on: LookupError by name
        timeout = _release.release_timeout_s(w, self.release_timeout_s)
        wait = timeout if wait_s is None else min(max(0.0, float(wait_s)), timeout)
        ledger = getattr(self.hm, "ledger", None)
        r = _release.release(_release.Local(w), nbytes, wait_s=wait, hm=self.hm,
                             ledger=ledger, timeout_s=self.release_timeout_s, raise_dead=True)
        # The ledger's figures, which `bulkhead status` shows: the worker's
        # receipt counts only ComfyUI's models there, not its blocks (the
        # results the host had from it) nor a worker without ComfyUI's
        # memory manager ("before 0 B" of a worker holding 48 MiB).  A host
        # without a ledger has only the receipt.
        figures = r["receipt"] if ledger is None else \
            {k: r[k] for k in ("before_bytes", "after_bytes", "freed_bytes")}
        return {"worker_pid": w.pid, "pack": w.name, **figures}

    def workers(self):
        return [{"pid": w.pid, "pack": w.name, "generation": w.generation, "busy": bool(w.busy)}
                for w in self._workers()]

    def packs(self):
        """Where each pack this host serves stands (host/states.py
        pack_states with what the panel offers, building.annotate: what
        GET /bulkhead/status lists as "packs"), for `bulkhead status`:
        "actions" one string ("retry", "retry, rebuild"), "command" the
        same from a terminal, "log" its newest build's log file."""
        return [{**{k: r.get(k) for k in ("name", "state", "reason", "fix", "pid", "log", "command")},
                 "actions": ", ".join(r.get("actions") or ()), "sandbox": (r.get("sandbox") or {}).get("words")}
                for r in building.annotate(states.pack_states())]

    def built(self, config_paths):
        """`bulkhead install` built the environments of these configs
        (host/building.py ``picked_up``)."""
        return building.picked_up([str(p) for p in config_paths])

    def _resolve(self, target):
        fn = self._calls.get(target)
        if fn is None:
            raise LookupError(f"the control socket serves {sorted(self._calls)}, not {target!r}")
        return fn

    # --- serving ---

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            fd = conn.detach()
            if self._stop:
                os.close(fd)
                return
            if not self._slots.acquire(blocking=False):
                log.warning("bulkhead: control socket %s: %d clients are being served; closed "
                            "one more", self.path, MAX_CLIENTS)
                os.close(fd)
                continue
            t = threading.Thread(target=self._serve_one, args=(fd,), name="bulkhead-control-client",
                                 daemon=True)
            with self._clients_lock:
                self._clients = {c for c in self._clients if c.is_alive()}
                self._clients.add(t)
            t.start()

    def _serve_one(self, fd):
        """One client's connection, on its own thread."""
        try:
            peer = Peer(describe="bulkhead control client", outgoing=_native.CALLBACK,
                        resolve=self._resolve)
            try:
                chan = _native.channel_open(fd, peer, os.getuid(), 0, first_id=2)
            except Exception:
                return  # channel_open consumed fd even so: its number may be another thread's now
            peer.channel = chan
            try:
                chan.serve(30.0)  # a client idle for 30 s is dropped
            except _native.ProtocolError as e:
                # A client sending garbage (or sending from another uid)
                # ends its own connection, nothing else.
                log.warning("bulkhead: control socket %s: a client broke the protocol (%s); "
                            "dropped it", self.path, getattr(e, "errname", "") or e)
            except Exception as e:
                log.warning("bulkhead: control socket %s: dropped a client: %s", self.path, e)
            finally:
                chan.close()
        finally:
            self._slots.release()

    def close(self):
        if self._stop:
            return
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(5.0)
        with self._clients_lock:
            clients = list(self._clients)
        for t in clients:
            t.join(5.0)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
