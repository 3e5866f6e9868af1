"""One pack spec (#39): channel/spec.py is the one home of a pack's
[bulkhead] settings (a row each, with its default) and of the environment
names a worker reads, both halves of each crossing there.  Checked: no
other product module spells a "BULKHEAD_" name (channel/formats.py's one
such string is a type name, listed with why); envs/config.py
checks the rows spec.py has; and a pack's 0 for a setting reaches its
worker as 0, winning over the host-wide variable of the same name (it
was dropped by `if o.get(...)`: the host-wide value won)."""

import os
import re
import textwrap

import pytest

from nodepacks import COMFY_PACK_INIT, HOST_VERSION, run_host

HERE = os.path.dirname(os.path.abspath(__file__))
PRODUCT = os.path.join(HERE, "..", "..", "python", "bulkhead")

# Modules that still spell a "BULKHEAD_" string of their own, and why: none
# may be added to this list.
NOT_MOVED_YET = {
    # not an environment name: the type name no pack uses (a wire word)
    "channel/formats.py",
}
LITERAL = re.compile(r"""["']BULKHEAD_""")


def _spelling_modules():
    out = set()
    for dirpath, _, files in os.walk(PRODUCT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    if LITERAL.search(fh.read()):
                        out.add(os.path.relpath(path, PRODUCT).replace(os.sep, "/"))
    return out


def test_no_bulkhead_name_is_spelled_outside_the_spec():
    found = _spelling_modules()
    assert "channel/spec.py" in found
    added = found - NOT_MOVED_YET - {"channel/spec.py"}
    assert not added, (f"{sorted(added)} spell a \"BULKHEAD_\" name: give it a row in channel/spec.py (ENV, "
                       f"with to_env/from_env) and use the constant there")
    moved = {f for f in NOT_MOVED_YET - found if os.path.exists(os.path.join(PRODUCT, f))}
    assert not moved, f"{sorted(moved)} no longer spell one: take them off NOT_MOVED_YET"


def test_the_config_reader_checks_the_spec_rows():
    from bulkhead.channel import spec
    from bulkhead.envs import config
    tables = {"seconds": config.OPTIONS, "choice": config.CHOICES, "flag": config.FLAGS, "paths": config.PATH_LISTS}
    for o in spec.OPTIONS:
        assert o.name in tables[o.kind], o
    for name in config.OPTIONS:
        assert spec.BY_NAME[name].kind == "seconds"
    for e in spec.ENV:
        value = e.default if e.default is not None else {"text": "x", "flag": True, "seconds": 0.0, "json": {"a": [1]}}[e.kind]
        assert spec.from_env(e.name, {e.name: spec.to_env(e.name, value)}) == value, e
        assert spec.from_env(e.name, {}) == e.default, e


@pytest.mark.parametrize("name", [o.name for o in __import__("bulkhead.channel.spec").channel.spec.OPTIONS
                                  if o.kind == "seconds" and o.low_ok])
def test_a_packs_zero_is_kept_for_every_setting_that_allows_it(monkeypatch, name):
    """0 ("never") for each setting that allows it is the record's value,
    not the default, and the one the worker or the host-wide reader gets:
    the idle exit's host-wide BULKHEAD_IDLE_EXIT_S does not win over it."""
    from bulkhead.channel import spec
    from bulkhead.host import idle
    s = spec.settings({name: 0})
    assert s[name] == 0.0 and name in s.given
    row = spec.BY_NAME[name]
    if row.env:
        assert spec.from_env(row.env, spec.worker_env(s)) == 0.0
    monkeypatch.setenv(spec.IDLE_EXIT_S, "7")
    assert idle.limit_s(s) == (0.0 if name == "idle_exit_s" else 7.0)


NODES = '''
from bulkhead.channel import spec

class IdleRelease:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self):
        return (spec.from_env(spec.IDLE_RELEASE_S),)

NODE_CLASS_MAPPINGS = {"IdleRelease": IdleRelease}
'''


@pytest.mark.torch
def test_a_packs_zero_reaches_the_worker_over_the_host_wide_variable(tmp_path):
    packs = []
    for name, extra in (("zero_pack", "[bulkhead]\nidle_release_s = 0\n"), ("plain_pack", "")):
        d = tmp_path / name
        d.mkdir()
        (d / "__init__.py").write_text(COMFY_PACK_INIT)
        (d / "nodes.py").write_text(NODES)
        (d / "comfy-env.toml").write_text(f'python = "{HOST_VERSION}"\n' + extra)
        packs.append(str(d))
    r = run_host(tmp_path, packs[0], textwrap.dedent(f"""
        out = {{}}
        for pack in {packs!r}:
            cls = load(pack).NODE_CLASS_MAPPINGS["IdleRelease"]
            out[os.path.basename(pack)] = getattr(cls(), cls.FUNCTION)()[0]
        from bulkhead.host import nodes
        nodes.close_all()
        emit(out)
    """), env={"BULKHEAD_IDLE_RELEASE_S": "7"})
    assert r == {"zero_pack": 0.0, "plain_pack": 7.0}, r
