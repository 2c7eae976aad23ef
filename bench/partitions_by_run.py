#!/usr/bin/env python
"""What partitioning ``checkpoints`` and ``evidence`` by month of the run would cost the
step hot path (issue 15 item 5; docs/scaling.md#when-to-partition-and-which-tables).

    .venv/bin/python bench/partitions_by_run.py                 # one JSON line on stdout
    .venv/bin/python bench/partitions_by_run.py --steps 500 --rounds 3

Run ids are uuid7: their first 48 bits are the run's creation time in milliseconds, so a
``PARTITION BY RANGE (run_id)`` with one partition per UTC month (bounds: the uuid7 of the
month's first millisecond, the rest zeros) keeps ``run_id`` in every unique key, keeps a
run's whole chain in one partition, and lets a statement naming one run prune to one
partition. Nothing here is shipped: this bench builds that layout on scratch databases and
measures the real statements on it.

Three databases on the server of ``ONWARD_DATABASE_URL`` (created, migrated and dropped
here), in which ``checkpoints`` and ``evidence`` are:

* ``flat``: as migrated (unpartitioned);
* ``months_5``: partitioned by range of run_id, this month, three ahead and a default (what
  a migration would leave, as 0038 does for ``step_attempts``);
* ``months_29``: 24 past months more (two years of runs kept).

On each, the worker's own ``StepStore`` runs ``--steps`` claim-then-commit steps of one run
per round (each statement one autocommit transaction, prepared, as a worker runs them),
in turns of 100 steps, the databases taking turns, in two forms of the claim statement:

* ``shipped``: as ``ledger/sql/steps.sql`` has it: its joins to ``checkpoints`` and
  ``evidence`` name the run by the ``claimed`` CTE's ``c.id``, which the planner cannot
  prune on; PostgreSQL keeps a generic plan, which opens and locks every partition of both
  tables at each execution and skips the others' index probes at run time;
* ``named``: the same statement with those joins naming the run id parameter, which prunes
  to one partition when planned with the value: PostgreSQL then finds the generic plan
  (all partitions) dearer than a custom one and plans the whole claim again at every call.

Reported per database and form: the backend's CPU microseconds per claim and per commit,
the median over the turns (``bench/_common.backend_cpu_s``: the server must run on this
host); whether the claim and the commit ran generic or custom plans
(``pg_prepared_statements``); and how many partitions of ``checkpoints`` and ``evidence``
the claim's plan names (EXPLAIN with the values bound, as a custom plan is made). Not
measured: ``record_evidence`` (an INSERT ... ON CONFLICT routed to one partition, like the
commit's checkpoint INSERT), and the reads that do not name a run (the artifacts'
row-level security policy, the artifact sweep), which probe every partition.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import sqlalchemy as sa  # noqa: E402

from bench._common import backend_cpu_s  # noqa: E402
from harness.databases import create_database, drop_database  # noqa: E402
from ledger import Ledger, OnwardSettings, OutcomeKind  # noqa: E402
from ledger import steps as steps_module  # noqa: E402
from ledger.db import database_url  # noqa: E402
from ledger.steps import Advance, Claim, StepStore  # noqa: E402
from tests.support.plans import explain, explaining  # noqa: E402

LAYOUTS = {"flat": None, "months_5": 0, "months_29": 24}
"""name -> past months of partitions (None: unpartitioned)"""
TABLES = ("checkpoints", "evidence")
BLOCK = 100
"""Steps per turn of a database: its backend CPU is read around each statement."""

_BY_CTE = re.compile(r"\b(e|cp|parent|base|d)\.run_id = c\.id\b")


def named(claim: str) -> str:
    """The claim statement with its joins to checkpoints and evidence naming the run id
    parameter instead of the claimed CTE's id (the same row: the claim updates that run).
    The sixth, ``effects_open``'s probe of ``effects`` (alias ``e`` too; not partitioned),
    is named the same way: it changes no plan but that table's."""
    out, count = _BY_CTE.subn(r"\1.run_id = %(run_id)s", claim)
    assert count == 6, f"the claim statement changed: {count} joins by c.id"
    return out


