"""Offline verification of stored history (``onward verify``): every checkpoint's MAC, the
chain of parent hashes, contiguity from the first checkpoint to the run's recorded head, and
the hashes of referenced artifacts. Reports each problem precisely; changes nothing."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger import compacted, signed, sql
from ledger.attempt_history import attempt_problems_txn
from ledger.bundle import DROPPED
from ledger.checkpoints import (
    CheckpointBody,
    CheckpointKeys,
    artifact_ref,
    canonical_json,
    sha256_hex,
)
from ledger.crypto import is_sealed
from ledger.effects import Effect, check_effect, check_recipient, list_effects_txn
from ledger.evidence import checked_response
from ledger.exceptions import IntegrityViolation, InvalidInput, MalformedControl
from ledger.retention import compacted_problem
from ledger.schema import (
    approvals,
    artifacts,
    audit,
    effects,
    evidence,
    refused_answers,
    runs,
    signals,
)
from ledger.signal_order import carried_marks
from ledger.states import checkpoint_rows_txn
from ledger.vocabulary import ApprovalStatus, OutcomeKind
from ledger.wait_control import parse_control
from ledger.waits import check_signal, check_terms

__all__ = [
    "Problem",
    "chain_problems",
    "head_disagreement",
    "result_problem",
    "run_ids_txn",
    "verify_run_txn",
    "verify_source_txn",
]


@dataclass(frozen=True)
class Problem:
    run_id: UUID | None  # None: a problem of the tenant's audit chain as a whole
    seq: int | None
    kind: str  # mac, chain, gap, head, first, artifact, key, run, beyond_head, evidence, result,
    # approval, audit, effect, launch, signal; unsealed (a warning: ledger/audit_chain.py)
    detail: str

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "run"
        if self.run_id is None:
            return f"{self.kind}: {self.detail}"
        return f"{self.run_id} {where}: {self.kind}: {self.detail}"


def verify_run_txn(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> list[Problem]:
    run = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().first()
    if run is None:
        return [Problem(run_id, None, "missing", "no such run")]
    rows = checkpoint_rows_txn(conn, run_id)
    if not rows:
        return [Problem(run_id, None, "head", "the run has no checkpoints at all")]
    problems = chain_problems(keys, run_id, rows, forked=run["parent_run_id"] is not None)
    last = rows[-1]
    if last["seq"] != run["seq"]:
        problems.append(Problem(run_id, last["seq"], "head",
                                f"the run is at seq {run['seq']} but history ends at "
                                f"{last['seq']} (truncated or extended outside onward)"))
    elif last["hash"] != run["head_hash"]:
        problems.append(Problem(run_id, last["seq"], "head",
                                "the last checkpoint is not the run's recorded head"))
    else:
        problems.extend(_check_run_row(run, last))
    problems.extend(_check_head_mac(keys, run))
    problems.extend(_check_launch(keys, run))
    problems.extend(_beyond_head(conn, run))
    problems.extend(_check_evidence(conn, keys, run_id))
    problems.extend(_check_effects(conn, keys, run_id))
    problems.extend(_check_used(conn, run, rows))
    problems.extend(_check_audit_rows(conn, keys, run_id))
    problems.extend(_check_approvals(conn, keys, run_id, rows))
    problems.extend(_check_signals(conn, keys, run_id, rows))
    problems.extend(_check_refusals(conn, keys, run_id))
    problems.extend(_check_result(keys, run))
    problems.extend(_check_state_artifacts(conn, run_id, rows))
    return problems


def head_disagreement(head: CheckpointBody, *, workflow: str, workflow_version: int | None,
                      state_schema_version: int | None, step: str | None) -> str | None:
    """How a run's row disagrees with its MAC'd head checkpoint about what runs next, or
    None: the workflow (envelope 2 on), workflow version, state schema version and, unless
    the head is a wait (whose continuations its control names), the next step."""
    edited = "(the run's row was edited outside onward)"
    if head.workflow is not None and workflow != head.workflow:
        return (f"the run names workflow {workflow!r}, its head checkpoint was signed for "
                f"workflow {head.workflow!r} {edited}")
    # A run's start (or a fork of it) names no version: the first claim binds the run to
    # the claiming code's version and schema (ledger/steps.py), which no checkpoint signs yet.
    unbound = head.workflow_version is None
    if not unbound and workflow_version != head.workflow_version:
        return (f"the run names workflow version {workflow_version}, its head checkpoint was "
                f"signed for workflow version {head.workflow_version} {edited}")
    if not unbound and state_schema_version != head.state_schema_version:
        return (f"the run names state schema version {state_schema_version}, its head "
                f"checkpoint was signed for state schema version {head.state_schema_version} "
                f"{edited}")
    try:
        control = parse_control(head.control, f"its head checkpoint {head.seq}")
    except MalformedControl as exc:
        return str(exc)
    if control is None and step != head.next_step:
        return (f"the run is routed to step {step!r}, its head checkpoint names step "
                f"{head.next_step!r} {edited}")
    if control is not None and step not in control.continuations:
        return (f"the run is routed to step {step!r}, which its head checkpoint's wait does "
                f"not name {edited}")
    return None


def chain_problems(keys: CheckpointKeys, run_id: UUID, rows: Sequence[Mapping[str, Any]], *,
                   forked: bool) -> list[Problem]:
    """Every MAC of ``rows`` (a run's checkpoints, oldest first), their links and their
    contiguity from the run's first checkpoint (seq 0, or a replay's fork checkpoint)."""
    problems: list[Problem] = []
    first = rows[0]
    if not forked and first["seq"] != 0:
        problems.append(Problem(run_id, first["seq"], "first",
                                f"history starts at seq {first['seq']}, not 0 (deleted?)"))
    if forked and first["outcome"] != OutcomeKind.FORK.value:
        problems.append(Problem(run_id, first["seq"], "first",
                                "a replay or branch must start with its fork checkpoint"))
    previous = None
    for row in rows:
        problems.extend(_check_one(keys, run_id, row, previous))
        previous = row
    return problems


def verify_source_txn(conn: Connection, keys: CheckpointKeys, run: sa.RowMapping,
                      seq: int) -> None:
    """Raise IntegrityViolation unless checkpoint ``seq`` of ``run`` can be copied: its MAC,
    the chain back to the run's first checkpoint, and the state artifact it references all
    verify. Replay and branch call it before they copy anything (O(seq))."""
    run_id = run["id"]
    rows = checkpoint_rows_txn(conn, run_id, upto=seq)
    problems = chain_problems(keys, run_id, rows, forked=run["parent_run_id"] is not None)
    problems.extend(_check_state_artifacts(conn, run_id, rows[-1:]))
    if problems:
        shown = "; ".join(f"seq {p.seq}: {p.kind}: {p.detail}" for p in problems[:3])
        raise IntegrityViolation(
            f"checkpoint {seq} of run {run_id} does not verify, so it is not copied: {shown}"
            f"{' …' if len(problems) > 3 else ''} (`onward verify {run_id}` reports the "
            "whole history; the run needs investigation, not a copy)")


def _check_launch(keys: CheckpointKeys, run: sa.RowMapping) -> Iterator[Problem]:
    try:
        keys.check(signed.launch(run["id"], run), run["launch_mac"],
                   f"how the run was launched (mode {run['mode'] or 'ordinary'}, parent "
                   f"{run['parent_run_id'] or 'none'}, irreversible effects "
                   f"{'allowed' if run['allow_irreversible'] else 'not allowed'})")
    except IntegrityViolation as exc:
        yield Problem(run["id"], None, "launch", str(exc))


def _check_head_mac(keys: CheckpointKeys, run: sa.RowMapping) -> Iterator[Problem]:
    try:
        keys.check(signed.head(run["id"], run["seq"], run["head_hash"]), run["head_mac"],
                   f"the run's head (seq {run['seq']})")
    except IntegrityViolation as exc:
        yield Problem(run["id"], run["seq"], "head", str(exc))


_BEYOND_HEAD = sql.text("beyond_head")


def _beyond_head(conn: Connection, run: sa.RowMapping) -> Iterator[Problem]:
    """Work recorded past the run's head means the head was moved back: a step committed at
    seq s made checkpoint s + 1, and nothing runs beyond the head."""
    for what, seq, count in conn.execute(_BEYOND_HEAD, {"run": run["id"], "seq": run["seq"]}):
        yield Problem(run["id"], seq, "beyond_head",
                      f"{count} {what} row(s) at seq {seq}, beyond the run's head at seq "
                      f"{run['seq']} (its history was cut back)")


def _check_run_row(run: sa.RowMapping, head: Mapping[str, Any]) -> Iterator[Problem]:
    found = head_disagreement(CheckpointBody.from_row(head), workflow=run["workflow"],
                              workflow_version=run["workflow_version"],
                              state_schema_version=run["state_schema_version"],
                              step=run["step"])
    if found is not None:
        yield Problem(run["id"], head["seq"], "run", found)


def _check_state_artifacts(conn: Connection, run_id: UUID,
                           rows: Sequence[Mapping[str, Any]]) -> Iterator[Problem]:
    for row in rows:
        ref = artifact_ref(row["state"])
        if ref is None:
            continue
        body = conn.execute(sa.select(artifacts.c.body)
                            .where(artifacts.c.sha256 == ref["sha256"])).scalar()
        if body is None:
            yield Problem(run_id, row["seq"], "artifact",
                          f"state artifact {ref['sha256'][:12]}… is missing")
        elif hashlib.sha256(bytes(body)).hexdigest() != ref["sha256"]:
            yield Problem(run_id, row["seq"], "artifact",
                          f"state artifact {ref['sha256'][:12]}… does not match its hash")


def _check_mac(keys: CheckpointKeys, row: Mapping[str, Any]) -> Iterator[Problem]:
    try:
        expected = keys.mac(CheckpointBody.from_row(row).as_dict(), row["key_id"])
    except IntegrityViolation as exc:
        yield Problem(row["run_id"], row["seq"], "key", str(exc))
    else:
        if not hmac.compare_digest(expected, row["hash"]):
            yield Problem(row["run_id"], row["seq"], "mac",
                          "content does not match its MAC (edited, reordered, or copied from "
                          "another run)")


def _check_one(keys: CheckpointKeys, run_id: UUID, row: Mapping[str, Any],
               previous: Mapping[str, Any] | None) -> Iterator[Problem]:
    seq = row["seq"]
    if row.get("state_problem_here"):
        yield Problem(run_id, seq, "delta", f"its state does not rebuild: {row['state_problem']}")
    if row.get("compacted_mac") is not None:  # retention dropped its state: check the seal
        sealed = compacted_problem(keys, row)
        if sealed is not None:
            yield Problem(run_id, seq, "compacted", sealed)
    elif not row.get("state_problem"):  # else there is no state to check the MAC over; the
        yield from _check_mac(keys, row)  # cause is reported where the chain broke
    if previous is None:
        return
    if seq != previous["seq"] + 1:
        yield Problem(run_id, seq, "gap",
                      f"checkpoints {previous['seq'] + 1}..{seq - 1} are missing")
    elif row["parent_hash"] != previous["hash"]:
        yield Problem(run_id, seq, "chain",
                      f"parent hash {str(row['parent_hash'])[:12]}… is not checkpoint "
                      f"{previous['seq']}'s hash {previous['hash'][:12]}…")


def _check_evidence(conn: Connection, keys: CheckpointKeys,
                    run_id: UUID) -> Iterator[Problem]:
    rows = conn.execute(
        sa.select(evidence, artifacts.c.body.label("artifact_body"))
        .join(artifacts, artifacts.c.sha256 == evidence.c.artifact_sha256, isouter=True)
        .where(evidence.c.run_id == run_id).order_by(evidence.c.seq, evidence.c.command_id)
    ).mappings()
    for row in rows:
        try:
            checked_response(keys, row, compacted_ok=True)
        except IntegrityViolation as exc:
            yield Problem(run_id, row["seq"], "evidence", str(exc))


def _check_effects(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> Iterator[Problem]:
    """Each effect's request, recipient and (completed or failed) outcome match their MACs;
    each attempt that ended matches its MAC; attempts are numbered without gaps; an attempt
    that saw the effect completed is not contradicted by the effect's status."""
    for effect in list_effects_txn(conn, run_id):
        for check in (check_effect, check_recipient):
            try:
                check(keys, effect)
            except IntegrityViolation as exc:
                yield Problem(run_id, effect.seq, "effect", str(exc))
        # a sealed payload is checked against its request hash where it is opened (a
        # worker, with the data key): verify needs no data key (ledger/crypto.py)
        if effect.payload not in (None, DROPPED) and not is_sealed(effect.payload) and \
                sha256_hex(canonical_json(effect.payload)) != effect.request_hash:
            yield Problem(run_id, effect.seq, "effect",
                          f"effect {effect.effect_type} {effect.effect_id[:16]}…'s stored "
                          "payload is not what its signed request hash names (edited)")
        yield from _check_attempts(conn, keys, effect)


