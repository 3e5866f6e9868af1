"""What a pack environment gets from the host, matched to the host.

A worker imports the host's ComfyUI (``comfy``, ``comfy_api``,
``server``), and tensors cross between the host and its workers, so a
worker must see what an in-process pack sees: every environment holds,
beside the pack's own requirements:

- torch at the host's exact version and build, with its dependencies;
- comfy-aimdo and comfy-kitchen at the host's versions (where installed);
- every requirement of the host ComfyUI's ``requirements.txt`` that the
  host has installed (markers evaluated for the host), with their
  dependencies: numpy, Pillow, aiohttp, av, transformers, ...

"The host" is the Python running this module: ComfyUI's, or the one
``bulkhead install`` runs in (BULKHEAD_PYTHON).  Its installed
distributions (``importlib.metadata``) are the source of truth, read
once per process while sys.path and its directories are unchanged
(``_host``: the builds in ComfyUI's process share one GIL); a
requirement the host does not have installed is left out with a note.

How they get there depends on the environment's interpreter.  Of the
host's own minor version: shared read-only, never copied -- a symlink farm
(``<workspace>/host/<hash12>/``, outside every environment, so pip in an
environment never uninstalls through it) holds links to exactly those
distributions' files (their RECORDs; a directory another host
distribution also has files in is made real and linked one level down),
and one ``bulkhead-host.pth`` in the environment's site-packages names the
farm (with uv as the installer, which does not read a .pth, each shared
distribution also gets a metadata-only marker there: ``write_markers``).
The host's whole site-packages is never on a worker's path.  Of another
minor: installed with pip at the host's versions
(``torch==2.13.0+cpu``, ...), before the pack's requirements, less what
only ComfyUI's server uses (SERVER_ONLY: its web assets); a local
build (``+cpu``, ``+cu128``) is looked for where it came from
(``local_sources``).  A host's version that does not exist for that minor
(numpy 2.4 under 3.10: its Requires-Python says >=3.11; or, found at
install, one pip cannot install there alone) is resolved for it instead:
the bare name, the version the resolver picks for that minor among the
host's other versions, said in the build log and kept in the stamp
(``resolved``) -- the host's version where it exists, the nearest one
that runs where it does not.  Only torch, the host's other ALWAYS
distributions and local builds are held to the host's exact version
(one torch across the host and its workers).  What no index reachable has
for that minor at any version is left out with one warning naming it
(envs/build.py): a pack that never imports torch keeps its isolation.

A pack that pins a torch the host's does not satisfy is refused by name; a
pack's pin of anything else that the host's version does not satisfy wins
(that distribution is left out of the host's set) and is reported.

The stamp records ``fingerprint()`` (the host's torch version and CUDA
build, comfy-aimdo, comfy-kitchen, the sha256 of ComfyUI's
requirements.txt); ``stale_reason`` compares it with the host now, so an
upgraded host marks its environments stale with the command that rebuilds
them.  A config's ``[bulkhead] host_packages = "none"`` opts out (a pack
that never imports comfy or torch, e.g. under a Python the host's torch
has no build for).
"""

from __future__ import annotations

import ast
import csv
import shutil
import dataclasses
import hashlib
import importlib.metadata as metadata
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Dict, List, Tuple

try:
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:     # bulkhead has no Python dependencies; pip (which builds environments) has packaging
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.specifiers import InvalidSpecifier, SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

from ..channel.spec import PIP_ARGS, TORCH_INDEX  # noqa: F401 (TORCH_INDEX: hostmatch.TORCH_INDEX)
from .config import PackConfigError

# Distributions every environment gets at the host's versions (where the
# host has them), whatever ComfyUI's requirements.txt says.
ALWAYS = ("torch", "comfy-aimdo", "comfy-kitchen")
# ComfyUI's requirements that no worker imports: its web assets (the
# frontend and the workflow templates alone are ~140 MB) and its own app
# database.  Under another minor they are not installed; under the host's
# own they are shared as links, which costs nothing.
SERVER_ONLY = frozenset({"comfyui-frontend-package", "comfyui-workflow-templates", "comfyui-embedded-docs",
                         "alembic", "sqlalchemy"})
