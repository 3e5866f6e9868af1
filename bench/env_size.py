"""The size of a numpy-only pack's environment under the host's Python
minor and under another one (#36's lean-environment target).

Under the host's minor an environment shares the host's matched set
(torch, ComfyUI's requirements) read-only through a symlink farm, so its
own directory is small and what its worker sees is the farm's files;
under another minor the matched set is installed into it, less what only
ComfyUI's server uses (hostmatch.SERVER_ONLY) and, where no torch for that
minor is reachable, less torch and what needs it.  The target: the
environment under another minor, less its torch (where it got one), is at
most 1.5x what the worker under the host's minor sees less the host's
torch -- "at most 1.5x its size under the host's minor plus torch's own
wheel", with both sizes counted as what a worker has on its path.

Opt-in, not part of `make check` or `make bench`: it installs ComfyUI's
requirements for the other minor (hundreds of MB from PyPI or the mirror
pip is configured for).  Run from the repository root after a build::

    PATH=$PWD/.venv/bin:$PATH PYTHONPATH=$PWD/build/rel/python \\
        .venv/bin/python bench/env_size.py --comfyui /path/to/ComfyUI --other 3.12

Prints one JSON object (sizes in bytes, the ratio, whether the target is
met) and exits 1 when it is not.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def du(path, follow=False):
    """Bytes of the files under path (each inode once); through symlinks
    when ``follow``."""
    seen, total = set(), 0
    for dp, dns, fns in os.walk(path, followlinks=follow):
        for n in fns:
            p = os.path.join(dp, n)
            try:
                st = os.stat(p) if follow else os.lstat(p)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def build(home, comfyui, minor):
    pack = os.path.join(home, "packs", f"numpy{minor}")
    os.makedirs(pack, exist_ok=True)
    with open(os.path.join(pack, "comfy-env.toml"), "w") as f:
        f.write(f'python = "{minor}"\nrequirements = ["numpy"]\n')
    env = dict(os.environ, BULKHEAD_HOME=home, COMFYUI_PATH=comfyui)
    r = subprocess.run([sys.executable, "-m", "bulkhead", "install", pack], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        sys.exit(f"bulkhead install of a numpy-only pack under {minor} failed:\n{r.stdout[-4000:]}")
    from bulkhead.envs import build as envs, config as packconfig
    [c] = packconfig.load_configs(pack, warn=False)
    return envs.env_dir(c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", required=True, help="the ComfyUI whose requirements.txt the host matches")
    ap.add_argument("--other", required=True, help="another Python minor, e.g. 3.12")
    ap.add_argument("--home", help="BULKHEAD_HOME to build in (default: a temporary one, removed)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    host_mm = "%d.%d" % sys.version_info[:2]
    tmp = None
    home = a.home
    if not home:
        tmp = tempfile.TemporaryDirectory(prefix="bulkhead-env-size-")
        home = tmp.name
    os.environ["BULKHEAD_HOME"] = home      # where envs.env_dir looks too
    same = build(home, a.comfyui, host_mm)
    other = build(home, a.comfyui, a.other)
    from bulkhead.envs import build as envs
    farm = envs.read_stamp(same)["host"].get("farm")
    torch_dirs = [os.path.join(other, "lib", f"python{a.other}", "site-packages", n) for n in ("torch", "torch.libs")]
    out = {
        "host_minor": host_mm, "other_minor": a.other,
        "same_minor_env_bytes": du(same),
        "same_minor_seen_bytes": du(same) + (du(farm, follow=True) if farm else 0),
        "same_minor_torch_bytes": du(os.path.join(farm, "torch"), follow=True) if farm else 0,
        "other_minor_env_bytes": du(other),
        "other_minor_torch_bytes": sum(du(d) for d in torch_dirs if os.path.isdir(d)),
        "other_minor_lacking": sorted(envs.read_stamp(other)["host"].get("lacking") or {}),
    }
    seen = out["same_minor_seen_bytes"] - out["same_minor_torch_bytes"]
    out["ratio"] = round((out["other_minor_env_bytes"] - out["other_minor_torch_bytes"]) / max(1, seen), 3)
    out["target_met"] = out["ratio"] <= 1.5
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0 if out["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
