"""What every operator command shares: the ledger from ``ONWARD_*`` settings, exit codes,
error reporting, JSON output, confirmation, and time filters.

Exit codes: 0 done, 1 failed (or declined at the prompt: nothing was done), 2 refused
(the command was not allowed: no valid token, role, state, input; a refusal by a known actor
is in the audit log). Each command checks the actor's role before it shows or asks anything.

A command run with ``--json`` that ends in an error says so on stdout too, as one JSON
object (``json_error``), besides the line on stderr: a script reading stdout never meets
text, nor nothing at all.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, overload
from uuid import UUID

import typer
from rich.text import Text

from console.auth import cli_ledger
from console.safe import console, visible
from ledger import Ledger
from ledger.api import REFUSALS
from ledger.exceptions import (
    InvalidInput,
    OnwardError,
    Unauthenticated,
    UnknownApproval,
    UnknownRun,
)
from ledger.json_input import read_json
from ledger.vocabulary import AuditAction
from tasks.exceptions import WorkflowModuleUnimportable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from workers.settings import WorkerSettings

__all__ = [
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "JsonFlag",
    "LimitOpt",
    "OffsetOpt",
    "ReasonOpt",
    "YesFlag",
    "announce",
    "approval_of",
    "confirm",
    "err",
    "fail",
    "json_error",
    "json_errors",
    "open_ledger",
    "out",
    "parse_json",
    "parse_since",
    "plain",
    "print_json",
    "reported",
    "resolve_run",
    "run_of",
    "say_error",
    "short",
    "warn_unknown_variables",
    "when",
    "worker_settings",
]


EXIT_FAILED = 1
EXIT_REFUSED = 2

# Data is never read as markup (console.safe): styled labels go in as (text, style) pieces.
out = console()
err = console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
YesFlag = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking.")]
ReasonOpt = Annotated[str | None, typer.Option(
    "--reason", "-r", help="Why (required; kept in the audit log with your name).")]
LimitOpt = Annotated[int, typer.Option(min=1, max=1000, help="Rows per page.")]
OffsetOpt = Annotated[int, typer.Option(min=0, help="Rows to skip (the page start).")]


def open_ledger(action: AuditAction | None = None) -> Ledger:
    """The ledger acting as this CLI's caller (console/auth.py); with ``action``, refused
    (audited, exit 2) unless the caller's role allows it, before anything else happens."""
    with reported():
        ledger = cli_ledger(warn=lambda text: err.print(f"note: {text}", markup=False,
                                                        highlight=False))
        if action is not None:
            ledger.require(action)
    return ledger


def resolve_run(ledger: Ledger, text: str) -> UUID:
    """A run id from the id or a unique prefix of it (as ``runs ls`` prints)."""
    with reported():
        return ledger.resolve_run(text)
    raise AssertionError("unreachable")  # pragma: no cover - reported() exits


def run_of(ledger: Ledger, text: str, action: AuditAction | None = None) -> UUID:
    """The run ``text`` names: its id, or a unique prefix of it (6+ hex digits, as ``runs
    ls`` prints). With ``action``, the role is checked first (audited), and an unknown or
    ambiguous prefix is then an audited refusal of ``action``. The CLI and the HTTP API
    both name runs through this."""
    return _named(ledger, text, action, ledger.resolve_run, "run_id")


def approval_of(ledger: Ledger, text: str, action: AuditAction | None = None) -> UUID:
    """The approval ``text`` names: its id, or a unique prefix of it (6+ hex digits, as
    ``approvals ls`` prints), checked as ``run_of`` checks a run."""
    return _named(ledger, text, action, ledger.resolve_approval, "approval_id")


def _named(ledger: Ledger, text: str, action: AuditAction | None,
           resolve: Callable[[str], UUID], field: str) -> UUID:
    full = _full_id(text)  # audit rows name the id only when the caller gave all of it
    run_id = full if field == "run_id" else None
    approval_id = full if field == "approval_id" else None
    if action is not None:
        ledger.require(action, run_id=run_id, approval_id=approval_id)
    try:
        return resolve(text)
    except (InvalidInput, UnknownRun, UnknownApproval) as exc:
        if action is None:
            raise
        raise ledger.refuse(action, exc, run_id=run_id, approval_id=approval_id) from None


