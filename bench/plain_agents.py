"""Plain Celery making the same calls as bench/agent_flow.py's steps, with no durability:
the comparison side of bench/agents.py. Same Celery settings as ``onward worker``
(``workers.app.celery_config``), same pool and concurrency, same model and provider calls;
each task sends the next one (``apply_async``) and the last one of a chain records when it
finished. A task whose call fails ends its chain (there is no durability to resume it): it is
recorded as lost, with the step it reached.

With ``BENCH_ASYNC=1`` (``bench/agents.py --async``) each task makes the calls of
bench/agent_flow_async.py's async step the way onward runs that step on a threads pool: one
event loop per process, in a daemon thread of its own; the pool thread that took the message
hands the step's coroutine (the awaited ``openai.AsyncOpenAI`` call, and one step in three
the awaited ``httpx.AsyncClient`` provider write) to that loop and waits for it to finish,
then sends the next task. Celery has no async tasks: this is how an async client is used
from a Celery task on the same pool and concurrency.

Run as a worker: ``python -m bench.plain_agents`` with BENCH_BROKER_URL, BENCH_PLAIN_QUEUE,
BENCH_POOL, BENCH_CONCURRENCY, BENCH_NODE, ONWARD_MODEL_URL and ONWARD_EXAMPLE_PROVIDER_URL.
"""

from __future__ import annotations

import os

if os.environ.get("BENCH_POOL") == "gevent":  # before anything imports socket users
    from gevent import monkey

    monkey.patch_all()

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable
from typing import Any, cast

import redis
from celery import Celery

from bench.agent_flow import MODEL, messages_for, model_client, writes_at
from examples.provider_client import create
from workers.app import celery_config
from workers.settings import WorkerSettings

TASK = "bench.plain_agent_step"
ASYNC = os.environ.get("BENCH_ASYNC") == "1"
_loop: dict[str, Any] = {}
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop, running in a daemon thread (started on first use)."""
    with _loop_lock:
        if _loop.get("pid") != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="plain-loop", daemon=True).start()
            _loop.update(pid=os.getpid(), loop=loop)
        found: asyncio.AbstractEventLoop = _loop["loop"]
        return found


async def async_calls(run: str, n: int) -> None:
    """The async step's calls (bench/agent_flow_async.py), awaited on the process's loop."""
    from bench.agent_flow_async import async_model_client, plain_write

    await async_model_client().complete(model=MODEL, messages=messages_for(run, n))
    if writes_at(n):
        # an async def tool (bench/agent_flow_async.py): its call is a coroutine
        await cast(Awaitable[Any], plain_write.call({"run": run, "n": n}, f"{run}:{n}",
                                                    timeout=30.0))


def calls(run: str, n: int) -> None:
    """One step's calls: in this thread, or (BENCH_ASYNC) on the event loop, waited for."""
    if ASYNC:
        asyncio.run_coroutine_threadsafe(async_calls(run, n), event_loop()).result()
        return
    model_client().complete(model=MODEL, messages=messages_for(run, n))
    if writes_at(n):
        create("plain_writes", {"run": run, "n": n}, f"{run}:{n}")


def done_key(queue: str) -> str:
    return f"bench:{queue}:agents_done"


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("bench_plain_agents", set_as_current=False)
    config = celery_config(WorkerSettings(broker_url=broker, queue=queue))
    config.pop("broker_transport", None)  # stock kombu Redis transport, ack emulation on
    config.pop("broker_transport_options", None)
    app.conf.update(config)
    client: dict[str, Any] = {}

    @app.task(name=TASK, ignore_result=True, acks_late=True)  # type: ignore[untyped-decorator]
    def step(run: str, n: int, steps: int) -> None:
        try:
            calls(run, n)
        except Exception as exc:  # no durability: the chain ends here, counted as lost
            finish(run, f"lost {n} {type(exc).__name__}")
            raise
        if n + 1 < steps:
            step.apply_async(kwargs={"run": run, "n": n + 1, "steps": steps}, queue=queue)
        else:
            finish(run, "done")

    def finish(run: str, how: str) -> None:
        if client.get("pid") != os.getpid():
            client.update(pid=os.getpid(), redis=redis.Redis.from_url(broker))
        client["redis"].rpush(done_key(queue), f"{run} {time.time():.6f} {how}")

    return app


def main() -> None:
    queue = os.environ["BENCH_PLAIN_QUEUE"]
    app = make_app(os.environ["BENCH_BROKER_URL"], queue)
    node = os.environ.get("BENCH_NODE") or f"plain-{os.getpid()}@{socket.gethostname()}"
    app.worker_main(["worker", "-P", os.environ.get("BENCH_POOL", "prefork"), "-c",
                     os.environ.get("BENCH_CONCURRENCY", "2"), "-Q", queue,
                     # task events as onward's workers have them (ONWARD_TASK_EVENTS)
                     *(["-E"] if app.conf.worker_send_task_events else []),
                     "--without-gossip", "--without-mingle", "-n", node,
                     f"--loglevel={os.environ.get('BENCH_LOGLEVEL', 'WARNING')}"])


if __name__ == "__main__":
    main()
