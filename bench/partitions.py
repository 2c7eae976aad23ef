#!/usr/bin/env python
"""What partitioning ``step_attempts`` by month costs the step hot path (issue 15 item 5;
docs/scaling.md#when-to-partition-and-which-tables).

    .venv/bin/python bench/partitions.py                 # one JSON line on stdout
    .venv/bin/python bench/partitions.py --ops 500 --rounds 3 --rows-per-month 2000

A step touches ``step_attempts`` twice: its claim inserts the attempt (and closes the one a
lost holder left open, by ``(run_id, lease_epoch - 1)``, naming no ``started_at``), its
commit closes it. Both forms of the close take turns here: as shipped, by ``(run_id,
lease_epoch, started_at)``, the claim's ``claimed_at`` being the attempt's ``started_at``,
so that the UPDATE prunes to the attempt's month (results named ``months_5_…``); and as
before the commit named it, by ``(run_id, lease_epoch)``, probing the primary-key index of
every partition (``…_by_epoch``). This measures those statements alone, in a database of
its own on the server of ``ONWARD_DATABASE_URL`` (created and dropped here), on three
tables with the columns and keys of ``step_attempts``:

* ``flat``: unpartitioned, primary key ``(run_id, lease_epoch)`` (before migration 0038);
* ``months_5``: partitioned as the migration leaves it (this month, three ahead, default);
* ``months_28``: with 24 past months too (two years of history kept), the most a
  deployment keeping two years has.

Each past month holds ``--rows-per-month`` attempts (the flat table all of them). Each
table runs ``--ops`` steps' worth of statements per round (UPDATE of the previous epoch,
INSERT of an attempt, UPDATE closing it: each its own autocommit statement, prepared, as
the workers run them), in turns of 100 steps, the tables and forms taking turns (a machine
that slows down slows them alike), with ``synchronous_commit`` off (a commit's WAL flush
costs every layout the same and would hide the difference). Reported per table and form:
the medians over turns of wall microseconds per step and of the backend's CPU microseconds
per step (``bench/_common.backend_cpu_s``, when the server runs on this host: far steadier
than wall time on a loaded machine), their quotients to ``flat`` in the same form, and the
tables the closing UPDATE scans (from EXPLAIN ANALYZE). FK and row-level security checks are
left out: they cost every layout the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psycopg  # noqa: E402

from bench._common import backend_cpu_s, measured_in_scratch_database  # noqa: E402
from ledger.db import libpq_conninfo  # noqa: E402

COLUMNS = """(run_id uuid NOT NULL, lease_epoch bigint NOT NULL, seq integer NOT NULL,
    attempt integer NOT NULL, step text, worker text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(), ended_at timestamptz, outcome text,
    error_type text, error_message text"""
BLOCK = 100
"""Steps per turn of a table: its backend CPU is read around each turn."""
LAYOUTS = {"flat": (0, False), "months_5": (0, True), "months_28": (24, True)}
"""name -> (past months, partitioned)"""

INSERT = ("INSERT INTO {t} (run_id, lease_epoch, seq, attempt, step, worker) "
          "VALUES (%s, %s, 0, 1, 'tick', 'bench')")
LOST = ("UPDATE {t} SET outcome = 'worker_lost', ended_at = now() "
        "WHERE run_id = %s AND lease_epoch = %s AND outcome IS NULL")
CLOSE = ("UPDATE {t} SET ended_at = now(), outcome = 'committed', step = 'tick', "
         "error_type = NULL, error_message = NULL WHERE run_id = %s AND lease_epoch = %s")
CLOSE_AT = CLOSE + " AND started_at = %s"
"""The commit's close as shipped: naming the attempt's month."""


def _month(base: datetime, delta: int) -> datetime:
    year, month = divmod(base.month - 1 + delta, 12)
    return base.replace(year=base.year + year, month=month + 1)


def build(conn: psycopg.Connection[Any], name: str, past: int, partitioned: bool,
          rows_per_month: int) -> None:
    key = "run_id, lease_epoch, started_at" if partitioned else "run_id, lease_epoch"
    conn.execute(f"CREATE TABLE {name} {COLUMNS}, PRIMARY KEY ({key}))"
                 + (" PARTITION BY RANGE (started_at)" if partitioned else ""))
    this = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if partitioned:
        conn.execute(f"CREATE TABLE {name}_default PARTITION OF {name} DEFAULT")
        for delta in range(-past, 4):
            lo, hi = _month(this, delta), _month(this, delta + 1)
            conn.execute(f"CREATE TABLE {name}_{lo:%Y_%m} PARTITION OF {name} "
                         f"FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')")
    for delta in range(-24, 0):  # every table holds the same history
        at = _month(this, delta)
        conn.execute(
            f"INSERT INTO {name} (run_id, lease_epoch, seq, attempt, step, worker, "
            "started_at, ended_at, outcome) "
            "SELECT gen_random_uuid(), 1, 0, 1, 'tick', 'bench', %s, %s, 'committed' "
            "FROM generate_series(1, %s)", (at, at, rows_per_month))
    conn.execute(f"ANALYZE {name}")


def one_block(conn: psycopg.Connection[Any], name: str, ops: int, backend: int,
              close_at: bool) -> tuple[float, float | None]:
    """``ops`` steps' statements on one table: the claim's lost-holder UPDATE and INSERT,
    the commit's closing UPDATE (naming the attempt's ``started_at`` if ``close_at``), each
    its own autocommit statement; the wall and the backend CPU microseconds per step."""
    lost = LOST.format(t=name)
    insert = INSERT.format(t=name) + (" RETURNING started_at" if close_at else "")
    close = (CLOSE_AT if close_at else CLOSE).format(t=name)
    runs = [uuid.uuid4() for _ in range(ops)]
    cpu0, started = backend_cpu_s(backend), time.perf_counter()
    for run in runs:
        conn.execute(lost, (run, 0), prepare=True)
        inserted = conn.execute(insert, (run, 1), prepare=True)
        at = inserted.fetchone()[0] if close_at else None  # type: ignore[index]
        conn.execute(close, (run, 1, at) if close_at else (run, 1), prepare=True)
    wall = (time.perf_counter() - started) / ops * 1e6
    cpu1 = backend_cpu_s(backend)
    return wall, None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / ops * 1e6


def probes(conn: psycopg.Connection[Any], name: str, close_at: bool) -> int:
    """The tables the closing UPDATE scans (one per partition it cannot prune), each by
    its primary-key index (or a scan of an empty partition)."""
    close = (CLOSE_AT if close_at else CLOSE).format(t=name)
    params = (uuid.uuid4(), 1, datetime.now(UTC)) if close_at else (uuid.uuid4(), 1)
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + close, params).fetchone()
    assert plan is not None

    def scans(node: dict[str, Any]) -> int:
        own = int(str(node.get("Node Type", "")).endswith("Scan"))
        return own + sum(scans(child) for child in node.get("Plans", []))

    return scans(plan[0][0]["Plan"])


FORMS = {"": True, "_by_epoch": False}
"""suffix of a result's name -> whether the closing UPDATE names the attempt's started_at
(as shipped) or only its epoch (before it did)"""


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        # the commit's WAL flush is the same for every layout and would drown the probes
        conn.execute("SET synchronous_commit = off")
        for name, (past, partitioned) in LAYOUTS.items():
            build(conn, name, past, partitioned, args.rows_per_month)
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        units = [(name, form) for form in FORMS for name in LAYOUTS]
        for name, form in units:  # warm-up: plans cached, pages in memory
            one_block(conn, name, 100, backend, FORMS[form])
        wall: dict[tuple[str, str], list[float]] = {unit: [] for unit in units}  # per block
        cpu: dict[tuple[str, str], list[float]] = {unit: [] for unit in units}
        block = min(BLOCK, args.ops)
        for r in range(args.rounds * max(1, args.ops // block)):
            turn = r % len(units)
            for name, form in units[turn:] + units[:turn]:  # the tables take turns
                w, c = one_block(conn, name, block, backend, FORMS[form])
                wall[(name, form)].append(w)
                if c is not None:
                    cpu[(name, form)].append(c)
        found = {(name, form): probes(conn, name, FORMS[form]) for name, form in units}
    result: dict[str, Any] = {}
    for name, form in units:
        key, flat = f"{name}{form}", ("flat", form)
        result[f"{key}_us_per_step"] = round(statistics.median(wall[(name, form)]), 1)
        if cpu[(name, form)]:
            result[f"{key}_backend_cpu_us_per_step"] = round(
                statistics.median(cpu[(name, form)]), 1)
        result[f"{key}_close_index_probes"] = found[(name, form)]
        if name == "flat":
            continue
        result[f"{key}_vs_flat"] = round(statistics.median(wall[(name, form)])
                                         / statistics.median(wall[flat]), 3)
        if cpu[(name, form)] and cpu[flat] and statistics.median(cpu[flat]) > 0:
            result[f"{key}_backend_cpu_vs_flat"] = round(
                statistics.median(cpu[(name, form)]) / statistics.median(cpu[flat]), 3)
    return {**result, "rounds": args.rounds, "ops": args.ops,
            "rows_per_month": args.rows_per_month}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parser.add_argument("--ops", type=int, default=2000, help="steps per table per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows-per-month", type=int, default=20000)
    args = parser.parse_args()
    result = measured_in_scratch_database("onward_partitions", lambda url: measure(url, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
