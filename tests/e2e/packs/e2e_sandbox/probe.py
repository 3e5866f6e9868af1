"""Each escape a pack's sandbox must refuse and each action it must
allow, tried for real: ``run(targets)`` returns {what: "ok" or the error's
class and errno name}.  Run as a script (``python probe.py targets.json``)
it prints that as JSON: the node's grandchild does.  What succeeds is
undone (a file made is removed), and a ptrace is only tried where the
process ends right after (trace=True: a tracer that exits detaches)."""
import ctypes
import errno
import json
import os
import socket
import sys
import tempfile
import uuid


def _outcome(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return f"{type(e).__name__} {errno.errorcode.get(e.errno, e.errno)}"


def _write_new(d):
    """Makes a file in d (and d, where missing: a cache) and removes it."""
    def attempt():
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"bh-probe-{uuid.uuid4().hex}")
        with open(path, "w") as f:
            f.write("probe")
        os.remove(path)
    return attempt


def _append(path):
    def attempt():
        with open(path, "a") as f:
            f.write("")
    return attempt


def _read(path):
    def attempt():
        with open(path, "rb") as f:
            f.read(1)
    return attempt


def _kill(pid):
    return lambda: os.kill(pid, 0)


def _ptrace(pid):
    """PTRACE_SEIZE (does not stop the tracee); this process ends soon
    after, which detaches it."""
    def attempt():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        if libc.ptrace(0x4206, pid, None, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return attempt


def _proc_mem(pid):
    """Opening /proc/<pid>/mem: the kernel's ptrace attach check."""
    return lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))


def _connect(port):
    def attempt():
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    return attempt


def _abstract(name):
    def attempt():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect("\0" + name)
    return attempt


def _tmp():
    fd, path = tempfile.mkstemp()
    os.close(fd)
    os.remove(path)


def run(t, trace=True):
    home = t["home"]
    cache = os.environ.get("HF_HOME") or os.path.join(home, ".cache", "huggingface")
    tries = {
        # refused
        "write ~/.bashrc": _append(os.path.join(home, ".bashrc")),
        "read ~/.ssh/id_ed25519": _read(os.path.join(home, ".ssh", "id_ed25519")),
        "write ComfyUI's code": _write_new(t["comfy_code"]),
        "write another pack's folder": _write_new(t["other_pack"]),
        "write another pack's env": _write_new(t["other_env"]),
        "read another pack's env": _read(os.path.join(t["other_env"], "pyvenv.cfg")),
        "write bulkhead's package": _write_new(t["bulkhead_pkg"]),
        "write bulkhead's custom node": _write_new(t["bulkhead_node"]),
        "kill ComfyUI": _kill(t["host_pid"]),
        "kill another worker": _kill(t["other_pid"]),
        "ptrace ComfyUI": (_ptrace if trace else _proc_mem)(t["host_pid"]),
        "ptrace another worker": (_ptrace if trace else _proc_mem)(t["other_pid"]),
        "connect an abstract socket outside": _abstract(t["abstract"]),
        # allowed
        "write own folder": _write_new(t["own_dir"]),
        "write models": _write_new(t["models"]),
        "write output": _write_new(t["output"]),
        "write ComfyUI's temp": _write_new(t["comfy_temp"]),
        "write tmp": _tmp,
        "write a model cache": _write_new(cache),
        "read ComfyUI's code": _read(os.path.join(t["comfy_code"], "main.py")),
        "connect loopback": _connect(t["port"]),
    }
    return {what: _outcome(fn) for what, fn in tries.items()}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(run(json.load(f))))
