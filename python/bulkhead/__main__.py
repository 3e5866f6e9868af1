"""``python -m bulkhead``: the environment commands and the contract check.

    python -m bulkhead install <pack dir> [--force] [--pip-args ARGS]
    python -m bulkhead env <pack dir>
    python -m bulkhead doctor [--json] [COMFYUI_DIR]
    python -m bulkhead canary [--json] [--without NAME]... COMFYUI_DIR
    python -m bulkhead uninstall [--yes] [--dry-run]

``install`` builds the environment of every ``comfy-env.toml`` in the pack
that is not ready (all of them with ``--force``), showing progress on
stderr (every line is in the build's log file too), describes each
one's nodes in a worker into the node metadata cache ComfyUI's next start
reads (host/pack.py ``describe_ahead``: that start starts no worker to
describe them), then tells each ComfyUI running on the machine and prints what it does with the result:
one that serves the pack without it serves it isolated from it at once.  ``env`` prints where each stands.  ``doctor`` imports a ComfyUI
(as under ``--cpu``) and prints bulkhead's contract with it
(``bulkhead.cli.doctor`` over ``bulkhead.host.contract``): every name bulkhead reads or calls there, its tier
and whether this ComfyUI offers it.  Exit status: 0 done / all ready /
nothing FATAL fails, 1 failed / not ready / something FATAL fails, 2 usage
(for doctor also: no ComfyUI in the directory).  ``canary`` checks the
StandIn against what a ComfyUI's model_management.py reads off its ledger
entries (``bulkhead.cli.canary``, which parses its own arguments and documents
its exit status).  ``uninstall``
lists what bulkhead left for this user and removes it after asking
(``bulkhead.cli.uninstall``).  (The C ``bulkhead`` command execs this for
``install``, ``env``, ``doctor``, ``canary`` and ``uninstall``.)
"""

import argparse
import os
import re
import sys

from .envs import build as envs, config as packconfig
from .host import controlclient, rundir


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m bulkhead",
        description="Build and check the isolated environments of ComfyUI node packs "
                    "that declare one in comfy-env.toml.",
        epilog="exit status: 0 success (all ready), 1 failure (not ready), 2 usage error")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    i = sub.add_parser("install", help="build a pack's environments",
                       description="Build the environment of every comfy-env.toml in PACK_DIR "
                                   "(its root, nodes/, nodes/<subdir>/) that is not ready.")
    i.add_argument("pack_dir", metavar="PACK_DIR", help="the node pack's directory")
    i.add_argument("--force", action="store_true", help="rebuild environments that are ready too")
    i.add_argument("--pip-args", metavar="ARGS", default=None,
                   help="extra arguments for pip (or uv pip), shell-quoted, e.g. "
                        "'--no-index --find-links /wheels' (default: $BULKHEAD_PIP_ARGS)")
    e = sub.add_parser("env", help="show where a pack's environments stand",
                       description="Print the state of each environment of PACK_DIR: ready, "
                                   "missing, stale, foreign or broken.")
    e.add_argument("pack_dir", metavar="PACK_DIR", help="the node pack's directory")
    d = sub.add_parser("doctor", help="check bulkhead's contract with a ComfyUI",
                       description="Import the ComfyUI in COMFYUI_DIR (default: $COMFYUI_PATH, else the "
                                   "current directory) as under --cpu and print every name bulkhead reads "
                                   "or calls there: its tier (FATAL: bulkhead refuses isolation without "
                                   "it; DEGRADED: a feature is off; OPTIONAL), the side that uses it and "
                                   "whether this ComfyUI offers it (ok, missing, signature changed).",
                       epilog="exit status: 0 nothing FATAL fails, 1 something FATAL fails, "
                              "2 usage error or no ComfyUI in COMFYUI_DIR")
    d.add_argument("comfyui", metavar="COMFYUI_DIR", nargs="?", default=None,
                   help="the ComfyUI directory (the one holding comfy/ and main.py)")
    d.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    u = sub.add_parser("uninstall", help="list and remove what bulkhead left for this user",
                       description="List, with sizes, what bulkhead made for this user (pack environments, "
                                   "the host link farm, caches, the shared-memory ledger, control sockets) "
                                   "and remove it after asking; refused while a bulkhead process runs.")
    u.add_argument("--yes", action="store_true", help="remove without asking")
    u.add_argument("--dry-run", action="store_true", help="only list")
    # Listed for --help only: main() hands canary's arguments to bulkhead.cli.canary.
    sub.add_parser("canary", add_help=False, help="check the StandIn against what a ComfyUI checkout "
                   "reads off its ledger entries (canary --help)")
    return p


