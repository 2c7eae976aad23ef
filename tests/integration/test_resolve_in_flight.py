"""A person's "not sent" waits until no call of the effect can still land (docs/operating.md,
"Resolve an effect by hand"), against a real PostgreSQL: a worker that died, was stopped or
lost its lease in the middle of a provider call leaves an attempt never seen to end, and the
request may still reach the provider after a person looked and found nothing; so may one
whose client gave up on it (outcome unknown: a timeout), queued or processing there. Said
then, ``not_sent`` would let the run send the effect again: it is refused (audited) until
``ONWARD_CALL_LANDING_S`` past the call's cover, or past the end of one that ended unknown,
unless the person says the call cannot land (``allow_in_flight``, kept in the audit row). A
``completed`` finding is not held back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from console.cli import app
from console.http.app import create_app
from console.http.pages import COOKIE, csrf_of
from ledger import Ledger, operations
from ledger.effects import Effect, EffectStore, Intent
from ledger.exceptions import OperationRefused
from ledger.steps import Claim, StepStore
from ledger.tokens import TokenRequest
from ledger.vocabulary import EffectAttemptKind, EffectAttemptOutcome, EffectStatus, Role
from tasks.scope import call_error
from tests.support import clock
from tests.support.cluster import wait_for
from tests.workflows_outcomes import OUTSIDE

NOT_SENT = operations.Finding.NOT_SENT
COVER_S = 0.3  # the call's time limit and lease margin, as its worker extended its lease


@pytest.fixture()
def admin(ledger: Ledger) -> Ledger:
    OUTSIDE.reset()
    return ledger.acting_as("ada", Role.ADMIN)


@pytest.fixture()
def offset() -> list[timedelta]:
    return [timedelta(0)]


@pytest.fixture()
def later(admin: Ledger, offset: list[timedelta]) -> Iterator[Ledger]:
    """The admin's ledger on an engine whose clock runs ``offset[0]`` ahead."""
    engine = sa.create_engine(admin.engine.url)
    clock.follow_engine(engine, offset)
    yield Ledger(engine, admin.settings).acting_as("ada", Role.ADMIN)
    engine.dispose()


@dataclass
class Call:
    """A worker's call of an irreversible effect, begun (its attempt recorded, its lease
    extended over the call) on ``store``."""

    store: StepStore
    effects: EffectStore
    effect: Effect
    attempt: int
    epoch: int


@contextmanager
def calling(ledger: Ledger, key: str) -> Iterator[Call]:
    """A worker claims a new run and begins its irreversible call; its connection closes
    after the block."""
    run_id = ledger.start_run("test_outcome_send", {"tool": "blind"})
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=0.2)
    try:
        claim = store.claim(run_id, 0, "w:1")
        assert isinstance(claim, Claim)
        effects = EffectStore(store.conn, ledger.keys)
        effect, _ = effects.intend(Intent(
            effect_id=key * 64, effect_type="test.outcome.without_lookup", run_id=run_id,
            tenant_id="default", seq=0, step="send", command_id="send@0#1",
            tool_class="irreversible", request_hash="h", recipient=None, payload={},
            lease_epoch=claim.epoch))
        attempt = effects.begin_attempt(effect, EffectAttemptKind.CALL, worker="w:1",
                                        epoch=claim.epoch, cover_s=COVER_S)
        yield Call(store, effects, effect, attempt, claim.epoch)
    finally:
        store.close()


def lapsed(ledger: Ledger, run_id: UUID) -> Effect:
    """Wait until no worker holds the run's lease; its one effect, whose outcome is
    unknown."""
    def expired() -> bool:
        with ledger.engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT lease_expires_at < onward.now() FROM onward.runs WHERE id = :id"),
                {"id": run_id}).scalar_one())
    wait_for(expired, timeout=10, what="the worker's lease to run out", interval=0.05)
    [effect] = ledger.effects(run_id)
    assert (effect.status, effect.outcome_unknown) == (EffectStatus.PENDING, True)
    return effect


def died_mid_call(ledger: Ledger, *, overran: bool = False, key: str = "d") -> Effect:
    """A worker began an irreversible call (attempt recorded, lease extended over the call)
    and was never heard of again; its lease has run out. With ``overran``, it had marked
    the call still in flight past its time limit first."""
    with calling(ledger, key) as call:
        if overran:
            assert call.effects.mark_overran(call.effect, call.attempt, epoch=call.epoch,
                                             timeout_s=0.1)
    effect = lapsed(ledger, call.effect.run_id)
    assert effect.attempts == 1
    return effect


