"""``onward keys``: encryption at rest (docs/security.md#encryption-at-rest): make a master
key, rotate the data keys and re-encrypt, erase a tenant's keys."""

from __future__ import annotations

import json
import secrets
from typing import Annotated

import typer
from rich.progress import Progress, TaskID

from console.common import JsonFlag, ReasonOpt, YesFlag, err, fail, open_ledger, out, reported
from console.safe import line
from ledger.vocabulary import AuditAction

__all__ = ["erase_tenant", "keys_app", "new", "rotate"]


keys_app = typer.Typer(help="Encryption keys: new master key, rotation, tenant erasure.",
                       no_args_is_help=True)


@keys_app.command("new")
def new(key_id: Annotated[str, typer.Argument(help="The id to give the key.")] = "m1") -> None:
    """Print a new random master key as ONWARD_ENCRYPTION_KEYS takes it (id=64 hex digits)."""
    print(f"{key_id}={secrets.token_hex(32)}")


@keys_app.command("rotate")
def rotate(
    batch: Annotated[int, typer.Option(help="Rows read and rewritten per transaction.")] = 500,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Go on after a rotation that stopped (no new data keys).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Wrap every data key under the active master key (ONWARD_ENCRYPTION_KEY_ID), give each
    tenant a new data key and re-encrypt every sealed value under it, batch by batch; MACs
    and chains are unchanged. Then the master keys not listed as in use can be removed."""
    ledger = open_ledger(AuditAction.KEYS)
    with reported(), Progress(console=err, disable=as_json) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(table: str, scanned: int, changed: int) -> None:
            if table not in tasks:
                tasks[table] = bar.add_task(table, total=None)
            bar.update(tasks[table], completed=scanned,
                       description=f"{table}: {changed} re-encrypted")

        report = ledger.rotate_keys(batch=batch, new_keys=not resume, progress=progress)
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    out.print(line(("✓", "green"), f" {report.rewrapped} data key(s) rewrapped, "
                   f"{report.new_keys} replaced; re-encrypted "
                   + ", ".join(f"{n} {t}" for t, n in report.resealed.items())), soft_wrap=True)
    left = sum(report.unreadable.values())
    if left:
        out.print(line(("✗", "red"), f" {left} row(s) did not open (erased or edited): left "
                       "as they are"), soft_wrap=True)
    out.print(line("master keys still in use: ", ", ".join(report.masters_in_use) or "-"),
              soft_wrap=True)


@keys_app.command("erase-tenant")
def erase_tenant(reason: ReasonOpt = None, yes: YesFlag = False) -> None:
    """Destroy your tenant's data keys: its sealed values can no longer be read by anyone,
    nothing more is sealed for it, and `onward verify` still passes. Irreversible."""
    ledger = open_ledger(AuditAction.KEYS)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.erase_tenant_keys(reason, dry_run=True)
    if not yes and not typer.confirm(
            f"destroy the data keys of tenant {ledger.actor.tenant_id}? Its sealed values "
            "become unreadable for good"):
        fail("not erased")
    with reported():
        erased = ledger.erase_tenant_keys(reason)
    out.print(line(("✓", "green"), f" {erased} data key(s) of tenant "
                   f"{ledger.actor.tenant_id} destroyed"), soft_wrap=True)
