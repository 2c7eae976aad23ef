"""``onward corpus``: recorded runs as a regression suite (docs/corpus.md).

``add`` pins runs by workflow, version, status, time window, tenant or id; ``ls``, ``show``
and ``rm`` manage corpora; ``export`` and ``import`` move one as a verified bundle; ``replay``
runs a corpus against candidate code offline and reports where it diverges
(console/commands_replay.py).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated
from uuid import UUID

import typer
from rich.table import Table

from console.common import (
    EXIT_REFUSED,
    JsonFlag,
    ReasonOpt,
    YesFlag,
    confirm,
    err,
    fail,
    open_ledger,
    out,
    parse_since,
    print_json,
    reported,
    resolve_run,
    short,
    when,
)
from console.safe import add_row, id_column, line
from ledger import RunStatus
from ledger.bundle import DropPolicy, open_for_write, read_bundle
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.vocabulary import AuditAction

__all__ = [
    "NameArg",
    "corpus_add",
    "corpus_app",
    "corpus_export",
    "corpus_import",
    "corpus_ls",
    "corpus_rm",
    "corpus_show",
]


corpus_app = typer.Typer(
    help="Corpora: recorded runs pinned as a regression suite; replay them against new code.",
    no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="The corpus's name.")]


@corpus_app.command("add")
def corpus_add(
    name: NameArg,
    workflow: Annotated[str | None, typer.Option(help="Runs of this workflow.")] = None,
    version: Annotated[int | None, typer.Option(help="Runs at this workflow version.")] = None,
    status: Annotated[list[RunStatus] | None, typer.Option(
        help="completed, failed or cancelled (repeatable); default: all three.")] = None,
    since: Annotated[str | None, typer.Option(help="Started since: 30m, 2h, 7d or ISO.")]
    = None,
    until: Annotated[datetime | None, typer.Option(help="Started before (ISO, with zone).")]
    = None,
    tenant: Annotated[str | None, typer.Option(help="Runs of this tenant (your own).")] = None,
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="A run by id or unique prefix (repeatable).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many, newest first.")]
    = None,
    description: Annotated[str | None, typer.Option(help="What the corpus is for.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Pin recorded runs into corpus NAME (created if new). Pinned runs are kept: retention
    skips them and the ledger refuses to delete them."""
    ledger = open_ledger(AuditAction.CORPUS_ADD)
    if until is not None and until.tzinfo is None:
        fail(f"--until {until.isoformat()} has no time zone; give one", EXIT_REFUSED)
    run_ids = tuple(resolve_run(ledger, r) for r in run or ())
    selection = Selection(workflow=workflow, version=version, statuses=tuple(status or ()),
                          since=parse_since(since), until=until, tenant_id=tenant,
                          run_ids=run_ids, limit=limit)
    with reported():
        pinned = Corpora(ledger).add(name, selection, description)
    if as_json:
        print_json(pinned)
        return
    out.print(line(("pinned", "green"), f" {pinned.added} run(s) into corpus ", name,
                   f" ({pinned.already} were already in it)"))


@corpus_app.command("ls")
def corpus_ls(as_json: JsonFlag = False) -> None:
    """Corpora of your tenant, with their runs per workflow."""
    ledger = open_ledger()
    with reported():
        found = Corpora(ledger).all()
    if as_json:
        print_json(found)
        return
    table = Table("corpus", "runs", "workflows", "created by", "updated")
    for c in found:
        add_row(table, c.name, c.runs, ", ".join(f"{w} ({n})" for w, n in c.workflows.items()),
                c.created_by, when(c.updated_at))
    out.print(table)


@corpus_app.command("show")
def corpus_show(name: NameArg, as_json: JsonFlag = False) -> None:
    """A corpus and its pinned runs."""
    ledger = open_ledger()
    corpora = Corpora(ledger)
    with reported():
        summary, pinned = corpora.get(name), corpora.runs(name)
    if as_json:
        print_json({"corpus": summary, "runs": pinned})
        return
    out.print(line(("corpus ", "bold"), name, f": {summary.runs} run(s)",
                   f" — {summary.description}" if summary.description else ""))
    table = Table(id_column("run"), "workflow", "status", "checkpoints", "started", "pinned by")
    for r in pinned:
        add_row(table, r.run_id, f"{r.workflow} v{r.workflow_version or '-'}", r.status,
                r.seq + 1, when(r.created_at), r.pinned_by)
    out.print(table)


