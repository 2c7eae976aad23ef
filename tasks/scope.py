"""What every call a step makes through ``ctx`` shares (docs/design.md section 5): the
step's identity and lease, its ``command_id``s, the references its checkpoint binds, the
run's launch and budgets, and the decisions its body must not swallow (``Control``,
tasks/control.py). ``StepServices`` (tasks/services.py) is this scope with effect calls
(tasks/effect_calls.py), evidence calls (tasks/evidence_calls.py), limits and retries
(tasks/call_limits.py) and replay answers (tasks/replay_answers.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import structlog

from ledger.checkpoints import canonical_json, sha256_hex
from ledger.effects import EffectStore
from ledger.evidence import Evidence, EvidenceStore
from ledger.exceptions import CancelRequested, IntegrityViolation, InvalidInput
from ledger.limits import LimitStore, RetryStore
from ledger.lineage import Launch, LineageStore
from ledger.steps import lease_clock
from ledger.vocabulary import ParkReason, Priority, ToolClass
from ledger.waits import WaitStore
from tasks import credentials
from tasks.clock import StepClock
from tasks.control import CancelFor, Control, Suspend
from tasks.exceptions import OutcomeError
from tasks.limits import declared_limits
from tasks.llm import LLMClient
from tasks.retry import RetryPolicy, default_policy
from tasks.tools import Tool

__all__ = ["StepScope", "call_error", "effect_id_for", "request_hash_of"]


T = TypeVar("T")
log = structlog.get_logger("onward.services")


def effect_id_for(run_id: UUID, effect_type: str, command_id: str) -> str:
    """``sha256(run_id : effect type : command_id)``: the provider's idempotency key."""
    return hashlib.sha256(f"{run_id}:{effect_type}:{command_id}".encode()).hexdigest()


def request_hash_of(payload: Any) -> str:
    try:
        return sha256_hex(canonical_json(payload))
    except InvalidInput as exc:
        raise OutcomeError(f"effect payload is not plain JSON: {exc}") from exc


def call_error(exc: BaseException) -> dict[str, Any]:
    """An error as an attempt or a retry count records it: redacted, without NUL."""
    message = credentials.redact(str(exc))[:2000].replace("\x00", "\\0")  # no NUL in PG
    error: dict[str, Any] = {"type": type(exc).__name__, "message": message}
    status_code = getattr(exc, "status_code", None)
    if status_code is not None:
        error["status_code"] = status_code
    return error


