"""Async V1 nodes of an isolated pack, as ComfyUI's executor runs them:
each call a coroutine that the host's event loop awaits while the worker
serves other calls (several in flight in one worker), with what a node
call has around it -- progress to the node that made it, the interrupt,
the worker's death, the prompt ending first, a call to the host from the
task -- and the grad mode of ComfyUI's executor (torch.inference_mode())
on every thread where node code runs.  tests/e2e/test_async_nodes.py
compares the same from the user's side with the nodes in-process.

Each scenario runs as a fresh ComfyUI-shaped host (tests/comfyui, or the
checkout named by COMFYUI_PATH) with the pack's worker under this venv's
python, as test_nodes.py's torch group does."""

import os
import textwrap

import pytest

from comfyenv import run_comfy_script

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("BULKHEAD_BUILD", os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                                      "build", "rel")))

PACK = {
    "__init__.py": "",
    "nodes.py": '''
import asyncio, json, os, time

import torch


class Sleep:
    """Sleeps on the event loop, reporting `steps` progress updates and
    checking ComfyUI's flag; answers when it ran."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {}), "steps": ("INT", {})}}
    RETURN_TYPES = ("FLOAT", "FLOAT")
    FUNCTION = "go"

    async def go(self, seconds, steps):
        import comfy.model_management as mm
        import comfy.utils
        bar = comfy.utils.ProgressBar(steps)
        start = time.time()
        for _ in range(steps):
            await asyncio.sleep(seconds / steps)
            mm.throw_exception_if_processing_interrupted()
            bar.update(1)
        return (start, time.time())


class Marked:
    """Sleeps until cancelled, then leaves a file saying so."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"path": ("STRING", {})}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    async def go(self, path):
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            with open(path, "w") as f:
                f.write("cancelled")
            raise
        return ("slept",)


class AskHost:
    """Calls the host from its task (as a model load's admission does)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("STRING",)
    FUNCTION = "go"

    async def go(self):
        from bulkhead.worker import call_host
        from bulkhead.channel import events, targets
        await asyncio.sleep(0.01)
        return (json.dumps(call_host(targets.SERVER, events.OP_STATE)),)


class Grad:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}
    RETURN_TYPES = ("BOOLEAN", "BOOLEAN", "INT")
    FUNCTION = "go"

    def go(self):
        return (torch.is_inference_mode_enabled(), torch.is_grad_enabled(), os.getpid())


class AsyncGrad(Grad):
    async def go(self):
        await asyncio.sleep(0.01)
        return (torch.is_inference_mode_enabled(), torch.is_grad_enabled(), os.getpid())


NODE_CLASS_MAPPINGS = {"Sleep": Sleep, "Marked": Marked, "AskHost": AskHost, "Grad": Grad, "AsyncGrad": AsyncGrad}
''',
}

SCENARIO = '''
import asyncio, contextvars, inspect, threading, time
import comfy.utils
from bulkhead.host import nodes, states
PACK = {pack!r}
m, _ = nodes.load_pack(PACK, sys.executable)
rt = states.runtime(PACK)
node = contextvars.ContextVar("node", default=None)   # stands for ComfyUI's executing context
seen = []
comfy.utils.set_progress_bar_global_hook(lambda v, t, p, node_id=None, **kw: seen.append([node.get(), v, t]))


async def as_node(name, coro):
    node.set(name)   # a task's own context, as upstream's CurrentNodeContext
    return await coro
'''


def scenario(tmp_path, body):
    pack = tmp_path / "asyncpack"
    pack.mkdir()
    for rel, text in PACK.items():
        (pack / rel).write_text(textwrap.dedent(text))
    env = {"PYTHONPATH": os.path.join(BUILD, "python"), "BULKHEAD_HOME": str(tmp_path / "home")}
    return run_comfy_script(SCENARIO.format(pack=str(pack)) + textwrap.dedent(body), env=env, timeout=240)


@pytest.mark.torch
def test_async_calls_overlap_in_one_worker_and_progress_reaches_each_node(tmp_path):
    r = scenario(tmp_path, """
        fn = m["Sleep"]().go
        async def main():
            return await asyncio.gather(*(as_node(f"n{i}", fn(seconds=1.0, steps=2 + i)) for i in range(3)))
        spans = asyncio.run(main())
        emit({"async": inspect.iscoroutinefunction(fn), "spans": spans, "seen": seen,
              "generation": rt.worker.generation, "left": len(rt._async)})
        nodes.close_all()
    """)
    assert r["async"] is True
    starts, ends = [s for s, _ in r["spans"]], [e for _, e in r["spans"]]
    assert max(starts) < min(ends), r["spans"]   # one moment in all three
    for i in range(3):   # each node's updates, in its own context
        assert [[v, t] for n, v, t in r["seen"] if n == f"n{i}"] == [[k, 2 + i] for k in range(1, 3 + i)]
    assert all(n is not None for n, _, _ in r["seen"])
    assert r["generation"] == 1 and r["left"] == 0


