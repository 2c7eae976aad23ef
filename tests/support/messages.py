"""Publishing step messages from a test, the way the dispatcher does, plus hostile ones.

The Celery app is the product's own (``workers.app.create_app``), so a message the test
publishes is byte-for-byte what a worker would get from the outbox; ``raw`` bypasses
Celery to put an arbitrary body on the queue.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import redis

from harness.brokers import amqp_depths, delete_amqp_queues
from ledger.vocabulary import Priority
from tasks.routing import worker_queues
from tasks.workflow import Registry
from workers.app import create_app
from workers.broker import broker_url, message_priority
from workers.runtime import STEP_TASK
from workers.settings import WorkerSettings


class Publisher:
    """Sends messages to the test's queue through a real broker connection."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.queue = settings.queue
        self.app = create_app(settings, registry=Registry())
        url = broker_url(settings)
        self.redis = redis.Redis.from_url(url) if url.startswith(("redis://", "rediss://")) \
            else None

    def step(self, run_id: UUID | str, seq: int, **options: Any) -> None:
        """A step message exactly as the dispatcher publishes it."""
        self.send({"run_id": str(run_id), "seq": seq}, **options)

    def send(self, kwargs: dict[str, Any], **options: Any) -> None:
        """An ``onward.step`` task with arbitrary kwargs (or serializer, args, ...)."""
        self.app.send_task(STEP_TASK, kwargs=kwargs, queue=self.queue, **options)

    def raw(self, body: bytes, *, content_type: str, headers: dict[str, Any] | None = None) -> None:
        """A message that is not a Celery task message at all (or a broken one)."""
        with self.app.connection_for_write() as conn:
            producer = conn.Producer()
            producer.publish(body, exchange="", routing_key=self.queue, content_type=content_type,
                             content_encoding="utf-8", headers=headers or {}, retry=True)

    def queued(self) -> int:
        """Messages waiting in the broker (not yet fetched by any worker), in the base queue
        and in the per-workflow(-version) queues derived from it (``<queue>.<workflow>…``),
        at every priority (kombu keeps one Redis list per priority step: ``<queue>\x06\x163``)."""
        if self.redis is None:
            return sum(amqp_depths(self.app, test_queues(self.settings)).values())
        keys = [key for key in self.redis.scan_iter(match=f"{self.queue}*", _type="list")
                if key.decode() == self.queue or key.decode()[len(self.queue)] in ".\x06"]
        return sum(int(self.redis.llen(key)) for key in keys)

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
        self.app.close()


def test_queues(settings: WorkerSettings) -> list[str]:
    """The queues a test's workers consume: the base queue and one per workflow (version)
    of the test workflows."""
    registry = Registry()
    registry.load_modules(settings.workflows)
    return [settings.queue, *(q for q, _, _ in worker_queues(settings.queue, registry))]


def remove_amqp_queues(env: dict[str, str]) -> None:
    """After a test on RabbitMQ, delete its queues (unique per test): quorum queues are
    durable and would pile up on the machine's broker. Nothing to do on Redis."""
    if not env.get("ONWARD_BROKER_URL", "").startswith(("amqp://", "amqps://", "pyamqp://")):
        return
    settings = WorkerSettings(**{"broker_url": env["ONWARD_BROKER_URL"],
                                 "queue": env["ONWARD_QUEUE"],
                                 "workflows": env.get("ONWARD_WORKFLOWS", "")})
    app = create_app(settings, registry=Registry())
    try:
        delete_amqp_queues(app, test_queues(settings))
    finally:
        app.close()



def redis_list(queue: str, priority: Priority = Priority.NORMAL) -> str:
    """The Redis list holding step messages of runs of ``priority`` in ``queue`` (kombu
    keeps one list per priority step; workers/broker.py)."""
    step = message_priority(priority, "redis://")
    return queue if step == 0 else f"{queue}\x06\x16{step}"
