"""``onward worker``: run a Celery worker that executes steps. The command reads as its
sequence, one small function each: logs, pool options, settings, waiting for the ledger's
schema, the app and its workflows, the queues, the advertisement, Celery's arguments, and
exit 2 when an upgrade stopped it."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from console.common import (
    EXIT_REFUSED,
    announce,
    fail,
    warn_unknown_variables,
    worker_settings,
)
from ledger.exceptions import InvalidInput, OnwardError, TracingUnavailable

if TYPE_CHECKING:
    from celery import Celery

    from tasks.workflow import Registry
    from workers.advertise import Advertiser
    from workers.pools import PoolKind, PoolOptions
    from workers.settings import WorkerSettings

__all__ = ["worker"]


def worker(
    concurrency: Annotated[int, typer.Option("-c", "--concurrency",
                                             help="Processes (prefork) or threads/greenlets.")] = 2,
    pool: Annotated[str, typer.Option("-P", "--pool", help="prefork | threads | gevent | solo "
                                      "(docs/operating.md: choosing a worker pool).")] = "prefork",
    autoscale: Annotated[str | None, typer.Option(help="MAX,MIN processes (prefork).")] = None,
    max_tasks_per_child: Annotated[int | None, typer.Option(
        help="Replace a pool process after this many messages (prefork).")] = None,
    max_memory_per_child: Annotated[int | None, typer.Option(
        help="Replace a pool process above this resident memory, in KiB (prefork).")] = None,
    prefetch_multiplier: Annotated[int | None, typer.Option(
        help="Messages reserved per concurrency slot (default 1).")] = None,
    workflows: Annotated[str, typer.Option(
        help="Comma-separated modules to import (default: ONWARD_WORKFLOWS).")] = "",
    name: Annotated[str, typer.Option(help="Celery node name.")] = "",
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Run a Celery worker that executes steps (prefork, threads or gevent pool)."""
    loglevel = _worker_logging(loglevel)
    options = _pool_options(pool, concurrency, autoscale, max_tasks_per_child,
                            max_memory_per_child, prefetch_multiplier)
    settings = _with_workflows(worker_settings(), workflows)
    _wait_for_ledger(settings, "worker")
    celery_app, registry = _worker_app(settings, options,
                                       debug=loglevel.upper() == "DEBUG")
    _require_workflows(registry)
    warn_unknown_variables()  # after the workflows' modules (and their settings) are loaded
    queues = _worker_queues(settings, registry)
    node = _node_name(name)
    advertiser = _start_advertising(settings, registry, node, options, queues)
    try:
        celery_app.worker_main(_celery_argv(node, options, queues, registry, loglevel,
                                            events=settings.task_events))
    finally:
        advertiser.retire()
    _stop_if_schema_changed(advertiser.schema_changed, settings)


def _worker_logging(loglevel: str | None) -> str:
    """Configure the worker's logs (what step code prints included); the level used."""
    from workers.logs import configure_logging
    from workers.settings import LogSettings

    loglevel = loglevel or LogSettings().log_level
    configure_logging(loglevel, capture_stdout=True)
    return loglevel


def _pool_options(pool: str, concurrency: int, autoscale: str | None,
                  max_tasks_per_child: int | None, max_memory_per_child: int | None,
                  prefetch_multiplier: int | None) -> PoolOptions:
    """The worker's pool, checked (exit 2 if refused), once tracing is found available
    (when ONWARD_OTEL asks for it)."""
    from ledger import tracing
    from workers.pools import PoolOptions

    try:
        tracing.available()
        return PoolOptions(_pool_kind(pool), concurrency, autoscale, max_tasks_per_child,
                           max_memory_per_child, prefetch_multiplier)
    except (InvalidInput, TracingUnavailable) as exc:
        fail(str(exc), EXIT_REFUSED)


def _pool_kind(pool: str) -> PoolKind:
    from workers.pools import PoolKind

    return PoolKind(pool) if pool in set(PoolKind) else _bad_pool(pool)


def _with_workflows(settings: WorkerSettings, workflows: str) -> WorkerSettings:
    """``--workflows`` (when given) over ONWARD_WORKFLOWS."""
    if workflows:
        return settings.model_copy(update={"workflows": workflows.split(",")})
    return settings


