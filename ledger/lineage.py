"""What a replay or branch run needs while its steps execute (docs/design.md section 8).

``Launch`` is the run's lineage as the claim returns it. ``LineageStore`` reads the
records an evidence replay answers from (its *source*: the nearest ancestor that is not an
evidence replay itself) and stops a replay that diverged. Every statement is one
transaction on the worker's hot connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from ledger import signed, sql
from ledger.checkpoints import CheckpointKeys
from ledger.effects import Effect
from ledger.exceptions import IntegrityViolation
from ledger.hot import HotConnection
from ledger.vocabulary import ApprovalStatus, AttemptOutcome, FailReason, LaunchMode
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl

__all__ = [
    "APPROVAL_AT",
    "SIGNAL_AT",
    "STEP_AFTER",
    "Divergence",
    "Launch",
    "LineageStore",
    "resume_after_wait",
]


@dataclass(frozen=True)
class Launch:
    """How a run reaches the outside world: ``mode`` None is an ordinary run."""

    mode: LaunchMode | None = None
    parent_run_id: UUID | None = None
    allow_irreversible: bool = False
    parent_seq: int | None = None
    mac: str | None = None  # signs how the run was launched: ledger/signed.py launch

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Launch:
        mode = row.get("mode")
        return cls(mode=LaunchMode(mode) if mode else None,
                   parent_run_id=row.get("parent_run_id"),
                   allow_irreversible=bool(row.get("allow_irreversible")),
                   parent_seq=row.get("parent_seq"), mac=row.get("launch_mac"))

    def signed_body(self, run_id: UUID, tenant_id: str) -> dict[str, Any]:
        """What ``mac`` must sign (ledger/signed.py launch)."""
        return signed.launch(run_id, {
            "tenant_id": tenant_id, "mode": self.mode.value if self.mode else None,
            "parent_run_id": self.parent_run_id, "parent_seq": self.parent_seq,
            "allow_irreversible": self.allow_irreversible})

    @property
    def evidence(self) -> bool:
        """Answers come from the parent's records; nothing external is called."""
        return self.mode is LaunchMode.EVIDENCE

    @property
    def simulation(self) -> bool:
        """Effects run the tool's sandbox (``Tool.simulate``)."""
        return self.mode is LaunchMode.SIMULATION

    @property
    def blocks_irreversible(self) -> bool:
        """A live replay or a branch sends irreversible effects only when explicitly allowed."""
        return self.mode in (LaunchMode.LIVE, LaunchMode.BRANCH) and not self.allow_irreversible


@dataclass(frozen=True)
class Divergence:
    """Where an evidence replay asked for something its parent never recorded, and why."""

    kind: str  # llm, read, effect, approval, signal
    why: str  # no_record, request_differs, no_outcome, no_decision, artifact_differs
    step: str | None
    seq: int
    command_id: str
    message: str
    details: dict[str, Any] | None = None

    def report(self, parent_run_id: UUID | None, source_run_id: UUID | None) -> dict[str, Any]:
        """The run's ``last_error``: what an operator reads to see where the code changed."""
        return {
            "type": "ReplayDiverged", "reason": FailReason.DIVERGED, "message": self.message,
            "where": {"step": self.step, "seq": self.seq, "command_id": self.command_id},
            "kind": self.kind, "why": self.why,
            "parent_run_id": str(parent_run_id) if parent_run_id else None,
            "source_run_id": str(source_run_id) if source_run_id else None,
            **(self.details or {}),
        }


def resume_after_wait(control: TimerControl | ApprovalControl | SignalControl, seq: int,
                      approval: dict[str, Any] | None, signal_seen: bool,
                      source_next: str | None = None) -> str | Divergence:
    """The step an evidence replay takes after the wait recorded in ``control`` at ``seq``:
    the one its source took after the recorded decision, or a divergence. ``source_next``
    is the step the source ran after that wait (its checkpoint ``seq + 1``), which tells a
    signal wait that timed out into its ``on_timeout`` step from one still waiting."""
    then = control.then
    if isinstance(control, TimerControl):
        return then
    if isinstance(control, SignalControl):
        if signal_seen:
            return then
        if control.on_timeout and source_next == control.on_timeout:
            return control.on_timeout  # the source's wait timed out
        return Divergence("signal", "no_decision", then, seq, f"signal:{control.name}",
                          f"the parent received no signal {control.name!r} at seq "
                          f"{seq}; an evidence replay cannot go past this wait")
    command_id = f"approval:{control.action}"
    if approval is None:
        return Divergence("approval", "no_record", then, seq, command_id,
                          f"the parent never asked for approval {control.action!r} at "
                          f"seq {seq}")
    if approval["artifact_hash"] != control.artifact_hash:
        return Divergence("approval", "artifact_differs", then, seq, command_id,
                          f"approval {control.action!r} at seq {seq} is for artifact "
                          f"{control.artifact_hash[:12]}…, the parent's approver saw "
                          f"{approval['artifact_hash'][:12]}…")
    status = ApprovalStatus(approval["status"])
    if status is ApprovalStatus.APPROVED:
        return then
    if status is ApprovalStatus.REJECTED and control.on_reject:
        return control.on_reject
    if status is ApprovalStatus.EXPIRED and control.on_expire:
        return control.on_expire
    return Divergence("approval", "no_decision", then, seq, command_id,
                      f"the parent's approval {approval['id']} at seq {seq} is {status.value}: "
                      "there is no decision an evidence replay could follow")


