"""The model test's rule for an edit of signed history made in the database without the key
(docs/security.md, "MACs, the hash chain and the audit chain"; docs/guarantees.md, "What an
edit leads to"; docs/design.md section 13 invariant 5).

``tamper``: someone with write access to the database, not the MAC key, edits a signed
value in place: a checkpoint's state (its ``tag``, which every step body reads), a recorded
model answer's text, an effect's result, or a completed effect's status (made to look never
sent). ``head``: preferably a row of the step a run has not committed yet (the one its next
claim or retry reads), else any row.

What the model expects, checked by tests/model/invariants.py:

* ``tampered_never_read``: no step body is ever handed a value the rule wrote (the flows
  check their state, answers and effect results for ``flows.TAMPERED``); a tampered effect
  made to look unsent is never sent again (``one_object_per_effect``);
* ``tampering_detected``: ``verify`` reports every tampered run (``verify_clean`` leaves
  them out); a run whose head checkpoint was tampered never moves past it, and once parked
  is parked ``integrity`` (or for what parks a claim before the head is read); a replay or
  branch is never made from a tampered checkpoint or one after it.
"""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.model import conditions
from tests.model.flows import TAMPERED
from tests.model.machine import MachineParts

__all__ = ["TAMPER_KINDS", "Tampering"]

# each: (rows that can be edited, the edit); a row is (run, seq, key) and the run's head seq
_ROWS = {
    "state": """
        SELECT c.run_id, c.seq, c.seq::text, r.seq
          FROM onward.checkpoints c JOIN onward.runs r ON r.id = c.run_id
         WHERE (c.state ? 'tag' AND jsonb_typeof(c.state->'tag') = 'string')
            OR jsonb_typeof(c.state_delta) = 'array'""",
    "answer": """
        SELECT e.run_id, e.seq, e.command_id, r.seq
          FROM onward.evidence e JOIN onward.runs r ON r.id = e.run_id
         WHERE jsonb_typeof(e.response->'text') = 'string'""",
    "effect_result": """
        SELECT f.run_id, f.seq, f.effect_type || ' ' || f.effect_id, r.seq
          FROM onward.effects f JOIN onward.runs r ON r.id = f.run_id
         WHERE f.status = 'completed' AND jsonb_typeof(f.result->'id') = 'string'""",
    "effect_unsent": """
        SELECT f.run_id, f.seq, f.effect_type || ' ' || f.effect_id, r.seq
          FROM onward.effects f JOIN onward.runs r ON r.id = f.run_id
         WHERE f.status = 'completed'""",
}
_EDITS = {
    "state": """
        UPDATE onward.checkpoints SET
               state = CASE WHEN state ? 'tag'
                            THEN jsonb_set(state, '{tag}', to_jsonb(:mark || (state->>'tag')))
                            ELSE state END,
               state_delta = CASE WHEN state ? 'tag' THEN state_delta
                                  ELSE state_delta || jsonb_build_array(jsonb_build_object(
                                       'op', 'replace', 'path', '/tag', 'value', :mark)) END
         WHERE run_id = :run AND seq = CAST(:key AS int)""",
    "answer": """
        UPDATE onward.evidence
           SET response = jsonb_set(response, '{text}', to_jsonb(:mark || (response->>'text')))
         WHERE run_id = :run AND command_id = :key""",
    "effect_result": """
        UPDATE onward.effects
           SET result = jsonb_set(result, '{id}', to_jsonb(:mark || (result->>'id')))
         WHERE run_id = :run AND effect_type || ' ' || effect_id = :key""",
    "effect_unsent": """
        UPDATE onward.effects SET status = 'unsent'
         WHERE run_id = :run AND effect_type || ' ' || effect_id = :key""",
}
TAMPER_KINDS = sorted(_ROWS)


class Tampering(MachineParts):
    """Rules mixed into tests/model/test_protocol.py's ProtocolMachine."""

    @precondition(conditions.has_refs)
    @rule(kind=st.sampled_from(TAMPER_KINDS), pick=st.integers(0, 15), head=st.booleans())
    def tamper(self, kind: str, pick: int, head: bool) -> None:
        """Someone without the MAC key edits a signed row in the database (``kind``); the
        run must be stopped where onward would act on it, and ``verify`` must name it."""
        with self._timed("tamper"):  # type: ignore[attr-defined]
            rows = sorted((r for r in self.env.checker.execute(_ROWS[kind]).fetchall()
                           if r[0] not in self.book.unreadable),  # parked invalid_control
                          key=lambda r: (self._rank(r[0]), r[1], r[2]))  # type: ignore[attr-defined]
            at_head = [r for r in rows if r[1] == r[3]]
            rows = at_head if head and at_head else rows
            if not rows:
                return
            run_id, seq, key, head_seq = rows[pick % len(rows)]
            self._tamper(kind, run_id, seq, key, head_seq)

    def _tamper(self, kind: str, run_id: UUID, seq: int, key: str, head_seq: int) -> None:
        with self.ledger.engine.begin() as conn:
            conn.execute(sa.text(_EDITS[kind]), {"run": run_id, "key": key,
                                                 "mark": f"{TAMPERED} "})
        self.book.tampered.setdefault(run_id, []).append(f"{kind} {key[:40]} at seq {seq}")
        self.book.tamper_checked.pop(run_id, None)
        if kind == "state":
            self.book.tampered_checkpoints[run_id] = min(
                seq, self.book.tampered_checkpoints.get(run_id, seq))
            if seq == head_seq:
                self.book.tampered_heads.setdefault(run_id, seq)
        self.env.stats[f"tampered_{kind}{'_head' if seq == head_seq else ''}"] += 1
