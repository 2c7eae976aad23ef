"""With encryption keys, the texts that could carry customer data and were stored plain are
sealed (docs/security.md#errors-what-is-sealed-and-what-is-not): a step error of a
workflow with no sensitive field (a provider's error can quote the request), the error a
worker records when it gives back an eager step's lease, the result an admin's repeat
records, and the input of a run started before any worker advertised its workflow (every
field, when nothing says which are sensitive). Each value is then in no table in the
clear, shown opened to the app and masked for a viewer. Real PostgreSQL; steps run by
the real executor in-process."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import psycopg
import pytest

from ledger import Ledger, RunStatus
from ledger.checkpoints import sealed_envelope
from ledger.db import libpq_conninfo
from ledger.steps import Claim
from tests.support.crypt import assert_error_sealed, settings_env  # noqa: F401 - a fixture
from tests.support.driver import Driver, driver_fixture
from tests.support.reads import places_holding
from tests.workflows_crypt import _call

pytest.importorskip("cryptography")

drv = driver_fixture(["tests.workflows_crypt"])


def rows(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        return conn.execute(query, args).fetchall()


def canary() -> str:
    return f"CANARY{secrets.token_hex(6)}"


def test_a_step_error_of_a_workflow_with_no_sensitive_field_is_sealed(drv: Driver) -> None:
    """Given a workflow marking nothing sensitive whose step fails quoting its state;
    expect the message sealed in the run's row, ``***`` in the attempt's, the value in no
    table, opened for the app, masked for a viewer; verify clean (before: plain)."""
    customer = canary()
    run_id = drv.ledger.start_run("test_crypt_unmarked_error", {"customer": customer})
    assert drv.drive(run_id).status is RunStatus.FAILED
    assert_error_sealed(drv, run_id, customer, f"provider said: invalid email {customer}")
    assert drv.ledger.verify_run(run_id) == []


def test_a_run_started_before_its_workflow_is_advertised_has_its_input_sealed(
        drv: Driver) -> None:
    """Given a start with keys, no worker having advertised the workflow and no
    ``sensitive=``; expect every input field sealed in checkpoint 0 (before: the plain
    copy of the customer), the run to complete, the customer in no table, the fields the
    workflow does not mark plain again from checkpoint 1, and verify clean."""
    customer = canary()
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer, "amount": 12})
    url = drv.ledger.url
    [(state,)] = rows(url, "SELECT state FROM onward.checkpoints WHERE run_id = %s "
                           "AND seq = 0", run_id)
    assert all(sealed_envelope(v) is not None for v in state.values()), state
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    assert places_holding(url, customer) == []
    viewer = drv.ledger.acting_as("vic", "viewer").checkpoints(run_id)
    assert viewer[0].state["amount"] == "***"  # type: ignore[index]
    assert viewer[-1].state["amount"] == 12 and viewer[-1].state["customer"] == "***"  # type: ignore[index]
    assert drv.ledger.checkpoints(run_id)[0].state["customer"] == customer  # type: ignore[index]
    assert drv.ledger.verify_run(run_id) == []


def test_the_error_of_a_lease_given_back_is_sealed(drv: Driver) -> None:
    """Given an eager step that failed outside its body with an exception quoting a value;
    expect the worker's give-back to record its message sealed (run's row) and ``***``
    (the attempt), the value in neither table (before: the exception's text, plain)."""
    from workers.runtime import WorkerRuntime

    customer = canary()
    run_id = drv.ledger.start_run("test_crypt_unmarked_error", {"customer": customer},
                                  sensitive=("customer",))
    claimed = drv.store.claim(run_id, 0, "driver:0")
    assert isinstance(claimed, Claim)
    runtime = WorkerRuntime.__new__(WorkerRuntime)
    runtime._store, runtime._config = drv.store, drv.config
    runtime._give_back(claimed, ValueError(f"cannot encode {customer}"))
    url = drv.ledger.url
    held = places_holding(url, customer)
    assert "runs" not in held and "step_attempts" not in held, held
    [(error,)] = rows(url, "SELECT last_error FROM onward.runs WHERE id = %s", run_id)
    assert error["type"] == "ValueError" and sealed_envelope(error["message"]) is not None
    assert drv.ledger.get_run(run_id).last_error["message"] == f"cannot encode {customer}"  # type: ignore[union-attr,index]


def test_the_result_an_admins_repeat_records_is_sealed(drv: Driver) -> None:
    """Given an effect the provider failed, repeated by an admin and now completed with a
    result echoing the customer; expect that result sealed in the effect's row (before:
    plain), opened for the admin, masked for a viewer, and verify clean."""
    from tasks.operator import plan_repeat, repeat_effect
    from tests.workflows_crypt import failing_crm

    customer = canary()
    run_id = drv.ledger.start_run("test_crypt_provider_error", {"customer": customer})
    drv.drive(run_id)
    admin = Ledger(drv.ledger.engine, drv.ledger.settings.model_copy(
        update={"workflows": ["tests.workflows_crypt"]}))
    [effect] = [e for e in admin.effects(run_id) if e.effect_type == failing_crm.name]
    assert effect.status.value == "failed"
    plan = plan_repeat(admin, effect)
    plan = dataclasses.replace(plan, tool=dataclasses.replace(plan.tool, call=_call))
    done = repeat_effect(admin, plan, "the provider is fixed")
    assert done.effect.status.value == "completed"
    [(result,)] = rows(admin.url, "SELECT result FROM onward.effects WHERE effect_type = %s "
                                  "AND effect_id = %s", effect.effect_type, effect.effect_id)
    assert sealed_envelope(result) is not None
    assert "effects" not in places_holding(admin.url, customer)
    [shown] = [e for e in admin.effects(run_id) if e.effect_id == effect.effect_id]
    assert shown.result["echo"] == customer  # type: ignore[index]
    [masked] = [e for e in admin.acting_as("vic", "viewer").effects(run_id)
                if e.effect_id == effect.effect_id]
    assert masked.result != shown.result
    assert admin.verify_run(run_id) == []
