"""The ``onward`` command line: run the processes, migrate, inspect runs."""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import socket
import sys
from datetime import timedelta
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

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
from console.commands_worker import worker
from console.commands_workers import note_unserved
from console.commands_workers import workers as workers_cmd
from console.common import (
    EXIT_FAILED,
    EXIT_REFUSED,
    JsonFlag,
    announce,
    err,
    fail,
    json_error,
    json_errors,
    open_ledger,
    out,
    parse_json,
    reported,
    warn_unknown_variables,
    worker_settings,
)
from console.help_params import plain_params
from console.safe import line
from console.workflow_modules import cwd_on_path
from ledger import Ledger, OnwardSettings
from ledger.exceptions import InvalidInput, OnwardError, SchemaMismatch
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
    stdout). Process commands (worker, dispatcher, reaper) configure logging again.

    The current directory goes on ``sys.path`` (console/workflow_modules.py), as Celery's
    own command does: the workflow modules a command imports (``ONWARD_WORKFLOWS``) are
    found in the folder it is run from."""
    import structlog

    cwd_on_path()
    if not structlog.is_configured():
        structlog.configure(logger_factory=lambda *_args: structlog.PrintLogger(sys.stderr))


app.command("verify")(commands_verify.verify)
app.command("anchor")(commands_anchor.anchor)
app.command("workers")(workers_cmd)
app.command("limits")(limits_cmd)
assert commands_replay.corpus_replay is not None


def _settings() -> OnwardSettings:
    """The ledger's settings (what ``db`` and ``embedded down`` need)."""
    return OnwardSettings()


# -- db -------------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the ledger schema to this code's revision."""
    from ledger.db import current_revision
    from ledger.migrate import upgrade

    ledger = Ledger.from_env(_settings())
    try:
        upgrade(ledger.engine)
    except SchemaMismatch as exc:  # a newer release upgraded it: never downgraded
        fail(str(exc), EXIT_REFUSED)
    except InvalidInput as exc:  # a signing migration refused the configured key
        fail(str(exc), EXIT_REFUSED)
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
        if not as_json:  # revisions are zero-padded numbers: they compare as text
            out.print(line("  run: onward db upgrade" if (found or "") < HEAD_REVISION else
                           "  the database is newer than this code: install the onward "
                           "version that upgraded it"))
        raise typer.Exit(EXIT_REFUSED)


# -- processes ----------------------------------------------------------------------------
app.command()(worker)  # console/commands_worker.py