SOURCE_CHAIN = sql.statement("replay_source")  # the rows evidence_source walks

APPROVAL_AT = sql.statement("approval_at")

STEP_AFTER = sql.statement("step_after")

SIGNAL_AT = sql.statement("signal_payload")  # the signal that ended the wait at seq

_EFFECT = sql.statement("effect_by_key")
_DIVERGE = sql.statement("diverge")


def evidence_source(chain: Sequence[Mapping[str, Any]], keys: CheckpointKeys, *,
                    check_first: bool = True) -> UUID | None:
    """The run an evidence replay answers from, given its lineage (``SOURCE_CHAIN``'s rows,
    nearest first): the first that made its own calls. None: there is none (a parent is gone).

    Every launch on the way, the source's included, must verify against the MAC its ``mode``
    and ``parent_run_id`` were signed with (``check_first=False`` skips the first row, already
    checked by the caller): an edited ancestor would otherwise redirect the replay to another
    run's records. Raises IntegrityViolation naming the ancestor."""
    for depth, row in enumerate(chain):
        if depth or check_first:
            launch = Launch.from_row(dict(row))
            keys.check(launch.signed_body(row["id"], row["tenant_id"]), launch.mac,
                       f"run {chain[0]['id']}: the launch (mode, parent) of "
                       f"{'its ancestor ' if depth else ''}{row['id']}")
        if row["mode"] != LaunchMode.EVIDENCE.value:
            return UUID(str(row["id"]))
    if len(chain) > 1000:
        raise IntegrityViolation(f"run {chain[0]['id']}: its lineage of evidence replays does "
                                 "not end at a run that made its own calls (a cycle, or over "
                                 "1,000 generations)")
    return None


class LineageStore:
    """The parent's records, as a replay's step reads them, on the worker's hot connection."""

    def __init__(self, conn: HotConnection) -> None:
        self.conn = conn

    def evidence_source(self, run_id: UUID, keys: CheckpointKeys) -> UUID | None:
        """The nearest ancestor of ``run_id`` that made its own calls (not an evidence replay),
        every launch on the way checked (``evidence_source``); the run's own launch was
        checked when it was claimed."""
        return evidence_source(self.conn.all(SOURCE_CHAIN, {"run_id": run_id}), keys,
                               check_first=False)

    def effect(self, effect_type: str, effect_id: str) -> Effect | None:
        row = self.conn.one(_EFFECT, {"effect_type": effect_type, "effect_id": effect_id})
        return Effect.from_row(row) if row else None

    def approval_at(self, run_id: UUID, seq: int) -> dict[str, Any] | None:
        return self.conn.one(APPROVAL_AT, {"run_id": run_id, "seq": seq})

    def signal_at(self, run_id: UUID, name: str, seq: int) -> dict[str, Any] | None:
        return self.conn.one(SIGNAL_AT, {"run_id": run_id, "name": name, "seq": seq})

    def step_after(self, run_id: UUID, seq: int) -> str | None:
        """The step ``run_id`` ran after checkpoint ``seq`` (None: it has not)."""
        row = self.conn.one(STEP_AFTER, {"run_id": run_id, "seq": seq})
        return row["step"] if row else None

    def diverge(self, run_id: UUID, epoch: int, claimed_at: datetime, step: str | None,
                report: dict[str, Any]) -> bool:
        """Stop the replay as ``diverged`` with its report, fenced by the lease (``epoch``,
        taken at ``claimed_at``: its attempt's partition key); False means the lease was
        lost (someone else decides the run's fate)."""
        row = self.conn.one(_DIVERGE, {"run_id": run_id, "epoch": epoch,
                                       "claimed_at": claimed_at, "step": step,
                                       "report": Jsonb(report),
                                       "attempt_outcome": AttemptOutcome.FAILED,
                                       "error_type": "ReplayDiverged",
                                       "error_message": str(report.get("message", ""))[:4000]})
        return row is not None and row["diverged"] == 1
