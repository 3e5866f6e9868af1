"""comfy-env as an oracle: what each release's own reader makes of a
config, beside what bulkhead's reader makes of it, field by field.

A *use* is a config put to a release that would have read it: every
release that accepts a fixture config (the repo's own, and
tests/oracle/corpus) and reads its shape (shape_of), and for a config
fetched from a public pack's
history (a folder named by BULKHEAD_CONFIG_CORPUS, each file with a
``<file>.json`` beside it: repo, commit, date, the pack's comfy-env
requirement then) the release that pack then got -- the version its
requirement pinned, else the newest out at the commit's date that
satisfies it, and for a 0.0.x file the last 0.0.x release out then
too.  The releases are those PyPI serves (0.3.0+), and where
BULKHEAD_COMFY_ENV_GIT names a clone of comfy-env's history, its tags
PyPI no longer serves (0.1.82-0.2.83); a config whose release is in
neither (0.0.x) is counted, not compared.

Each side's result is put in one *view* (FIELDS): the release's from its
``load_config`` (its ``pixi_passthrough`` tables read as pixi reads them:
a bare version is ``==``, ``"*"`` any), bulkhead's from
envs/config.py's ``load`` and envs/rootconfig.py's ``load_root``.  A
field that differs is a *difference*; docs/comfy-env-differences.toml
lists those bulkhead keeps, with the row of docs/comfy-env-dialects.md
that gives the reason, and ``listed`` says whether one is.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DIFFERENCES = os.path.join(REPO, "docs", "comfy-env-differences.toml")
DIALECTS = os.path.join(REPO, "docs", "comfy-env-dialects.md")

# The fields of a view, by the file's role; "refused" is the reader's
# error (None when it read the file).
FIELDS = {
    "env": ("refused", "python", "requirements", "conda", "cuda", "env_vars", "apt", "brew", "local", "no_deps"),
    "root": ("refused", "node_packs", "types", "apt", "brew", "isolate"),
}
ALL_FIELDS = sorted(set(FIELDS["env"]) | set(FIELDS["root"]))
# The keys an entry of docs/comfy-env-differences.toml may have.
ENTRY_KEYS = {"field", "role", "shape", "config", "releases", "only_release", "only_bulkhead", "release", "bulkhead", "row",
              "reason"}
# A config's shape (shape_of): "d1" for comfy-env 0.0.13-0.0.65's, which
# later releases handed to pixi unread; "current" for the others.
SHAPES = ("d1", "current")
# What marks 0.0.x's shape: an environment table named for it, or tables
# of that dialect only.
_D1_ENV_KEYS = {"python", "cuda_version", "pytorch_version", "packages", "cuda", "conda", "env"}
_CURRENT_TABLES = {"cuda", "apt", "brew", "env_vars", "options", "settings", "node_reqs", "node_packs", "types",
                   "pypi-dependencies", "dependencies", "target", "workspace", "feature", "environments",
                   "tasks", "activation", "system-requirements", "pypi-options", "bulkhead"}
PLATFORM = "linux-64"


# --- the corpus ---

def role_of(path):
    return "root" if os.path.basename(path) == "comfy-env-root.toml" else "env"


def fixture_configs():
    """The repo's own configs: the example packs', the e2e packs', and
    tests/oracle/corpus (one file per shape the dialects table names)."""
    out = []
    for base in (os.path.join(REPO, "examples"), os.path.join(REPO, "tests", "e2e", "packs"),
                 os.path.join(HERE, "corpus")):
        for d, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(".toml") and f.startswith("comfy-env"):
                    out.append(os.path.join(d, f))
    return sorted(out)


def corpus_configs(folder):
    """(path, metadata) for each comfy-env(-root).toml under folder."""
    out = []
    for d, _, files in os.walk(folder):
        for f in sorted(files):
            if f in ("comfy-env.toml", "comfy-env-root.toml"):
                p = os.path.join(d, f)
                meta = {}
                if os.path.isfile(p + ".json"):
                    with open(p + ".json") as fh:
                        meta = json.load(fh)
                out.append((p, meta))
    return sorted(out)


def shape_of(path):
    """"d1" where the file has 0.0.x's shape (an environment table named
    for it, ``[env]`` + ``[packages]`` or a top-level ``packages`` alone, ``[system]``, ``[local]``,
    ``[variables]``, ``cuda = [...]`` or ``[cuda] name = "version"``),
    else "current"."""
    try:
        import tomllib
    except ImportError:         # Python 3.9/3.10: bulkhead's reader carries one
        from bulkhead.envs.config import toml_loads as _loads
    else:
        def _loads(text, _path):
            return tomllib.loads(text)
    try:
        with open(path, encoding="utf-8") as f:
            data = _loads(f.read(), path)
    except Exception:
        return "current"
    if any(k in data for k in ("system", "local", "variables", "sources", "wheel_sources", "worker", "tools")):
        return "d1"
    if any(k in data for k in ("python", "pypi-dependencies", "dependencies")) and "env" not in data:
        return "current"       # 0.0.66+'s top level, whatever else the file carries
    if "packages" in data:      # [env] + [packages], or a top-level packages alone: 0.0.x's simple shape
        return "d1"
    cuda = data.get("cuda")
    if isinstance(cuda, list) or (isinstance(cuda, dict) and "packages" not in cuda and cuda
                                  and all(isinstance(v, str) for v in cuda.values())):
        return "d1"
    for k, v in data.items():
        if k not in _CURRENT_TABLES and isinstance(v, dict) and _D1_ENV_KEYS & set(v):
            return "d1"
    return "current"


def release_in_use(meta, served, upload_dates, version_key):
    """The release a pack got at the commit meta names: ``==X`` -> X;
    otherwise the newest served at the commit's date that satisfies its
    requirement.  Returns (version, None) or (None, why not compared)."""
    from packaging.specifiers import SpecifierSet
    pin = (meta.get("comfy_env") or "").strip()
    if pin.startswith("=="):
        v = pin[2:].strip()
        return (v, None) if v in served else (None, f"pinned {v}, which neither PyPI nor comfy-env's tags have")
    try:
        spec = SpecifierSet(pin) if pin else SpecifierSet()
    except Exception:
        spec = SpecifierSet()
    date = meta.get("date", "9999")
    ok = [v for v in served if upload_dates.get(v, "") <= date[:19].replace("T", "T") and spec.contains(v)]
    if not ok:
        return None, ("no release here was out at that commit (PyPI serves 0.3.0+; BULKHEAD_COMFY_ENV_GIT adds "
                      "the older ones from comfy-env's history)")
    return max(ok, key=version_key), None


# --- the release's side ---

PROBE = r'''
import contextlib, dataclasses, io, json, sys, types
release, paths = sys.argv[1], json.loads(sys.stdin.read())
# The package without its __init__, which imports every layer and its
# dependencies: the reader alone runs, as in the release.
pkg = types.ModuleType("comfy_env")
pkg.__path__ = [release + "/comfy_env"]
sys.modules["comfy_env"] = pkg
try:
    from comfy_env.config import load_config
except ImportError:
    # 0.0.13-0.0.65: comfy-env's env/config_file.py, its CUDA detection answering
    # 12.8 (the torch it then picked: 2.8.0), as bulkhead's side is told
    import comfy_env.env.config_file as cf
    cf.detect_cuda_version = lambda: "12.8"
    load_config = cf.load_config

def plain(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)

out = {}
for p in paths:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            r = {"config": plain(load_config(p))}
        except Exception as e:
            r = {"error": f"{type(e).__name__}: {e}"}
    r["said"] = err.getvalue()
    out[p] = r
print(json.dumps(out))
'''


def run_release(folder, deps, paths, python=sys.executable):
    """{path: {"config": ...} or {"error": ...}} from the release in
    folder, run in a child with only it and its readers' dependencies."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, deps]))
    env.pop("COMFY_ENV_ROOT", None)
    r = subprocess.run([python, "-c", PROBE, folder], input=json.dumps(paths), capture_output=True, text=True,
                       env=env, timeout=600, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise RuntimeError(f"the reader of the release in {folder} did not run: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _pixi_req(key, spec):
    """A pixi [pypi-dependencies] entry -> (name, what is asked) as both
    views spell it: extras sorted, the specifier set's normal form, or
    "@" + the source for a path/url/git."""
    from packaging.specifiers import SpecifierSet
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*$", key)
    name, extras = (m.group(1), [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]) if m else (key, [])
    version = spec
    if isinstance(spec, dict):
        extras = extras + list(spec.get("extras") or [])
        for k in ("git", "url", "path"):
            if k in spec:
                return _canon(name), (sorted({_canon(e) for e in extras}), "@" + k)
        version = spec.get("version", "*")
    version = str(version).strip()
    if version in ("", "*"):
        version = ""
    elif re.match(r"\d", version):
        version = "==" + version
    try:
        version = str(SpecifierSet(version))
    except Exception:
        version = "?" + version
    return _canon(name), (sorted({_canon(e) for e in extras}), version)


def _bulkhead_req(req):
    from packaging.requirements import InvalidRequirement, Requirement
    try:
        r = Requirement(req)
    except InvalidRequirement:      # kept as written ({var}s left, a pip option): compared as text
        return req.strip(), ([], "")
    if r.url:
        kind = "git" if r.url.startswith("git+") else ("path" if r.url.startswith("file:") else "url")
        return _canon(r.name), (sorted({_canon(e) for e in r.extras}), "@" + kind)
    return _canon(r.name), (sorted({_canon(e) for e in r.extras}), str(r.specifier))


def _reqs(pairs):
    return sorted(f"{n}{'[' + ','.join(e) + ']' if e else ''}{v}" for n, (e, v) in pairs)


def _listify(v):
    if v is None:
        return []
    if isinstance(v, list):
        return [str(x) for x in v]
    return [str(v)] if v else []


D1_RELEASES = ">=0.0.13,<0.0.66"


def d1_view(c, role):
    """A 0.0.13-0.0.65 release's answer (its EnvManagerConfig) as a view:
    its one environment's python, requirements (its ``[<env>.cuda]``
    wheels among them, as that release resolved them: merged_view puts
    bulkhead's CUDA wheels there too), conda packages and variables;
    ``[system] linux`` as apt; what ``[local]`` (and, with no environment,
    the simple shape) put into ComfyUI's own Python, as local."""
    envs = list((c.get("envs") or {}).values())
    system = c.get("system") or {}
    view = {"refused": None, "apt": sorted(_listify(system.get("linux"))),
            "brew": sorted(_listify(system.get("darwin"))), "cuda": [], "no_deps": []}
    if role == "root":
        view.update(node_packs=sorted(r.get("name") for r in c.get("node_reqs") or []), types={}, isolate=None)
        return view
    if len(envs) > 1:
        view["environments"] = len(envs)
    local = c.get("local") or {}
    into = [k + ("==" + v if v and v != "*" else "") for k, v in (local.get("cuda_packages") or {}).items()]
    into += list(local.get("requirements") or [])
    # what that release installed into ComfyUI's own Python
    view["local"] = _reqs(dict(_bulkhead_req(q) for q in into if q.strip()).items())
    if envs:
        e = envs[0]
        reqs = list(e.get("requirements") or []) + list(e.get("no_deps_requirements") or []) + \
            list(e.get("linux_requirements") or [])
        view["python"] = e.get("python")
        # what it installed with --no-deps: its CUDA packages and no_deps
        view["no_deps"] = _reqs(dict(_bulkhead_req(q) for q in e.get("no_deps_requirements") or []
                                     if q.strip()).items())
        view["env_vars"] = {str(k): str(v) for k, v in (e.get("env_vars") or {}).items()}
        conda = (e.get("conda") or {}).get("packages") or []
    else:
        view["python"], view["env_vars"], conda, reqs = None, {}, [], []
    view["requirements"] = _reqs(dict(_bulkhead_req(q) for q in reqs if q.strip()).items())
    view["conda"] = sorted(_canon(re.split(r"[\s=<>!~]", str(x).split("::")[-1], 1)[0]) for x in conda)
    return view


def merged_view(view):
    """view with its CUDA wheels among its requirements, and among what
    is installed without dependencies (as that release installed both its
    CUDA packages and no_deps): how a 0.0.x release's answer is compared."""
    v = dict(view)
    if v.get("refused") is None and "requirements" in v:
        extra = dict(_bulkhead_req(q) for q in v.get("cuda") or [])
        v["requirements"] = sorted(set(v["requirements"]) | set(_reqs(extra.items())))
        v["no_deps"] = sorted(set(v.get("no_deps") or []) | set(_reqs(extra.items())))
        v["cuda"] = []
    return v


def release_view(result, role):
    """The release's answer as a view (FIELDS[role])."""
    if "error" in result:
        return {"refused": result["error"]}
    c = result["config"]
    if "envs" in c and "local" in c:
        return d1_view(c, role)
    pp = c.get("pixi_passthrough") or {}
    target = ((pp.get("target") or {}).get(PLATFORM) or {}) if isinstance(pp.get("target"), dict) else {}
    view = {"refused": None}

    def system(name):
        if f"{name}_packages" in c:
            return sorted(_listify(c.get(f"{name}_packages")))
        t = pp.get(name)     # 0.4.x: handed to pixi as written
        return sorted(_listify(t.get("packages"))) if isinstance(t, dict) else []
    view["apt"], view["brew"] = system("apt"), system("brew")
    if role == "root":
        reqs = c.get("node_packs") or c.get("node_reqs") or []
        view["node_packs"] = sorted(r["name"] if isinstance(r, dict) else str(r) for r in reqs)
        view["types"] = {str(k): str(v) for k, v in (c.get("types") or pp.get("types") or {}).items()}
        s = c.get("settings") or {}
        # settings.resolve_bool: bool() of the value the file gave
        view["isolate"] = bool(s["isolate"]) if isinstance(s, dict) and "isolate" in s else None
        return view
    view["python"] = c.get("python")
    view["cuda"] = sorted(_listify(c.get("cuda_packages")))
    view["env_vars"] = {str(k): str(v) for k, v in (c.get("env_vars") or {}).items()}
    pypi = dict(pp.get("pypi-dependencies") or {})
    pypi.update(target.get("pypi-dependencies") or {})
    view["requirements"] = _reqs(dict(_pixi_req(k, v) for k, v in pypi.items()).items())
    conda = dict(pp.get("dependencies") or {})
    conda.update(target.get("dependencies") or {})
    view["conda"] = sorted(_canon(k) for k in conda if _canon(k) != "python")
    view["local"] = []
    view["no_deps"] = []
    return view


# --- bulkhead's side ---

def bulkhead_view(path, role):
    """bulkhead's reader's answer over the file at path as a view."""
    from bulkhead.envs import config as packconfig, rootconfig
    try:
        if role == "root":
            r = rootconfig.load_root(os.path.dirname(path), warn=False)
            return {"refused": None, "node_packs": sorted(n for n, _ in r.node_packs), "types": dict(r.types),
                    "apt": sorted(r.system_packages.get("apt", ())),
                    "brew": sorted(r.system_packages.get("brew", ())),
                    "isolate": getattr(r, "isolate", None)}
        c = packconfig.load(path, warn=False)
    except packconfig.PackConfigError as e:
        return {"refused": str(e)}
    python = c.python
    return {"refused": None, "python": python, "cuda": sorted(c.cuda), "env_vars": dict(c.env_vars),
            "requirements": _reqs(dict(_bulkhead_req(q) for q in c.requirements).items()),
            "conda": sorted(_canon(re.split(r"[\s=<>!~]", s.split("::")[-1], 1)[0]) for s in c.conda),
            "apt": sorted(c.system_packages.get("apt", ())), "brew": sorted(c.system_packages.get("brew", ())),
            "local": _reqs(dict(_bulkhead_req(q) for q in c.local).items()),   # `bulkhead install` installs
            "no_deps": _reqs(dict(_bulkhead_req(q) for q in getattr(c, "no_deps", ())).items())}


def _same_python(a, b):
    if a == b:
        return True
    if a is None or b is None:
        return False
    from packaging.specifiers import SpecifierSet
    try:
        return SpecifierSet(a) == SpecifierSet(b)
    except Exception:
        return False


def differences(rel, bh, role):
    """[{field, release, bulkhead, only_release, only_bulkhead}] where the
    two views disagree.  A release's refusal is no difference (bulkhead
    reads every dialect; that release was not the one in use); bulkhead's
    refusal of a file the release read is."""
    if rel.get("refused") is not None:
        return []
    if bh.get("refused") is not None:
        return [{"field": "refused", "release": None, "bulkhead": bh["refused"]}]
    out = []
    for f in FIELDS[role][1:]:
        a, b = rel.get(f), bh.get(f)
        if f == "python" and _same_python(a, b):
            continue
        if a == b:
            continue
        d = {"field": f, "release": a, "bulkhead": b}
        if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
            sa = set(_items(a))
            sb = set(_items(b))
            d["only_release"], d["only_bulkhead"] = sorted(sa - sb), sorted(sb - sa)
        out.append(d)
    return out


def _items(v):
    if isinstance(v, dict):
        return [f"{k}={x}" for k, x in v.items()]
    return [str(x) for x in (v or [])]


# --- the listed differences ---

def load_listed(path=DIFFERENCES):
    """The entries of docs/comfy-env-differences.toml."""
    try:
        import tomllib
    except ImportError:
        from bulkhead.envs.config import toml_loads
        with open(path, encoding="utf-8") as f:
            return toml_loads(f.read(), path).get("difference", [])
    with open(path, "rb") as f:
        return tomllib.load(f).get("difference", [])


def _matches(rx, value):
    return rx is not None and re.search(rx, json.dumps(value) if not isinstance(value, str) else value) is not None


def listed(diff, version, role, entries, shape="current", text=""):
    """The entry of entries that lists this difference in a file of that
    role, shape (shape_of) and text, or None.  An entry with ``field =
    "*"`` names a shape: every field of such a file; one with ``config``
    only files whose text that pattern finds."""
    from packaging.specifiers import SpecifierSet
    for e in entries:
        if e["field"] not in ("*", diff["field"]) or e.get("role", role) != role:
            continue
        if e.get("shape", shape) != shape:
            continue
        if "config" in e and not re.search(e["config"], text):
            continue
        if e["field"] == "*":
            if SpecifierSet(e.get("releases", "")).contains(version, prereleases=True):
                return e
            continue
        if not SpecifierSet(e.get("releases", "")).contains(version, prereleases=True):
            continue
        if "only_release" in diff:
            if diff["only_release"] and not all(_matches(e.get("only_release"), x) for x in diff["only_release"]):
                continue
            if diff["only_bulkhead"] and not all(_matches(e.get("only_bulkhead"), x) for x in diff["only_bulkhead"]):
                continue
        else:
            if "release" in e and not _matches(e["release"], diff["release"]):
                continue
            if "bulkhead" in e and not _matches(e["bulkhead"], diff["bulkhead"]):
                continue
        return e
    return None


# --- the public names ---

def exported(folder, which=("__all__",)):
    """The names a release's ``__init__.py`` exports (its ``__all__``),
    read, not imported; with ``which=("_INTERNAL",)`` the PEP 562 table of
    0.4.23+ instead: names it used to export, which it answers with an
    AttributeError pointing at their internal module."""
    import ast
    with open(os.path.join(folder, "comfy_env", "__init__.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) in which for t in n.targets):
            v = n.value
            if isinstance(v, (ast.List, ast.Tuple)):
                names |= {e.value for e in v.elts if isinstance(e, ast.Constant)}
            elif isinstance(v, ast.Dict):
                names |= {e.value for e in v.keys if isinstance(e, ast.Constant)}
    return names


NAMES_PROBE = textwrap.dedent(r'''
    import json, sys
    names, real = json.loads(sys.stdin.read()), sys.argv[1:]
    sys.path[:0] = real
    from bulkhead.host import comfy_env as served, comfy_env_legacy as legacy
    served.route()
    out = {}
    for n in names:
        try:
            exec(f"from comfy_env import {n} as v")
        except BaseException as e:
            out[n] = f"{type(e).__name__}: {e}"
            continue
        out[n] = "refused" if n in legacy._WHY else "served"
    print(json.dumps(out))
''')


def routed_names(names, real=(), python=sys.executable):
    """{name: "served" | "refused" | the error} for ``from comfy_env
    import name`` under bulkhead's routing, with the folders real (a
    release and its dependencies) first on sys.path, or none."""
    import bulkhead
    env = dict(os.environ)
    for v in ("COMFY_ENV_ROOT", "BULKHEAD_COMFY_ENV", "COMFY_ENV_ISOLATE", "USE_COMFY_ENV"):
        env.pop(v, None)
    # the child runs elsewhere: the bulkhead this process imported, by its absolute path
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(bulkhead.__file__)))] +
                                        [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([python, "-c", NAMES_PROBE, *real], input=json.dumps(sorted(names)), capture_output=True,
                       text=True, env=env, timeout=300, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise RuntimeError(f"importing comfy-env's names under bulkhead failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def covers(span, version, version_key):
    """Whether legacy.NAMES' "first-last" span (x: any) names version."""
    span = span.split("(")[0].strip()
    lo, _, hi = span.partition("-")
    hi = hi or lo

    def bound(s, fill):
        return tuple(fill if p == "x" else int(p) for p in s.strip().split("."))
    v = version_key(version)
    return bound(lo, 0) <= v <= bound(hi, 10 ** 6)
