"""A pack's declaration: finding and reading ``comfy-env.toml``.

A node pack asks for isolation with a ``comfy-env.toml`` -- the file packs
already ship for the existing comfy-env tool.  bulkhead reads the part of
it that decides a worker environment and a worker's run time, and says
so, once, about every part it does not read.

Where configs are found (``find_configs``), in this order:

  1. ``<pack>/comfy-env.toml``            -- governs the whole pack;
  2. ``<pack>/nodes/comfy-env.toml``      -- governs ``nodes/``;
  3. ``<pack>/nodes/<subdir>/comfy-env.toml`` for each subdirectory, in
     name order                           -- each governs its subdirectory.

Every config found is one worker environment and one worker; a config's
directory is the code it governs, and for any file in the pack the
DEEPEST config directory above it wins (``config_for``).  So a pack with
only a root config runs entirely in one worker, and a pack with
``nodes/a/comfy-env.toml`` and ``nodes/b/comfy-env.toml`` runs ``a`` and
``b`` in two workers (with a root config too, the rest of the pack runs
in a third).  Only these three places are looked at: a config deeper
than ``nodes/<subdir>/`` is not a bulkhead config.

What is read:

  ``python``               "3.12" (newest 3.12.x found), "3.12.1" (that
                           patch), a PEP 440 specifier (">=3.10",
                           ">=3.10,<3.13": the newest interpreter found here
                           that satisfies it, as comfy-env's pixi solve took
                           the newest Python that did), or an interpreter
                           path (absolute, ``~``, or relative to the
                           config's directory).  Absent: the host's own
                           major.minor.
  ``requirements``         a list of pip requirement strings.
  ``[pypi-dependencies]``  pixi style: ``name = "<2"``, ``name = "*"``,
                           ``name = { version = ">=1", extras = ["x"] }``,
                           ``"name[x]" = "*"`` (extras in the key, as pixi
                           and comfy-env take it),
                           ``{ path = "..." }``, ``{ url = "..." }``,
                           ``{ git = "...", rev = "..." }``.
                           ``{ version = ">=1", index = "https://..." }``
                           (that entry from that index alone, its
                           dependencies from the default ones).
  ``[target.<platform>.pypi-dependencies]``  for this machine's pixi
                           platform (``current_platform()``) and its
                           selectors (unix, linux, osx, win); other
                           platforms' tables are checked, not applied; an
                           unknown platform name is an error.
  ``[env_vars]``           set in the worker only (never in the host); any
                           TOML scalar, turned into text as comfy-env does
                           (``str()``: 3 -> "3", true -> "True").
  ``[apt]``/``[brew]``     ``packages = [...]``: checked for presence at
                           install (rootconfig's ``check_system_packages``),
                           never run.
  ``[dependencies]``       conda packages (``name = "spec"`` or ``{ version,
                           build, channel }``), with this platform's
                           ``[target.*.dependencies]``, from ``[workspace]
                           channels`` (default conda-forge; a local
                           directory too): solved and installed into the
                           environment's conda prefix (envs/conda.py).
  ``[cuda]``               ``packages = [...]``: wheels resolved from the
                           CUDA wheel indexes (envs/cudawheels.py); torch
                           and its family there are the host's (a note).
  ``[bulkhead]``           bulkhead's own options (``OPTIONS`` below); an
                           unknown key here is an error.

Anything else -- ``pypi-options``, ``system-requirements``, ``activation``, ``[tasks]``, ...
-- is one ``PackConfigWarning`` per table naming the table, the file and
what not reading it means.  ``comfy-env-root.toml`` at the pack's root
(envs/rootconfig.py's ``load_root``) is no environment: its ``[node_packs]``/``[node_reqs]``,
``[types]``, ``[apt]``/``[brew]`` are read, anything else is an error.  Errors are
``PackConfigError`` with ``path:line[:column]: message`` (a TOML syntax
error carries the parser's line and column; a wrong type names the key and
the type expected, with the key's line found in the source text, best
effort).  rootconfig.py reads its file with this module's reader:
``toml_loads``, ``Reader``, ``check_packages``, ``warn_note``.

The result is a frozen ``PackConfig``.  Its ``config_hash`` is a sha256
over what decides the ENVIRONMENT -- the python request and the normalised
requirements -- plus the bulkhead protocol version.  ``[env_vars]`` and
``[bulkhead]`` apply at run time, so editing them does not make an
environment stale.

This module needs ``tomllib`` (Python 3.11+) or ``tomli`` only when it
parses: importing it (as every worker does, through ``bulkhead``) costs
nothing on Python 3.9.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform as _platform
import re
import shutil
import sys
import types
import warnings
from typing import Mapping, Optional, Tuple

try:
    from packaging.specifiers import SpecifierSet
except ImportError:     # bulkhead has no Python dependencies; pip (which builds environments) has packaging
    from pip._vendor.packaging.specifiers import SpecifierSet

from .. import _native
from ..channel import spec
from ..channel.peer import BulkheadError
from .tomlpos import find_line as _find_line

CONFIG_NAME = "comfy-env.toml"
ROOT_CONFIG_NAME = "comfy-env-root.toml"

# The oldest Python a worker runs on (the extension's limited API).
MIN_PYTHON = (3, 9)

# Version of the normalised form the hash is taken over: bump it when the
# normalisation changes, so every environment is seen as stale once.
HASH_FORMAT = 1

# [bulkhead] keys that take seconds: name -> (what it is, smallest value
# allowed, whether the smallest value itself is allowed); their rows,
# defaults and units are channel/spec.py's.
OPTIONS = spec.seconds_table()

# [bulkhead] keys that take true or false: name -> what it is.
FLAGS = spec.flags_table()

# [bulkhead] keys that take an array of paths (~ expanded, relative to the
# pack's folder): name -> what it is.
PATH_LISTS = spec.paths_table()

# [bulkhead] keys that take one of a few words: name -> (what it is, the words).
CHOICES = spec.choices_table()

# Tables bulkhead knows it does not implement, with what that means.
_UNIMPLEMENTED = {
    "apt": "its system packages are NOT installed (bulkhead checks each with dpkg-query at install and "
           "names the apt-get command for those missing)",
    "brew": "its system packages are NOT installed (bulkhead checks each with brew list at install on macOS and "
            "names the brew command for those missing)",
    "node_reqs": "the node packs it names are NOT installed; install them in ComfyUI yourself",
    "node_packs": "the node packs it names are NOT installed; install them in ComfyUI yourself",
    "types": "its types are not read from an environment's file; declare them in comfy-env-root.toml",
    "pypi-options": "its pip options (index-url, find-links, no-build-isolation, dependency-overrides...) "
                    "are NOT applied; pass pip options in BULKHEAD_PIP_ARGS",
    "activation": "its activation variables and scripts are NOT applied; set variables under [env_vars]",
    "tasks": "its tasks are NOT run",
    "system-requirements": "its system requirements (glibc, cuda, macos versions) are NOT checked",
    "target": "its per-platform settings are NOT applied",
    "feature": "its features are NOT applied; only the top-level tables are read",
    "environments": "its environments are NOT built; one config is one environment",
}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PY_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?\Z")
_DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\Z")
_KEY_EXTRAS = re.compile(r"\s*([^\[\s]+)\s*\[([^\]]*)\]\s*\Z")
_REQ_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(.*)\Z", re.S)
_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")


class PackConfigError(BulkheadError, ValueError):
    """A ``comfy-env.toml`` that cannot be used.  ``path``, ``line`` and
    ``column`` (either may be None) say where; ``key`` names the key at
    fault when there is one."""

    def __init__(self, path, message, line=None, column=None, key=None):
        where = str(path)
        if line:
            where += f":{line}"
            if column:
                where += f":{column}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.key = key
        self.reason = message


class PackConfigWarning(UserWarning):
    """A part of a ``comfy-env.toml`` that bulkhead does not implement."""


def warn_note(note, path):
    """Issues one note as a PackConfigWarning located at the config file's
    own line (so Python's warning display shows that TOML line, never a
    line of this module)."""
    m = re.match(re.escape(path) + r":(\d+):", note)
    warnings.warn_explicit(note, PackConfigWarning, path, int(m.group(1)) if m else 0,
                           module="bulkhead.envs.config", registry=_WARNED)


_WARNED = {}     # warn_explicit's registry: Python's filter shows each note once per process


@dataclasses.dataclass(frozen=True)
class PackConfig:
    """One ``comfy-env.toml``, read and normalised.

    ``path``          the config file (absolute).
    ``root``          the pack's root directory (what ``bulkhead install``
                      takes).
    ``name``          the worker's and environment's name: the pack
                      directory's name, and ``<pack>.<subdir>`` for a config
                      in ``nodes/<subdir>/``.
    ``python``        the request as written ("3.12", "3.12.1", an absolute
                      path), a specifier in packaging's normal form
                      ("<3.13,>=3.10": ``is_specifier``), or None for the
                      host's major.minor.
    ``env_vars``      read-only mapping str -> str, for the worker only.
    ``requirements``  tuple of pip requirement strings, normalised, sorted,
                      without duplicates: exactly what the environment gets.
    ``options``       read-only mapping of the ``[bulkhead]`` table.
    ``warnings``      tuple of the warnings this file produced.
    ``config_hash``   hex sha256 of the environment-deciding content and the
                      protocol version.
    ``indexes``       ((index URL, requirements), ...): the requirements a
                      ``[pypi-dependencies]`` entry pins to an ``index``
                      (also in ``requirements``), installed from that index.
    ``system_packages`` {"apt": (...), "brew": (...)} as the file lists them:
                      checked for presence at install, never installed.
    ``platform``      the pixi platform the ``[target.*]`` tables were chosen
                      for (``current_platform()``).
    ``conda``         conda match specs from ``[dependencies]`` and this
                      platform's ``[target.*.dependencies]`` (sorted):
                      installed into the environment's conda prefix.
    ``channels``      the channels they come from (``[workspace] channels``,
                      default conda-forge); empty without conda packages.
    ``cuda``          ``[cuda] packages``: wheels resolved at install from
                      the CUDA wheel indexes for the env's torch, CUDA,
                      Python and platform (``envs.cudawheels``).
    ``local``         requirement strings of a comfy-env 0.0.x ``[local]``
                      table, for the host's own Python (ComfyUI's), where
                      that release installed them: installed there only by
                      ``bulkhead install`` (envs/build.py ``install_local``),
                      never part of the environment or its hash.
    ``local_cuda``    those of ``local`` from ``[local.cuda]``
                      (``name`` or ``name==version``): CUDA wheels for the
                      host's torch, from the CUDA wheel index
                      (``envs.cudawheels``), installed without their
                      dependencies, as that release installed them.
    ``no_deps``       those of ``requirements`` a comfy-env 0.0.x simple
                      shape lists under ``[packages] no_deps``, which
                      that release installed with ``--no-deps``: the
                      build installs them after the others, without their
                      dependencies (envs/build.py).  In the hash when
                      there are any.
    """

    path: str
    root: str
    name: str
    python: Optional[str]
    env_vars: Mapping[str, str] = dataclasses.field(hash=False)
    requirements: Tuple[str, ...]
    options: Mapping[str, float] = dataclasses.field(hash=False)
    warnings: Tuple[str, ...]
    config_hash: str
    indexes: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    system_packages: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)
    platform: str = ""
    conda: Tuple[str, ...] = ()
    channels: Tuple[str, ...] = ()
    cuda: Tuple[str, ...] = ()
    local: Tuple[str, ...] = ()
    no_deps: Tuple[str, ...] = ()
    local_cuda: Tuple[str, ...] = ()

    @property
    def directory(self):
        """The directory this config governs (the one it lies in)."""
        return os.path.dirname(self.path)

    @property
    def hash12(self):
        return self.config_hash[:12]


# --- discovery ---

def find_configs(pack_dir):
    """The ``comfy-env.toml`` files of a pack, as absolute paths, in the
    order described at the top of this module.  An empty list when there
    are none; ``NotADirectoryError``/``FileNotFoundError`` when
    ``pack_dir`` is not a directory."""
    pack_dir = os.path.abspath(os.fspath(pack_dir))
    if not os.path.isdir(pack_dir):
        if os.path.exists(pack_dir):
            raise NotADirectoryError(f"pack directory {pack_dir} is not a directory")
        raise FileNotFoundError(f"pack directory {pack_dir} does not exist")
    found = []
    for d in (pack_dir, os.path.join(pack_dir, "nodes")):
        f = os.path.join(d, CONFIG_NAME)
        if os.path.isfile(f):
            found.append(f)
    nodes = os.path.join(pack_dir, "nodes")
    if os.path.isdir(nodes):
        for sub in sorted(os.listdir(nodes)):
            if sub.startswith((".", "_")):     # as comfy-env: _private and .hidden are no pack's
                continue
            f = os.path.join(nodes, sub, CONFIG_NAME)
            if os.path.isfile(f):
                found.append(f)
    return found


def load_configs(pack_dir, *, warn=True):
    """Every config of a pack, loaded (``find_configs`` order)."""
    pack_dir = os.path.abspath(os.fspath(pack_dir))
    return [load(p, root=pack_dir, warn=warn) for p in find_configs(pack_dir)]


def config_for(configs, path):
    """The config governing file or directory ``path``: the one whose
    directory is the deepest above it, or None."""
    path = os.path.abspath(os.fspath(path))
    best = None
    for c in configs:
        d = c.directory
        if (path == d or path.startswith(d + os.sep)) and (best is None or len(d) > len(best.directory)):
            best = c
    return best


def _pack_root(path):
    """The pack root for a config file found in one of the three places."""
    d = os.path.dirname(path)
    if os.path.basename(d) == "nodes":
        return os.path.dirname(d)
    parent = os.path.dirname(d)
    if os.path.basename(parent) == "nodes":
        return os.path.dirname(parent)
    return d


def pack_name(path, root):
    """The name of the config at ``path`` of the pack at ``root`` in logs
    and handles: the pack's, ``<pack>.<subdir>`` for ``nodes/<subdir>/``."""
    name = os.path.basename(root.rstrip(os.sep)) or "pack"
    d = os.path.dirname(path)
    if os.path.dirname(d) == os.path.join(root, "nodes"):
        name += "." + os.path.basename(d)
    return name


