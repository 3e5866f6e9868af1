"""Conda packages for an environment: a pack's ``[dependencies]``,
solved and installed by py-rattler (the library under pixi).

The design.  An environment's interpreter is always the venv's, from this
machine (as for every bulkhead environment): conda-forge's python cannot
be downloaded where only PyPI is reachable, and a worker on the same
CPython as its venv is what the rest of bulkhead builds and checks.  The
conda packages go into a conda prefix INSIDE the environment,
``<env>/conda``, solved with ``python <major.minor>.*`` as a constraint
(pinned to the venv's interpreter): a conda package built for Python (av)
then matches the interpreter's ABI, and one that is not (ffmpeg, cgal,
mesalib) is just files.  The worker sees the prefix as conda's activation
would show it: ``<prefix>/bin`` first on PATH, ``<prefix>/lib`` first on
LD_LIBRARY_PATH (DYLD_FALLBACK_LIBRARY_PATH on macOS), ``CONDA_PREFIX``
set, and ``<prefix>/lib/pythonX.Y/site-packages`` on sys.path through a
``.pth`` file in the venv (after the venv's own site-packages, so the
PyPI dependencies installed after the conda ones win where both have a
package).  A prefix that pulls in conda's own python (a real channel does
for av) holds it unused.

Building.  The prefix is installed into the environment's temporary
directory (envs/build.py) with rattler's ``alternative_target_prefix`` set
to the final path, so what conda packages record of their prefix
(placeholders in scripts, pkg-config files) already names where the
environment will live after the rename.  Downloads are cached in
``<workspace>/conda-pkgs``.  Channels are names (conda-forge), URLs, or a
local directory; ``BULKHEAD_CONDA_CHANNELS`` (space separated) replaces a
pack's channels, for a mirror.

py-rattler comes with bulkhead's install (requirements.txt, the
``conda`` extra of the wheel) where ComfyUI's Python is 3.10 or later.

Where it cannot be done, ``EnvBuildError`` says why and what to do: py-rattler
missing (``pip install -r requirements.txt`` in bulkhead's folder, or
``pip install 'py-rattler>=0.28,<0.29'``; under Python 3.9: none that
works), a channel that cannot be reached
(the mirror, or building where it can be reached), a package or version
the channels do not have (the solver's words, naming it).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shlex
import sys

from ..channel.spec import CONDA_CHANNELS
from . import config as packconfig
from .errors import EnvBuildError

PREFIX = "conda"            # the prefix's name inside an environment
PTH = "bulkhead-conda.pth"  # the venv's path file naming its site-packages


def channels_for(config):
    """The channels config's conda packages come from:
    ``$BULKHEAD_CONDA_CHANNELS`` when set, else the config's."""
    forced = os.environ.get(CONDA_CHANNELS, "").strip()
    if forced:
        return [c if "://" in c or not c.startswith("/") else "file://" + c for c in shlex.split(forced)]
    return list(config.channels)


RATTLER = "py-rattler>=0.28,<0.29"     # as requirements.txt and pyproject.toml's conda extra say


def _rattler():
    if sys.version_info < (3, 10):
        raise EnvBuildError(
            f"conda packages need py-rattler, whose releases that bulkhead can use need Python 3.10 or later; "
            f"this Python ({sys.executable}) is {sys.version_info[0]}.{sys.version_info[1]}: run ComfyUI under "
            "Python 3.10 or later, or give the pack no conda [dependencies]")
    try:
        import rattler  # optional: rattler
        import rattler.exceptions  # optional: rattler
    except ImportError as e:
        raise EnvBuildError(
            f"conda packages need py-rattler, which is not importable in {sys.executable} ({e}); "
            f"bulkhead's install brings it: run `{sys.executable} -m pip install -r requirements.txt` in "
            f"bulkhead's folder (custom_nodes/bulkhead), or `{sys.executable} -m pip install '{RATTLER}'`") from None
    return rattler


def site_packages(prefix, python_version):
    mm = ".".join(python_version.split(".")[:2])
    return os.path.join(prefix, "lib", f"python{mm}", "site-packages")


ERROR_MARK = "bulkhead-conda: error: "


def install(config, tmp, final, python_version, progress, *, stream, env, cache):
    """Solves and installs config's conda packages into ``<tmp>/conda`` (to
    live at ``<final>/conda``) for an interpreter of python_version, and
    writes the venv's ``.pth`` naming its site-packages under tmp
    (``finish`` turns it to final once the PyPI packages are in).  Returns
    the installed records as [[name, version, build, channel url]].
    Raises EnvBuildError.  stream, env and cache are build.py's command
    runner (``_stream``), the clean environment for the child and the
    package cache directory: handed in, as this module does not import
    build.py (which imports it).

    The solve and install run in a child process of this interpreter
    (``python -m bulkhead.envs.conda``): rattler keeps a runtime of
    threads, sockets and event fds for the life of a process, which has
    no place in a ComfyUI host, and a child is killed and reaped with the
    rest of the build when the install is interrupted."""
    chans = channels_for(config)
    where = f"the conda packages of {config.name} ({config.path}: {', '.join(config.conda)})"
    job = {"channels": chans, "specs": list(config.conda), "platform": packconfig.current_platform(),
           "python": python_version, "prefix": os.path.join(tmp, PREFIX),
           "final_prefix": os.path.join(final, PREFIX), "cache": cache,
           "where": where, "out": os.path.join(tmp, ".bulkhead-conda.json")}
    env = dict(env)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_parent
    try:
        stream([sys.executable, "-m", "bulkhead.envs.conda", json.dumps(job)], progress,
                f"installing {where}", env=env)
    except EnvBuildError as e:
        msg = [l[len(ERROR_MARK):] for l in e.output_tail.splitlines() if l.startswith(ERROR_MARK)]
        if msg:
            raise EnvBuildError(msg[-1]) from None
        raise
    with open(job["out"], encoding="utf-8") as f:
        recs = json.load(f)
    os.unlink(job["out"])
    _write_pth(tmp, site_packages(job["prefix"], python_version))
    return recs


