"""A wait's control (ledger/wait_control.py) is a pydantic model told apart by ``kind``,
stored key for key as onward wrote it before: a checkpoint's MAC covers its stored control,
so the stored form must not change, and old forms must still read."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.exceptions import MalformedControl
from ledger.wait_control import ApprovalControl, SignalControl, TimerControl, parse_control

# The forms tasks/waiting.py wrote as plain dicts before the models existed.
OLD_FORMS: list[dict[str, Any]] = [
    {"kind": "timer", "until": "2026-01-01T00:00:00+00:00", "then": "wake"},
    {"kind": "approval", "approval_id": "01a2", "action": "publish", "artifact_hash": "ab" * 32,
     "then": "publish", "on_reject": None, "on_expire": "expired"},
    {"kind": "signal", "name": "go", "then": "next", "on_timeout": "late",
     "timeout_at": "2026-01-01T00:00:00+00:00", "timeout_s": 60.0},
    {"kind": "signal", "name": "go", "then": "next", "on_timeout": None, "timeout_at": None},
]


@pytest.mark.parametrize("raw", OLD_FORMS, ids=lambda raw: f"{raw['kind']}")
def test_wait_control__reads_and_stores_the_old_form_key_for_key(raw: dict[str, Any]) -> None:
    """Invariant: what a checkpoint stores (and its MAC covers) is unchanged: parsing an
    existing control and storing it again gives the same object, null values and absent
    keys alike (a signal wait without a timeout has no ``timeout_s``)."""
    control = parse_control(raw)
    assert control is not None and control.stored() == raw


def test_wait_control__older_and_newer_keys_still_read() -> None:
    """A signal control written before ``timeout_s`` and ``on_timeout`` existed reads with
    them unset; a key this code does not know is kept as it is, not dropped."""
    old = parse_control({"kind": "signal", "name": "go", "then": "next", "timeout_at": None})
    assert isinstance(old, SignalControl) and old.on_timeout is None and old.timeout_s is None
    assert old.continuations == {"next"}
    extra = {"kind": "timer", "until": "2026-01-01T00:00:00+00:00", "then": "wake", "note": 1}
    timer = parse_control(extra)
    assert isinstance(timer, TimerControl) and timer.stored() == extra


def test_wait_control__continuations_name_every_way_on() -> None:
    approval = parse_control(OLD_FORMS[1])
    assert isinstance(approval, ApprovalControl)
    assert approval.continuations == {"publish", "expired"}


def test_wait_control__no_control_is_no_wait() -> None:
    assert parse_control(None) is None and parse_control({}) is None


@pytest.mark.parametrize(("raw", "said"), [
    ({"kind": "hologram", "then": "x"}, "'hologram'"),
    ({"then": "x"}, "None"),
    ({"kind": "signal", "then": "x"}, "name"),
    ({"kind": "approval", "approval_id": "a", "then": "x"}, "artifact_hash"),
    ({"kind": "timer", "until": 5, "then": "x"}, "until"),
])
def test_wait_control__a_malformed_control_is_refused_with_what_is_wrong(
        raw: dict[str, Any], said: str) -> None:
    """Invariant: nothing is guessed. An unknown kind, a missing kind or a missing or
    mistyped field raises MalformedControl naming the problem."""
    with pytest.raises(MalformedControl, match="cannot read") as raised:
        parse_control(raw, "checkpoint 3 of run r")
    assert said in str(raised.value) and "checkpoint 3 of run r" in str(raised.value)
