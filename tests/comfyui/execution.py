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
naming an existing node and an output whose type fits the input's (as
upstream's validate_node_input: the types' own != first, then a shared
comma-separated member; not checked where VALIDATE_INPUTS takes
input_types), a literal converted (in the prompt the node runs with) for
each of INT, FLOAT, STRING and BOOLEAN the input's type == in turn, within
min/max, combo values in their list; literals named in VALIDATE_INPUTS's
signature skip those checks and are passed to it, and its answer (True or
a message) decides.  It answers
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
{"ui": ..., "result": ...}, or, a V3 node (comfy_api.latest.io), an
io.NodeOutput: V3 nodes run as upstream runs them, their FUNCTION called on
a clone of the class carrying the hidden values the schema asks for
(unique id, prompt, a DynamicPrompt, extra_pnginfo, the auth keys), async
ones awaited; fingerprint_inputs / validate_inputs / check_lazy_status are
the node's own overrides; NOT_IDEMPOTENT keeps a node from sharing another
node's cached outputs.  Nodes run under
torch.inference_mode(), and a V1 or V3 node whose FUNCTION is async runs
as a task of the prompt's event loop: the executor goes on with the nodes
that do not need it and comes back when it has ended, so async nodes
overlap (the tasks left when the prompt stops are cancelled).  Lazy
inputs: a node with check_lazy_status gets
None for its unevaluated lazy links and is asked until it wants no more.
An `expand` adds its graph's nodes (their display node the expanding node),
runs those the result links to and the output nodes among them, and the
result's links become the node's outputs.  A `block_execution` makes the
outputs ExecutionBlockers (as does a node returning one): a node getting
one is not run and passes it on, a blocker with a message first sent as
an execution_error event ("Execution Blocked: ...") and passed on
silently.  A V1 node's hidden inputs are its UNIQUE_ID, PROMPT,
DYNPROMPT (the DynamicPrompt, expansions' nodes included) and
EXTRA_PNGINFO; before a node's FUNCTION runs the GraphBuilder's default
prefix is set to the node's id and call index, as upstream's
pre_execute_cb sets it.  Lists, as upstream's _map_node_over_list: an
output a V1 node's OUTPUT_IS_LIST marks is a list (ListOutput) handed on
item by item: a node getting one is called once per item (the shorter
lists' last item repeated), its outputs of all calls lists in turn (an
OUTPUT_IS_LIST one's lists joined) and its ui's lists joined; an
INPUT_IS_LIST node is called once with every input a list (a widget's
and a hidden value a list of one).  The websocket hears execution_start,
execution_cached, executing, executed (a node's ui), execution_success,
execution_error or execution_interrupted, with upstream's fields.  Not
here: a V3 node's lists (is_input_list, is_output_list), lists under
async nodes, blockers or expansions, the V3 node info, upstream's execution list (nodes run depth first), the LRU/RAM
caches (the classic one's is: outputs no node of the prompt would read
are dropped as it starts).  `reset()` drops the
output cache and the node objects (what /free's free_memory does).

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import asyncio
import copy
import heapq
import inspect
import threading
import time
import traceback

import nodes
from comfy_api.internal import _ComfyNodeInternal, _NodeOutputInternal, first_real_override
from comfy_api.latest import io
from comfy_execution import cache_provider
from comfy_execution.graph import DynamicPrompt
from comfy_execution.graph_utils import ExecutionBlocker, GraphBuilder

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

def is_v3(cls):
    return isinstance(cls, type) and issubclass(cls, _ComfyNodeInternal)


def _node_method(cls, v3_name, v1_name):
    """A V3 node's own override of v3_name (not ComfyNode's placeholder),
    or a V1 node's v1_name; None when there is none."""
    if is_v3(cls):
        return first_real_override(cls, v3_name)
    return getattr(cls, v1_name, None)


def _hidden_inputs(cls, node_id, prompt, extra_data, dynprompt=None):
    """The V3 hidden values the node's schema asks for, keyed by io.Hidden."""
    if not is_v3(cls):
        return {}
    _inputs, schema = cls.INPUT_TYPES(include_hidden=False, return_schema=True)
    values = {io.Hidden.unique_id: node_id, io.Hidden.prompt: prompt, io.Hidden.dynprompt: dynprompt,
              io.Hidden.extra_pnginfo: extra_data.get("extra_pnginfo"),
              io.Hidden.auth_token_comfy_org: extra_data.get("auth_token_comfy_org"),
              io.Hidden.api_key_comfy_org: extra_data.get("api_key_comfy_org")}
    return {h: values[h] for h in schema.hidden or () if h in values}


def _call_node(cls, name, kwargs, hidden, obj=None):
    """Calls method `name` as upstream does: a V3 node's on a clone of its
    class carrying the hidden values, a V1 node's on obj (or the class).
    Returns what it returned (a coroutine for an async method)."""
    if is_v3(cls):
        cls.VALIDATE_CLASS()
        clone = cls.PREPARE_CLASS_CLONE(hidden)
        return getattr(cls, name).__func__(clone, **kwargs)
    return getattr(obj if obj is not None else cls, name)(**kwargs)


async def resolve_map_node_over_list_results(results):
    """Upstream's: a node method's results, each task among them awaited
    (an async method's, or a task a validator returned)."""
    return [await x if isinstance(x, asyncio.Task) else x for x in results]


async def _awaited(aw):
    return await aw


class ListOutput(list):
    """An output that is a list of values, handed on item by item (see the
    module's docstring)."""


def _over_lists(cls, kwargs):
    """The calls a node's FUNCTION gets for these inputs, as upstream's
    _map_node_over_list: one with every input a list (INPUT_IS_LIST), one
    per item where an input is a ListOutput (a list of one: its item),
    else the one call as it is."""
    if getattr(cls, "INPUT_IS_LIST", False) is True and not is_v3(cls):
        return [{k: (list(v) if isinstance(v, ListOutput) else [v]) for k, v in kwargs.items()}]
    n = max((len(v) for v in kwargs.values() if isinstance(v, ListOutput)), default=0)
    if not n:
        return [kwargs]
    if n == 1:
        return [{k: (v[0] if isinstance(v, ListOutput) else v) for k, v in kwargs.items()}]
    return [{k: (v[min(i, len(v) - 1)] if isinstance(v, ListOutput) else v) for k, v in kwargs.items()}
            for i in range(n)]


def _merge_list_calls(cls, values):
    """One ui and result from a list-mapped node's calls' answers (each a
    tuple or a {"ui", "result"} dict): each output a ListOutput (an
    OUTPUT_IS_LIST one's lists joined), the ui's lists joined."""
    is_list = getattr(cls, "OUTPUT_IS_LIST", None) or ()
    ui, results = None, []
    for value in values:
        if isinstance(value, dict):
            if value.get("ui") is not None:
                ui = ui or {}
                for k, v in value["ui"].items():
                    ui.setdefault(k, []).extend(v)
            value = value.get("result", ())
        results.append(tuple(value))
    out = []
    for i in range(len(getattr(cls, "RETURN_TYPES", ()))):
        items = ListOutput()
        for r in results:
            if i < len(r):
                items.extend(r[i]) if i < len(is_list) and is_list[i] else items.append(r[i])
        out.append(items)
    return {"ui": ui, "result": tuple(out)}


def _is_link(value):
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
        and isinstance(value[1], int)


def _link_fits(received, wanted):
    """Upstream's validate_node_input (not strict): a link fits where the
    received type is not != the input's (the types' own __ne__ decides
    first, as packs' "any type" strings rely on), or both are strings
    sharing a comma-separated member."""
    if not received != wanted:
        return True
    if not isinstance(received, str) or not isinstance(wanted, str):
        return False
    return bool({t.strip() for t in received.split(",")} & {t.strip() for t in wanted.split(",")})


def _error(kind, message, details="", **extra):
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def _input_types(cls):
    return cls.INPUT_TYPES() if hasattr(cls, "INPUT_TYPES") else None


async def _validate_node(prompt, node_id, validated):
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
    validate_fn = _node_method(cls, "validate_inputs", "VALIDATE_INPUTS")
    if validate_fn is not None:
        spec = inspect.getfullargspec(validate_fn)
        custom = set(spec.args) - ({"cls"} if is_v3(cls) else set())
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
                if "input_types" not in custom and not _link_fits(got, type_):
                    errors.append(_error("return_type_mismatch", "Return type mismatch between linked nodes",
                                         f"{name}, received_type({got}) mismatch input_type({type_})",
                                         received_type=got, linked_node=value, **where))
                    continue
                src_ok, _ = await _validate_node(prompt, src, validated)
                ok = ok and src_ok
                continue
            if name in custom:
                values[name] = value
                continue
            try:   # each in turn, as upstream: a type equal to several converts the value several times
                if type_ == "INT":
                    value = int(value)
                if type_ == "FLOAT":
                    value = float(value)
                if type_ == "STRING":
                    value = str(value)
                if type_ == "BOOLEAN":
                    value = bool(value)
            except (TypeError, ValueError) as e:
                errors.append(_error("invalid_input_type", f"Failed to convert an input value to a {type_} value",
                                     f"{name}, {value}, {e}", received_value=value, **where))
                continue
            inputs[name] = value   # the node runs with the converted value, as upstream's
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
        result = _call_node(cls, "validate_inputs" if is_v3(cls) else "VALIDATE_INPUTS", args,
                            _hidden_inputs(cls, node_id, prompt, {}))
        if inspect.iscoroutine(result):     # an async validator: upstream runs it as a task
            result = asyncio.create_task(result)
        [result] = await resolve_map_node_over_list_results([result])
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
            ok, _ = await _validate_node(prompt, out, validated)
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
        if _node_method(cls, "fingerprint_inputs", "IS_CHANGED") is not None:
            literal = {k: v for k, v in inputs.items() if not _is_link(v)}
            try:
                changed = _call_node(cls, "fingerprint_inputs" if is_v3(cls) else "IS_CHANGED", literal,
                                     _hidden_inputs(cls, node_id, prompt, {}))
                if inspect.isawaitable(changed):
                    changed = asyncio.run(changed)
            except Exception:
                changed = float("nan")
            if isinstance(changed, float) and changed != changed:
                changed = ("always", object())   # never equal to any earlier signature
        memo[node_id] = (spec["class_type"], repr(changed) if not isinstance(changed, tuple) else changed,
                         tuple(parts), node_id if getattr(cls, "NOT_IDEMPOTENT", False) else None)
        return memo[node_id]

    def _hidden(self, cls, node_id, prompt, extra_data, dynprompt):
        if is_v3(cls):
            return {}
        hidden = ((_input_types(cls) or {}).get("hidden") or {})
        out = {}
        for name, kind in hidden.items():
            if kind == "UNIQUE_ID":
                out[name] = node_id
            elif kind == "PROMPT":
                out[name] = prompt
            elif kind == "DYNPROMPT":
                out[name] = dynprompt
            elif kind == "EXTRA_PNGINFO":
                out[name] = extra_data.get("extra_pnginfo")
        return out

    @staticmethod
    def _lazy_links(cls, inputs):
        """The linked inputs the node declares lazy (left for check_lazy_status)."""
        if _node_method(cls, "check_lazy_status", "check_lazy_status") is None:
            return set()
        types = _input_types(cls) or {}
        lazy = set()
        for section in ("required", "optional"):
            for name, info in (types.get(section) or {}).items():
                if len(info) > 1 and isinstance(info[1], dict) and info[1].get("lazy") and _is_link(inputs.get(name)):
                    lazy.add(name)
        return lazy

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        import comfy.model_management as mm
        import torch
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
            # upstream's classic cache (set_prompt, clean_unused): what no
            # node of this prompt would read goes before it runs
            keep = set(signatures.values())
            for sig in [s for s in self.outputs if s not in keep]:
                del self.outputs[sig]
            cached = [n for n in order if signatures[n] in self.outputs]
            self.add_message("execution_cached", {"nodes": cached, "prompt_id": prompt_id}, broadcast=False)
            dynprompt = DynamicPrompt(prompt)
            results, ui_outputs, meta, executed = {}, {}, {}, []
            parents = {}   # expanded node id -> the node that expanded it

            class Stop(Exception):
                pass

            # Async nodes (a FUNCTION that is a coroutine function), as
            # upstream: the coroutine runs as a task of the prompt's event
            # loop, given one step at once; a node whose task has not ended
            # is left pending (Pending), and the executor goes on with the
            # nodes that do not wait on it, then waits for a task to end and
            # comes back.  Everything runs under torch.inference_mode(), as
            # upstream's execute_async runs the whole prompt.
            loop = asyncio.new_event_loop()
            tasks = {}   # node id -> its FUNCTION's task, not taken yet

            class Pending(BaseException):
                """run(node_id) cannot finish yet: a task it waits on runs."""

            def run(node_id, wait=False):
                """Runs node_id (and what it needs); wait: until its
                tasks end, rather than Pending (an expansion's nodes)."""
                if node_id in results:
                    return
                spec = dynprompt.get_node(node_id)
                cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
                inputs = spec.get("inputs", {})
                sig = signatures.get(node_id)
                if sig is not None and sig in self.outputs:
                    results[node_id], ui = self.outputs[sig]
                    record_ui(node_id, ui)
                    return
                lazy = self._lazy_links(cls, inputs)
                waiting = []
                for name, v in inputs.items():
                    if _is_link(v) and name not in lazy:
                        try:
                            run(v[0])
                        except Pending:
                            waiting.append(v[0])
                if waiting and not wait:
                    raise Pending()
                for n in waiting:
                    run(n, True)

                def gather():
                    kwargs = {}
                    for name, v in inputs.items():
                        if not _is_link(v):
                            kwargs[name] = v
                        elif v[0] in results:
                            kwargs[name] = results[v[0]][v[1]]
                        else:
                            kwargs[name] = None   # a lazy input not evaluated (yet)
                    return kwargs
                kwargs = gather()
                hidden = _hidden_inputs(cls, node_id, prompt, extra_data, dynprompt)
                if node_id not in tasks:   # (a node whose task runs was announced)
                    self.server.last_node_id = node_id
                if self.server.client_id is not None and node_id not in tasks:
                    self.server.send_sync("executing", {"node": node_id, "display_node": parents.get(node_id, node_id),
                                                        "prompt_id": prompt_id}, self.server.client_id)
                blocker = next((v for v in kwargs.values() if isinstance(v, ExecutionBlocker)), None)
                try:
                    if blocker is not None:
                        if blocker.message is not None:
                            # upstream's execution_block_cb: the message as an
                            # error event (not the prompt's), and the blocker
                            # goes on silently
                            self.server.send_sync("execution_error", {
                                "prompt_id": prompt_id, "node_id": node_id, "node_type": spec["class_type"],
                                "executed": list(executed), "exception_message": f"Execution Blocked: {blocker.message}",
                                "exception_type": "ExecutionBlocked", "traceback": [], "current_inputs": [],
                                "current_outputs": []}, self.server.client_id)
                            blocker = ExecutionBlocker(None)
                        results[node_id] = tuple([blocker] * len(getattr(cls, "RETURN_TYPES", ())))
                        return
                    obj = self.objects.get((node_id, spec["class_type"]))
                    if obj is None:
                        obj = self.objects[(node_id, spec["class_type"])] = cls()
                    while lazy and node_id not in tasks:
                        wanted = _call_node(cls, "check_lazy_status", kwargs, hidden, obj)
                        if inspect.isawaitable(wanted):
                            wanted = asyncio.run(wanted)
                        todo = [n for n in (wanted or ()) if n in lazy and inputs[n][0] not in results]
                        if not todo:
                            break
                        for n in todo:
                            run(inputs[n][0], wait)
                        kwargs = gather()
                    kwargs.update(self._hidden(cls, node_id, prompt, extra_data, dynprompt))
                    task = tasks.pop(node_id, None)
                    calls = _over_lists(cls, kwargs) if task is None else [kwargs]
                    if len(calls) > 1:
                        values = []
                        for i, call in enumerate(calls):
                            GraphBuilder.set_default_prefix(node_id, i, 0)
                            values.append(_call_node(cls, cls.FUNCTION, call, hidden, obj))
                        value = _merge_list_calls(cls, values)
                    elif task is None:
                        kwargs = calls[0]   # an INPUT_IS_LIST node's lists, a list of one's item
                        # upstream's pre_execute_cb: the nodes a GraphBuilder
                        # makes in this call get ids "<node id>.<call
                        # index>.<graph>."
                        GraphBuilder.set_default_prefix(node_id, 0, 0)
                        value = _call_node(cls, cls.FUNCTION, kwargs, hidden, obj)
                        if inspect.isawaitable(value):
                            task = loop.create_task(_awaited(value))
                            loop.run_until_complete(asyncio.sleep(0))   # its first step, as upstream
                    if task is not None:
                        if not task.done() and not wait:
                            tasks[node_id] = task
                            raise Pending()
                        value = loop.run_until_complete(task)
                except mm.InterruptProcessingException:
                    self.add_message("execution_interrupted", {
                        "prompt_id": prompt_id, "node_id": node_id, "node_type": spec["class_type"],
                        "executed": executed}, broadcast=True)
                    raise Stop() from None
                except Stop:
                    raise
                except Exception as e:
                    self.add_message("execution_error", {
                        "prompt_id": prompt_id, "node_id": node_id, "node_type": spec["class_type"],
                        "executed": executed, "exception_message": str(e),
                        "exception_type": _full_type_name(type(e)),
                        "traceback": traceback.format_tb(e.__traceback__),
                        "current_inputs": {k: repr(v)[:200] for k, v in kwargs.items()},
                        "current_outputs": list(results)}, broadcast=False)
                    raise Stop() from None
                ui, expand, block = None, None, None
                if isinstance(value, _NodeOutputInternal):
                    ui = value.ui if value.ui is None or isinstance(value.ui, dict) else value.ui.as_dict()
                    expand, block = value.expand, value.block_execution
                    value = value.args
                elif isinstance(value, dict):
                    ui, expand = value.get("ui"), value.get("expand")
                    value = value.get("result", ())
                if isinstance(value, ExecutionBlocker):   # a blocker for every output
                    value = (value,) * len(getattr(cls, "RETURN_TYPES", ()))
                value = tuple(value) if value is not None else ()
                if len(calls) == 1:   # one call: an OUTPUT_IS_LIST output is its list
                    is_list = (getattr(cls, "OUTPUT_IS_LIST", None) or ()) if not is_v3(cls) else ()
                    value = tuple(ListOutput(v) if i < len(is_list) and is_list[i] else v
                                  for i, v in enumerate(value))
                if block is not None:
                    value = tuple([ExecutionBlocker(block)] * len(getattr(cls, "RETURN_TYPES", ())))
                if expand is not None:
                    value = self._expand(node_id, expand, value, dynprompt, parents, lambda n: run(n, True),
                                         results)
                results[node_id] = value
                if sig is not None and expand is None:
                    self.outputs[sig] = (value, ui)
                executed.append(node_id)
                if ui is not None and self.server.client_id is not None:
                    self.server.send_sync("executed", {"node": node_id, "display_node": parents.get(node_id, node_id),
                                                       "output": ui, "prompt_id": prompt_id},
                                          self.server.client_id)
                record_ui(node_id, ui)

            def record_ui(node_id, ui):
                if ui is not None:
                    ui_outputs[node_id] = ui
                    meta[node_id] = {"node_id": node_id, "display_node": parents.get(node_id, node_id),
                                     "parent_node": parents.get(node_id), "real_node_id": node_id}

            try:
                with torch.inference_mode():
                    todo = [n for n in order
                            if n in (execute_outputs or order) or not self._lazy_only(n, order, prompt)]
                    while todo:
                        left = []
                        for node_id in todo:
                            try:
                                run(node_id)
                            except Pending:
                                left.append(node_id)
                        todo = left
                        if todo:   # each waits on a task: until one ends
                            loop.run_until_complete(asyncio.wait(list(tasks.values()),
                                                                 return_when=asyncio.FIRST_COMPLETED))
            except Stop:
                self.success = False
            finally:   # as asyncio.run ends upstream's prompt: the tasks left are cancelled
                for task in tasks.values():
                    task.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks.values(), return_exceptions=True))
                loop.close()
            if self.success:
                self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
            self.history_result = {"outputs": ui_outputs, "meta": meta}
            self.server.last_node_id = None
        finally:
            self._lifecycle("end", prompt_id)

    def _lazy_only(self, node_id, order, prompt):
        """Whether node_id is reached only through lazy inputs (run() runs
        it when check_lazy_status asks)."""
        for other in order:
            spec = prompt[other]
            cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
            inputs = spec.get("inputs", {})
            lazy = self._lazy_links(cls, inputs)
            for name, v in inputs.items():
                if _is_link(v) and v[0] == node_id and name not in lazy:
                    return False
        return True

    @staticmethod
    def _expand(node_id, graph, value, dynprompt, parents, run, results):
        """A node's expansion: its graph's nodes join the prompt (parent:
        node_id), the ones its result links to and the output nodes among
        them run, and the node's outputs are what its result links to."""
        for new_id, info in graph.items():
            dynprompt.add_ephemeral_node(new_id, info, node_id)
            parents[new_id] = parents.get(node_id, node_id)
        for new_id, info in graph.items():
            if getattr(nodes.NODE_CLASS_MAPPINGS[info["class_type"]], "OUTPUT_NODE", False):
                run(new_id)
        out = []
        for v in value:
            if _is_link(v) and v[0] in graph:
                run(v[0])
                out.append(results[v[0]][v[1]])
            else:
                out.append(v)
        return tuple(out)
