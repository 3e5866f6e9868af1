"""``python -m bulkhead``: the environment commands.

    python -m bulkhead install <pack dir> [--force] [--pip-args ARGS]
    python -m bulkhead env <pack dir>

``install`` builds the environment of every ``comfy-env.toml`` in the pack
that is not ready (all of them with ``--force``), showing progress on
stderr.  ``env`` prints where each stands.  Exit status: 0 done / all
ready, 1 failed / not ready, 2 usage.  (The C ``bulkhead`` command execs
this for ``install``.)
"""

import argparse
import os
import sys

from . import envs, packconfig


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
    return p


def _install(args):
    statuses = envs.install(args.pack_dir, force=args.force, pip_args=args.pip_args)
    for st in statuses:
        print(f"{st.name}: {st.state}: {st.python}")
    return 0


def _env(args):
    pack = os.path.abspath(args.pack_dir)
    configs = packconfig.load_pack(pack, warn=False)
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
        print(f"  reason:  {st.reason}")
        if st.fix:
            print(f"  fix:     {st.fix}")
    return 0 if ok else 1


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return _install(args) if args.command == "install" else _env(args)
    except (packconfig.PackConfigError, envs.EnvBuildError, OSError) as e:
        print(f"python -m bulkhead {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"python -m bulkhead {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
