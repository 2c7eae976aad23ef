"""Restore is a validated procedure (docs/design.md section 7): verify the checkpoint, find code
that may continue the run (same version, a declared-compatible one, or one with a complete
state migration path), resolve the step, validate the state. Anything else is refused.

A migration happens in memory, at the seq the run is at: the step then runs in the same
claim with the command ids of that seq (a migration never renumbers a step, so its
recorded effects, model answers and signal are found again), and the checkpoint it commits
records where the state came from (``Migrated``, bound under the checkpoint's MAC)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ledger import signed
from ledger.checkpoints import (
    CheckpointBody,
    CheckpointKeys,
    check_parent_link,
    verify_checkpoint,
)
from ledger.exceptions import IntegrityViolation, MalformedControl, SealedValueUnreadable
from ledger.states import copy_json
from ledger.steps import Claim
from ledger.verify import head_disagreement
from ledger.vocabulary import OutcomeKind, ParkReason
from ledger.wait_control import parse_control
from tasks.fresh_state import validation_copies
from tasks.sensitive import open_state
from tasks.workflow import MigrationFn, Registry, Step, Workflow

__all__ = ["Migrated", "Refusal", "Restored", "restore"]


@dataclass(frozen=True)
class Migrated:
    """The stored run's version and state schema, when newer code migrated its state."""

    workflow_version: int
    state_schema_version: int

    def as_ref(self) -> dict[str, int]:
        return {"workflow_version": self.workflow_version,
                "state_schema_version": self.state_schema_version}


@dataclass(frozen=True)
class Restored:
    workflow: Workflow[Any]
    step: Step
    state: BaseModel
    migrated: Migrated | None = None  # set when the state was migrated to this code's schema
    opened: dict[str, Any] | None = None  # the stored state, sealed fields opened
    foreign: frozenset[str] = frozenset()  # fields sealed for the run this one was copied from


@dataclass(frozen=True)
class Refusal:
    """Park the run, or (``hand_back``) give the step back to the fleet, without spending
    an attempt, for a worker that has the run's workflow and version (tasks/executor.py
    ``_hand_back`` parks it ``no_worker_for_version`` once none took it for too long)."""

    reason: ParkReason
    error_type: str
    message: str
    hand_back: bool = False
    unbind: bool = False  # with hand_back: the run's input fits none of this code's versions
    bind_to: tuple[int, int] | None = None  # with unbind: an older version here accepts it


def restore(keys: CheckpointKeys, registry: Registry,
            claim: Claim) -> Restored | Refusal:
    """The workflow, step and state the claimed run continues with, or why not: its head
    verified, code chosen that may continue it, its step resolved, its state opened,
    migrated where the code's schema is newer, and validated."""
    refused = _verify(keys, claim)
    if refused is not None:
        return refused
    code = _choose_code(registry, claim)
    if isinstance(code, Refusal):
        return code
    workflow, path = code
    step = _resolve_step(workflow, claim)
    if isinstance(step, Refusal):
        return step
    opened = _open(keys, claim)
    if isinstance(opened, Refusal):
        return opened
    fields, foreign = opened
    state = _migrated_state(workflow, path, fields, claim)
    if isinstance(state, Refusal):
        return _older_version_accepting(registry, workflow, fields, state)
    migrated = Migrated(claim.workflow_version or 0, _run_schema(claim)) if path else None
    return Restored(workflow, step, state, migrated, fields, foreign)