# --- parsing ---

def toml_loads(text, path):
    try:
        import tomllib as toml  # optional: tomllib (Python 3.11+)
    except ImportError:
        try:
            import tomli as toml  # optional: tomli
        except ImportError:
            raise PackConfigError(
                path, "cannot read TOML: this Python has no tomllib (3.11+) and no tomli; "
                      f"install it with: {sys.executable} -m pip install tomli") from None
    try:
        return toml.loads(text)
    except RecursionError:      # the reader recurses per array or inline table level
        raise PackConfigError(path, "arrays or inline tables nest deeper than a TOML reader can follow; "
                                    "flatten them", _deepest_line(text)) from None
    except toml.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS.search(msg)
        line = int(m.group(1)) if m else getattr(e, "lineno", None)
        col = int(m.group(2)) if m else getattr(e, "colno", None)
        reason = _TOML_POS.sub("", msg).strip()
        raise PackConfigError(path, f"TOML syntax error: {reason}", line, col) from None


def _deepest_line(text):
    """The line where arrays and inline tables nest deepest (strings and
    comments skipped; a rough scan, for the error's line only)."""
    depth = deepest = 0
    line = where = 1
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\n":
            line += 1
        elif quote is not None:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#":
            while i + 1 < len(text) and text[i + 1] != "\n":
                i += 1
        elif c in "[{":
            depth += 1
            if depth > deepest:
                deepest, where = depth, line
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return where


