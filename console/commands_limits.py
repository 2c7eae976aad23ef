"""``onward limits``: every fleet-wide limit a tool or model client declared, with its current
use: slots in flight, starts in the rate's window, runs waiting for a slot, and how many
calls it let through or held back so far (docs/limits.md)."""

from __future__ import annotations

from rich.table import Table

from console.common import JsonFlag, open_ledger, out, print_json, reported
from console.safe import line, visible
from ledger.limits import LimitState

__all__ = ["limits"]


def limits(as_json: JsonFlag = False) -> None:
    """List fleet-wide limits (concurrency, rate) with their use now and waiting runs."""
    ledger = open_ledger()
    with reported():
        states = ledger.limits()
    if as_json:
        print_json({"limits": [state.as_dict() for state in states]})
        return
    _print(states)


def _rate(state: LimitState) -> str:
    if state.rate_count is None or state.rate_window_s is None:
        return "-"
    return f"{state.started_in_window}/{state.rate_count} per {state.rate_window_s:g}s"


def _print(states: list[LimitState]) -> None:
    table = Table("limit", "in flight", "rate (started in window)", "waiting", "granted",
                  "throttled")
    for s in states:
        concurrency = f"{s.in_use}/{s.concurrency}" if s.concurrency else f"{s.in_use}/-"
        table.add_row(visible(s.key), concurrency, _rate(s), str(s.waiting), str(s.granted),
                      str(s.throttled))
    out.print(table)
    out.print(line(f"{len(states)} limit key(s), {sum(s.waiting for s in states)} run(s) "
                   "waiting for a slot"))
