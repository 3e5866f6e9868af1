"""What another local user can do to a bulkhead host (issue 17, items 1
and 10): the attacker is ``nobody``, the victim a test user made here
(``bhvictim``), each run in its own process through ``setpriv``.  The host
under attack runs from a copy of the built package in a directory that
holds more than ``bulkhead`` (as site-packages does), so its workers get a
package root of their own.  Needs root (to make the user and switch to
both uids): skipped with a message otherwise.  /work/isolate gives /tmp
and /dev/shm of our own; the tests clean what they make there.
"""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

import bulkhead

VICTIM = "bhvictim"
ATTACKER_UID = 65534  # nobody
HOST_PY = "/usr/bin/python3"  # readable by every user (pyenv's live under /root, 0700)


def _victim():
    if os.geteuid() != 0:
        pytest.skip("local-user tests need root (to make a victim user and switch uids)")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is missing")
    if not os.access(HOST_PY, os.X_OK):
        pytest.skip(f"{HOST_PY} is missing: no interpreter every user can run")
    try:
        return pwd.getpwnam(VICTIM)
    except KeyError:
        pass
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", VICTIM],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make the victim user {VICTIM}: {r.stderr.strip()}")
    return pwd.getpwnam(VICTIM)


def _as(uid, gid, argv, **kw):
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"] + argv


@pytest.fixture
def site():
    """A shared directory (0755) with a copy of the built bulkhead package
    and something else beside it; removed afterwards with everything the
    tests made under /tmp and /dev/shm for the victim."""
    victim = _victim()
    top = tempfile.mkdtemp(prefix="bh-localuser-", dir="/tmp")
    os.chmod(top, 0o755)
    src = os.path.dirname(bulkhead.__file__)
    for name in ("a", "b"):
        d = os.path.join(top, name)
        shutil.copytree(src, os.path.join(d, "bulkhead"), ignore=shutil.ignore_patterns("*.p", "__pycache__"))
        with open(os.path.join(d, "other_module.py"), "w") as f:
            f.write("")
        subprocess.run(["chmod", "-R", "a+rX", d], check=True)
    shared = os.path.join(top, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    paths = [f"/tmp/bulkhead-{victim.pw_uid}", f"/dev/shm/bulkhead-{victim.pw_uid}",
             f"/dev/shm/bulkhead-ledger-{victim.pw_uid}"]
    for p in paths:
        subprocess.run(["rm", "-rf", p])
    yield victim, top, shared
    mine = [os.path.join("/tmp", n) for n in os.listdir("/tmp") if n.startswith(f"bulkhead-{victim.pw_uid}-")]
    for p in paths + mine + [top]:
        subprocess.run(["rm", "-rf", p])


def _env(extra=None):
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if os.environ.get("BULKHEAD_ASAN"):  # the extension is built under ASan: its runtime goes first
        for name in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "BULKHEAD_ASAN"):
            if name in os.environ:
                env[name] = os.environ[name]
    env.update(extra or {})
    return env


VICTIM_HOST = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bulkhead.host.workers import Worker
w = Worker(sys.argv[2], name="victim", output=False)
try:
    print("gen1", w.call("os:getpid"), flush=True)
    sys.stdin.readline()          # the attacker acts here
    w.close()
    print("gen2", w.call("os:getpid"), flush=True)
except Exception as e:
    print("ERR", type(e).__name__, str(e).replace("\n", " "), flush=True)
finally:
    w.close()
"""

PLANT = r"""
import os, sys
shared, victim_uid = sys.argv[1], sys.argv[2]
os.umask(0)
base = f"/tmp/bulkhead-{victim_uid}"
if sys.argv[3] == "squat":
    pkg = os.path.join(shared, "evil", "bulkhead")
    os.makedirs(os.path.join(pkg, "worker"))
    body = f"open({os.path.join(shared, 'pwned')!r}, 'w').write('ran as ' + str(__import__('os').getuid()))\n"
    for f in ("__init__.py", "worker/__init__.py", "worker/__main__.py"):
        open(os.path.join(pkg, f), "w").write(body)
    os.mkdir(base, 0o777)
    os.mkdir(os.path.join(base, "bulkhead-pkgroot"), 0o777)
    os.mkdir(f"{base}-999999999-x", 0o777)  # the victim's naming, a pid that is gone: not theirs to sweep
    open(f"{base}-999999999-x/keep", "w").close()
