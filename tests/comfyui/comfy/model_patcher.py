"""A minimal ModelPatcher: a torch module plus where it loads and offloads,
with the loading semantics ComfyUI's memory manager relies on.

No weight patches (LoRA), hooks, wrappers or injections: a patcher here
moves a module's weights between `offload_device` and `load_device`, whole
or leaf module by leaf module, and keeps the bookkeeping upstream keeps on
the module itself (so clones, which share the module, share it too):

    model.device                       where the module was last loaded to
    model.model_loaded_weight_memory   bytes of weights on the load device
    model.model_lowvram                some weights stay offloaded
    model.lowvram_patch_counter        (always 0 here: no patches)
    model.model_offload_buffer_memory  bytes kept free for streaming weights

Loading a budget: leaf modules (those holding parameters), largest first,
are moved while the bytes loaded so far plus the module plus its streaming
buffer (the module itself and the next NUM_STREAMS modules) stay under the
budget; a budget above what is left loads the whole module.  Partial
unloading walks the loaded leaves smallest first, moving each to the
offload device until more than was asked for (plus any growth of the
streaming buffer) has been freed, and returns the bytes it moved.

On the CPU load and offload devices are the same: moving frees no RAM and
the byte counts are bookkeeping only.  Real RAM is only given back when the
module itself is freed.
"""

import logging
import uuid

import torch