class Reader:
    """Checks one parsed document against what bulkhead reads."""

    def __init__(self, path, text):
        self.path = path
        self.text = text

    def error(self, message, *keypath):
        raise PackConfigError(self.path, message, _find_line(self.text, *keypath) if keypath else None,
                              key=".".join(keypath) or None)

    def type_error(self, keypath, expected, value):
        self.error(f"{'.'.join(_q(k) for k in keypath)} must be {expected}, not "
                   f"{_toml_type(value)} ({value!r})", *keypath)


def _q(k):
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_type(v):
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a table"
    return type(v).__name__


def _norm_name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _norm_req(req):
    """One requirement string: no whitespace in the name-and-specifier part
    (where PEP 508 gives it no meaning), a marker's whitespace collapsed,
    the name in PEP 503 normal form.  Strings that do not start with a name
    (a URL, a path) keep their text."""
    head, sep, marker = req.partition(";")
    head = " ".join(head.split()) if "@" in head else "".join(head.split())
    req = head + (f"; {' '.join(marker.split())}" if sep else "")
    m = _REQ_NAME.match(req)
    if m and not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", req):
        return _norm_name(m.group(1)) + m.group(2)
    return req


def _dep_from_table(r, name, spec, keypath):
    """A [pypi-dependencies] entry written as a table -> (requirement,
    index URL or None)."""
    table = "[" + ".".join(_q(k) for k in keypath[:-1]) + "]"
    allowed = {"version", "extras", "path", "url", "git", "rev", "tag", "branch", "subdirectory", "editable",
               "index"}
    for k in spec:
        if k not in allowed:
            r.error(f"{table} {name}: unknown key {k!r} (known: {', '.join(sorted(allowed))})", *keypath)
    extras = spec.get("extras", [])
    if not isinstance(extras, list) or not all(isinstance(e, str) and _DIST_NAME.match(e) for e in extras):
        r.type_error(keypath + ("extras",), "an array of extra names", extras)
    for k in ("version", "path", "url", "git", "rev", "tag", "branch", "subdirectory", "index"):
        if k in spec and not isinstance(spec[k], str):
            r.type_error(keypath + (k,), "a string", spec[k])
    if spec.get("editable"):
        r.error(f"{table} {name}: editable installs are not supported "
                "(an environment is built once and must not depend on a working tree)", *keypath)
    sources = [k for k in ("path", "url", "git") if k in spec]
    if len(sources) > 1:
        r.error(f"{table} {name}: give one of path, url, git (got {', '.join(sources)})", *keypath)
    head = _norm_name(name) + (f"[{','.join(sorted({_norm_name(e) for e in extras}))}]" if extras else "")
    index = spec.get("index")
    if index is not None:
        if sources:
            r.error(f"{table} {name}: index cannot be combined with {sources[0]} "
                    "(an index serves versions, a path/url/git names one artifact)", *keypath)
        if not re.match(r"(https?|file)://", index.strip()):
            r.error(f"{table} {name}: index = {index!r} is not an http(s):// or file:// URL", *keypath)
        index = index.strip()
    if sources:
        if "version" in spec:
            r.error(f"{table} {name}: version cannot be combined with {sources[0]}", *keypath)
        if "path" in spec:
            p = os.path.expanduser(spec["path"])
            if not os.path.isabs(p):
                p = os.path.join(os.path.dirname(r.path), p)
            url = "file://" + os.path.normpath(p)
        elif "url" in spec:
            url = spec["url"]
        else:
            g = spec["git"].strip()
            if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", g) and not re.match(r"[^/]+@[^/:]+:", g):
                # a local repository, as pixi takes it: relative to the config
                g = os.path.normpath(os.path.join(os.path.dirname(r.path), os.path.expanduser(g)))
                g = "file://" + g
            if g.startswith("file:///"):
                # pip's PEP 508 parser refuses git+file:/// (an empty host)
                g = "file://localhost/" + g[len("file:///"):]
            url = "git+" + g
            refs = [spec[k] for k in ("rev", "tag", "branch") if k in spec]
            if len(refs) > 1:
                r.error(f"{table} {name}: give one of rev, tag, branch", *keypath)
            if refs:
                url += "@" + refs[0]
        if "subdirectory" in spec:
            url += "#subdirectory=" + spec["subdirectory"]
        return f"{head} @ {url}", None
    for k in ("rev", "tag", "branch", "subdirectory"):
        if k in spec:
            r.error(f"{table} {name}: {k} needs git (or url/path)", *keypath)
    return head + _version_spec(r, keypath, spec.get("version", "*")), index


def _read_pypi(r, deps, keypath):
    """A [pypi-dependencies] table (top-level or a target's) ->
    {normalised name: (requirement, index or None)}."""
    table = "[" + ".".join(_q(k) for k in keypath) + "]"
    if not isinstance(deps, dict):
        r.type_error(keypath, 'a table of name = "version spec"', deps)
    out = {}
    for key, spec in deps.items():
        # "trimesh[easy]" = "*": extras in the key, as pixi and comfy-env took it.
        m = _KEY_EXTRAS.match(key)
        name, extras = (m.group(1), [e.strip() for e in m.group(2).split(",") if e.strip()]) if m else (key, [])
        if not _DIST_NAME.match(name) or not all(_DIST_NAME.match(e) for e in extras):
            r.error(f"{table} {key!r} is not a valid distribution name (a name, or name[extra,...])", *keypath, key)
        if isinstance(spec, str):
            head = _norm_name(name) + (f"[{','.join(sorted({_norm_name(e) for e in extras}))}]" if extras else "")
            req = (head + _version_spec(r, keypath + (key,), spec), None)
        elif isinstance(spec, dict):
            if extras and isinstance(spec.get("extras", []), list):
                spec = dict(spec, extras=list(spec.get("extras", [])) + extras)
            req = _dep_from_table(r, name, spec, keypath + (key,))
        else:
            r.type_error(keypath + (key,), 'a version spec string or a table', spec)
        out[_norm_name(name)] = req
    return out


def _check_conda(r, deps, keypath):
    """A conda ``[dependencies]`` table (name = "spec" or a table of
    version/build/channel): {name: match spec string} (``channel::name
    version build``, what rattler's MatchSpec reads)."""
    if not isinstance(deps, dict):
        r.type_error(keypath, 'a table of conda package = "version spec"', deps)
    out = {}
    for name, spec in deps.items():
        if not _DIST_NAME.match(name):
            r.error(f"{'.'.join(_q(k) for k in keypath)}: {name!r} is not a conda package name", *keypath, name)
        version, build, channel = "", "", ""
        if isinstance(spec, dict):
            for k, v in spec.items():
                if k in ("version", "build", "channel", "build-number", "file-name", "md5", "sha256",
                         "subdir", "license") and not isinstance(v, str):
                    r.type_error(keypath + (name, k), "a string", v)
                if k not in ("version", "build", "channel"):
                    r.error(f"{'.'.join(_q(k) for k in keypath + (name,))}: key {k!r} is not supported by "
                            "bulkhead (known: version, build, channel)", *keypath, name)
            version, build, channel = (spec.get("version", ""), spec.get("build", ""), spec.get("channel", ""))
        elif isinstance(spec, str):
            version = spec
        else:
            r.type_error(keypath + (name,), 'a version spec string or a table', spec)
        version = version.strip()
        ms = (f"{channel}::" if channel else "") + name.lower()
        if version and version != "*" or build:
            ms += " " + (version.replace(" ", "") or "*")
        if build:
            ms += " " + build.strip()
        out[name.lower()] = ms
    return out


