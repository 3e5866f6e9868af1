"""The words of the crossing: every name one process calls in the other.

A host calls a worker's functions by ``"module:function"`` target
(``Worker.call``), and a worker calls what its host exposed by name
(``Worker.expose`` / ``bulkhead.worker.call_host``); a RELEASE frame names
the worker's release ladder to run by its op.  Both sides import
these constants instead of writing the strings, so a rename is one edit,
and ``WORKER_TARGETS`` / ``HOST_TARGETS`` let a test check, in a running
worker, that every target resolves (tests/py/test_layout.py).
"""

# --- worker functions the host calls (bulkhead/worker/) ---
DESCRIBE = "bulkhead.worker.nodes:describe"          # the pack's node metadata, as JSON text
RUN = "bulkhead.worker.nodes:run"                    # a V1 node's FUNCTION (or another method)
RUN_V3 = "bulkhead.worker.nodes:run_v3"              # a V3 node's classmethod
RUN_ASYNC = "bulkhead.worker.nodes:run_async"        # an async V1 FUNCTION started as a task
RUN_V3_ASYNC = "bulkhead.worker.nodes:run_v3_async"  # an async V3 FUNCTION started as a task
ASYNC_RESULT = "bulkhead.worker.nodes:async_result"  # that task's outcome, once it ended
ASYNC_CANCEL = "bulkhead.worker.nodes:async_cancel"  # that task cancelled (its prompt ended)
ASYNC_PUMP = "bulkhead.worker.nodes:async_pump"      # the host calls its tasks asked for
CALL_CLASS = "bulkhead.worker.nodes:call_class"      # VALIDATE_INPUTS, IS_CHANGED, ... on the class
WARM = "bulkhead.worker.nodes:warm"                  # import the pack ahead of its first node
REHEARSE = "bulkhead.worker.nodes:rehearse"          # a node call's round trip without a node
HANDLE_ROUTE = "bulkhead.worker.nodes:handle_route"  # one of the pack's aiohttp routes
ON_PROMPT = "bulkhead.worker.nodes:on_prompt"        # the pack's prompt handlers
LOAD = "bulkhead.worker.memory:load"                 # a StandIn's load: more of a model onto its device
RELEASE_OBJECTS = "bulkhead.worker:release_objects"  # object handles the host no longer holds
HELD_COUNT = "bulkhead.worker.nodes:held_count"      # how many objects the worker holds for the host
COMBOS = "bulkhead.worker.nodes:combos"              # every node's dropdowns, INPUT_TYPES / define_schema run again

# A pack's worker serves these and nothing else (worker/__init__.py, as
# multiprocessing's managers serve their `exposed` names): the host's
# ComfyUI never has it run an arbitrary "module:function".  A plain
# bulkhead.Worker, which is no pack's, serves any target (Worker.call).
WORKER_TARGETS = (DESCRIBE, RUN, RUN_V3, RUN_ASYNC, RUN_V3_ASYNC, ASYNC_RESULT, ASYNC_CANCEL, ASYNC_PUMP,
                  CALL_CLASS, WARM, REHEARSE, HANDLE_ROUTE, ON_PROMPT, LOAD, RELEASE_OBJECTS, HELD_COUNT,
                  COMBOS)

# --- host callables a worker calls (exposed by host/serverproxy.py, host/memory.py) ---
SERVER = "bulkhead.server"            # the worker's PromptServer asking the host's
ADMIT = "bulkhead.admit"              # a model load asking the host's memory manager for room
LOADS_DONE = "bulkhead.loads_done"    # the loads admitted are done

HOST_TARGETS = (SERVER, ADMIT, LOADS_DONE)

# --- release ops: what a RELEASE frame asks of a worker (worker/memory.py's ladders) ---
RELEASE_ALL = "all"        # the full ladder: models, cast buffers, pins, allocator cache
RELEASE_MODEL = "model"    # one model (model_id): nbytes of it, or all of it when None
RELEASE_BYTES = "bytes"    # nbytes of the worker's models, in upstream's eviction order
RELEASE_PINS = "pins"      # pinned host memory only (the soft release)

RELEASE_OPS = (RELEASE_ALL, RELEASE_MODEL, RELEASE_BYTES, RELEASE_PINS)