def _check_attempts(conn: Connection, keys: CheckpointKeys,
                    effect: Effect) -> Iterator[Problem]:
    for problem in attempt_problems_txn(conn, keys, effect):
        yield Problem(effect.run_id, effect.seq, "effect", problem)


def _check_used(conn: Connection, run: sa.RowMapping,
                rows: Sequence[Mapping[str, Any]]) -> Iterator[Problem]:
    """What the run's committed steps used, as their MAC'd checkpoints name it, is still
    there as named: each effect with the status it had, each of the run's own recorded
    answers for the same request (an evidence replay's answers are its source's)."""
    own_evidence = run["mode"] != "evidence"
    for row in rows:
        refs = row["refs"] or {}
        for ref in refs.get("effects", []):
            status = conn.execute(sa.select(effects.c.status).where(
                effects.c.effect_type == ref["effect_type"],
                effects.c.effect_id == ref["effect_id"])).scalar()
            if status != ref["status"]:
                yield Problem(run["id"], row["seq"], "effect",
                              f"the step that made checkpoint {row['seq']} used effect "
                              f"{ref['effect_type']} {str(ref['effect_id'])[:16]}… "
                              f"({ref['status']}); it is now "
                              f"{status or 'missing'} (edited or deleted outside onward)")
        for ref in refs.get("evidence", []) if own_evidence else []:
            found = conn.execute(sa.select(evidence.c.request_hash).where(
                evidence.c.run_id == run["id"],
                evidence.c.command_id == ref["command_id"])).scalar()
            if found != ref["request_hash"]:
                yield Problem(run["id"], row["seq"], "evidence",
                              f"the step that made checkpoint {row['seq']} used recorded "
                              f"answer {ref['command_id']}; it is "
                              f"{'missing' if found is None else 'for another request'} "
                              "(deleted or edited outside onward)")


