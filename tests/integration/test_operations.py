"""Operator commands against a real PostgreSQL, with steps executed in the test process
(tests/support/driver.py): replay in each mode, branch, continue, cancel, approvals,
repeat, roles and the audit log. What the outside world saw is counted by the local tool's
call log and the fake model's call log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.exceptions import ApprovalRefused, InvalidInput, OperationRefused, PermissionDenied
from ledger.steps import StepStore
from ledger.vocabulary import ApprovalStatus, EffectAttemptKind, EffectStatus, LaunchMode, Role
from tasks.operator import plan_repeat, repeat_effect, state_check
from tests.support.driver import Driver, driver
from tests.workflows_ops import calls

MODULES = ["tests.workflows_ops"]


@pytest.fixture()
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    paths = {"tool": tmp_path / "tool.log", "llm": tmp_path / "llm.log"}
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(paths["tool"]))
    monkeypatch.setenv("ONWARD_FAKE_LLM_LOG", str(paths["llm"]))
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    return paths


@pytest.fixture()
def ledger_ops(ledger: Ledger) -> Ledger:
    """The test ledger, with the operator tools' workflow modules configured."""
    return Ledger(ledger.engine, ledger.settings.model_copy(update={"workflows": MODULES}))


@pytest.fixture()
def ops(ledger_ops: Ledger) -> Ledger:
    return ledger_ops.acting_as("olga", Role.OPERATOR)


@pytest.fixture()
def drv(ops: Ledger, logs: dict[str, Path]) -> Iterator[Driver]:
    with driver(ops, MODULES) as running:
        yield running


def outside(logs: dict[str, Path]) -> tuple[int, int]:
    """(tool calls, model calls) the outside world received."""
    return len(calls(logs["tool"])), len(calls(logs["llm"]))


def finished_note(drv: Driver, **state: object) -> UUID:
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "pricing", **state})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


def audit_actions(ledger: Ledger, run_id: UUID) -> list[tuple[str, str]]:
    return [(a.action, a.outcome) for a in reversed(ledger.audit(run_id=run_id))]