# The host's distributions that import torch without requiring it in their
# metadata: under another minor without the host's torch they are left out
# with it (``Plan.needing``), as no worker there can import them
# (comfy-kitchen's CUDA kernels alone are ~190 MB).
TORCH_ONLY = frozenset({"comfy-kitchen"})
PTH_NAME = "bulkhead-host.pth"
FINGERPRINT_FORMAT = 1


# --- the host's ComfyUI ---

def find_comfyui(options=None):
    """The host's ComfyUI directory: options['comfyui'], else where the
    imported ``folder_paths`` or ``comfy`` came from, else $COMFYUI_PATH;
    None when there is none.  (host.nodes.find_comfyui is this.)"""
    given = (options or {}).get("comfyui")
    if given:
        return os.path.realpath(given)
    fp = sys.modules.get("folder_paths")
    if getattr(fp, "__file__", None):
        return os.path.dirname(os.path.realpath(fp.__file__))
    comfy = sys.modules.get("comfy")
    if getattr(comfy, "__file__", None):
        return os.path.dirname(os.path.dirname(os.path.realpath(comfy.__file__)))
    env = os.environ.get("COMFYUI_PATH")
    if env and os.path.isdir(os.path.join(env, "comfy")):
        return os.path.realpath(env)
    return None


def comfyui_for(config):
    """The ComfyUI a pack's environment is matched to: ``find_comfyui()``,
    else the one the pack is installed in (``<ComfyUI>/custom_nodes/<pack>``),
    else None."""
    base = find_comfyui()
    if base:
        return base
    up = os.path.dirname(os.path.dirname(os.path.realpath(config.root)))
    if os.path.basename(os.path.dirname(os.path.realpath(config.root))) == "custom_nodes" and \
            os.path.isdir(os.path.join(up, "comfy")):
        return up
    return None


def _requirements_file(base):
    return os.path.join(base, "requirements.txt") if base else None