def check_packages(r, table, value, allow_scalar=False):
    """``[apt]`` / ``[brew]`` / ``[cuda]``: ``packages = ["a", "b"]``."""
    if not isinstance(value, dict):
        r.type_error((table,), "a table with packages = [...]", value)
    pk = value.get("packages", [])
    if allow_scalar and isinstance(pk, str):
        pk = [pk]
    if not isinstance(pk, list) or not all(isinstance(x, str) and x.strip() for x in pk):
        r.type_error((table, "packages"), "an array of package names", pk)
    return tuple(x.strip() for x in pk)


# pixi's platforms (what [target.<name>] may name) and its generic selectors.
PLATFORMS = ("linux-32", "linux-64", "linux-aarch64", "linux-armv6l", "linux-armv7l", "linux-ppc64le",
             "linux-ppc64", "linux-s390x", "linux-riscv32", "linux-riscv64", "osx-64", "osx-arm64",
             "win-32", "win-64", "win-arm64", "emscripten-wasm32", "wasi-wasm32", "zos-z")
SELECTORS = ("unix", "linux", "osx", "win")


def current_platform():
    """This machine's pixi platform name (``linux-64``, ``osx-arm64``, ...),
    as comfy-env names it; ``$BULKHEAD_PLATFORM`` overrides it."""
    forced = os.environ.get(spec.PLATFORM)
    if forced:
        return forced
    machine = _platform.machine().lower()
    if sys.platform.startswith("linux"):
        osname = "linux"
    elif sys.platform == "darwin":
        osname = "osx"
    elif sys.platform == "win32":
        osname = "win"
    else:
        osname = sys.platform
    arch = {"x86_64": "64", "amd64": "64", "aarch64": "aarch64", "i686": "32", "i386": "32"}.get(machine, machine)
    if osname in ("osx", "win") and arch in ("arm64", "aarch64"):
        arch = "arm64"
    return f"{osname}-{arch}"


def _selectors_for(platform):
    """The [target.*] names that apply to platform, least specific first."""
    osname = platform.split("-", 1)[0]
    out = []
    if osname in ("linux", "osx"):
        out.append("unix")
    if osname in SELECTORS:
        out.append(osname)
    return out + [platform]


def _version_spec(r, keypath, v):
    v = v.strip()
    if v in ("", "*"):
        return ""
    if re.match(r"\d", v):          # a bare version means exactly that version
        v = "==" + v
    if not re.match(r"(===|==|!=|~=|<=|>=|<|>)", v):
        r.error(f"{'.'.join(_q(k) for k in keypath)}: {v!r} is not a version specifier "
                "(like \"<2\", \">=1.2,<2\", \"==1.26.4\" or \"*\")", *keypath)
    return v.replace(" ", "")


# --- older comfy-env dialects (docs/comfy-env-dialects.md) ---

# comfy-env 0.0.13-0.0.65 ("D1"): an environment is a table named for it
# ([geometrypack] python = ..., with .packages / .cuda / .conda / .env
# sub-tables), or [env] + [packages]; these keys mark such a table.
_D1_ENV_KEYS = ("python", "cuda", "pytorch", "cuda_version", "pytorch_version")
# Top-level names of the current shape and of D1 that are not environments.
_D1_RESERVED = {"env", "packages", "local", "node_reqs", "system", "tools", "sources", "wheel_sources",
                "variables", "worker", "cuda", "apt", "brew", "env_vars", "options", "settings", "bulkhead",
                "target", "workspace", "dependencies", "pypi-dependencies", "pypi-options", "activation",
                "tasks", "system-requirements", "feature", "environments", "types", "node_packs"}
_OS_NAME = {"linux": "linux", "darwin": "darwin", "win32": "windows"}
# Keys that carry what the environment holds: a misspelling of one is an
# error (the environment would silently lack it), of anything else a warning.
_CARRIERS = ("requirements", "pypi-dependencies", "dependencies", "cuda", "python", "packages")
_KNOWN_TOP = ("python", "requirements", "env_vars", "pypi-dependencies", "bulkhead", "dependencies", "cuda",
              "workspace", "target", "apt", "brew", "node_reqs", "node_packs", "options", "types")


def _closest(word, choices):
    """The one of ``choices`` ``word`` is a likely misspelling of, or None."""
    import difflib  # lazy: ComfyUI start (only a misspelled key)
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return close[0] if close else None


def _hint(close):
    return f" (did you mean {close!r}?)" if close else ""


def did_you_mean(word, choices):
    """' (did you mean 'x'?)' for the closest of ``choices``, or ''."""
    return _hint(_closest(word, choices))


def _d1_cuda(r, table, keypath):
    """A D1 ``[cuda]``-like table of ``package = "version"`` ("*" or "":
    any): [``name`` or ``name==version``]."""
    out = []
    for name, v in table.items():
        if not isinstance(v, str):
            r.type_error(keypath + (name,), 'a version string ("*": any)', v)
        v = v.strip().lstrip("=")
        out.append(name if v in ("", "*") else f"{name}=={v}")
    return out


def _d1_expander(r, data):
    """comfy-env 0.0.13-0.0.65's ``{var}`` substitution in requirement
    strings (``torch-scatter==2.1.2+pt{pytorch_mm}cu{cuda_short}``), as
    that release's simple shape did it: ``[variables]`` (popped: read here)
    first, then ``cuda_version`` ("12.8"), ``cuda_short`` ("128"),
    ``pytorch_version`` ("2.8.0"), ``pytorch_short`` ("280") and
    ``pytorch_mm`` ("28"), each ``{name}`` replaced by plain text.  The
    release took torch and CUDA from what it installed; here they are the
    host's (``cudawheels.host_torch``), which the environment gets.
    Returns ``expand(requirement, keypath)``, which raises a
    PackConfigError at the key's line for a ``{name}`` left with no value."""
    table = data.pop("variables", None) if isinstance(data.get("variables"), dict) else None
    variables = {k: str(v) for k, v in (table or {}).items()}
    tv, read = None, False

    def expand(req, keypath):
        nonlocal tv, read
        if "{" not in req:
            return req
        if not read:        # the host's torch, read once and only for a file that has a {var}
            from .cudawheels import host_torch  # lazy: ComfyUI start (urllib.request; only for a {var})
            (tv, cv), read = host_torch(), True
            if cv:
                cuda = ".".join(cv.split(".")[:2])
                variables.setdefault("cuda_version", cuda)
                variables.setdefault("cuda_short", cuda.replace(".", ""))
            if tv:
                tv = tv.split("+", 1)[0]
                variables.setdefault("pytorch_version", tv)
                variables.setdefault("pytorch_short", tv.replace(".", ""))
                variables.setdefault("pytorch_mm", "".join(tv.split(".")[:2]))
        for k, v in variables.items():
            req = req.replace("{" + k + "}", v)
        left = re.search(r"\{(\w+)\}", req)
        if left:
            why = ("the host's torch has no CUDA" if left.group(1).startswith("cuda") and tv else
                   f"the host ({sys.executable}) has no torch" if not tv else "it is no variable comfy-env 0.0.x set")
            r.error(f"{req!r} names {{{left.group(1)}}}, which comfy-env 0.0.x expanded, and it has no value here "
                    f"({why}; known: {', '.join(sorted(variables)) or 'none'}); set it under [variables] or write "
                    "the version out", *keypath)
        return req
    return expand


def _d1_strings(r, table, keypath, key):
    """``table[key]``, an array of requirement strings ([] when absent)."""
    v = table.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        r.type_error(keypath + (key,), "an array of pip requirement strings", v)
    return list(v)