def _verify(keys: CheckpointKeys, claim: Claim) -> Refusal | None:
    """Why the claimed head may not be continued, if it may not: a missing checkpoint, a
    state that does not rebuild, a MAC that does not verify (checkpoint, head, launch), a
    wait control this code cannot read, or a run row that differs from what its head signs."""
    checkpoint, digest, key_id = claim.checkpoint, claim.checkpoint_hash, claim.checkpoint_key_id
    if checkpoint is None or digest is None or key_id is None:
        return Refusal(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run {claim.run_id}: checkpoint {claim.seq} is missing")
    if claim.state_problem is not None:  # a delta chain that does not rebuild, a lost artifact
        try:  # a deleted or moved parent is named as such, as for a stored state
            check_parent_link(checkpoint, claim.parent_found_hash)
        except IntegrityViolation as exc:
            return Refusal(ParkReason.INTEGRITY, "IntegrityViolation", str(exc))
        return Refusal(ParkReason.INTEGRITY, "IntegrityViolation", claim.state_problem)
    try:
        _verify_macs(keys, claim, checkpoint, digest, key_id)
    except IntegrityViolation as exc:
        return Refusal(ParkReason.INTEGRITY, "IntegrityViolation", str(exc))
    try:  # a wait control this code cannot read is not guessed at: a person looks
        parse_control(checkpoint.control, f"checkpoint {claim.seq} of run {claim.run_id}")
    except MalformedControl as exc:
        return Refusal(ParkReason.INVALID_CONTROL, type(exc).__name__, str(exc))
    unsigned = _unsigned_difference(claim, checkpoint)
    if unsigned is not None:
        return Refusal(ParkReason.INTEGRITY, "IntegrityViolation", unsigned)
    return None


def _verify_macs(keys: CheckpointKeys, claim: Claim, checkpoint: CheckpointBody, digest: str,
                 key_id: str) -> None:
    """The head checkpoint (stored hash ``digest``, signed with ``key_id``), the run's head
    and how it was launched, each against its MAC (raises IntegrityViolation)."""
    verify_checkpoint(keys, checkpoint, digest, key_id, claim.head_hash,
                      parent_found=claim.parent_found_hash)
    keys.check(signed.head(claim.run_id, claim.seq, claim.head_hash), claim.head_mac,
               f"run {claim.run_id}: its head (seq {claim.seq}, checkpoint "
               f"{claim.head_hash[:12]}…)")
    keys.check(claim.launch.signed_body(claim.run_id, claim.tenant_id), claim.launch.mac,
               f"run {claim.run_id}: how it was launched (mode, parent, irreversible "
               "effects allowed)")


def _resolve_step(workflow: Workflow[Any], claim: Claim) -> Step | Refusal:
    step = workflow.resolve(claim.step)
    if step is None:
        return Refusal(ParkReason.UNKNOWN_STEP, "UnknownStep",
                       f"checkpoint {claim.seq} names step {claim.step!r}, which "
                       f"{workflow.name} v{workflow.version} does not define (was it removed? "
                       "keep a step until no stored run needs it)")
    return step


def _open(keys: CheckpointKeys,
          claim: Claim) -> tuple[dict[str, Any], frozenset[str]] | Refusal:
    """The claimed state with its sealed fields (tasks/sensitive.py) opened, here in the
    worker, and the fields sealed for the run this one was copied from; or the run parks."""
    if claim.state is None:
        return Refusal(ParkReason.INTEGRITY, "IntegrityViolation",
                       f"run {claim.run_id}: checkpoint {claim.seq}'s state artifact is missing "
                       "or does not match its sha256")
    try:
        return open_state(keys.crypt, claim.state, tenant=claim.tenant_id,
                          run_id=claim.run_id, seq=claim.seq,
                          parent_run_id=claim.launch.parent_run_id)
    except SealedValueUnreadable as exc:
        return Refusal(ParkReason.INTEGRITY, "SealedValueUnreadable", str(exc))


def _migrated_state(workflow: Workflow[Any], path: list[MigrationFn], opened: dict[str, Any],
                    claim: Claim) -> BaseModel | Refusal:
    """The step's state: a copy of ``opened``, migrated along ``path``, validated as the
    workflow's state model."""
    # the step must not hold a container of the claim's state (and ``opened``, which shares
    # its containers; open_state changes neither): it is what the next checkpoint is made
    # from, and a migration or a model field typed Any could otherwise change it in place.
    # So the step gets a copy, unless no migration runs and validating as the model builds
    # every container anew (tasks/fresh_state.py): the copy was a tenth of a 2 MB state's
    # restore. A structural copy: a JSON round trip cost as much as the rest together
    state_json = copy_json(opened) if path or not validation_copies(workflow.state) else opened
    try:
        for migrate in path:
            state_json = migrate(dict(state_json))
    except Exception as exc:
        return Refusal(ParkReason.INCOMPATIBLE_VERSION, "MigrationFailed",
                       f"migrating {workflow.name} state to schema "
                       f"{workflow.state_schema_version} failed: {exc}")
    try:
        state: BaseModel = workflow.state.model_validate(state_json)
    except ValidationError as exc:
        if _unbound_start(claim) and not path:
            return _input_not_accepted(workflow, exc)
        return Refusal(ParkReason.INVALID_STATE, "InvalidState",
                       f"checkpoint {claim.seq} does not validate as {workflow.name} "
                       f"v{workflow.version}'s state {workflow.state.__name__} (schema "
                       f"{workflow.state_schema_version}): {exc}\n{_invalid_remedy(claim, path)}")
    return state


def _invalid_remedy(claim: Claim, path: list[MigrationFn]) -> str:
    """What a person does about a stored state this code's model rejects."""
    version = "" if claim.workflow_version is None else f" v{claim.workflow_version}"
    stored = f"{claim.workflow}{version}, schema {_run_schema(claim)}"
    if path:
        return (f"The migrations from schema {_run_schema(claim)} ({stored}) do not produce "
                f"a valid state: fix them, then `onward runs continue {claim.run_id}`.")
    return (f"The run's state was written under {stored}, and this code's model no longer "
            "accepts it: if the model changed, ship the change under a new "
            f"state_schema_version with a migration from schema {_run_schema(claim)} "
            "(docs/versioning.md), or restore the model; then `onward runs continue "
            f"{claim.run_id}`.")


def _unbound_start(claim: Claim) -> bool:
    """The claim is of an ordinary run's start checkpoint, which names no version: the claim
    itself bound the run to this code, so no code ran a step from it under that binding."""
    checkpoint = claim.checkpoint
    return (claim.seq == 0 and checkpoint is not None and checkpoint.workflow_version is None
            and claim.launch.mode is None)


def _older_version_accepting(registry: Registry, newest: Workflow[Any],
                             opened: dict[str, Any], refusal: Refusal) -> Refusal:
    """For a new run whose input ``newest`` rejected (``refusal`` unbinds it): bind it to the
    newest older version of its workflow in this worker whose model accepts the input, if
    any (several versions side by side in one worker), so that version runs it; else the
    refusal as it is."""
    if not refusal.unbind:
        return refusal
    for version in reversed(registry.versions(newest.name)):
        older = registry.get(newest.name, version)
        if older is None or older.version >= newest.version:
            continue
        try:
            older.state.model_validate(copy_json(opened))
        except ValidationError:
            continue
        return Refusal(refusal.reason, refusal.error_type,
                       f"{refusal.message}; {older.name} v{older.version} here accepts it: "
                       f"handing it back bound to v{older.version}", hand_back=True,
                       unbind=True, bind_to=(older.version, older.state_schema_version))
    return refusal


def _input_not_accepted(workflow: Workflow[Any], exc: ValidationError) -> Refusal:
    """A new run whose input this code's state model rejects was started for another version
    of its workflow (``start_run`` accepts an input any advertised version's model accepts):
    it is handed back unbound, for a worker of a version whose model accepts it, not parked
    ``invalid_state`` under a version it was never meant for."""
    return Refusal(ParkReason.NO_WORKER_FOR_VERSION, "InputNotAccepted",
                   f"the run's input does not validate as {workflow.name} v{workflow.version}'s "
                   f"state {workflow.state.__name__} (schema {workflow.state_schema_version}): "
                   f"{exc}; handing it back, bound to no version, for a worker whose version "
                   f"of {workflow.name} accepts it", hand_back=True, unbind=True)


def _unsigned_difference(claim: Claim, head: CheckpointBody) -> str | None:
    """What the run's row (the claim) would run that its MAC'd head checkpoint did not sign
    (ledger/verify.py ``head_disagreement``), or a head that ended the run. After a wait the
    step is one of the head's continuations; tasks/policy.py checks it against the decision."""
    where = f"run {claim.run_id} at seq {claim.seq}"
    if head.outcome in (OutcomeKind.FINISH.value, OutcomeKind.FAIL.value):
        return (f"{where}: checkpoint {claim.seq} ended the run ({head.outcome}): nothing runs "
                "after it (the run's row was set runnable outside onward)")
    found = head_disagreement(head, workflow=claim.workflow,
                              workflow_version=claim.workflow_version,
                              state_schema_version=claim.state_schema_version, step=claim.step)
    return f"{where}: {found}" if found else None


def _run_schema(claim: Claim) -> int:
    return claim.state_schema_version or 1


def _choose_code(registry: Registry,
                 claim: Claim) -> tuple[Workflow[Any], list[MigrationFn]] | Refusal:
    versions = registry.versions(claim.workflow)
    if not versions:
        return Refusal(ParkReason.UNKNOWN_WORKFLOW, "UnknownWorkflow",
                       f"no workflow {claim.workflow!r} is registered in this worker (known: "
                       f"{registry.names()}; ONWARD_WORKFLOWS): handing it back for a "
                       "worker with it", hand_back=True)
    wanted = claim.workflow_version
    if wanted is None:
        latest = registry.latest(claim.workflow)
        assert latest is not None
        return latest, []
    exact = registry.get(claim.workflow, wanted)
    if exact is not None:
        return exact, []
    if wanted > versions[-1]:
        return Refusal(ParkReason.NEWER_VERSION, "NewerVersion",
                       f"run is at {claim.workflow} v{wanted}; this worker has only "
                       f"v{versions}: handing it back for a worker with v{wanted}",
                       hand_back=True)
    latest = registry.latest(claim.workflow)
    assert latest is not None
    if wanted in latest.compatible_with:
        return latest, []
    path = latest.migration_path(_run_schema(claim))
    if path is not None and _run_schema(claim) < latest.state_schema_version:
        return latest, path
    return Refusal(ParkReason.INCOMPATIBLE_VERSION, "IncompatibleVersion",
                   f"run is at {claim.workflow} v{wanted} (state schema {_run_schema(claim)}); "
                   f"this code has v{versions} (schema {latest.state_schema_version}), does not "
                   f"declare v{wanted} compatible and has no complete migration path. Deploy "
                   f"workers with {claim.workflow} v{wanted} again (run both versions until "
                   f"v{wanted}'s runs drain), or give v{latest.version} a migration from schema "
                   f"{_run_schema(claim)} (or compatible_with={{{wanted}}} if the state means "
                   f"the same); then `onward runs continue {claim.run_id}`")
