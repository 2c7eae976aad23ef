"""``onward anchor`` and ``onward verify --anchor``: a rollback of the whole database is
reported instead of silently accepted (docs/guarantees.md, "Rollback of the whole
database")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

import typer

from console.common import JsonFlag, ReasonOpt, open_ledger, out, reported
from console.safe import line
from ledger import Ledger
from ledger.anchor_store import find_anchor, open_store
from ledger.anchoring import Anchors, Compared
from ledger.api import REFUSALS
from ledger.exceptions import AnchorRefused, InvalidInput
from ledger.verify import Problem
from ledger.vocabulary import AuditAction
from workers.settings import WorkerSettings

__all__ = ["AnchorComparison", "anchor", "compare_with_anchor"]


def anchor(
    accept_rollback: Annotated[bool, typer.Option(
        "--accept-rollback", help="Anchor the ledger as it is although it does not match the "
        "latest anchor (a restore you decided to keep); needs --reason.")] = False,
    reason: ReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Write a signed digest of every run's head (all tenants) to ONWARD_ANCHOR_LOCATION, after
    checking that no run moved backwards since the latest anchor there (admin; audited). The
    reaper does this every ONWARD_ANCHOR_INTERVAL_S."""
    ledger = open_ledger(AuditAction.ANCHOR)
    with reported():
        location = WorkerSettings.of(ledger.settings).anchor_location
        if not location:
            raise InvalidInput("set ONWARD_ANCHOR_LOCATION to a directory the database's "
                               "administrators cannot rewrite (docs/configuration.md)")
        done = Anchors(ledger).publish(open_store(location), accept_rollback=accept_rollback,
                                       reason=reason)
    if as_json:
        print(json.dumps({"anchor": done.name, "where": done.where, "runs": done.runs,
                          "root": done.root, "bytes": done.size,
                          "taken_at": done.taken_at.isoformat(), "previous": done.previous,
                          "not_anchored": [str(r) for r in done.not_anchored],
                          "accepted": len(done.accepted)}))
        return
    out.print(line(("✓", "green"), f" anchored {done.runs} run(s) in {done.where} "
                   f"(root {done.root[:16]}…, {done.size:,} bytes)"), soft_wrap=True)
    if done.accepted:
        out.print(line(f"accepted {len(done.accepted)} difference(s) from {done.previous}"))
    if done.not_anchored:
        out.print(line(("✗", "red"), f" {len(done.not_anchored)} run(s) left out: their head "
                       "MAC does not verify (onward verify RUN): ",
                       ", ".join(str(r) for r in done.not_anchored[:5])), soft_wrap=True)


@dataclass(frozen=True)
class AnchorComparison:
    """What ``onward verify --anchor`` found: the problems, a summary line for people, and
    the anchor and the count of runs compared (0 when the anchor itself was refused)."""

    problems: list[Problem]
    text: str
    anchor: str
    runs_compared: int


def compare_with_anchor(ledger: Ledger, path: str | None) -> AnchorComparison:
    """The actor's tenant's runs compared with an anchor."""
    with reported():
        location = WorkerSettings.of(ledger.settings).anchor_location
        try:
            name, data, latest = find_anchor(path, location)
        except REFUSALS as exc:  # no anchor there: an audited refusal of the verify
            raise ledger.refuse(AuditAction.VERIFY, exc) from None
        try:
            found = Anchors(ledger).compare(name, data)
        except AnchorRefused as exc:
            return AnchorComparison([Problem(None, None, "anchor", str(exc))],
                                    f"anchor {name}: refused", name, 0)
    return AnchorComparison(found.problems, _summary(ledger, name, found, latest), name,
                            found.compared)


def _summary(ledger: Ledger, name: str, found: Compared, latest: bool) -> str:
    others = (f"; {found.other_tenants} run(s) of other tenants not compared"
              if found.other_tenants else "")
    text = (f"compared {found.compared} run(s) of tenant {ledger.actor.tenant_id} with anchor "
            f"{name} (taken {_age(found.age)} ago{others}): {len(found.problems)} problem(s)")
    interval_s = WorkerSettings.of(ledger.settings).anchor_interval_s  # the reaper's
    if latest and found.age > 2 * timedelta(seconds=interval_s):
        text += ("\nnote: the latest anchor is older than twice ONWARD_ANCHOR_INTERVAL_S: "
                 "is a reaper anchoring? (or were newer anchors removed?)")
    return text


def _age(age: timedelta) -> str:
    seconds = max(0, int(age.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"