import comfy.model_management
import comfy.utils


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self.size = size
        self.model = model
        if getattr(self.model, "device", None) is None:
            self.model.device = offload_device
        self.load_device = load_device
        self.offload_device = offload_device
        self.weight_inplace_update = weight_inplace_update
        self.patches = {}
        self.backup = {}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.model_options = {"transformer_options": {}}
        self.patches_uuid = uuid.uuid4()
        self.parent = None
        self.additional_models = {}
        self.clone_base_uuid = uuid.uuid4()
        for name, default in (("model_loaded_weight_memory", 0), ("lowvram_patch_counter", 0),
                              ("model_lowvram", False), ("current_weight_patches_uuid", None),
                              ("model_offload_buffer_memory", 0)):
            if not hasattr(self.model, name):
                setattr(self.model, name, default)

    # -- what the memory manager asks ------------------------------------------

    def is_dynamic(self):
        return False

    def model_size(self):
        if self.size <= 0:
            self.size = comfy.model_management.module_size(self.model)
        return self.size

    def loaded_size(self):
        return self.model.model_loaded_weight_memory

    def lowvram_patch_counter(self):
        return self.model.lowvram_patch_counter

    def current_loaded_device(self):
        return self.model.device

    def model_dtype(self):
        if hasattr(self.model, "get_dtype"):
            return self.model.get_dtype()
        return None

    def loaded_ram_size(self):
        return 0

    def pinned_memory_size(self):
        return 0

    def partially_unload_ram(self, ram_to_unload, subsets=None):
        return 0

    def clone(self):
        """A patcher over the same module (weights and bookkeeping shared),
        with its own options; the original becomes its parent."""
        n = self.__class__(self.model, self.load_device, self.offload_device, self.model_size(),
                           weight_inplace_update=self.weight_inplace_update)
        n.patches = {k: list(v) for k, v in self.patches.items()}
        n.patches_uuid = self.patches_uuid
        n.object_patches = dict(self.object_patches)
        n.model_options = _copy_options(self.model_options)
        n.backup = self.backup
        n.object_patches_backup = self.object_patches_backup
        n.parent = self
        n.additional_models = {k: [m.clone() for m in v] for k, v in self.additional_models.items()}
        n.clone_base_uuid = self.clone_base_uuid
        return n

    def is_clone(self, other):
        return hasattr(other, "model") and self.model is other.model

    def _patch_objects(self, transform):
        """Apply `transform` to every patch object in the transformer options
        (and the function wrapper), replacing it with what it returns."""
        to = self.model_options["transformer_options"]
        for patch_list in to.get("patches", {}).values():
            for i in range(len(patch_list)):
                patch_list[i] = transform(patch_list[i])
        for patch_map in to.get("patches_replace", {}).values():
            for k in patch_map:
                patch_map[k] = transform(patch_map[k])
        if "model_function_wrapper" in self.model_options:
            self.model_options["model_function_wrapper"] = transform(self.model_options["model_function_wrapper"])

    def model_patches_to(self, device):
        self._patch_objects(lambda p: p.to(device) if hasattr(p, "to") else p)

    def model_patches_models(self):
        found = []

        def collect(p):
            if hasattr(p, "models"):
                found.extend(p.models())
            return p

        self._patch_objects(collect)
        return found

    def set_model_patch(self, patch, name):
        patches = self.model_options["transformer_options"].setdefault("patches", {})
        patches[name] = patches.get(name, []) + [patch]

    def set_additional_models(self, key, models):
        self.additional_models[key] = models

    def remove_additional_models(self, key):
        self.additional_models.pop(key, None)

    def get_additional_models_with_key(self, key):
        return self.additional_models.get(key, [])

    def get_additional_models(self):
        return [m for models in self.additional_models.values() for m in models]

    def get_nested_additional_models(self):
        """Additional models, then theirs, breadth first, each once."""
        out = self.get_additional_models()
        seen = set(out)
        frontier = out
        while frontier:
            nxt = []
            for m in frontier:
                for c in m.get_additional_models():
                    if c not in seen:
                        seen.add(c)
                        nxt.append(c)
            out = out + nxt
            frontier = nxt
        return out

    def add_object_patch(self, name, obj):
        self.object_patches[name] = obj

    def cleanup(self):
        pass

    # -- moving weights ----------------------------------------------------------

    def _leaves(self):
        """(offload bytes, bytes, name, module, param names) for every module
        that holds parameters itself and whose children hold none."""
        out = []
        for name, m in self.model.named_modules():
            own = [n for n, _ in m.named_parameters(recurse=False)]
            if any(n not in own for n, _ in m.named_parameters(recurse=True)):
                continue
            if own or hasattr(m, "comfy_cast_weights"):
                size = comfy.model_management.module_size(m)
                out.append((size, size, name, m, own))
        return out

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        streams = comfy.model_management.NUM_STREAMS
        loading = sorted(self._leaves(), key=lambda x: (x[0], x[1], x[2]), reverse=True)
        loaded_bytes = 0
        lowvram = 0
        buffer = 0
        whole = []
        for i, (offload_size, size, name, m, _params) in enumerate(loading):
            upcoming = sum(x[1] for x in loading[i + 1:i + 1 + streams])
            stream_buffer = max(buffer, offload_size + upcoming)
            fits = loaded_bytes + size + stream_buffer < lowvram_model_memory
            if not full_load and hasattr(m, "comfy_cast_weights") and not fits:
                buffer = stream_buffer
                lowvram += 1
                continue
            if full_load or fits:
                loaded_bytes += size
                whole.append(m)
            else:
                buffer = stream_buffer
        for m in whole:
            if getattr(m, "comfy_patched_weights", False):
                continue
            m.comfy_patched_weights = True
        for m in whole:
            m.to(device_to)
        if lowvram > 0:
            logging.info("loaded partially; {:.2f} MB loaded".format(loaded_bytes / (1024 * 1024)))
            self.model.model_lowvram = True
        else:
            logging.info("loaded completely; {:.2f} MB loaded, full load: {}".format(loaded_bytes / (1024 * 1024), full_load))
            self.model.model_lowvram = False
            if full_load:
                self.model.to(device_to)
                loaded_bytes = self.model_size()
        self.model.device = device_to
        self.model.model_loaded_weight_memory = loaded_bytes
        self.model.model_offload_buffer_memory = buffer
        self.model.current_weight_patches_uuid = self.patches_uuid

    def patch_model(self, device_to=None, lowvram_model_memory=0, load_weights=True, force_patch_weights=False):
        for k, obj in self.object_patches.items():
            old = comfy.utils.set_attr(self.model, k, obj)
            self.object_patches_backup.setdefault(k, old)
        if load_weights:
            self.load(device_to, lowvram_model_memory=lowvram_model_memory,
                      force_patch_weights=force_patch_weights, full_load=lowvram_model_memory == 0)
        return self.model

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        if unpatch_weights:
            if self.model.model_lowvram:
                self.model.model_lowvram = False
                self.model.lowvram_patch_counter = 0
            self.model.current_weight_patches_uuid = None
            self.backup.clear()
            if device_to is not None:
                self.model.to(device_to)
                self.model.device = device_to
            self.model.model_loaded_weight_memory = 0
            self.model.model_offload_buffer_memory = 0
            for m in self.model.modules():
                if hasattr(m, "comfy_patched_weights"):
                    del m.comfy_patched_weights
        for k, old in self.object_patches_backup.items():
            comfy.utils.set_attr(self.model, k, old)
        self.object_patches_backup.clear()

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        streams = comfy.model_management.NUM_STREAMS
        leaves = sorted(self._leaves(), key=lambda x: (x[0], x[1], x[2]))
        start_buffer = self.model.model_offload_buffer_memory
        buffer = start_buffer
        recent = [min(buffer / (streams + 1), leaves[0][1])] * streams if leaves else []
        freed = 0
        for offload_size, size, name, m, _params in leaves:
            if memory_to_free + buffer - start_buffer < freed:
                break
            if not getattr(m, "comfy_patched_weights", False):
                continue
            m.to(device_to)
            m.comfy_patched_weights = False
            freed += size
            buffer = max(buffer, offload_size + sum(recent))
            if recent:
                recent.append(size)
                recent.pop(0)
        self.model.model_lowvram = True
        self.model.model_loaded_weight_memory -= freed
        self.model.model_offload_buffer_memory = buffer
        logging.info("Unloaded partially: {:.2f} MB freed, {:.2f} MB remains loaded".format(
            freed / (1024 * 1024), self.model.model_loaded_weight_memory / (1024 * 1024)))
        return freed

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        """Load up to `extra_memory` more bytes (1e32: everything; negative:
        unload that much instead).  Returns the bytes added."""
        stale = self.model.current_weight_patches_uuid is not None and (
            self.model.current_weight_patches_uuid != self.patches_uuid or force_patch_weights)
        held = self.model.model_loaded_weight_memory
        self.unpatch_model(self.offload_device, unpatch_weights=stale)
        if stale:
            extra_memory += held - self.model.model_loaded_weight_memory
        self.patch_model(load_weights=False)
        if extra_memory < 0 and not stale:
            self.partially_unload(self.offload_device, -extra_memory, force_patch_weights=force_patch_weights)
            return 0
        if not self.model.model_lowvram and self.model.model_loaded_weight_memory > 0:
            return 0                                   # already fully loaded
        current = self.model.model_loaded_weight_memory
        full = current + extra_memory > self.model_size()
        try:
            self.load(device_to, lowvram_model_memory=current + extra_memory,
                      force_patch_weights=force_patch_weights, full_load=full)
        except Exception:
            self.detach()
            raise
        return self.model.model_loaded_weight_memory - current

    def detach(self, unpatch_all=True):
        """Leave the load device.  unpatch_all=False is bookkeeping only:
        weights stay where they are."""
        self.model_patches_to(self.offload_device)
        if unpatch_all:
            self.unpatch_model(self.offload_device, unpatch_weights=unpatch_all)
        return self.model


def _copy_options(options):
    if isinstance(options, dict):
        return {k: _copy_options(v) for k, v in options.items()}
    if isinstance(options, list):
        return [_copy_options(v) for v in options]
    return options

