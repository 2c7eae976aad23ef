"""The ``onward`` command line: run the processes, migrate, inspect runs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from datetime import timedelta
from typing import Annotated, NoReturn

import typer

from console import commands_anchor, commands_replay, commands_verify
from console.commands_approvals import approvals_app
from console.commands_audit import audit_app
from console.commands_corpus import corpus_app
from console.commands_effects import effects_app
from console.commands_keys import keys_app
from console.commands_limits import limits as limits_cmd
from console.commands_retention import retention_app
from console.commands_runs import runs_app
from console.commands_tokens import tokens_app
from console.commands_tools import tools_app
from console.commands_workers import workers as workers_cmd
from console.common import open_ledger, reported, say_error
from console.safe import console, line
from ledger import Ledger, OnwardSettings
from ledger.exceptions import InvalidInput, OnwardError, TracingUnavailable
from ledger.vocabulary import AuditAction, Priority

__all__ = [
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "JsonFlag",
    "app",
    "console_cmd",
    "db_app",
    "db_status",
    "db_upgrade",
    "dispatcher",
    "embedded_app",
    "embedded_down",
    "embedded_up",
    "err",
    "main",
    "metrics",
    "out",
    "reaper",
    "start",
    "worker",
]


app = typer.Typer(help="onward: durable execution for AI agent runs.", no_args_is_help=True)
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True)
embedded_app = typer.Typer(help="The embedded PostgreSQL and Redis under ONWARD_HOME.",
                           no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(effects_app, name="effects")
app.add_typer(approvals_app, name="approvals")
app.add_typer(audit_app, name="audit")
app.add_typer(tools_app, name="tools")
app.add_typer(retention_app, name="retention")
app.add_typer(keys_app, name="keys")
app.add_typer(embedded_app, name="embedded")
app.add_typer(tokens_app, name="tokens")
app.add_typer(corpus_app, name="corpus")  # with `corpus replay` (commands_replay)


@app.callback()
def _logs_to_stderr() -> None:
    """Whatever onward logs while a command runs goes to stderr: stdout holds only the
    command's answer, so ``--json`` output stays parseable (structlog unconfigured prints to
    stdout). Process commands (worker, dispatcher, reaper) configure logging again."""
    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=lambda *_args: structlog.PrintLogger(sys.stderr))


app.command("verify")(commands_verify.verify)
app.command("anchor")(commands_anchor.anchor)
app.command("workers")(workers_cmd)
app.command("limits")(limits_cmd)
assert commands_replay.corpus_replay is not None

out = console()
err = console(stderr=True)

EXIT_REFUSED = 2
EXIT_FAILED = 1

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _settings() -> OnwardSettings:
    return OnwardSettings()


def _fail(message: str, code: int = EXIT_FAILED) -> None:
    say_error("error:", message)
    raise typer.Exit(code)


# -- db -------------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the ledger schema to this code's revision."""
    from ledger.db import current_revision
    from ledger.migrate import upgrade

    ledger = Ledger.from_env(_settings())
    upgrade(ledger.engine)
    out.print(line("ledger schema at revision ", str(current_revision(ledger.engine))))


@db_app.command("status")
def db_status(as_json: JsonFlag = False) -> None:
    """Show the schema revision of the database and the one this code needs."""
    from ledger.db import HEAD_REVISION, current_revision

    found = current_revision(Ledger.from_env(_settings()).engine)
    if as_json:
        print(json.dumps({"database": found, "code": HEAD_REVISION}))
    else:
        out.print(line("database: ", found or "(empty)", "   code needs: ", HEAD_REVISION))
    if found != HEAD_REVISION:
        raise typer.Exit(EXIT_REFUSED)