def _check_audit_rows(conn: Connection, keys: CheckpointKeys,
                      run_id: UUID) -> Iterator[Problem]:
    """The run's own audit rows match their MACs (the chain is checked per tenant)."""
    rows = conn.execute(sa.select(audit).where(
        sa.or_(audit.c.run_id == run_id, audit.c.new_run_id == run_id)).order_by(audit.c.id)
    ).mappings()
    for row in rows:
        try:
            keys.check(signed.audit_row(row), row["mac"], f"audit row {row['id']}")
        except IntegrityViolation as exc:
            yield Problem(run_id, None, "audit", str(exc))


def _check_approvals(conn: Connection, keys: CheckpointKeys, run_id: UUID,
                     rows: Sequence[Mapping[str, Any]]) -> Iterator[Problem]:
    """Each approval is the one its checkpoint's signed control names, for the artifact it
    shows; a decision taken on it (approved, rejected) matches its MAC."""
    controls = {row["seq"]: (row["control"] or {}) for row in rows}
    found = conn.execute(sa.select(approvals).where(approvals.c.run_id == run_id)
                         .order_by(approvals.c.seq)).mappings()
    for approval in found:
        problem = _approval_problem(keys, approval, controls.get(approval["seq"], {}))
        if problem is not None:
            yield Problem(run_id, approval["seq"], "approval",
                          f"approval {approval['id']}: {problem}")


