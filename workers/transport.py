"""A Redis transport for kombu that keeps one client per channel.

kombu 5.x builds a new ``redis.Redis`` for every publish, ack and QoS update
(``Channel.conn_or_acquire``); with redis-py 5+ each construction costs ~0.2 ms of CPU.
The connection pool underneath is already shared, so reusing the client object is safe.
Selected through Celery's documented ``broker_transport`` setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]


class Channel(kombu_redis.Channel):
    _cached_client: Any = None
    _cached_pool: Any = None

    if TYPE_CHECKING:  # kombu's own method, unannotated there
        def _create_client(self, asynchronous: bool = False) -> Any: ...

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client is not None:
            yield client
            return
        pool = self.pool
        if self._cached_client is None or self._cached_pool is not pool:
            self._cached_client = self._create_client()
            self._cached_pool = pool
        yield self._cached_client


class Transport(kombu_redis.Transport):
    Channel = Channel
