"""A pack's settings, and the environment names a worker reads: one row each.

In the spirit of Redis's ``static_configs[]``: every ``[bulkhead]`` option
of a ``comfy-env.toml`` is one ``Option`` row here -- its name, unit,
bounds, default, the kind of value it takes (how it is read) and, where
the worker reads it, the environment name that carries it -- and every
environment name a worker reads is one ``Env`` row, with both halves of
its crossing: ``to_env`` on the host (the text the worker's environment
gets) and ``from_env`` in the worker (the value read back).  Nothing else
knows a default: envs/config.py checks a config's options against these
rows, and host/pack.py builds a pack's ``Settings`` record from them
(``settings``), where a value the pack gives, 0 included, wins over the
default and over a host-wide variable of the same name
(``worker_env``).

This module is imported by the host and by every worker, under any
Python bulkhead runs on: standard library only, and at a worker's start
nothing a call does not need (json where a JSON value is read or
written; no typing, which imports re: tests/py/test_worker_start.py).
"""

import os


class _Row(tuple):
    """A row of the tables below: a tuple whose fields have names and
    defaults, as collections.namedtuple's are (its repr too), written out
    because collections (with keyword, operator and reprlib) cost every
    worker's start about 1.5 ms (#40).  A subclass names its ``_fields``
    and the ``_defaults`` of the last of them, and gets each field's
    property from ``_fields_of``."""
    __slots__ = ()
    _fields = ()
    _defaults = ()

    def __new__(cls, *args, **kwargs):
        fields, defaults = cls._fields, cls._defaults
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} values, not {len(args)}")
        values = list(args)
        for i in range(len(args), len(fields)):
            if fields[i] in kwargs:
                values.append(kwargs.pop(fields[i]))
            elif i >= len(fields) - len(defaults):
                values.append(defaults[i - len(fields) + len(defaults)])
            else:
                raise TypeError(f"{cls.__name__} needs its {fields[i]!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__} has no field {next(iter(kwargs))!r} (its fields: {', '.join(fields)})")
        return tuple.__new__(cls, values)

    def __getnewargs__(self):
        return tuple(self)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{f}={v!r}' for f, v in zip(self._fields, self))})"


def _fields_of(names):
    """One read-only property per field name, in order (each the tuple's
    item at its place)."""
    return tuple(property(lambda self, i=i: self[i], doc=f"field {i}: {name}") for i, name in enumerate(names))


class Option(_Row):
    """One ``[bulkhead]`` key.  kind: "seconds" (a number of seconds,
    at least ``low``; ``low`` itself allowed where ``low_ok``), "choice"
    (one of ``choices``), "flag" (true or false) or "paths" (an array of
    paths, ~ expanded, relative to the pack's folder: a tuple once read).  default: its value where the pack
    gives none (None: the reader's own rule, said in ``what``).  env: the
    worker environment name that carries it, where the worker reads it."""
    __slots__ = ()
    _fields = ("name", "kind", "what", "default", "low", "low_ok", "choices", "env")
    _defaults = (None, 0.0, True, (), None)
    name, kind, what, default, low, low_ok, choices, env = _fields_of(_fields)

    @property
    def unit(self):
        return "s" if self.kind == "seconds" else None


