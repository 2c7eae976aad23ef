"""Sensitive state fields: marked on the pydantic model, sealed in checkpoints.

    class Offer(BaseModel):
        customer_id: Annotated[str, Sensitive]
        amount: int

With encryption keys configured (docs/security.md, encryption at rest), each field so
marked is stored sealed (AES-GCM under the tenant's data key, bound to tenant, run, seq and
field: ledger/crypto.py) in every checkpoint, opened only by the worker that restores the
state. A field whose value did not change keeps the envelope it was sealed with at an
earlier checkpoint, so a checkpoint stored as a delta does not grow with it.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from uuid import UUID

from pydantic import BaseModel, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ledger.catalog import SENSITIVE_MARK
from ledger.checkpoints import sealed_envelope
from ledger.crypto import ERROR_FIELD, Keyring, Place, open_value, sealed_text
from ledger.exceptions import SealedValueUnreadable

__all__ = ["SCHEMA_MARK", "Sensitive", "open_state", "seal_error", "seal_state",
           "sensitive_fields", "state_field"]

SCHEMA_MARK = SENSITIVE_MARK
"""What a sensitive field's JSON Schema says (workers advertise their state schemas, and a
new run's input has these fields sealed by ``start_run``)."""


class Sensitive:
    """Marks a state field sensitive: ``Annotated[str, Sensitive]`` (the class or an
    instance), or ``Field(json_schema_extra={"x-onward-sensitive": True})``."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        found = handler(schema)
        found[SCHEMA_MARK] = True
        return found


def _marked(metadata: list[Any], extra: Any) -> bool:
    if any(m is Sensitive or isinstance(m, Sensitive) for m in metadata):
        return True
    return isinstance(extra, dict) and bool(extra.get(SCHEMA_MARK))


def sensitive_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names (as stored: aliases applied) of ``model``'s sensitive fields."""
    return _sensitive_fields(model)


@cache
def _sensitive_fields(model: Any) -> frozenset[str]:
    return frozenset(info.serialization_alias or info.alias or name
                     for name, info in model.model_fields.items()
                     if _marked(info.metadata, info.json_schema_extra))


def state_field(name: str) -> str:
    """The field a sealed state field is bound to."""
    return f"state.{name}"


def seal_state(crypt: Keyring | None, state: dict[str, Any], fields: frozenset[str], *,
               tenant: str, run_id: UUID, seq: int, parent_stored: dict[str, Any] | None,
               parent_plain: dict[str, Any] | None,
               foreign: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``state`` (plain JSON) with each of ``fields`` sealed for checkpoint ``seq``; a field
    equal to the parent checkpoint's (``parent_plain``) keeps the parent's envelope
    (``parent_stored``). Unchanged without a keyring or sensitive fields."""
    if crypt is None or not fields:
        return state
    sealed = dict(state)
    for name in fields & state.keys():
        value = state[name]
        if value is None:
            continue
        kept = (parent_stored or {}).get(name)
        if (sealed_envelope(kept) is not None and parent_plain is not None
                and name not in foreign
                and name in parent_plain and parent_plain[name] == value):
            sealed[name] = kept
        else:
            sealed[name] = crypt.seal(value, Place(tenant, run_id, seq, state_field(name)))
    return sealed


def open_state(crypt: Keyring | None, state: dict[str, Any], *, tenant: str, run_id: UUID,
               seq: int, parent_run_id: UUID | None = None
               ) -> tuple[dict[str, Any], frozenset[str]]:
    """``state`` with every sealed top-level field opened (sealed at this checkpoint or an
    earlier one of the run, or, for a run copied from another (replay, branch), of that
    run), and the names of those sealed for the other run (sealed again at the next
    checkpoint, never kept). Raises SealedValueUnreadable."""
    opened = None
    foreign: set[str] = set()
    for name, value in state.items():
        if sealed_envelope(value) is None:
            continue
        opened = opened if opened is not None else dict(state)
        try:
            opened[name] = open_value(crypt, value, tenant=tenant, run_id=run_id,
                                      field=state_field(name), seq_at_most=seq)
        except SealedValueUnreadable:
            if parent_run_id is None:
                raise
            opened[name] = open_value(crypt, value, tenant=tenant, run_id=parent_run_id,
                                      field=state_field(name))
            foreign.add(name)
    return (state if opened is None else opened), frozenset(foreign)


def seal_error(crypt: Keyring | None, error: dict[str, Any], *,
               tenant: str, run_id: UUID, seq: int) -> dict[str, Any]:
    """A step error (``ledger.steps.error_record``) with its message sealed for checkpoint
    ``seq`` when keys are configured, whatever the workflow: a step's exception text may
    quote its state (``ValueError(f"bad address {state.address}")``), and a provider's
    error its request ("invalid email ada@…"), i.e. the model prompt or effect payload that
    is sealed in every workflow. Its type, step and attempt stay plain: what an operator
    triages by. Unchanged without keys. A tenant whose keys were erased (nothing more can be
    sealed for it) gets ``***``: the failure is still recorded, its text is not."""
    if crypt is None or not isinstance(error.get("message"), str):
        return error
    return {**error, "message": sealed_text(crypt, error["message"],
                                            Place(tenant, run_id, seq, ERROR_FIELD))}