def _d1_requirements(r, table, keypath, note, no_deps=None):
    """D1 ``packages``: ``requirements = [...]``, or a bare array, returned.
    Its ``no_deps = [...]`` goes into ``no_deps`` (a list) where the shape
    read it -- the simple shape's ``[packages]``, whose release installed
    those with ``--no-deps`` --; elsewhere (``no_deps`` None: an
    environment table's, an OS's sub-table) that release did not read it,
    and a note says so."""
    if isinstance(table, list):
        return list(table)
    if not isinstance(table, dict):
        r.type_error(keypath, "a table with requirements = [...]", table)
    nd = _d1_strings(r, table, keypath, "no_deps")
    if no_deps is not None:
        no_deps += nd
    elif nd:
        where = ".".join(keypath)
        note(f"[{where}] no_deps is not read, as comfy-env 0.0.x read no_deps only in the simple shape ([env] + "
             f"[packages]): the environment does not get {', '.join(nd)}; list {'them' if len(nd) > 1 else 'it'} "
             "under requirements to install it with its dependencies", *keypath, "no_deps")
    return _d1_strings(r, table, keypath, "requirements")


def _d1_literal_vars(r, reqs, keypath):
    """An error for a ``{var}`` in an environment table's requirement: the
    release that read that shape did not expand it and handed it to pip
    as written, which refused it (no environment was made)."""
    for req in reqs:
        m = re.search(r"\{(\w+)\}", req) if isinstance(req, str) else None
        if m is None:
            continue
        try:        # what the simple shape would have made of it, for the fix
            here = _d1_expander(r, {})(req, keypath)
        except PackConfigError:
            here = None
        r.error(f"{req!r} names {{{m.group(1)}}}: comfy-env 0.0.x expanded {{var}}s only in the simple shape "
                "([env] + [packages], cuda = [...]); in an environment table it handed the text to pip as "
                "written, which refused it, and no environment was made. Write the version out"
                + (f" (on this host: {here!r})" if here else "") + " or move the requirements to the simple "
                "shape", *keypath)


def _older_dialects(data, r, notes):
    """Rewrites the config shapes of older comfy-env releases into the
    current one, each with the meaning its own release gave it (see
    docs/comfy-env-dialects.md): the D1 environment tables, ``[cuda]``
    as ``package = "version"``, a top-level ``cuda = [...]``,
    ``[system]``, a number for ``python``.  Returns the new mapping; what
    has no meaning here is left for the warnings below.  The simple
    shape's ``no_deps`` requirements are in its ``requirements`` and,
    under the key ``_NO_DEPS``, apart (``load`` takes them)."""
    data = dict(data)
    path, text = r.path, r.text

    def note(msg, *keypath):
        line = _find_line(text, *keypath)
        notes.append(f"{path}:{line}: {msg}" if line else f"{path}: {msg}")

    named = [k for k, v in data.items() if k not in _D1_RESERVED and isinstance(v, dict)
             and any(x in v for x in _D1_ENV_KEYS)]
    if len(named) > 1:
        r.error(f"tables {', '.join(f'[{n}]' for n in named)} each declare an environment (comfy-env 0.0.x's "
                "shape); bulkhead runs one environment per comfy-env.toml: keep one here and move each other "
                f"to nodes/<subdir>/{CONFIG_NAME} of the nodes it serves", named[1])
    env = dict(data.pop(named[0])) if named else None
    where = named[0] if named else None
    # 0.0.13-0.0.65's simple shape (no [<env>] table, no [local]): [env]
    # and a top-level packages, each optional; it expanded {var}s in its
    # requirement strings, which its other shapes did not.
    simple = not named and "local" not in data
    expand = _d1_expander(r, data) if simple else None
    if env is None and (isinstance(data.get("env"), dict) or (simple and "packages" in data)):
        env = dict(data.pop("env")) if isinstance(data.get("env"), dict) else {}
        where = "env"
        if "packages" in data:
            packages = data.pop("packages")
            # That shape's reader took [cuda] (or cuda = [...]) instead of
            # packages when the file had both: packages was not installed.
            if data.get("cuda") and simple:
                note("[packages] is not read beside [cuda] (or cuda = [...]), as comfy-env 0.0.x read this "
                     "shape: move its requirements into [cuda] or requirements = [...] to install them",
                     "packages")
            elif isinstance(packages, list) and simple:
                # packages = [...]: its CUDA packages, as cuda = [...] (that release read both alike)
                data["cuda"] = packages
            else:
                env["packages"] = packages
    if env is not None:
        _d1_environment(data, r, note, env, where, expand)
    local = data.pop("local", None)
    if local is not None:
        data["local"] = _d1_local(r, local)
    system = data.pop("system", None)
    if isinstance(system, dict):
        for osname, table in (("linux", "apt"), ("darwin", "brew")):
            if osname in system:
                data[table] = {"packages": system[osname]}
    _older_cuda(data, r, note, expand)
    py = data.get("python")
    if isinstance(py, (int, float)) and not isinstance(py, bool):
        # comfy-env 0.0.66-0.4.13 took str(): 3.11 -> "3.11".  But TOML reads 3.10 as 3.1.
        if str(py) in ("3.1", "3.2", "3.3"):
            r.error(f"python = {py!r}: a TOML number, which reads 3.10 as {py!r}; write the version as a "
                    'string: python = "3.10"', "python")
        data["python"] = str(py)
    return data


# The key under which _older_dialects hands load the simple shape's
# no_deps requirements: no TOML key (an object), so no file can set it.
_NO_DEPS = object()


def _d1_local(r, local):
    """comfy-env 0.0.13-0.0.65's ``[local]``: ``[local.cuda]`` as
    ``package = "version"`` and ``[local.packages]`` (``requirements =
    [...]`` or an array), which that release installed into ComfyUI's own
    Python: {"cuda": [...], "packages": [...]} of requirement strings
    (PackConfig ``local_cuda``, and with the packages ``local``)."""
    if not isinstance(local, dict):
        r.type_error(("local",), "a table with cuda and packages", local)
    out = []
    cu = local.get("cuda", {})
    if isinstance(cu, dict):
        out += _d1_cuda(r, cu, ("local", "cuda"))
    pk = local.get("packages", {})
    reqs = pk.get("requirements", []) if isinstance(pk, dict) else pk
    if not isinstance(reqs, list) or not all(isinstance(x, str) for x in reqs):
        r.type_error(("local", "packages"), "an array of pip requirement strings", reqs)
    for req in reqs:
        if not req.strip() or req.strip().startswith("-") or "\n" in req:
            r.error(f"[local.packages] {req!r}: only requirement strings are accepted", "local", "packages")
    return {"cuda": out, "packages": [_norm_req(q) for q in reqs]}


def _read_local(d, key, local):
    d.local = tuple(local["cuda"] + local["packages"])
    d.local_cuda = tuple(local["cuda"])