OPTIONS = (
    Option("idle_release_s", "seconds", "seconds a worker may sit idle before a full release (0: never)",
           default=0.0, env="BULKHEAD_IDLE_RELEASE_S"),   # IDLE_RELEASE_S below
    Option("idle_exit_s", "seconds", "seconds a worker may sit idle before it exits, holding nothing ComfyUI "
           "still references (0: never; default BULKHEAD_IDLE_EXIT_S, else 600)"),
    Option("call_timeout_s", "seconds", "seconds one node call may take before the worker is killed",
           low_ok=False),
    Option("release_timeout_s", "seconds", "seconds a release ask may take before the worker is counted as stuck",
           low_ok=False),
    Option("start_timeout_s", "seconds", "seconds a worker may take to start (import the pack and say HELLO)",
           default=120.0, low_ok=False),
    Option("interrupt_grace_s", "seconds", "seconds a node may run on after the stop button before its worker is "
           "stopped (0: never)", default=3.0),
    Option("prewarm", "choice", "when the worker starts ahead of its first node: when a queued prompt uses the "
           "pack, when ComfyUI loads the pack, or only when a node runs", default="prompt",
           choices=("prompt", "startup", "off")),
    # Read by envs/hostmatch.py too; the stamp records it (a change marks
    # the environment stale there, not through the config hash).
    Option("fallback", "choice", "what happens when the pack cannot run isolated (its environment not built, "
           "refused, or its worker cannot import it): run it in ComfyUI's process with one warning (in-process), "
           "or load none of its nodes, with one error (error); unset: in-process only where ComfyUI's process is "
           "the same as its environment, else its nodes refuse to run", choices=("in-process", "error")),
    Option("host_packages", "choice", "what the environment gets from the host: torch, comfy-aimdo, comfy-kitchen "
           "and every requirement of ComfyUI's requirements.txt, at the host's versions (match), or nothing "
           "(none: for a pack that never imports comfy or torch)", default="match", choices=("match", "none")),
    # Read by host/sandbox.py (its default: BULKHEAD_SANDBOX, else on).
    Option("sandbox", "choice", "whether the pack's worker runs sandboxed (host/sandbox.py): where the kernel has "
           "Landlock (on), never (off), or refusing to start where the kernel cannot (required)",
           choices=("on", "off", "required")),
    Option("network", "flag", "whether the pack's sandboxed worker may make TCP connections (default true)",
           default=True),
    Option("sandbox_read", "paths", "paths the pack's sandboxed worker may read beyond its own", default=()),
    Option("sandbox_write", "paths", "paths the pack's sandboxed worker may write beyond its own", default=()),
)
BY_NAME = {o.name: o for o in OPTIONS}


def seconds_table():
    """{name: (what, low, low_ok)} of the "seconds" options: the shape
    envs/config.py checks a config against."""
    return {o.name: (o.what, o.low, o.low_ok) for o in OPTIONS if o.kind == "seconds"}


def choices_table():
    """{name: (what, choices)} of the "choice" options."""
    return {o.name: (o.what, o.choices) for o in OPTIONS if o.kind == "choice"}


def flags_table():
    """{name: what} of the "flag" options."""
    return {o.name: o.what for o in OPTIONS if o.kind == "flag"}


def paths_table():
    """{name: what} of the "paths" options."""
    return {o.name: o.what for o in OPTIONS if o.kind == "paths"}


class Settings(dict):
    """One pack's settings: every option of ``OPTIONS`` by name, the
    pack's own value where its config gives one (0 included), else the
    row's default; ``given`` is the set of names the pack gave."""

    def __init__(self, values, given):
        super().__init__(values)
        self.given = frozenset(given)


def settings(options):
    """The Settings of a config's ``[bulkhead]`` options (a mapping, as
    envs/config.py read it); keys no row has are kept as they are (the
    options other tables of envs/config.py read)."""
    values = {o.name: o.default for o in OPTIONS}
    given = set()
    for k, v in (options or {}).items():
        o = BY_NAME.get(k)
        values[k] = float(v) if o is not None and o.kind == "seconds" else v
        given.add(k)
    return Settings(values, given)


# --- the worker's environment names ---

class Env(_Row):
    """One environment name a worker reads.  kind: "seconds" (a number),
    "json" (a JSON document), "text", or "flag" ("1" or unset)."""
    __slots__ = ()
    _fields = ("name", "kind", "what", "default")
    _defaults = (None,)
    name, kind, what, default = _fields_of(_fields)


