"""Every comfy-env release PyPI serves, installed once each under
build/comfy-env-oracle (outside git): the list comes from PyPI's JSON API,
each release goes into a folder of its own with ``uv pip install --target
--no-deps`` (the wheel, or its sdist built), and the dependencies its
reader imports (tomli, tomli-w, pyyaml, numpy) into one folder beside them
that every release shares.  A release that does not install on this
machine is recorded with uv's reason instead of failing the run.

Run alone (``python tests/oracle/comfy_env_releases.py``) it fetches what
is missing and prints one line per release; the oracle test
(test_comfy_env_oracle.py) imports it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ROOT = os.environ.get("BULKHEAD_COMFY_ENV_ORACLE_DIR", os.path.join(REPO, "build", "comfy-env-oracle"))
PYPI_JSON = "https://pypi.org/pypi/comfy-env/json"
# What the releases' readers import beyond the standard library, from
# their Requires-Dist; pip, uv and pre-commit are tools they run, not
# modules the reader imports, and are left out.
READER_DEPS = ("tomli>=2.0.0", "tomli-w>=1.0.0", "pyyaml>=6.0", "numpy")


def version_key(v):
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else -1)
    return tuple(out)


def served_versions(refresh=False):
    """The versions PyPI serves (yanked ones and those with no files left
    out), oldest first; the JSON is kept in ROOT/pypi.json so that a run
    without network uses the last list."""
    cache = os.path.join(ROOT, "pypi.json")
    data = None
    if refresh or not os.path.isfile(cache):
        try:
            with urllib.request.urlopen(PYPI_JSON, timeout=60) as r:
                data = json.load(r)
            os.makedirs(ROOT, exist_ok=True)
            with open(cache + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(cache + ".tmp", cache)
        except OSError:
            if not os.path.isfile(cache):
                raise
    if data is None:
        with open(cache) as f:
            data = json.load(f)
    out = []
    for v, files in data["releases"].items():
        if files and not all(f.get("yanked") for f in files):
            out.append(v)
    return sorted(out, key=version_key)


def _uv():
    uv = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(uv):
        raise RuntimeError("the comfy-env oracle installs releases with uv: `.venv/bin/pip install uv` "
                           "(make's .stamp-uv does it)")
    return uv


def deps_dir():
    """The folder holding READER_DEPS for this interpreter, installed once."""
    d = os.path.join(ROOT, "deps-%d.%d" % sys.version_info[:2])
    stamp = os.path.join(d, ".ok")
    if not os.path.isfile(stamp):
        shutil.rmtree(d, ignore_errors=True)
        r = subprocess.run([_uv(), "pip", "install", "-q", "--python", sys.executable, "--target", d, *READER_DEPS],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"the comfy-env oracle could not install its readers' dependencies into {d}: "
                               f"{r.stderr[-1500:]}")
        open(stamp, "w").close()
    return d


def install(version):
    """(folder holding that release's comfy_env package, None), or (None,
    the reason it does not install here).  Both answers are kept: a
    release is fetched once."""
    d = os.path.join(ROOT, "releases", version)
    ok, bad = os.path.join(d, ".ok"), os.path.join(d, ".not-installable")
    if os.path.isfile(ok):
        return d, None
    if os.path.isfile(bad):
        with open(bad) as f:
            return None, f.read()
    shutil.rmtree(d, ignore_errors=True)
    r = subprocess.run([_uv(), "pip", "install", "-q", "--no-deps", "--python", sys.executable, "--target", d,
                        f"comfy-env=={version}"], capture_output=True, text=True, timeout=600)
    if r.returncode == 0 and os.path.isfile(os.path.join(d, "comfy_env", "__init__.py")):
        open(ok, "w").close()
        return d, None
    why = (r.stderr.strip() or r.stdout.strip() or "installed no comfy_env package").splitlines()
    why = " | ".join(why[-6:])
    if r.returncode != 0 and ("network" in why.lower() or "dns" in why.lower() or "connect" in why.lower()):
        raise RuntimeError(f"comfy-env {version}: PyPI not reachable: {why}")
    os.makedirs(d, exist_ok=True)
    with open(bad, "w") as f:
        f.write(f"uv pip install comfy-env=={version} under Python {sys.version.split()[0]}: {why}")
    return None, open(bad).read()


def install_all(progress=None):
    """{version: (folder or None, reason or None)} for every served version."""
    out = {}
    for v in served_versions():
        out[v] = install(v)
        if progress:
            progress(v, *out[v])
    return out


def git_releases(repo, served):
    """{version: (folder, date)} for the releases of comfy-env's history
    (repo: a clone, or its git directory) that PyPI does not serve: each
    version its pyproject.toml named (0.0.1-0.2.83), at its tag where it
    has one (v0.1.82 on), else at the commit that set that version; its
    ``src/comfy_env`` extracted once under ROOT/git/<version>.  A version
    whose tree has no ``src/comfy_env`` is left out."""
    git = ["git", "--git-dir", repo] if os.path.isfile(os.path.join(repo, "HEAD")) else ["git", "-C", repo]

    def out(*a):
        return subprocess.run(git + list(a), capture_output=True, text=True, check=True).stdout
    at = {}
    for line in out("log", "--all", "--reverse", "--format=%H %cI", "--", "pyproject.toml").splitlines():
        commit, date = line.split()
        m = re.search(r'(?m)^version\s*=\s*"([^"]+)"', subprocess.run(
            git + ["show", f"{commit}:pyproject.toml"], capture_output=True, text=True).stdout)
        if m and m.group(1) not in at:
            at[m.group(1)] = (commit, date)
    for tag in out("tag").split():
        v = tag[1:] if tag.startswith("v") else tag
        if v in at:
            at[v] = (tag, out("log", "-1", "--format=%cI", tag).strip())
    found = {}
    for v, (ref, date) in at.items():
        if v in served or not re.match(r"\d+(\.\d+)*$", v):
            continue
        d = os.path.join(ROOT, "git", v)
        if not os.path.isfile(os.path.join(d, ".ok")):
            shutil.rmtree(d, ignore_errors=True)
            arch = subprocess.run(git + ["archive", "--format=tar", ref, "src/comfy_env"], capture_output=True)
            if arch.returncode != 0:
                continue
            os.makedirs(d)
            subprocess.run(["tar", "-x", "-C", d, "--strip-components=1"], input=arch.stdout, check=True)
            open(os.path.join(d, ".ok"), "w").close()
        found[v] = (d, date[:19])
    return found


if __name__ == "__main__":
    deps_dir()
    for v, (d, why) in install_all().items():
        print(v, d or f"NOT INSTALLABLE: {why}")