# -- processes ----------------------------------------------------------------------------
@app.command()
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
    workflows: Annotated[str, typer.Option(help="Comma-separated modules to import.")] = "",
    name: Annotated[str, typer.Option(help="Celery node name.")] = "",
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Run a Celery worker that executes steps (prefork, threads or gevent pool)."""
    from ledger import tracing
    from ledger.db import create_engine
    from tasks.routing import worker_queues
    from workers.app import create_app, start_advertising
    from workers.logs import configure_logging, json_logs
    from workers.pools import PoolKind, PoolOptions, check_pool_runs
    from workers.revision import schema_changed_under, wait_for_ledger
    from workers.settings import LogSettings

    loglevel = loglevel or LogSettings().log_level
    configure_logging(loglevel, capture_stdout=True)
    try:
        tracing.available()
        options = PoolOptions(PoolKind(pool) if pool in set(PoolKind) else _bad_pool(pool),
                              concurrency, autoscale, max_tasks_per_child,
                              max_memory_per_child, prefetch_multiplier)
    except (InvalidInput, TracingUnavailable) as exc:
        _fail(str(exc), EXIT_REFUSED)
    settings = _settings()
    if workflows:
        settings = settings.model_copy(update={"workflows": workflows.split(",")})
    engine = create_engine(settings)
    try:
        wait_for_ledger(engine, "worker")
    except OnwardError as exc:
        _fail(str(exc), EXIT_REFUSED)
    engine.dispose()  # no pooled connection may be inherited by the forked pool children
    celery_app = create_app(settings, concurrency=options.steps_per_process)
    runtime = celery_app.onward_runtime  # type: ignore[attr-defined]
    try:
        check_pool_runs(options.pool, runtime.registry)
    except InvalidInput as exc:
        _fail(str(exc), EXIT_REFUSED)
    queues = [settings.queue, *(q for q, _, _ in worker_queues(settings.queue, runtime.registry))]
    node = name or f"onward-{os.getpid()}@{socket.gethostname()}"
    node = node.replace("%h", socket.gethostname())
    advertiser = start_advertising(settings, runtime.registry, node=node,
                                   pool=options.pool.value, concurrency=concurrency,
                                   queues=queues)
    quiet = []
    if json_logs():  # Celery's banner is not a log line: say the same in one JSON object
        quiet = ["--quiet"]
        _announce("worker starting", node=node, pool=options.pool.value,
                  concurrency=concurrency, queues=queues,
                  workflows=[f"{w.name} v{w.version}" for w in runtime.registry.all()])
    try:
        celery_app.worker_main([
            *quiet, "worker", *options.celery_args(), "-Q", ",".join(queues), "-E",
            "--without-gossip", "--without-mingle", "-n", node, f"--loglevel={loglevel}",
        ])
    finally:
        advertiser.retire()
    changed = advertiser.schema_changed or schema_changed_under(settings)
    if changed:  # an upgrade stopped it: exit 2, for the supervisor to restart it on new code
        _fail(changed, EXIT_REFUSED)


def _bad_pool(pool: str) -> NoReturn:
    from workers.pools import PoolKind

    raise InvalidInput(f"unknown pool {pool!r}; choose one of "
                       f"{', '.join(kind.value for kind in PoolKind)}")


@app.command()
def dispatcher(
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Publish outbox rows to the broker (LISTEN/NOTIFY, polling fallback)."""
    from workers.dispatcher import run_dispatcher
    from workers.logs import configure_logging

    configure_logging(loglevel)
    try:
        run_dispatcher(_settings())
    except OnwardError as exc:
        _fail(str(exc), EXIT_REFUSED)


