"""What ``ctx.effect``, ``ctx.llm`` and ``ctx.read`` do: docs/design.md section 5, step by step.

Control flow that the step body must not be able to swallow (wait for an accepted effect,
park the run for review) is recorded on ``Control`` (tasks/control.py) before anything is
raised; the executor reads it after the body returns or raises, whatever the body caught.

Replays and branches (docs/design.md section 8) change where answers come from, by the run's
``Launch``: an **evidence** replay answers every call from its parent's records by
``command_id`` and calls nothing (a call without a matching record stops it as
``diverged``); a **simulation** runs each tool's ``simulate``; a **live** replay or a
**branch** calls for real but refuses irreversible effects unless explicitly allowed.
"""

from __future__ import annotations

from tasks.effect_calls import EffectCalls, overrun_guard, poll_delay
from tasks.evidence_calls import EvidenceCalls
from tasks.scope import effect_id_for, request_hash_of

__all__ = ["StepServices", "effect_id_for", "overrun_guard", "poll_delay", "request_hash_of"]


class StepServices(EffectCalls, EvidenceCalls):
    """Effects and evidence for one execution of one step: the scope it shares
    (tasks/scope.py), effect calls (tasks/effect_calls.py), model calls and reads
    (tasks/evidence_calls.py), their limits and retries (tasks/call_limits.py) and where a
    replay's answers come from (tasks/replay_answers.py)."""
