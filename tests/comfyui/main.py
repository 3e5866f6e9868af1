"""A skeleton of ComfyUI's `main.py` (tests only): only `prompt_worker`,
the loop on the execution thread that runs queued prompts and then acts
on the /free flags, as upstream's does -- `unload_models` (implied by
`free_memory`) calls `unload_all_models()`, `free_memory` resets the
executor's caches.  `stop` ends the loop (upstream's never ends; its
thread is a daemon).  Importing this module starts nothing.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import gc

import execution


def prompt_worker(q, server_instance, stop=None, poll_s=0.1):
    import comfy.model_management
    e = execution.PromptExecutor(server_instance)
    while stop is None or not stop.is_set():
        queue_item = q.get(timeout=poll_s)
        if queue_item is not None:
            item, item_id = queue_item
            prompt_id = item[1]
            server_instance.last_prompt_id = prompt_id
            e.execute(item[2], prompt_id, item[3], item[4])
            q.task_done(item_id, e.history_result,
                        status={"status_str": "success" if e.success else "error",
                                "completed": e.success, "messages": e.status_messages})
            if server_instance.client_id is not None:
                server_instance.send_sync("executing", {"node": None, "prompt_id": prompt_id},
                                          server_instance.client_id)
        flags = q.get_flags()
        free_memory = flags.get("free_memory", False)
        if flags.get("unload_models", free_memory):
            comfy.model_management.unload_all_models()
        if free_memory:
            e.reset()
        if flags:
            gc.collect()
            comfy.model_management.soft_empty_cache()