def _approval_problem(keys: CheckpointKeys, approval: sa.RowMapping,
                      control: dict[str, Any]) -> str | None:
    if str(control.get("approval_id")) != str(approval["id"]):
        return "no checkpoint asks for it (inserted outside onward?)"
    if approval["artifact_hash"] != control.get("artifact_hash"):
        return (f"it is for artifact {approval['artifact_hash'][:12]}…, its checkpoint asked "
                f"about {str(control.get('artifact_hash'))[:12]}…")
    try:  # a sealed artifact is checked against its hash where it is opened (no data key)
        shown = (approval["artifact_hash"] if is_sealed(approval["artifact"])
                 else sha256_hex(canonical_json(approval["artifact"])))
    except InvalidInput as exc:
        return f"its artifact is not plain JSON: {exc}"
    if shown != approval["artifact_hash"] and approval["artifact"] != DROPPED:
        return "its artifact does not match its hash (edited outside onward)"
    try:
        check_terms(keys, approval)
    except IntegrityViolation as exc:
        return str(exc)
    if approval["status"] in (ApprovalStatus.APPROVED.value, ApprovalStatus.REJECTED.value):
        try:
            keys.check(signed.approval_decision(approval), approval["decision_mac"],
                       f"its decision ({approval['status']} by {approval['decided_by']})")
        except IntegrityViolation as exc:
            return str(exc)
    return None