def _install(args):
    statuses = envs.install(args.pack_dir, force=args.force, pip_args=args.pip_args)
    for st in statuses:
        print(f"{st.name}: {st.state}: {st.python}")
    for line in _describe_ahead(args.pack_dir):
        print(line)
    for line in _tell_running([st.config_path for st in statuses]):
        print(line)
    return 0


def _describe_ahead(pack_dir):
    """Each built config's nodes described now, into the node metadata
    cache ComfyUI's next start reads (host/pack.py ``describe_pack``):
    that start registers them without a worker.  One line each."""
    from .host import pack  # lazy: CLI start (its nodes, runtime, ...: only an install describes)
    return pack.describe_pack(pack_dir)


def _tell_running(config_paths):
    """Tells each ComfyUI running bulkhead on this machine (for this user:
    its control socket) that these configs' environments are built, and
    returns what each says it does with them (host/building.py
    ``picked_up``: a pack it serves in-process, refused or failed is
    served isolated from it now, without a restart)."""
    pids = set()
    for d in rundir.runtime_dirs():
        try:
            pids.update(int(m.group(1)) for m in map(re.compile(r"host-(\d+)\.sock\Z").match, os.listdir(d)) if m)
        except OSError:
            pass
    lines = []
    for pid in sorted(pids):
        try:
            answers = controlclient.request(pid, "built", list(config_paths), timeout_s=10.0)
        except (controlclient.ControlUnreachable, OSError):
            continue    # a host that is gone (its socket left behind): nothing to tell
        except Exception as e:  # a host too old to know "built", or stuck: it uses it from its next start
            lines.append(f"ComfyUI (bulkhead host pid {pid}) was not told ({type(e).__name__}: {e}); "
                         "restart it to use the new environment")
            continue
        lines.extend(f"ComfyUI (bulkhead host pid {pid}): {a}" for a in answers)
    if not lines:
        lines.append("no running ComfyUI on this machine serves this pack: ComfyUI's next start uses the new "
                     "environment")
    return lines


def _env(args):
    pack = os.path.abspath(args.pack_dir)
    configs = packconfig.load_configs(pack, warn=False)
    if not configs:
        print(f"{pack}: no {packconfig.CONFIG_NAME} in the root, nodes/ or nodes/<subdir>/: "
              "the pack runs in the host, not isolated", file=sys.stderr)
        return 1
    ok = True
    for c in configs:
        for w in c.warnings:
            print(f"warning: {w}", file=sys.stderr)
        st = envs.env_status(c)
        ok = ok and st.ok
        print(f"{c.name}: {st.state}")
        print(f"  config:  {c.path}")
        print(f"  env:     {st.env_dir}")
        if st.python:
            print(f"  python:  {st.python} ({st.version})")
        if c.python and packconfig.is_specifier(c.python):
            print(f"  picked:  {_picked(c, st)}")
        print(f"  reason:  {st.reason}")
        if st.fix:
            print(f"  fix:     {st.fix}")
    return 0 if ok else 1


def _picked(c, st):
    """Which interpreter a config's python specifier got, and why: the
    built environment's (its stamp), else the one a build would take."""
    why = ((envs.read_stamp(st.env_dir) or {}).get("interpreter") or {}).get("why") if st.python else None
    if why:
        return why
    try:
        it = envs.find_interpreter(c.python, where=packconfig.key_where(c.path, "python"))
    except envs.InterpreterNotFound as e:
        return f"none: {e}"
    return f"a build would take {it.path} (Python {it.version}): {it.why}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["canary"]:
        from .cli import canary  # lazy: CLI start (one command's module)
        return canary.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from .cli import doctor  # lazy: CLI start (one command's module)
        return doctor.main(args.comfyui, as_json=args.json)
    if args.command == "uninstall":
        from .cli import uninstall  # lazy: CLI start (one command's module)
        return uninstall.main(yes=args.yes, dry_run=args.dry_run)
    try:
        return _install(args) if args.command == "install" else _env(args)
    except (packconfig.PackConfigError, envs.EnvBuildError, OSError) as e:
        print(f"python -m bulkhead {args.command}: {e}", file=sys.stderr)
        if getattr(e, "log_path", None):
            print(f"python -m bulkhead {args.command}: the whole output is in {e.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"python -m bulkhead {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
