"""``onward tools check``: does a tool keep the promises its declaration makes? It calls the
tool for REAL (tasks/toolcheck.py), so it is meant for the provider's test environment.

Exit codes: 0 every declared promise holds, 1 a promise is broken (or declined at the
prompt: nothing was called), 2 refused (no such tool, a module that cannot be imported, no
sample payload, bad JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from console.common import (
    EXIT_FAILED,
    EXIT_REFUSED,
    JsonFlag,
    YesFlag,
    confirm,
    err,
    fail,
    out,
    parse_json,
    print_json,
)
from console.safe import line
from ledger.exceptions import InvalidInput, OnwardError

__all__ = ["CHECK_HELP", "tools_app", "tools_check"]


tools_app = typer.Typer(help="Tools: check a tool's declared promises against a TEST provider.",
                        no_args_is_help=True)

_MARK = {"passed": ("✓", "green"), "failed": ("✗", "red"), "skipped": ("·", "dim")}


CHECK_HELP = "\n\n".join([
    "Check that a tool keeps each promise its declaration makes, by CALLING IT FOR REAL.",
    "WARNING: this creates real objects at the tool's provider (one, and up to three when the "
    "provider ignores keys). Point it ONLY at a TEST environment (a sandbox account, a staging "
    "URL): configure the tool's client for it before running this command.",
    "Checked where the declaration makes the promise: the call answers with a reference; an "
    "accepted job's status settles; lookup finds what the call created with its key; lookup of "
    "an unknown key says missing; the same key twice gives one object (honours_key); the same "
    "key with another payload is refused (refuses_key_reuse); simulate answers.",
    "Exit codes: 0 every declared promise holds; 1 a promise is broken (or you declined); "
    "2 refused (no such tool, a module that cannot be imported, no sample payload, bad "
    "JSON).",
])


@tools_app.command("check", help=CHECK_HELP)
def tools_check(
    target: Annotated[str, typer.Argument(
        metavar="MODULE:TOOL",
        help="Where the Tool is declared, e.g. examples.sales:create_offer.")],
    payload: Annotated[str | None, typer.Option(
        help="A sample request (JSON object) the provider's TEST environment accepts. "
             "Default: the tool's check_payload.")] = None,
    payload_file: Annotated[Path | None, typer.Option(
        help="A file holding the sample request (JSON object).")] = None,
    other_payload: Annotated[str | None, typer.Option(
        help="Another valid request, sent under the SAME key to check that key reuse is "
             "refused. Default: the sample with its first value changed.")] = None,
    status_timeout: Annotated[float, typer.Option(
        min=0, help="Seconds to poll an accepted job before calling status broken.")] = 30.0,
    yes: YesFlag = False,
    as_json: JsonFlag = False,
) -> None:
    from tasks.toolcheck import check_tool, load_tool

    try:
        tool = load_tool(target)
        sample = _sample(payload, payload_file)
        other = _object(other_payload, "--other-payload") if other_payload else None
    except InvalidInput as exc:
        fail(str(exc), EXIT_REFUSED)
    console = err if as_json else out
    console.print(line(("tools check ", "bold"), tool.name, f" ({tool.tool_class.value}): ",
                       ("this CALLS THE TOOL FOR REAL and creates objects at its provider; "
                        "use a test environment only", "yellow")), soft_wrap=True)
    confirm("is the provider a test environment?", yes)
    try:
        report = check_tool(tool, sample, other_payload=other, status_timeout_s=status_timeout)
    except OnwardError as exc:
        fail(str(exc), EXIT_REFUSED)
    if as_json:
        print_json(report.as_dict())
    else:
        _show(report)
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)


def _sample(text: str | None, path: Path | None) -> dict[str, Any] | None:
    if text is not None and path is not None:
        raise InvalidInput("give --payload or --payload-file, not both")
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read --payload-file {path}: {exc}") from exc
    return _object(text, "--payload") if text is not None else None


def _object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = parse_json(text)
    except ValueError as exc:
        raise InvalidInput(f"{flag} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput(f"{flag} must be a JSON object")
    return value


def _show(report: Any) -> None:
    for check in report.checks:
        mark, style = _MARK[check.verdict.value]
        out.print(line((f"  {mark} {check.verdict.value:7} ", style), (check.promise, "bold"),
                       ": ", check.detail), soft_wrap=True)
    out.print(line("  key sent: ", report.key, "   unknown key asked: ", report.unknown_key),
                   soft_wrap=True)
    if report.objects:
        out.print(line("  objects created at the provider: ", ", ".join(report.objects),
                       (" (remove them from the test environment if it keeps them)", "dim")),
                  soft_wrap=True)
    if report.passed:
        out.print(line((f"{report.tool} keeps every promise it declares", "green")))
    else:
        names = ", ".join(c.promise for c in report.broken)
        out.print(line((f"{report.tool} BREAKS {len(report.broken)} promise(s): ", "red"),
                       names), soft_wrap=True)
