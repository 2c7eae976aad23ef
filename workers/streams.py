"""Streamed model text, best effort, over Redis pub/sub (the broker's Redis).

A worker publishes each piece of a ``ctx.llm(..., stream=True)`` answer to the run's
channel ``onward:tokens:<run id>`` as ``{"run_id", "seq", "command_id", "delta"}``, then
``{"done": true, "model", "tool_calls"}``; an application subscribes with ``tokens()`` (or
``tokens_async()``). Pub/sub keeps nothing: a subscriber that was not listening misses what
was sent, and a step that runs again streams again. What the run did is the evidence, read
with ``Ledger.model_calls`` once the step committed; this is only for showing text as it
arrives.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

import redis
import redis.asyncio as aredis

from ledger.settings import OnwardSettings
from workers.broker import broker_url

__all__ = ["PREFIX", "RedisTokenSink", "token_channel", "tokens", "tokens_async"]


PREFIX = "onward:tokens:"


def token_channel(run_id: UUID | str) -> str:
    return f"{PREFIX}{run_id}"


class RedisTokenSink:
    """``tasks.llm.TokenSink`` publishing to Redis (thread-safe: redis-py's pool)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=2.0)

    def publish(self, run_id: UUID, seq: int, command_id: str, event: dict[str, Any]) -> None:
        message = {"run_id": str(run_id), "seq": seq, "command_id": command_id, **event}
        self.client.publish(token_channel(run_id), json.dumps(message))


def tokens(settings: OnwardSettings, run_id: UUID, *, timeout: float | None = None,
           until_done: bool = True) -> Iterator[dict[str, Any]]:
    """The run's streamed events from now on; stops after a ``done`` event (unless
    ``until_done`` is False) or when ``timeout`` seconds pass with nothing."""
    client = redis.Redis.from_url(broker_url(settings))
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(token_channel(run_id))
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            message = pubsub.get_message(timeout=wait)
            if message is None:
                continue
            event: dict[str, Any] = json.loads(message["data"])
            yield event
            if until_done and event.get("done"):
                return
    finally:
        pubsub.close()
        client.close()


async def tokens_async(settings: OnwardSettings, run_id: UUID, *,
                       until_done: bool = True) -> AsyncIterator[dict[str, Any]]:
    """``tokens()`` for asyncio (cancel the iteration to stop it)."""
    client = aredis.Redis.from_url(broker_url(settings))
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(token_channel(run_id))
    try:
        async for message in pubsub.listen():
            if message.get("type") != "message":
                continue
            event: dict[str, Any] = json.loads(message["data"])
            yield event
            if until_done and event.get("done"):
                return
    finally:
        await pubsub.aclose()
        await client.aclose()
