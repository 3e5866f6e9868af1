"""Installs bulkhead into the Python that runs this file -- ComfyUI's own,
as ComfyUI-Manager runs it after ``pip install -r requirements.txt``.

1. A prebuilt wheel in dist/ beside this file that this interpreter and
   platform can take (``bulkhead-<version>-cp39-abi3-<platform>.whl``, of
   this clone's version) is installed; a wheel for another platform or
   version there is named and skipped.
2. Otherwise the wheel is built from this clone with pip (meson-python;
   needs a C compiler and Python's headers, checked first, each named with
   the fix when missing) and installed.
3. The installed package is imported in a fresh process to check it.

Exit status 0 when bulkhead is installed and imports, 1 on an unsupported
system, 2 when something needed is missing (nothing is installed then), 3
when pip or the check failed.  Nothing here needs more than the standard
library and pip.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.realpath(__file__))


def say(msg):
    print(f"[bulkhead install] {msg}", flush=True)


def fail(status, msg, fix):
    print(f"[bulkhead install] ERROR: {msg}\n[bulkhead install] Fix: {fix}", file=sys.stderr, flush=True)
    sys.exit(status)


def project_version():
    """meson.build's project version: the one source of the version."""
    with open(os.path.join(HERE, "meson.build"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*'bulkhead'.*?version\s*:\s*'([^']+)'", f.read(), re.S)
    if m is None:
        fail(2, f"no project version in {HERE}/meson.build", "use a complete clone of bulkhead")
    return m.group(1)


def _packaging():
    """packaging's tags and utils: the package where installed, else pip's copy."""
    try:
        from packaging import tags, utils
    except ImportError:
        from pip._vendor.packaging import tags, utils
    return tags, utils


def prebuilt_wheel(version):
    """The wheel in dist/ this interpreter takes, or None; says why it
    skips each other bulkhead wheel there."""
    tags, utils = _packaging()
    ours = set(tags.sys_tags())
    found = None
    for path in sorted(glob.glob(os.path.join(HERE, "dist", "*.whl"))):
        name = os.path.basename(path)
        try:
            dist, wheel_version, _build, wheel_tags = utils.parse_wheel_filename(name)
        except Exception as e:
            say(f"skipping dist/{name}: not a wheel's name ({e})")
            continue
        if dist != "bulkhead":
            continue
        if str(wheel_version) != version:
            say(f"skipping dist/{name}: version {wheel_version}, this clone is {version}")
        elif not (set(wheel_tags) & ours):
            say(f"skipping dist/{name}: built for {'.'.join(sorted(str(t) for t in wheel_tags))}, "
                f"which this Python cannot install (it takes e.g. {next(iter(tags.sys_tags()))})")
        elif found is None:
            found = path
    return found


def find_compiler():
    """The C compiler meson will use ($CC, else cc, gcc, clang), or None."""
    cc = os.environ.get("CC", "").split()
    if cc:
        return shutil.which(cc[0])
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build_env():
    """This environment, with this Python's scripts directory first on
    PATH: there meson and ninja are, when requirements.txt installed them
    into a venv that is not activated (as ComfyUI-Manager runs us)."""
    env = dict(os.environ)
    env["PATH"] = sysconfig.get_path("scripts") + os.pathsep + env.get("PATH", "")
    return env


def build_deps_present():
    """True when meson-python imports here and meson and ninja are on the
    build's PATH (requirements.txt installs them), so pip can build without
    fetching them again."""
    try:
        import mesonpy  # noqa: F401
    except ImportError:
        return False
    path = build_env()["PATH"]
    return all(shutil.which(tool, path=path) for tool in ("meson", "ninja"))


def pip(*args):
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    say("running: " + " ".join(cmd))
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=HERE, env=build_env())
    if rc != 0:
        fail(3, f"pip exited with status {rc} (its output is above)",
             "read pip's error above; then run `python install.py` again")
    say(f"pip done in {time.monotonic() - t0:.0f} s")


def check_installed(version):
    probe = ("import os, bulkhead, bulkhead._native; "
             "print(bulkhead.__version__, os.path.dirname(bulkhead.__file__))")
    # from a neutral directory, so neither the clone nor its custom_nodes/
    # (both directories named bulkhead) is what imports
    p = subprocess.run([sys.executable, "-c", probe], cwd=os.path.join(HERE, "web"), capture_output=True, text=True)
    if p.returncode != 0:
        fail(3, f"bulkhead was installed but does not import:\n{p.stderr.strip()}",
             "report this with the output above")
    got, where = p.stdout.split(maxsplit=1)
    if got != version:
        fail(3, f"the bulkhead that imports is {got} ({where.strip()}), not this clone's {version}",
             f"uninstall the other one (`{sys.executable} -m pip uninstall bulkhead`), then run install.py again")
    say(f"bulkhead {got} installed in {where.strip()}; restart ComfyUI to load it")


def main():
    if not sys.platform.startswith("linux"):
        fail(1, f"bulkhead runs on Linux only (this is {sys.platform}); ComfyUI still starts, "
                "and packs that use bulkhead run in-process", "none on this system")
    if sys.version_info < (3, 9):
        fail(1, f"bulkhead needs CPython 3.9 or later (this is {sys.version.split()[0]})",
             "run ComfyUI with a newer Python")
    version = project_version()
    say(f"bulkhead {version} into {sys.executable}")
    wheel = prebuilt_wheel(version)
    if wheel is not None:
        say(f"installing the prebuilt wheel dist/{os.path.basename(wheel)}")
        pip("--force-reinstall", "--no-deps", wheel)
        return check_installed(version)

    say("no prebuilt wheel for this platform in dist/: building one from this clone")
    cc = find_compiler()
    if cc is None:
        fail(2, "no C compiler found (looked for $CC, cc, gcc, clang on PATH); nothing was installed",
             "install one (Debian/Ubuntu: `apt install build-essential`; Fedora: `dnf install gcc`), "
             "or put a bulkhead wheel built for this platform in dist/, then run `python install.py` again")
    headers = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(headers, "Python.h")):
        fail(2, f"Python's C headers are missing (no Python.h in {headers}); nothing was installed",
             f"install them (Debian/Ubuntu: `apt install python{sys.version_info[0]}.{sys.version_info[1]}-dev`), "
             "then run `python install.py` again")
    say(f"compiler {cc}; Python headers {headers}")
    say("building the wheel (meson-python: C core, extension, command; about a minute)")
    isolation = ["--no-build-isolation"] if build_deps_present() else []
    if not isolation:
        say("meson-python, meson or ninja is not installed here (requirements.txt lists them): "
            "pip fetches them for the build")
    pip("--force-reinstall", "--no-deps", *isolation, HERE)
    return check_installed(version)


if __name__ == "__main__":
    main()
