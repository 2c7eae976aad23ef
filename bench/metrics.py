"""What a Prometheus scrape of ``onward metrics`` costs on a big ledger.

    python bench/metrics.py [--steps 1000000] [--runs 200000] [--json]

Creates a database of its own on the server ONWARD_DATABASE_URL names (or the embedded
one) and fills it with bulk INSERT … SELECT (ledger/fill.py): ``--runs`` runs of two
workflows in a mix of statuses (9% running, 2% parked), 10,000 of them waiting for an
approval, one run of ``--steps`` committed steps (checkpoints and step executions), 1,000
effects pending or accepted, 500 restores, and the counters a fleet would have flushed.
Then it times the exporter's collect (every query of a scrape, in this process: the
ledger's time, not HTTP's), median of 15 after one warm-up, and EXPLAINs each query,
printing any sequential scan of a table over 10,000 rows. Prints ``{"scrape_ms": …}``
(with ``--json`` only that object, plus the fill times). Target: under 100 ms.
The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.databases import create_database, drop_database  # noqa: E402
from ledger import Ledger, OnwardSettings  # noqa: E402
from ledger import health as health_queries  # noqa: E402
from ledger.db import database_url  # noqa: E402
from ledger.fill import fill_approvals_txn, fill_long_run_txn, fill_runs_txn  # noqa: E402
from workers.metrics import LedgerCollector  # noqa: E402

TARGET_MS = 100.0
LONG_RUN = "01a00000-0000-7000-8000-00000000cafe"

_EFFECTS = """
INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, step, command_id,
                            tool_class, request_hash, status, updated_at)
SELECT 'e' || g, 'crm.create_offer', r.id, 'default', r.seq, 'send', 'send@' || g,
       'irreversible', repeat('a', 64), CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'accepted' END,
       onward.now() - make_interval(secs => g)
  FROM (SELECT id, seq, row_number() OVER () AS g FROM onward.runs
         WHERE status = 'running' LIMIT :n) r
"""

_RESTORES = """
UPDATE onward.step_attempts SET outcome = 'worker_lost'
 WHERE run_id = :run AND lease_epoch IN (SELECT generate_series(1, :n) * 1000)
"""

_TOTALS = """
INSERT INTO onward.metric_totals (workflow, version, metric, label, value)
SELECT w, v, m, l, 1000
  FROM unnest(ARRAY['research_agent', 'sales_offer_agent', 'long_agent']) AS w,
       generate_series(1, 3) AS v,
       unnest(ARRAY['steps_committed', 'stale_deliveries', 'step_seconds_count',
                    'step_seconds_sum']) AS m,
       unnest(ARRAY['']) AS l
UNION ALL
SELECT w, v, 'step_seconds_bucket', b::text, 10
  FROM unnest(ARRAY['research_agent', 'sales_offer_agent', 'long_agent']) AS w,
       generate_series(1, 3) AS v,
       unnest(ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0]) AS b
"""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fill(ledger: Ledger, runs: int, steps: int) -> dict[str, float]:
    took: dict[str, float] = {}
    for name, body in (
        ("runs", lambda c: fill_runs_txn(c, "default", runs)),
        ("approvals", lambda c: fill_approvals_txn(c, "default", 10_000)),
        ("steps", lambda c: fill_long_run_txn(c, "default", LONG_RUN, steps)),  # type: ignore[arg-type]
        ("effects", lambda c: c.execute(sa.text(_EFFECTS), {"n": 1000})),
        ("restores", lambda c: c.execute(sa.text(_RESTORES), {"run": LONG_RUN,
                                                              "n": min(500, steps // 1000)})),
        ("totals", lambda c: c.execute(sa.text(_TOTALS))),
    ):
        started = time.perf_counter()
        with ledger.engine.begin() as conn:
            body(conn)
        took[name] = round(time.perf_counter() - started, 2)
        log(f"filled {name} in {took[name]} s")
    with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))
    return took


def per_query_ms(ledger: Ledger) -> dict[str, float]:
    """Each scrape query alone, median of 5 (which one to index when a scrape is slow)."""
    out = {}
    with ledger.engine.connect() as conn:
        for name, query in _queries():
            times = []
            for _ in range(5):
                started = time.perf_counter()
                conn.execute(query, {"grace": 30.0, "within": 30.0}).all()
                times.append((time.perf_counter() - started) * 1000)
            out[name] = round(statistics.median(times), 1)
    return out


def _queries() -> list[tuple[str, sa.TextClause]]:
    return [(k, v) for k, v in vars(health_queries).items()
            if k.isupper() and k.startswith("_") and isinstance(v, sa.TextClause)]


def seq_scans(ledger: Ledger) -> list[str]:
    """Sequential scans of big tables in the plan of any scrape query."""
    queries = [query for _, query in _queries()]
    found = []
    with ledger.engine.connect() as conn:
        big = {r[0] for r in conn.execute(sa.text(
            "SELECT relname FROM pg_class WHERE reltuples > 10000 AND relkind = 'r'"))}
        for query in queries:
            plan = conn.execute(sa.text("EXPLAIN " + query.text),
                                {"grace": 30.0, "within": 30.0}).scalars().all()
            for line in plan:
                if "Seq Scan on" in line and line.split("Seq Scan on ")[1].split()[0] in big:
                    found.append(f"{line.strip()}  <- {query.text.split()[0:6]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--json", action="store_true", help="One JSON object on stdout.")
    args = parser.parse_args(argv)
    admin_url = database_url(OnwardSettings())
    name, url = create_database(admin_url, "onward_bench_metrics")
    try:
        ledger = Ledger.from_env(OnwardSettings(database_url=url))
        filled = fill(ledger, args.runs, args.steps)
        collector = LedgerCollector(ledger.engine)
        list(collector.collect())  # warm-up: connection, plans
        times = []
        for _ in range(15):
            started = time.perf_counter()
            families = list(collector.collect())
            times.append((time.perf_counter() - started) * 1000)
        samples = sum(len(f.samples) for f in families)
        scans = seq_scans(ledger)
        each = per_query_ms(ledger)
        result: dict[str, Any] = {
            "scrape_ms": round(statistics.median(times), 1),
            "scrape_ms_max": round(max(times), 1), "samples": samples,
            "steps": args.steps, "runs": args.runs, "per_query_ms": each,
            "seq_scans": scans, "fill_s": filled}
    finally:
        drop_database(admin_url, name)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps({"scrape_ms": result["scrape_ms"]}))
        log(f"scrape: median {result['scrape_ms']} ms, max {result['scrape_ms_max']} ms, "
            f"{samples} samples over {args.steps:,} steps and {args.runs:,} runs "
            f"(target < {TARGET_MS:.0f} ms)")
        for scan in scans:
            log(f"sequential scan: {scan}")
    return 0 if result["scrape_ms"] < TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