# The names, for the code on either side that sets or reads one: no other
# module spells a "BULKHEAD_" name (tests/py/test_spec.py).
PREFIX = "BULKHEAD_"      # every name's: a pack's [env_vars] may set none (envs/config.py)
# -- read by the worker (ENV) --
FD = "BULKHEAD_FD"
HOST_PID = "BULKHEAD_HOST_PID"
PARENT_PID = "BULKHEAD_PARENT_PID"
IDLE_RELEASE_S = "BULKHEAD_IDLE_RELEASE_S"
SERIALIZERS = "BULKHEAD_SERIALIZERS"
LEDGER = "BULKHEAD_LEDGER"
PACK_NAME = "BULKHEAD_PACK_NAME"
PACK_DIR = "BULKHEAD_PACK_DIR"
PACK_MODULE = "BULKHEAD_PACK_MODULE"
COMFYUI = "BULKHEAD_COMFYUI"
COMFY_ARGS = "BULKHEAD_COMFY_ARGS"
COMFY_FOLDERS = "BULKHEAD_COMFY_FOLDERS"
MEMORY = "BULKHEAD_MEMORY"
VRAM_STATE = "BULKHEAD_VRAM_STATE"
RAM_ROOT = "BULKHEAD_RAM_ROOT"
LOG_LEVEL = "BULKHEAD_LOG_LEVEL"
WORKER_PAGER = "BULKHEAD_WORKER_PAGER"
PAGER_HEADROOM = "BULKHEAD_PAGER_HEADROOM"
AS_ZYGOTE = "BULKHEAD_AS_ZYGOTE"
ZYGOTE_LINGER_S = "BULKHEAD_ZYGOTE_LINGER_S"
SANDBOXED = "BULKHEAD_SANDBOXED"
ZYGOTE_PRELOAD = "BULKHEAD_ZYGOTE_PRELOAD"
# -- read by the host and the command line only (HOST_ENV) --
HOME = "BULKHEAD_HOME"
PLATFORM = "BULKHEAD_PLATFORM"
CONDA_CHANNELS = "BULKHEAD_CONDA_CHANNELS"
CUDA_INDEX = "BULKHEAD_CUDA_INDEX"
TORCH_VERSION = "BULKHEAD_TORCH_VERSION"
CUDA_VERSION = "BULKHEAD_CUDA_VERSION"
TORCH_INDEX = "BULKHEAD_TORCH_INDEX"
PIP_ARGS = "BULKHEAD_PIP_ARGS"
COMFY_ENV = "BULKHEAD_COMFY_ENV"
BUILD_AT_START = "BULKHEAD_BUILD_AT_START"
IDLE_EXIT_S = "BULKHEAD_IDLE_EXIT_S"
IDLE_PRESSURE_PCT = "BULKHEAD_IDLE_PRESSURE_PCT"
RELEASE_TIMEOUT = "BULKHEAD_RELEASE_TIMEOUT"
FREE_WAIT = "BULKHEAD_FREE_WAIT"
ALLOW_REMOTE_ALL_HOSTS = "BULKHEAD_ALLOW_REMOTE_ALL_HOSTS"
FALLBACK = "BULKHEAD_FALLBACK"
INSTALLER = "BULKHEAD_INSTALLER"
SANDBOX = "BULKHEAD_SANDBOX"
SANDBOX_NO_LANDLOCK = "BULKHEAD_SANDBOX_NO_LANDLOCK"
SANDBOX_READ = "BULKHEAD_SANDBOX_READ"
SANDBOX_WRITE = "BULKHEAD_SANDBOX_WRITE"
NETWORK = "BULKHEAD_NETWORK"
OMP_SPIN_US = "BULKHEAD_OMP_SPIN_US"
ZYGOTE = "BULKHEAD_ZYGOTE"
ZYGOTE_RETRY_S = "BULKHEAD_ZYGOTE_RETRY_S"

ENV = (
    Env(FD, "text", "the channel's file descriptor in the worker", "3"),
    Env(HOST_PID, "text", "the host's pid"),
    Env(PARENT_PID, "text", "the parent's pid: a zygote's, where it forked the worker"),
    Env(IDLE_RELEASE_S, "seconds", "seconds idle before the worker's full release (0: never)", 0.0),
    Env(SERIALIZERS, "json", "[[pack, serialization.py], ...] the worker loads (worker/typed.py)", []),
    Env(LEDGER, "text", "the shared ledger's path"),
    Env(PACK_NAME, "text", "the pack's name, in logs and the ledger"),
    Env(PACK_DIR, "text", "the pack's directory"),
    Env(PACK_MODULE, "text", "the module of the pack's node classes", "auto"),
    Env(COMFYUI, "text", "the host's ComfyUI directory"),
    Env(COMFY_ARGS, "json", "the host's ComfyUI arguments the worker mirrors"),
    Env(COMFY_FOLDERS, "json", "the host's folder_paths the worker mirrors"),
    Env(MEMORY, "flag", "the worker is under the host's one memory budget"),
    Env(VRAM_STATE, "text", "ComfyUI's VRAM state in the host"),
    Env(RAM_ROOT, "text", "where the worker's RAM accounting is rooted (tests)"),
    Env(LOG_LEVEL, "text", "the worker's log level"),
    Env(WORKER_PAGER, "text", "whether the worker runs comfy-aimdo's pager ('1', '0')"),
    Env(PAGER_HEADROOM, "text", "the pager's headroom in bytes"),
    Env(AS_ZYGOTE, "flag", "the process is a zygote that forks workers"),
    Env(ZYGOTE_LINGER_S, "seconds", "seconds a zygote lingers with no worker to fork"),
    Env(SANDBOXED, "flag", "the worker runs sandboxed"),
    Env(ZYGOTE_PRELOAD, "text", "the modules a zygote imports before it forks (comma-separated)"),
)

