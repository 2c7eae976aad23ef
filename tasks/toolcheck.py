"""Check that a tool keeps the promises its declaration makes, against a TEST provider.

onward trusts a tool's declaration when an outcome is unknown (docs/effects.md): a lookup
that cannot find what the call created makes onward send again and duplicate, silently. This
module calls the tool for real, so point it only at the provider's test environment (a
sandbox account, a staging URL); every check creates at least one real object there.

    report = check_tool(create_offer, payload={"customer_id": "c-1", "amount": 100})
    assert_tool_keeps_promises(create_offer)          # in an integrator's own test suite

The promises, each checked only when the declaration makes it:

* ``call_answers``: the call answers ``completed`` or ``accepted`` with a provider reference.
* ``status_settles``: an accepted job's ``status(ref)`` reaches ``completed`` for that object.
* ``lookup_finds_created``: ``lookup(key)`` returns the object the call created with ``key``.
* ``lookup_unknown_missing``: ``lookup`` of a key never sent returns ``None``.
* ``same_key_one_object``: (``honours_key``) the same key and payload again gives the same
  object, not a second one and not a refusal.
* ``key_reuse_refused``: (``refuses_key_reuse``) the same key with another payload is refused
  (``ToolError``, not retryable) and creates nothing.
* ``simulate_answers``: ``simulate`` answers without raising.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import uuid4

from ledger.checkpoints import canonical_json
from ledger.exceptions import InvalidInput
from ledger.vocabulary import EffectAttemptOutcome, ToolClass
from tasks.exceptions import ToolError, ToolPromiseBroken
from tasks.services import effect_id_for
from tasks.tools import Status, Tool, ToolResult

__all__ = [
    "PROMISES",
    "PromiseCheck",
    "ToolPromiseBroken",
    "ToolReport",
    "Verdict",
    "assert_tool_keeps_promises",
    "check_tool",
    "load_tool",
]

PROMISES = {
    "call_answers": "the call answers with a result and a provider reference",
    "status_settles": "status of an accepted job is pollable until it completes",
    "lookup_finds_created": "lookup finds what the call created with its key",
    "lookup_unknown_missing": "lookup of an unknown key says missing",
    "same_key_one_object": "the same key twice gives one object",
    "key_reuse_refused": "the same key with another payload is refused",
    "simulate_answers": "simulate answers without the provider",
}


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class PromiseCheck:
    """One promise and what the provider did about it."""

    promise: str
    verdict: Verdict
    detail: str

    @property
    def title(self) -> str:
        return PROMISES[self.promise]

    def as_dict(self) -> dict[str, str]:
        return {"promise": self.promise, "title": self.title, "verdict": self.verdict.value,
                "detail": self.detail}


@dataclass
class ToolReport:
    """Every check of one tool, the keys it sent and the objects it made at the provider."""

    tool: str
    tool_class: str
    key: str
    unknown_key: str
    checks: list[PromiseCheck] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.verdict is not Verdict.FAILED for c in self.checks)

    @property
    def broken(self) -> list[PromiseCheck]:
        return [c for c in self.checks if c.verdict is Verdict.FAILED]

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "tool_class": self.tool_class, "passed": self.passed,
                "key": self.key, "unknown_key": self.unknown_key,
                "objects_created": self.objects, "checks": [c.as_dict() for c in self.checks]}

    def summary(self) -> str:
        lines = [f"tool {self.tool} ({self.tool_class}): "
                 + ("keeps its promises" if self.passed else "BREAKS a promise")]
        lines += [f"  {c.verdict.value:7} {c.promise}: {c.detail}" for c in self.checks]
        return "\n".join(lines)


def load_tool(target: str) -> Tool:
    """``package.module:name`` → the Tool declared there."""
    module_name, sep, name = target.partition(":")
    if not sep or not module_name or not name:
        raise InvalidInput(f"{target!r}: name the tool as MODULE:TOOL, e.g. examples.sales:"
                           "create_offer")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an error of the user's code at import, whatever it is
        raise InvalidInput(cannot_import_tool(module_name, exc)) from exc
    tool = getattr(module, name, None)
    if not isinstance(tool, Tool):
        found = "nothing" if tool is None else type(tool).__name__
        raise InvalidInput(f"{module_name}.{name} is {found}, not a Tool")
    return tool


def cannot_import_tool(module: str, exc: BaseException) -> str:
    """One paragraph, as for a workflow module (tasks/workflow_modules.py): which module,
    the exception's type and message, and whether the module or something it imports
    raised it; the traceback stays the exception's ``__cause__``."""
    why = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
            module == exc.name or module.startswith(exc.name + ".")):
        why += (" (imported from the current directory or sys.path: run the command from "
                "the folder that holds the package, set PYTHONPATH, or install it)")
    elif isinstance(exc, ImportError):
        why += " (raised by an import inside the module)"
    else:
        why += " (raised while the module was imported)"
    return f"cannot import tool module {module!r}: {why}"


