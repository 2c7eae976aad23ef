"""Restore validates before it runs (docs/design.md section 7): a checkpoint edited in SQL parks
the run for review and the step never runs. execute_step is called directly, in this
process, against the real ledger, so the test can count the step's executions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from ledger import Ledger
from ledger.steps import StepStore
from tasks import ExecutorConfig, Registry, StepContext, StepMessage, Workflow, execute_step
from tasks.executor import ReportKind
from tests.support import reads
from workers.settings import WorkerSettings


class Tally(BaseModel):
    n: int = 0
    notes: str = "a state larger than its deltas, so they are stored as deltas " * 2


calls: list[tuple[UUID, int]] = []
probe = Workflow("integrity_probe", version=1, state=Tally)


@probe.step(start=True)
def count(ctx: StepContext, state: Tally) -> Any:
    calls.append((ctx.run_id, ctx.seq))
    if state.n >= 3:
        return ctx.finish(n=state.n)
    return ctx.goto(count, n=state.n + 1)


class Harness:
    """One in-process executor: what a worker child does for one message."""

    def __init__(self, ledger: Ledger, settings: WorkerSettings) -> None:
        self.store = StepStore(ledger.url, ledger.keys, lease_ttl_s=settings.lease_ttl_s)
        self.registry = Registry()
        self.registry.register(probe)
        self.config = ExecutorConfig(keys=ledger.keys, max_state_bytes=settings.max_state_bytes,
                                     retry_base_s=0.0, retry_max_s=0.0)
        self.published: list[tuple[UUID, int]] = []

    def deliver(self, run_id: UUID, seq: int) -> Any:
        return execute_step(self.store, self.registry, self.config,
                            StepMessage(run_id=run_id, seq=seq), worker="test:0",
                            publish=lambda r, s, q: self.published.append((r, s)))


@pytest.fixture()
def harness(ledger: Ledger, settings: WorkerSettings) -> Iterator[Harness]:
    calls.clear()
    running = Harness(ledger, settings)
    yield running
    running.store.close()


TAMPERING = {
    # a snapshot's state, or a delta's patch made to set n (ledger/states.py)
    "state": "UPDATE onward.checkpoints SET state = jsonb_set(state, '{n}', '100'), "
             "state_delta = state_delta || '[{\"op\": \"replace\", \"path\": \"/n\", "
             "\"value\": 100}]' WHERE run_id = :run AND seq = :seq",
    # a delta's patch replaced by one that rebuilds another valid state
    "state_delta": "UPDATE onward.checkpoints SET state_delta = '[{\"op\": \"replace\", "
                   "\"path\": \"/n\", \"value\": 7}]' WHERE run_id = :run AND seq = :seq "
                   "AND state_delta IS NOT NULL",
    "next_step": "UPDATE onward.checkpoints SET next_step = 'count_other' "
                 "WHERE run_id = :run AND seq = :seq",
    "parent_hash": "UPDATE onward.checkpoints SET parent_hash = repeat('0', 64) "
                   "WHERE run_id = :run AND seq = :seq",
}


def test_integrity__untouched_history_runs_to_completion(ledger: Ledger,
                                                         harness: Harness) -> None:
    """Control: without tampering the same harness runs all four steps once each."""
    run_id = ledger.start_run("integrity_probe", {})
    for seq in range(4):
        assert harness.deliver(run_id, seq).kind is ReportKind.COMMITTED
    assert calls == [(run_id, seq) for seq in range(4)]
    assert harness.published == [(run_id, seq) for seq in range(1, 4)]
    assert reads.run_row(ledger.engine, run_id)["status"] == "completed"


@pytest.mark.parametrize("field", ["state", "state_delta", "next_step", "parent_hash"])
def test_integrity__tampered_checkpoint_parks_the_run_and_never_runs_the_step(
        ledger: Ledger, harness: Harness, field: str) -> None:
    """After step 1 committed checkpoint 1, an UPDATE of that checkpoint's {field} in SQL
    (which cannot recompute the keyed MAC) makes the next delivery park the run as
    needs_review with parked_reason 'integrity': the step body runs 1 time in total, no
    checkpoint 2 and no message for seq 2 exist."""
    run_id = ledger.start_run("integrity_probe", Tally().model_dump())
    assert harness.deliver(run_id, 0).kind is ReportKind.COMMITTED
    assert reads.execute(ledger.engine, TAMPERING[field], run=run_id, seq=1) == 1

    report = harness.deliver(run_id, 1)

    assert report.kind is ReportKind.PARKED
    assert calls == [(run_id, 0)]
    assert harness.published == [(run_id, 1)]
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"], row["seq"]) == ("needs_review", "integrity", 1)
    assert row["last_error"]["type"] == "IntegrityViolation"
    assert "does not match its MAC" in row["last_error"]["message"]
    assert row["lease_owner"] is None
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1]
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == [
        "committed", "parked"]
    assert reads.outbox_rows(ledger.engine, run_id) == []

    before = reads.fingerprint(ledger.engine)
    assert harness.deliver(run_id, 1).kind is ReportKind.STALE  # parked: nothing runs
    assert calls == [(run_id, 0)]
    after = reads.fingerprint(ledger.engine)
    assert after.step_attempts == before.step_attempts
    assert after.checkpoints == before.checkpoints


def test_integrity__a_delta_that_does_not_apply_parks_the_run(
        ledger: Ledger, harness: Harness) -> None:
    """A delta edited into a patch that does not apply to its parent's state (or a row of
    its chain deleted) parks the run integrity, saying so; the step never runs."""
    run_id = ledger.start_run("integrity_probe", Tally().model_dump())
    assert harness.deliver(run_id, 0).kind is ReportKind.COMMITTED
    assert reads.execute(ledger.engine, "UPDATE onward.checkpoints SET state_delta = "
                         "'[{\"op\": \"remove\", \"path\": \"/nothing\"}]' WHERE run_id = :run "
                         "AND seq = 1 AND state_delta IS NOT NULL", run=run_id) == 1
    assert harness.deliver(run_id, 1).kind is ReportKind.PARKED
    assert calls == [(run_id, 0)]
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert "delta does not apply" in row["last_error"]["message"]
    assert [p.kind for p in ledger.verify_run(run_id)][:1] == ["delta"]


def test_integrity__tampered_input_is_refused_before_the_first_step(
        ledger: Ledger, harness: Harness) -> None:
    """Checkpoint 0 (the run's input) is MAC'd too: editing it before any step ran parks
    the run on its first delivery, and the start step never runs."""
    run_id = ledger.start_run("integrity_probe", {"n": 0})
    assert reads.execute(ledger.engine, TAMPERING["state"], run=run_id, seq=0) == 1
    assert harness.deliver(run_id, 0).kind is ReportKind.PARKED
    assert calls == []
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"], row["seq"]) == ("needs_review", "integrity", 0)
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]


def test_integrity__rewritten_head_is_refused(ledger: Ledger, harness: Harness) -> None:
    """Replacing the run's latest checkpoint with a validly MAC'd older one (rolling history
    back in SQL) is caught by the run's recorded head hash: parked, step not run."""
    run_id = ledger.start_run("integrity_probe", {})
    assert harness.deliver(run_id, 0).kind is ReportKind.COMMITTED
    assert harness.deliver(run_id, 1).kind is ReportKind.COMMITTED
    # Point the run's head back at checkpoint 1 while the run sits at seq 2.
    assert reads.execute(ledger.engine, """
        UPDATE onward.runs r SET head_hash = c.hash FROM onward.checkpoints c
         WHERE r.id = :run AND c.run_id = r.id AND c.seq = 1""", run=run_id) == 1
    assert harness.deliver(run_id, 2).kind is ReportKind.PARKED
    assert calls == [(run_id, 0), (run_id, 1)]
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"]) == ("needs_review", "integrity")
    assert "recorded head" in row["last_error"]["message"]


@pytest.mark.parametrize("edit", [
    # the chain's snapshot (seq 0) given another n, under a head that is a delta
    "UPDATE onward.checkpoints SET state = jsonb_set(state, '{n}', '100') "
    "WHERE run_id = :run AND seq = 0",
    # a delta in the middle of the chain edited so that the head's state is still the same
    # (the head's own delta sets n again): the history under the head was rewritten
    "UPDATE onward.checkpoints SET state_delta = '[{\"op\": \"replace\", \"path\": \"/n\", "
    "\"value\": 7}]' WHERE run_id = :run AND seq = 1 AND state_delta IS NOT NULL",
], ids=["snapshot", "mid_chain_delta"])
def test_integrity__an_edit_under_a_delta_head_parks_the_run(
        ledger: Ledger, harness: Harness, edit: str) -> None:
    """The head (seq 2) is a delta whose MAC signs its chain digest (envelope 3): an edit
    of the snapshot its chain starts from, or of a delta before it, that SQL makes without
    the key parks the run integrity at the next delivery, as an edit of the head does; the
    step never runs; verify reports it."""
    run_id = ledger.start_run("integrity_probe", Tally().model_dump())
    for seq in range(2):
        assert harness.deliver(run_id, seq).kind is ReportKind.COMMITTED
    kinds = reads.checkpoint_kinds(ledger.engine, run_id)
    assert (kinds[0], kinds[1], kinds[2]) == ("snapshot", "delta", "delta")
    assert reads.execute(ledger.engine, edit, run=run_id) == 1

    assert harness.deliver(run_id, 2).kind is ReportKind.PARKED
    assert calls == [(run_id, 0), (run_id, 1)]
    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["parked_reason"], row["seq"]) == ("needs_review", "integrity", 2)
    assert "checkpoint 2 does not match its MAC" in row["last_error"]["message"]
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2]
    assert {p.kind for p in ledger.verify_run(run_id)} == {"mac"}
