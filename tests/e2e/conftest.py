"""Fixtures for the tests from the user's side: ComfyUI server processes
with bulkhead and isolated packs in their custom_nodes/ (how they are
assembled, started and stopped: e2eenv.py)."""

import os
import subprocess
import sys

import pytest

from .e2eenv import BUILD, CLI, EXAMPLE_PACKS, HELPERS, Server, _shm, assemble, clone_into, run_manager_flow

class _Servers:
    """Starts servers under one directory and stops them all, checking what
    they leave.  Servers started from one share a ledger, as two ComfyUIs
    on a machine do."""

    def __init__(self, root):
        self.root = root
        self.made = []
        self.shm_before = _shm()
        self.ledger = str(root / "ledger")

    def start(self, packs=("e2e_pack",), example_packs=(), name="comfyui", env=None, bulkhead_home=None,
              installed=None, pack_dirs=(), wait_built=True):
        """installed: a (python, clone) pair from the manager_install
        fixture: the server runs that Python, bulkhead comes from its
        site-packages and the clone is the custom node.  pack_dirs: more
        packs to copy into custom_nodes/ (directories a test wrote).
        wait_built: return (and restart) only once no pack's environment
        builds in the background (Server.wait_built)."""
        base = str(self.root / name)
        python, clone = installed or (None, None)
        path = assemble(base, packs, example_packs, clone=clone, pack_dirs=pack_dirs)
        full = dict(os.environ)
        full.pop("COMFYUI_PATH", None)
        if installed:
            full.pop("BULKHEAD_BUILD", None)
        full.update({"PYTHONPATH": os.pathsep.join(path), "BULKHEAD_LEDGER": self.ledger,
                     "BH_E2E_HELPERS": HELPERS, "PYTHONUNBUFFERED": "1",
                     # the test packs import helpers from there (e2e_pack's HoldRam): their sandboxes may read it
                     "BULKHEAD_SANDBOX_READ": HELPERS,
                     "BULKHEAD_HOME": bulkhead_home or str(self.root / "bulkhead-home")})
        full.update(env or {})
        s = Server(base, full, self.ledger, python=python)
        s.wait_for_builds = wait_built
        self.made.append(s)
        return s.start()

    def close(self):
        errors = []
        for s in self.made:
            try:
                s.stop()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, "\n".join(errors)
        assert _shm() == self.shm_before, f"/dev/shm changed: {set(_shm()) ^ set(self.shm_before)}"


@pytest.fixture
def comfyui(tmp_path):
    """comfyui(packs=(...), example_packs=(...), name="a") -> a started
    Server; every one is stopped (and checked for leftovers) after the test.
    Servers of one test share a ledger, as two ComfyUIs on a machine do."""
    servers = _Servers(tmp_path)
    yield servers.start
    servers.close()


@pytest.fixture(scope="module")
def comfyui_module(tmp_path_factory):
    """comfyui, once for a module: its servers are stopped (and checked)
    after the module's last test.  For tests that only read what a server
    serves, or change nothing another test of the module reads: a server
    start costs seconds."""
    servers = _Servers(tmp_path_factory.mktemp("comfyui"))
    yield servers.start
    servers.close()


@pytest.fixture(scope="session")
def example_envs():
    """BULKHEAD_HOME with the example packs' environments built (`bulkhead
    install`, as `make demo` does): build/e2e-home, kept between runs, so
    only the first run pays for pip."""
    home = os.environ.get("BULKHEAD_E2E_HOME") or os.path.join(os.path.dirname(BUILD), "e2e-home")
    env = dict(os.environ, BULKHEAD_HOME=home, BULKHEAD_PYTHON=sys.executable)
    for pack in ("old_numpy_pack", "new_numpy_pack"):
        r = subprocess.run([CLI, "install", os.path.join(EXAMPLE_PACKS, pack)], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip(f"`bulkhead install examples/packs/{pack}` failed (an interpreter or PyPI "
                        f"missing?):\n{r.stderr[-2000:]}")
    return home


@pytest.fixture(scope="session")
def manager_install(tmp_path_factory):
    """bulkhead installed as ComfyUI-Manager installs it, once per session:
    a fresh venv standing for ComfyUI's own Python (ComfyUI's requirements
    -- torch, aiohttp, ... -- are this test venv's, reached through a .pth,
    as a ComfyUI venv has them installed), a clone of this repository in a
    custom_nodes/ folder, `pip install -r requirements.txt`, then `python
    install.py`.  Returns (python, clone)."""
    import sysconfig
    root = tmp_path_factory.mktemp("manager")
    venv = root / "comfy-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "comfyui-requirements.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    clone = clone_into(str(root / "custom_nodes"))
    with open(root / "install.log", "w") as log:
        run_manager_flow(clone, python, log)
    return python, clone