# The switches only the host (ComfyUI's process) and the `bulkhead`
# command read: name -> what it is.  Their defaults stay with their one
# reader, which names the variable through the constant above.
HOST_ENV = {
    HOME: "bulkhead's home: environments, caches, logs",
    PLATFORM: "the pixi platform configs are read for, in place of this machine's",
    CONDA_CHANNELS: "conda channels every conda build uses instead of a config's",
    CUDA_INDEX: "the CUDA wheel index [cuda] packages come from",
    TORCH_VERSION: "the torch version [cuda] wheels are resolved for",
    CUDA_VERSION: "the CUDA version [cuda] wheels are resolved for",
    TORCH_INDEX: "the index a torch build for another Python comes from",
    PIP_ARGS: "arguments every environment build gives pip",
    COMFY_ENV: "whether bulkhead serves comfy_env's register_nodes (off: hands it back)",
    BUILD_AT_START: "0: ComfyUI's start builds no environment, `bulkhead install` does",
    IDLE_EXIT_S: "seconds an idle worker lives before it exits, where its pack says nothing",
    IDLE_PRESSURE_PCT: "below this % of RAM available, idle workers exit",
    RELEASE_TIMEOUT: "seconds a release ask may take",
    FREE_WAIT: "seconds POST /free waits for workers' releases",
    ALLOW_REMOTE_ALL_HOSTS: "lets a non-local client drive every host's workers",
    FALLBACK: "what a pack that cannot run isolated does: error, in-process (unset: in-process only where the "
              "same)",
    INSTALLER: "what builds environments: uv, pip (default: uv where found)",
    SANDBOX: "every pack's sandbox: on, off, required (a pack's own [bulkhead] sandbox otherwise)",
    SANDBOX_NO_LANDLOCK: "1: act as if the kernel had no Landlock (tests)",
    SANDBOX_READ: "paths every sandboxed worker may read beyond its own",
    SANDBOX_WRITE: "paths every sandboxed worker may write beyond its own",
    NETWORK: "0: no sandboxed worker makes TCP connections",
    OMP_SPIN_US: "microseconds ComfyUI's idle OpenMP/BLAS threads spin before they sleep",
    ZYGOTE: "0: workers start without a zygote",
    ZYGOTE_RETRY_S: "seconds before a zygote that failed is tried again",
}

ENV_BY_NAME = {e.name: e for e in ENV}


def to_env(name, value):
    """The text the worker's environment gets for name (a row of ENV) and
    value: on the host."""
    e = ENV_BY_NAME[name]
    if e.kind == "json":
        import json  # lazy: worker start
        return json.dumps(value)
    if e.kind == "seconds":
        return repr(float(value))
    if e.kind == "flag":
        return "1" if value else ""
    return str(value)


def from_env(name, environ=None):
    """The value of name (a row of ENV) in the worker's environment
    (environ, default os.environ), or the row's default where it is unset
    or empty: in the worker.  A number that does not parse is an error
    naming the variable, not a silent default."""
    e = ENV_BY_NAME[name]
    text = (os.environ if environ is None else environ).get(name)
    if not text:
        return e.default
    if e.kind == "json":
        import json  # lazy: worker start
        return json.loads(text)
    if e.kind == "seconds":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds; set it to one (e.g. 30) or unset it") \
                from None
    if e.kind == "flag":
        return text == "1"
    return text


def worker_env(s):
    """{name: text} of the options of Settings s that the worker reads
    (rows with ``env``): where the pack gave one (0 included), it goes
    in, so it wins over a host-wide variable of that name the worker
    would inherit; where it gave none, nothing does, and the host-wide
    variable (or the worker's default) stands."""
    return {o.env: to_env(o.env, s[o.name]) for o in OPTIONS if o.env and o.name in s.given}
