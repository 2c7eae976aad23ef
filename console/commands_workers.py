"""``onward workers``: the live worker fleet, from what each worker advertises in the ledger,
and the workflows with active runs that no live worker serves.

Exit codes: 0 every active run's workflow (and version) is served by a live worker; 1 some
are not (so a cron job or a readiness probe can alert on it); 2 refused.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from console.common import (
    EXIT_FAILED,
    JsonFlag,
    err,
    open_ledger,
    out,
    plain,
    print_json,
    reported,
)
from console.safe import line, visible
from ledger import Ledger
from ledger.db import database_url
from ledger.fleet import FleetStore, Unserved, WorkerRow
from workers.settings import WorkerSettings

__all__ = ["note_unserved", "workers"]


def _workflows(row: WorkerRow) -> str:
    return ", ".join(f"{w['workflow']} v{w['version']}" for w in row.workflows)


def _unserved_text(u: Unserved) -> str:
    version = f" v{u.version}" if u.version is not None else ""
    if u.workflow_served:
        why = ("live workers have other versions of it: these runs go to the base queue, "
               "where newer code continues them if it declares compatibility, else parks them")
    else:
        why = "no live worker has this workflow: deploy workers with it (ONWARD_WORKFLOWS)"
    return f"{u.workflow}{version}: {u.runs} active run(s) unserved; {why}"


def note_unserved(ledger: Ledger, workflow: str) -> None:
    """After a command queued a step of ``workflow`` (start, replay, branch, continue): a
    note on stderr when no live worker serves it, so the person knows why the run does not
    move (it waits for one; nothing is wrong with it)."""
    store = FleetStore(database_url(ledger.settings))
    ttl = WorkerSettings.of(ledger.settings).worker_queue_ttl_s
    with reported():
        unserved = [u for u in store.unserved(within_s=ttl) if u.workflow == workflow]
    for found in unserved:
        err.print(line(("note:", "yellow"), " ", _unserved_text(found),
                       "; the run waits for one (onward workers lists them)"), soft_wrap=True)


def workers(
    as_json: JsonFlag = False,
    all_rows: Annotated[bool, typer.Option(
        "--all", help="Also list workers that stopped advertising (dead or stopped).")] = False,
) -> None:
    """List live workers (host, pid, pool, concurrency, queues, workflows and versions, steps
    in flight, last heartbeat) and flag workflows with active runs that no live worker
    serves (exit 1 when there is one)."""
    ledger = open_ledger()
    store = FleetStore(database_url(ledger.settings))
    ttl = WorkerSettings.of(ledger.settings).worker_queue_ttl_s
    with reported():
        rows = [r for r in store.workers(within_s=ttl) if r.live or all_rows]
        unserved = store.unserved(within_s=ttl)
    if as_json:
        print_json({"workers": [_row_json(r) for r in rows],
                    "unserved": [plain(u) for u in unserved]})
    else:
        _print(rows, unserved)
    if unserved:
        raise typer.Exit(EXIT_FAILED)


def _row_json(row: WorkerRow) -> dict[str, Any]:
    data: dict[str, Any] = plain(row)
    data["heartbeat_age_s"] = round(row.age_s, 3)
    del data["age_s"]
    return data


def _print(rows: list[WorkerRow], unserved: list[Unserved]) -> None:
    table = Table("node", "host", "pid", "pool", "conc", "in flight", "workflows", "queues",
                  "heartbeat")
    for r in rows:
        beat = f"{r.age_s:.0f}s ago" + ("" if r.live else " (gone)")
        table.add_row(visible(r.node), visible(r.host), str(r.pid), visible(r.pool),
                      str(r.concurrency), str(r.in_flight), visible(_workflows(r)),
                      visible(", ".join(r.queues)), beat)
    out.print(table)
    live = sum(r.live for r in rows)
    out.print(line(f"{live} live worker(s), {sum(r.in_flight for r in rows if r.live)} "
                   "step message(s) in flight"))
    for u in unserved:
        out.print(line(("unserved: ", "red"), _unserved_text(u)), soft_wrap=True)