def check_tool(tool: Tool, payload: dict[str, Any] | None = None, *,
               other_payload: dict[str, Any] | None = None,
               status_timeout_s: float = 30.0) -> ToolReport:
    """Call ``tool`` for real and check each promise its declaration makes.

    ``payload`` (default ``tool.check_payload``) must be a request the provider's test
    environment accepts; ``other_payload`` (default: ``payload`` with one value changed) is
    the different request sent under the same key when the tool refuses key reuse.
    """
    sample = _sample(tool, payload)
    report = ToolReport(tool.name, tool.tool_class.value, _fresh_key(tool),
                        _fresh_key(tool))
    first = _check_call(tool, sample, report)
    if first is not None and tool.tool_class is not ToolClass.READ:
        first = _check_status(tool, first, report, status_timeout_s)
        _check_lookup(tool, first, report)
        _check_same_key(tool, sample, first, report)
        _check_key_reuse(tool, sample, other_payload, first, report)
    elif tool.tool_class is ToolClass.READ:
        report.checks.append(PromiseCheck("same_key_one_object", Verdict.SKIPPED,
                                          "a read is repeated freely; it creates nothing"))
    _check_simulate(tool, sample, report)
    return report


def assert_tool_keeps_promises(tool: Tool, payload: dict[str, Any] | None = None, *,
                               other_payload: dict[str, Any] | None = None,
                               status_timeout_s: float = 30.0) -> ToolReport:
    """For an integrator's test suite: raise ``ToolPromiseBroken`` (an AssertionError) naming
    each broken promise; return the report when every declared promise holds."""
    report = check_tool(tool, payload, other_payload=other_payload,
                        status_timeout_s=status_timeout_s)
    if not report.passed:
        raise ToolPromiseBroken(report.summary())
    return report


# -- the checks ----------------------------------------------------------------------------
def _sample(tool: Tool, payload: dict[str, Any] | None) -> dict[str, Any]:
    sample = payload if payload is not None else tool.check_payload
    if sample is None:
        raise InvalidInput(f"tool {tool.name} has no sample payload: give one (--payload JSON) "
                           "or declare Tool(..., check_payload={...})")
    if not isinstance(sample, dict):
        raise InvalidInput(f"the sample payload for {tool.name} must be a JSON object")
    canonical_json(sample)  # plain JSON, as ctx.effect requires
    return sample


def _fresh_key(tool: Tool) -> str:
    """A key shaped like the ones onward sends (64 hex), never sent before."""
    return effect_id_for(uuid4(), tool.name, "onward-tools-check")


def _attempt(action: Callable[[], Any]) -> tuple[ToolResult | None, Exception | None]:
    try:
        raw = action()
        return (None if raw is None else ToolResult.coerce(raw)), None
    except Exception as exc:  # the check reports what any failure means for onward
        return None, exc


def _record(report: ToolReport, promise: str, ok: bool, detail: str) -> None:
    verdict = Verdict.PASSED if ok else Verdict.FAILED
    text = detail if ok else f"broken promise '{PROMISES[promise]}': {detail}"
    report.checks.append(PromiseCheck(promise, verdict, text))


def _skip(report: ToolReport, promise: str, why: str) -> None:
    report.checks.append(PromiseCheck(promise, Verdict.SKIPPED, why))


