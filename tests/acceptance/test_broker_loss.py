"""The broker is only a transport (docs/design.md section 4): losing every queued message loses
no run, because the outbox and the reaper bring every runnable run back.

On Redis the loss is a FLUSHDB of the broker's database (a restarted Redis without
persistence); on RabbitMQ it is the test's queues deleted under the consuming workers, with
their messages (a broker rebuilt from scratch, or an operator's `rabbitmqctl delete_queue`)."""

from __future__ import annotations

import random

import pytest
import redis
from redis.connection import parse_url

from harness.brokers import delete_amqp_queues
from ledger import Ledger
from tests.support import messages, reads
from tests.support.cluster import Cluster, wait_for
from tests.support.messages import Publisher

pytestmark = pytest.mark.acceptance


def _free_redis_db(broker: str) -> int:
    """A Redis database index nobody uses right now (the embedded Redis has 16)."""
    client = redis.Redis.from_url(broker)
    try:
        count = int(client.config_get("databases")["databases"])
        candidates = [db for db in range(1, count) if db != parse_url(broker).get("db", 0)]
        random.shuffle(candidates)
        for db in candidates:
            if client.execute_command("SELECT", db) and client.dbsize() == 0:
                return db
    finally:
        client.close()
    raise AssertionError("no empty Redis database index to run the broker-loss test in")


@pytest.fixture()
def settings_env(settings_env: dict[str, str]) -> dict[str, str]:
    """On Redis, this test's processes use a Redis database of their own, so that its FLUSHDB
    only empties this test's broker (the embedded Redis is shared with other suites). On
    RabbitMQ the queues are already unique per test."""
    if not settings_env["ONWARD_BROKER_URL"].startswith(("redis://", "rediss://")):
        return settings_env
    base = settings_env["ONWARD_BROKER_URL"].rsplit("/", 1)[0]
    db = _free_redis_db(settings_env["ONWARD_BROKER_URL"])
    return {**settings_env, "ONWARD_BROKER_URL": f"{base}/{db}"}


def _lose_broker_state(publisher: Publisher) -> None:
    """Every queued message of this test gone: FLUSHDB on Redis, the queues deleted on
    RabbitMQ (the workers consuming them get a cancel, and must consume again once the
    dispatcher or the reaper declares them anew)."""
    if publisher.redis is not None:
        publisher.redis.flushdb()
    else:
        delete_amqp_queues(publisher.app, messages.test_queues(publisher.settings))


def test_broker__state_lost_mid_batch_every_run_still_completes(
        ledger: Ledger, cluster: Cluster, publisher: Publisher) -> None:
    """The broker's state lost (FLUSHDB on Redis, queues deleted on RabbitMQ) while 30 runs
    of 10 steps are in flight (messages queued, kombu's bindings gone with them): every run
    still completes with exactly one committed checkpoint per seq, no gaps, no duplicates.

    FLUSHDB on a Redis database index chosen for this test (empty when picked), not
    FLUSHALL: the embedded Redis is shared by concurrent test sessions, whose queues
    FLUSHALL would destroy."""
    cluster.dispatcher()
    cluster.reaper()
    cluster.worker(concurrency=2)
    run_ids = [ledger.start_run("test_chain", {"steps": 10, "sleep_ms": 30})
               for _ in range(30)]

    def progress() -> int:
        return ledger.batch_stats(run_ids).steps_committed

    wait_for(lambda: progress() >= 40 and publisher.queued() > 0, timeout=90,
             what="the batch to be under way with messages queued",
             seen=lambda: (progress(), publisher.queued()))
    lost = publisher.queued()
    _lose_broker_state(publisher)
    assert publisher.queued() == 0
    assert progress() < 300, "the batch finished before the flush; nothing was lost"

    wait_for(lambda: ledger.batch_stats(run_ids).completed == 30, timeout=180,
             what="every run to complete after the flush",
             seen=lambda: ledger.batch_stats(run_ids).as_dict())
    stats = ledger.batch_stats(run_ids)
    assert lost > 0
    assert stats.steps_committed == 300
    assert (stats.duplicate_commits, stats.runs_with_gaps, stats.failed, stats.parked) == (
        0, 0, 0, 0)
    assert stats.completed_steps_reexecuted == 0
    for run_id in run_ids:
        assert reads.checkpoint_seqs(ledger.engine, run_id) == list(range(11))