def gave_up(ledger: Ledger, *, key: str = "t") -> Effect:
    """A worker's client gave up on an irreversible call (a timeout): the attempt ended
    with outcome unknown, the request may still be queued at the provider; the run's lease
    has run out since (its next attempt would park it: no lookup)."""
    with calling(ledger, key) as call:
        call.effects.record(call.effect, call.attempt, outcome=EffectAttemptOutcome.UNKNOWN,
                            status=EffectStatus.PENDING, epoch=call.epoch,
                            error=call_error(TimeoutError("the provider did not answer")))
    return lapsed(ledger, call.effect.run_id)


def resolve_not_sent(ledger: Ledger, effect: Effect, **options: bool) -> Effect:
    plan = operations.resolve_plan(effect, NOT_SENT, None, None)
    return ledger.resolve_effect(effect.effect_type, effect.effect_id, "nothing there", plan,
                                 finding=NOT_SENT, **options)


LEFT = {  # how the call was left: its effect, what the refusal says, when it stops landing
    "died_mid_call": (died_mid_call, "never seen to end", COVER_S),
    "gave_up": (gave_up, "ended at .* with outcome unknown", 0.0),
}


@pytest.mark.parametrize("left", LEFT)
def test_resolve_not_sent__refused_while_the_call_may_still_land(
        admin: Ledger, later: Ledger, offset: list[timedelta], left: str) -> None:
    """Invariant: while an attempt never seen to end is within ONWARD_CALL_LANDING_S of
    its cover, or one that ended with outcome unknown (its client gave up: a timeout; the
    request may still be queued or processing at the provider) ended less than that ago,
    by the database's clock, ``not_sent`` is refused (audited, the effect unchanged) and
    says until when; after that time it is recorded. A person who found the object
    records it ``completed`` at once."""
    make, said, cover_s = LEFT[left]
    effect, found = make(admin), make(admin, key="u")
    with pytest.raises(OperationRefused, match=said) as refused:
        resolve_not_sent(admin, effect)
    assert "may still land at the provider until" in str(refused.value)
    assert "--allow-in-flight" in str(refused.value)
    offset[0] = timedelta(seconds=admin.settings.call_landing_s - 5)
    with pytest.raises(OperationRefused, match="may still land"):
        resolve_not_sent(later, effect)
    unchanged = admin.effects(effect.run_id)[0]
    assert (unchanged.status, unchanged.attempts) == (EffectStatus.PENDING, 1)
    offset[0] = timedelta(seconds=admin.settings.call_landing_s + cover_s + 1)
    assert resolve_not_sent(later, effect).status is EffectStatus.UNSENT
    rows = [(a.outcome, (a.details or {}).get("allow_in_flight"))
            for a in reversed(admin.audit(run_id=effect.run_id, action="resolve_effect"))]
    assert rows == [("refused", None), ("refused", None), ("done", None)]
    plan = operations.resolve_plan(found, operations.Finding.COMPLETED, "obj_1", None)
    done = admin.resolve_effect(found.effect_type, found.effect_id, "found it", plan,
                                finding=operations.Finding.COMPLETED, provider_ref="obj_1")
    assert done.status is EffectStatus.COMPLETED


def test_resolve_not_sent__waits_from_a_late_answers_end_whatever_a_lookup_found_before(
        admin: Ledger, later: Ledger, offset: list[timedelta]) -> None:
    """Invariant: the window is counted from the call's end, not its start or cover, and a
    lookup that found nothing within it does not close it (it shows only that nothing had
    landed yet). Worker A's call outlived its lease; worker B then took the step and its
    lookup found nothing (B was stopped before sending again); A's client gave up 120 s
    into the call (its answer came after its lease: outcome unknown). ``not_sent`` is
    refused until ONWARD_CALL_LANDING_S past that end, long after the call's cover."""
    late_s = 120.0
    with calling(admin, "l") as a:
        run_id = a.effect.run_id
        lapsed(admin, run_id)
        b = StepStore(admin.url, admin.keys, lease_ttl_s=0.2)
        try:
            claim = b.claim(run_id, 0, "w:2")
            assert isinstance(claim, Claim)
            looked = EffectStore(b.conn, admin.keys)
            lookup = looked.begin_attempt(a.effect, EffectAttemptKind.LOOKUP, worker="w:2",
                                          epoch=claim.epoch, cover_s=COVER_S)
            looked.record(a.effect, lookup, outcome=EffectAttemptOutcome.MISSING,
                          status=EffectStatus.PENDING, epoch=claim.epoch)
        finally:
            b.close()
        clock.set_on_store(a.store, timedelta(seconds=late_s))
        a.effects.record_late(a.effect, a.attempt, epoch=a.epoch,
                              what="the call ended with TimeoutError: no answer")
    effect = lapsed(admin, run_id)
    assert [(x.kind, x.outcome) for x in admin.effect_attempts(effect)] == [
        ("call", "unknown"), ("lookup", "missing")]
    offset[0] = timedelta(seconds=late_s + admin.settings.call_landing_s - 5)
    with pytest.raises(OperationRefused, match="with outcome unknown"):
        resolve_not_sent(later, effect)
    offset[0] = timedelta(seconds=late_s + admin.settings.call_landing_s + 1)
    assert resolve_not_sent(later, effect).status is EffectStatus.UNSENT


