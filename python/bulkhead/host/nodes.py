"""Isolated node packs in ComfyUI: the host side's one call.

A pack's ``__init__.py`` (in the host) makes one call::

    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = load_pack(pack_dir, python)

and gets proxy classes, whose calls run the real nodes in the pack's worker
(host/runtime.py: the proxies, ``PackRuntime`` and the call path).

``fallback(pack_dir, reason)`` imports a pack in-process instead, with one
warning per pack naming the reason and the fix; load_pack uses it when it
finds no ComfyUI or no built environment, and the config layer calls it for
its own reasons (``REASONS``).  It lives in host/states.py, with the record
of where each pack stands (``pack_states``: /bulkhead/status, the panel).

This module only reads ComfyUI's state; it never assigns to a comfy module.
"""

import logging
import os

from ..channel import spec
from ..packimport import import_nodes, in_worker
from . import idle, prewarm, sandbox, states
from .runtime import PackRuntime, find_comfyui
from .states import ENV_NOT_BUILT, NO_COMFYUI, fallback, runtimes, set_state

log = logging.getLogger("bulkhead")


def load_pack(pack_dir, python, *, name=None, env=None, options=None, memory=None):
    """NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS of an isolated pack.

    pack_dir: the pack's directory (its node classes in ``nodes.py`` /
    ``nodes/``, or options['module'], or None for the package's own
    ``__init__``); python: the pack environment's interpreter; name: the
    pack's name in logs and handles (default: the directory's name); env:
    variables set in the worker only.  options: the pack's settings, a
    channel/spec.py Settings record (a mapping is made into one, each row's
    default where it gives none): its [bulkhead] options --
    'start_timeout_s', 'call_timeout_s', 'release_timeout_s' (seconds:
    Worker's), 'interrupt_grace_s' (seconds a node may run on after the stop
    button before its worker is stopped; 0: never), 'prewarm' ('prompt':
    start the worker when a prompt whose nodes of the pack will execute
    starts, ComfyUI's cache deciding (host/prewarm.py), the default;
    'startup': now, in the background; 'off'), 'idle_exit_s' -- and what
    the caller adds: 'stamp' (the environment's identity for the metadata
    cache; default from the interpreter's and site-packages' mtimes),
    'comfyui' (the ComfyUI directory; default found), 'module', 'cache'
    (False: no cache), 'cache_dir', 'route_timeout_s',
    'prompt_handler_timeout_s' (seconds: the pack's routes and prompt
    handlers on the host's server, host/serverproxy.py).  memory: the
    HostMemory the worker stands in (attached before it starts, drained
    after every node on ComfyUI's execution thread), or None.

    With a warm cache no worker starts here.  Falls back to ``fallback``
    (in-process) when no ComfyUI is found or the interpreter does not
    exist; raises PackLoadError when the pack fails to import in its
    worker.  Inside a worker (a pack importing another) the pack is
    imported in-process."""
    options = options if isinstance(options, spec.Settings) else spec.settings(options)
    pack_dir = os.path.realpath(os.fspath(pack_dir))
    name = name or os.path.basename(pack_dir)
    if in_worker():
        mod = import_nodes(pack_dir, options.get("module", "auto"))
        return (dict(getattr(mod, "NODE_CLASS_MAPPINGS", {}) or {}),
                dict(getattr(mod, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {}))
    comfyui = find_comfyui(options)
    if comfyui is None:
        return fallback(pack_dir, NO_COMFYUI, name=name, module=options.get("module", "auto"),
                        policy=options.get("fallback"))
    if python is None or not os.access(os.fspath(python), os.X_OK):
        return fallback(pack_dir, ENV_NOT_BUILT, name=name, module=options.get("module", "auto"),
                        detail=f" (no interpreter at {python})" if python else "", policy=options.get("fallback"))
    rt = states.runtime_for(pack_dir, os.fspath(python),
                            lambda: PackRuntime(pack_dir, python, name, env, options, comfyui, memory))
    if rt.meta is None:
        rt.load_metadata()
        rt.build()
        idle.watch(rt)
        log.info("%s", _loaded_line(name, rt))
        if options.get("prewarm") == "startup":
            prewarm.start(rt)
    set_state(pack_dir, options.get("module", "auto"), name=name, state="isolated", python=rt.python,
              env=os.path.dirname(os.path.dirname(rt.python)), **_without_torch(rt, name))
    return dict(rt.classes), dict(rt.display)


def _loaded_line(name, rt):
    """The one line a pack's load says in ComfyUI's log, at most
    states.LINE_MAX characters: its name, its node count and where its
    node metadata came from always whole; its interpreter's path, then
    why it is not sandboxed, cut to fit (states.short: `bulkhead status`
    and the panel have them whole)."""
    n = len(rt.classes)
    head = f"bulkhead: pack {name!r}: {n} node{'' if n == 1 else 's'}, "
    tail = ", metadata " + ("cached" if rt.from_cache else f"from worker pid {rt.worker.pid}")
    words = sandbox.state_of(rt).words()
    room = states.LINE_MAX - len(head) - len(tail) - 2     # ", " between the interpreter and the sandbox
    python = states.short(rt.python, max(24, room - len(words)))
    words = states.short(words, max(16, room - len(python)))
    return f"{head}{python}, {words}{tail}"


def _without_torch(rt, name):
    """{"warning", "fix"} for the pack's state where its environment was
    built without the host's torch (no index reachable has that build for
    its Python: envs/build.py left it out with one warning) and some of its
    nodes take or return tensors, which then cannot run (said once in the
    log too); else {}.  Its other nodes run isolated."""
    from ..envs import build as envs, hostmatch  # lazy: ComfyUI start (envs.build)
    stamp = envs.read_stamp(os.path.dirname(os.path.dirname(rt.python))) or {}
    lacking = (stamp.get("host") or {}).get("lacking") or {}
    torch = [p for p in lacking if hostmatch.pin_name(p) == "torch"]
    if not torch:
        return {}
    tensor_nodes = rt.tensor_nodes()
    if not tensor_nodes:
        return {}
    shown = ", ".join(sorted(tensor_nodes)[:8]) + (f" and {len(tensor_nodes) - 8} more" if len(tensor_nodes) > 8
                                                   else "")
    warning = (f"isolated without torch: its environment ({stamp.get('interpreter', {}).get('version', '?')}) "
               f"has no {torch[0]} ({lacking[torch[0]]}), so {shown}, which take or return tensors, fail")
    fix = (f"give the pack the host's Python minor (python = in its comfy-env.toml), or name an index with a "
           f"torch build for that Python ({hostmatch.TORCH_INDEX}), then `bulkhead install {rt.pack_dir}`")
    log.warning("%s", states.pack_line(name, "is isolated without torch", warning.split(": ", 1)[1],
                                       whole="which nodes fail and the fix: the panel's Packs, /bulkhead/status"))
    return {"warning": warning, "fix": fix}


def close_all():
    """Stops every pack worker (their metadata stays)."""
    for rt in runtimes():
        rt.close()


def _forget_all():
    """Tests: forget every runtime (as a fresh ComfyUI start would)."""
    close_all()
    states.forget_all()