@pytest.mark.torch
def test_an_interrupt_ends_every_async_call_in_flight_and_the_worker_lives(tmp_path):
    r = scenario(tmp_path, """
        fn = m["Sleep"]().go
        asyncio.run(fn(seconds=0.01, steps=1))   # the worker is up and ComfyUI imported there

        def click():
            time.sleep(0.5)
            mm.interrupt_current_processing(True)   # the stop button
        threading.Thread(target=click).start()

        async def main():
            return await asyncio.gather(*(fn(seconds=60.0, steps=600) for _ in range(3)), return_exceptions=True)
        t0 = time.monotonic()
        out = asyncio.run(main())
        took = time.monotonic() - t0
        mm.interrupt_current_processing(False)
        emit({"raised": [type(e).__name__ for e in out], "took": took, "generation": rt.worker.generation,
              "again": len(asyncio.run(fn(seconds=0.01, steps=1)))})
        nodes.close_all()
    """)
    assert r["raised"] == ["InterruptProcessingException"] * 3
    assert r["took"] < 30   # ended by the click, long before the nodes' 60 s
    assert r["generation"] == 1 and r["again"] == 2   # the worker survived


@pytest.mark.torch
def test_a_worker_that_dies_ends_its_async_calls_with_worker_died(tmp_path):
    r = scenario(tmp_path, """
        from bulkhead.host.errors import WorkerDied
        fn = m["Sleep"]().go
        asyncio.run(fn(seconds=0.01, steps=1))

        def kill():
            time.sleep(0.5)
            rt.worker.kill()
        threading.Thread(target=kill).start()

        async def main():
            return await asyncio.gather(*(fn(seconds=60.0, steps=600) for _ in range(2)), return_exceptions=True)
        out = asyncio.run(main())
        emit({"errors": [[type(e).__name__, str(e)] for e in out], "died": [isinstance(e, WorkerDied) for e in out],
              "again": len(asyncio.run(fn(seconds=0.01, steps=1))), "generation": rt.worker.generation})
        nodes.close_all()
    """)
    assert r["died"] == [True, True], r["errors"]
    for _, message in r["errors"]:
        assert "asyncpack" in message and "signal 9" in message and "next call starts generation 2" in message
    assert r["again"] == 2 and r["generation"] == 2


@pytest.mark.torch
def test_a_prompt_that_ends_first_cancels_the_task_in_the_worker(tmp_path):
    marker = tmp_path / "asyncpack" / "cancelled"   # in the pack's own folder, which its sandbox lets it write
    r = scenario(tmp_path, f"""
        fn = m["Marked"]().go
        async def main():
            task = asyncio.ensure_future(fn(path={str(marker)!r}))
            await asyncio.sleep(2.0)   # started in the worker (its first call imports the pack)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
        out = asyncio.run(main())
        deadline = time.monotonic() + 10
        while not os.path.exists({str(marker)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
        emit({{"out": out, "marked": os.path.exists({str(marker)!r}), "generation": rt.worker.generation}})
        nodes.close_all()
    """)
    assert r == {"out": "cancelled", "marked": True, "generation": 1}


@pytest.mark.torch
def test_a_task_calls_the_host_through_the_workers_main_thread(tmp_path):
    r = scenario(tmp_path, """
        emit(json.loads(asyncio.run(m["AskHost"]().go())[0]))
        nodes.close_all()
    """)
    assert r == {"client_id": None, "last_node_id": None, "last_prompt_id": None}


@pytest.mark.torch
def test_node_code_runs_under_inference_mode_as_in_comfyuis_executor(tmp_path):
    r = scenario(tmp_path, """
        with torch.inference_mode():   # what upstream's executor runs every node in
            here = [torch.is_inference_mode_enabled(), torch.is_grad_enabled()]
        sync = list(m["Grad"]().go())
        asynchronous = list(asyncio.run(m["AsyncGrad"]().go()))
        emit({"in_process": here, "sync": sync[:2], "async": asynchronous[:2], "pids": [sync[2], asynchronous[2]]})
        nodes.close_all()
    """)
    assert r["sync"] == r["in_process"] and r["async"] == r["in_process"], r
    assert r["pids"][0] == r["pids"][1] != os.getpid()


@pytest.mark.torch
def test_a_worker_whose_async_calls_run_is_not_stopped_as_idle(tmp_path):
    r = scenario(tmp_path, """
        from bulkhead.host import idle
        fn = m["Sleep"]().go
        asyncio.run(fn(seconds=0.01, steps=1))
        asked = []

        def free():   # /free's exit of idle workers, while the task runs
            time.sleep(0.5)
            asked.append(idle._exit_one(rt, 0.0, "asked now", wait_s=idle.BRIEF_S))
        threading.Thread(target=free).start()
        out = asyncio.run(fn(seconds=1.5, steps=3))
        emit({"exit": asked, "ran": len(out), "generation": rt.worker.generation})
        nodes.close_all()
    """)
    assert r == {"exit": [None], "ran": 2, "generation": 1}