@pytest.mark.parametrize("left", LEFT)
def test_resolve_not_sent__allow_in_flight_records_it_and_says_so_in_the_audit(
        admin: Ledger, left: str) -> None:
    """Invariant: a person who knows the call cannot land any more (its worker died in it,
    or its client gave up on it) says so (``allow_in_flight``): ``not_sent`` is recorded
    at once, and its audit row says it was said over a call that may have been in
    flight."""
    effect = LEFT[left][0](admin)
    assert resolve_not_sent(admin, effect, allow_in_flight=True).status is EffectStatus.UNSENT
    [row] = admin.audit(run_id=effect.run_id, action="resolve_effect")
    assert row.outcome == "done" and row.details is not None
    assert row.details["allow_in_flight"] is True


def test_resolve__a_call_marked_past_its_time_limit_holds_not_sent_back_not_completed(
        admin: Ledger, later: Ledger, offset: list[timedelta]) -> None:
    """Invariant: a call its worker marked in flight past its time limit and never saw end
    may land at any time: ``not_sent`` is refused however late (a day after); a person
    who found the object records it ``completed`` at once."""
    effect = died_mid_call(admin, overran=True)
    offset[0] = timedelta(days=1)
    with pytest.raises(OperationRefused, match="past its time limit"):
        resolve_not_sent(later, effect)
    plan = operations.resolve_plan(effect, operations.Finding.COMPLETED, "obj_1", None)
    done = admin.resolve_effect(effect.effect_type, effect.effect_id, "found it", plan,
                                finding=operations.Finding.COMPLETED, provider_ref="obj_1")
    assert (done.status, done.provider_ref) == (EffectStatus.COMPLETED, "obj_1")


def test_cli_api_and_page__not_sent_over_a_call_in_flight_is_exit_2_and_409(
        admin: Ledger, settings_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: ``onward effects resolve --not-sent`` refuses (exit 2, the reason and
    the way out printed, nothing asked), POST .../resolve and the run page's resolve form
    answer 409 while the call may still land; ``--allow-in-flight``, ``allow_in_flight``
    and the form's box record it."""
    for key, value in {**settings_env, "XDG_CONFIG_HOME": str(tmp_path / "config")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ONWARD_AUTH", raising=False)
    secret = admin.create_token(TokenRequest("ada", Role.ADMIN, "default",
                                             timedelta(hours=1))).secret
    cli, api, page = (died_mid_call(admin, key=key) for key in "def")
    args = ["effects", "resolve", cli.effect_id, "--not-sent", "--reason", "nothing there",
            "--yes"]
    env = {"COLUMNS": "220", "ONWARD_TOKEN": secret}
    refused = CliRunner().invoke(app, args, env=env)
    assert refused.exit_code == 2, refused.output
    assert "never seen to end" in refused.output and "--allow-in-flight" in refused.output
    done = CliRunner().invoke(app, [*args, "--allow-in-flight", "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout.strip().splitlines()[-1])["effect"]["status"] == "unsent"
    body = {"reason": "nothing there", "finding": "not_sent", "attempts": api.attempts}
    with TestClient(create_app(Ledger.from_env())) as client:
        path = f"/api/v1/effects/{api.effect_id}/resolve"
        headers = {"Authorization": f"Bearer {secret}"}
        answer = client.post(path, json=body, headers=headers)
        assert answer.status_code == 409, answer.text
        assert "never seen to end" in answer.json()["detail"]
        answer = client.post(path, json={**body, "allow_in_flight": True}, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["effect"]["status"] == "unsent"
        client.cookies.set(COOKIE, secret)
        form = {"reason": "nothing there", "finding": "not_sent", "confirm": "yes",
                "attempts": str(page.attempts), "csrf": csrf_of(secret)}
        path = f"/effects/{page.effect_type}/{page.effect_id}/resolve"
        answer = client.post(path, data=form, follow_redirects=False)
        assert answer.status_code == 409 and "never seen to end" in answer.text, answer.text
        answer = client.post(path, data={**form, "allow_in_flight": "yes"},
                             follow_redirects=False)
        assert answer.status_code == 303, answer.text
    assert admin.effects(page.run_id)[0].status is EffectStatus.UNSENT
