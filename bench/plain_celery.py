"""Plain Celery, chained like onward steps but with no durability: the comparison side of
``bench/steps.py``.

The app takes onward's own Celery settings (``workers.app.celery_config``: JSON only,
``task_acks_late``, ``worker_prefetch_multiplier=1``, results ignored, task events as
``ONWARD_TASK_EVENTS`` says: off by default) and the worker is started with the same flags as
``onward worker`` (prefork, ``-E`` only with task events, no gossip, no mingle), on the same
broker. The one difference is the transport:

* ``default`` (what the targets compare against): kombu's stock Redis transport with its ack
  emulation on. Plain Celery needs ack emulation; without it a worker that dies loses its
  message, and plain Celery has no outbox to bring it back.
* ``tuned``: onward's client-caching transport (``workers.transport``) plus a long-lived
  producer, ack emulation still on (the calibration doc's "plain_tuned").
* ``noevents``: no ``-E`` and no task-sent events, ``events``: both on, whatever
  ``ONWARD_TASK_EVENTS`` says (reference only; combinable: "tuned,events").

Each task records its start time in a process-local buffer (flushed to Redis by a background
thread), then ``apply_async``s the next step; the last step of a run pushes a "done" record.

Run as a worker: ``python -m bench.plain_celery`` with BENCH_BROKER_URL, BENCH_PLAIN_QUEUE,
BENCH_PLAIN_VARIANT, BENCH_CONCURRENCY, BENCH_NODE and BENCH_LOGLEVEL set (bench/steps.py does).
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Any

import redis
from celery import Celery

from workers.app import celery_config
from workers.settings import WorkerSettings

TASK = "bench.plain_step"
VARIANT_FLAGS = ("default", "tuned", "noevents", "events")


def record_keys(queue: str) -> tuple[str, str]:
    """Redis lists of (run, seq, start time) records and of "run finished" records."""
    return f"bench:{queue}:records", f"bench:{queue}:done"


def variant_flags(variant: str) -> set[str]:
    """``default``, or a comma-separated set of ``tuned``, ``noevents`` and ``events``."""
    flags = {f.strip() for f in variant.split(",") if f.strip()} or {"default"}
    unknown = flags - set(VARIANT_FLAGS)
    if unknown:
        raise ValueError(f"unknown plain Celery variant flags {sorted(unknown)}; "
                         f"known: {VARIANT_FLAGS}")
    return flags


def plain_config(broker: str, queue: str, variant: str) -> dict[str, Any]:
    """onward's Celery settings, with the transport of the chosen plain variant."""
    flags = variant_flags(variant)
    config = celery_config(WorkerSettings(broker_url=broker, queue=queue))
    config.pop("broker_transport", None)
    config.pop("broker_transport_options", None)
    # on RabbitMQ, plain Celery as a team gets it: classic queues, no publisher confirms
    for key in ("task_default_queue_type", "task_create_missing_queue_type",
                "worker_detect_quorum_queues"):
        config.pop(key, None)
    if "tuned" in flags and broker.startswith(("redis://", "rediss://")):
        config["broker_transport"] = "workers.transport:Transport"
    if flags & {"noevents", "events"}:  # reference only: onward's follow ONWARD_TASK_EVENTS
        config["worker_send_task_events"] = config["task_send_sent_event"] = "events" in flags
    return config


class _Recorder:
    """Start times of tasks: one deque append per task, flushed by a background thread."""

    def __init__(self, broker: str, queue: str) -> None:
        self._broker = broker
        self._records, self._done = record_keys(queue)
        self._pid = 0
        self._buffer: collections.deque[str] = collections.deque()
        self._client: redis.Redis | None = None

    def _ensure(self) -> redis.Redis:
        if self._pid != os.getpid() or self._client is None:  # first use after fork
            self._pid = os.getpid()
            self._buffer = collections.deque()
            self._client = redis.Redis.from_url(self._broker)
            threading.Thread(target=self._flush_loop, daemon=True).start()
        return self._client

    def add(self, run_id: str, seq: int, started: float) -> None:
        self._ensure()
        self._buffer.append(f"{run_id} {seq} {started:.6f}")

    def done(self, run_id: str, finished: float) -> None:
        self._ensure().rpush(self._done, f"{run_id} {finished:.6f}")

    def _flush_loop(self) -> None:
        client = self._client
        assert client is not None
        while True:
            time.sleep(0.05)
            items = []
            while self._buffer:
                items.append(self._buffer.popleft())
            if items:
                client.rpush(self._records, *items)


def make_app(broker: str, queue: str, variant: str = "default",
             records: str | None = None) -> Celery:
    """The plain app; ``records`` is the Redis its tasks record start times in (the broker
    itself when it is Redis)."""
    app = Celery("bench_plain", set_as_current=False)
    app.conf.update(plain_config(broker, queue, variant))
    recorder = _Recorder(records or broker, queue)
    held: dict[str, Any] = {}
    tuned = "tuned" in variant_flags(variant)

    @app.task(name=TASK, ignore_result=True, acks_late=True)  # type: ignore[untyped-decorator]
    def plain_step(run_id: str, seq: int, steps: int) -> None:
        started = time.time()
        recorder.add(run_id, seq, started)
        if seq + 1 < steps:
            options: dict[str, Any] = {"queue": queue}
            if tuned:
                if held.get("pid") != os.getpid():
                    held["producer"] = app.producer_pool.acquire(block=True)
                    held["pid"] = os.getpid()
                options["producer"] = held["producer"]
            plain_step.apply_async(kwargs={"run_id": run_id, "seq": seq + 1, "steps": steps},
                                   **options)
        else:
            recorder.done(run_id, started)

    return app


def worker_argv(concurrency: int, queue: str, node: str, loglevel: str,
                events: bool) -> list[str]:
    """The same worker flags as ``onward worker`` (console/cli.py)."""
    return ["worker", "-c", str(concurrency), "-P", "prefork", "-Q", queue,
            *(["-E"] if events else []), "--without-gossip", "--without-mingle", "-n", node,
            f"--loglevel={loglevel}"]


def main() -> None:
    from workers.logs import configure_logging

    loglevel = os.environ.get("BENCH_LOGLEVEL", "INFO")
    configure_logging(loglevel)  # as `onward worker` does
    queue = os.environ["BENCH_PLAIN_QUEUE"]
    variant = os.environ.get("BENCH_PLAIN_VARIANT", "default")
    app = make_app(os.environ["BENCH_BROKER_URL"], queue, variant,
                   os.environ.get("BENCH_RECORDS_URL"))
    node = os.environ.get("BENCH_NODE") or f"plain-{os.getpid()}@{socket.gethostname()}"
    app.worker_main(worker_argv(int(os.environ.get("BENCH_CONCURRENCY", "2")), queue, node,
                                loglevel, events=bool(app.conf.worker_send_task_events)))


if __name__ == "__main__":
    main()
