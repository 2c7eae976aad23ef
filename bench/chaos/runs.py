"""The workload: runs started in waves, and how far they got."""

from __future__ import annotations

import sqlalchemy as sa

from bench.chaos.agent import MAX_ATTEMPTS, WORKFLOW
from bench.chaos.log import log
from bench.chaos.state import Chaos


def start_runs(c: Chaos, arg: tuple[int, int]) -> None:
    """Runs ``first .. first + count - 1`` (an idempotency key each: a wave tried again
    after a database error starts none twice)."""
    first, count = arg
    ids = []
    for i in range(first, first + count):
        blind_at = c.blind_plan.get(i, -1)
        run_id = c.servers.ledger.start_run(
            WORKFLOW,
            {"steps": c.cfg.steps, "blind_at": blind_at, "pause_ms": c.cfg.pause_ms},
            idempotency_key=f"chaos:{c.cfg.seed}:{c.servers.db_name}:{i}",
            max_attempts=MAX_ATTEMPTS,
        )
        ids.append(run_id)
        if blind_at >= 0:
            c.blind[run_id] = blind_at
    c.run_ids.extend(ids)
    log(f"t={c.now():5.1f}s started runs {first}..{first + count - 1} "
        f"({len(c.run_ids)}/{c.cfg.runs})")


def status_counts(c: Chaos) -> dict[str, int]:
    with c.servers.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT status, count(*), coalesce(sum(seq), 0) FROM onward.runs "
            "WHERE id = ANY(:ids) GROUP BY 1"), {"ids": c.run_ids}).all()
    counts = {status: int(n) for status, n, _ in rows}
    counts["steps"] = sum(int(s) for _, _, s in rows)
    return counts


def progress(c: Chaos) -> dict[str, int]:
    counts = status_counts(c)
    fired = len(c.fleet.fired())
    log(f"t={c.now():5.1f}s runs {len(c.run_ids)}/{c.cfg.runs}: "
        f"completed {counts.get('completed', 0)}, running {counts.get('running', 0)}, "
        f"parked {counts.get('needs_review', 0)}, failed {counts.get('failed', 0)}; "
        f"steps {counts['steps']}/{c.cfg.runs * c.cfg.steps}; "
        f"kills {sum(c.tally.kills.values()) + fired} (points fired {fired}); "
        f"workers ready {len(c.fleet.workers_ready())}")
    return counts