else:  # swap every package link the victim left where we can write
    pkg = os.path.join(shared, "evil", "bulkhead")
    for root, dirs, files in [w for d in os.listdir("/tmp") if d.startswith(os.path.basename(base))
                              for w in os.walk(os.path.join("/tmp", d))]:
        for name in dirs + files:
            if name == "bulkhead":
                link = os.path.join(root, name)
                try:
                    os.symlink(pkg, link + ".evil")
                    os.replace(link + ".evil", link)
                    print("swapped", link)
                except OSError as e:
                    print("could not swap", link, e)
"""


def test_another_user_cannot_plant_the_workers_bulkhead_nor_disable_the_workers(site):
    """Item 1's probe, and #24 M4: nobody pre-creates /tmp/bulkhead-<victim>/
    and its bulkhead-pkgroot mode 0777 with a planted package (and a
    /tmp/bulkhead-<victim>-<pid>-x of theirs for every pid), then swaps
    every link the victim's host leaves under /tmp.  No worker of the
    victim imports the planted package, and the victim's workers start as
    if nobody had: its directory is one of its own, of a name nobody can
    make first (main refused the squatted one, so every worker start
    failed)."""
    victim, top, shared = site
    v, g = victim.pw_uid, victim.pw_gid
    plant = os.path.join(shared, "plant.py")
    host = os.path.join(shared, "host.py")
    with open(plant, "w") as f:
        f.write(PLANT)
    with open(host, "w") as f:
        f.write(VICTIM_HOST)
    subprocess.run(_as(ATTACKER_UID, ATTACKER_UID, [HOST_PY, plant, shared, str(v), "squat"]),
                   check=True, env=_env(), timeout=30)
    p = subprocess.Popen(_as(v, g, [HOST_PY, host, os.path.join(top, "a"), HOST_PY]), env=_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = p.stdout.readline()
        swapped = ""
        if first.startswith("gen1"):
            swapped = subprocess.run(_as(ATTACKER_UID, ATTACKER_UID, [HOST_PY, plant, shared, str(v), "swap"]),
                                     env=_env(), timeout=30, capture_output=True, text=True).stdout
        out, _ = p.communicate("go\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = first + out
    pwned = os.path.join(shared, "pwned")
    assert not os.path.exists(pwned), f"a worker of the victim ran the planted package: {out}"
    assert first.startswith("gen1 ") and "gen2 " in out and "ERR" not in out, out
    assert "swapped" not in swapped, swapped  # nothing of the victim's was where nobody could write
    assert os.path.exists(f"/tmp/bulkhead-{v}-999999999-x/keep"), "the victim swept another user's directory"
    assert not [n for n in os.listdir("/tmp") if n.startswith(f"bulkhead-{v}-") and os.lstat(
        os.path.join("/tmp", n)).st_uid == v], "the victim's directory outlived its host"


FRESH = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from bulkhead.host import controlclient, workerenv
root = workerenv.worker_pythonpath()
print("root", root, os.listdir(root), os.path.dirname(os.path.realpath(os.path.join(root, "bulkhead", "__init__.py"))))
print("control", controlclient.control_dir())
for d in (controlclient.control_dir(), root):
    print("mode", d, oct(os.lstat(d).st_mode & 0o777))
print("pid", os.getpid())
"""