def _d1_environment(data, r, note, env, where, expand):
    """comfy-env 0.0.13-0.0.65's environment table ``env`` (``[<name>]``
    or ``[env]``, named ``where``) moved into ``data``'s current keys:
    its packages into requirements (and [cuda]), python, conda into
    [dependencies] and [workspace] channels, env into [env_vars]; torch's
    and CUDA's versions are noted (the host's are used)."""
    reqs = list(data.get("requirements", []) or [])
    ours = len(reqs)
    # The simple shape's packages is a top-level table ([env] holds no
    # packages); its no_deps was read there alone.
    pre = ("packages",) if where == "env" else (where, "packages")
    no_deps = [] if where == "env" else None
    if "packages" in env:
        reqs += _d1_packages(data, r, note, env.pop("packages"), pre, no_deps)
    if expand is not None:
        reqs[ours:] = [expand(q, pre + ("requirements",)) for q in reqs[ours:]]
        no_deps = [expand(q, pre + ("no_deps",)) for q in no_deps or []]
    else:
        _d1_literal_vars(r, reqs[ours:], pre + ("requirements",))
    # A no_deps entry also among the requirements is installed with its
    # dependencies (that release installed it so, after the no_deps run).
    no_deps = [q for q in no_deps or [] if q not in reqs]
    if no_deps:
        data[_NO_DEPS] = no_deps
    reqs += no_deps
    if reqs:
        data["requirements"] = reqs
    cu = env.pop("cuda", None)
    if isinstance(cu, dict):
        data.setdefault("cuda", {"packages": []})
        data["cuda"]["packages"] = list(data["cuda"].get("packages", [])) + _d1_cuda(r, cu, (where, "cuda"))
    elif cu is not None:
        note(f"[{where}] cuda = {cu!r}: the CUDA build is the host's torch's (bulkhead matches it)",
             where, "cuda")
    for k in ("cuda_version", "pytorch", "pytorch_version"):
        if k in env:
            note(f"[{where}] {k} = {env.pop(k)!r}: torch and its CUDA build are the host's (bulkhead "
                 "matches them), not chosen here", where, k)
    if "python" in env:
        data["python"] = env.pop("python")
    conda = env.pop("conda", None)
    if conda is not None:
        _d1_conda(data, r, conda, where)
    ev = env.pop("env", None)
    if ev is not None:
        data["env_vars"] = dict(data.get("env_vars", {}) or {}, **(ev if isinstance(ev, dict) else {}))
    env.pop("isolated", None)
    env.pop("name", None)
    for k in env:
        note(f"[{where}] {k} is not read by bulkhead and has no effect", where, k)


def _d1_packages(data, r, note, pk, pre, no_deps):
    """A D1 environment's ``packages`` (at key path ``pre``): its
    requirements (this OS's sub-table's too) returned, its ``no_deps``
    into ``no_deps`` where the shape read them (``_d1_requirements``);
    its ``package = "version"`` entries, CUDA wheels as comfy-env 0.0.x
    read them, added to ``data``'s [cuda] -- in the simple shape only
    where the table has none of requirements, no_deps and
    requirements_file, as that release read them."""
    reqs = []
    where = ".".join(pre)
    if isinstance(pk, dict):
        here = _OS_NAME.get(sys.platform, sys.platform)
        for osname in ("windows", "linux", "darwin"):
            sub = pk.pop(osname, None)
            if sub is not None and osname == here:
                reqs += _d1_requirements(r, sub, pre + (osname,), note)
        listed = [k for k in ("requirements", "no_deps", "requirements_file") if k in pk]
        if "requirements_file" in pk:
            note(f"[{where}] requirements_file is not read: list its requirements under "
                 "requirements", *pre)
            pk.pop("requirements_file")
        plain = {k: v for k, v in pk.items() if k not in ("requirements", "no_deps")}
        if plain and no_deps is not None and listed:
            note(f"[{where}] {', '.join(plain)}: not read beside {', '.join(listed)}, as comfy-env 0.0.x read "
                 f"this shape (package = \"version\" entries were its CUDA wheels only in a [packages] without "
                 "them): move them to [cuda] to install them", *pre, next(iter(plain)))
        elif plain:     # package = "version": CUDA wheels, as comfy-env 0.0.x read them
            data.setdefault("cuda", {"packages": []})
            data["cuda"]["packages"] = list(data["cuda"].get("packages", [])) + _d1_cuda(r, plain, pre)
    return reqs + _d1_requirements(r, {k: v for k, v in pk.items() if k in ("requirements", "no_deps")}
                                   if isinstance(pk, dict) else pk, pre, note, no_deps)


def _d1_conda(data, r, conda, where):
    """A D1 environment's ``conda`` table (``channels``, ``packages`` as
    match specs) into ``data``'s [dependencies] and [workspace] channels."""
    if not isinstance(conda, dict):
        r.type_error((where, "conda"), "a table with channels and packages", conda)
    specs = conda.get("packages", [])
    if not isinstance(specs, list) or not all(isinstance(x, str) for x in specs):
        r.type_error((where, "conda", "packages"), "an array of conda package specs", specs)
    deps = dict(data.get("dependencies", {}) or {})
    for spec in specs:
        m = _REQ_NAME.match(spec)
        if not m:
            r.error(f"[{where}.conda] packages: {spec!r} is not a conda package spec", where, "conda")
        deps[m.group(1)] = m.group(2).strip() or "*"
    data["dependencies"] = deps
    if conda.get("channels"):
        data["workspace"] = dict(data.get("workspace", {}) or {}, channels=conda["channels"])


def _older_cuda(data, r, note, expand):
    """``[cuda]`` in comfy-env 0.0.x's shapes (a top-level array, or
    ``package = "version"`` keys) as ``packages = [...]``; a key that
    is neither is a typo, noted and left out."""
    cu = data.get("cuda")
    if isinstance(cu, list):            # comfy-env 0.0.x: cuda = ["pkg==1.0", ...]
        data["cuda"] = {"packages": [expand(x, ("cuda",)) if expand and isinstance(x, str) else x for x in cu]}
    elif isinstance(cu, dict):
        extra = {k: v for k, v in cu.items() if k != "packages"}
        # A key that is no package = "version" (0.0.x's form), or that reads
        # as a misspelling of packages, is a typo: comfy-env 0.3-0.4 warned
        # about it and built the rest, and so does bulkhead.
        typos = [k for k, v in extra.items() if not isinstance(v, str) or _closest(k, ["packages"])]
        for k in typos:
            note(f"[cuda] unknown key {k!r}{did_you_mean(k, ['packages'])}: ignored, as comfy-env ignores it; "
                 "the environment gets no CUDA wheel from it. [cuda] takes packages = [...] (or, as comfy-env "
                 "0.0.x, package = \"version\")", "cuda", k)
        if extra:
            data["cuda"] = {"packages": list(cu.get("packages", []) if isinstance(cu.get("packages"), list)
                                             else [cu["packages"]] if "packages" in cu else [])
                            + _d1_cuda(r, {k: v for k, v in extra.items() if k not in typos}, ("cuda",))}


def load(path, root=None, *, warn=True):
    """Reads one ``comfy-env.toml`` into a ``PackConfig``.  ``root`` is the
    pack's root (inferred from where the file lies when None).  Each
    warning is also issued as a ``PackConfigWarning`` when ``warn`` is true
    (Python's warning filter shows each one once per process).  Raises
    ``PackConfigError``; ``OSError`` when the file cannot be read."""
    path = os.path.abspath(os.fspath(path))
    root = os.path.abspath(os.fspath(root)) if root is not None else _pack_root(path)
    text = _read_text(path)
    r = Reader(path, text)
    d = _Doc(r)
    data = _older_dialects(toml_loads(text, path), r, d.notes)
    d.no_deps = tuple(sorted({_norm_req(q) for q in data.pop(_NO_DEPS, ())}))
    for key, read in _READERS.items():
        if key in data:
            read(d, key, data[key])
    _note_unread(d, data)
    if warn:
        for n in d.notes:
            warn_note(n, path)
    return d.config(root)


