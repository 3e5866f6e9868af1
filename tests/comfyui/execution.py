"""A skeleton of ComfyUI's top-level `execution` module (tests only): the
prompt queue, the validation POST /prompt runs, and an executor that runs a
prompt's nodes in dependency order with an output cache.

As upstream: `PromptQueue` holds queued items `(number, prompt_id, prompt,
extra_data, outputs)`, `get()` moves one to `currently_running`,
`task_done()` files it in `history` with the executor's `outputs` (each
output node's `ui` dict) and `meta`; `set_flag`/`get_flags` carry the
/free request to the prompt worker (get_flags resets them).

`validate_prompt()` (a coroutine: the server awaits it on its event loop,
and a node's VALIDATE_INPUTS runs right there, inline, as upstream's does)
checks that every node names a known class, that there is an output node,
and, for each node an output depends on: required inputs present, links
naming an existing node and an output of the linked type, INT/FLOAT/
BOOLEAN/STRING values converted and within min/max, combo values in their
list; inputs named in VALIDATE_INPUTS's signature skip those checks and are
passed to it, and its answer (True or a message) decides.  It answers
upstream's tuple (valid, error, outputs, node_errors) with upstream's error
types.  One leniency: a class without INPUT_TYPES (the route tests' bare
nodes) is taken as given and counts as an output.

`PromptExecutor.execute()` tells every registered cache provider
(comfy_execution.cache_provider) that the prompt starts, clears the
interrupt flag, runs every node the outputs need (depth first, inputs
before the node), and in a `finally` tells the providers it ended.  A node
whose input signature -- class, IS_CHANGED's answer, its literal inputs and
the signatures of what it links to -- was seen before is not run again (its
outputs come from the cache; NaN from IS_CHANGED means always run); node
objects are kept per node id and class.  A node returns a tuple or
{"ui": ..., "result": ...}.  The websocket hears execution_start,
execution_cached, executing, executed (a node's ui), execution_success,
execution_error or execution_interrupted, with upstream's fields.  Not
here: list inputs/outputs (INPUT_IS_LIST, OUTPUT_IS_LIST), lazy inputs,
subgraph expansion, async nodes, the LRU/RAM caches.  `reset()` drops the
output cache and the node objects (what /free's free_memory does).

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import copy
import heapq
import inspect
import threading
import time
import traceback

import nodes
from comfy_execution import cache_provider

MAXIMUM_HISTORY_SIZE = 10000


class PromptQueue:
    def __init__(self, server):
        self.server = server
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.task_counter = 0
        self.queue = []
        self.currently_running = {}
        self.history = {}
        self.flags = {}

    def put(self, item):
        with self.mutex:
            heapq.heappush(self.queue, item)
            self.not_empty.notify()
        self.server.queue_updated()

    def get(self, timeout=None):
        with self.not_empty:
            while not self.queue:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and not self.queue:
                    return None
            item = heapq.heappop(self.queue)
            i = self.task_counter
            self.currently_running[i] = item
            self.task_counter += 1
        self.server.queue_updated()
        return item, i

    def task_done(self, item_id, history_result, status=None):
        with self.mutex:
            item = self.currently_running.pop(item_id)
            if len(self.history) > MAXIMUM_HISTORY_SIZE:
                self.history.pop(next(iter(self.history)))
            self.history[item[1]] = dict({"prompt": item, "outputs": {}, "status": copy.deepcopy(status)},
                                         **history_result)
        self.server.queue_updated()

    def get_current_queue(self):
        with self.mutex:
            return list(self.currently_running.values()), copy.deepcopy(self.queue)

    def get_current_queue_volatile(self):
        with self.mutex:
            return list(self.currently_running.values()), list(self.queue)

    def get_tasks_remaining(self):
        with self.mutex:
            return len(self.queue) + len(self.currently_running)

    def wipe_queue(self):
        with self.mutex:
            self.queue = []
        self.server.queue_updated()

    def delete_queue_item(self, function):
        with self.mutex:
            for i, item in enumerate(self.queue):
                if function(item):
                    self.queue.pop(i)
                    heapq.heapify(self.queue)
                    break
            else:
                return False
        self.server.queue_updated()
        return True

    def get_history(self, prompt_id=None, max_items=None, offset=-1):
        with self.mutex:
            if prompt_id is not None:
                return copy.deepcopy({prompt_id: self.history[prompt_id]}) if prompt_id in self.history else {}
            keys = list(self.history)
            if offset < 0 and max_items is not None:
                offset = len(keys) - max_items
            keys = keys[max(offset, 0):]
            if max_items is not None:
                keys = keys[:max_items]
            return copy.deepcopy({k: self.history[k] for k in keys})

    def wipe_history(self):
        with self.mutex:
            self.history = {}

    def delete_history_item(self, id_to_delete):
        with self.mutex:
            self.history.pop(id_to_delete, None)

    def set_flag(self, name, data):
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self, reset=True):
        with self.mutex:
            if reset:
                flags, self.flags = self.flags, {}
                return flags
            return dict(self.flags)


# ------------------------------------------------------------ validation

def _is_link(value):
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
        and isinstance(value[1], int)


def _error(kind, message, details="", **extra):
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def _input_types(cls):
    return cls.INPUT_TYPES() if hasattr(cls, "INPUT_TYPES") else None


def _validate_node(prompt, node_id, validated):
    """(ok, errors) for node_id and what it links to, memoised in validated."""
    if node_id in validated:
        return validated[node_id]
    validated[node_id] = (True, [])   # a cycle stops here
    spec = prompt[node_id]
    cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
    types = _input_types(cls)
    if types is None:
        validated[node_id] = (True, [])
        return validated[node_id]
    inputs = spec.get("inputs", {})
    custom = set()
    validate_fn = getattr(cls, "VALIDATE_INPUTS", None)
    if validate_fn is not None:
        custom = set(inspect.signature(validate_fn).parameters)
    errors, values, ok = [], {}, True
    for section in ("required", "optional"):
        for name, info in (types.get(section) or {}).items():
            type_ = info[0]
            extra = info[1] if len(info) > 1 and isinstance(info[1], dict) else {}
            where = {"input_name": name, "input_config": info}
            if name not in inputs:
                if section == "required":
                    errors.append(_error("required_input_missing", "Required input is missing",
                                         name, input_name=name))
                continue
            value = inputs[name]
            if _is_link(value):
                src, index = value
                if src not in prompt:
                    errors.append(_error("invalid_input_link", "Linked node does not exist",
                                         f"{name}: node {src}", **where))
                    continue
                src_cls = nodes.NODE_CLASS_MAPPINGS[prompt[src]["class_type"]]
                returns = getattr(src_cls, "RETURN_TYPES", ())
                if index >= len(returns):
                    errors.append(_error("invalid_input_link", "Linked output does not exist",
                                         f"{name}: output {index} of node {src}", **where))
                    continue
                got = returns[index]
                if name not in custom and isinstance(type_, str) and got != type_ \
                        and "*" not in (got, type_) and not set(str(type_).split(",")) & set(str(got).split(",")):
                    errors.append(_error("return_type_mismatch", "Return type mismatch between linked nodes",
                                         f"{name}, received_type({got}) mismatch input_type({type_})",
                                         received_type=got, linked_node=value, **where))
                    continue
                src_ok, _ = _validate_node(prompt, src, validated)
                ok = ok and src_ok
                continue
            if name in custom:
                values[name] = value
                continue
            try:
                if type_ == "INT":
                    value = int(value)
                elif type_ == "FLOAT":
                    value = float(value)
                elif type_ == "STRING":
                    value = str(value)
                elif type_ == "BOOLEAN":
                    value = bool(value)
            except (TypeError, ValueError) as e:
                errors.append(_error("invalid_input_type", f"Failed to convert an input value to a {type_} value",
                                     f"{name}, {value}, {e}", received_value=value, **where))
                continue
            if type_ in ("INT", "FLOAT"):
                if "min" in extra and value < extra["min"]:
                    errors.append(_error("value_smaller_than_min", f"Value {value} smaller than min of {extra['min']}",
                                         name, received_value=value, **where))
                    continue
                if "max" in extra and value > extra["max"]:
                    errors.append(_error("value_bigger_than_max", f"Value {value} bigger than max of {extra['max']}",
                                         name, received_value=value, **where))
                    continue
            if isinstance(type_, list) and value not in type_:
                errors.append(_error("value_not_in_list", "Value not in list",
                                     f"{name}: '{value}' not in {type_}", received_value=value, **where))
                continue
            values[name] = value
    if validate_fn is not None and not errors:
        args = {k: v for k, v in values.items() if k in custom}
        if "input_types" in custom:
            args["input_types"] = {k: getattr(nodes.NODE_CLASS_MAPPINGS[prompt[v[0]]["class_type"]],
                                              "RETURN_TYPES")[v[1]]
                                   for k, v in inputs.items() if _is_link(v)}
        result = validate_fn(**args)   # inline, on the server's event loop, as upstream
        if result is not True:
            errors.append(_error("custom_validation_failed", "Custom validation failed for node",
                                 f"{', '.join(sorted(args))}: {result}"))
    validated[node_id] = (ok and not errors, errors)
    return validated[node_id]


async def validate_prompt(prompt_id, prompt, partial_execution_targets=None):
    """(valid, error, outputs to execute, node_errors), as upstream's."""
    outputs = []
    for node_id, spec in prompt.items():
        if not isinstance(spec, dict) or "class_type" not in spec:
            return (False, _error("invalid_prompt", f"Cannot execute because a node is missing the "
                                  f"class_type property.", f"Node ID '#{node_id}'"), [], {})
        cls = nodes.NODE_CLASS_MAPPINGS.get(spec["class_type"])
        if cls is None:
            return (False, _error("missing_node_type", f"Node '{spec['class_type']}' not found. The custom "
                                  "node may not be installed.", f"Node ID '#{node_id}'",
                                  node_id=node_id, class_type=spec["class_type"]), [], {})
        if getattr(cls, "OUTPUT_NODE", False) or not hasattr(cls, "INPUT_TYPES"):
            if partial_execution_targets is None or node_id in partial_execution_targets:
                outputs.append(node_id)
    if not outputs:
        return (False, _error("prompt_no_outputs", "Prompt has no outputs"), [], {})
    validated, good, node_errors = {}, [], {}
    for out in outputs:
        try:
            ok, _ = _validate_node(prompt, out, validated)
        except Exception as e:   # upstream reports a crashing validation the same way
            ok = False
            validated[out] = (False, [_error("exception_during_validation", "Exception when validating node",
                                             str(e), traceback=traceback.format_exc())])
        if ok:
            good.append(out)
    for node_id, (_ok, errs) in validated.items():
        if errs:
            node_errors[node_id] = {"errors": errs, "dependent_outputs": [o for o in outputs if o == node_id],
                                    "class_type": prompt[node_id]["class_type"]}
    if not good:
        return (False, _error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                              "\n".join(f"{e['message']}: {e['details']}" for v in node_errors.values()
                                        for e in v["errors"])), [], node_errors)
    return (True, None, good, node_errors)