def test_a_fresh_private_dir_is_0700_and_the_control_socket_accepts_it(site):
    """The package root made first leaves the process's directory 0700, so
    control_dir() takes it after (main once left it 0755 through makedirs
    and refused it then); both go at exit."""
    victim, top, shared = site
    script = os.path.join(shared, "fresh.py")
    with open(script, "w") as f:
        f.write(FRESH)
    r = subprocess.run(_as(victim.pw_uid, victim.pw_gid, [HOST_PY, script, os.path.join(top, "a")]),
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    pid = r.stdout.split("pid ")[1].split()[0]
    base = r.stdout.split("control ")[1].split()[0]
    assert base.startswith(f"/tmp/bulkhead-{victim.pw_uid}-{pid}-"), r.stdout
    assert f"mode {base} 0o700" in r.stdout, r.stdout
    root = r.stdout.split()[1]
    assert os.path.dirname(root) == base and f"mode {root} 0o700" in r.stdout, r.stdout
    assert f"['bulkhead'] {os.path.join(top, 'a', 'bulkhead')}" in r.stdout, r.stdout
    assert not os.path.exists(root) and not os.path.exists(base), "the package root outlived its host"


TWO = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from bulkhead.host import workerenv
root = workerenv.worker_pythonpath()
print(root, flush=True)
sys.stdin.readline()  # the other install's host starts here
print(os.path.dirname(os.path.realpath(os.path.join(root, "bulkhead", "__init__.py"))), flush=True)
"""


def test_two_installs_do_not_repoint_each_others_workers(site):
    """Two hosts of one user, from two installs (two versions, say): each
    one's workers import its own bulkhead, whichever started last."""
    victim, top, shared = site
    script = os.path.join(shared, "two.py")
    with open(script, "w") as f:
        f.write(TWO)
    run = lambda name: subprocess.Popen(
        _as(victim.pw_uid, victim.pw_gid, [HOST_PY, script, os.path.join(top, name)]), env=_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    a = run("a")
    try:
        a.stdout.readline()
        b = run("b")
        b_root = b.stdout.readline()
        b_out, _ = b.communicate("\n", timeout=30)
        a_out, _ = a.communicate("\n", timeout=30)
    finally:
        for p in (a,):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert a_out.strip() == os.path.join(top, "a", "bulkhead"), a_out
    assert b_out.strip() == os.path.join(top, "b", "bulkhead"), b_root + b_out


LEDGER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from bulkhead import _native
try:
    l = _native.Ledger()
except OSError as e:
    print("ERR", e)
else:
    print("OK", l.path)
    l.close()
"""


def _ledger_as_victim(victim, top, shared, env=None):
    script = os.path.join(shared, "ledger.py")
    with open(script, "w") as f:
        f.write(LEDGER)
    r = subprocess.run(_as(victim.pw_uid, victim.pw_gid, [HOST_PY, script, os.path.join(top, "a")]),
                       env=_env(env), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_another_user_cannot_squat_the_ledger_name(site):
    """Item 10: nobody makes the ledger's old name (a file of theirs) and a
    /tmp/bulkhead-<victim> of theirs before the victim's first host: the
    victim's ledger opens (main refused it: the host ran outside the
    budget, the CLI exited 5)."""
    victim, top, shared = site
    v = victim.pw_uid
    squat = (f"import os; os.umask(0); open('/dev/shm/bulkhead-ledger-{v}', 'w').close(); "
             f"os.chmod('/dev/shm/bulkhead-ledger-{v}', 0o600)")
    subprocess.run(_as(ATTACKER_UID, ATTACKER_UID, [HOST_PY, "-c", squat]), check=True, env=_env(), timeout=30)
    out = _ledger_as_victim(victim, top, shared)
    assert out == f"OK /dev/shm/bulkhead-{v}/ledger", out
    st = os.lstat(f"/dev/shm/bulkhead-{v}")
    assert st.st_uid == v and st.st_mode & 0o777 == 0o700


def test_a_squatted_ledger_directory_is_named_or_avoided(site):
    """nobody takes the new name too (/dev/shm/bulkhead-<victim>, 0777):
    with a private XDG_RUNTIME_DIR the ledger goes there, and the CLI finds
    the same one; without, the error names the squatter's uid and the fix."""
    victim, top, shared = site
    v = victim.pw_uid
    subprocess.run(_as(ATTACKER_UID, ATTACKER_UID, [HOST_PY, "-c",
                                                   f"import os; os.umask(0); os.mkdir('/dev/shm/bulkhead-{v}', 0o777)"]),
                   check=True, env=_env(), timeout=30)
    out = _ledger_as_victim(victim, top, shared)
    assert out.startswith("ERR") and f"/dev/shm/bulkhead-{v}" in out, out
    assert f"owner uid {ATTACKER_UID}" in out and "XDG_RUNTIME_DIR" in out, out
    run = os.path.join(top, "run")
    os.mkdir(run, 0o700)
    os.chown(run, v, victim.pw_gid)
    out = _ledger_as_victim(victim, top, shared, {"XDG_RUNTIME_DIR": run})
    assert out == f"OK {run}/bulkhead-ledger", out
    cli = os.path.join(os.environ.get("BULKHEAD_BUILD", "build/rel"), "tools", "bulkhead")
    if os.access(cli, os.X_OK):
        code = (f"import subprocess, sys; sys.path.insert(0, {os.path.join(top, 'a')!r}); "
                f"from bulkhead import _native; l = _native.Ledger(); l.join('host'); "
                f"print(subprocess.run([{os.path.abspath(cli)!r}, 'status', '--json'], capture_output=True, "
                f"text=True).stdout); l.close()")
        r = subprocess.run(_as(v, victim.pw_gid, [HOST_PY, "-c", code]), env=_env({"XDG_RUNTIME_DIR": run}),
                           capture_output=True, text=True, timeout=60)
        assert f'"ledger": "{run}/bulkhead-ledger"' in r.stdout, r.stdout + r.stderr