def _full_id(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


def worker_settings() -> WorkerSettings:
    """A worker's, dispatcher's or reaper's settings (workers/settings.py)."""
    from workers.settings import WorkerSettings

    return WorkerSettings()


def warn_unknown_variables() -> None:
    """Log a warning for each ``ONWARD_`` variable no settings class reads (a typo, or a
    setting that no longer exists), naming the nearest known one (console/settings.py)."""
    import os

    import structlog

    from console.settings import unknown_variables

    for note in unknown_variables(os.environ):
        structlog.get_logger("onward.cli").warning(note)


def announce(message: str, **fields: object) -> None:
    """A line for the operator: a log line in JSON mode, plain text otherwise."""
    from workers.logs import json_logs

    if json_logs():
        import structlog

        structlog.get_logger("onward.cli").info(message, **fields)
    else:
        print(message, flush=True)


_JSON_ERRORS: ContextVar[bool] = ContextVar("onward_json_errors", default=False)


@contextmanager
def json_errors(on: bool) -> Iterator[None]:
    """While a command runs with ``--json`` (console/cli.py sets it for every command that
    has the flag), its errors are also printed as JSON on stdout (``json_error``)."""
    token = _JSON_ERRORS.set(on)
    try:
        yield
    finally:
        _JSON_ERRORS.reset(token)


def json_error(error: str, message: object, code: int, kind: str | None = None) -> None:
    """The one object a ``--json`` command prints on stdout when it ends in an error:
    ``{"kind": "error", "ok": false, "error": refused|not_authenticated|failed|declined|
    usage, "type": the error's class or null, "message": …, "exit_code": …}``."""
    print(json.dumps({"kind": "error", "ok": False, "error": error, "type": kind,
                      "message": str(message), "exit_code": code}))


def _stop(label: str, message: object, code: int, *, error: str,
          kind: str | None = None) -> NoReturn:
    """Say ``label`` and ``message`` on stderr (and as JSON on stdout with ``--json``),
    then exit with ``code``."""
    say_error(label, message)
    if _JSON_ERRORS.get():
        json_error(error, message, code, kind)
    raise typer.Exit(code)


def parse_json(text: str) -> Any:
    """JSON a person gave (an option, a file), read strictly (ledger/json_input.py): a
    value nested past the parser, NaN or Infinity, a giant integer, a NUL or a lone
    surrogate is refused like any other bad JSON (a ``ValueError`` saying which), never a
    traceback or a value the ledger fails on later."""
    return read_json(text)


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    _stop("error:", message, code, error="refused" if code == EXIT_REFUSED else "failed")


def say_error(label: str, message: object) -> None:
    """``label`` in red, then ``message`` as data (its line breaks kept, controls escaped)."""
    err.print(Text.assemble((label, "red"), " ", visible(message, newlines=True)),
              soft_wrap=True)


@contextmanager
def reported() -> Iterator[None]:
    """Turn onward errors into a message and the exit code: 2 refused, 1 failed."""
    try:
        yield
    except Unauthenticated as exc:
        _stop("not authenticated:", exc, EXIT_REFUSED, error="not_authenticated",
              kind=type(exc).__name__)
    except REFUSALS as exc:
        _stop("refused:", exc, EXIT_REFUSED, error="refused", kind=type(exc).__name__)
    except WorkflowModuleUnimportable as exc:  # the paragraph says which module and why
        _stop("error:", exc, EXIT_REFUSED, error="refused", kind=type(exc).__name__)
    except OnwardError as exc:
        _stop("error:", f"{type(exc).__name__}: {exc}", EXIT_FAILED, error="failed",
              kind=type(exc).__name__)


def confirm(question: str, yes: bool) -> None:
    """Ask before a change; declining does nothing and exits 1."""
    if yes:
        return
    ask: dict[str, Any] = {"err": True} if _JSON_ERRORS.get() else {}  # stdout: the JSON
    if not typer.confirm(question, default=False, **ask):
        err.print("nothing done")
        if _JSON_ERRORS.get():
            json_error("declined", "nothing done", EXIT_FAILED)
        raise typer.Exit(EXIT_FAILED)


@overload
def plain(value: DataclassInstance) -> dict[str, Any]: ...


@overload
def plain(value: Any) -> Any: ...


def plain(value: Any) -> Any:
    """A JSON-ready copy of dataclasses, UUIDs, times, decimals and enums."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.repr}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return value


def print_json(value: Any) -> None:
    print(json.dumps(plain(value), indent=None, sort_keys=False))


_AGO = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str | None) -> datetime | timedelta | None:
    """``30m``, ``2h``, ``7d``, ``1w`` ago (a span the ledger counts back from the
    database's clock, not this host's), or an ISO 8601 time with its zone."""
    if value is None:
        return None
    match = _AGO.match(value.strip())
    if match:
        return timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        fail(f"--since {value!r}: give e.g. 30m, 2h, 7d or an ISO time", EXIT_REFUSED)
    if parsed.tzinfo is None:
        fail(f"--since {value!r} has no time zone; give one (e.g. {value}Z or {value}+01:00) "
             "or a span such as 2h", EXIT_REFUSED)
    return parsed


def short(value: Any, width: int = 12) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[:width] + "…"


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"