def _sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def read_requirements(path):
    """The requirements of a requirements.txt, parsed (comments, blank
    lines and pip options skipped).  [] when the file cannot be read."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue
    return out


# --- the host's distributions ---

def canonical(name):
    """A distribution name in its canonical form (PEP 503)."""
    return canonicalize_name(name)


class _Dist:
    """One host distribution as this process read it: its metadata parsed
    once (importlib.metadata parses a distribution's METADATA anew on every
    ``metadata``, ``version`` or ``requires``, and makes a pathlib object
    per RECORD line on every ``files``: with ComfyUI's ~200 distributions
    that was most of a build's CPU in ComfyUI's process, one GIL)."""

    def __init__(self, d, meta):
        self.dist = d
        self.metadata = meta
        self.version = meta["Version"]
        self._requires = self._parsed = self._has_files = self._location = _UNREAD
        self.torch_cuda = _UNREAD   # torch's alone: its torch.version.cuda (fingerprint)

    @property
    def requires(self):
        """Its Requires-Dist lines (an egg-info's requires.txt), or None."""
        if self._requires is _UNREAD:
            reqs = self.metadata.get_all("Requires-Dist")
            self._requires = reqs if reqs is not None else self.dist.requires
        return self._requires

    @property
    def parsed_requires(self):
        """``requires`` parsed, what does not parse left out."""
        if self._parsed is _UNREAD:
            out = []
            for r in self.requires or ():
                try:
                    out.append(Requirement(r))
                except InvalidRequirement:
                    continue
            self._parsed = out
        return self._parsed

    @property
    def files(self):
        """Its files as path parts relative to its site directory
        (("numpy", "__init__.py"), ...), from its RECORD read as the CSV
        it is; None when it lists none (importlib.metadata's ``files``).
        Read anew on each call: a host's RECORDs are tens of MB as tuples,
        not kept in ComfyUI's process for a farm made once."""
        text = self.dist.read_text("RECORD")
        if text is None:
            files = self.dist.files
            return None if files is None else [tuple(f.parts) for f in files]
        out = []
        for row in csv.reader(text.splitlines()):
            if row:
                parts = row[0].split("/")
                if "" in parts or "." in parts:     # "./x", "a//b": as pathlib reads them
                    parts = [x for x in parts if x not in ("", ".")]
                out.append(tuple(parts))
        return out

    @property
    def has_files(self):
        """Whether it lists its files (what a farm links)."""
        if self._has_files is _UNREAD:
            self._has_files = self.dist.read_text("RECORD") is not None or self.dist.files is not None
        return self._has_files

    @property
    def location(self):
        """The real path of its site directory."""
        if self._location is _UNREAD:
            self._location = os.path.realpath(str(self.dist.locate_file("")))
        return self._location

    def locate_file(self, path):
        return self.dist.locate_file(path)

    def read_text(self, name):
        return self.dist.read_text(name)


_UNREAD = object()


class _Host:
    """The host's installed distributions as ``_host`` read them for
    ``key`` (what ``_host_key`` says)."""

    def __init__(self, key, dists):
        self.key = key
        self.dists = dists      # {canonical name: _Dist}, the first on sys.path winning (as import does)
        self.farms = {}         # {farm path: threading.Lock}: one thread of this process makes a farm
        self._owners = {}
        self._lock = threading.Lock()

    def owners(self, loc):
        """{the parts of a directory in the site directory ``loc``: the
        canonical name of the distribution with files under it, or the
        set of them where several have}: where a farm must make a real
        directory and link one level down (``build_farm``)."""
        with self._lock:    # builds side by side: read once
            got = self._owners.get(loc)
            if got is None:
                got = self._owners[loc] = {}
                for n, d in self.dists.items():
                    if d.location != loc:
                        continue
                    for parts in d.files or ():
                        for k in range(1, len(parts)):
                            o = got.setdefault(parts[:k], n)
                            if o != n:
                                if isinstance(o, str):
                                    got[parts[:k]] = o = {o}
                                o.add(n)
            return got


# The distributions of each sys.path entry are read once and kept while
# the entry's directory (or zip) has the same device, inode and mtime: a
# distribution installed, upgraded or removed there makes or removes its
# .dist-info directory, which changes the mtime (importlib's own path
# finder keys its directory listings so).  An entry modified within
# _RACY_S of its read is not trusted to show everything made there (one
# mtime tick may cover a write made after the read, as git's "racy" index
# entries): it serves that read and is read again on the next (ComfyUI's
# own directory, on sys.path, is one at its start; it holds no
# distribution and is listed in no time).
_RACY_S = 2.0
_host_lock = threading.Lock()
_host_read = None           # the last _Host, while none of its entries was racy
_entries = {}               # {sys.path entry: (its stat key, [(canonical name, _Dist)])}


def _entry_key(p):
    try:
        st = os.stat(p or ".")
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _host_key():
    """What a kept read of the host's distributions holds for (above)."""
    return (tuple(sys.path),) + tuple(_entry_key(p) for p in sys.path)


def _read_entry(p):
    out = []
    for d in metadata.distributions(path=[p]):
        meta = d.metadata
        name = meta["Name"] if meta else None
        if name:
            out.append((canonicalize_name(name), _Dist(d, meta)))
    return out


def _host():
    """The host's distributions (a _Host): each sys.path entry read again
    only where its key changed (or its last read was racy)."""
    global _host_read, _entries
    key = _host_key()
    got = _host_read
    if got is not None and got.key == key:
        return got
    with _host_lock:
        got = _host_read
        if got is not None and got.key == key:
            return got
        began = time.time()
        dists, racy, kept, cleared = {}, False, {}, False
        for p, k in zip(sys.path, key[1:]):
            hit = _entries.get(p)
            if hit is not None and hit[0] == k:
                found = hit[1]
            else:
                if not cleared:
                    # importlib.metadata (3.10 on) keeps its own listing of
                    # each path entry, keyed on its mtime alone: the same
                    # race, cleared (an instance's method: 3.10-3.12 lack
                    # @classmethod).
                    finder = getattr(metadata, "MetadataPathFinder", None)
                    if finder is not None and hasattr(finder, "invalidate_caches"):
                        finder().invalidate_caches()
                    cleared = True
                found = _read_entry(p)
            if k is not None and k[2] / 1e9 >= began - _RACY_S:
                racy = True
            else:
                kept[p] = (k, found)
            for n, d in found:
                dists.setdefault(n, d)
        _entries = kept
        got = _Host(key, dists)
        _host_read = None if racy else got
    return got


def _host_dists():
    """{canonical name: _Dist} of the host, the first on sys.path winning
    (as import does); read once while nothing changed (``_host``)."""
    return _host().dists


def _torch_cuda(d):
    """torch.version.cuda of an installed torch, read from torch's
    torch/version.py without importing it; None for a CPU build or when unreadable."""
    try:
        path = d.locate_file("torch/version.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            return node.value.value if isinstance(node.value.value, str) else None
    return None


def _closure(dists, roots):
    """The canonical names of ``roots`` and everything they require
    (markers evaluated here, no extras), as far as the host has them."""
    env = dict(default_environment(), extra="")
    out, todo = [], list(roots)
    while todo:
        n = canonicalize_name(todo.pop(0))
        if n in out or n not in dists:
            continue
        out.append(n)
        for req in dists[n].parsed_requires:
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return out


def fingerprint(comfyui, mode="match"):
    """What an environment's match to the host depends on, as the stamp
    records it; cheap (no RECORD or source read beyond torch's
    torch/version.py and ComfyUI's requirements.txt)."""
    if mode == "none":
        return {"format": FINGERPRINT_FORMAT, "mode": "none"}
    dists = _host().dists
    found = {name: dists.get(name) for name in ALWAYS}
    torch = found["torch"]
    if torch is not None and torch.torch_cuda is _UNREAD:
        torch.torch_cuda = _torch_cuda(torch)
    req = _requirements_file(comfyui)
    return {"format": FINGERPRINT_FORMAT, "mode": "match",
            "torch": torch.version if torch is not None else None,
            "torch_cuda": torch.torch_cuda if torch is not None else None,
            "comfy-aimdo": found["comfy-aimdo"].version if found["comfy-aimdo"] else None,
            "comfy-kitchen": found["comfy-kitchen"].version if found["comfy-kitchen"] else None,
            "comfyui": comfyui,
            "requirements_sha256": _sha256(req) if req else None}


_COMPARED = (("torch", "the host's torch"), ("torch_cuda", "the host's torch CUDA build"),
             ("comfy-aimdo", "the host's comfy-aimdo"), ("comfy-kitchen", "the host's comfy-kitchen"))


def stale_reason(stamped, config, rebuild):
    """Why an environment stamped with ``stamped`` (its stamp's ``host``)
    no longer matches the host, in words ending in ``rebuild`` (the
    command); None while it matches."""
    mode = config.options.get("host_packages", "match")
    if not isinstance(stamped, dict) or stamped.get("format") != FINGERPRINT_FORMAT:
        return f"it was built before bulkhead matched environments to the host; run `{rebuild}`"
    if stamped.get("mode") != mode:
        return (f"[bulkhead] host_packages changed from {stamped.get('mode')!r} to {mode!r}; "
                f"run `{rebuild}`")
    if mode == "none":
        return None
    base = comfyui_for(config) or stamped.get("comfyui")
    now = fingerprint(base, mode)
    for key, what in _COMPARED:
        if stamped.get(key) != now[key]:
            return (f"{what} changed from {stamped.get(key) or 'none'} to {now[key] or 'none'}; "
                    f"run `{rebuild}`")
    # Built where no ComfyUI was found (an install outside ComfyUI, the pack
    # not in its custom_nodes): its torch is matched, which is what must
    # agree; ComfyUI's other requirements are not held against it.
    if stamped.get("comfyui") and stamped.get("requirements_sha256") != now["requirements_sha256"]:
        return (f"the host ComfyUI's requirements.txt ({_requirements_file(base)}) changed; "
                f"run `{rebuild}`")
    return None


# --- planning ---

@dataclasses.dataclass
class Plan:
    """What an environment gets from the host.

    ``share``      canonical names shared read-only (same minor), in order.
    ``install``    pip requirement strings at the host's versions (another
                   minor, or what cannot be shared).
    ``constraints`` lines for pip's -c: the host's torch, always.
    ``pack_wins``  (name, the pack's requirement, the host's version): the
                   pack's pin is used instead of the host's.
    ``notes``      lines for the install output.
    ``stamp``      the stamp's ``host`` entry.
    ``sources``    {an ``install`` entry: [(pip arguments, in words)]} for
                   the host's local builds (``torch==2.13.0+cpu``), which
                   no index pip uses by default holds (``local_sources``).
    ``requires``   {canonical name: every canonical name it requires,
                   through others too} of what ``install`` holds, as the
                   host has them installed.
    ``resolve``    {an ``install`` entry that is a bare name: why the
                   host's version is not pinned} -- the host's version
                   does not run under that minor (its Requires-Python), so
                   the resolver picks that minor's.
    """

    share: List[str]
    install: List[str]
    constraints: List[str]
    pack_wins: List[Tuple[str, str, str]]
    notes: List[str]
    stamp: Dict[str, object]
    sources: Dict[str, List[Tuple[List[str], str]]] = dataclasses.field(default_factory=dict)
    requires: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    resolve: Dict[str, str] = dataclasses.field(default_factory=dict)

    def needing(self, lacking):
        """The ``install`` entries that need (directly or through others)
        one of the canonical names ``lacking``, those included."""
        lacking = set(lacking)
        return [p for p in self.install
                if pin_name(p) in lacking or lacking.intersection(self.requires.get(pin_name(p), ()))]


    def relaxed(self, pin):
        """The bare name to resolve for the environment's minor in place
        of ``pin`` (an ``install`` entry pip could not install there);
        None for what must be the host's exact version: torch and the
        rest of ALWAYS, a local build (``+cpu``), an entry already bare."""
        req = Requirement(pin)
        n = canonicalize_name(req.name)
        if n in ALWAYS or pin in self.resolve or pin in self.sources or not req.specifier:
            return None
        return req.name


def pin_name(pin):
    """The canonical name of a ``name==version`` pin (or a bare name)."""
    return canonicalize_name(Requirement(pin).name)


def _runs_under(d, python_version):
    """False when the installed distribution ``d``'s Requires-Python
    excludes ``python_version`` ("3.10.13"): that version has no
    distribution for it on any index; True otherwise (none declared, or
    unreadable: pip finds out)."""
    spec = d.metadata.get("Requires-Python") if d.metadata else None
    if not spec:
        return True
    try:
        return SpecifierSet(spec).contains(python_version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return True


# Where another minor's build of a host's local build comes from (a
# version with a local segment: torch 2.13.0+cpu from /opt/wheels, or
# 2.13.0+cu128 from the PyTorch index): $BULKHEAD_TORCH_INDEX (a URL, or a
# directory of wheels; "{local}" in it becomes the local segment; "none":
# nowhere but BULKHEAD_PIP_ARGS and pip's own configuration), else the
# PyTorch index that build implies (+cpu, +cuXYZ, +rocmX.Y, +xpu).  The
# variable's name is TORCH_INDEX, from channel/spec.py.
PYTORCH_INDEX = "https://download.pytorch.org/whl/{local}"
_PYTORCH_LOCAL = re.compile(r"(cpu|cu\d+|rocm\d+(\.\d+)*|xpu)\Z")


def _direct_dir(d):
    """The directory of the wheel file the host installed ``d`` from
    (its direct_url.json), where a build for another minor may lie beside
    it; None when it came from an index."""
    try:
        url = json.loads(d.read_text("direct_url.json") or "null")
    except ValueError:
        return None
    u = url.get("url", "") if isinstance(url, dict) else ""
    if u.startswith("file://") and u.endswith(".whl"):
        return os.path.dirname(urllib.parse.unquote(u[len("file://"):]))
    return None


def local_sources(d):
    """Where to look for another minor's build of the host distribution
    ``d``'s exact version: [(pip arguments, in words)], tried in order (an
    unreachable index fails uv's whole resolution, so each is its own
    try), the last one pip's own configuration; None when its version has
    no local segment (any index pip uses serves it)."""
    try:
        local = Version(d.version).local
    except InvalidVersion:
        return None
    if not local:
        return None
    out = []
    given = os.environ.get(TORCH_INDEX, "").strip()
    if given and given.lower() != "none":
        loc = given.replace("{local}", local)
        out.append((["--find-links", loc] if os.path.isdir(loc) else ["--extra-index-url", loc],
                    f"{TORCH_INDEX} ({loc})"))
    elif not given and _PYTORCH_LOCAL.match(local):
        loc = PYTORCH_INDEX.format(local=local)
        out.append((["--extra-index-url", loc], f"the PyTorch index for +{local} builds ({loc})"))
    beside = _direct_dir(d)
    if beside and os.path.isdir(beside):
        out.append((["--find-links", beside], f"beside the host's own wheel ({beside})"))
    out.append(([], f"{PIP_ARGS} and pip's configuration"))
    return out


def _pin(name, version):
    try:
        Version(version)
        return f"{name}=={version}"
    except InvalidVersion:
        return f"{name}==={version}"


def plan(config, python_version, comfyui):
    """The Plan for ``config``'s environment under an interpreter of
    ``python_version`` ("3.12.1"), matched to the host ComfyUI at
    ``comfyui`` (or None).  Raises PackConfigError when the pack pins a
    torch the host's does not satisfy."""
    mode = config.options.get("host_packages", "match")
    stamp = fingerprint(comfyui, mode)
    same_minor = python_version.split(".")[:2] == [str(x) for x in sys.version_info[:2]]
    if mode == "none":
        return Plan([], [], [], [], ["host_packages = \"none\": nothing of the host's is matched"], stamp)
    dists = _host_dists()
    notes = []
    roots = [n for n in ALWAYS if n in dists]
    if comfyui:
        # Every requirement of ComfyUI's requirements.txt the host has: what
        # an in-process pack can import (comfy_api's av, server's aiohttp, ...).
        path = _requirements_file(comfyui)
        host_env = dict(default_environment(), extra="")
        lacking, server_only = [], []
        for req in read_requirements(path):
            if req.marker is not None and not req.marker.evaluate(host_env):
                continue
            n = canonicalize_name(req.name)
            if n in SERVER_ONLY and not same_minor:
                server_only.append(req.name)
            elif n in dists:
                roots.append(n)
            else:
                lacking.append(req.name)
        if lacking:
            notes.append(f"the host has no {', '.join(lacking)} installed ({path} lists "
                         f"{'them' if len(lacking) > 1 else 'it'}): nor does this environment")
        if server_only:
            notes.append(f"not installed: {', '.join(server_only)} (ComfyUI's server alone uses "
                         f"{'them' if len(server_only) > 1 else 'it'}; no worker imports "
                         f"{'them' if len(server_only) > 1 else 'it'})")
    else:
        notes.append("no ComfyUI found (COMFYUI_PATH, or the pack in <ComfyUI>/custom_nodes): only "
                     f"{', '.join(roots) or 'nothing'} matched to the host")
    names = _closure(dists, roots)
    host_torch = dists["torch"].version if "torch" in dists else None

    marker_env = dict(default_environment(), python_version=".".join(python_version.split(".")[:2]),
                      python_full_version=python_version, extra="")
    pack_wins = []
    for text in config.requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(marker_env):
            continue
        n = canonicalize_name(req.name)
        if n not in names:
            continue
        host_v = dists[n].version
        if not req.url and req.specifier.contains(host_v, prereleases=True):
            continue        # the host's version does: shared or pinned as below
        if n == "torch":
            raise PackConfigError(
                config.path, f"requirement {text!r} asks for another torch than the host's torch {host_v}: "
                "the host and its workers run one torch (tensors and CUDA IPC cross between them); "
                f"remove the torch pin or let it allow {host_v}", key="requirements")
        pack_wins.append((n, text, host_v))
    won = {n for n, _, _ in pack_wins}
    for n, text, host_v in pack_wins:
        notes.append(f"{n}: the pack's {text} wins over the host's {n} {host_v}")
    names = [n for n in names if n not in won]
    share, install, resolve = [], [], {}
    for n in names:
        d = dists[n]
        if same_minor and d.has_files:
            share.append(n)
        elif (not same_minor and n not in ALWAYS and not _local(d.version)
              and not _runs_under(d, python_version)):
            # The host's version has no distribution for this minor: the
            # resolver picks this minor's (with the host's other versions).
            install.append(d.metadata["Name"])
            resolve[d.metadata["Name"]] = f"the host's {d.version} requires Python {d.metadata['Requires-Python']}"
        else:
            install.append(_pin(d.metadata["Name"], d.version))
    if resolve:
        notes.append(f"the host's {', '.join(f'{n} {dists[canonicalize_name(n)].version}' for n in resolve)} "
                     f"do not run under Python {'.'.join(python_version.split('.')[:2])} (their "
                     "Requires-Python): resolved for it instead")
    constraints = [_pin("torch", host_torch)] if host_torch and "torch" not in won else []
    stamp.update({"shared": {n: dists[n].version for n in share}, "installed": install,
               "pack_wins": [list(w) for w in pack_wins]})
    sources = {p: local_sources(dists[pin_name(p)]) for p in install if p not in resolve}
    sources = {p: src for p, src in sources.items() if src is not None}
    requires = {}
    for p in install:
        n = pin_name(p)
        requires[n] = _closure(dists, [n])[1:] + (["torch"] if n in TORCH_ONLY else [])
    return Plan(share, install, constraints, pack_wins, notes, stamp, sources, requires, resolve)


def _local(version):
    """True when ``version`` has a local segment (a build: 2.13.0+cpu)."""
    try:
        return bool(Version(version).local)
    except InvalidVersion:
        return False


# --- sharing ---

def _site_files(d):
    """(site directory, [path parts]) of a distribution's files that lie
    in its site directory."""
    out = []
    for parts in d.files or ():
        if not parts or ".." in parts or parts[0] == "__pycache__" or (len(parts) == 1 and parts[0].endswith(".pth")):
            continue
        out.append(parts)
    return d.location, out


def build_farm(names, directory):
    """Makes (or finds) the symlink farm holding exactly the host's
    distributions ``names`` under ``directory`` and returns its path."""
    host = _host()
    dists = host.dists
    key = hashlib.sha256(repr(sorted((n, dists[n].version, str(dists[n].locate_file(""))) for n in names))
                         .encode()).hexdigest()[:12]
    farm = os.path.join(directory, key)
    if os.path.isdir(farm):
        return farm
    # Builds side by side in this process share one farm: one makes it,
    # the others wait and find it (another process's is its rename's race).
    with _host_lock:
        lock = host.farms.setdefault(farm, threading.Lock())
    with lock:
        if os.path.isdir(farm):
            return farm
        return _make_farm(host, names, directory, key, farm)


def _make_farm(host, names, directory, key, farm):
    """Makes ``farm`` (named ``key`` under ``directory``) of the host's
    distributions ``names``: a file's path is linked at its first
    directory no other host distribution has files under."""
    os.makedirs(directory, exist_ok=True)
    mine = {}
    for n in names:
        loc, files = _site_files(host.dists[n])
        mine.setdefault(loc, []).extend(files)
    chosen = set(names)

    def taken(owners, head):
        # Another distribution (one not shared) has files under it.
        o = owners.get(head)
        return o is not None and (o not in chosen if isinstance(o, str) else not o <= chosen)
    tmp = tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=directory)
    try:
        os.chmod(tmp, 0o755)
        for loc, files in mine.items():
            owners = host.owners(loc)
            linked = set()
            for parts in files:
                k = 1
                while k < len(parts) and taken(owners, parts[:k]):
                    k += 1
                head = parts[:k]
                if any(head[:j] in linked for j in range(1, k + 1)):
                    continue
                src = os.path.join(loc, *head)
                if not os.path.lexists(src):
                    continue
                dst = os.path.join(tmp, *head)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(src, dst)
                linked.add(head)
        try:
            os.rename(tmp, farm)
        except OSError:
            if not os.path.isdir(farm):        # not another install's farm: a real failure
                raise
        else:
            tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return farm


def write_markers(site_packages, names):
    """For installers that read only the environment's own site-packages
    (uv): one ``<name>-<version>.dist-info`` per shared distribution there,
    holding the host's METADATA (what a resolver reads) and a RECORD that
    lists only the marker itself, so the distribution counts as installed
    while its code stays in the farm, and an uninstall removes the marker,
    never a host file.  Returns the marker directories made."""
    dists = _host_dists()
    made = []
    for n in names:
        d = dists[n]
        text = d.read_text("METADATA")
        if text is None:
            continue
        stem = f"{canonicalize_name(d.metadata['Name']).replace('-', '_')}-{d.version}.dist-info"
        marker = os.path.join(site_packages, stem)
        os.makedirs(marker, exist_ok=True)
        for name, body in (("METADATA", text), ("INSTALLER", "bulkhead-host\n")):
            with open(os.path.join(marker, name), "w", encoding="utf-8") as f:
                f.write(body)
        with open(os.path.join(marker, "RECORD"), "w", encoding="utf-8") as f:
            f.write("".join(f"{stem}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))
        made.append(marker)
    return made


def write_pth(site_packages, farm):
    """Puts the farm on the environment's path (after its own
    site-packages, so the pack's own distributions win)."""
    with open(os.path.join(site_packages, PTH_NAME), "w", encoding="utf-8") as f:
        f.write(farm + "\n")
