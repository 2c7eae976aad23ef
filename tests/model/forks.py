"""The model test's rules for forks of a run: replays (evidence, simulation, live) and
branches (docs/operating.md, "Replay" and "Branch"; docs/design.md section 8).

``replay`` and ``branch``: a person forks any run from any of its checkpoints (a live
replay or a branch may allow irreversible effects, or effects of unknown outcome).
``fork_beside_unknown``: a run's first step makes an effect and leaves its outcome unknown
(its worker killed after the provider acted, its answer lost, its call still in flight on a
worker stopped in it...) or known, and a person replays it live or branches it from its
start, so the fork would make that effect again. ``fork_beside_open``: the same from any
effect not resolved yet that the other rules left (pending or accepted), from its
checkpoint or one before.

What the model expects, checked by tests/model/invariants.py after every rule:

* ``forks_resend_nothing``: a fork never sends what its copied history sent (no provider
  object of a fork for an intent before the state it starts from); an evidence replay calls
  nothing (no provider object, no model call), a simulation nothing real; a live replay or a
  branch not allowed irreversible effects sends none;
* ``forks_refused_beside_unknown``: a live replay or branch is started, without
  ``allow_unresolved``, only if the provider neither holds nor has in flight a call of an
  effect of the parent's at or after the fork's seq that the ledger does not know completed
  (the fork's call, under keys of its own, would make it a second time); a fork refused for
  effects of unknown outcome was not allowed them, and a refused fork writes nothing (no
  run, checkpoint, outbox row, approval or effect);
* ``verify_clean`` verifies each fork as it verifies every run.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, multiple, precondition, rule

from ledger.api import REFUSALS
from ledger.vocabulary import LaunchMode
from tests.model import conditions, interleavings
from tests.model.invariants import CALLS_AGAIN, Fork
from tests.model.machine import MachineParts

__all__ = ["UNRESOLVED_REFUSAL", "Forks"]

REPLAY_MODES = [m.value for m in (LaunchMode.EVIDENCE, LaunchMode.SIMULATION, LaunchMode.LIVE)]
# a first step that makes an effect (a tool with a lookup, an idempotent one, one with
# neither, a slow one; an async step making two at once), and how its outcome is left
# (interleavings.py's ways, and the call left in flight, or answered)
SENDS = ["crm", "mail", "blind", "crm_slow", "pair"]
LEFT_BY = [*interleavings.LEFT_BY, "hang", "answer"]
UNRESOLVED_REFUSAL = "whose outcome at the provider is unknown"
"""How a fork's refusal for the parent's effects of unknown outcome reads (ledger/forks.py)."""
# what a refused fork must not have written
_WRITTEN = """
    SELECT (SELECT count(*) FROM onward.runs), (SELECT count(*) FROM onward.checkpoints),
           (SELECT count(*) FROM onward.outbox), (SELECT count(*) FROM onward.approvals),
           (SELECT count(*) FROM onward.effects)"""
# the parent's effects at or after the fork's seq the ledger has not closed, among the keys
# the provider holds an object for or has a call of in flight
_AT_RISK = """
    SELECT effect_type, left(effect_id, 16), seq, status FROM onward.effects
     WHERE run_id = %s AND seq >= %s AND status IN ('pending', 'accepted')
       AND effect_id = ANY(%s) ORDER BY seq, effect_id"""
# runs with an effect not resolved yet, and the seq of its step
_OPEN_EFFECTS = """
    SELECT DISTINCT run_id, seq FROM onward.effects WHERE status IN ('pending', 'accepted')"""


class Forks(MachineParts):
    """Rules mixed into tests/model/test_protocol.py's ProtocolMachine."""

    @rule(target=Bundle("runs"), run=Bundle("runs"), pick=st.integers(0, 15),
          mode=st.sampled_from(REPLAY_MODES), allow_irreversible=st.booleans(),
          allow_unresolved=st.booleans(), reset=st.booleans())
    def replay(self, run: UUID, pick: int, mode: str, allow_irreversible: bool,
               allow_unresolved: bool, reset: bool) -> Any:
        seq = self._fork_seq(run, pick)
        if seq is None:
            return multiple()
        live = mode == LaunchMode.LIVE.value
        return self._fork(run, seq, LaunchMode(mode), allow_irreversible=allow_irreversible
                          and live, allow_unresolved=allow_unresolved and live, reset=reset)

    @rule(target=Bundle("runs"), run=Bundle("runs"), pick=st.integers(0, 15),
          allow_irreversible=st.booleans(), allow_unresolved=st.booleans())
    def branch(self, run: UUID, pick: int, allow_irreversible: bool,
               allow_unresolved: bool) -> Any:
        seq = self._fork_seq(run, pick)
        if seq is None:
            return multiple()
        return self._fork(run, seq, LaunchMode.BRANCH, allow_irreversible=allow_irreversible,
                          allow_unresolved=allow_unresolved)

    @precondition(conditions.idle_worker)
    @rule(target=Bundle("runs"), op=st.sampled_from(SENDS), left_by=st.sampled_from(LEFT_BY),
          branch=st.booleans(), allow_irreversible=st.booleans(),
          allow_unresolved=st.booleans())
    def fork_beside_unknown(self, op: str, left_by: str, branch: bool,
                            allow_irreversible: bool, allow_unresolved: bool) -> Any:
        """A run's first step makes an effect and leaves its outcome unknown (``left_by``:
        killed after the provider acted, after the intent, after recording; the answer lost;
        killed in a hung call, acted or not; ``hang``: the call still in flight, its worker
        left stopped in it) or known (``answer``); a person then replays it live or branches
        it from its start: refused, writing nothing, while the outcome is unknown, unless
        ``allow_unresolved`` (``forks_refused_beside_unknown``)."""
        run_id = self.start([op, "mail"], "none")  # type: ignore[attr-defined]
        if not isinstance(run_id, UUID):
            return multiple()
        self.env.stats[f"fork_beside_{left_by}"] += 1
        self.dispatcher.sweep(crash_before_mark=False)
        worker = self._idle()  # type: ignore[attr-defined]
        message = self._message_of(run_id)  # type: ignore[attr-defined]
        if worker is not None and message is not None and op == "pair":
            self._record(worker, worker.deliver(message, 0))  # type: ignore[attr-defined]
            message = self._message_of(run_id)  # type: ignore[attr-defined]
        if worker is not None and message is not None:
            self._leave(worker, message, left_by)
        forked = self._fork(run_id, 0, LaunchMode.BRANCH if branch else LaunchMode.LIVE,
                            allow_irreversible=allow_irreversible,
                            allow_unresolved=allow_unresolved)
        return multiple(run_id, forked) if isinstance(forked, UUID) else run_id

    @precondition(conditions.open_effect)
    @rule(target=Bundle("runs"), pick=st.integers(0, 15), earlier=st.integers(0, 3),
          branch=st.booleans(), allow_irreversible=st.booleans(),
          allow_unresolved=st.booleans())
    def fork_beside_open(self, pick: int, earlier: int, branch: bool,
                         allow_irreversible: bool, allow_unresolved: bool) -> Any:
        """A live replay or branch of a run with an effect not resolved yet (as the other
        rules left it: a worker stopped in its call, a lost answer, a run parked), from the
        checkpoint of that effect's step or ``earlier`` ones before it."""
        found = sorted(self.env.checker.execute(_OPEN_EFFECTS).fetchall(),
                       key=lambda row: (self._rank(row[0]), row[1]))  # type: ignore[attr-defined]
        if not found:
            return multiple()
        run, effect_seq = found[pick % len(found)]
        seqs = [row[0] for row in self.env.checker.execute(
            "SELECT seq FROM onward.checkpoints WHERE run_id = %s AND seq <= %s ORDER BY seq",
            (run, effect_seq))]
        if not seqs:
            return multiple()
        self.env.stats["fork_beside_open"] += 1
        seq = seqs[max(len(seqs) - 1 - earlier, 0)]
        return self._fork(run, seq, LaunchMode.BRANCH if branch else LaunchMode.LIVE,
                          allow_irreversible=allow_irreversible,
                          allow_unresolved=allow_unresolved)

    # -- helpers ---------------------------------------------------------------------------
    def _leave(self, worker: Any, message: tuple[UUID, int], left_by: str) -> None:
        """Deliver the run's first step, its effect's outcome left as ``left_by`` says."""
        if left_by == "answer":
            self.world.provider.script.clear()
            self.env.crashes.clear()
            self._record(worker, worker.deliver(message, 0))  # type: ignore[attr-defined]
        elif left_by == "hang":
            self.world.provider.script.clear()
            self.world.provider.script.append("hang")
            self.env.crashes.clear()
            self._record(worker, worker.deliver(message, 0))  # type: ignore[attr-defined]
        else:
            self._first_attempt(worker, message, left_by)  # type: ignore[attr-defined]

    def _fork_seq(self, run_id: UUID, pick: int) -> int | None:
        seqs = [row[0] for row in self.env.checker.execute(
            "SELECT seq FROM onward.checkpoints WHERE run_id = %s ORDER BY seq", (run_id,))]
        return seqs[pick % len(seqs)] if seqs else None

    def _fork(self, run: UUID, seq: int, mode: LaunchMode, *, allow_irreversible: bool,
              allow_unresolved: bool, reset: bool = False) -> Any:
        """Replay or branch ``run`` from checkpoint ``seq``; what the provider showed of the
        parent's effects then, and what a refusal wrote, are checked here."""
        at_risk = self._at_risk(run, seq)
        written = self.env.checker.execute(_WRITTEN).fetchone()
        how = "branch" if mode is LaunchMode.BRANCH else f"{mode.value} replay"
        try:
            if mode is LaunchMode.BRANCH:
                launched = self.ledger.branch(
                    run, seq, [{"op": "replace", "path": "/tag", "value": f"branch of {seq}"}],
                    "model test: branch", allow_irreversible=allow_irreversible,
                    allow_unresolved=allow_unresolved)
            else:
                launched = self.ledger.replay(
                    run, seq, mode, "model test: replay",
                    budgets="reset" if reset else "inherited",
                    allow_irreversible=allow_irreversible, allow_unresolved=allow_unresolved)
        except REFUSALS as exc:
            self._refused(run, seq, how, exc, written, allow_unresolved)
            return multiple()
        if at_risk and mode in CALLS_AGAIN and not allow_unresolved:
            self.world.note("fork", f"a {how} of run {run} from checkpoint {seq} was started "
                            "without allow_unresolved while the provider held or had in "
                            f"flight these of the parent's effects, not known completed: "
                            f"{at_risk}")
        self._copied_from(run, seq, how)
        self._book(launched.run_id, self.book.notes[run])  # type: ignore[attr-defined]
        self.book.forks[launched.run_id] = Fork(run, seq, self._start_pc(launched.run_id),
                                                mode, allow_irreversible)
        self.env.stats["branches" if mode is LaunchMode.BRANCH else "replays"] += 1
        if at_risk and allow_unresolved:
            self.env.stats["forks_allowed_unresolved"] += 1
        return launched.run_id

    def _at_risk(self, run: UUID, seq: int) -> list[tuple[Any, ...]]:
        """The parent's effects at or after ``seq`` that the provider holds an object for, or
        has a call of in flight, which the ledger has not closed: their outcome is unknown
        to it (``tampered`` runs aside: an edit can make a completed effect look open)."""
        provider = self.world.provider
        keys = {o.key for o in provider.objects if o.run_id == run} | \
            {call.key for call in provider.hung.values() if call.run_id == run}
        if not keys or run in self.book.tampered:
            return []
        return [tuple(row) for row in self.env.checker.execute(
            _AT_RISK, (run, seq, sorted(keys))).fetchall()]

    def _refused(self, run: UUID, seq: int, how: str, exc: Exception,
                 written: Any, allow_unresolved: bool) -> None:
        self.env.stats["forks_refused"] += 1
        if UNRESOLVED_REFUSAL in str(exc):
            self.env.stats["forks_refused_unresolved"] += 1
            if allow_unresolved:
                self.world.note("fork", f"a {how} of run {run} from checkpoint {seq}, allowed "
                                f"effects of unknown outcome, was refused for them: {exc}")
        now = self.env.checker.execute(_WRITTEN).fetchone()
        if now != written:
            self.world.note("fork", f"a refused {how} of run {run} from checkpoint {seq} "
                            f"wrote rows (runs, checkpoints, outbox, approvals, effects "
                            f"{written} -> {now}): {type(exc).__name__}: {exc}")

    def _start_pc(self, run_id: UUID) -> int | None:
        """Where the fork's plan starts: its first checkpoint's ``pc``."""
        checkpoints = self.ledger.checkpoints(run_id)
        state = checkpoints[0].state if checkpoints else None
        pc = state.get("pc") if isinstance(state, dict) else None
        return pc if isinstance(pc, int) else None

    def _copied_from(self, run: UUID, seq: int, how: str) -> None:
        """A copy is made only from a checkpoint whose chain verifies (``tampering_detected``)."""
        edited = self.book.tampered_checkpoints.get(run)
        if edited is not None and edited <= seq:
            self.world.note("tampered_copy", f"run {run}: a {how} was made from checkpoint "
                            f"{seq}, though checkpoint {edited} was edited in the database")
