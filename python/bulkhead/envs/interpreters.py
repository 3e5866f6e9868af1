"""Interpreters for pack environments: which Python a config's
``python`` asks for, found among pyenv's, PATH's, Debian's and uv's
(``find_interpreter``), each probed in a clean environment for its
version and whether it can make a venv; and that clean environment
(``clean_env``: nothing of the host's own Python setup reaches a probe,
venv or pip).  envs/build.py builds environments with what this finds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from ..channel.spec import INSTALLER
from . import config as packconfig
from .errors import InterpreterNotFound

# Variables of the host's environment that must not reach an interpreter
# probe, venv or pip: they would point it at the host's own Python setup.
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONEXECUTABLE", "VIRTUAL_ENV",
             "__PYVENV_LAUNCHER__", "CONDA_PREFIX")

PROBE = ("import sys, importlib.util as u; print('%d.%d.%d' % sys.version_info[:3]); "
          "print(sys.executable); print(int(u.find_spec('venv') is not None)); "
          "print(int(u.find_spec('ensurepip') is not None))")
PROBE_ENV = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """An interpreter chosen for an environment: ``path``, its full
    ``version`` ("3.12.1"), ``source`` (pyenv, PATH, debian, uv, explicit)
    and ``why`` it was chosen, in words."""

    path: str
    version: str
    source: str
    why: str


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


# --- interpreters ---

def probe(path, script=PROBE, timeout_s=30):
    """Runs ``path -I -c script``: its output lines, or raises OSError /
    CalledProcessError / TimeoutExpired."""
    out = subprocess.run([path, "-I", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=clean_env(), timeout=timeout_s, check=True,
                         universal_newlines=True)
    return out.stdout.split("\n")


def _version_tuple(v):
    return tuple(int(x) for x in v.split("."))


def _pyenv_root():
    return os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")


def _pyenv_versions():
    """(version tuple, name, python path) of every pyenv CPython, newest first."""
    vroot = os.path.join(_pyenv_root(), "versions")
    out = []
    try:
        names = os.listdir(vroot)
    except OSError:
        return out
    for n in names:
        if not re.fullmatch(r"\d+\.\d+\.\d+", n):
            continue
        for exe in ("python3", "python"):
            p = os.path.join(vroot, n, "bin", exe)
            if os.access(p, os.X_OK):
                out.append((_version_tuple(n), n, p))
                break
    out.sort(reverse=True)
    return out


def find_uv():
    """The uv binary environments are built with, or None (pip then): one
    on PATH, else the one installed beside this Python (bulkhead's
    requirements.txt brings it: a ComfyUI started as venv/bin/python
    main.py has no venv/bin on PATH), else the uv package's own.
    BULKHEAD_INSTALLER=pip: None.  (#40: a numpy-only environment built in
    0.6-0.8 s with uv, 15-45 s with pip, from the same local caches.)"""
    if os.environ.get(INSTALLER, "auto") == "pip":
        return None
    found = shutil.which("uv")
    if found:
        return found
    beside = os.path.join(sysconfig.get_path("scripts"), "uv")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    try:
        import uv  # optional: uv
        found = uv.find_uv_bin()
    except (ImportError, FileNotFoundError, AttributeError):
        return None
    return found if found and os.access(found, os.X_OK) else None


def _accept(path, want, source, why, rejected, need_ensurepip):
    """Probes a candidate: an Interpreter when it runs and is the wanted
    version (``want``: a (major, minor[, patch]) tuple), else None with the
    reason appended to ``rejected``."""
    try:
        lines = probe(path)
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", None) or str(e)
        rejected.append(f"{path} ({source}): does not run: {err.strip().splitlines()[-1] if err.strip() else e}")
        return None
    version = lines[0].strip()
    if _version_tuple(version)[:2] < packconfig.MIN_PYTHON:
        rejected.append(f"{path} ({source}): is Python {version}; a bulkhead worker needs "
                        f"{'.'.join(map(str, packconfig.MIN_PYTHON))} or newer")
        return None
    if _version_tuple(version)[:len(want)] != want:
        rejected.append(f"{path} ({source}): is Python {version}")
        return None
    if lines[2].strip() != "1":
        rejected.append(f"{path} ({source}): Python {version} has no venv module")
        return None
    if need_ensurepip and lines[3].strip() != "1":
        rejected.append(f"{path} ({source}): Python {version} has no ensurepip "
                        f"(on Debian: apt install python{want[0]}.{want[1]}-venv)")
        return None
    return Interpreter(path, version, source, why)


def list_interpreters():
    """Every CPython 3 bulkhead can see: (version, path, source), by
    version.  For error messages and ``python -m bulkhead env``."""
    seen = {}
    for _, n, p in _pyenv_versions():
        if n.startswith("3."):
            seen.setdefault(os.path.realpath(p), (n, p, "pyenv"))
    for minor in range(6, 30):
        for p, src in ((shutil.which(f"python3.{minor}"), "PATH"), (f"/usr/bin/python3.{minor}", "debian")):
            if not p or not os.access(p, os.X_OK):
                continue
            real = os.path.realpath(p)
            if real in seen or "/shims/" in p:      # a pyenv shim is the pyenv entry again
                continue
            try:
                v = probe(p, PROBE_ENV, timeout_s=10)[0].strip()
            except (OSError, subprocess.SubprocessError):
                continue
            seen[real] = (v, p, src)
    return sorted(seen.values(), key=lambda t: _version_tuple(t[0]))


def find_interpreter(request=None, *, installer_uv=None, where=None):
    """The interpreter for a config's ``python`` request.

    ``request`` is "3.12" (the newest 3.12.x found), "3.12.1" (exactly
    that), a PEP 440 specifier (">=3.10": ``find_for_specifier``), an
    absolute path (used as is: it must exist and run), or None (the host's
    own major.minor).  ``where``: the config's ``path:line`` of the key,
    which begins every error.  Candidates for a version, in order:
    pyenv (``$PYENV_ROOT/versions/3.12.*``, newest patch first),
    ``python3.12`` on PATH, Debian's ``/usr/bin/python3.12``, and
    ``uv python find 3.12`` when uv is on PATH.  Each is run once to check
    its version.  Returns an ``Interpreter``; raises ``InterpreterNotFound``
    listing what was tried and every interpreter seen."""
    try:
        return _find_interpreter(request, installer_uv)
    except InterpreterNotFound as e:
        if not where:
            raise
        raise InterpreterNotFound(f"{where}: {e}", e.found) from None


def _find_interpreter(request, installer_uv):
    uv = find_uv() if installer_uv is None else installer_uv
    need_ensurepip = not uv
    rejected = []
    if request and packconfig.is_specifier(request):
        return find_for_specifier(request, uv)
    if request and os.path.isabs(request):
        if not os.path.exists(request):
            raise InterpreterNotFound(f"interpreter {request} does not exist")
        it = _accept(request, (), "explicit", f"python = {request!r} in the config", rejected, need_ensurepip)
        if it is None:
            raise InterpreterNotFound(f"interpreter {request} cannot be used: {rejected[0].split(': ', 1)[1]}")
        return it
    host = "%d.%d" % sys.version_info[:2]
    if not request:
        request, why0 = host, f"no python key in the config: the host's version {host}; "
    else:
        why0 = ""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", request)
    if not m:
        raise InterpreterNotFound(f"python = {request!r} is neither a version nor an absolute path")
    want = tuple(int(x) for x in m.groups() if x is not None)
    mm = f"{want[0]}.{want[1]}"
    exact = len(want) == 3

    pyenv = [(n, p) for t, n, p in _pyenv_versions() if t[:len(want)] == want]
    versions_dir = os.path.join(_pyenv_root(), "versions")
    for n, p in pyenv:
        others = [x for x, _ in pyenv if x != n]
        why = (f"pyenv {n}" + ("" if exact else f", the newest {mm} patch in {versions_dir}")
               + (f" (also there: {', '.join(others)})" if others else ""))
        it = _accept(p, want, "pyenv", why0 + why, rejected, need_ensurepip)
        if it:
            return it
    tried = [f"pyenv ({versions_dir}/{request}{'' if exact else '.*'})"]
    on_path = shutil.which(f"python{mm}")
    tried.append(f"python{mm} on PATH")
    if on_path:
        it = _accept(on_path, want, "PATH", why0 + f"python{mm} on PATH ({on_path})", rejected, need_ensurepip)
        if it:
            return it
    deb = f"/usr/bin/python{mm}"
    tried.append(deb)
    if os.access(deb, os.X_OK) and (not on_path or os.path.realpath(on_path) != os.path.realpath(deb)):
        it = _accept(deb, want, "debian", why0 + f"the system's {deb}", rejected, need_ensurepip)
        if it:
            return it
    if uv:
        tried.append(f"uv python find {request}")
        try:
            out = subprocess.run([uv, "python", "find", request], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                                 timeout=60, universal_newlines=True)
            p = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
        except (OSError, subprocess.SubprocessError):
            p = ""
        if p:
            it = _accept(p, want, "uv", why0 + f"uv python find {request} ({p})", rejected, need_ensurepip)
            if it:
                return it
    found = list_interpreters()
    msg = (f"no Python {request} interpreter found; looked at: {', '.join(tried)}."
           + ("\nrejected:\n  " + "\n  ".join(rejected) if rejected else "")
           + "\ninterpreters on this machine: "
           + (", ".join(f"{v} ({p})" for v, p, _ in found) if found else "none")
           + f"\ninstall Python {request} (pyenv install {request}"
           + (f", or uv python install {request}" if uv else "")
           + ") or name an interpreter path in the config's python key")
    raise InterpreterNotFound(msg, found)


def find_for_specifier(request, uv=None):
    """The interpreter for a specifier (">=3.10"): the newest CPython found
    here (``list_interpreters``; then ``uv python find``) whose version
    satisfies it and that can make an environment -- as comfy-env's pixi
    solve took the newest Python satisfying it (from conda-forge; bulkhead
    downloads none).  Raises ``InterpreterNotFound`` naming the specifier
    and every interpreter seen."""
    spec = packconfig.specifier_set(request)
    found = list_interpreters()
    fits = sorted((t for t in found if spec.contains(t[0], prereleases=True)),
                  key=lambda t: _version_tuple(t[0]), reverse=True)
    rejected = []
    for v, p, source in fits:
        others = [x for x, _, _ in fits if x != v]
        why = (f"python = {request!r} in the config: the newest interpreter here that satisfies it ({source} {p})"
               + (f"; also satisfying it: {', '.join(dict.fromkeys(others))}" if others else ""))
        it = _accept(p, (), source, why, rejected, not uv)
        if it:
            return it
    tried = ["pyenv", "python3.N on PATH", "/usr/bin/python3.N"]
    if uv:
        tried.append(f"uv python find {request}")
        try:
            out = subprocess.run([uv, "python", "find", request], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=clean_env(), timeout=60, universal_newlines=True)
            p = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
        except (OSError, subprocess.SubprocessError):
            p = ""
        if p:
            it = _accept(p, (), "uv", f"python = {request!r} in the config: uv python find {request} ({p})",
                         rejected, False)
            if it and spec.contains(it.version, prereleases=True):
                return it
            if it:
                rejected.append(f"{p} (uv): is Python {it.version}")
    raise InterpreterNotFound(
        f"python = {request!r}: no interpreter found here satisfies it; looked at: {', '.join(tried)}."
        + ("\nrejected:\n  " + "\n  ".join(rejected) if rejected else "")
        + "\ninterpreters on this machine: "
        + (", ".join(f"{v} ({p})" for v, p, _ in found) if found else "none")
        + "\ninstall a Python that satisfies it (pyenv install 3.N"
        + (", or uv python install 3.N" if uv else "")
        + "), or widen the specifier in the config's python key", found)
