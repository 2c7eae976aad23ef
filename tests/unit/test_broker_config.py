"""The Celery settings each broker gets (docs/brokers.md): the step protocol's own on both,
and on RabbitMQ quorum queues, publisher confirms and persistent messages."""

from __future__ import annotations

from workers.app import celery_config
from workers.settings import WorkerSettings


def test_broker_config__rabbitmq_gets_quorum_queues_and_publisher_confirms() -> None:
    """An amqp:// broker: every queue onward declares is a quorum queue, each publish waits
    for the broker's confirm, messages are persistent; acks stay late, prefetch 1, JSON."""
    config = celery_config(WorkerSettings(broker_url="amqp://u:p@rabbit:5672//", queue="q"))
    assert config["task_default_queue_type"] == "quorum"
    assert config["task_create_missing_queue_type"] == "quorum"
    assert config["worker_detect_quorum_queues"] is True
    assert config["broker_transport_options"] == {"confirm_publish": True}
    assert config["task_default_delivery_mode"] == "persistent"
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["worker_prefetch_multiplier"] == 1
    assert config["accept_content"] == ["json"]
    assert "broker_transport" not in config  # the Redis channel override is Redis's only


def test_broker_config__redis_keeps_its_transport_and_no_quorum_settings() -> None:
    """A redis:// broker keeps onward's Redis channel and no RabbitMQ-only setting."""
    config = celery_config(WorkerSettings(broker_url="redis://127.0.0.1:6379/0", queue="q"))
    assert config["broker_transport"] == "workers.transport:Transport"
    assert "task_default_queue_type" not in config
    assert "confirm_publish" not in config["broker_transport_options"]