def _read_text(path):
    """The config file's text; a PackConfigError at the first line that is
    not UTF-8."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise PackConfigError(path, "not UTF-8 text (TOML files must be UTF-8)", line) from None


class _Doc:
    """What ``load`` has read of one config so far: each key reader of
    ``_READERS`` adds to it, and ``config`` makes the ``PackConfig``."""

    def __init__(self, r):
        self.r = r
        self.path = r.path
        self.text = r.text
        self.notes = []
        self.platform = current_platform()
        self.python = None
        self.env_vars = {}
        self.pypi = {}              # {normalised name: (requirement, index or None)}
        self.conda = {}             # {name: match spec}
        self.system = {}
        self.cuda = ()
        self.local = ()
        self.local_cuda = ()
        self.no_deps = ()
        self.channels = ()
        self.requirements = []      # the requirements array's, normalised
        self.options = {}

    def config(self, root):
        """The ``PackConfig`` of what was read, with its hash."""
        reqs = [req for req, _ in self.pypi.values()] + self.requirements
        requirements = tuple(sorted(set(reqs)))
        by_index = {}
        for req, index in self.pypi.values():
            if index:
                by_index.setdefault(index, []).append(req)
        indexes = tuple((i, tuple(sorted(rs))) for i, rs in sorted(by_index.items()))
        # python in [dependencies] is the interpreter: the venv's, pinned in the solve (envs/conda.py)
        conda = dict(self.conda)
        conda.pop("python", None)
        channels = self.channels
        if conda and not channels:
            channels = ("conda-forge",)     # pixi's default, which comfy-env writes
        digest = hashlib.sha256(json.dumps({
            "format": HASH_FORMAT,
            "protocol": _native.PROTOCOL_VERSION,
            "python": self.python,
            "requirements": list(requirements),
            **({"indexes": [[i, list(rs)] for i, rs in indexes]} if indexes else {}),
            **({"conda": sorted(conda.values()), "channels": list(channels)} if conda else {}),
            **({"cuda": list(self.cuda)} if self.cuda else {}),
            **({"no_deps": list(self.no_deps)} if self.no_deps else {}),
        }, sort_keys=True).encode()).hexdigest()
        return PackConfig(
            path=self.path, root=root, name=pack_name(self.path, root), python=self.python,
            env_vars=types.MappingProxyType(self.env_vars), requirements=requirements,
            options=types.MappingProxyType(self.options), warnings=tuple(self.notes), config_hash=digest,
            indexes=indexes, system_packages=types.MappingProxyType(self.system), platform=self.platform,
            conda=tuple(sorted(conda.values())), channels=channels if conda else (), cuda=self.cuda,
            local=self.local, no_deps=self.no_deps, local_cuda=self.local_cuda)


# --- the key readers: one per top-level key load reads, each reader(doc, key, value) ---

def _read_python(d, key, python):
    r = d.r
    if not isinstance(python, str):
        r.type_error(("python",), 'a string (a version like "3.12" or an interpreter path)', python)
    python = python.strip()
    if re.fullmatch(r"(==?)?\s*\d+(\.\d+)*(\.\*)?", python):  # "3.11.*", "==3.11", "=3.11": conda's spellings
        python = python.lstrip("=").strip().rstrip("*").rstrip(".")
    if "/" in python or (python.startswith("~") and not python.startswith("~=")):
        p = os.path.expanduser(python)
        if not os.path.isabs(p):
            p = os.path.join(os.path.dirname(d.path), p)
        python = os.path.normpath(p)
    elif is_specifier(python):
        python = _read_specifier(r, python)
    else:
        m = _PY_VERSION.match(python)
        if not m:
            r.error(f'python = {python!r}: expected a version like "3.12" or "3.12.1", a specifier like '
                    '">=3.10", or a path to an interpreter', "python")
        if (int(m.group(1)), int(m.group(2))) < MIN_PYTHON:
            r.error(f"python = {python!r}: a bulkhead worker needs Python "
                    f"{'.'.join(map(str, MIN_PYTHON))} or newer", "python")
    d.python = python


def _read_env_vars(d, key, ev):
    r = d.r
    if not isinstance(ev, dict):
        r.type_error(("env_vars",), "a table of NAME = \"value\"", ev)
    for k, v in ev.items():
        if not _ENV_NAME.match(k):
            r.error(f"[env_vars] {k!r} is not a valid environment variable name", "env_vars", k)
        if k.startswith(spec.PREFIX) or k in ("PYTHONHOME", "PYTHONNOUSERSITE"):
            r.error(f"[env_vars] {k} is set by bulkhead itself and cannot be set here", "env_vars", k)
        if isinstance(v, (list, dict)):
            r.error(f"env_vars.{_q(k)} must be a string, not {_toml_type(v)} ({v!r}); any TOML scalar "
                    "(string, number, boolean, date) is taken and turned into text, as comfy-env does",
                    "env_vars", k)
        d.env_vars[k] = str(v)     # as comfy-env: 3 -> "3", true -> "True", 0.5 -> "0.5"


def _read_pypi_dependencies(d, key, deps):
    d.pypi = _read_pypi(d.r, deps, (key,))


def _read_dependencies(d, key, deps):
    d.conda = _check_conda(d.r, deps, (key,))


def _read_target(d, key, tgt):
    """``[target.<platform>]``: this machine's tables applied over the
    top level's (the more specific wins), every other one checked."""
    r = d.r
    if not isinstance(tgt, dict):
        r.type_error(("target",), "a table of [target.<platform>] tables", tgt)
    applies = _selectors_for(d.platform)
    for plat in sorted(tgt, key=lambda p: applies.index(p) if p in applies else -1):
        body = tgt[plat]
        if plat not in PLATFORMS and plat not in SELECTORS:
            r.error(f"[target.{plat}]: unknown platform {plat!r}; pixi's platforms are "
                    f"{', '.join(PLATFORMS)} (and the selectors {', '.join(SELECTORS)})", "target", plat)
        if not isinstance(body, dict):
            r.type_error(("target", plat), "a table", body)
        here = plat in applies
        for sub, v in body.items():
            kp = ("target", plat, sub)
            if sub == "pypi-dependencies":
                got = _read_pypi(r, v, kp)
                if here:
                    d.pypi.update(got)    # the more specific target wins over the top level
            elif sub == "dependencies":
                got = _check_conda(r, v, kp)
                if here:
                    d.conda.update(got)   # the more specific target wins
            elif here:
                line = _find_line(d.text, *kp)
                d.notes.append(f"{d.path}:{line}: table [target.{plat}.{sub}] is not implemented by bulkhead: "
                               + _UNIMPLEMENTED.get(sub, "nothing in it is read").replace("{pixi}", ""))


def _read_system(d, key, value):
    d.system[key] = check_packages(d.r, key, value, allow_scalar=True)


def _read_cuda(d, key, value):
    cuda = check_packages(d.r, "cuda", value, allow_scalar=True)
    # comfy-env before 0.3.0 read torch and its family there as "the
    # CUDA build of torch", matched to the machine (packs in the field
    # still list them); 0.3.0 and later refuse them.  The environment
    # has the host's torch either way: read, with one note.
    family = [n for n in cuda if _norm_name(n.partition("==")[0]) in ("torch", "torchvision", "torchaudio")]
    if family:
        cuda = tuple(n for n in cuda if n not in family)
        line = _find_line(d.text, "cuda", "packages")
        d.notes.append(f"{d.path}:{line}: [cuda] packages lists {', '.join(family)}: the environment gets the "
                       "host's torch and its family, as every other environment does (comfy-env before 0.3.0 "
                       "matched them to the machine's CUDA; later releases refuse them there), not a wheel "
                       "from the CUDA index")
    d.cuda = cuda


def _read_workspace(d, key, ws):
    r = d.r
    if not isinstance(ws, dict):
        r.type_error(("workspace",), "a table", ws)
    ch = ws.get("channels", [])
    if not isinstance(ch, list) or not all(isinstance(c, str) or (isinstance(c, dict) and
                                                                  isinstance(c.get("channel"), str))
                                           for c in ch):
        r.type_error(("workspace", "channels"), 'an array of channel names or URLs', ch)
    d.channels = tuple(_channel_name(c if isinstance(c, str) else c["channel"], d.path) for c in ch)
    for k in ws:
        if k not in ("channels", "name", "platforms", "version", "description", "authors"):
            line = _find_line(d.text, "workspace", k)
            d.notes.append(f"{d.path}:{line}: [workspace] {k} is not read by bulkhead and has no effect")


