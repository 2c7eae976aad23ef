"""Broker queues seen from a test or a benchmark, whatever the broker: ready messages per
RabbitMQ queue, and removing a run's queues (quorum queues are durable and outlive the
processes that declared them)."""

from __future__ import annotations

import contextlib
from typing import Any


def amqp_depths(app: Any, queues: list[str]) -> dict[str, int]:
    """Ready messages per RabbitMQ queue (a passive declare; missing queues count 0)."""
    depths: dict[str, int] = {}
    with app.connection_for_write() as conn:
        for queue in queues:
            channel = conn.channel()
            try:
                depths[queue] = int(channel.queue_declare(queue, passive=True).message_count)
            except conn.channel_errors:
                depths[queue] = 0  # never declared: nobody published or consumed there
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
    return depths


def delete_amqp_queues(app: Any, queues: list[str]) -> None:
    """Remove a test's queues from RabbitMQ (quorum queues outlive their consumers)."""
    with app.connection_for_write() as conn:
        for queue in queues:
            channel = conn.channel()
            try:
                channel.queue_delete(queue)
            except conn.channel_errors:
                pass
            finally:
                with contextlib.suppress(Exception):
                    channel.close()