def _main(job):
    """The child's side of ``install``: prints progress, writes the records
    to job["out"]; on a failure one ``ERROR_MARK`` line and exit status 3."""
    rattler = _rattler()
    ex = rattler.exceptions
    chans, specs, where = job["channels"], job["specs"], job["where"]
    mm = ".".join(job["python"].split(".")[:2])
    platform = job["platform"]
    print(f"solving {len(specs)} conda package(s) from {', '.join(chans)} for {platform} "
          f"(python {mm}.* as the interpreter's): {' '.join(specs)}", flush=True)

    async def go():
        recs = await rattler.solve([rattler.Channel(c) for c in chans], specs,
                                   platforms=[platform, "noarch"], constraints=[f"python {mm}.*"],
                                   virtual_packages=rattler.VirtualPackage.detect())
        print("installing " + ", ".join(f"{r.name.normalized} {r.version} ({r.build})" for r in recs), flush=True)
        await rattler.install(recs, target_prefix=job["prefix"], alternative_target_prefix=job["final_prefix"],
                              cache_dir=job["cache"], show_progress=False, execute_link_scripts=False)
        return recs

    try:
        recs = asyncio.run(go())
    except ex.GatewayError as e:
        first = [l.strip() for l in str(e).splitlines() if l.strip()]
        msg = (f"{where}: cannot read the conda channel(s) {', '.join(chans)} from this machine: "
               + " / ".join(first[:4]) +
               "; point [workspace] channels (or BULKHEAD_CONDA_CHANNELS) at a channel this machine can "
               "reach -- a mirror, or a local directory of packages indexed with rattler-index -- or run "
               "`bulkhead install` where conda-forge is reachable; no environment was made")
    except ex.SolverError as e:
        msg = (f"{where}: the channels {', '.join(chans)} cannot satisfy them for {platform} with python "
               f"{mm}: {' '.join(str(e).split())}; no environment was made")
    except Exception as e:      # rattler's other errors: installer, link, cache, a bad spec
        msg = f"{where}: {type(e).__name__}: {' '.join(str(e).split())}; no environment was made"
    else:
        with open(job["out"], "w", encoding="utf-8") as f:
            json.dump([[r.name.normalized, str(r.version), str(r.build), str(r.channel)] for r in recs], f)
        return 0
    print(ERROR_MARK + msg, flush=True)
    return 3


def _venv_site(env):
    sp = glob.glob(os.path.join(env, "lib", "python*", "site-packages"))
    if not sp:
        raise EnvBuildError(f"{env} has no lib/python*/site-packages to put the conda prefix on")
    return sp[0]


def _write_pth(env, line):
    with open(os.path.join(_venv_site(env), PTH), "w", encoding="utf-8") as f:
        f.write(line + "\n")


def finish(tmp, final, python_version):
    """Points the venv's ``.pth`` at the final prefix (before the rename)."""
    _write_pth(tmp, site_packages(os.path.join(final, PREFIX), python_version))


def worker_env(env_dir, base=None):
    """The variables a worker of the environment at env_dir runs with for
    its conda prefix (PATH, LD_LIBRARY_PATH, CONDA_PREFIX); {} when it has
    none.  The prefix is ``<env>/conda`` (bulkhead's), or the environment
    itself when it is one (a pixi environment comfy-env built).  base: the
    environment they extend (default os.environ)."""
    prefix = os.path.join(env_dir, PREFIX)
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        prefix = env_dir
        if not os.path.isdir(os.path.join(prefix, "conda-meta")):
            return {}
    base = os.environ if base is None else base
    lib = "DYLD_FALLBACK_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"

    def first(var, d):
        old = base.get(var, os.defpath if var == "PATH" else "")
        return d + (os.pathsep + old if old else "")

    return {"PATH": first("PATH", os.path.join(prefix, "bin")), lib: first(lib, os.path.join(prefix, "lib")),
            "CONDA_PREFIX": prefix}


if __name__ == "__main__":
    try:
        _rc = _main(json.loads(sys.argv[1]))
    except EnvBuildError as _e:
        print(ERROR_MARK + str(_e), flush=True)
        _rc = 3
    # os._exit: rattler's runtime threads still hold Python thread states,
    # and a normal interpreter finalisation aborts on them.
    sys.stdout.flush()
    os._exit(_rc)
