"""A wait's control: what a checkpoint that waits records about its wait (covered by the
checkpoint's MAC) and every reader of it decides by: a timer, an approval or a signal,
told apart by ``kind`` (a pydantic discriminated union).

The stored form is the JSON object these models dump (``stored``), key for key what onward
wrote before they existed, so a checkpoint's MAC over its stored control is unchanged and
old checkpoints read as they are (extra keys kept, missing optional ones ``None``). A
control that is not one of them (an unknown kind, a missing field) raises
``MalformedControl``: the run is parked for review, nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ledger.exceptions import MalformedControl

__all__ = ["AnyControl", "ApprovalControl", "SignalControl", "TimerControl", "WaitControl",
           "parse_control"]


class _Control(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    then: str

    @property
    def continuations(self) -> set[str]:
        """The steps the run may go on to after this wait."""
        return {self.then}

    def stored(self) -> dict[str, Any]:
        """The JSON object a checkpoint stores (and its MAC covers)."""
        return self.model_dump(mode="json")


class TimerControl(_Control):
    kind: Literal["timer"]
    until: str  # ISO 8601, aware: the step runs then

    def stored(self) -> dict[str, Any]:
        return {"kind": self.kind, "until": self.until, "then": self.then,
                **(self.model_extra or {})}


class ApprovalControl(_Control):
    kind: Literal["approval"]
    approval_id: str
    action: str
    artifact_hash: str
    on_reject: str | None = None
    on_expire: str | None = None

    @property
    def continuations(self) -> set[str]:
        return {s for s in (self.then, self.on_reject, self.on_expire) if s is not None}

    def stored(self) -> dict[str, Any]:
        return {"kind": self.kind, "approval_id": self.approval_id, "action": self.action,
                "artifact_hash": self.artifact_hash, "then": self.then,
                "on_reject": self.on_reject, "on_expire": self.on_expire,
                **(self.model_extra or {})}


class SignalControl(_Control):
    kind: Literal["signal"]
    name: str
    on_timeout: str | None = None
    timeout_at: str | None = None  # ISO 8601: when the wait times out
    timeout_s: float | None = None  # how long, for a replay or branch waiting from its start

    @property
    def continuations(self) -> set[str]:
        return {s for s in (self.then, self.on_timeout) if s is not None}

    def stored(self) -> dict[str, Any]:
        stored: dict[str, Any] = {"kind": self.kind, "name": self.name, "then": self.then,
                                  "on_timeout": self.on_timeout, "timeout_at": self.timeout_at}
        if self.timeout_s is not None:  # absent, not null, on a wait without a timeout
            stored["timeout_s"] = self.timeout_s
        return {**stored, **(self.model_extra or {})}


AnyControl = TimerControl | ApprovalControl | SignalControl
WaitControl = Annotated[AnyControl, Field(discriminator="kind")]
_CONTROL: TypeAdapter[AnyControl] = TypeAdapter(WaitControl)


def parse_control(raw: Mapping[str, Any] | None,
                  where: str = "the checkpoint") -> AnyControl | None:
    """The wait control ``raw`` records; None for a checkpoint that does not wait (no
    control, or an empty one). Raises MalformedControl for anything else."""
    if not raw:
        return None
    try:
        return _CONTROL.validate_python(dict(raw))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'control'}: {error['msg']}"
            for error in exc.errors())
        raise MalformedControl(
            f"{where} records a wait control onward cannot read (kind "
            f"{raw.get('kind')!r}: {problems}); expected a timer, approval or signal wait. "
            "Nothing was guessed: check which code wrote it (a newer onward?) and "
            "`onward runs continue` once a worker that reads it runs, or replay or branch "
            "the run from an earlier checkpoint") from None
