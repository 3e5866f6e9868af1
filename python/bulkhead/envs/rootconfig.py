"""A pack's root file, ``comfy-env-root.toml``: pack-level declarations
(other packs it needs, its custom socket types, system packages), no
environment -- read and checked as envs/config.py reads ``comfy-env.toml``,
with its reader (file and line in every error).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import types
from typing import Mapping, Optional, Tuple

from .config import (CONFIG_NAME, ROOT_CONFIG_NAME, PackConfigError, Reader, check_packages, did_you_mean,
                     toml_loads, warn_note)
from .tomlpos import find_line as _find_line


@dataclasses.dataclass(frozen=True)
class RootConfig:
    """A pack's ``comfy-env-root.toml``: pack-level declarations, no
    environment.

    ``node_packs``  ((name, source), ...) from ``[node_packs]`` (comfy-env
                    0.4.46) or ``[node_reqs]`` (its older name): other
                    packs this one needs; source is "owner/repo" or the
                    table's github/repo/registry value.
    ``types``       {socket type: "custom" | "builtin"} from ``[types]``.
    ``system_packages``  {"apt": (...), "brew": (...)} (older packs put
                    these here).
    ``warnings``    what is not honoured, one line each.
    ``isolate``     ``[settings] isolate`` as comfy-env 0.2.40-0.4.24 read
                    it (``bool()`` of the value), or None where the file
                    does not set it: False runs the pack's nodes in
                    ComfyUI's process, True isolates them even under the
                    user's ``COMFY_ENV_ISOLATE=0`` (the pack's setting won).
    ``isolate_where``  "path:line" of that setting, for the messages that
                    name it.
    """

    path: str
    root: str
    node_packs: Tuple[Tuple[str, str], ...]
    types: Mapping[str, str] = dataclasses.field(hash=False)
    system_packages: Mapping[str, Tuple[str, ...]] = dataclasses.field(hash=False)
    warnings: Tuple[str, ...] = ()
    isolate: Optional[bool] = None
    isolate_where: str = ""


ROOT_TABLES = ("node_packs", "node_reqs", "types", "apt", "brew")


def load_root(pack_dir, *, warn=True):
    """The pack's ``comfy-env-root.toml`` as a RootConfig, or None when it
    has none.  Raises PackConfigError naming file and line."""
    pack_dir = os.path.abspath(os.fspath(pack_dir))
    path = os.path.join(pack_dir, ROOT_CONFIG_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PackConfigError(path, "not UTF-8 text (TOML files must be UTF-8)",
                              raw[:e.start].count(b"\n") + 1) from None
    data = toml_loads(text, path)
    r = Reader(path, text)
    notes = []
    packs = []
    for table in ("node_packs", "node_reqs"):
        if table not in data:
            continue
        t = data[table]
        if not isinstance(t, dict):
            r.type_error((table,), 'a table of name = "owner/repo" or name = { github = "..." }', t)
        for name, v in t.items():
            if isinstance(v, str):
                packs.append((name, v))
                continue
            if not isinstance(v, dict):
                r.type_error((table, name), 'a string ("owner/repo") or a table', v)
            for k, x in v.items():
                if k not in ("github", "repo", "tag", "branch", "commit", "registry", "version"):
                    # comfy-env read these entries with .get and ignored the rest
                    known = ("branch", "commit", "github", "registry", "repo", "tag", "version")
                    notes.append(f"{path}:{_find_line(text, table, name)}: [{table}] {name}: key {k!r} is not "
                                 f"read{did_you_mean(k, known)} (known: {', '.join(known)})")
                    continue
                if not isinstance(x, str):
                    r.type_error((table, name, k), "a string", x)
            src = v.get("github") or v.get("repo") or v.get("registry")
            if not src:
                r.error(f"[{table}] {name}: names no source (github, repo or registry)", table, name)
            packs.append((name, src))
    typ = data.get("types", {})
    if not isinstance(typ, dict):
        r.type_error(("types",), 'a table of TYPE = "custom" | "builtin"', typ)
    for k, v in typ.items():
        if v not in ("custom", "builtin"):
            r.error(f'[types] {k} = {v!r}: must be "custom" (its serializer in <pack>/serialization.py) '
                    'or "builtin"', "types", k)
    isolate, isolate_where = _read_settings(path, text, data, r, notes)
    system = {}
    for table in ("apt", "brew"):
        if table in data:
            system[table] = check_packages(r, table, data[table], allow_scalar=True)
    for k in data:
        if k in ("node_packs", "node_reqs", "types", "apt", "brew"):
            continue
        line = _find_line(text, k)
        if k == "settings":
            continue
        # comfy-env 0.1.17-0.4.13 read this file with the environment files' parser: their tables
        # were accepted here (with no effect from 0.2.19 on); 0.4.14 refuses them.
        notes.append(f"{path}:{line}: [{k}] is not read in {ROOT_CONFIG_NAME}{did_you_mean(k, ROOT_TABLES)}: "
                     "comfy-env 0.2.19-0.4.13 gave an environment's tables no effect here and 0.4.14 refuses "
                     f"them; they go in nodes/{CONFIG_NAME} or nodes/<subdir>/{CONFIG_NAME}")
    if warn:
        for n in notes:
            warn_note(n, path)
    return RootConfig(path=path, root=pack_dir, node_packs=tuple(packs),
                      types=types.MappingProxyType(dict(typ)),
                      system_packages=types.MappingProxyType(system), warnings=tuple(notes),
                      isolate=isolate, isolate_where=isolate_where)


# comfy-env's [settings] keys (settings.SETTINGS_KEY_MAP of 0.2.40-0.4.24):
# what each did, and why bulkhead reads only isolate.
SETTINGS_NOT_READ = {
    "install_isolated": "comfy-env's choice between its own environments and ComfyUI's Python; bulkhead "
                        "always builds the pack's environment",
    "auto_install": "bulkhead builds a missing environment as ComfyUI starts (BULKHEAD_BUILD_AT_START)",
    "pool_ipc": "comfy-env's tensor transport; bulkhead's is its own shared memory",
    "worker_vram_budget": "one machine-wide memory budget admits every worker's loads",
}


def _read_settings(path, text, data, r, notes):
    """``[settings]`` (comfy-env 0.2.40-0.4.24, removed in 0.4.25): its
    ``isolate`` as comfy-env's ``resolve_bool`` took it -- ``bool()`` of
    the value, so a quoted ``"false"`` isolated the pack, which a note
    says -- and one note for each other key.  Returns (isolate or None,
    "path:line")."""
    if "settings" not in data:
        return None, ""
    t = data["settings"]
    if not isinstance(t, dict):
        r.type_error(("settings",), "a table (isolate = false)", t)
    isolate, where = None, ""
    for k, v in t.items():
        line = _find_line(text, "settings", k)
        if k == "isolate":
            isolate, where = bool(v), f"{path}:{line}"
            if not isinstance(v, bool):
                runs = "isolated" if v else "in ComfyUI's process"
                other = "false" if v else "true"
                notes.append(f"{path}:{line}: [settings] isolate = {v!r} is not true or false: comfy-env read it "
                             f"as {bool(v)} (any non-empty value is true), and so does bulkhead: the pack runs "
                             f"{runs}; write isolate = {other} (no quotes) if you meant the other")
        elif k in SETTINGS_NOT_READ:
            notes.append(f"{path}:{line}: [settings] {k} is not read: {SETTINGS_NOT_READ[k]}")
        else:
            known = ("isolate",) + tuple(SETTINGS_NOT_READ)
            notes.append(f"{path}:{line}: [settings] {k} is not read{did_you_mean(k, known)} "
                         f"(comfy-env's keys: {', '.join(known)})")
    return isolate, where


def check_system_packages(system_packages, source):
    """One line per ``[apt]``/``[brew]`` package not found on this machine
    (dpkg-query / brew list), with the command that installs it; a line
    saying so when the checker itself is missing.  Runs nothing else."""
    out = []
    for table, names in sorted(system_packages.items()):
        if not names:
            continue
        if table == "apt":
            if sys.platform != "linux":
                continue
            tool = shutil.which("dpkg-query")
            if tool is None:
                out.append(f"{source}: [apt] lists {', '.join(names)}; dpkg-query is not on this machine, "
                           "so they were not checked (install them with your system's package manager)")
                continue
            missing = []
            for n in names:
                r = subprocess.run([tool, "-W", "-f=${Status}", n], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, universal_newlines=True)
                if r.returncode != 0 or "install ok installed" not in r.stdout:
                    missing.append(n)
            if missing:
                out.append(f"{source}: [apt] packages not installed: {', '.join(missing)}; bulkhead does not "
                           f"install system packages: sudo apt-get install {' '.join(missing)}")
        else:
            if sys.platform != "darwin":
                continue
            tool = shutil.which("brew")
            if tool is None:
                out.append(f"{source}: [brew] lists {', '.join(names)}; brew is not on this machine, so they "
                           "were not checked (install Homebrew, then: brew install "
                           f"{' '.join(names)})")
                continue
            missing = [n for n in names if subprocess.run([tool, "list", "--versions", n],
                                                          stdout=subprocess.DEVNULL,
                                                          stderr=subprocess.DEVNULL).returncode != 0]
            if missing:
                out.append(f"{source}: [brew] packages not installed: {', '.join(missing)}; bulkhead does not "
                           f"install system packages: brew install {' '.join(missing)}")
    return out
