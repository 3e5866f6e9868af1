"""Environments are built with uv by default (#40: it built a numpy-only
environment in under a second where pip took 15-45 s): bulkhead's
requirements.txt installs uv beside ComfyUI's Python, whose bin/ a
ComfyUI started as venv/bin/python main.py does not have on PATH, so the
one beside the host's Python is found there; pip stays the fallback and
BULKHEAD_INSTALLER=pip's choice."""

import os
import shutil
import subprocess
import sys

import pytest

CODE = "from bulkhead.envs.interpreters import find_uv; print(find_uv() or '')"
BARE_PATH = "/usr/bin:/bin"


def _find_uv(**env):
    e = {k: v for k, v in os.environ.items() if k != "BULKHEAD_INSTALLER"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", CODE], env=e, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_uv_installed_beside_the_host_python_is_found_off_path():
    uv = pytest.importorskip("uv", reason="the tests' .venv installs uv (make check's .stamp-uv)")
    if shutil.which("uv", path=BARE_PATH):
        pytest.skip(f"a uv on {BARE_PATH} would be found first")
    got = _find_uv(PATH=BARE_PATH)
    assert got and os.path.realpath(got) == os.path.realpath(uv.find_uv_bin())
    assert _find_uv(PATH=BARE_PATH, BULKHEAD_INSTALLER="pip") == ""