@app.command()
def reaper(
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Restore runs whose lease expired, re-send lost messages, park crash loops."""
    from workers.logs import configure_logging
    from workers.reaper import run_reaper

    configure_logging(loglevel)
    try:
        run_reaper(_settings())
    except OnwardError as exc:
        _fail(str(exc), EXIT_REFUSED)


# -- embedded -----------------------------------------------------------------------------
@embedded_app.command("up")
def embedded_up() -> None:
    """Start the embedded PostgreSQL and Redis (no-op when already running)."""
    from ledger.db import database_url
    from workers.broker import broker_url

    settings = _settings()
    out.print(line("database: ", database_url(settings)), soft_wrap=True)
    out.print(line("broker:   ", broker_url(settings)), soft_wrap=True)


@embedded_app.command("down")
def embedded_down() -> None:
    """Stop the embedded servers (their data stays under ONWARD_HOME)."""
    from ledger.embedded import stop_postgres
    from workers.broker import stop_redis

    home = _settings().home_dir
    out.print(line(f"postgres stopped: {stop_postgres(home)}  "
                   f"redis stopped: {stop_redis(home)}"))


@app.command()
def metrics(
    port: Annotated[int, typer.Option(help="Port for /metrics.")] = 9464,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics read from the ledger (runs, steps, restores, lag, effects)."""
    import signal as signals

    from ledger.db import create_engine, require_current_schema
    from workers.logs import configure_logging
    from workers.metrics import serve_metrics

    configure_logging()
    engine = create_engine(_settings(), pool_size=1)
    try:
        require_current_schema(engine)
    except OnwardError as exc:
        _fail(str(exc), EXIT_REFUSED)
    settings = _settings()
    stop = serve_metrics(engine, port, host, worker_ttl_s=settings.worker_queue_ttl_s,
                         outbox_grace_s=settings.outbox_grace_s)
    signals.signal(signals.SIGTERM, lambda *_: stop.set())
    _announce(f"serving http://{host}:{port}/metrics", port=port)
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()


@app.command()
def start(
    workflow: str,
    input_json: Annotated[str, typer.Option("--input", help="Run input as a JSON object.")] = "{}",
    idempotency_key: Annotated[str | None, typer.Option()] = None,
    conversation: Annotated[str | None, typer.Option()] = None,
    priority: Annotated[Priority, typer.Option(
        help="Who goes first in the queues and for limited tools (docs/limits.md).")]
        = Priority.NORMAL,
) -> None:
    """Start a run of WORKFLOW and print its id (operator role; audited)."""
    ledger = open_ledger(AuditAction.START)
    with reported():
        try:
            payload = json.loads(input_json)
        except ValueError as exc:
            raise ledger.refuse(AuditAction.START, InvalidInput(
                f"--input must be JSON, an object such as '{{\"topic\": \"x\"}}' ({exc})"
            )) from None
        if not isinstance(payload, dict):
            raise ledger.refuse(AuditAction.START, InvalidInput(
                f"--input must be a JSON object, not {type(payload).__name__}"))
        run_id = ledger.start_run_command(workflow, payload, idempotency_key=idempotency_key,
                                          conversation_id=conversation, priority=priority)
    print(run_id)


def _announce(message: str, **fields: object) -> None:
    """A line for the operator: a log line in JSON mode, plain text otherwise."""
    from workers.logs import json_logs

    if json_logs():
        import structlog

        structlog.get_logger("onward.cli").info(message, **fields)
    else:
        print(message, flush=True)


def main() -> None:  # pragma: no cover - console script entry
    sys.exit(app())


@app.command("console")
def console_cmd(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")]
    = "127.0.0.1",
) -> None:
    """Serve the HTTP API (/api/v1, OpenAPI at /api/docs) and the web page. On the embedded
    default, prints a login link with a fresh admin token that lives 12 hours and is revoked
    when the console stops; otherwise sign in with a token of your own."""
    import uvicorn

    from console.auth import local_admin, owns_embedded_database
    from console.http.app import create_app
    from ledger.tokens import TokenRequest
    from ledger.vocabulary import Role
    from workers.logs import configure_logging, json_logs

    configure_logging()
    settings = _settings()
    ledger = Ledger.from_env(settings)
    with reported():
        ledger.require_current_schema()
    issued = None
    if settings.database_url is None and owns_embedded_database(settings):
        admin = ledger.with_actor(local_admin(settings))
        with reported():
            issued = admin.create_token(TokenRequest(
                settings.actor, Role.ADMIN, settings.tenant_id, timedelta(hours=12),
                note="onward console login link"))
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    if issued is not None:
        _announce(f"open {base}/login?token={issued.secret}", url=f"{base}/login")
    else:
        _announce(f"open {base}/login and sign in with a token (onward tokens create)",
                  url=f"{base}/login")
    # uvicorn's own handlers print plain text: in JSON mode its loggers use onward's
    extra = {"log_config": None} if json_logs() else {}
    try:
        uvicorn.run(create_app(ledger), host=host, port=port, log_level="warning", **extra)
    finally:
        if issued is not None:
            with contextlib.suppress(OnwardError):
                admin.revoke_token(str(issued.token.id), "the console stopped")
