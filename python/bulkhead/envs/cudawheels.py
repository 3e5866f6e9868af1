"""``[cuda] packages``: CUDA extension wheels matched to the environment.

Packs written for comfy-env list CUDA extensions (nvdiffrast, spconv,
flash-attn, ...) under ``[cuda] packages``; their wheels are published on
a wheel index laid out as comfy-env reads it: ``<index>/<package>/`` is an
HTML page of links whose text is the wheel's file name, and the build a
wheel is for is in its local version: ``+cu128torch2.8`` (or
``+pt2.8cu128``).  The default index is the one those packs use,
``https://comfy-forge.github.io/cuda-wheels/``; ``$BULKHEAD_CUDA_INDEX``
(space separated, tried in order) replaces it, ``$COMFY_ENV_CUDA_WHEELS_INDEX``
(comfy-env's own variable) too when bulkhead's is unset.  An index may be
a URL or a local directory (``<dir>/<package>/index.html``, or the wheels
themselves in ``<dir>/<package>/``).

A wheel fits when its name is a spelling of the package (``-``/``_``), its
local version names the host's CUDA (``torch.version.cuda``, major+minor)
and torch (major.minor) -- the versions comfy-env pins into its envs --, it
is for the environment's CPython (``cp311``) and this machine's
architecture (``_x86_64``).  Of the wheels that fit, the newest version wins,
compared as versions (PEP 440: 1.10 after 1.9, 2.1 after 2.0; a final
release before a pre-release, as pip), manylinux before a plain linux
wheel of the same version; comfy-env took the first
that fit in the page's order (docs/comfy-env-dialects.md).  The build log
says which was picked, over which others, and why.  A host whose torch has
no CUDA (a CPU build) matches only CPU builds (``+cputorch2.8``,
``+pt2.8cpu``).  The host's torch is read from torch's ``torch/version.py``
without importing torch; ``$BULKHEAD_TORCH_VERSION`` and
``$BULKHEAD_CUDA_VERSION`` ("none" for no CUDA) override it.

No fit is an ``EnvBuildError`` naming the package, the build wanted and
every index tried (and why an index could not be read) -- except on a host
whose torch has no CUDA: there, as comfy-env skips the CUDA wheels on a
machine without an NVIDIA GPU, a package with no CPU build is left out
with one warning naming it, and the rest of the environment is built.  The wheel found
is installed as ``name @ url`` with the environment's other requirements
(its dependencies from the default indexes).
"""

from __future__ import annotations

import importlib.util
import os
import platform as _platform
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

from ..channel.spec import CUDA_INDEX, CUDA_VERSION, TORCH_VERSION
from .errors import EnvBuildError

try:
    from packaging.version import InvalidVersion, Version
except ImportError:     # bulkhead has no Python dependencies; pip (which builds environments) has packaging
    from pip._vendor.packaging.version import InvalidVersion, Version

DEFAULT_INDEX = "https://comfy-forge.github.io/cuda-wheels/"

_LINK = re.compile(r'href="([^"]+\.whl(?:#[^"]*)?)"[^>]*>([^<]+)</a>', re.IGNORECASE)


def indexes():
    raw = os.environ.get(CUDA_INDEX, "").strip() or \
        os.environ.get("COMFY_ENV_CUDA_WHEELS_INDEX", "").strip() or DEFAULT_INDEX
    out = []
    for i in raw.split():
        if i.startswith("/"):
            i = "file://" + i
        out.append(i if i.endswith("/") else i + "/")
    return out


def host_torch():
    """(torch version, CUDA version or None) of the host's torch, read from
    torch's torch/version.py; (None, None) when the host has no torch."""
    tv = os.environ.get(TORCH_VERSION, "").strip() or None
    cv = os.environ.get(CUDA_VERSION)
    if tv is None or cv is None:
        spec = importlib.util.find_spec("torch")
        text = ""
        if spec is not None and spec.submodule_search_locations:
            try:
                with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py"),
                          encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                pass
        if tv is None:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            tv = m.group(1) if m else None
        if cv is None:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
            cv = m.group(1) if m else None
    if cv is not None and cv.strip().lower() in ("", "none", "cpu"):
        cv = None
    return tv, cv


def _arch_tag():
    m = _platform.machine().lower()
    if sys.platform.startswith("linux"):
        return "_" + {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
    if sys.platform == "win32":
        return "win_amd64"
    return ""


def _listing(index, pkg_dir):
    """[(href, text)] of the wheels <index><pkg_dir>/ lists.  Raises
    OSError (a directory or file that is not there, an unreachable host)
    and urllib's errors."""
    url = index + pkg_dir + "/"
    if url.startswith("file://"):
        d = urllib.parse.unquote(urllib.parse.urlparse(url).path)
        page = os.path.join(d, "index.html")
        if os.path.isfile(page):
            with open(page, encoding="utf-8") as f:
                html = f.read()
        else:
            return [(n, n) for n in sorted(os.listdir(d)) if n.endswith(".whl")]
    else:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "bulkhead"}),
                                    timeout=15) as r:
            html = r.read().decode("utf-8", "replace")
    return [(m.group(1), m.group(2).strip()) for m in _LINK.finditer(html)]


