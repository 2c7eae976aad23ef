"""The claim's "answered at this seq?" is read through an index (migration 0045).

A claim says whether an earlier attempt recorded an answer at the claimed seq, so the step's
first model call can skip its look-up (ledger/sql/steps.sql ``claim``). Evidence's primary
key is (run_id, command_id), so without ``ix_evidence_run_seq`` that check walked every
evidence row of the run and filtered on seq: a claim's cost grew with the run's model calls.
The plan is read with sequential scans off (the test database is tiny, so the planner would
otherwise scan it whole whatever the indexes).
"""

from __future__ import annotations

import re
from typing import Any

from ledger import Ledger
from ledger.steps import Claim, StepStore
from tests.support.plans import explain, explaining


def _evidence_probes(url: str, query: str, params: dict[str, Any]) -> list[str]:
    """How the plan of ``query`` (bound to ``params``, not executed) reaches onward.evidence:
    one line per probe, with its index condition."""
    plan = explain(url, query, params, setup=("SET enable_seqscan = off",))
    probes = []
    for at, line in enumerate(plan):
        if re.search(r"Scan using \w+ on evidence\b", line):
            probes.append(" ".join(part.strip() for part in plan[at:at + 3]))
    return probes


def test_claim__reads_answered_at_its_seq_through_the_run_seq_index(ledger: Ledger) -> None:
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    probes: list[list[str]] = []
    explaining(store, "AS answered",
               lambda query, params: probes.append(_evidence_probes(ledger.url, query, params)))
    try:
        run_id = ledger.start_run("test_chain", {"steps": 1})
        assert isinstance(store.claim(run_id, 0, "w"), Claim)
    finally:
        store.close()
    assert len(probes) == 1, probes
    (claim_probes,) = probes
    assert claim_probes, "the claim's plan does not read evidence at all"
    for probe in claim_probes:
        assert "ix_evidence_run_seq" in probe and re.search(r"Index Cond:.*\bseq\b", probe), (
            f"evidence is read without (run_id, seq) as its index condition: {probe}")
