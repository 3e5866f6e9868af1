"""Local package sources the tests build, so that environments build
offline: wheels, a source tree with an in-tree PEP 517 backend, a git
repository, a PEP 503 simple index, a conda channel (indexed by
py-rattler) and a CUDA-wheel index laid out as comfy-env's.  Used by
tests/py/test_comfy_env.py and tests/e2e."""

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
import zipfile

HOST_MM = "%d.%d" % sys.version_info[:2]

# An in-tree PEP 517 backend: a source tree builds into a wheel with no
# setuptools and no network (pip's isolated build installs nothing).
BACKEND = '''
import base64, hashlib, os, zipfile
NAME, VERSION = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "NAME")).read().split()

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    info = f"{NAME}-{VERSION}.dist-info"
    files = {}
    for dp, _, fs in os.walk(os.path.join(here, NAME)):
        for f in fs:
            if f.endswith(".py"):
                p = os.path.join(dp, f)
                files[os.path.relpath(p, here)] = open(p).read()
    files[info + "/METADATA"] = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n"
    files[info + "/WHEEL"] = "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    rec = []
    for p, t in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        rec.append(f"{p},sha256={d},{len(t.encode())}")
    files[info + "/RECORD"] = "\\n".join(rec + [info + "/RECORD,,"]) + "\\n"
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return name
'''


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def _write_wheel(directory, name, version, tag, files, purelib, metadata=""):
    """A wheel of ``files`` (path -> text) with its dist-info and RECORD;
    ``metadata``: more METADATA lines (Requires-Dist, Provides-Extra)."""
    info = f"{name}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}"
    entries[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: {str(purelib).lower()}\n"
                                f"Tag: {tag}\n")
    record = []
    for path, text in entries.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={d},{len(text.encode())}")
    entries[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    os.makedirs(directory, exist_ok=True)
    whl = os.path.join(directory, f"{name}-{version}-{tag}.whl")
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
    return whl


def make_wheel(directory, name, version, files, metadata=""):
    """A pure-Python wheel (py3-none-any); returns its path."""
    return _write_wheel(directory, name, version, "py3-none-any", files, True, metadata)


def source_tree(directory, name, version, value):
    write(os.path.join(directory, "NAME"), f"{name} {version}\n")
    write(os.path.join(directory, "bhbackend.py"), BACKEND)
    write(os.path.join(directory, "pyproject.toml"), '''
        [build-system]
        requires = []
        build-backend = "bhbackend"
        backend-path = ["."]
    ''')
    write(os.path.join(directory, name, "__init__.py"), f"VALUE = {value!r}\n")
    return directory


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_sources(root):
    """Local sources of every kind a [pypi-dependencies] entry names."""
    s = {}
    repo = source_tree(str(root / "src" / "bhgit"), "bhgit", "1.0", "from git v1")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v1")
    git(repo, "tag", "v1")
    write(os.path.join(repo, "bhgit", "__init__.py"), "VALUE = 'from git main'\n")
    git(repo, "commit", "-q", "-am", "main")
    s["git"] = repo
    s["path"] = source_tree(str(root / "src" / "bhpath"), "bhpath", "2.0", "from a path")
    s["url"] = make_wheel(str(root / "src" / "urlwheels"), "bhurl", "3.0", {"bhurl/__init__.py": "VALUE = 'from a url'\n"})
    # a PEP 503 simple index in a directory
    idx = root / "src" / "simple"
    whl = make_wheel(str(idx / "bhindexed"), "bhindexed", "4.0", {"bhindexed/__init__.py": "VALUE = 'from the index'\n"})
    write(idx / "bhindexed" / "index.html",
          f'<html><body><a href="{os.path.basename(whl)}">{os.path.basename(whl)}</a></body></html>\n')
    write(idx / "index.html", '<html><body><a href="bhindexed/">bhindexed</a></body></html>\n')
    s["index"] = "file://" + str(idx)
    s["wheels"] = os.path.dirname(make_wheel(str(root / "src" / "wheels"), "bhplain", "1.0",
                                             {"bhplain/__init__.py": "VALUE = 'plain'\n"}))
    return s


def conda_package(channel, name, version, files, depends=()):
    """A noarch conda package (.tar.bz2: info/index.json, info/paths.json,
    info/files and the files) written into channel/noarch."""
    import io
    import json
    import tarfile
    os.makedirs(os.path.join(channel, "noarch"), exist_ok=True)
    index = {"name": name, "version": version, "build": "0", "build_number": 0, "depends": list(depends),
             "noarch": "generic", "subdir": "noarch", "license": "MIT", "timestamp": 1700000000000}
    paths = {"paths_version": 1, "paths": [{"_path": p, "path_type": "hardlink", "size_in_bytes": len(d),
                                            "sha256": hashlib.sha256(d).hexdigest()}
                                           for p, (d, _) in files.items()]}
    fn = os.path.join(channel, "noarch", f"{name}-{version}-0.tar.bz2")
    with tarfile.open(fn, "w:bz2") as t:
        def add(n, data, mode=0o644):
            ti = tarfile.TarInfo(n)
            ti.size, ti.mode = len(data), mode
            t.addfile(ti, io.BytesIO(data))
        add("info/index.json", json.dumps(index).encode())
        add("info/paths.json", json.dumps(paths).encode())
        add("info/files", "".join(p + "\n" for p in files).encode())
        for p, (d, mode) in files.items():
            add(p, d, mode)
    return fn


def make_channel(root):
    """A local conda channel, indexed by py-rattler: bhtool 1.0 and 1.2 (a
    program, a data file, and a Python module in the prefix's
    site-packages for this interpreter's version)."""
    ch = str(root / "channel")
    for v in ("1.0", "1.2"):
        conda_package(ch, "bhtool", v, {
            "bin/bhtool": (f"#!/bin/sh\necho bhtool {v} \"$CONDA_PREFIX\"\n".encode(), 0o755),
            "share/bhtool/data.txt": (f"data {v}\n".encode(), 0o644),
            f"lib/python{HOST_MM}/site-packages/bhconda/__init__.py": (f"VALUE = 'conda {v}'\n".encode(), 0o644),
        })
    # in a child: rattler's runtime keeps threads and fds for the life of a process
    subprocess.run([sys.executable, "-c", "import asyncio, sys, rattler.index as i; "
                    "asyncio.run(i.index_fs(sys.argv[1], write_zst=False, write_shards=False)); "
                    "import os; os._exit(0)", ch], check=True)  # os._exit: see envs/conda.py
    return ch


PY_TAG = "cp%d%d" % sys.version_info[:2]


def tagged_wheel(directory, name, version, tag, value):
    """A wheel named and tagged for one build (``1.0+cu128torch2.8``,
    cp311-cp311-linux_x86_64); returns its file name."""
    return os.path.basename(_write_wheel(directory, name, version, tag, {f"{name}/__init__.py": f"VALUE = {value!r}\n"},
                                         False))


def make_cuda_index(root, locals_=("cu128torch2.8", "cu124torch2.5", "cputorch2.4")):
    """A wheel index laid out as comfy-env's cuda-wheels: <pkg>/index.html
    whose link texts are the wheel names."""
    import platform
    arch = platform.machine()
    idx = root / "cuda-index"
    names = [tagged_wheel(str(idx / "bh_cudaext"), "bh_cudaext", f"1.0+{local}", f"{PY_TAG}-{PY_TAG}-linux_{arch}",
                          local)
             for local in locals_]
    names.append(tagged_wheel(str(idx / "bh_cudaext"), "bh_cudaext", "1.0+cu128torch2.8",
                              f"cp30-cp30-linux_{arch}", "wrong python"))
    write(idx / "bh_cudaext" / "index.html",
          "".join(f'<a href="{n}">{n}</a><br>\n' for n in names))
    return str(idx)
