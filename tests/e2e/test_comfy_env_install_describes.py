"""#36: a pack written for comfy-env whose install.py calls
``comfy_env.install()`` -- bulkhead's, where comfy_env is routed to it
(host/comfy_env.py) -- describes the pack's nodes into the node metadata
cache as ``bulkhead.install()`` does, so that ComfyUI's next start
registers them from the cache and starts no worker to describe them, and
/object_info lists them exactly as ComfyUI's process does."""

import os
import subprocess

from .e2eenv import HOST_MM, start_from_cache, unbuilt_server, write

NAME = "ComfyUI-CeDescribed"

INIT = '''
from comfy_env import register_nodes
NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = register_nodes()
'''

NODES = '''
import os


class E2ECeDescribed:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"n": ("INT", {"default": 3, "min": 0})}, "optional": {"mode": (["a", "b"],)}}
    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "e2e/described"

    def run(self, n, mode="a"):
        return {"ui": {"pid": [os.getpid()]}, "result": (2 * n,)}


NODE_CLASS_MAPPINGS = {"E2ECeDescribed": E2ECeDescribed}
NODE_DISPLAY_NAME_MAPPINGS = {"E2ECeDescribed": "E2E comfy-env pack described at install"}
'''

INSTALL_PY = '''
from comfy_env import install
install()
'''

# install.py run as in ComfyUI's process, where `import comfy_env` is
# bulkhead's (route(): what bulkhead's prestartup step does).
ROUTED = ("import runpy; from bulkhead.host import comfy_env; comfy_env.route(); "
          "runpy.run_path('install.py', run_name='__main__')")


def test_comfy_env_install_fills_the_metadata_cache(comfyui, tmp_path):
    pack = tmp_path / "repos" / NAME
    write(pack / "__init__.py", INIT)
    write(pack / "nodes" / "__init__.py", NODES)
    write(pack / "nodes" / "comfy-env.toml", f'python = "{HOST_MM}"\n')
    write(pack / "install.py", INSTALL_PY)
    # a start that builds nothing: the pack is not isolated, nothing is
    # described.  Its home is deep: the pack's load line cuts the
    # interpreter's path, never its name, count or metadata's source.
    home = tmp_path / ("a-long-folder-name-" * 8) / "bulkhead"
    srv = unbuilt_server(comfyui, pack, bulkhead_home=str(home))
    # the real answer: its node as ComfyUI's process lists it (not built: imported here for its definition)
    status, info = srv.http("GET", "/object_info")
    assert status == 200 and "E2ECeDescribed" in info
    in_process = info["E2ECeDescribed"]
    srv.stop()
    here = os.path.join(srv.base, "custom_nodes", NAME)
    run = subprocess.run([srv.python, "-c", ROUTED], cwd=here, env=srv.env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "1 node(s) described: ComfyUI's next start registers them from the cache" in run.stderr, \
        run.stderr[-3000:]

    # the next start: isolated, its nodes from the cache, no worker
    # started to describe them; its line at most 200 characters
    line, cached = start_from_cache(srv, NAME, "E2ECeDescribed")
    assert len(line) <= 200 and cached == in_process, line
