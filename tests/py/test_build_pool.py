"""#36: ComfyUI's background builds side by side, bounded by what each
command waits for (host/building.py ``_Gate``, envs.build ``gate``): a
command that downloads takes its index's one download stream, any other
one of the CPU slots.  Which indexes an installer command reaches is read
from its arguments and environment (envs.build ``indexes_of``).  The gate
is driven with real commands through envs.build's own runner, each one
seeing which others run beside it (marker files, no timing).  The pool's
builds (host/building.py ``submit``) each hold a CPU slot while at work,
their steps beside their commands included, and none while they wait for
another install's lock or download."""

import os
import sys
import threading
import time

import pytest

from bulkhead.envs import build as envs
from bulkhead.host import building

PYPI = envs.DEFAULT_INDEX


@pytest.mark.parametrize("cmd, env, expect", [
    (["uv", "pip", "install", "--python", "/e/bin/python", "humanize"], {}, [PYPI]),
    (["/e/bin/python", "-m", "pip", "install", "--no-input", "x"], {}, [PYPI]),
    (["/usr/bin/uv", "pip", "install", "--index-url", "https://tok@a.example/simple/", "x"], {},
     ["https://****@a.example/simple"]),
    (["uv", "pip", "install", "--extra-index-url=https://b.example/whl", "x"], {"UV_INDEX_URL": "https://m.example"},
     ["https://b.example/whl", "https://m.example"]),
    (["/e/bin/python", "-m", "pip", "install", "x"], {"PIP_INDEX_URL": "https://p.example/simple",
                                                      "PIP_FIND_LINKS": "/some/folder https://w.example/links"},
     ["https://p.example/simple", "https://w.example/links"]),
    (["uv", "pip", "install", "--no-index", "--find-links", "/wheels", "x"], {}, []),
    (["uv", "pip", "install", "--offline", "x"], {}, []),
    (["uv", "venv", "--python", "/usr/bin/python3", "/e"], {}, []),
    (["uv", "pip", "uninstall", "--python", "/e/bin/python", "x"], {}, []),
])
def test_the_indexes_a_command_downloads_from(cmd, env, expect):
    assert envs.indexes_of(cmd, env) == expect


# A command that shows what runs beside it: it puts its marker in DIR,
# acknowledges each other command's marker it sees (ack-<that>-<me>),
# waits (at most 60 s, a bound, not a timing) until it has seen a name
# starting with each of the prefixes it is told to wait for, and prints
# the other commands it saw running.
WATCHER = r"""
import os, sys, time
d, me, wants = os.environ["BH_POOL_DIR"], os.environ["BH_POOL_ME"], os.environ["BH_POOL_WANTS"].split()
open(os.path.join(d, me), "w").close()
if os.environ.get("BH_POOL_SAY"):
    print(os.environ["BH_POOL_SAY"], flush=True)
seen, deadline = set(), time.monotonic() + 60
while True:
    now = set(os.listdir(d)) - {me}
    for n in now - seen:
        if "-" not in n:
            open(os.path.join(d, f"ack-{n}-{me}"), "w").close()
    seen |= now
    if all(any(s.startswith(w) for s in seen) for w in wants) or time.monotonic() > deadline:
        break
    time.sleep(0.01)
os.unlink(os.path.join(d, me))
print("saw", " ".join(sorted(n for n in seen if "-" not in n)))
"""


