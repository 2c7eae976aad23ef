"""The Celery app: JSON only, late acks, prefetch 1, no results; one task, ``onward.step``."""

from __future__ import annotations

from typing import Any

import structlog
from celery import Celery
from pydantic import ValidationError

from ledger.settings import OnwardSettings
from tasks.routing import worker_queues
from tasks.workflow import Registry
from workers.advertise import Advertiser
from workers.broker import broker_url
from workers.runtime import STEP_TASK, WorkerRuntime

log = structlog.get_logger("onward.worker")


def celery_config(settings: OnwardSettings) -> dict[str, Any]:
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
        "worker_send_task_events": True,
        "task_send_sent_event": True,
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
    return config


def create_app(settings: OnwardSettings | None = None, registry: Registry | None = None, *,
               concurrency: int = 1) -> Celery:
    """Build the Celery app with ``onward.step`` registered on it (no global current app).

    ``concurrency`` is how many steps one process runs at once (a threads or gevent pool's
    ``-c``; 1 for a prefork child): the size of its ledger connection pool."""
    settings = settings or OnwardSettings()
    if registry is None:
        registry = Registry()
        registry.load_modules(settings.workflows)
    app = Celery("onward", set_as_current=False)
    app.conf.update(celery_config(settings))
    runtime = WorkerRuntime(app=app, settings=settings, registry=registry,
                            concurrency=concurrency)

    @app.task(name=STEP_TASK, ignore_result=True, acks_late=True)
    def step(**kwargs: Any) -> str:
        """Execute the step after checkpoint ``seq`` of ``run_id``; the ledger holds results."""
        try:
            report = runtime.handle(kwargs)
        except ValidationError as exc:
            # A malformed message changes nothing: log it clearly and drop it.
            log.error("malformed step message rejected", kwargs=repr(kwargs)[:200],
                      error=str(exc).splitlines()[0])
            return "rejected"
        return report.kind.value

    app.onward_runtime = runtime  # type: ignore[attr-defined]
    return app


def start_advertising(settings: OnwardSettings, registry: Registry) -> Advertiser:
    """Called by ``onward worker`` once its queues are known (main process only)."""
    advertiser = Advertiser(settings, worker_queues(settings.queue, registry))
    advertiser.advertise()  # before the first message can be routed
    advertiser.start()
    return advertiser
