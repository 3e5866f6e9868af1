"""``bulkhead uninstall``: what bulkhead left on this machine for this
user, listed with sizes, and removed once the user says so.

What bulkhead makes outside the package itself, each removed by its own
path, never by a parent (a parent may be the user's: ``$BULKHEAD_HOME``,
``$XDG_RUNTIME_DIR``):

- in the workspace (``envs.build.workspace()``: ``$BULKHEAD_HOME``, else
  ``$XDG_DATA_HOME/bulkhead``, else ``~/.local/share/bulkhead``), the
  entries of ``envs.build.WORKSPACE_ENTRIES``: the pack environments, the
  host link farm, remembered build failures, the conda package cache;
- the node metadata cache (``host.metadata.cache_dir()``: in the
  workspace under ``$BULKHEAD_HOME``, else ``~/.cache/bulkhead/nodes``;
  both are looked at, as either may be left from a run with or without it);
- the shared ledger's file (``/dev/shm/bulkhead-<uid>/ledger``,
  ``$XDG_RUNTIME_DIR/bulkhead-ledger`` where another user took the
  first, or ``$BULKHEAD_LEDGER``) and the private run directories with the
  hosts' control sockets (``/tmp/bulkhead-<uid>-<pid>-*``, the older
  ``/tmp/bulkhead-<uid>``, ``$XDG_RUNTIME_DIR/bulkhead``).

Then the folders bulkhead named for itself that held them
(``~/.local/share/bulkhead``, ``~/.cache/bulkhead``,
``/dev/shm/bulkhead-<uid>``) go where they are left empty; one that holds
something else is kept and named.

Nothing is removed while a bulkhead process of this user runs (a host or
worker in the ledger, or a process running an environment's interpreter):
stop ComfyUI first.  The package itself is pip's to remove; the custom
node's folder is the Manager's (or ``rm -r``): the last lines say so.
"""

import os
import shutil
import sys

from .. import _native
from ..channel.spec import HOME, LEDGER
from ..envs import build as envs
from ..host import metadata, rundir, service


def _size(path):
    total = 0
    if os.path.isfile(path) or os.path.islink(path):
        try:
            return os.lstat(path).st_size
        except OSError:
            return 0
    for root, dirs, files in os.walk(path, onerror=lambda e: None):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _made():
    """[(path, what)]: every path bulkhead makes for this user (existing
    or not), and [dir]: the folders bulkhead named for itself that hold
    them, removed once empty (see the module's doc)."""
    ws = envs.workspace()
    whats = {"envs": "pack environments", "host": "the host link farm", "failed": "remembered build failures",
             "conda-pkgs": "the conda package cache"}
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    ledger = os.environ.get(LEDGER) or _native.ledger_default_path()
    made = [*[(os.path.join(ws, n), whats.get(n, "bulkhead's")) for n in envs.WORKSPACE_ENTRIES],
            (metadata.cache_dir(), "the node metadata cache"),
            (os.path.join(xdg, "bulkhead", "nodes"), "the node metadata cache"),  # made when BULKHEAD_HOME was unset
            (ledger, "the shared memory ledger"),
            *[(d, "control sockets of ComfyUI hosts") for d in rundir.runtime_dirs()]]
    shm = f"/dev/shm/bulkhead-{os.geteuid()}"
    holders = [os.path.join(xdg, "bulkhead"), os.path.dirname(metadata.cache_dir())]
    if not os.environ.get(HOME):
        holders.append(ws)
    if os.path.dirname(os.path.abspath(ledger)) == shm:
        holders.append(shm)
    return made, [os.path.abspath(d) for d in holders]


def found():
    """[(path, what, bytes)] of what bulkhead left for this user, existing
    paths only, without duplicates (one inside another counted once)."""
    out = []
    for path, what in _made()[0]:
        path = os.path.abspath(path)
        if not os.path.lexists(path) or any(path == p or path.startswith(p + os.sep) for p, _, _ in out):
            continue
        if _host_dir_in_use(path):
            continue        # a running host's own directory (its control socket, its workers' package root)
        out.append((path, what, _size(path)))
    return out


def _prune(holders):
    """Removes the holders left empty, deepest first; returns [(dir,
    [names])] of those that hold something bulkhead did not make."""
    kept = []
    for d in sorted(set(holders), key=len, reverse=True):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            try:
                kept.append((d, sorted(os.listdir(d))))
            except OSError:
                pass
    return kept


def _host_dir_in_use(path):
    """Whether path is a host's own directory under /tmp
    (``bulkhead-<uid>-<pid>-*``) whose process still runs: never a
    leftover, whatever else the user asks removed."""
    name, prefix = os.path.basename(path), rundir.tmp_prefix()
    return name.startswith(prefix) and not rundir.owner_gone(name, prefix)


def running():
    """Lines naming the bulkhead processes of this user that run now."""
    seen = {}           # pid -> what it is
    try:
        for p in service.status_document().get("processes", []):
            seen[p["pid"]] = f"{p['role']} {p['pack']}"
    except Exception:
        pass
    envs_dir = os.path.join(envs.workspace(), "envs")
    if os.path.isdir(envs_dir):
        for n in sorted(os.listdir(envs_dir)):
            d = os.path.join(envs_dir, n)
            if os.path.isdir(d) and not n.startswith("."):
                for pid in envs.users(d):
                    seen.setdefault(pid, f"a worker on {d}")
    return [f"pid {pid} ({what})" for pid, what in seen.items()]


def main(yes=False, dry_run=False, out=sys.stdout, ask=input):
    """The verb: 0 removed (or nothing to remove, or --dry-run), 1 refused
    or declined."""
    items = found()
    if not items:
        print("bulkhead uninstall: nothing of bulkhead's is left for this user", file=out)
    else:
        print("bulkhead uninstall: bulkhead left, for this user:", file=out)
        for path, what, n in items:
            print(f"  {_human(n):>10}  {path}  ({what})", file=out)
        print(f"  {_human(sum(n for _, _, n in items)):>10}  in all", file=out)
    live = running()
    if items and live:
        print(f"bulkhead uninstall: refused: bulkhead processes run now ({', '.join(live)}); stop ComfyUI "
              "(and every process using a pack environment), then run this again", file=out)
        return 1
    if items and not dry_run:
        if not yes:
            if not sys.stdin or not sys.stdin.isatty():
                print("bulkhead uninstall: nothing removed: no terminal to ask on; run it with --yes to "
                      "remove the above", file=out)
                return 1
            if ask("Remove all of the above? [y/N] ").strip().lower() not in ("y", "yes"):
                print("bulkhead uninstall: nothing removed", file=out)
                return 1
        for path, _, _ in items:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        left = [p for p, _, _ in items if os.path.lexists(p)]
        if left:
            print(f"bulkhead uninstall: could not remove {', '.join(left)}", file=out)
            return 1
        print("bulkhead uninstall: removed", file=out)
        for d, names in _prune(_made()[1]):
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            print(f"bulkhead uninstall: kept {d}: it holds what bulkhead did not make ({shown})", file=out)
    print(f"Then remove the package: {sys.executable} -m pip uninstall bulkhead (ComfyUI's Python), and "
          "the custom node's folder: ComfyUI-Manager's Uninstall, or rm -r custom_nodes/<its folder>", file=out)
    return 0