# ------------------------------------------------------------ execution

def _full_type_name(klass):
    module = klass.__module__
    return klass.__qualname__ if module == "builtins" else module + "." + klass.__qualname__


class PromptExecutor:
    def __init__(self, server, cache_type=None, cache_size=None):
        self.server = server
        self.reset()

    def reset(self):
        self.outputs = {}        # input signature -> (result tuple, ui or None)
        self.objects = {}        # (node_id, class_type) -> node object
        self.success = True
        self.history_result = {}
        self.status_messages = []

    def add_message(self, event, data, broadcast):
        data = dict(data, timestamp=int(time.time() * 1000))
        self.status_messages.append((event, data))
        if self.server.client_id is not None or broadcast:
            self.server.send_sync(event, data, self.server.client_id)

    def _lifecycle(self, phase, prompt_id):
        for provider in cache_provider._get_cache_providers():
            try:
                (provider.on_prompt_start if phase == "start" else provider.on_prompt_end)(prompt_id)
            except Exception:
                pass  # upstream logs and goes on: a provider never stops a prompt

    def _signature(self, prompt, node_id, memo):
        if node_id in memo:
            return memo[node_id]
        spec = prompt[node_id]
        cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
        inputs = spec.get("inputs", {})
        parts = []
        for name in sorted(inputs):
            v = inputs[name]
            parts.append((name, ("link", self._signature(prompt, v[0], memo), v[1]) if _is_link(v) else repr(v)))
        changed = None
        if hasattr(cls, "IS_CHANGED"):
            literal = {k: v for k, v in inputs.items() if not _is_link(v)}
            try:
                changed = cls.IS_CHANGED(**literal)
            except Exception:
                changed = float("nan")
            if isinstance(changed, float) and changed != changed:
                changed = ("always", object())   # never equal to any earlier signature
        memo[node_id] = (spec["class_type"], repr(changed) if not isinstance(changed, tuple) else changed,
                         tuple(parts))
        return memo[node_id]

    def _hidden(self, cls, node_id, prompt, extra_data):
        hidden = ((_input_types(cls) or {}).get("hidden") or {})
        out = {}
        for name, kind in hidden.items():
            if kind == "UNIQUE_ID":
                out[name] = node_id
            elif kind == "PROMPT":
                out[name] = prompt
            elif kind == "EXTRA_PNGINFO":
                out[name] = extra_data.get("extra_pnginfo")
        return out

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        import comfy.model_management as mm
        nodes.interrupt_processing(False)
        self.server.client_id = extra_data.get("client_id")
        self.status_messages = []
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)
        self._lifecycle("start", prompt_id)
        try:
            self.success = True
            order, seen = [], set()

            def visit(node_id):
                if node_id in seen:
                    return
                seen.add(node_id)
                for v in prompt[node_id].get("inputs", {}).values():
                    if _is_link(v) and v[0] in prompt:
                        visit(v[0])
                order.append(node_id)
            for out in (execute_outputs or list(prompt)):
                visit(out)

            memo = {}
            signatures = {n: self._signature(prompt, n, memo) for n in order}
            cached = [n for n in order if signatures[n] in self.outputs]
            self.add_message("execution_cached", {"nodes": cached, "prompt_id": prompt_id}, broadcast=False)
            results, ui_outputs, meta, executed = {}, {}, {}, []
            for node_id in order:
                spec = prompt[node_id]
                cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
                sig = signatures[node_id]
                if sig in self.outputs:
                    results[node_id], ui = self.outputs[sig]
                else:
                    self.server.last_node_id = node_id
                    if self.server.client_id is not None:
                        self.server.send_sync("executing", {"node": node_id, "display_node": node_id,
                                                            "prompt_id": prompt_id}, self.server.client_id)
                    kwargs = {}
                    for name, v in spec.get("inputs", {}).items():
                        kwargs[name] = results[v[0]][v[1]] if _is_link(v) else v
                    kwargs.update(self._hidden(cls, node_id, prompt, extra_data))
                    try:
                        obj = self.objects.get((node_id, spec["class_type"]))
                        if obj is None:
                            obj = self.objects[(node_id, spec["class_type"])] = cls()
                        value = getattr(obj, cls.FUNCTION)(**kwargs)
                    except mm.InterruptProcessingException:
                        self.add_message("execution_interrupted", {
                            "prompt_id": prompt_id, "node_id": node_id, "node_type": spec["class_type"],
                            "executed": executed}, broadcast=True)
                        self.success = False
                        break
                    except Exception as e:
                        self.add_message("execution_error", {
                            "prompt_id": prompt_id, "node_id": node_id, "node_type": spec["class_type"],
                            "executed": executed, "exception_message": str(e),
                            "exception_type": _full_type_name(type(e)),
                            "traceback": traceback.format_tb(e.__traceback__),
                            "current_inputs": {k: repr(v)[:200] for k, v in kwargs.items()},
                            "current_outputs": list(results)}, broadcast=False)
                        self.success = False
                        break
                    ui = None
                    if isinstance(value, dict):
                        ui = value.get("ui")
                        value = tuple(value.get("result", ()))
                    results[node_id] = tuple(value) if value is not None else ()
                    self.outputs[sig] = (results[node_id], ui)
                    executed.append(node_id)
                    if ui is not None and self.server.client_id is not None:
                        self.server.send_sync("executed", {"node": node_id, "display_node": node_id,
                                                           "output": ui, "prompt_id": prompt_id},
                                              self.server.client_id)
                if ui is not None:
                    ui_outputs[node_id] = ui
                    meta[node_id] = {"node_id": node_id, "display_node": node_id, "parent_node": None,
                                     "real_node_id": node_id}
            if self.success:
                self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
            self.history_result = {"outputs": ui_outputs, "meta": meta}
            self.server.last_node_id = None
        finally:
            self._lifecycle("end", prompt_id)
