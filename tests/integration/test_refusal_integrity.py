"""A refused answer is signed (issue 11 follow-up, migration 0042): a retried step that
finds a standing refusal fails without calling the model again only if the refusal is as
the debit that recorded it signed it. An edited refusal, or one inserted in the database
(which would fail a step whose call was never refused), parks the run integrity instead,
and verify names it. Each test edits the database directly, as an attacker with write
access but no key would. Real PostgreSQL; steps run in this process (tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import Ledger, RunStatus
from tasks import faults
from tests.integration.test_bad_input import _refusals, drv, limited  # noqa: F401
from tests.support import reads
from tests.support.driver import Driver
from tests.workflows_inputs import MODEL


def refusal_problems(ledger: Ledger, run_id: object) -> list[str]:
    return [p.detail for p in ledger.verify_run(run_id) if p.kind == "refusal"]


def test_an_edited_refusal_parks_the_retried_step(limited: Ledger, drv: Driver,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """Invariant: the retried step acts on a refusal only as it was signed: its reason
    edited after the attempt that recorded it died parks the run integrity, the model is
    not called again, and verify names the refusal. Failed before: the run failed
    invalid_answer with the edited reason as its error."""
    monkeypatch.setenv("ONWARD_FAULTS", "after_answer_refused:raise:once")
    monkeypatch.setenv("ONWARD_FAULTS_DIR", str(tmp_path))
    faults.arm_from_env()
    before = MODEL.paid
    try:
        run_id = limited.start_run("test_bad_input", {"kind": "nul_answer"})
        drv.step(run_id, 0)
    finally:
        monkeypatch.delenv("ONWARD_FAULTS")
        faults.arm_from_env()
    assert limited.get_run(run_id).status is RunStatus.RUNNING
    assert refusal_problems(limited, run_id) == []
    assert reads.execute(limited.engine, "UPDATE onward.refused_answers SET reason = "
                         "'the provider is down' WHERE run_id = :r", r=run_id) == 1
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    assert MODEL.paid - before == 1
    assert refusal_problems(limited, run_id) != []


def test_a_refusal_inserted_in_the_database_does_not_fail_the_step(
        limited: Ledger, drv: Driver) -> None:  # noqa: F811
    """Invariant: a refusal copied to another run (the same call, seq and step) is not taken
    for that run's own: the step parks integrity instead of failing invalid_answer without
    calling. Failed before: the second run failed invalid_answer, its model never asked."""
    first = limited.start_run("test_bad_input", {"kind": "nul_answer"})
    assert drv.drive(first).status is RunStatus.FAILED
    second = limited.start_run("test_bad_input", {"kind": "nul_answer"})
    assert reads.execute(limited.engine, """
        INSERT INTO onward.refused_answers (run_id, seq, command_id, kind, source, request_hash,
               answer_sha256, answer_bytes, reason, input_tokens, output_tokens, cost_usd,
               lease_epoch, mac)
        SELECT :second, seq, command_id, kind, source, request_hash, answer_sha256,
               answer_bytes, reason, input_tokens, output_tokens, cost_usd, lease_epoch, mac
          FROM onward.refused_answers WHERE run_id = :first""", first=first,
                         second=second) == 1
    MODEL.fixed = True
    try:
        run = drv.drive(second)
    finally:
        MODEL.fixed = False
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity"), run
    assert len(refusal_problems(limited, second)) == 1
    assert refusal_problems(limited, first) == []
    assert len(_refusals(limited, first)) == 1