class StepScope:
    """One execution of one step: what its calls share."""

    def __init__(self, *, effects: EffectStore, evidence: EvidenceStore, run_id: UUID,
                 tenant_id: str, seq: int, step: str, epoch: int, worker: str,
                 llm_client: LLMClient | None, control: dict[str, Any] | None = None,
                 tokens_left: int | None = None, cost_left_usd: float | None = None,
                 spent: dict[str, Any] | None = None, launch: Launch | None = None,
                 clock: StepClock, max_effect_payload_bytes: int | None = None,
                 max_json_depth: int | None = None, tool_timeout_s: float = 30.0,
                 lease_margin_s: float = 5.0, model_timeout_s: float = 120.0,
                 priority: Priority = Priority.NORMAL, limit_poll_s: float = 5.0,
                 claim_covers_until: float | None = None) -> None:
        self.effects = effects
        self.evidence = evidence
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.seq = seq
        self.step = step
        self.epoch = epoch
        self.worker = worker
        self.launch = launch or Launch()
        self.clock = clock
        self.priority = Priority(priority)
        self.max_effect_payload_bytes = max_effect_payload_bytes
        self.max_json_depth = max_json_depth
        self.tool_timeout_s = tool_timeout_s
        self.lease_margin_s = lease_margin_s
        self.limit_poll_s = limit_poll_s  # a throttled call asks again then, if not woken
        # until when (ledger.steps.lease_clock()) the claim's lease lasts, when the claim
        # found no answer recorded or refused at this seq: the step's first call may use it
        self._claim_covers_until = claim_covers_until
        self._open_stores(effects)
        self._start_budgets(tokens_left, cost_left_usd, spent)
        self._start_records(control)
        self._configure_model(llm_client, model_timeout_s)

    def _open_stores(self, effects: EffectStore) -> None:
        """The ledger stores the step's calls use besides effects and evidence, on the
        effect store's connection."""
        self.lineage = LineageStore(effects.conn)
        self.waits = WaitStore(effects.conn)
        self.retries = RetryStore(effects.conn, effects.keys.crypt)
        self.limits = LimitStore(effects.conn)

    def _start_budgets(self, tokens_left: int | None, cost_left_usd: float | None,
                       spent: dict[str, Any] | None) -> None:
        """What the run may still spend, what it had spent when the step was claimed, and
        the step's own usage (none yet)."""
        self.tokens_left = tokens_left
        self.cost_left_usd = cost_left_usd
        self.spent = spent or {}
        self.usage_tokens = 0
        self.usage_cost_usd = 0.0

    def _start_records(self, control: dict[str, Any] | None) -> None:
        """What the step's calls record as they go (empty): its decisions, its command
        ordinal, the evidence and effects its checkpoint binds, the tools it used and the
        outcomes it left unknown; ``control`` is the wait control of the checkpoint it
        resumes from."""
        self.control = Control()
        self.checkpoint_control = control or {}
        self._ordinal = 0
        self._last_command = ""
        self._evidence_refs: list[dict[str, Any]] = []
        self._effect_refs: list[dict[str, Any]] = []
        self._source: UUID | None = None
        self._source_known = False
        self.tools_used: dict[str, Tool] = {}  # by name: what resolves effects if the run ends
        self.unknown: dict[str, str] = {}  # effect id -> tool: outcomes this step left unknown

    def _configure_model(self, llm_client: LLMClient | None, model_timeout_s: float) -> None:
        """The model client, its call time limit, its declared limits and its retry policy."""
        self.llm_client = llm_client
        # a model call's time limit: the client's own (``timeout_s``), else the default
        self.model_timeout_s = float(getattr(llm_client, "timeout_s", None) or model_timeout_s)
        self.model_limits = declared_limits(llm_client)
        model_retry = getattr(llm_client, "retry", None)
        self.model_retry = (model_retry if isinstance(model_retry, RetryPolicy)
                            else default_policy(ToolClass.READ))

    def command_id(self, key: str | None, position: int | None = None) -> str:
        """The call's intent, stable across retries of this step: step, seq, ordinal or key.
        ``position`` is a keyless call's ordinal when its caller fixed it already (an async
        step's calls are numbered as the body makes them, tasks/aio.py); a plain step's
        calls are numbered here, as they are made."""
        if key is not None:
            self._last_command = f"{self.step}@{self.seq}:{key}"
        else:
            if position is None:
                self._ordinal += 1
                position = self._ordinal
            self._last_command = f"{self.step}@{self.seq}#{position}"
        return self._last_command

    def position_note(self, command_id: str) -> str:
        """For a call without ``key=`` whose record is for another request: why (it is named
        by its position) and what to do; nothing for a keyed call."""
        prefix = f"{self.step}@{self.seq}#"
        if not command_id.startswith(prefix):
            return ""
        return (f"; this call has no key=, so it is named by its position in the step "
                f"(#{command_id.removeprefix(prefix)}): an earlier attempt made another call "
                "there, its calls came in another order or number (code that changed, an "
                "order that depends on time or on concurrent tasks); give each call whose "
                "order can change a key= naming what it is for (docs/steps.md, \"Async "
                "steps\")")

    def refs(self, spent: dict[str, Any]) -> dict[str, Any]:
        """What the checkpoint this step commits binds under its MAC (docs/design.md section 9):
        the evidence and effects the step used, and the budgets it started with."""
        return {"evidence": self._evidence_refs, "effects": self._effect_refs, "budgets": spent}

    def cancelled(self, exc: CancelRequested) -> Suspend:
        """Record the operator's cancel on ``control`` (the body cannot swallow it)."""
        self.control.cancel(CancelFor(str(exc)))
        return Suspend()

    def claim_covers(self, cover_s: float) -> bool:
        """Whether the step's first outside call (model call, read or effect) may start
        without a statement before it: the claim found no answer recorded or refused at
        this seq, and its lease, counted from before the claim was sent, lasts ``cover_s``
        more (the call's time limit and the margin) on this host's ``lease_clock()`` (boot
        time, which also runs while the host is suspended). Asked
        once: every later call asks the ledger, so a cancel requested, or time passed,
        during an earlier call is seen before the next one (tasks/evidence_calls.py)."""
        until, self._claim_covers_until = self._claim_covers_until, None
        return until is not None and until - lease_clock() >= cover_s

    def timeout(self, tool: Tool) -> float:
        return tool.timeout_for(self.tool_timeout_s)

    def _verified(self, read: Callable[[], T]) -> T:
        """What ``read`` returns, unless it does not verify against its MAC: then the run is
        parked (integrity) and nothing is answered with the edited record."""
        try:
            return read()
        except IntegrityViolation as exc:
            self.control.park(ParkReason.INTEGRITY, exc)
            raise

    def _find(self, run_id: UUID, command_id: str) -> Evidence | None:
        """A recorded answer that verifies; one that does not parks the run (integrity):
        an edited record is never answered with, and nothing is asked again in its place."""
        return self._verified(lambda: self.evidence.find(run_id, command_id))