def month_bound(year: int, month: int) -> str:
    """The uuid7 of the first millisecond of a UTC month, the bits after the time zero."""
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    ms = int(datetime(year, month, 1, tzinfo=UTC).timestamp() * 1000)
    digits = f"{ms:012x}" + "0" * 20
    return "-".join((digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:]))


def policies(conn: sa.Connection, table: str, only: str = "%") -> list[str]:
    """The statements that make ``onward.table``'s row-level security policies (those
    whose name is like ``only``) again."""
    made = []
    for row in conn.exec_driver_sql(
            "SELECT policyname, cmd, roles, qual, with_check FROM pg_policies "
            "WHERE schemaname = 'onward' AND tablename = %(t)s AND policyname LIKE %(only)s",
            {"t": table, "only": only}).mappings():
        roles = ", ".join(row["roles"])
        made.append(f"CREATE POLICY {row['policyname']} ON onward.{table} FOR {row['cmd']} "
                    f"TO {roles}" + (f" USING ({row['qual']})" if row["qual"] else "")
                    + (f" WITH CHECK ({row['with_check']})" if row["with_check"] else ""))
    return made


def partition(conn: sa.Connection, past: int) -> None:
    """Replace checkpoints and evidence (empty: the database was just migrated) by tables
    partitioned by month of run_id: ``past`` months, this month, three ahead, a default;
    with the columns, keys, checks, indexes, foreign keys, grants and row-level security of
    the tables they replace. The artifacts' tenant policy names both tables: it is made
    again after."""
    now = datetime.now(UTC)
    artifacts = policies(conn, "artifacts", "tenant")
    conn.exec_driver_sql("DROP POLICY tenant ON onward.artifacts")
    for table in TABLES:
        own = policies(conn, table)
        conn.exec_driver_sql(f"ALTER TABLE onward.{table} RENAME TO {table}_flat")
        conn.exec_driver_sql(f"CREATE TABLE onward.{table} (LIKE onward.{table}_flat "
                             "INCLUDING ALL) PARTITION BY RANGE (run_id)")
        for delta in range(-past, 4):
            year, month = divmod(now.year * 12 + now.month - 1 + delta, 12)
            conn.exec_driver_sql(
                f"CREATE TABLE onward.{table}_{year}_{month + 1:02d} PARTITION OF "
                f"onward.{table} FOR VALUES FROM ('{month_bound(year, month + 1)}') "
                f"TO ('{month_bound(year, month + 2)}')")
        conn.exec_driver_sql(f"CREATE TABLE onward.{table}_default PARTITION OF "
                             f"onward.{table} DEFAULT")
        foreign = conn.exec_driver_sql(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %(t)s::regclass AND contype = 'f'",
            {"t": f"onward.{table}_flat"}).scalars().all()
        conn.exec_driver_sql(f"DROP TABLE onward.{table}_flat")
        for definition in foreign:
            conn.exec_driver_sql(f"ALTER TABLE onward.{table} ADD {definition}")
        conn.exec_driver_sql(f"ALTER TABLE onward.{table} ENABLE ROW LEVEL SECURITY")
        conn.exec_driver_sql(f"ALTER TABLE onward.{table} FORCE ROW LEVEL SECURITY")
        for statement in own:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON onward.{table} "
                             "TO onward_app, onward_operator")
    for statement in artifacts:
        conn.exec_driver_sql(statement)


def _cpu_s(pid: int) -> float:
    spent = backend_cpu_s(pid)
    if spent is None:
        raise SystemExit("PostgreSQL must run on this host: its backends' CPU is read from /proc")
    return spent


