"""The node metadata cache: what a pack's worker described, kept on disk.

Start-up does not wait for workers: the description of a pack's nodes is
kept in one JSON file per pack under ``cache_dir()`` (``MetadataCache``),
keyed by the environment's identity (interpreter path and a stamp,
``default_stamp``), the hashes of the pack's sources (``source_hash``) and
the host ComfyUI's version (``comfyui_version_hash``); with a warm cache no
worker starts until a node first runs.  host/runtime.py
(``PackRuntime.cache_key``) makes the key.
"""

import glob
import hashlib
import json
import logging
import os
import threading

from ..channel.spec import HOME

log = logging.getLogger("bulkhead")


# --- the metadata cache ---

def cache_dir():
    """$BULKHEAD_HOME/cache/nodes, else $XDG_CACHE_HOME/bulkhead/nodes, else
    ~/.cache/bulkhead/nodes."""
    home = os.environ.get(HOME)
    if home:
        return os.path.join(home, "cache", "nodes")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "bulkhead", "nodes")


_SKIP_DIRS = {"__pycache__", "node_modules", "venv", ".venv", "env", "site-packages"}
_SOURCE_NAMES = {"comfy-env.toml", "pyproject.toml", "requirements.txt"}


def source_hash(pack_dir):
    """sha256 over the pack's Python sources and config files (relative
    path and contents)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(pack_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for f in sorted(files):
            if not (f.endswith(".py") or f in _SOURCE_NAMES):
                continue
            path = os.path.join(root, f)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            h.update(os.path.relpath(path, pack_dir).encode() + b"\0")
            h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def default_stamp(python):
    """The environment's identity when the caller gives none: the
    interpreter's mtime, and the mtimes of the venv's config and
    site-packages directories (which change when packages do)."""
    parts = []
    for path in [python] + [os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")] + \
            sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(python)), "lib*", "python*",
                                          "site-packages"))):
        try:
            parts.append(str(os.stat(path).st_mtime_ns))
        except OSError:
            parts.append("-")
    return ":".join(parts)


def comfyui_version_hash(base):
    h = hashlib.sha256()
    for rel in ("comfyui_version.py", os.path.join("comfy", "cli_args.py"), os.path.join("comfy", "samplers.py")):
        try:
            with open(os.path.join(base, rel), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"-")
    return h.hexdigest()[:32]


class MetadataCache:
    """One JSON file per pack under cache_dir(): the key it was made for
    and the worker's description.  A file whose key differs is a miss; a
    write replaces the pack's older files."""

    def __init__(self, directory=None):
        self.directory = directory or cache_dir()

    def _prefix(self, pack_dir):
        return hashlib.sha256(pack_dir.encode()).hexdigest()[:16]

    def path(self, pack_dir, key):
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        return os.path.join(self.directory, f"{self._prefix(pack_dir)}-{digest}.json")

    def load(self, pack_dir, key):
        try:
            with open(self.path(pack_dir, key), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("meta"), str):
            return None
        return data["meta"]

    def latest(self, pack_dir):
        """(key, meta) of the pack's file whatever key it was made for
        (``store`` keeps one per pack): an earlier environment's
        description, for a pack whose new one is being built
        (host/building.py ``early_nodes``); None where there is none."""
        prefix = self._prefix(pack_dir) + "-"
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.startswith(prefix) and n.endswith(".json"))
        except OSError:
            return None
        for n in names:
            try:
                with open(os.path.join(self.directory, n), encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(data.get("key"), dict) and isinstance(data.get("meta"), str):
                return data["key"], data["meta"]
        return None

    def store(self, pack_dir, key, meta):
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            path = self.path(pack_dir, key)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"key": key, "meta": meta}, f)
            os.replace(tmp, path)
            prefix = self._prefix(pack_dir) + "-"
            for old in os.listdir(self.directory):
                if old.startswith(prefix) and old.endswith(".json") and \
                        os.path.join(self.directory, old) != path:
                    try:
                        os.unlink(os.path.join(self.directory, old))
                    except OSError:
                        pass
        except OSError as e:
            log.warning("bulkhead: cannot write the node metadata cache %s: %s", self.directory, e)