def _check_call(tool: Tool, sample: dict[str, Any], report: ToolReport) -> ToolResult | None:
    answer, error = _attempt(lambda: tool.call(sample, report.key))
    if error is not None or answer is None:
        what = _describe(error) if error else "it returned None"
        _record(report, "call_answers", False,
                f"the call with the sample payload did not answer ({what}); the other "
                "promises cannot be checked. Is the sample valid for the provider's test "
                "environment, and is the provider reachable?")
        return None
    if answer.outcome is EffectAttemptOutcome.FAILED:
        _record(report, "call_answers", False,
                f"the provider reported the sample call failed: {_short(answer.result)}")
        return None
    if answer.provider_ref is None and tool.tool_class is not ToolClass.READ:
        _record(report, "call_answers", False,
                f"the call answered {answer.status} without a provider reference "
                "(ToolResult.provider_ref, or an 'id' in a dict answer): onward cannot tell "
                "which object it made, nor poll an accepted job")
        return None
    if answer.provider_ref is not None:
        report.objects.append(answer.provider_ref)
    _record(report, "call_answers", True,
            f"answered {answer.status}, reference {answer.provider_ref or '-'}")
    return answer


def _check_status(tool: Tool, first: ToolResult, report: ToolReport,
                  timeout_s: float) -> ToolResult:
    if tool.status is None:
        if first.outcome is EffectAttemptOutcome.ACCEPTED:
            _record(report, "status_settles", False,
                    "the call answered 'accepted' but the tool declares no status: onward "
                    "would park every such effect (effect_unpollable); declare status=")
        else:
            _skip(report, "status_settles", "no status declared; the call completed at once")
        return first
    ref = first.provider_ref or ""
    answer, error, polls = _poll(tool.status, ref, timeout_s)
    if error is not None or answer is None:
        detail = f"status({ref}) did not answer ({_describe(error) if error else 'None'})"
    elif answer.outcome is EffectAttemptOutcome.ACCEPTED:
        detail = (f"status({ref}) still says accepted after {timeout_s:.0f}s ({polls} polls); "
                  "raise --status-timeout if the test provider is slow")
    elif answer.outcome is EffectAttemptOutcome.FAILED:
        detail = f"status({ref}) reports the sample job failed: {_short(answer.result)}"
    elif answer.provider_ref not in (None, ref):
        detail = f"status({ref}) answered about another object ({answer.provider_ref})"
    else:
        _record(report, "status_settles", True,
                f"status({ref}) answered completed after {polls} poll(s)")
        return ToolResult("completed", ref, answer.result, answer.version)
    _record(report, "status_settles", False, detail)
    return first


def _poll(status: Status, ref: str,
          timeout_s: float) -> tuple[ToolResult | None, Exception | None, int]:
    """Ask ``status(ref)`` until it stops saying accepted, it fails, or time runs out."""
    deadline = time.monotonic() + timeout_s
    delay, polls = 0.1, 0
    while True:
        polls += 1
        answer, error = _attempt(lambda: status(ref))
        left = deadline - time.monotonic()
        if (error is not None or answer is None
                or answer.outcome is not EffectAttemptOutcome.ACCEPTED or left <= 0):
            return answer, error, polls
        time.sleep(min(delay, left))
        delay = min(delay * 2, 2.0)


def _check_lookup(tool: Tool, first: ToolResult, report: ToolReport) -> None:
    if tool.lookup is None:
        why = ("no lookup declared; after a lost response onward "
               + ("resends with the same key (honours_key)" if tool.honours_key
                  else "parks the run for a person (effect_outcome_unknown)"))
        _skip(report, "lookup_finds_created", why)
        _skip(report, "lookup_unknown_missing", "no lookup declared")
        return
    lookup = tool.lookup
    found, error = _attempt(lambda: lookup(report.key))
    _record(report, "lookup_finds_created", *_judge_found(first, found, error, report.key))
    missing, error = _attempt(lambda: lookup(report.unknown_key))
    if error is not None:
        _record(report, "lookup_unknown_missing", False,
                f"lookup of a key never sent raised {_describe(error)}; it must return None, "
                "or onward can never send an effect whose first attempt was lost before "
                "reaching the provider")
    elif missing is not None:
        _record(report, "lookup_unknown_missing", False,
                f"lookup of a key never sent returned object {missing.provider_ref or '?'}; "
                "onward would record an effect as done that never happened")
    else:
        _record(report, "lookup_unknown_missing", True, "lookup of a key never sent: None")


def _judge_found(first: ToolResult, found: ToolResult | None, error: Exception | None,
                 key: str) -> tuple[bool, str]:
    consequence = "after a lost response onward would send again and create a duplicate"
    if error is not None:
        return False, (f"lookup(key) raised {_describe(error)} for the key the call just "
                       f"sent (object {first.provider_ref} exists); onward cannot reconcile")
    if found is None:
        return False, (f"lookup(key) returned nothing for the key the call just sent "
                       f"({key[:16]}…), although object {first.provider_ref} exists: "
                       f"{consequence}. Does the call send the key, and does lookup search "
                       "by it?")
    if found.provider_ref != first.provider_ref:
        return False, (f"lookup(key) returned object {found.provider_ref}, but the call "
                       f"created {first.provider_ref} with that key: onward would record "
                       "the wrong object as this effect's outcome")
    return True, f"lookup(key) found {found.provider_ref} ({found.status})"