def _version_of(name):
    """The version a wheel file name carries (``pkg-1.10+cu128torch2.8-cp311-...``),
    as a ``Version`` without its local label; the lowest there is when it
    is no PEP 440 version (never picked over one that is)."""
    parts = name.split("-")
    try:
        return Version(parts[1].split("+")[0]) if len(parts) >= 3 else _NO_VERSION
    except InvalidVersion:
        return _NO_VERSION


_NO_VERSION = Version("0.dev0")


def _why(found, pats, py_tag, arch):
    """The build log's words for the pick: what matched, and over what."""
    text = found[0][2]
    others = sorted({f[2].split("-")[1] for f in found[1:]} - {text.split("-")[1]})
    why = (f"the newest version of {len(found)} wheel(s) built for {pats[0].lstrip('+')} "
           f"(or {pats[1].lstrip('+')}), {py_tag}, {arch.lstrip('_') or 'any platform'}")
    if others:
        why += f" (also there: {', '.join(others)})"
    if len(found) > 1 and found[0][0] == found[1][0]:
        why += "; manylinux before plain linux" if found[0][1] and not found[1][1] else ""
    return why


def wanted(torch_version, cuda_version):
    """The local-version spellings of the build wanted."""
    t = ".".join(torch_version.split("+")[0].split(".")[:2])
    if cuda_version is None:
        return [f"+cputorch{t}", f"+pt{t}cpu"]
    c = "".join(cuda_version.split(".")[:2])
    return [f"+cu{c}torch{t}", f"+pt{t}cu{c}"]


def resolve(config, python_version, progress, rebuild="bulkhead install <pack>", torch=None,
            table="[cuda] packages"):
    """``[name @ url, ...]``: a wheel for each of config.cuda.  Raises
    EnvBuildError.  rebuild: the command that rebuilds the environment
    (build.rebuild_command), for the warning when wheels are skipped.
    torch: (torch version, CUDA version or None) wanted instead of the
    host's (comfy-env's ``get_wheel_url`` names them).  table: the
    config's table that lists them, for what is said ("[local.cuda]")."""
    tv, cv = torch if torch is not None else host_torch()
    where = f"{config.path}: {table}"
    if tv is None:
        raise EnvBuildError(f"{where} lists {', '.join(config.cuda)}, whose wheels are built for a torch "
                            f"version, and the host ({sys.executable}) has no torch; install torch there (or "
                            "set BULKHEAD_TORCH_VERSION and BULKHEAD_CUDA_VERSION to the build wanted)")
    py_tag = "cp" + "".join(python_version.split(".")[:2])
    arch = _arch_tag()
    pats = wanted(tv, cv)
    idx = indexes()
    out, skipped, indexes_tried = [], [], []
    for spec in config.cuda:
        # "name" or "name==version" (comfy-env 0.0.x's [cuda] name = "version")
        pkg, _, want_version = spec.partition("==")
        variants = list(dict.fromkeys([pkg, pkg.replace("-", "_"), pkg.replace("_", "-")]))
        found, tried = [], []
        for index in idx:
            for v in variants:
                try:
                    links = _listing(index, v)
                except (OSError, urllib.error.URLError) as e:
                    why = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
                    tried.append(f"{index}{v}/ ({why})")
                    continue
                tried.append(f"{index}{v}/")
                for href, text in links:
                    version = _version_of(text)
                    if want_version and version != _version_of(f"x-{want_version}-"):
                        continue
                    if any(p in text for p in pats) and f"-{py_tag}-" in text and (not arch or arch in text):
                        url = href if "://" in href else index + v + "/" + href
                        found.append((version, "manylinux" in text, text, url))
            if found:
                break
        if not found and cv is None:
            skipped.append(spec)
            indexes_tried.extend(t for t in tried if t not in indexes_tried)
            continue
        if not found:
            build = f"{pats[0]} (or {pats[1]}), {py_tag}, {arch.lstrip('_') or 'any platform'}"
            head = f"{where}: no wheel of {spec!r} for {build}"
            raise EnvBuildError(f"{head} in the indexes tried: {'; '.join(tried)}. Point BULKHEAD_CUDA_INDEX at "
                                "an index that has it, or list the wheel under [pypi-dependencies] with its url; "
                                "no environment was made")
        # A final release before a pre-release (as pip), then the newest, then manylinux.
        found.sort(key=lambda f: (not f[0].is_prerelease, f[0], f[1]), reverse=True)
        _, _, text, url = found[0]
        progress(f"{table.split()[0]} {spec}: {text} ({url}): {_why(found, pats, py_tag, arch)}")
        name = text.split("-", 1)[0]
        out.append(f"{name} @ {url}")
    if skipped:
        build = f"{pats[0]} (or {pats[1]}), {py_tag}"
        progress(f"warning: {where}: skipping the CUDA wheels {', '.join(skipped)}: the host's torch ({tv}) has "
                 f"no CUDA (torch.version.cuda is None; as comfy-env, which skips them without an NVIDIA GPU) "
                 f"and no CPU build ({build}) is in the indexes tried ({'; '.join(indexes_tried)}). The "
                 "environment is built without them: the pack runs isolated, and its code that imports them "
                 "fails in its worker. Fix: on a machine with a CUDA build of torch, run "
                 f"`{rebuild} --force`")
    return out