def _wait_for_ledger(settings: WorkerSettings, process: str) -> None:
    """Wait for the ledger's schema (exit 2 if it never comes); no pooled connection is kept,
    so none is inherited by the forked pool children."""
    from ledger.db import create_engine
    from workers.revision import wait_for_ledger

    engine = create_engine(settings)
    try:
        wait_for_ledger(engine, process)
    except OnwardError as exc:
        fail(str(exc), EXIT_REFUSED)
    engine.dispose()


def _worker_app(settings: WorkerSettings, options: PoolOptions, *,
                debug: bool) -> tuple[Celery, Registry]:
    """The Celery app and its workflows; exit 2 if a workflow's module cannot be imported
    (its traceback too when ``debug``) or a workflow cannot run on the pool."""
    from console.workflow_modules import load_workflows
    from workers.app import create_app
    from workers.pools import check_pool_runs

    registry = load_workflows(settings.workflows, debug=debug)
    celery_app = create_app(settings, registry=registry,
                            concurrency=options.steps_per_process)
    try:
        check_pool_runs(options.pool, registry)
    except InvalidInput as exc:
        fail(str(exc), EXIT_REFUSED)
    return celery_app, registry


def _require_workflows(registry: Registry) -> None:
    """Refuse a worker with no workflow (ONWARD_WORKFLOWS unset, say): it could run nothing,
    and from the base queue it would take other workflows' steps and hand each back spending
    an attempt, until their runs were parked attempts_exhausted."""
    if not registry.names():
        fail("no workflows to run: set ONWARD_WORKFLOWS (or --workflows) to the modules that "
             "define them, e.g. ONWARD_WORKFLOWS=myapp.agents onward worker", EXIT_REFUSED)


def _worker_queues(settings: WorkerSettings, registry: Registry) -> list[str]:
    """The step queue and the version queues of the registry's workflows."""
    from tasks.routing import worker_queues

    return [settings.queue, *(q for q, _, _ in worker_queues(settings.queue, registry))]


def _node_name(name: str) -> str:
    node = name or f"onward-{os.getpid()}@{socket.gethostname()}"
    return node.replace("%h", socket.gethostname())


def _start_advertising(settings: WorkerSettings, registry: Registry, node: str,
                       options: PoolOptions, queues: list[str]) -> Advertiser:
    from workers.app import start_advertising

    return start_advertising(settings, registry, node=node, pool=options.pool.value,
                             concurrency=options.concurrency, queues=queues)


def _celery_argv(node: str, options: PoolOptions, queues: list[str], registry: Registry,
                 loglevel: str, *, events: bool) -> list[str]:
    """``celery worker``'s arguments: the pool's, the queues, task events when ``events``
    (ONWARD_TASK_EVENTS, for Flower), no gossip."""
    return [*_banner(node, options, queues, registry), "worker", *options.celery_args(),
            "-Q", ",".join(queues), *(["-E"] if events else []), "--without-gossip",
            "--without-mingle", "-n", node, f"--loglevel={loglevel}"]


def _banner(node: str, options: PoolOptions, queues: list[str], registry: Registry,
            ) -> list[str]:
    """Celery's banner is not a log line: in JSON mode it is replaced (``--quiet``) by one
    JSON object that says the same."""
    from workers.logs import json_logs

    if not json_logs():
        return []
    announce("worker starting", node=node, pool=options.pool.value,
             concurrency=options.concurrency, queues=queues,
             workflows=[f"{w.name} v{w.version}" for w in registry.all()])
    return ["--quiet"]


def _stop_if_schema_changed(changed: str | None, settings: WorkerSettings) -> None:
    """Exit 2 when an upgrade stopped the process, for its supervisor to restart it on new
    code."""
    from workers.revision import schema_changed_under

    changed = changed or schema_changed_under(settings)
    if changed:
        fail(changed, EXIT_REFUSED)


def _bad_pool(pool: str) -> NoReturn:
    from workers.pools import PoolKind

    raise InvalidInput(f"unknown pool {pool!r}; choose one of "
                       f"{', '.join(kind.value for kind in PoolKind)}")
