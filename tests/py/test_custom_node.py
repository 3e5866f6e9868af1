"""#25: bulkhead is on in a ComfyUI only while its custom node is in one of
ComfyUI's custom_nodes folders (bulkhead.packimport.custom_node_missing,
the one check the comfy_env start hook, the routes and comfy_pack use):
each shape of the custom node, a disabled one, and the places where it
cannot be told, so bulkhead stays on."""

import os
import sys
import types

import bulkhead
from bulkhead import packimport


def _comfyui(monkeypatch, *folders):
    fp = types.ModuleType("folder_paths")
    fp.get_folder_paths = lambda name: [str(f) for f in folders] if name == "custom_nodes" else []
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    return fp


def test_each_shape_of_the_custom_node_keeps_bulkhead_on(tmp_path, monkeypatch):
    custom = tmp_path / "custom_nodes"
    pack = custom / "some_pack"
    pack.mkdir(parents=True)
    _comfyui(monkeypatch, custom, tmp_path / "not_there")
    assert packimport.custom_node_missing() == [str(custom)]                    # none: off
    assert packimport.custom_node_missing(str(pack)) == [str(custom)]
    # ComfyUI skips a disabled folder (the Manager's Disable): still off
    (custom / "bulkhead.disabled" / "python" / "bulkhead").mkdir(parents=True)
    (custom / "bulkhead.disabled" / "python" / "bulkhead" / "__init__.py").write_text("")
    assert packimport.custom_node_missing() == [str(custom)]
    # a clone: the package at python/bulkhead/
    (custom / "ComfyUI-bulkhead" / "python" / "bulkhead").mkdir(parents=True)
    (custom / "ComfyUI-bulkhead" / "python" / "bulkhead" / "__init__.py").write_text("")
    assert packimport.custom_node_missing() is None and packimport.custom_node_missing(str(pack)) is None
    # the package itself linked there
    os.rename(custom / "ComfyUI-bulkhead", tmp_path / "clone")
    os.symlink(os.path.dirname(bulkhead.__file__), custom / "bulkhead")
    assert packimport.custom_node_missing() is None
    os.unlink(custom / "bulkhead")
    assert packimport.custom_node_missing() == [str(custom)]


def test_where_it_cannot_be_told_bulkhead_stays_on(tmp_path, monkeypatch):
    custom = tmp_path / "custom_nodes"
    custom.mkdir()
    monkeypatch.delitem(sys.modules, "folder_paths", raising=False)
    assert packimport.custom_node_missing() is None                      # not ComfyUI
    _comfyui(monkeypatch, custom)
    outside = tmp_path / "elsewhere" / "pack"
    outside.mkdir(parents=True)
    assert packimport.custom_node_missing(str(outside)) is None          # a pack a script loads
    linked = custom / "linked_pack"
    os.symlink(outside, linked)                                          # one ComfyUI loads, linked in
    assert packimport.custom_node_missing(str(linked), str(outside)) == [str(custom)]
    _comfyui(monkeypatch, tmp_path / "no_such_folder")
    assert packimport.custom_node_missing() is None                      # no custom_nodes folder
    monkeypatch.setitem(sys.modules, "folder_paths", types.ModuleType("folder_paths"))
    assert packimport.custom_node_missing() is None                      # no get_folder_paths
    _comfyui(monkeypatch, custom)
    worker = types.ModuleType("bulkhead.worker")
    worker._peer = object()
    monkeypatch.setitem(sys.modules, "bulkhead.worker", worker)
    assert packimport.custom_node_missing() is None                      # a bulkhead worker
