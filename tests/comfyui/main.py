"""A skeleton of ComfyUI's `main.py` (tests only).

`prompt_worker` is the loop on the execution thread that runs queued
prompts and then acts on the /free flags, as upstream's does --
`unload_models` (implied by `free_memory`) calls `unload_all_models()`,
`free_memory` resets the executor's caches.  `stop` ends the loop
(upstream's never ends; its thread is a daemon).  Importing this module
starts nothing.

Run as a script it is a server, in upstream's start-up order:

    python main.py --cpu --listen 127.0.0.1 --port 8188 [--base-directory DIR]
                   [--output-directory DIR] [--disable-all-custom-nodes]

the flags parsed (comfy.cli_args), --base-directory and the folder flags
applied to folder_paths, every `custom_nodes/<pack>/prestartup_script.py`
executed (a failure is logged "Failed to execute startup-script" and listed
"(PRESTARTUP FAILED)"), then the PromptServer made on a new event loop, the
custom nodes loaded (nodes.init_extra_nodes), the routes added, the
progress hook set (comfy.utils's global hook sends `progress` to the
prompt's client, and a preview as the unencoded preview event, and raises
a pending interrupt), the prompt worker thread
started, and the server run on --listen/--port until SIGINT/SIGTERM.

Written for bulkhead from a reading of upstream's behaviour; no upstream
code.
"""

import gc
import importlib.util
import logging
import os
import sys
import threading
import time

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
            t0 = time.perf_counter()
            e.execute(item[2], prompt_id, item[3], item[4])
            q.task_done(item_id, e.history_result,
                        status={"status_str": "success" if e.success else "error",
                                "completed": e.success, "messages": e.status_messages})
            if server_instance.client_id is not None:
                server_instance.send_sync("executing", {"node": None, "prompt_id": prompt_id},
                                          server_instance.client_id)
            logging.info("Prompt executed in {:.2f} seconds".format(time.perf_counter() - t0))
        flags = q.get_flags()
        free_memory = flags.get("free_memory", False)
        if flags.get("unload_models", free_memory):
            comfy.model_management.unload_all_models()
        if free_memory:
            e.reset()
        if flags:
            gc.collect()
            comfy.model_management.soft_empty_cache()


def execute_prestartup_script(args, folder_paths):
    if args.disable_all_custom_nodes and not args.whitelist_custom_nodes:
        return
    times = []
    for custom_node_path in folder_paths.get_folder_paths("custom_nodes"):
        if not os.path.isdir(custom_node_path):
            continue
        for entry in sorted(os.listdir(custom_node_path)):
            module_path = os.path.join(custom_node_path, entry)
            if os.path.isfile(module_path) or module_path.endswith(".disabled") or entry == "__pycache__":
                continue
            script = os.path.join(module_path, "prestartup_script.py")
            if not os.path.exists(script):
                continue
            if args.disable_all_custom_nodes and entry not in args.whitelist_custom_nodes:
                logging.info(f"Prestartup Skipping {entry} due to disable_all_custom_nodes and "
                             "whitelist_custom_nodes")
                continue
            t0 = time.perf_counter()
            try:
                spec = importlib.util.spec_from_file_location(os.path.splitext(script)[0], script)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
                ok = True
            except Exception as e:
                logging.error(f"Failed to execute startup-script: {script} / {e}")
                ok = False
            times.append((time.perf_counter() - t0, module_path, ok))
    if times:
        logging.info("\nPrestartup times for custom nodes:")
        for seconds, path, ok in sorted(times):
            logging.info("{:6.1f} seconds{}: {}".format(seconds, "" if ok else " (PRESTARTUP FAILED)", path))
        logging.info("")


def hijack_progress(server_instance):
    import comfy.model_management
    import comfy.utils
    import server

    def hook(value, total, preview_image, prompt_id=None, node_id=None):
        comfy.model_management.throw_exception_if_processing_interrupted()
        progress = {"value": value, "max": total,
                    "prompt_id": prompt_id if prompt_id is not None else server_instance.last_prompt_id,
                    "node": node_id if node_id is not None else server_instance.last_node_id}
        server_instance.send_sync("progress", progress, server_instance.client_id)
        if preview_image is not None:   # the old preview event: no client here says it takes metadata
            server_instance.send_sync(server.BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, preview_image,
                                      server_instance.client_id)

    comfy.utils.set_progress_bar_global_hook(hook)


def main():
    import asyncio
    import signal

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    import comfy.options
    comfy.options.enable_args_parsing()
    from comfy.cli_args import args
    import folder_paths
    if args.output_directory:
        folder_paths.set_output_directory(os.path.abspath(args.output_directory))
    if args.input_directory:
        folder_paths.set_input_directory(os.path.abspath(args.input_directory))
    if args.temp_directory:
        folder_paths.set_temp_directory(os.path.join(os.path.abspath(args.temp_directory), "temp"))
    execute_prestartup_script(args, folder_paths)

    import comfy.model_management  # noqa: F401  (the device is chosen before any node loads)
    import nodes
    import server

    logging.info("Python version: {}".format(sys.version))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    prompt_server = server.PromptServer(loop)
    loop.run_until_complete(nodes.init_extra_nodes(
        init_custom_nodes=not args.disable_all_custom_nodes or bool(args.whitelist_custom_nodes)))
    prompt_server.add_routes()
    hijack_progress(prompt_server)
    threading.Thread(target=prompt_worker, daemon=True, name="prompt_worker",
                     args=(prompt_server.prompt_queue, prompt_server)).start()
    if args.quick_test_for_ci:
        return 0

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, loop.stop)
    addresses = [(a, args.port) for a in args.listen.split(",")]
    loop.run_until_complete(prompt_server.start_multi_address(addresses, verbose=not args.dont_print_server))
    publisher = loop.create_task(prompt_server.publish_loop())
    try:
        loop.run_forever()
    finally:
        logging.info("\nStopped server")
        publisher.cancel()
        # what upstream's exit leaves to the interpreter: bulkhead's workers
        # end with the process (their atexit hooks close them)
    return 0


if __name__ == "__main__":
    sys.exit(main())