@app.command()
def dispatcher(
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Publish outbox rows to the broker (LISTEN/NOTIFY, polling fallback)."""
    from workers.dispatcher import run_dispatcher
    from workers.logs import configure_logging

    configure_logging(loglevel)
    warn_unknown_variables()
    try:
        run_dispatcher(worker_settings())
    except OnwardError as exc:
        fail(str(exc), EXIT_REFUSED)


@app.command()
def reaper(
    loglevel: Annotated[str | None, typer.Option(help="Default: ONWARD_LOG_LEVEL or INFO.")] = None,
) -> None:
    """Restore runs whose lease expired, re-send lost messages, park crash loops."""
    from workers.logs import configure_logging
    from workers.reaper import run_reaper

    configure_logging(loglevel)
    warn_unknown_variables()
    try:
        run_reaper(worker_settings())
    except OnwardError as exc:
        fail(str(exc), EXIT_REFUSED)


# -- embedded -----------------------------------------------------------------------------
@embedded_app.command("up")
def embedded_up() -> None:
    """Start the embedded PostgreSQL and Redis (no-op when already running)."""
    from ledger.checkpoints import CheckpointKeys
    from ledger.db import database_url
    from workers.broker import broker_url

    settings = worker_settings()
    out.print(line("database: ", database_url(settings)), soft_wrap=True)
    out.print(line("broker:   ", broker_url(settings)), soft_wrap=True)
    crypt = CheckpointKeys.from_settings(settings).crypt  # makes the home's key when missing
    out.print(line("encryption at rest: ", f"on (master key {crypt.active})" if crypt
                   else "off"), soft_wrap=True)


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
    from ledger.db import create_engine, require_current_schema
    from workers.logs import configure_logging
    from workers.metrics import serve_metrics

    configure_logging()
    warn_unknown_variables()
    settings = worker_settings()
    engine = create_engine(settings, pool_size=1)
    try:
        require_current_schema(engine)
    except OnwardError as exc:
        fail(str(exc), EXIT_REFUSED)
    stop = serve_metrics(engine, port, host, worker_ttl_s=settings.worker_queue_ttl_s,
                         outbox_grace_s=settings.outbox_grace_s)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    announce(f"serving http://{host}:{port}/metrics", port=port)
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
            payload = parse_json(input_json)
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
    note_unserved(ledger, workflow)


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
    from uvicorn.config import LOGGING_CONFIG

    from console.auth import local_admin, owns_embedded_database
    from console.http.app import create_app
    from ledger.tokens import TokenRequest
    from ledger.vocabulary import Role
    from workers.logs import configure_logging, json_logs

    configure_logging()
    warn_unknown_variables()
    settings = _settings()
    ledger = Ledger.from_env(settings)
    with reported():
        ledger.require_current_schema()
    _require_free_port(host, port)  # before a login token is made for a console that won't run
    # uvicorn stops gracefully on SIGTERM, then raises it again for the handler it found:
    # the default one ended the process before `finally` revoked the login token
    signal.signal(signal.SIGTERM, _stopped)
    issued = None
    if settings.database_url is None and owns_embedded_database(settings):
        admin = ledger.with_actor(local_admin(settings))
        with reported():
            issued = admin.create_token(TokenRequest(
                settings.actor, Role.ADMIN, settings.tenant_id, timedelta(hours=12),
                note="onward console login link"))
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    if issued is not None:
        announce(f"open {base}/login?token={issued.secret}", url=f"{base}/login")
    else:
        announce(f"open {base}/login and sign in with a token (onward tokens create)",
                 url=f"{base}/login")
    # uvicorn's own handlers print plain text: in JSON mode its loggers use onward's
    log_config = None if json_logs() else LOGGING_CONFIG
    try:
        uvicorn.run(create_app(ledger), host=host, port=port, log_level="warning",
                    log_config=log_config)
    finally:
        if issued is not None:
            with contextlib.suppress(OnwardError):
                admin.revoke_token(str(issued.token.id), "the console stopped")


def _stopped(signum: int, _frame: object) -> None:
    """SIGTERM after uvicorn's shutdown: leave through ``finally`` (exit 0, as on Ctrl-C)."""
    raise SystemExit(0)


def _require_free_port(host: str, port: int) -> None:
    """Refuse, saying what to do, when ``host:port`` is taken (another console, say): uvicorn
    would print a login link first, then fail with "address already in use", and the link
    pointed at the other console, with a token revoked at once."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}): another onward "
             "console may be running there; pass --port (or stop it)", EXIT_REFUSED)


def _one_line_summaries(group: typer.Typer) -> None:
    """A command's summary in its group's ``--help`` list is its docstring's first
    paragraph, reflowed: typer's rich help keeps that paragraph's source line breaks, which
    printed each long summary as ragged lines at any terminal width."""
    for command in group.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        if command.short_help is None:
            command.short_help = " ".join(doc.split("\n\n")[0].split())
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


try:  # typer 0.29 vendors click: the usage errors it raises are its own copy's
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - an earlier typer, on click itself
    from click.exceptions import UsageError  # type: ignore[assignment]


def _json_flag(command: TyperCommand) -> bool:
    """Whether ``command`` has the ``--json`` flag that prints its answer as JSON (not
    ``corpus replay``'s ``--json FILE``)."""
    return any(isinstance(p, TyperOption) and p.name == "as_json" and p.is_flag
               for p in command.params)


class _OnwardCommand(TyperCommand):
    """A command whose ``--help`` names its parameters in plain words (help_params.py:
    no ``<str>``, no ``{run_id}``, flags without a type), and whose errors,
    run with ``--json``, are also one JSON object on stdout (console/common.py): its usage
    errors too (a missing argument, an unknown option, a bad value), which click raises
    while it reads the command line, before the command runs, and prints on stderr."""

    def get_params(self, ctx: Any) -> Any:
        return plain_params(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # click consumes them
        try:
            return super().parse_args(ctx, args)
        except UsageError as exc:
            if "--json" in given and _json_flag(self):
                json_error("usage", exc.format_message(), exc.exit_code)
            raise

    def invoke(self, ctx: Any) -> Any:
        with json_errors(ctx.params.get("as_json") is True and _json_flag(self)):
            return super().invoke(ctx)


class _OnwardGroup(TyperGroup):
    """A command group whose ``--help`` names its parameters in plain words."""

    def get_params(self, ctx: Any) -> Any:
        return plain_params(super().get_params(ctx))


def _onward_classes(group: typer.Typer) -> None:
    """Every command and group under ``group``, at any depth, built with the classes above
    (tests/unit/test_cli_help.py walks them all)."""
    group.info.cls = _OnwardGroup
    for command in group.registered_commands:
        if command.cls in (None, TyperCommand):  # typer's default; a chosen class stays
            command.cls = _OnwardCommand
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _onward_classes(sub.typer_instance)


_one_line_summaries(app)
_onward_classes(app)
