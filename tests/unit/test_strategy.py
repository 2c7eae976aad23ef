"""The step task's strategy (workers/strategy.py): a malformed message is refused before
Celery's handling starts, and nothing Celery's handling raises is mistaken for one."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery
from celery.exceptions import InvalidTaskError

import workers.strategy as strategy
from workers.strategy import header_problem, step_strategy

KWARGS = {"run_id": "0190f0c2-7b3e-7cc1-9d7a-1f2e3d4c5b6a", "seq": 0}


def _celery_headers(**options: Any) -> dict[str, Any]:
    """The headers Celery itself puts on an onward.step message (protocol 2)."""
    app = Celery("strategy-test")
    sent = app.amqp.as_task_v2(str(uuid4()), "onward.step", kwargs=KWARGS, **options)
    return dict(sent.headers)


class _Handled:
    """Celery's default strategy's handler, as the strategy under test wraps it."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.messages: list[Any] = []

    def strategy(self, task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
        def handle(message: Any, body: Any, *args: Any, **more: Any) -> str:
            self.messages.append(message)
            if self.raises is not None:
                raise self.raises
            return "handled"
        return handle


def _message(headers: dict[str, Any]) -> SimpleNamespace:
    payload = [[], KWARGS, {}]
    return SimpleNamespace(body=json.dumps(payload).encode(), payload=payload, headers=headers)


def _checked(monkeypatch: pytest.MonkeyPatch, handled: _Handled) -> Any:
    monkeypatch.setattr(strategy, "default", handled.strategy)
    return step_strategy(None, None, None)


def test_header_problem__the_headers_celery_sends_pass() -> None:
    """What Celery's own send_task puts on a step message (with a time limit, an ETA, an
    expiry, retries) is not refused."""
    assert header_problem(_celery_headers()) is None
    assert header_problem(_celery_headers(
        time_limit=300, soft_time_limit=240, eta="2026-12-02T13:00:00+00:00",
        expires="2026-12-02T14:00:00+00:00", retries=2)) is None


@pytest.mark.parametrize(("header", "value"), [
    ("id", None), ("id", 5), ("task", ["onward.step"]), ("timelimit", [1]),
    ("timelimit", 5), ("timelimit", [None, "x"]), ("timelimit", [float("inf"), None]),
    ("timelimit", [-1, None]), ("timelimit", [True, None]), ("timelimit", [10**40, None]),
    ("retries", "1"), ("retries", -1), ("retries", True), ("ignore_result", "yes"),
    ("root_id", 7), ("parent_id", {}), ("shadow", 1), ("argsrepr", []), ("eta", 5),
    ("expires", [1]), ("group_index", 1.5), ("replaced_task_nesting", "0"),
    ("stamps", []), ("stamped_headers", "x"), ("groups", {}),
])
def test_step_strategy__a_malformed_header_is_refused_before_celery_reads_it(
        monkeypatch: pytest.MonkeyPatch, header: str, value: Any) -> None:
    """Invariant: a step message with a header of a type Celery assumes but does not check
    is refused as malformed (InvalidTaskError, which the consumer logs and answers by
    dropping that message: the outbox re-sends a lost step message, so nothing is lost),
    and Celery's handling never sees it (it raised on timelimit [1] as it handed the
    request to the pool, and the whole worker stopped)."""
    handled = _Handled()
    checked = _checked(monkeypatch, handled)
    headers = {**_celery_headers(), header: value}
    with pytest.raises(InvalidTaskError, match=f"malformed step message: its {header} header"):
        checked(_message(headers), None, None, None, None)
    assert handled.messages == []


@pytest.mark.parametrize("error", [
    TypeError("unsupported operand"), KeyError("hostname"), AttributeError("no pool"),
    ValueError("bad value"), OverflowError("too big"), RuntimeError("pool closed"),
])
def test_step_strategy__an_exception_from_celerys_handling_is_not_swallowed(
        monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Invariant: on a well-formed message, whatever Celery's handling raises propagates
    as it is: a bug in Celery, the pool or onward is not logged as a refused message and
    its message silently dropped (the strategy turned TypeError, ValueError, KeyError,
    AttributeError and OverflowError from anywhere in Celery's handling into
    InvalidTaskError)."""
    handled = _Handled(raises=error)
    checked = _checked(monkeypatch, handled)
    with pytest.raises(type(error)) as raised:
        checked(_message(_celery_headers()), None, None, None, None)
    assert raised.value is error and not isinstance(raised.value, InvalidTaskError)
    assert len(handled.messages) == 1


def test_step_strategy__a_well_formed_message_is_handed_to_celery(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handled = _Handled()
    checked = _checked(monkeypatch, handled)
    assert checked(_message(_celery_headers()), None, None, None, None) == "handled"
    assert len(handled.messages) == 1