def _check_same_key(tool: Tool, sample: dict[str, Any], first: ToolResult,
                    report: ToolReport) -> None:
    if not tool.honours_key:
        _skip(report, "same_key_one_object",
              "not declared (honours_key=False): onward never resends this tool blindly")
        return
    again, error = _attempt(lambda: tool.call(sample, report.key))
    if again is not None and again.provider_ref not in report.objects and again.provider_ref:
        report.objects.append(again.provider_ref)
    if error is not None:
        detail = (f"the same key and payload again raised {_describe(error)}; onward resends "
                  "blindly after a lost response and would record "
                  + ("this effect failed although the object exists"
                     if isinstance(error, ToolError) and not error.retryable
                     else "the outcome as unknown again")
                  + ". A provider that honours keys answers with the original object")
        _record(report, "same_key_one_object", False, detail)
    elif again is None or again.provider_ref != first.provider_ref:
        ref = again.provider_ref if again else None
        _record(report, "same_key_one_object", False,
                f"the same key twice gave object {ref} after {first.provider_ref}: the "
                "provider does not deduplicate by this key, yet the tool declares honours_key"
                f" ({tool.tool_class.value}); onward would resend after a lost response and "
                "duplicate. Send the key, or declare honours_key=False and give a lookup")
    else:
        _record(report, "same_key_one_object", True,
                f"the same key again answered with {again.provider_ref}")


def _check_key_reuse(tool: Tool, sample: dict[str, Any], other: dict[str, Any] | None,
                     first: ToolResult, report: ToolReport) -> None:
    if not tool.refuses_key_reuse:
        _skip(report, "key_reuse_refused", "not declared (refuses_key_reuse=False)")
        return
    changed = other if other is not None else vary(sample)
    if changed is None or changed == sample:
        _skip(report, "key_reuse_refused", "no other payload: give --other-payload JSON")
        return
    answer, error = _attempt(lambda: tool.call(changed, report.key))
    if isinstance(error, ToolError) and not error.retryable:
        _record(report, "key_reuse_refused", True, f"refused: {_short(str(error))}")
        return
    if answer is not None and answer.provider_ref and answer.provider_ref not in report.objects:
        report.objects.append(answer.provider_ref)
    if error is not None:
        detail = (f"the same key with another payload raised {_describe(error)}, which "
                  "onward reads as 'try again', not as a refusal (raise ToolError("
                  "retryable=False) for the provider's 409/422)")
    elif answer is not None and answer.provider_ref == first.provider_ref:
        detail = (f"the same key with another payload answered with the original object "
                  f"{first.provider_ref}: the changed request was dropped silently")
    else:
        detail = (f"the same key with another payload created object "
                  f"{answer.provider_ref if answer else None}: the provider does not tie "
                  "the key to its request")
    _record(report, "key_reuse_refused", False, detail)


def _check_simulate(tool: Tool, sample: dict[str, Any], report: ToolReport) -> None:
    if tool.simulate is None:
        _skip(report, "simulate_answers", "no simulate declared (simulation replays refuse)")
        return
    simulate = tool.simulate
    answer, error = _attempt(lambda: simulate(sample, report.key))
    if error is not None or answer is None:
        _record(report, "simulate_answers", False,
                f"simulate raised {_describe(error)}" if error else "simulate returned None")
    else:
        _record(report, "simulate_answers", True, f"simulate answered {answer.status}")


def vary(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The payload with its first number, text or flag changed (None if it has none)."""
    for name, value in payload.items():
        if isinstance(value, bool):
            return {**payload, name: not value}
        if isinstance(value, int | float):
            return {**payload, name: value + 1}
        if isinstance(value, str):
            return {**payload, name: value + " (changed)"}
    return None


def _describe(error: Exception | None) -> str:
    return "nothing" if error is None else f"{type(error).__name__}: {_short(str(error))}"


def _short(value: Any, width: int = 200) -> str:
    text = str(value)
    return text if len(text) <= width else text[:width] + f"… ({len(text)} characters)"