class Stepper:
    """One run stepped on one database by a StepStore of its own, in one claim form."""

    def __init__(self, url: str, form: str, steps: int) -> None:
        self.url, self.form = url, form
        self.ledger = Ledger(sa.create_engine(url), OnwardSettings(database_url=url))
        self.store = StepStore(url, self.ledger.keys, lease_ttl_s=30)
        self.run_id = self.ledger.start_run("bench_chain", {}, allow_unadvertised=True)
        self.seq = 0
        self.pid = int(self.store.conn.one("SELECT pg_backend_pid() AS pid", {})["pid"])  # type: ignore[index]
        self.claim_us: list[float] = []
        self.commit_us: list[float] = []
        self.left = steps

    def step(self) -> tuple[float, float]:
        """Claim the run's next step and commit it: the backend CPU seconds of each."""
        before = _cpu_s(self.pid)
        with self._form():
            claim = self.store.claim(self.run_id, self.seq, "bench")
        between = _cpu_s(self.pid)
        assert isinstance(claim, Claim), claim
        self.store.commit(claim, Advance(
            step="tick", outcome=OutcomeKind.GOTO, next_step="tick",
            state={"done": self.seq + 1}, workflow_version=1, next_max_attempts=3))
        self.seq += 1
        return between - before, _cpu_s(self.pid) - between

    def block(self, steps: int) -> None:
        claim_s = commit_s = 0.0
        for _ in range(steps):
            claim, commit = self.step()
            claim_s += claim
            commit_s += commit
        self.claim_us.append(claim_s / steps * 1e6)
        self.commit_us.append(commit_s / steps * 1e6)

    @contextmanager
    def _form(self) -> Iterator[None]:
        shipped = steps_module._CLAIM
        if self.form == "named":
            steps_module._CLAIM = named(shipped)
        try:
            yield
        finally:
            steps_module._CLAIM = shipped

    def plans(self) -> dict[str, str]:
        """generic or custom, for the claim and the commit (what PostgreSQL ran last)."""
        rows = self.store.conn.all(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements", {})
        kinds = {}
        for row in rows:
            name = ("claim" if "WITH claimed AS" in row["statement"] else
                    "commit" if "), checkpoint AS (" in row["statement"] else None)
            if name:
                kinds[name] = "generic" if row["generic_plans"] > row["custom_plans"] else "custom"
        return kinds

    def partitions_planned(self) -> dict[str, int]:
        """The relations of checkpoints and evidence the claim's plan names (planned with the
        values bound)."""
        seen: list[list[str]] = []
        explaining(self.store, "WITH claimed AS",
                   lambda query, params: seen.append(explain(self.url, query, params)))
        self.step()
        plan = "\n".join(seen[0])
        return {table: len(set(re.findall(rf"\bon ({table}(?:_\w+)?)\b", plan)))
                for table in TABLES}

    def close(self) -> None:
        self.store.close()
        self.ledger.engine.dispose()


def measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    steppers = {(name, form): Stepper(url, form, args.steps)
                for name, url in urls.items() for form in ("shipped", "named")}
    try:
        order = list(steppers)
        for stepper in steppers.values():  # warm-up: past psycopg's and PostgreSQL's
            stepper.block(20)                 # five executions before a plan is cached
        for stepper in steppers.values():
            stepper.claim_us.clear()
            stepper.commit_us.clear()
        turns = args.rounds * max(1, args.steps // BLOCK)
        for turn in range(turns):
            for key in order[turn % len(order):] + order[:turn % len(order)]:
                steppers[key].block(min(BLOCK, args.steps))
        result: dict[str, Any] = {}
        for (name, form), stepper in steppers.items():
            prefix = f"{name}_{form}"
            result[f"{prefix}_claim_cpu_us"] = round(statistics.median(stepper.claim_us))
            result[f"{prefix}_commit_cpu_us"] = round(statistics.median(stepper.commit_us))
            result[f"{prefix}_plans"] = stepper.plans()
        for (name, form), stepper in steppers.items():
            result[f"{name}_{form}_claim_plan_names"] = stepper.partitions_planned()
        return {**result, "rounds": args.rounds, "steps": args.steps}
    finally:
        for stepper in steppers.values():
            stepper.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parser.add_argument("--steps", type=int, default=1000, help="steps per database, form "
                        "and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    admin_url = database_url(OnwardSettings())
    with ExitStack() as stack:
        urls = {}
        for name, past in LAYOUTS.items():
            db, url = create_database(admin_url, f"onward_byrun_{name}")
            stack.callback(drop_database, admin_url, db)
            if past is not None:
                with sa.create_engine(url).begin() as conn:
                    partition(conn, past)
            urls[name] = url
        result = measure(urls, args)
    load1, _, _ = os.getloadavg()
    print(json.dumps({**result, "load_1min": round(load1, 2), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
