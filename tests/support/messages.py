"""Publishing step messages from a test, the way the dispatcher does, plus hostile ones.

The Celery app is the product's own (``workers.app.create_app``), so a message the test
publishes is byte-for-byte what a worker would get from the outbox; ``raw`` bypasses
Celery to put an arbitrary body on the queue.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import redis

from ledger import OnwardSettings
from tasks.workflow import Registry
from workers.app import create_app
from workers.broker import broker_url
from workers.runtime import STEP_TASK


class Publisher:
    """Sends messages to the test's queue through a real broker connection."""

    def __init__(self, settings: OnwardSettings) -> None:
        self.settings = settings
        self.queue = settings.queue
        self.app = create_app(settings, registry=Registry())
        self.redis = redis.Redis.from_url(broker_url(settings))

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
        """Messages waiting in Redis (not yet fetched by any worker), in the base queue and
        in the per-workflow-version queues derived from it (``<queue>.<workflow>.v<n>``)."""
        keys = [self.queue, *(key for key in self.redis.scan_iter(match=f"{self.queue}.*",
                                                                  _type="list"))]
        return sum(int(self.redis.llen(key)) for key in keys)

    def close(self) -> None:
        self.redis.close()
        self.app.close()