def _read_requirements(d, key, rl):
    r = d.r
    if not isinstance(rl, list):
        r.type_error(("requirements",), "an array of pip requirement strings", rl)
    for i, req in enumerate(rl):
        if not isinstance(req, str):
            r.type_error(("requirements",), f"an array of strings (item {i})", req)
        if not req.strip():
            r.error(f"requirements item {i} is empty", "requirements")
        if req.strip().startswith("-") or "\n" in req:
            r.error(f"requirements item {i} ({req!r}): only requirement strings are accepted, not pip "
                    "options (pass index options through BULKHEAD_PIP_ARGS)", "requirements")
        d.requirements.append(_norm_req(req))


def _read_bulkhead(d, key, bh):
    """``[bulkhead]``: each key's row of channel/spec.py (``lookupConfig``'s
    part) and the reader of its kind (``_OPTION_READERS``); an unknown key
    is a note, its default kept."""
    if not isinstance(bh, dict):
        d.r.type_error(("bulkhead",), "a table", bh)
    for k, v in bh.items():
        o = spec.BY_NAME.get(k)
        read = _OPTION_READERS.get(o.kind) if o is not None else None
        if read is None:
            # A tuning key: its default is kept, and so is the isolation.
            known = list(OPTIONS) + list(CHOICES) + list(FLAGS) + list(PATH_LISTS)
            line = _find_line(d.text, "bulkhead", k)
            d.notes.append(f"{d.path}:{line}: [bulkhead] unknown key {k!r}{did_you_mean(k, known)}: ignored, "
                           f"its default kept; known keys: {', '.join(known)}")
            continue
        d.options[k] = read(d.r, o, v)


# The [bulkhead] readers, one per kind of row: reader(Reader, row, value)
# -> the value the record holds, or a PackConfigError at the key's line.

def _read_choice(r, o, v):
    if not isinstance(v, str) or v not in o.choices:
        r.error(f"[bulkhead] {o.name} = {v!r}: must be one of {', '.join(map(repr, o.choices))} ({o.what})",
                "bulkhead", o.name)
    return v


def _read_flag(r, o, v):
    if not isinstance(v, bool):
        r.type_error(("bulkhead", o.name), f"true or false ({o.what})", v)
    return v


def _read_paths(r, o, v):
    if not isinstance(v, list) or not all(isinstance(p, str) and p for p in v):
        r.type_error(("bulkhead", o.name), f"an array of paths ({o.what})", v)
    return tuple(v)


def _read_seconds(r, o, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        r.type_error(("bulkhead", o.name), "a number of seconds", v)
    if v < o.low or (v == o.low and not o.low_ok) or v != v:
        r.error(f"[bulkhead] {o.name} = {v!r}: must be {'>=' if o.low_ok else '>'} {o.low:g} ({o.what})",
                "bulkhead", o.name)
    return float(v)


_OPTION_READERS = {"choice": _read_choice, "flag": _read_flag, "paths": _read_paths, "seconds": _read_seconds}

# What load reads of a config: top-level key -> its reader, called in this
# order for each key the file has (so of two faults the same one is named
# first every time; [target] after the top-level tables it applies over).
_READERS = {
    "python": _read_python,
    "env_vars": _read_env_vars,
    "pypi-dependencies": _read_pypi_dependencies,
    "dependencies": _read_dependencies,
    "target": _read_target,
    "apt": _read_system,
    "brew": _read_system,
    "cuda": _read_cuda,
    "workspace": _read_workspace,
    "requirements": _read_requirements,
    "bulkhead": _read_bulkhead,
    "local": _read_local,
}
# Keys read and noted all the same: their packages are checked, never installed.
_NOTED = ("apt", "brew")


def _note_unread(d, data):
    """A note for each top-level key no reader takes (an error for a
    likely misspelling of one that carries what the environment holds)."""
    path = d.path
    for k, v in data.items():
        if k in _READERS and k not in _NOTED:
            continue
        line = _find_line(d.text, k)
        loc = f"{path}:{line}" if line else path
        if isinstance(v, dict) or (isinstance(v, list) and v and all(isinstance(e, dict) for e in v)):
            close = None if k in _UNIMPLEMENTED else _closest(k, _KNOWN_TOP)
            if close in _CARRIERS:
                raise PackConfigError(path, f"unknown table [{k}]{_hint(close)}: the environment would be built "
                                            "without what it lists; correct the table's name", line, key=k)
            why = _UNIMPLEMENTED.get(k, "nothing in it is read")
            if "{pixi}" in why:
                why = why.format(pixi="; pixi is on this machine, but bulkhead does not drive it"
                                 if shutil.which("pixi") else " and pixi is not on this machine")
            d.notes.append(f"{loc}: table [{k}] is not implemented by bulkhead: {why}")
        else:
            close = _closest(k, _KNOWN_TOP)
            if close in _CARRIERS:
                raise PackConfigError(path, f"unknown key {k!r}{_hint(close)}: the environment would be built without "
                                            "what it lists; correct the key", line, key=k)
            d.notes.append(f"{loc}: key {k!r} is not read by bulkhead and has no effect{_hint(close)}")


def key_where(path, *keypath):
    """``path:line`` of a key of a config file (``path`` alone when the
    line is not found or the file cannot be read), for errors raised after
    the file was read (the interpreter a python request names)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = _find_line(f.read(), *keypath)
    except (OSError, UnicodeDecodeError):
        line = None
    return f"{path}:{line}" if line else str(path)


def is_specifier(python):
    """Whether a config's ``python`` request is a version specifier
    (">=3.10", "~=3.11", "!=3.12.*,>=3.10") rather than a version or a path."""
    return bool(python) and python.lstrip()[:1] in ("<", ">", "=", "!", "~")


def specifier_set(spec):
    """packaging's ``SpecifierSet`` of ``spec``; raises ``ValueError`` when
    it is not one (packaging's, else pip's copy: bulkhead has no Python
    dependencies)."""
    return SpecifierSet(spec)


def python_admits(request, version):
    """Whether Python ``version`` ("3.11.7") is what a config's ``python``
    request ("3.11", "3.11.7", ">=3.10") asks for (a path: always)."""
    if not request or os.path.isabs(request):
        return True
    if is_specifier(request):
        return specifier_set(request).contains(version, prereleases=True)
    want = request.split(".")
    return version.split(".")[:len(want)] == want


def _read_specifier(r, python):
    """A PEP 440 ``python`` specifier, in packaging's normal form.  conda's
    ">=3.10.*" (what comfy-env made of a request, which pixi read as
    ">=3.10") is taken as ">=3.10"."""
    spec = ",".join(re.sub(r"^\s*(>=|<=|>|<|~=)\s*(\d[\d.]*?)\.\*\s*$", r"\1\2", part)
                    for part in python.split(","))
    try:
        out = specifier_set(spec)
    except ValueError as e:
        r.error(f"python = {python!r} is not a PEP 440 version specifier ({e}); write one like \">=3.10\" or "
                '">=3.10,<3.13", or a version like "3.12"', "python")
    versions = [f"3.{minor}.{patch}" for minor in range(MIN_PYTHON[1], 40) for patch in (0, 99)]
    if not any(out.contains(v, prereleases=True) for v in versions + ["3.999.0", "4.0.0"]):
        r.error(f"python = {python!r} admits no Python {'.'.join(map(str, MIN_PYTHON))} or newer, and a bulkhead "
                "worker needs one; widen the specifier", "python")
    return str(out)


def _channel_name(c, path):
    """A [workspace] channel as rattler takes it: a name (conda-forge), a
    URL, or a local directory (absolute, or relative to the config) as a
    file:// URL."""
    c = c.strip()
    if c.startswith(("/", "./", "../", "~")):
        p = os.path.expanduser(c)
        if not os.path.isabs(p):
            p = os.path.join(os.path.dirname(path), p)
        return "file://" + os.path.normpath(p)
    return c
