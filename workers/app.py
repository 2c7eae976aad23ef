"""The Celery app: JSON only, late acks, prefetch 1, no results; one task, ``onward.step``."""

from __future__ import annotations

from typing import Any

import structlog
from celery import Celery, signals
from celery.app.amqp import AMQP
from pydantic import ValidationError

from ledger import tracing
from ledger.exceptions import LedgerUnavailable
from tasks.routing import worker_queues
from tasks.workflow import Registry
from workers.advertise import Advertiser
from workers.allocator import connect_keep_freed
from workers.broker import broker_url
from workers.events import FAILED_KINDS
from workers.exceptions import StepNotCommitted
from workers.gcfreeze import connect_freeze
from workers.logs import unbind_step
from workers.runtime import STEP_TASK, WorkerRuntime
from workers.settings import WorkerSettings

__all__ = ["StepAMQP", "amqp_config", "celery_config", "create_app", "is_amqp", "start_advertising"]


log = structlog.get_logger("onward.worker")


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery settings the step protocol relies on (docs/design.md section 4)."""
    url = broker_url(settings)
    config: dict[str, Any] = {
        "broker_url": url,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "result_backend": None,
        # task events are for Flower; off by default (ONWARD_TASK_EVENTS): docs/scaling.md
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "task_default_queue": settings.queue,
        "task_create_missing_queues": True,
        "broker_connection_retry_on_startup": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
    }
    if url.startswith(("redis://", "rediss://")):
        config["broker_transport"] = "workers.transport:Transport"
        # The outbox and the reaper redeliver (see docs/guarantees.md), so Redis ack
        # emulation is off by default; its visibility timeout would only add duplicates.
        config["broker_transport_options"] = {
            "ack_emulation": settings.broker_ack_emulation,
            "visibility_timeout": 3600,
        }
    elif is_amqp(url):
        config.update(amqp_config())
    return config


def is_amqp(url: str) -> bool:
    return url.startswith(("amqp://", "amqps://", "pyamqp://"))


def amqp_config() -> dict[str, Any]:
    """RabbitMQ (docs/brokers.md): every step queue a quorum queue (replicated, durable;
    Celery then uses per-consumer prefetch, as quorum queues require), publishes confirmed
    by the broker before ``send_task`` returns, persistent messages, late acks as above."""
    return {
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        "worker_detect_quorum_queues": True,
        "task_default_delivery_mode": "persistent",
        "broker_transport_options": {"confirm_publish": True},
    }


class StepAMQP(AMQP):  # type: ignore[misc]
    """Celery's message builder, with the ``task-sent`` event named like the message's
    ``shadow`` name: Flower merges a late ``task-sent`` over ``task-received`` (the
    publisher's event can arrive after the worker's), and the step's name must win."""

    def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(*args, **kwargs)
        shadow = message.headers.get("shadow")
        if shadow and message.sent_event is not None:
            message.sent_event["name"] = shadow
        return message


def create_app(settings: WorkerSettings | None = None, registry: Registry | None = None, *,
               concurrency: int = 1) -> Celery:
    """Build the Celery app with ``onward.step`` registered on it (no global current app).

    ``concurrency`` is how many steps one process runs at once (a threads or gevent pool's
    ``-c``; 1 for a prefork child): the size of its ledger connection pool."""
    settings = settings or WorkerSettings()
    if registry is None:
        registry = Registry()
        registry.load_modules(settings.workflows)
    app = Celery("onward", set_as_current=False, amqp=StepAMQP)
    app.conf.update(celery_config(settings))
    runtime = WorkerRuntime(app=app, settings=settings, registry=registry,
                            concurrency=concurrency)

    def step(self: Any, **kwargs: Any) -> str:
        """Execute the step after checkpoint ``seq`` of ``run_id``; the ledger holds results.
        A step that did not commit (failed, retrying, parked, diverged) ends the task as
        failed, for Flower; the message is acked all the same (the ledger re-sends)."""
        unbind_step()
        structlog.contextvars.bind_contextvars(task_id=self.request.id)
        try:
            report = runtime.handle(kwargs, task_id=self.request.id,
                                    hostname=self.request.hostname or "",
                                    name=getattr(self.request, "shadow", None),
                                    traceparent=getattr(self.request, "traceparent", None))
        except ValidationError as exc:
            # A malformed message changes nothing: log it clearly and drop it.
            log.error("malformed step message rejected", kwargs=repr(kwargs)[:200],
                      error=str(exc).splitlines()[0])
            return "rejected"
        if report.kind in FAILED_KINDS:
            raise StepNotCommitted(f"{report.kind.value}: {report.detail[:200]}")
        return report.kind.value

    # registered by a call, not as a decorator: Celery is untyped, and a decorator would
    # leave ``step`` untyped too
    app.task(name=STEP_TASK, ignore_result=True, acks_late=True, bind=True,
             throws=(StepNotCommitted,), Strategy="workers.strategy:step_strategy")(step)

    def flush_observers(**_kwargs: Any) -> None:
        """A pool process (or a threads/solo worker) exits: flush its counters and the
        spans it still buffers."""
        if runtime.meter is not None:
            runtime.meter.close()
        runtime.flush_events()
        tracing.flush()

    signals.worker_process_shutdown.connect(flush_observers, weak=False)
    signals.worker_shutdown.connect(flush_observers, weak=False)
    connect_freeze(settings.gc_freeze)
    connect_keep_freed(settings.malloc_keep_freed)
    app.onward_runtime = runtime
    return app


def start_advertising(settings: WorkerSettings, registry: Registry, *, node: str = "",
                      pool: str = "prefork", concurrency: int = 0,
                      queues: list[str] | None = None) -> Advertiser:
    """Called by ``onward worker`` once its queues are known (main process only)."""
    advertised = []
    for queue, workflow, version in worker_queues(settings.queue, registry):
        code = registry.get(workflow, version or None)
        start = code.start.name if code is not None and code.start is not None else None
        advertised.append((queue, workflow, version, start))
    schemas = {(w.name, w.version): w.state.model_json_schema() for w in registry.all()}
    advertiser = Advertiser(settings, advertised, node=node, pool=pool,
                            concurrency=concurrency, all_queues=queues, schemas=schemas)
    try:
        advertiser.advertise()  # before the first message can be routed
    except LedgerUnavailable as exc:  # the database went away since the check: the loop retries
        log.warning("could not advertise version queues", error=str(exc))
    advertiser.start()
    return advertiser
