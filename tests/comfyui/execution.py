"""A skeleton of ComfyUI's top-level `execution` module (tests only): the
prompt queue and an executor that runs a prompt's nodes in order.

As upstream: `PromptQueue` holds queued items `(number, prompt_id, prompt,
extra_data, outputs)`, `get()` moves one to `currently_running`,
`task_done()` files it in `history`; `set_flag`/`get_flags` carry the
/free request to the prompt worker (get_flags resets them).
`PromptExecutor.execute()` tells every registered cache provider
(comfy_execution.cache_provider) that the prompt starts, runs it, and in
a `finally` that it ended -- the lifecycle hook of upstream's CacheProvider
API; `reset()` drops the output cache (what /free's free_memory does).

The executor here is deliberately small: a prompt is {node_id:
{"class_type", "inputs"}} whose inputs are plain values (no links), run in
order through nodes.NODE_CLASS_MAPPINGS; outputs are cached by (class,
inputs) until reset().  Written for bulkhead from a reading of upstream's
behaviour; no upstream code.
"""

import heapq
import threading

import nodes
from comfy_execution import cache_provider


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
            self.history[item[1]] = dict(prompt=item, outputs={}, status=status, **history_result)
        self.server.queue_updated()

    def get_tasks_remaining(self):
        with self.mutex:
            return len(self.queue) + len(self.currently_running)

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


class PromptExecutor:
    def __init__(self, server, cache_type=None, cache_size=None):
        self.server = server
        self.reset()

    def reset(self):
        self.outputs = {}        # (class_type, inputs) -> result
        self.success = True
        self.history_result = {}
        self.status_messages = []

    def _lifecycle(self, phase, prompt_id):
        for provider in cache_provider._get_cache_providers():
            try:
                (provider.on_prompt_start if phase == "start" else provider.on_prompt_end)(prompt_id)
            except Exception:
                pass  # upstream logs and goes on: a provider never stops a prompt

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        self.server.client_id = extra_data.get("client_id")
        self.status_messages = []
        self._lifecycle("start", prompt_id)
        try:
            self.success = True
            for node_id, spec in prompt.items():
                key = (spec["class_type"], repr(sorted(spec.get("inputs", {}).items())))
                if key in self.outputs:
                    continue
                self.server.last_node_id = node_id
                cls = nodes.NODE_CLASS_MAPPINGS[spec["class_type"]]
                obj = cls()
                try:
                    self.outputs[key] = getattr(obj, cls.FUNCTION)(**spec.get("inputs", {}))
                except Exception as e:
                    self.success = False
                    self.status_messages.append(("execution_error", {"node_id": node_id, "message": str(e)}))
                    break
            self.history_result = {"outputs": {}, "meta": {}}
            self.server.last_node_id = None
        finally:
            self._lifecycle("end", prompt_id)