def test_one_download_per_index_and_one_command_per_cpu_slot(tmp_path, monkeypatch):
    """CPU slots 1.  B1 downloads from index B until it has seen both
    downloads from index A run (one after the other: A's one stream, the
    first held until the second says it waits);
    they, and the two CPU commands (one after the other: one slot), each
    wait to see B1 run beside them: more commands at once than CPU slots
    where they download, and no two on one index's stream or one slot."""
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setattr(envs, "gate", building._Gate(1))
    dl = {"A": "https://a.example/simple", "B": "https://b.example/simple"}
    # Each A waits until B1 has seen it (its ack) and until one A says it
    # waits for the stream (its "W-" marker: the first holds it till then);
    # B1 until both C's have seen it.
    runs = {"A1": ("A", "B1 ack-A1-B1 W-A"), "A2": ("A", "B1 ack-A2-B1 W-A"),
            "B1": ("B", "A1 A2 ack-B1-C1 ack-B1-C2"), "C1": (None, "B1"), "C2": (None, "B1")}
    said, errors = {}, []

    def run(me, index, wants):
        cmd = [sys.executable, "-c", WATCHER] + (["pip", "install", "--index-url", dl[index], "x"] if index else [])
        env = dict(os.environ, BH_POOL_DIR=str(markers), BH_POOL_ME=me, BH_POOL_WANTS=wants)
        lines = said.setdefault(me, [])

        def progress(line):
            lines.append(line)
            if line.startswith("waiting for"):
                (markers / f"W-{me}").touch()
        try:
            envs._stream(cmd, progress, me, env=env)
        except Exception as e:  # the assertion below shows it
            errors.append(f"{me}: {e}")

    threads = [threading.Thread(target=run, args=(me, index, wants)) for me, (index, wants) in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    seen = {me: next(line for line in lines if line.startswith("saw")).split()[1:] for me, lines in said.items()}
    assert {"A1", "A2"} <= set(seen["B1"]), seen           # B's stream held while A's two ran
    for me in ("A1", "A2", "C1", "C2"):
        assert "B1" in seen[me], seen                       # beside a download of another index
    assert "A2" not in seen["A1"] and "A1" not in seen["A2"], seen     # one stream per index
    assert "C2" not in seen["C1"] and "C1" not in seen["C2"], seen     # one CPU slot
    waited = [line for me in ("A1", "A2") for line in said[me] if line.startswith("waiting for the download stream")]
    assert waited == [f"waiting for the download stream of {dl['A']} (one build at a time downloads from it)"], said


def test_a_download_lets_its_stream_go_once_the_installer_says_so(tmp_path, monkeypatch):
    """Two downloads from one index, each saying uv's "Prepared 1
    package" at once and then waiting until it has seen the other run:
    the second starts while the first still runs (it installs), which one
    stream per index for the whole command would not let happen."""
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setattr(envs, "gate", building._Gate(1))
    said, errors = {}, []

    def run(me, other):
        cmd = [sys.executable, "-c", WATCHER, "pip", "install", "--index-url", "https://a.example/simple", "x"]
        env = dict(os.environ, BH_POOL_DIR=str(markers), BH_POOL_ME=me, BH_POOL_WANTS=f"ack-{me}-{other}",
                   BH_POOL_SAY="Prepared 1 package in 1ms")
        try:
            envs._stream(cmd, said.setdefault(me, []).append, me, env=env)
        except Exception as e:  # the assertion below shows it
            errors.append(f"{me}: {e}")

    threads = [threading.Thread(target=run, args=pair) for pair in (("D1", "D2"), ("D2", "D1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    seen = {me: next(line for line in lines if line.startswith("saw")).split()[1:] for me, lines in said.items()}
    assert seen == {"D1": ["D2"], "D2": ["D1"]}, said


# --- the pool's builds: what each holds while it waits ---

class _Pack:
    """What submit reads of a pack's config: its name."""

    def __init__(self, name):
        self.name = name


def _submit(tmp_path, name, work):
    return building.submit(_Pack(name), "new", str(tmp_path / "envs" / name), str(tmp_path / name), "auto", work)


def test_builds_waiting_for_another_install_keep_no_other_build_waiting(tmp_path, monkeypatch):
    """Nine builds wait for the lock of their environment, which another
    install holds (this test: the lock envs.build takes, on the file
    `bulkhead install` locks too); more than the pool had threads (eight).
    A tenth build, of another environment, runs meanwhile, on the one CPU
    slot: the waiting ones hold none.  Once the lock is let go they go on."""
    monkeypatch.setattr(envs, "gate", building._Gate(1))
    lock_path = str(tmp_path / ".env.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_EX)

    def waits(b):
        with envs._Lock(lock_path, b.progress, b.name):
            envs._stream([sys.executable, "-c", "pass"], b.progress, b.name)

    try:
        waiting = [_submit(tmp_path, f"waits{k}", waits) for k in range(9)]
        other = _submit(tmp_path, "other", lambda b: envs._stream([sys.executable, "-c", "print('built')"],
                                                                  b.progress, b.name))
        assert building.wait([other], 60), [(b.name, b.phase, b.known) for b in waiting + [other]]
        assert other.error is None and other.known == "built", (other.error, other.known)
        assert not any(b.done() for b in waiting)
        assert all(b.phase.startswith(building.LOCK_WAIT + b.name) for b in waiting), [b.phase for b in waiting]
    finally:
        os.close(fd)
    assert building.wait(waiting, 60), [(b.name, b.phase, b.known) for b in waiting]
    assert not [b.error for b in waiting if b.error], [b.error for b in waiting]


def test_a_builds_work_after_its_commands_holds_its_cpu_slot(tmp_path, monkeypatch):
    """A build's work beside its commands (its pack described in a worker
    once built) works the CPU too: on one CPU slot, a build submitted
    while the first one's work goes on after its command waits for it
    (says so) rather than run its command beside it."""
    monkeypatch.setattr(envs, "gate", building._Gate(1))
    ran = tmp_path / "second-ran"
    describing, second, seen = threading.Event(), [], []

    def first(b):
        envs._stream([sys.executable, "-c", "pass"], b.progress, b.name)
        describing.set()
        deadline = time.monotonic() + 60      # a bound, not a timing
        while time.monotonic() < deadline:
            if ran.exists():
                seen.append("ran beside")
                return
            if second and second[0].known.startswith("waiting for a CPU slot"):
                seen.append("waited")
                return
            time.sleep(0.01)

    a = _submit(tmp_path, "first", first)
    assert describing.wait(60)
    second.append(_submit(tmp_path, "second", lambda b: envs._stream(
        [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"], b.progress, b.name)))
    assert building.wait([a, second[0]], 120)
    assert seen == ["waited"] and ran.exists(), (seen, second[0].known)


def test_a_build_that_downloads_lets_its_cpu_slot_go(tmp_path, monkeypatch):
    """On one CPU slot, a build's download and another build's CPU
    command run at once (each waits until it has seen the other): a
    download holds its index's stream, not the build's CPU slot."""
    monkeypatch.setattr(envs, "gate", building._Gate(1))
    markers = tmp_path / "markers"
    markers.mkdir()
    said = {}

    def run(me, wants, download):
        def work(b):
            cmd = [sys.executable, "-c", WATCHER] + (["pip", "install", "--index-url", "https://a.example/simple",
                                                      "x"] if download else [])
            env = dict(os.environ, BH_POOL_DIR=str(markers), BH_POOL_ME=me, BH_POOL_WANTS=wants)
            envs._stream(cmd, said.setdefault(me, []).append, me, env=env)
        return work

    bs = [_submit(tmp_path, "downloads", run("A1", "ack-A1-C1", True)),
          _submit(tmp_path, "works", run("C1", "ack-C1-A1", False))]
    assert building.wait(bs, 120)
    assert [b.error for b in bs] == [None, None], [b.error for b in bs]
    seen = {me: next(line for line in lines if line.startswith("saw")).split()[1:] for me, lines in said.items()}
    assert seen == {"A1": ["C1"], "C1": ["A1"]}, said