@corpus_app.command("rm")
def corpus_rm(
    name: NameArg,
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Unpin only this run (repeatable); default: delete the corpus.")] = None,
    reason: ReasonOpt = None,
    yes: YesFlag = False,
) -> None:
    """Delete corpus NAME (its runs stay; they are no longer pinned by it), or unpin runs."""
    ledger = open_ledger(AuditAction.CORPUS_REMOVE)
    run_ids: tuple[UUID, ...] = tuple(resolve_run(ledger, r) for r in run or ())
    what = f"unpin {len(run_ids)} run(s) from" if run_ids else "delete"
    with reported():
        # refused before the question, as the ledger would refuse after it
        Corpora(ledger).remove(name, run_ids, reason, dry_run=True)
        confirm(f"{what} corpus {name}?", yes)
        removed = Corpora(ledger).remove(name, run_ids, reason)
    out.print(line(("done", "green"), f": {removed} run(s) unpinned from ", name))


@corpus_app.command("export")
def corpus_export(
    name: NameArg,
    file: Annotated[Path, typer.Argument(help="The bundle to write (.gz: compressed).")],
    drop_field: Annotated[list[str] | None, typer.Option(
        "--drop-field", help="Leave a sensitive field out, e.g. effects.payload or "
        "effects.payload/card (repeatable; docs/corpus.md lists what may be dropped).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Write corpus NAME to FILE: a self-contained bundle (checkpoints, evidence, effects,
    approvals, signals, with their MACs) and its digest, signed with the ledger's key."""
    ledger = open_ledger(AuditAction.CORPUS_EXPORT)
    with reported():
        drop = DropPolicy(tuple(drop_field or ()))
    partial = file.with_name(file.name + ".partial")
    try:
        with reported(), open_for_write(partial) as handle:
            exported = Corpora(ledger).export(name, handle, drop)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(file)
    if as_json:
        print_json({**exported.__dict__, "file": str(file)})
        return
    rows = ", ".join(f"{n} {t}" for t, n in exported.counts.items() if n)
    out.print(line(("exported", "green"), " corpus ", name, " to ", str(file)))
    out.print(line(f"  {rows}"))
    out.print(line(f"  sha256 {exported.digest}"))
    if exported.skipped:
        err.print(line(f"note: {len(exported.skipped)} pinned run(s) left out: they no longer "
                       "stopped (continued after they were pinned): ",
                       ", ".join(f"{s['run_id']} ({s['status']})" for s in exported.skipped)))


@corpus_app.command("import")
def corpus_import(
    file: Annotated[Path, typer.Argument(help="A bundle written by `onward corpus export`.")],
    name: Annotated[str | None, typer.Option(help="Corpus to pin the runs in "
                                              "(default: the bundle's).")] = None,
    without_keys: Annotated[bool, typer.Option(
        "--without-keys", help="Leave out the data keys the bundle carries: its sealed values "
        "stay unreadable here (what a tenant whose keys were erased here allows).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Load a bundle's runs into this ledger and pin them: refused, with nothing written,
    unless its digest, its MAC and every run verify with the keys configured here, and
    refused if it carries data keys of a tenant whose keys were erased here."""
    ledger = open_ledger(AuditAction.CORPUS_IMPORT)
    if not file.is_file():
        fail(f"no file {file}", EXIT_REFUSED)
    with reported():
        try:
            bundle = read_bundle(file, ledger.keys)
        except (IntegrityViolation, InvalidInput) as exc:
            raise ledger.refuse(AuditAction.CORPUS_IMPORT, exc) from None
        imported = Corpora(ledger).import_bundle(bundle, name, without_keys=without_keys)
    if as_json:
        print_json(imported)
        return
    out.print(line(("imported", "green"), f" {len(imported.added)} run(s) into corpus ",
                   imported.corpus, f" ({len(imported.present)} were already here); sha256 "
                   f"{short(imported.digest, 16)}"))
    if imported.keys_dropped:
        err.print(line(f"note: {imported.keys_dropped} data key(s) of the bundle left out: its "
                       "sealed values are unreadable here"))
    if bundle.header.get("dropped"):
        err.print(line("note: the bundle left out ", ", ".join(bundle.header["dropped"])))
