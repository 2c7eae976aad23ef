"""Replay one recorded run against candidate code, in this process, on the scratch ledger
(docs/corpus.md#how-a-run-is-replayed).

The replay is an ordinary evidence replay (ledger/forks.py) from the run's first
checkpoint, executed step by step through the real executor (``execute_step``, as a
worker would, with no broker): model calls and reads are answered from the recorded
evidence, effects from the effect log (nothing is sent), approvals and signals from what
was decided. Each step runs with the workflow version the recorded step ran with when the
candidate code has it (so a run that migrated between versions migrates at the same step),
otherwise with the candidate's code for the workflow (its latest version, or the one the
replay is bound to).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID

from ledger import Ledger
from ledger.audit import Actor
from ledger.corpus_history import History, read_history_txn, recorded_request_txn
from ledger.crypto import REQUEST_FIELD, open_value
from ledger.db import wrap_driver_errors
from ledger.forks import BudgetPolicy, ForkRequest, fork_txn
from ledger.steps import StepStore
from ledger.verify import verify_run_txn
from ledger.vocabulary import LaunchMode, OutcomeKind, Role, RunStatus
from tasks.corpus.compare import Finding, Kind, Requests, Verdict, compare, opened
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, execute_step
from tasks.workflow import Registry

__all__ = ["ACTOR", "WORKER", "ReplayOptions", "Replayer", "RunOutcome", "verify_runs"]


WORKER = "corpus-replay"
ACTOR = "corpus-replay"


@dataclass(frozen=True)
class ReplayOptions:
    """How a corpus is replayed; plain JSON, so it crosses to worker processes as text."""

    modules: tuple[str, ...]
    versions: str = "recorded"  # recorded: the recorded step's version when the code has it
    ignore: tuple[str, ...] = ()  # JSON pointers left out of states and results
    label: str = ""  # what is replayed (corpus or file), for the replays' launch reason
    # a request that differs is shown opened when sealed (``--show-sealed``: a reader allowed
    # to see sealed values asked, audited); otherwise by its hash
    show_sealed: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayOptions:
        return cls(tuple(data["modules"]), data["versions"], tuple(data["ignore"]),
                   data.get("label", ""), bool(data.get("show_sealed", False)))


@dataclass(frozen=True)
class RunOutcome:
    """What the replay of one recorded run came to."""

    run_id: str
    workflow: str
    recorded_version: int | None
    recorded_status: str
    steps_recorded: int
    replay_run_id: str | None = None
    replayed_version: int | None = None
    replay_status: str | None = None
    steps_replayed: int = 0
    identical: bool = False
    finding: dict[str, Any] | None = None
    note: str | None = None
    same_effect_keys: bool = True
    seconds: float = 0.0

    @property
    def kind(self) -> str | None:
        return str(self.finding["kind"]) if self.finding else None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOutcome:
        return cls(**data)


class Replayer:
    """Everything one process needs to replay runs of the scratch ledger."""

    def __init__(self, ledger: Ledger, options: ReplayOptions) -> None:
        self.ledger = ledger
        self.options = options
        self.registry = Registry()
        self.registry.load_modules(list(options.modules))
        self._only: dict[tuple[str, int], Registry] = {}
        settings = ledger.settings
        self.store = StepStore(ledger.url, ledger.keys, lease_ttl_s=600.0)
        self.config = ExecutorConfig(
            keys=ledger.keys, max_state_bytes=settings.max_state_bytes, retry_base_s=0.0,
            retry_max_s=0.0, max_artifact_bytes=settings.max_artifact_bytes,
            max_json_depth=settings.max_json_depth,
            max_effect_payload_bytes=settings.max_effect_payload_bytes,
            max_approval_artifact_bytes=settings.max_approval_artifact_bytes)

    def close(self) -> None:
        self.store.close()
        self.ledger.engine.dispose()

    def replay(self, run_id: UUID) -> RunOutcome:
        """Replay one recorded run and compare. The recorded run is not verified here: the
        caller verifies every run of the bundle (``verify_runs``) and reports nothing unless
        all verify; a replay calls nothing outside the scratch ledger meanwhile."""
        started = time.perf_counter()
        rec = self._history(run_id, with_tables=True)
        base = RunOutcome(str(run_id), rec.workflow, rec.workflow_version, rec.status,
                          len(rec.checkpoints))
        if not self.registry.versions(rec.workflow):
            finding = Finding(Kind.NO_CODE, f"{', '.join(self.options.modules)} defines no "
                              f"workflow {rec.workflow!r}: not replayed")
            return RunOutcome(**{**base.as_json(), "finding": _plain(finding)})
        replay_id, status = self._fork(rec)
        stopped_as_recorded = self._drive(rec, replay_id, {
            "seq": rec.first_seq, "status": status,
            "workflow_version": rec.checkpoints[rec.first_seq].workflow_version})
        crypt = self.ledger.keys.crypt  # sealed values compare opened, each at its place
        rep = opened(self._history(replay_id, with_tables=False), crypt, copied_from=run_id)
        verdict = compare(opened(rec, crypt), rep, ignore=self.options.ignore,
                          requests=self._requests(rec, replay_id),
                          stopped_as_recorded=stopped_as_recorded)
        return _outcome(base, rep, verdict, time.perf_counter() - started)

    # -- the recorded run ---------------------------------------------------------------------
    def _history(self, run_id: UUID, *, with_tables: bool) -> History:
        with wrap_driver_errors("reading a replay"), self.ledger.engine.connect() as conn:
            return read_history_txn(conn, run_id, with_tables=with_tables)

    def _requests(self, rec: History, replay_id: UUID) -> Requests:
        """How the report quotes the requests of a call that differs: sealed ones opened,
        each at its place, only with ``show_sealed``."""
        crypt = self.ledger.keys.crypt if self.options.show_sealed else None

        def recorded(kind: str, command_id: str) -> tuple[bool, Any]:
            with wrap_driver_errors("reading a request"), self.ledger.engine.connect() as conn:
                return recorded_request_txn(conn, rec.run_id, kind, command_id, crypt=crypt,
                                            tenant=rec.tenant_id)

        def replayed(value: Any, seq: int) -> Any:
            return open_value(crypt, value, tenant=rec.tenant_id, run_id=replay_id, seq=seq,
                              field=REQUEST_FIELD)

        return Requests(recorded, replayed if self.options.show_sealed else None)

    # -- the replay ---------------------------------------------------------------------------
    def _fork(self, rec: History) -> tuple[UUID, str]:
        actor = Actor(ACTOR, Role.ADMIN, rec.tenant_id)
        request = ForkRequest(rec.run_id, rec.first_seq, LaunchMode.EVIDENCE,
                              f"corpus replay of {self.options.label or 'a corpus'} against "
                              f"{', '.join(self.options.modules)}", BudgetPolicy.INHERITED)
        settings = self.ledger.settings
        with wrap_driver_errors("starting a replay"), self.ledger.engine.begin() as conn:
            launched = fork_txn(conn, self.ledger.keys, actor, request,
                                default_max_attempts=settings.step_max_attempts,
                                max_state_bytes=settings.max_state_bytes)
        return launched.run_id, launched.status.value

    def _drive(self, rec: History, run_id: UUID, row: dict[str, Any] | None) -> bool:
        """Execute the replay's steps until it stops; True when it was stopped where the
        recorded run was stopped by something its code did not decide (see ``_stop_at``).
        After a commit that goes straight on, the next seq and the version the step ran
        with are known; anything else reads where the run is."""
        stop_at = _stop_at(rec)
        for _ in range(4 * len(rec.checkpoints) + 20):  # a replay that loops is stopped
            if row is None or row["status"] != RunStatus.RUNNING.value:
                return False
            if stop_at is not None and row["seq"] >= stop_at:
                return True
            registry = self._registry_for(rec, row["seq"], row["workflow_version"])
            report = execute_step(self.store, registry, self.config,
                                  StepMessage(run_id=run_id, seq=row["seq"]), worker=WORKER,
                                  publish=lambda *args: None, count_stale=False)
            if report.kind is ReportKind.RELEASED:
                return False  # no code took it: the run's last_error says why
            if report.kind is ReportKind.STALE:
                time.sleep(0.002)  # a retry or timer due a moment from now
            ran = registry.versions(rec.workflow)
            if report.next_seq is not None and len(ran) == 1:
                row = {"seq": report.next_seq, "status": RunStatus.RUNNING.value,
                       "workflow_version": ran[0]}
            else:
                row = self._position(run_id)
        return False

    def _position(self, run_id: UUID) -> dict[str, Any] | None:
        return self.store.position(run_id)

    def _registry_for(self, rec: History, seq: int, bound: int | None) -> Registry:
        """The code the step after checkpoint ``seq`` runs with (see the module's doc)."""
        if self.options.versions != "recorded":
            return self.registry
        produced = rec.checkpoints.get(seq + 1)
        version = produced.workflow_version if produced is not None else rec.workflow_version
        if version is None or self.registry.get(rec.workflow, version) is None:
            return self.registry
        if bound is not None and bound > version:
            return self.registry
        key = (rec.workflow, version)
        if key not in self._only:
            only = Registry()
            workflow = self.registry.get(*key)
            assert workflow is not None
            only.register(workflow)
            self._only[key] = only
        return self._only[key]


def verify_runs(ledger: Ledger, run_ids: list[UUID]) -> dict[str, list[str]]:
    """Each run of the scratch ledger that does not verify, with its problems."""
    broken: dict[str, list[str]] = {}
    with wrap_driver_errors("verifying the bundle's runs"), ledger.engine.connect() as conn:
        for run_id in run_ids:
            problems = verify_run_txn(conn, ledger.keys, run_id)
            if problems:
                broken[str(run_id)] = [str(p) for p in problems]
    return broken


def _stop_at(rec: History) -> int | None:
    """The seq at which the replay stops without running the step: where the recorded run
    was stopped by something its code did not decide (a person cancelled it, a budget, a
    deadline, an approval or signal that ended it), so there is nothing recorded to follow.
    A run that failed by its code (an error, ``ctx.fail``) is replayed to its end."""
    if rec.status == RunStatus.CANCELLED.value:
        return rec.seq
    error = rec.last_error or {}
    head = rec.checkpoints.get(rec.seq)
    if rec.status == RunStatus.FAILED.value and error.get("reason") and (
            head is None or head.outcome != OutcomeKind.FAIL.value):
        return rec.seq
    return None


def _outcome(base: RunOutcome, rep: History, verdict: Verdict, seconds: float) -> RunOutcome:
    return RunOutcome(**{
        **base.as_json(), "replay_run_id": str(rep.run_id),
        "replayed_version": rep.workflow_version, "replay_status": rep.status,
        "steps_replayed": len(rep.checkpoints), "identical": verdict.identical,
        "finding": _plain(verdict.finding) if verdict.finding else None, "note": verdict.note,
        "same_effect_keys": verdict.recorded_effects == verdict.replayed_effects,
        "seconds": round(seconds, 4)})


def _plain(finding: Finding) -> dict[str, Any]:
    data = asdict(finding)
    data["kind"] = finding.kind.value
    data["diff"] = list(finding.diff)
    return data
