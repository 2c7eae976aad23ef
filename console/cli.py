"""The ``onward`` command line: run the processes, migrate, inspect runs."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.table import Table

from ledger import Ledger, OnwardSettings, RunStatus
from console import verify_cmd
from ledger.exceptions import OnwardError

app = typer.Typer(help="onward: durable execution for AI agent runs.", no_args_is_help=True)
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
embedded_app = typer.Typer(help="The embedded PostgreSQL and Redis under ONWARD_HOME.",
                           no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(embedded_app, name="embedded")
app.command("verify")(verify_cmd.verify)

out = Console()
err = Console(stderr=True)

EXIT_REFUSED = 2
EXIT_FAILED = 1

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _settings() -> OnwardSettings:
    return OnwardSettings()


def _fail(message: str, code: int = EXIT_FAILED) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


# -- db -------------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the ledger schema to this code's revision."""
    from ledger.db import current_revision
    from ledger.migrate import upgrade

    ledger = Ledger.from_env(_settings())
    upgrade(ledger.engine)
    out.print(f"ledger schema at revision {current_revision(ledger.engine)}")


@db_app.command("status")
def db_status(as_json: JsonFlag = False) -> None:
    """Show the schema revision of the database and the one this code needs."""
    from ledger.db import HEAD_REVISION, current_revision

    found = current_revision(Ledger.from_env(_settings()).engine)
    if as_json:
        print(json.dumps({"database": found, "code": HEAD_REVISION}))
    else:
        out.print(f"database: {found or '(empty)'}   code needs: {HEAD_REVISION}")
    if found != HEAD_REVISION:
        raise typer.Exit(EXIT_REFUSED)


# -- processes ----------------------------------------------------------------------------
@app.command()
def worker(
    concurrency: Annotated[int, typer.Option("-c", "--concurrency")] = 2,
    workflows: Annotated[str, typer.Option(help="Comma-separated modules to import.")] = "",
    name: Annotated[str, typer.Option(help="Celery node name.")] = "",
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Run a Celery worker (prefork) that executes steps."""
    from ledger.db import create_engine, require_current_schema
    from tasks.routing import worker_queues
    from workers.app import create_app, start_advertising
    from workers.logs import configure_logging

    loglevel = loglevel or os.environ.get("ONWARD_LOG_LEVEL", "INFO")
    configure_logging(loglevel)
    settings = _settings()
    if workflows:
        settings = settings.model_copy(update={"workflows": workflows.split(",")})
    engine = create_engine(settings)
    try:
        require_current_schema(engine)
    except OnwardError as exc:
        _fail(str(exc), EXIT_REFUSED)
    engine.dispose()  # no pooled connection may be inherited by the forked pool children
    celery_app = create_app(settings)
    runtime = celery_app.onward_runtime  # type: ignore[attr-defined]
    queues = [settings.queue, *(q for q, _, _ in worker_queues(settings.queue, runtime.registry))]
    node = name or f"onward-{os.getpid()}@{socket.gethostname()}"
    start_advertising(settings, runtime.registry)
    celery_app.worker_main([
        "worker", "-c", str(concurrency), "-P", "prefork", "-Q", ",".join(queues), "-E",
        "--without-gossip", "--without-mingle", "-n", node, f"--loglevel={loglevel}",
    ])


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
    out.print(f"database: {database_url(settings)}")
    out.print(f"broker:   {broker_url(settings)}")


@embedded_app.command("down")
def embedded_down() -> None:
    """Stop the embedded servers (their data stays under ONWARD_HOME)."""
    from ledger.embedded import stop_postgres
    from workers.broker import stop_redis

    home = _settings().home_dir
    out.print(f"postgres stopped: {stop_postgres(home)}  redis stopped: {stop_redis(home)}")


# -- runs ---------------------------------------------------------------------------------
def _run_dict(run: Any) -> dict[str, Any]:
    return {
        "id": str(run.id), "workflow": run.workflow, "version": run.workflow_version,
        "status": run.status.value, "seq": run.seq, "step": run.step,
        "attempt": run.attempt, "restores": run.restore_count,
        "stale_deliveries": run.stale_deliveries, "conversation_id": run.conversation_id,
        "idempotency_key": run.idempotency_key, "parked_reason": run.parked_reason,
        "last_error": run.last_error, "result": run.result,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


@runs_app.command("ls")
def runs_ls(
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this status.")] = None,
    workflow: Annotated[str | None, typer.Option()] = None,
    conversation: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List runs, newest first."""
    found = Ledger.from_env(_settings()).list_runs(
        status=status, workflow=workflow, conversation_id=conversation, limit=limit)
    if as_json:
        print(json.dumps([_run_dict(r) for r in found]))
        return
    table = Table("run", "workflow", "status", "seq", "step", "restores", "created")
    for r in found:
        table.add_row(str(r.id), r.workflow, r.status.value, str(r.seq), r.step or "-",
                      str(r.restore_count), r.created_at.strftime("%Y-%m-%d %H:%M:%S"))
    out.print(table)


@runs_app.command("show")
def runs_show(run_id: UUID, as_json: JsonFlag = False) -> None:
    """Show a run and its step timeline (every attempt, with worker and duration)."""
    ledger = Ledger.from_env(_settings())
    run = ledger.get_run(run_id)
    if run is None:
        _fail(f"no run {run_id}", EXIT_REFUSED)
    assert run is not None
    entries = ledger.timeline(run_id)
    if as_json:
        data = _run_dict(run)
        data["timeline"] = [
            {"seq": e.seq, "step": e.step, "attempt": e.attempt, "worker": e.worker,
             "outcome": e.outcome, "duration_ms": e.duration_ms, "error": e.error_message}
            for e in entries
        ]
        print(json.dumps(data))
        return
    out.print(f"[bold]{run.id}[/bold]  {run.workflow} v{run.workflow_version}  "
              f"status={run.status.value}  seq={run.seq}  restores={run.restore_count}")
    if run.last_error:
        out.print(f"last error: {run.last_error}")
    out.print(timeline_table(entries))


def timeline_table(entries: list[Any]) -> Table:
    table = Table("seq", "step", "attempt", "worker", "outcome", "ms", "error")
    for e in entries:
        ms = f"{e.duration_ms:.1f}" if e.duration_ms is not None else "-"
        table.add_row(str(e.seq), e.step or "(start)", str(e.attempt), e.worker,
                      e.outcome or "(running)", ms, (e.error_message or "")[:60])
    return table


@app.command()
def start(
    workflow: str,
    input_json: Annotated[str, typer.Option("--input", help="Run input as a JSON object.")] = "{}",
    idempotency_key: Annotated[str | None, typer.Option()] = None,
    conversation: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Start a run of WORKFLOW and print its id."""
    try:
        payload = json.loads(input_json)
        run_id = Ledger.from_env(_settings()).start_run(
            workflow, payload, idempotency_key=idempotency_key, conversation_id=conversation)
    except (ValueError, OnwardError) as exc:
        _fail(str(exc), EXIT_REFUSED)
    print(run_id)


def main() -> None:  # pragma: no cover - console script entry
    sys.exit(app())
