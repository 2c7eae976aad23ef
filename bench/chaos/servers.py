"""The servers of one chaos run: a database of its own (on a private PostgreSQL when the
bench restarts PostgreSQL), a Redis database for the broker, and the reference provider."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from sqlalchemy.engine import Engine

from bench.chaos.agent import BLIND_COLLECTION
from bench.chaos.config import Config
from bench.chaos.log import log
from harness.databases import create_database, drop_database
from harness.postgres import PrivatePostgres
from harness.processes import Processes
from harness.provider import ReferenceProvider
from ledger import Ledger
from ledger.db import database_url
from workers.broker import broker_url
from workers.settings import WorkerSettings

CHECKPOINT_KEY = "chaos-bench-checkpoint-key"
OWNER_KEY = "onward-chaos-bench:owner"  # marks the Redis DB as taken while the bench runs
OWNER_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def choose_broker_db(base_url: str, requested: int | None) -> tuple[str, bool]:
    """The broker URL to use and whether the bench owns (and may clear) that Redis DB."""
    if requested is not None and requested < 0:
        return base_url, False
    if requested is not None:
        return with_redis_db(base_url, requested), False
    for db in range(1, 15):
        url = with_redis_db(base_url, db)
        client = redis.Redis.from_url(url)
        try:
            if client.dbsize() == 0:
                client.set(OWNER_KEY, OWNER_TOKEN, ex=3600)
                return url, True
        finally:
            client.close()
    raise RuntimeError("no empty Redis database in 1..14 for the bench; pass --broker-db")


class Servers:
    """Set up by ``start``; ``stop`` keeps the database (and the private cluster's files)
    for inspection when asked to."""

    pg: PrivatePostgres | None = None
    db_name: str | None = None

    def __init__(self, cfg: Config, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.admin_settings = WorkerSettings()
        self.queue = f"chaos.{secrets.token_hex(6)}"

    def start(self) -> None:
        self._database()
        self.broker, self.owns_broker_db = choose_broker_db(
            broker_url(self.admin_settings), self.cfg.broker_db)
        log(f"broker {self.broker} (queue {self.queue})")
        # its own process list: the fleet's processes get the provider's URL in their env
        self.provider = ReferenceProvider.start(Processes(env={}, log_dir=self.workdir),
                                                self.workdir)
        self.provider.configure(key_ttl_s=self.cfg.key_ttl_s, lookup=True,
                                async_complete_s=0.0)
        if self.cfg.blind_runs:
            self.provider.arm(BLIND_COLLECTION, drop_response=self.cfg.blind_runs)
        log(f"provider at {self.provider.url} (key_ttl_s={self.cfg.key_ttl_s})")
        self.ledger = Ledger.from_env(WorkerSettings(
            database_url=self.db_url, broker_url=self.broker,
            home=self.admin_settings.home_dir, queue=self.queue, checkpoint_key=CHECKPOINT_KEY))

    def _database(self) -> None:
        if self.cfg.pg_restarts:  # never restart a server somebody else uses: run our own
            self.pg = PrivatePostgres(prefix="onward-chaos-pg-").init()
            self.pg.start()
            self.admin_url = self.pg.url
            log(f"private PostgreSQL at 127.0.0.1:{self.pg.port} ({self.pg.root})")
        else:
            self.admin_url = database_url(self.admin_settings)
        self.db_name, self.db_url = create_database(self.admin_url, "onward_chaos")
        log(f"created database {self.db_name}")

    @property
    def engine(self) -> Engine:
        return self.ledger.engine

    def env(self) -> dict[str, str]:
        """The environment of every onward process of the bench."""
        return {
            "ONWARD_DATABASE_URL": self.db_url,
            "ONWARD_BROKER_URL": self.broker,
            "ONWARD_HOME": str(self.admin_settings.home_dir),
            "ONWARD_QUEUE": self.queue,
            "ONWARD_WORKFLOWS": "bench.chaos.agent",
            "ONWARD_CHECKPOINT_KEY": CHECKPOINT_KEY,
            "ONWARD_LEASE_TTL_S": str(self.cfg.lease_ttl_s),
            "ONWARD_TOOL_TIMEOUT_S": str(self.cfg.tool_timeout_s),
            "ONWARD_TOOL_LEASE_MARGIN_S": "1",
            "ONWARD_REAPER_INTERVAL_S": "0.5",
            "ONWARD_OUTBOX_GRACE_S": "1",
            "ONWARD_OUTBOX_REPUBLISH_S": "5",
            "ONWARD_STALL_AFTER_S": "5",
            "ONWARD_DISPATCHER_POLL_S": "0.5",
            "ONWARD_RETRY_BASE_S": "0.1",
            "ONWARD_RETRY_MAX_S": "1",
            "ONWARD_EXAMPLE_PROVIDER_URL": self.provider.url,
        }

    def flush_broker(self) -> tuple[int, int]:
        """FLUSHDB the broker's Redis database: (keys, step messages) it held."""
        client = redis.Redis.from_url(self.broker)
        try:
            queued = sum(client.llen(key) for key in client.scan_iter(match=f"{self.queue}*")
                         if client.type(key) == b"list")
            keys = client.dbsize()
            client.flushdb()
            if self.owns_broker_db:  # keep the DB marked as taken for other users
                client.set(OWNER_KEY, OWNER_TOKEN, ex=3600)
        finally:
            client.close()
        return int(keys), int(queued)

    def stop(self, keep_db: bool) -> None:
        with contextlib.suppress(Exception):
            self.provider.stop()
        with contextlib.suppress(Exception):
            self._clear_broker()
        with contextlib.suppress(Exception):
            self.ledger.engine.dispose()
        if self.pg is not None:  # stopped either way; its files kept for inspection
            self.pg.destroy(keep=keep_db)
            if keep_db:
                log(f"kept the private PostgreSQL cluster {self.pg.data} (database "
                    f"{self.db_name}); start it with: {self.pg.start_command()}", always=True)
        elif self.db_name is not None:
            if keep_db:
                log(f"kept database {self.db_name} for inspection "
                    f"(ONWARD_DATABASE_URL={self.db_url})", always=True)
            else:
                with contextlib.suppress(Exception):
                    drop_database(self.admin_url, self.db_name)

    def _clear_broker(self) -> None:
        client = redis.Redis.from_url(self.broker)
        try:
            if self.owns_broker_db and client.get(OWNER_KEY) == OWNER_TOKEN.encode():
                client.flushdb()
            else:
                for key in client.scan_iter(match=f"*{self.queue}*"):
                    client.delete(key)
        finally:
            client.close()