def _check_signals(conn: Connection, keys: CheckpointKeys, run_id: UUID,
                   checkpoints: Sequence[Mapping[str, Any]]) -> Iterator[Problem]:
    """Each signal sent to the run is as it was sent (run, name, payload), and each one its
    checkpoints record as consumed (ledger/signal_order.py) is still consumed, before the
    first checkpoint that records it: not made consumable again, nor consumed a second time."""
    found = {row["id"]: row for row in conn.execute(
        sa.select(signals).where(signals.c.run_id == run_id).order_by(signals.c.id)).mappings()}
    for row in found.values():
        try:
            check_signal(keys, row)
        except IntegrityViolation as exc:
            yield Problem(run_id, row["consumed_seq"], "signal", str(exc))
    for seq, name, signal_id in _marked_signals(run_id, checkpoints):
        marked = found.get(signal_id)
        consumed = marked["consumed_seq"] if marked is not None else None
        if marked is None or marked["name"] != name or consumed is None or consumed >= seq:
            state = ("is missing" if marked is None else "is not consumed" if consumed is None
                     else f"is recorded consumed at seq {consumed}")
            yield Problem(run_id, seq, "signal",
                          f"checkpoint {seq} records signal {signal_id} ({name!r}) consumed "
                          f"before it, but that signal {state} (edited outside onward)")


def _check_refusals(conn: Connection, keys: CheckpointKeys, run_id: UUID) -> Iterator[Problem]:
    """Each answer the ledger refused to record is as the debit that recorded it signed it."""
    found = conn.execute(sa.select(refused_answers).where(refused_answers.c.run_id == run_id)
                         .order_by(refused_answers.c.id)).mappings()
    for row in found:
        try:
            keys.check(signed.refused_answer(run_id, row), row["mac"],
                       f"the refusal of the answer to {row['command_id']}")
        except IntegrityViolation as exc:
            yield Problem(run_id, row["seq"], "refusal", str(exc))


def _marked_signals(run_id: UUID, checkpoints: Sequence[Mapping[str, Any]]
                    ) -> Iterator[tuple[int, str, int]]:
    """Each (seq, name, id) of a signal the run's checkpoints record as consumed, at the
    first checkpoint that records it."""
    seen: set[tuple[str, int]] = set()
    for row in checkpoints:
        for name, signal_id in carried_marks(row["refs"], run_id).items():
            if (name, signal_id) not in seen:
                seen.add((name, signal_id))
                yield row["seq"], name, signal_id


def _check_result(keys: CheckpointKeys, run: sa.RowMapping) -> Iterator[Problem]:
    problem = result_problem(keys, run)
    if problem is not None:
        yield Problem(run["id"], run["seq"], "result", problem)


def result_problem(keys: CheckpointKeys, run: Any) -> str | None:
    """Why a run's recorded result (``runs.result``) cannot be trusted, or None: it must
    match its MAC (bound to the run and the seq it finished at); a MAC with no result means
    the result was removed."""
    if run["result"] is None and run["result_mac"] is None:
        return None
    if compacted.digest_of(run["result"]) is not None and compacted.is_sealed(
            keys, "run_result", compacted.result_identity(run), run["result"]):
        return None  # retention dropped it, sealed when it verified
    try:
        keys.check(signed.result(run["id"], run["seq"], run["result"]), run["result_mac"],
                   f"the run's result (seq {run['seq']})")
    except IntegrityViolation as exc:
        return str(exc)
    return None


def run_ids_txn(conn: Connection, *, after: UUID | None = None, limit: int = 500,
                tenant_id: str | None = None) -> list[UUID]:
    query = sa.select(runs.c.id).order_by(runs.c.id).limit(limit)
    if tenant_id is not None:
        query = query.where(runs.c.tenant_id == tenant_id)
    if after is not None:
        query = query.where(runs.c.id > after)
    return [row[0] for row in conn.execute(query)]
