"""The checkpoint envelope (docs/design.md section 9): a versioned, inspectable record.

``CheckpointBody`` (ledger/checkpoints.py) is what the MAC covers; this pydantic model is
how a stored checkpoint is validated and shown, grouped as the design names the groups.
Large states are referenced artifacts (sha256 and size), so the envelope stays small.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from ledger.checkpoints import artifact_ref
from ledger.vocabulary import OutcomeKind

__all__ = [
    "ArtifactRef",
    "Budgets",
    "CheckpointEnvelope",
    "Compatibility",
    "EffectRef",
    "EvidenceRef",
    "Identity",
    "Inputs",
    "MigratedFrom",
    "Position",
]


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Identity(_Group):
    run_id: UUID
    seq: int = Field(ge=0)
    parent_seq: int | None
    parent_hash: str | None
    hash: str
    key_id: str


class Position(_Group):
    step: str | None = Field(description="the step that produced it (None for the start)")
    next_step: str | None
    outcome: OutcomeKind


class ArtifactRef(_Group):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Inputs(_Group):
    state_artifact: ArtifactRef | None = Field(description="set when the state is stored apart")
    state_bytes_inline: bool


class EvidenceRef(_Group):
    kind: str
    command_id: str
    request_hash: str


class EffectRef(_Group):
    effect_type: str
    command_id: str
    effect_id: str
    status: str


class Budgets(_Group):
    attempts: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None


class MigratedFrom(_Group):
    """The stored version and state schema newer code migrated the step's state from."""

    workflow_version: int
    state_schema_version: int


class Compatibility(_Group):
    envelope_version: int
    workflow_version: int | None
    state_schema_version: int | None
    migrated_from: MigratedFrom | None = Field(
        default=None, description="set when the step ran on a state migrated by newer code")


class CheckpointEnvelope(_Group):
    """One checkpoint, validated. ``SCHEMA_VERSION`` is this model's own version."""

    SCHEMA_VERSION: ClassVar[int] = 1

    identity: Identity
    position: Position
    inputs: Inputs
    evidence: list[EvidenceRef]
    side_effects: list[EffectRef]
    budgets_at_start: Budgets
    control: dict[str, Any] | None
    compatibility: Compatibility
    lease_epoch: int
    created_at: datetime
    # None: compacted by retention (docs/operating.md#retention), which keeps the state's
    # sha256 and the checkpoint's hash, not the state
    state: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Any) -> CheckpointEnvelope:
        refs = row["refs"] or {}
        ref = artifact_ref(row["state"])
        return cls(
            identity=Identity(run_id=row["run_id"], seq=row["seq"],
                              parent_seq=row["seq"] - 1 if row["parent_hash"] else None,
                              parent_hash=row["parent_hash"], hash=row["hash"],
                              key_id=row["key_id"]),
            position=Position(step=row["step"], next_step=row["next_step"],
                              outcome=OutcomeKind(row["outcome"])),
            inputs=Inputs(state_artifact=ArtifactRef(**ref) if ref else None,
                          state_bytes_inline=ref is None),
            evidence=[EvidenceRef(**e) for e in refs.get("evidence", [])],
            side_effects=[EffectRef(**e) for e in refs.get("effects", [])],
            budgets_at_start=Budgets(**refs.get("budgets", {})),
            control=row["control"],
            compatibility=Compatibility(envelope_version=row["envelope_version"],
                                        workflow_version=row["workflow_version"],
                                        state_schema_version=row["state_schema_version"],
                                        migrated_from=refs.get("migrated_from")),
            lease_epoch=row["lease_epoch"],
            created_at=row["created_at"],
            state=row["state"],
        )
