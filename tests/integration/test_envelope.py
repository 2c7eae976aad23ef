"""The checkpoint envelope (docs/design.md section 9): a validated, versioned record whose large
state is a referenced artifact, bound by sha256 under the checkpoint's MAC."""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import BaseModel

from ledger import Ledger
from ledger.checkpoints import ARTIFACT_KEY
from ledger.envelope import CheckpointEnvelope
from tasks import StepContext, Workflow
from tasks.executor import ReportKind
from tests.integration.test_integrity import Harness, harness  # noqa: F401 - fixture
from tests.support import reads


class Big(BaseModel):
    text: str = ""
    rounds: int = 0


big = Workflow("envelope_big_state", version=1, state=Big)


@big.step(start=True)
def grow(ctx: StepContext, state: Big) -> Any:
    if state.rounds >= 2:
        return ctx.finish(length=len(state.text))
    return ctx.goto(grow, text=state.text + "x" * 50_000, rounds=state.rounds + 1)


def test_envelope__large_state_is_an_artifact_bound_by_the_mac(
        ledger: Ledger, harness: Harness) -> None:  # noqa: F811
    """Invariant: a state over the inline limit is stored once as an artifact; the checkpoint
    keeps only its sha256 and size; restore reads it back, and an edited artifact is refused
    (parked, integrity) and named by verify."""
    harness.registry.register(big)
    run_id = ledger.start_run("envelope_big_state", {})
    for seq in range(3):
        assert harness.deliver(run_id, seq).kind is ReportKind.COMMITTED
    assert reads.run_row(ledger.engine, run_id)["result"] == {"length": 100_000}
    envelopes = ledger.checkpoints(run_id)
    # checkpoint 3 (the finish, same state) is a delta from 2: its state is not stored apart
    assert [e.inputs.state_bytes_inline for e in envelopes] == [True, True, False, True]
    ref = envelopes[2].inputs.state_artifact
    assert ref is not None and ref.size > 100_000
    assert envelopes[2].state == {ARTIFACT_KEY: {"sha256": ref.sha256, "size": ref.size}}
    assert ledger.verify_run(run_id) == []

    other = ledger.start_run("envelope_big_state", {})
    for seq in range(2):
        assert harness.deliver(other, seq).kind is ReportKind.COMMITTED
    target = ledger.checkpoints(other)[2].inputs.state_artifact
    assert target is not None
    reads.execute(ledger.engine,
                  "UPDATE onward.artifacts SET body = convert_to('{\"text\":\"\"}', 'UTF8') "
                  "WHERE sha256 = :sha", sha=target.sha256)
    assert harness.deliver(other, 2).kind is ReportKind.PARKED
    assert reads.run_row(ledger.engine, other)["parked_reason"] == "integrity"
    assert any(p.kind == "artifact" for p in ledger.verify_run(other))


def test_envelope__groups_validate_and_bind_what_the_step_used(
        ledger: Ledger, harness: Harness) -> None:  # noqa: F811
    """Invariant: every stored checkpoint validates as a CheckpointEnvelope of its schema
    version, with identity, position, compatibility and the budgets the step started with."""
    run_id = ledger.start_run("integrity_probe", {"n": 1})
    for seq in range(3):
        assert harness.deliver(run_id, seq).kind is ReportKind.COMMITTED
    envelopes = ledger.checkpoints(run_id)
    assert CheckpointEnvelope.SCHEMA_VERSION == 1
    assert [e.identity.seq for e in envelopes] == [0, 1, 2, 3]
    assert [e.position.outcome.value for e in envelopes] == ["start", "goto", "goto", "finish"]
    assert all(e.identity.parent_hash == p.identity.hash
               for p, e in itertools.pairwise(envelopes))
    assert envelopes[1].budgets_at_start.attempts == 1
    assert envelopes[3].budgets_at_start.attempts == 3
    assert envelopes[3].compatibility.workflow_version == 1
