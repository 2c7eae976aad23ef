"""Compare what a replay did with what the recorded run did (docs/corpus.md#the-report).

Step by step from the first checkpoint: the calls each step made (model calls, reads,
effects: the same command ids, requests and effect keys, in the same order), where it went
next (next step, outcome, the wait it asked for), and the state it committed; then how each
run ended (status, result, error). The first difference is the run's finding. Sealed values
(encryption at rest) are compared opened (``opened``): each seal is different (a random
nonce, the run's id in its associated data), what it holds may be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

from ledger.corpus_history import Call, Checkpoint, History
from ledger.crypto import MASK, RESULT_FIELD, Keyring, is_sealed, open_value
from ledger.exceptions import IntegrityViolation, MalformedControl, SealedValueUnreadable
from ledger.vocabulary import OutcomeKind, RunStatus
from ledger.wait_control import parse_control
from tasks.corpus.diff import json_diff, request_diff, request_text, without
from tasks.sensitive import open_state

__all__ = [
    "SEALED_REQUEST",
    "Finding",
    "Kind",
    "Requests",
    "Verdict",
    "compare",
    "describe",
    "diverged",
    "opened",
    "stopped_early",
    "went_on",
]


SEALED_REQUEST = "(stored sealed: not shown)"
"""How a report names a request it does not show (it is sealed; ``Requests.replayed``)."""


@dataclass(frozen=True)
class Requests:
    """How a report quotes the requests of a call that differs. ``recorded``: (kind,
    command_id) -> (kept, request) of the recorded run's call, opened when sealed values
    are shown (it may raise SealedValueUnreadable or IntegrityViolation). ``replayed``:
    (value, seq) -> the replay's request quoted at seq, opened; None when sealed values
    are not shown (the default: a report goes to files and CI logs, which have no reader
    role), and a sealed request is then named by its hash only."""

    recorded: Callable[[str, str], tuple[bool, Any]]
    replayed: Callable[[Any, int], Any] | None = None


class Kind(StrEnum):
    """Kinds of divergence, as ``--allow`` names them."""

    REQUEST = "request_differs"  # a model or tool call, or an effect, asked something else
    UNRECORDED = "unrecorded_call"  # a call the recorded run never made
    NOT_MADE = "call_not_made"  # a call the recorded run made, the replay did not
    NEXT_STEP = "next_step"  # another next step, outcome or wait
    STATE = "state"  # the same step committed another state
    RESULT = "result"  # ended otherwise: status, result or error
    ERROR = "error"  # the replay failed, was parked, or never ended
    NO_CODE = "no_code"  # the candidate code has no such workflow: not replayed


@dataclass(frozen=True)
class Finding:
    """The first point where a replay diverged, and how."""

    kind: Kind
    message: str
    seq: int | None = None
    step: str | None = None
    call: str | None = None  # llm, read, effect, approval, signal
    command_id: str | None = None
    diff: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    identical: bool
    finding: Finding | None = None
    compared: int = 0  # checkpoints compared
    note: str | None = None
    recorded_effects: tuple[str, ...] = field(default_factory=tuple)
    replayed_effects: tuple[str, ...] = field(default_factory=tuple)


_CONTROL_KEYS = ("kind", "then", "on_reject", "on_expire", "on_timeout", "action",
                 "artifact_hash", "name", "timeout_s")
"""What a wait means; ids and instants (approval id, until, timeout_at) differ in a replay."""


def compare(rec: History, rep: History, *, ignore: tuple[str, ...] = (),
            requests: Requests | None = None, stopped_as_recorded: bool = False) -> Verdict:
    """The verdict on replay ``rep`` of recorded run ``rec``."""
    compared = 0
    effects = (_effect_keys(rec), _effect_keys(rep))
    for seq in range(rec.first_seq, max(rec.seq, rep.seq) + 1):
        recorded, replayed = rec.checkpoints.get(seq + 1), rep.checkpoints.get(seq + 1)
        if recorded is None and replayed is None:
            break
        if replayed is None and _stopped_at_recorded_wait(rec, rep, seq):
            return Verdict(True, None, compared, f"stopped at the wait of seq {seq + 1}, where "
                           f"the recorded run was stopped: {_ended(rec)}", *effects)
        finding: Finding | None
        if replayed is None:
            finding = stopped_early(rec, rep, seq, requests)
        elif recorded is None:
            finding = went_on(rec, rep, seq)
        else:
            finding = _step(rec, rep, seq, recorded, replayed, ignore)
        if finding is not None:
            return Verdict(False, finding, compared, None, *effects)
        compared += 1
    end = _end(rec, rep, ignore, stopped_as_recorded)
    if isinstance(end, Finding):
        return Verdict(False, end, compared, None, *effects)
    return Verdict(True, None, compared, end, *effects)


def _effect_keys(history: History) -> tuple[str, ...]:
    return tuple(call.effect_id or "" for seq in sorted(history.checkpoints)
                 for call in (history.checkpoints[seq].calls or ()) if call.kind == "effect")


# -- sealed values ------------------------------------------------------------------------------
def opened(history: History, crypt: Keyring | None, *,
           copied_from: UUID | None = None) -> History:
    """``history`` with its sealed values opened to be compared, each at its own place:
    every checkpoint's sensitive state fields (sealed at that checkpoint or an earlier one
    of the run, or, for a replay, of the run it copied its first state from:
    ``copied_from``) and the result (at the seq the run ended at); which were sealed is
    kept, so that a diff does not show them (``tasks/corpus/diff.py`` ``HIDDEN``). An
    error's sealed message reads ``***``: errors compare by type, a report quotes the
    message. A value that does not open is left as stored, so it differs from whatever it
    is compared with: nothing is guessed."""
    error = history.last_error
    if isinstance(error, dict) and is_sealed(error.get("message")):
        history = replace(history, last_error={**error, "message": MASK})
    if crypt is None:
        return history
    checkpoints = {seq: _opened_state(cp, history, crypt, copied_from)
                   for seq, cp in history.checkpoints.items()}
    return replace(history, checkpoints=checkpoints,
                   result=_opened(crypt, history.result, history, RESULT_FIELD),
                   sealed_result=is_sealed(history.result))


def _opened_state(cp: Checkpoint, history: History, crypt: Keyring,
                  copied_from: UUID | None) -> Checkpoint:
    sealed = frozenset(name for name, value in cp.state.items() if is_sealed(value))
    if not sealed:
        return cp
    try:
        state, _ = open_state(crypt, cp.state, tenant=history.tenant_id,
                              run_id=history.run_id, seq=cp.seq, parent_run_id=copied_from)
    except SealedValueUnreadable:
        return replace(cp, sealed=sealed)
    return replace(cp, state=state, sealed=sealed)


def _top(path: str) -> str:
    """The state field a JSON pointer is under."""
    return path.split("/")[1].replace("~1", "/").replace("~0", "~") if "/" in path else ""


def _opened(crypt: Keyring, value: Any, history: History, place: str) -> Any:
    try:
        return open_value(crypt, value, tenant=history.tenant_id, run_id=history.run_id,
                          field=place, seq=history.seq)
    except SealedValueUnreadable:
        return value


# -- one step ---------------------------------------------------------------------------------
def _step(rec: History, rep: History, seq: int, recorded: Checkpoint, replayed: Checkpoint,
          ignore: tuple[str, ...]) -> Finding | None:
    step = recorded.step
    found = _calls(rec.calls_at(seq), rep.calls_at(seq), seq, step)
    if found is not None:
        return found
    before, after = describe(recorded), describe(replayed)
    if before != after:
        return Finding(Kind.NEXT_STEP, f"after {step} at seq {seq} the recorded run went to "
                       f"{before}, the replay to {after}", seq, step,
                       diff=(f"- {before}", f"+ {after}"))
    sealed = recorded.sealed | replayed.sealed
    lines = json_diff(without(recorded.state, ignore), without(replayed.state, ignore),
                      hidden=lambda path: _top(path) in sealed)
    if lines:
        return Finding(Kind.STATE, f"{step} at seq {seq} committed another state "
                       f"({len(lines)} change(s))", seq, step, diff=tuple(lines))
    return None


def _calls(recorded: tuple[Call, ...] | None, replayed: tuple[Call, ...] | None, seq: int,
           step: str | None) -> Finding | None:
    if recorded is None or replayed is None:
        return None  # a checkpoint of an older envelope names no calls: nothing to compare
    made = {c.command_id: c for c in replayed}
    asked = {c.command_id: c for c in recorded}
    for call in replayed:
        if call.command_id not in asked:
            return Finding(Kind.UNRECORDED, f"{step} at seq {seq} made {call.kind} call "
                           f"{call.command_id}, which the recorded run never made", seq, step,
                           call.kind, call.command_id)
    for call in recorded:
        if call.command_id not in made:
            return Finding(Kind.NOT_MADE, f"{step} at seq {seq} never made the recorded "
                           f"{call.kind} call {call.command_id}" + _named(call), seq, step,
                           call.kind, call.command_id)
    for before, after in zip(recorded, replayed, strict=True):
        changed = before.command_id != after.command_id or before.effect_id != after.effect_id
        hashes = before.request_hash and after.request_hash
        if changed or (hashes and before.request_hash != after.request_hash):
            return Finding(Kind.REQUEST if not changed else Kind.NOT_MADE,
                           f"{step} at seq {seq}: call {after.command_id} differs from the "
                           f"recorded {before.command_id} (order, effect key or request)",
                           seq, step, after.kind, after.command_id)
    return None


def _named(call: Call) -> str:
    return f" ({call.name})" if call.name else ""


def describe(checkpoint: Checkpoint) -> str:
    """Where a step went, in words: ``goto draft``, ``finish``, ``wait approval …``."""
    outcome = checkpoint.outcome
    if outcome == OutcomeKind.WAIT.value:
        try:
            wait = parse_control(checkpoint.control)
        except MalformedControl:
            return "wait (a control this code cannot read)"
        control = {k: v for k, v in (wait.stored() if wait else {}).items()
                   if k in _CONTROL_KEYS and v is not None}
        kind = control.pop("kind", "?")
        then = control.pop("then", None)
        rest = ", ".join(f"{k}={v}" for k, v in sorted(control.items()))
        return f"wait {kind} then {then}" + (f" ({rest})" if rest else "")
    if outcome == OutcomeKind.GOTO.value:
        return f"goto {checkpoint.next_step}"
    return outcome


# -- where one history ends before the other ------------------------------------------------
def stopped_early(rec: History, rep: History, seq: int,
                  requests: Requests | None) -> Finding:
    """The replay made no checkpoint ``seq + 1``, the recorded run did: why it stopped."""
    error = rep.last_error or {}
    step = rep.step
    if rep.status == RunStatus.DIVERGED.value:
        return diverged(error, seq, requests)
    if rep.status == RunStatus.COMPLETED.value:  # unreachable: a finish is a checkpoint
        return Finding(Kind.RESULT, f"the replay completed at seq {seq}", seq, step)
    return Finding(Kind.ERROR, f"the replay {_ended(rep)} at seq {seq} in step {step}; the "
                   f"recorded run went on to {describe(rec.checkpoints[seq + 1])}", seq, step,
                   diff=_error_lines(error))


def diverged(error: dict[str, Any], seq: int, requests: Requests | None) -> Finding:
    """A replay the executor stopped because a call had no matching record."""
    where = error.get("where") or {}
    call, why = str(error.get("kind", "")), str(error.get("why", ""))
    command_id, step = where.get("command_id"), where.get("step")
    message = str(error.get("message", "diverged"))
    if why in ("request_differs", "artifact_differs"):
        return Finding(Kind.REQUEST, message, where.get("seq", seq), step, call, command_id,
                       tuple(_request_lines(error, call, command_id, requests,
                                            where.get("seq", seq))))
    if why == "no_record":
        shown = _replayed(error.get("request"), requests, where.get("seq", seq))
        if shown is None:
            lines = []
        elif is_sealed(shown):  # a report goes to CI logs
            lines = [f"the replay asked: {SEALED_REQUEST}"]
        else:
            lines = ["the replay asked:", *(f"+ {line}" for line in request_text(shown))]
        return Finding(Kind.UNRECORDED, message, where.get("seq", seq), step, call,
                       command_id, tuple(lines))
    return Finding(Kind.ERROR, message, where.get("seq", seq), step, call, command_id)


def _replayed(request: Any, requests: Requests | None, seq: int) -> Any:
    """The replay's request as the report may quote it: opened when sealed values are shown
    (left sealed if it does not open), else as stored."""
    if requests is None or requests.replayed is None or not is_sealed(request):
        return request
    try:
        return requests.replayed(request, seq)
    except SealedValueUnreadable:
        return request


def _request_lines(error: dict[str, Any], call: str, command_id: str | None,
                   requests: Requests | None, seq: int) -> list[str]:
    replayed = _replayed(error.get("request"), requests, seq)
    hashes = f"request hash {error.get('recorded_request_hash')} → {error.get('request_hash')}"
    if requests is None or command_id is None or replayed is None:
        return [hashes]
    try:
        kept, recorded = requests.recorded(call, command_id)
    except (SealedValueUnreadable, IntegrityViolation) as exc:
        return [f"{hashes} (stored sealed: does not open: {exc})"]
    if is_sealed(replayed) or is_sealed(recorded):  # a report goes to CI logs: not shown
        return [f"{hashes} {SEALED_REQUEST}"]
    if not kept:
        return [f"{hashes} (the recorded request was not kept, so no diff: "
                "recorded before onward kept requests, left out of the bundle, or a tool that "
                "keeps no payloads)"]
    return request_diff(recorded, replayed)


def _stopped_at_recorded_wait(rec: History, rep: History, seq: int) -> bool:
    """The recorded run ended at the wait of checkpoint ``seq + 1`` by a decision its code
    did not take (rejected or expired without a continuation, a signal that timed out), and
    the replay, which follows recorded decisions, found none to follow there."""
    head = rec.checkpoints.get(rec.seq)
    error = rep.last_error or {}
    return (rec.seq == seq + 1 and head is not None and head.outcome == OutcomeKind.WAIT.value
            and rec.status == RunStatus.FAILED.value and bool((rec.last_error or {})
                                                              .get("reason"))
            and rep.status == RunStatus.DIVERGED.value and error.get("why") == "no_decision")


def went_on(rec: History, rep: History, seq: int) -> Finding:
    """The recorded run made no checkpoint ``seq + 1``, the replay did."""
    after = describe(rep.checkpoints[seq + 1])
    return Finding(Kind.RESULT, f"the recorded run {_ended(rec)} at seq {seq} in step "
                   f"{rec.step}; the replay went on to {after}", seq, rec.step,
                   diff=(*_error_lines(rec.last_error or {}, "-"), f"+ {after}"))


def _ended(history: History) -> str:
    reason = history.parked_reason or (history.last_error or {}).get("type")
    return f"{history.status}" + (f" ({reason})" if reason else "")


def _error_lines(error: dict[str, Any], sign: str = "+") -> tuple[str, ...]:
    if not error:
        return ()
    return (f"{sign} {error.get('type', 'error')}: {str(error.get('message', ''))[:300]}",)


# -- how both ended -------------------------------------------------------------------------------
def _end(rec: History, rep: History, ignore: tuple[str, ...],
         stopped_as_recorded: bool) -> Finding | str | None:
    """A finding, or a note for an identical run (None: nothing to say)."""
    if stopped_as_recorded:
        return (f"stopped at seq {rec.seq} where the recorded run stopped: {_ended(rec)}, "
                "which its code did not decide")
    if rec.status != rep.status:
        if rep.status == RunStatus.DIVERGED.value:
            return diverged(rep.last_error or {}, rep.seq, None)
        kind = Kind.ERROR if rep.status in (RunStatus.FAILED.value,
                                            RunStatus.NEEDS_REVIEW.value) else Kind.RESULT
        return Finding(kind, f"the recorded run {_ended(rec)}, the replay {_ended(rep)}",
                       rep.seq, _last_step(rep),
                       diff=(f"- {_ended(rec)}", *_error_lines(rec.last_error or {}, "-"),
                             f"+ {_ended(rep)}", *_error_lines(rep.last_error or {})))
    if rec.status == RunStatus.FAILED.value and _error_type(rec) != _error_type(rep):
        return Finding(Kind.RESULT, f"both failed, with another error ({_error_type(rec)} → "
                       f"{_error_type(rep)})", rep.seq, _last_step(rep),
                       diff=(*_error_lines(rec.last_error or {}, "-"),
                             *_error_lines(rep.last_error or {})))
    sealed = rec.sealed_result or rep.sealed_result
    lines = json_diff(without(rec.result, ignore), without(rep.result, ignore),
                      hidden=lambda path: sealed)
    if lines:
        return Finding(Kind.RESULT, f"the result differs ({len(lines)} change(s))", rep.seq,
                       _last_step(rep), diff=tuple(lines))
    return None


def _last_step(history: History) -> str | None:
    """The step the run was at when it ended: the one that finished it, else the next."""
    head = history.checkpoints.get(history.seq)
    return head.step if head is not None and history.step is None else history.step


def _error_type(history: History) -> str | None:
    error = history.last_error or {}
    return str(error.get("reason") or error.get("type") or "") or None