def test_replay_evidence__same_final_state_and_nothing_called(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: an evidence replay from checkpoint 0 calls no model and no tool, answers
    every call from the parent's records, and ends in the parent's final state."""
    parent = finished_note(drv)
    seen = outside(logs)
    assert seen == (2, 1)
    launched = ops.replay(parent, 0, "evidence", "audit the run")
    replay = drv.drive(launched.run_id)
    assert replay.status is RunStatus.COMPLETED
    assert outside(logs) == seen
    assert replay.result == ops.get_run(parent).result
    assert ops.checkpoints(launched.run_id)[-1].state == ops.checkpoints(parent)[-1].state
    assert (replay.parent_run_id, replay.parent_seq, replay.mode, replay.launch_reason) == (
        parent, 0, "evidence", "audit the run")
    first = ops.checkpoints(launched.run_id)[0]
    assert (first.identity.seq, first.position.outcome, first.identity.parent_hash) == (
        0, "fork", None)
    assert ops.verify_run(launched.run_id) == []
    assert ops.effects(launched.run_id) == []
    # its checkpoints bind the parent's effects and evidence that answered it
    assert ([c.side_effects for c in ops.checkpoints(launched.run_id)[1:]]
            == [c.side_effects for c in ops.checkpoints(parent)[1:]])
    assert {e.effect_id for e in ops.effects(parent)} == {
        r.effect_id for c in ops.checkpoints(launched.run_id) for r in c.side_effects}
    assert ([c.evidence for c in ops.checkpoints(launched.run_id)[1:]]
            == [c.evidence for c in ops.checkpoints(parent)[1:]])
    assert replay.used_tokens == 0
    assert audit_actions(ops, parent) == [("replay", "done")]


def test_replay_evidence__from_a_middle_checkpoint(drv: Driver, ops: Ledger,
                                                   logs: dict[str, Path]) -> None:
    """Invariant: a replay from checkpoint k starts at seq k with the parent's state there."""
    parent = finished_note(drv)
    seen = outside(logs)
    launched = ops.replay(parent, 2, LaunchMode.EVIDENCE, "from before the publish")
    assert [c.identity.seq for c in ops.checkpoints(launched.run_id)] == [2]
    assert drv.drive(launched.run_id).status is RunStatus.COMPLETED
    assert [c.identity.seq for c in ops.checkpoints(launched.run_id)] == [2, 3]
    assert outside(logs) == seen


def test_replay_evidence__changed_request_diverges_with_report(
        drv: Driver, ops: Ledger, logs: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: when the code now asks the model something else, the replay stops as
    diverged, naming the step, seq and command id, and calls nothing."""
    parent = finished_note(drv)
    seen = outside(logs)
    monkeypatch.setenv("ONWARD_TEST_OPS_VARIANT", "reworded")
    replay = drv.drive(ops.replay(parent, 0, "evidence", "new prompt").run_id)
    assert replay.status is RunStatus.DIVERGED
    report = replay.last_error
    assert report["where"] == {"step": "summarize", "seq": 0, "command_id": "summarize@0#1"}
    assert (report["kind"], report["why"]) == ("llm", "request_differs")
    assert report["parent_run_id"] == str(parent)
    assert outside(logs) == seen


def test_replay_evidence__call_without_record_diverges(
        drv: Driver, ops: Ledger, logs: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a call the parent never made is a divergence, not an improvised call."""
    parent = finished_note(drv)
    seen = outside(logs)
    monkeypatch.setenv("ONWARD_TEST_OPS_VARIANT", "extra")
    replay = drv.drive(ops.replay(parent, 0, "evidence", "extra check").run_id)
    assert replay.status is RunStatus.DIVERGED
    assert replay.last_error["where"] == {"step": "review", "seq": 1,
                                          "command_id": "review@1#1"}
    assert replay.last_error["why"] == "no_record"
    assert outside(logs) == seen


def test_replay_live__irreversible_refused_unless_allowed(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: a live replay calls for real, but an irreversible effect is refused (the
    run fails with irreversible_blocked, nothing sent) unless allow_irreversible was given."""
    parent = finished_note(drv)
    blocked = drv.drive(ops.replay(parent, 0, "live", "try live").run_id)
    assert blocked.status is RunStatus.FAILED
    assert blocked.last_error["reason"] == "irreversible_blocked"
    assert [c.split("\t")[0] for c in calls(logs["tool"])] == ["log", "real", "log"]
    allowed = drv.drive(ops.replay(parent, 0, "live", "send it again",
                                   allow_irreversible=True).run_id)
    assert allowed.status is RunStatus.COMPLETED
    kinds = [c.split("\t")[0] for c in calls(logs["tool"])]
    assert kinds.count("real") == 2
    assert allowed.result["post_id"] != ops.get_run(parent).result["post_id"]


def test_replay_simulation__sandbox_only(drv: Driver, ops: Ledger,
                                         logs: dict[str, Path]) -> None:
    """Invariant: a simulation runs tools' sandboxes and records them as completed effects;
    a tool without a sandbox stops it (no_simulation) before anything is sent."""
    parent = finished_note(drv)
    sim = drv.drive(ops.replay(parent, 2, "simulation", "dry run of the publish").run_id)
    assert sim.status is RunStatus.COMPLETED
    assert calls(logs["tool"])[-1].startswith("sandbox\t")
    [effect] = ops.effects(sim.id)
    assert effect.status is EffectStatus.COMPLETED
    assert effect.provider_ref is not None and effect.provider_ref.startswith("sandbox_")
    early = drv.drive(ops.replay(parent, 0, "simulation", "whole run").run_id)
    assert early.status is RunStatus.FAILED
    assert early.last_error["reason"] == "no_simulation"
    assert [c.split("\t")[0] for c in calls(logs["tool"])].count("real") == 1


def test_replay__approvals(drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: an evidence replay follows the parent's recorded decision (no new
    approval); a live replay from the waiting checkpoint asks anew, for the same artifact,
    and never touches the parent's approval."""
    parent = ops.start_run("test_ops_notes", {"approve": True})
    assert drv.drive(parent).status is RunStatus.WAITING
    [asked] = ops.approvals(run_id=parent)
    ops.approve(asked.id, artifact_hash=asked.artifact_hash, comment="fine")
    assert drv.drive(parent).status is RunStatus.COMPLETED
    wait_seq = asked.seq
    evidence_run = drv.drive(ops.replay(parent, 0, "evidence", "check decisions").run_id)
    assert evidence_run.status is RunStatus.COMPLETED
    assert ops.approvals(run_id=evidence_run.id) == []
    from_wait = drv.drive(ops.replay(parent, wait_seq, "evidence", "after the wait").run_id)
    assert from_wait.status is RunStatus.COMPLETED
    live = ops.replay(parent, wait_seq, "live", "ask again", allow_irreversible=True)
    assert live.status is RunStatus.WAITING
    [again] = ops.approvals(run_id=live.run_id)
    assert again.id != asked.id and again.artifact_hash == asked.artifact_hash
    assert again.status is ApprovalStatus.PENDING
    assert ops.get_approval(asked.id).status is ApprovalStatus.APPROVED


def test_branch__reason_patch_diff_and_parent_untouched(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: a branch needs a reason; it stores its patch, starts from the patched state
    and calls live; the parent's checkpoints, effects, approvals and outbox do not change."""
    parent = finished_note(drv)
    patch = [{"op": "replace", "path": "/channel", "value": "sports"}]
    before = parent_rows(ops, parent)
    with pytest.raises(InvalidInput, match="needs a reason"):
        ops.branch(parent, 2, patch, "")
    diff = ops.preview_branch(parent, 2, patch)
    assert [(c.op, c.path, c.before, c.after) for c in diff] == [
        ("replace", "/channel", "news", "sports")]
    launched = ops.branch(parent, 2, patch, "wrong channel", allow_irreversible=True)
    branch = drv.drive(launched.run_id)
    assert branch.status is RunStatus.COMPLETED
    assert (branch.mode, branch.branch_patch) == ("branch", patch)
    assert "'channel': 'sports'" in calls(logs["tool"])[-1]
    assert parent_rows(ops, parent) == before
    assert audit_actions(ops, parent) == [("branch", "refused"), ("branch", "done")]
    [done] = [a for a in ops.audit(run_id=parent) if a.outcome == "done"]
    assert done.details["diff"][0]["after"] == "sports"


def test_branch__invalid_state_refused_or_parked_never_run(
        drv: Driver, ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: a patched state the workflow's model rejects is refused up front when the
    model is known here, and otherwise parked by the worker before the step runs."""
    parent = finished_note(drv)
    seen = outside(logs)
    patch = [{"op": "replace", "path": "/topic", "value": 123}]
    with pytest.raises(InvalidInput, match="not a valid Note"):
        ops.branch(parent, 0, patch, "bad edit", check_state=state_check(MODULES))
    parked = drv.drive(ops.branch(parent, 0, patch, "bad edit").run_id)
    assert parked.status is RunStatus.NEEDS_REVIEW
    assert parked.parked_reason == "invalid_state"
    assert outside(logs) == seen
    with pytest.raises(InvalidInput, match="does not apply"):
        ops.branch(parent, 0, [{"op": "remove", "path": "/nope"}], "bad path")


def parent_rows(ledger: Ledger, run_id: UUID) -> dict[str, object]:
    with ledger.engine.connect() as conn:
        counts = {table: conn.execute(sa.text(
            f"SELECT count(*) FROM onward.{table} WHERE run_id = :id"), {"id": run_id}).scalar()
            for table in ("checkpoints", "effects", "approvals", "outbox", "evidence")}
    run = ledger.get_run(run_id)
    return {**counts, "status": run.status, "seq": run.seq, "updated_at": run.updated_at}


def test_continue__refusals(drv: Driver, ops: Ledger) -> None:
    """Invariant: continue refuses finished runs, replays and waits, and says what to do."""
    parent = finished_note(drv)
    with pytest.raises(OperationRefused, match="completed"):
        ops.continue_run(parent, "again")
    replay = ops.replay(parent, 0, "evidence", "look").run_id
    with pytest.raises(OperationRefused, match="is an evidence replay of"):
        ops.continue_run(replay, "go on")
    waiting = ops.start_run("test_ops_notes", {"approve": True})
    assert drv.drive(waiting).status is RunStatus.WAITING
    with pytest.raises(OperationRefused, match="approvals approve"):
        ops.continue_run(waiting, "skip the approval")
    assert audit_actions(ops, parent)[0] == ("continue", "refused")


def test_continue__failed_by_an_error_resumes_at_its_seq(
        drv: Driver, ops: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a run failed by a bug continues at the same seq after the fix, with its
    attempts reset, and finishes; its history keeps the failed attempt."""
    monkeypatch.setenv("ONWARD_TEST_OPS_BROKEN", "1")
    run_id = ops.start_run("test_ops_fragile", {})
    assert drv.drive(run_id).status is RunStatus.FAILED
    monkeypatch.delenv("ONWARD_TEST_OPS_BROKEN")
    continued = ops.continue_run(run_id, "template fixed in deploy 42")
    assert (continued.seq, continued.previous_status) == (0, RunStatus.FAILED)
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    assert [e.outcome for e in ops.timeline(run_id)] == ["failed", "committed"]
    [entry] = ops.audit(run_id=run_id)
    assert (entry.action, entry.before_seq, entry.after_seq, entry.reason) == (
        "continue", 0, 0, "template fixed in deploy 42")


def test_cancel__waiting_run_and_its_approval(drv: Driver, ops: Ledger) -> None:
    """Invariant: cancelling a waiting run ends it at once; its approval can no longer be
    decided."""
    run_id = ops.start_run("test_ops_notes", {"approve": True})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [asked] = ops.approvals(run_id=run_id)
    cancelled = ops.cancel(run_id, "customer withdrew")
    assert cancelled.approvals_invalidated == [asked.id]
    assert ops.get_run(run_id).status is RunStatus.CANCELLED
    with pytest.raises(ApprovalRefused):
        ops.approve(asked.id, artifact_hash=asked.artifact_hash)
    with pytest.raises(OperationRefused, match="already cancelled"):
        ops.cancel(run_id, "twice")


def test_cancel__a_step_in_flight_cannot_commit_and_its_worker_ends_the_run(
        ops: Ledger) -> None:
    """Invariant: cancelling a run a worker holds records a request: the holder's commit is
    refused (CancelRequested), and the holder then ends the run ``cancelled`` at its seq, with
    no checkpoint written and its attempt ``cancelled``."""
    from ledger import OutcomeKind
    from ledger.exceptions import CancelRequested
    from ledger.steps import Advance, Claim, Ended

    run_id = ops.start_run("test_ops_notes", {})
    store = StepStore(ops.url, ops.keys, lease_ttl_s=30)
    try:
        claim = store.claim(run_id, 0, "slow:1")
        assert isinstance(claim, Claim)
        cancelled = ops.cancel(run_id, "stop it")
        assert (cancelled.was_leased_by, cancelled.requested) == ("slow:1", True)
        assert ops.get_run(run_id).status is RunStatus.RUNNING
        advance = Advance(step="summarize", outcome=OutcomeKind.GOTO, next_step="review",
                          state={"topic": "pricing"}, workflow_version=1, next_max_attempts=3)
        with pytest.raises(CancelRequested):
            store.commit(claim, advance)
        assert store.end_cancelled(claim, "summarize") is Ended.ENDED
    finally:
        store.close()
    run = ops.get_run(run_id)
    assert (run.status, run.seq) == (RunStatus.CANCELLED, 0)
    assert run.last_error["by"] == "olga"
    assert [c.identity.seq for c in ops.checkpoints(run_id)] == [0]
    assert [e.outcome for e in ops.timeline(run_id)] == ["cancelled"]


def test_roles__each_command_needs_its_role_and_refusals_are_audited(
        drv: Driver, ledger_ops: Ledger) -> None:
    """Invariant: a viewer can change nothing, an operator cannot repeat an effect; each
    refusal names the role needed and leaves one audit row."""
    ledger = ledger_ops
    ops = ledger.acting_as("olga", "operator")
    parent = finished_note(drv)
    viewer = ledger.acting_as("vic", "viewer")
    with pytest.raises(PermissionDenied, match="needs the operator role"):
        viewer.replay(parent, 0, "evidence", "look")
    with pytest.raises(PermissionDenied, match="needs the operator role"):
        viewer.cancel(parent, "stop")
    effect = ops.effects(parent)[-1]
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        repeat_effect(ops, plan_repeat(ops, effect), "resend")
    refused = [(a.actor, a.role, a.action, a.outcome) for a in reversed(ledger.audit())
               if a.outcome == "refused"][-3:]
    assert refused == [("vic", "viewer", "replay", "refused"),
                       ("vic", "viewer", "cancel", "refused"),
                       ("olga", "operator", "repeat_effect", "refused")]


def test_repeat_effect__new_key_one_new_call_linked_attempt(
        drv: Driver, ledger_ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: a repeat is one new call with its own recorded key, linked to the original
    effect as a 'repeat' attempt, and one audit row."""
    ops = ledger_ops.acting_as("ada", "admin")
    parent = finished_note(drv)
    effect = next(e for e in ops.effects(parent) if e.effect_type == "test.publish")
    plan = plan_repeat(ops, effect)
    assert plan.dedup == "lookup"
    assert plan.as_dict()["recipient"] == "news"
    before = len(calls(logs["tool"]))
    done = repeat_effect(ops, plan, "the customer lost the post")
    assert done.outcome == "completed"
    assert len(calls(logs["tool"])) == before + 1
    attempts = ops.effect_attempts(effect)
    assert [a.kind for a in attempts] == [EffectAttemptKind.CALL.value,
                                          EffectAttemptKind.REPEAT.value]
    assert attempts[-1].idempotency_key == done.started.idempotency_key != effect.effect_id
    assert done.started.idempotency_key in calls(logs["tool"])[-1]
    [entry] = [a for a in ops.audit(action="repeat_effect") if a.effect_id == effect.effect_id]
    assert (entry.effect_id, entry.actor, entry.outcome) == (effect.effect_id, "ada", "done")


def test_repeat_effect__of_a_simulation_only_calls_the_sandbox(
        drv: Driver, ledger_ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: ``effects repeat`` on an effect of a simulation run never reaches the real
    provider: the plan shows the run's mode and that it sends to the sandbox, and the
    repeat calls the tool's ``simulate``; a real call count stays unchanged."""
    ops = ledger_ops.acting_as("ada", "admin")
    parent = finished_note(drv)
    sim = drv.drive(ops.replay(parent, 2, "simulation", "dry run").run_id)
    assert sim.status is RunStatus.COMPLETED
    effect = next(e for e in ops.effects(sim.id) if e.effect_type == "test.publish")
    plan = plan_repeat(ops, effect)
    assert (plan.as_dict()["run_mode"], plan.as_dict()["sends_to"]) == ("simulation", "sandbox")
    real_before = [c for c in calls(logs["tool"]) if c.startswith("real")]
    done = repeat_effect(ops, plan, "the sandbox lost it")
    assert done.outcome == "completed"
    assert [c for c in calls(logs["tool"]) if c.startswith("real")] == real_before
    assert calls(logs["tool"])[-1].startswith("sandbox")
    forged = {**plan.as_dict(), "sends_to": "provider"}  # the ledger checks it as well
    with pytest.raises(OperationRefused, match="simulation"):
        ops.begin_repeat(effect.effect_type, effect.effect_id, "forged", {
            **forged, "attempts": ops.effects(sim.id)[-1].attempts})


def test_repeat_effect__two_admins_confirming_one_plan_make_one_repeat(
        drv: Driver, ledger_ops: Ledger, logs: dict[str, Path]) -> None:
    """Invariant: a confirmation carries the attempt count its plan showed; when two admins
    confirm the same plan, the ledger refuses the second (the effect changed since), so the
    provider receives one repeat, not two."""
    ada = ledger_ops.acting_as("ada", "admin")
    bob = ledger_ops.acting_as("bob", "admin")
    parent = finished_note(drv)
    effect = next(e for e in ada.effects(parent) if e.effect_type == "test.publish")
    shown_to_ada, shown_to_bob = plan_repeat(ada, effect), plan_repeat(bob, effect)
    before = len(calls(logs["tool"]))
    assert repeat_effect(ada, shown_to_ada, "customer lost it").outcome == "completed"
    with pytest.raises(OperationRefused, match="changed since the plan"):
        repeat_effect(bob, shown_to_bob, "customer lost it")
    assert len(calls(logs["tool"])) == before + 1
    kinds = [a.kind for a in ada.effect_attempts(effect)]
    assert kinds.count(EffectAttemptKind.REPEAT.value) == 1
    refused = [(a.actor, a.outcome) for a in reversed(ada.audit(action="repeat_effect"))
               if a.effect_id == effect.effect_id]
    assert refused == [("ada", "done"), ("bob", "refused")]


def test_continue__refuses_to_cut_a_durable_timer_short(ops: Ledger) -> None:
    """Invariant: a run sleeping on a durable timer is not 'continued' early: it goes on by
    itself when the timer is due."""
    with driver(ops, ["tests.workflows_waits"]) as sleepy:
        run_id = ops.start_run("test_timer", {"seconds": 600})
        sleepy.step(run_id, 0)
    run = ops.get_run(run_id)
    assert (run.status, run.seq) == (RunStatus.RUNNING, 1)
    with pytest.raises(OperationRefused, match="sleeps until"):
        ops.continue_run(run_id, "hurry up")


def test_replay__signal_wait_keeps_its_timeout(ops: Ledger) -> None:
    """Invariant: a live replay from a checkpoint that waits for a signal with a timeout
    waits with the same timeout, counted from the replay's start, so the reaper times it out
    as it would the parent; a signal wait without a timeout stays without one."""
    with driver(ops, ["tests.workflows_waits"]) as waits:
        timed = ops.start_run("test_signal", {"timeout_s": 600})
        untimed = ops.start_run("test_signal", {})
        waits.step(timed, 0)
        waits.step(untimed, 0)
    parent = ops.get_run(timed)
    assert parent.status is RunStatus.WAITING

    replay = ops.replay(timed, 1, "live", "wait again")
    plain = ops.replay(untimed, 1, "live", "wait again")

    assert replay.status is RunStatus.WAITING
    with ops.engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.text(
            "SELECT id, waiting_on, wait_until, now() AS now FROM onward.runs "
            "WHERE id = ANY(:ids)"), {"ids": [replay.run_id, plain.run_id]})}
    left = (rows[replay.run_id].wait_until - rows[replay.run_id].now).total_seconds()
    assert 590 < left <= 600
    assert rows[replay.run_id].waiting_on == "signal:go"
    assert rows[plain.run_id].wait_until is None
    assert ops.verify_run(replay.run_id) == []
