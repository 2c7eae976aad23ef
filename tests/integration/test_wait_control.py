"""A checkpoint's wait control is read through ledger/wait_control.py: a run waiting on a
control in an old form still resumes, its stored control untouched, and one whose control
this code cannot read is parked for review, not guessed at. Real PostgreSQL; steps run in
this process through the real executor (tests/support/driver.py)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from ledger import Ledger, RunStatus, signed
from ledger.checkpoints import CheckpointBody
from tests.support.driver import Driver, driver_fixture

MODULES = ["tests.workflows_inputs"]


drv = driver_fixture(MODULES)


def _rewrite_head_control(ledger: Ledger, run_id: UUID, control: dict[str, Any]) -> None:
    """Store ``control`` on the run's head checkpoint and sign it as onward signs a commit
    (the checkpoint's MAC, the run's head hash and head MAC), as if an older (or other)
    onward had written it."""
    with ledger.engine.begin() as conn:
        run = conn.execute(sa.text("SELECT seq FROM onward.runs WHERE id = :r"),
                           {"r": run_id}).mappings().one()
        row = dict(conn.execute(sa.text(
            "SELECT * FROM onward.checkpoints WHERE run_id = :r AND seq = :s"),
            {"r": run_id, "s": run["seq"]}).mappings().one())
        row["control"] = control
        digest = ledger.keys.mac(CheckpointBody.from_row(row).as_dict())
        conn.execute(sa.text(
            "UPDATE onward.checkpoints SET control = CAST(:c AS jsonb), hash = :h "
            "WHERE run_id = :r AND seq = :s"),
            {"c": json.dumps(control), "h": digest,
             "r": run_id, "s": run["seq"]})
        conn.execute(sa.text("UPDATE onward.runs SET head_hash = :h, head_mac = :m "
                             "WHERE id = :r"),
                     {"h": digest, "m": ledger.keys.sign(signed.head(run_id, run["seq"],
                                                                     digest)),
                      "r": run_id})


def _stored_control(ledger: Ledger, run_id: UUID, seq: int) -> Any:
    with ledger.engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT control FROM onward.checkpoints WHERE run_id = :r AND seq = :s"),
            {"r": run_id, "s": seq}).scalar_one()


def test_wait_control__a_run_waiting_on_an_old_form_control_resumes(ledger: Ledger,
                                                                   drv: Driver) -> None:
    """Invariant: existing checkpoints still restore. A signal wait whose control has the
    form written before ``on_timeout``, ``timeout_at`` and ``timeout_s`` were recorded (and
    a key this code does not know) resumes when its signal comes and completes; its stored
    control is left exactly as it was, and verify finds nothing."""
    run_id = ledger.start_run("test_bad_input", {"kind": "wait"})
    assert drv.drive(run_id).status is RunStatus.WAITING
    old = {"kind": "signal", "name": "go", "then": "done", "written_by": "onward 0.1"}
    _rewrite_head_control(ledger, run_id, old)
    assert ledger.verify_run(run_id) == []
    assert ledger.signal(run_id, "go", {"ok": True}) is True
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    assert _stored_control(ledger, run_id, 1) == old
    assert ledger.verify_run(run_id) == []


def test_wait_control__a_control_this_code_cannot_read_parks_the_run(ledger: Ledger,
                                                                    drv: Driver) -> None:
    """Invariant: bad input is never guessed at. A signed head checkpoint whose control has
    an unknown kind (as a newer onward might write): once its signal wakes the run, the
    claimed step is not run; the run is parked ``invalid_control`` with a message that
    names the kind and what to do."""
    run_id = ledger.start_run("test_bad_input", {"kind": "wait"})
    assert drv.drive(run_id).status is RunStatus.WAITING
    _rewrite_head_control(ledger, run_id, {"kind": "hologram", "name": "go", "then": "done"})
    ledger.signal(run_id, "go", {})
    run = drv.drive(run_id)
    assert run.status is RunStatus.NEEDS_REVIEW, run
    assert run.parked_reason == "invalid_control"
    assert run.last_error is not None
    message = str(run.last_error["message"])
    assert "'hologram'" in message and "cannot read" in message
