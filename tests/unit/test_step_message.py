"""The step message: ``{run_id, seq}`` and nothing else (docs/design.md section 4)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from pydantic import ValidationError

from tasks import StepMessage

RUN = "0190f0c2-7b3e-7cc1-9d7a-1f2e3d4c5b6a"


def test_step_message__accepts_exactly_run_id_and_seq() -> None:
    """What the dispatcher publishes validates into a frozen message."""
    message = StepMessage.model_validate({"run_id": RUN, "seq": 3})
    assert message.run_id == UUID(RUN) and message.seq == 3
    with pytest.raises(ValidationError):
        message.seq = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"seq": 0},
        {"run_id": RUN},
        {"run_id": "not-a-uuid", "seq": 0},
        {"run_id": RUN, "seq": "zero"},
        {"run_id": RUN, "seq": 1.5},
        {"run_id": RUN, "seq": 0, "state": {"injected": True}},
        {"run_id": [RUN], "seq": 0},
    ],
)
def test_step_message__malformed_kwargs_are_refused(kwargs: dict[str, Any]) -> None:
    """Anything but ``{run_id: uuid, seq: int}`` is refused: a message never carries state."""
    with pytest.raises(ValidationError):
        StepMessage.model_validate(kwargs)
