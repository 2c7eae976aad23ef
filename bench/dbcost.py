#!/usr/bin/env python
"""What one step costs PostgreSQL: statements, transactions, rows, bytes, WAL, CPU.

    .venv/bin/python bench/dbcost.py                      # one JSON object on stdout
    .venv/bin/python bench/dbcost.py --steps 5000 --runs 50 --state-bytes 4000

For each step shape of ``bench/dbcost_flows.py`` (a step that only moves on, one with a
model call, one with an external write) it starts ``--runs`` runs, warms up, then drives
``--steps`` steps round-robin over them through the real executor (``execute_step``, no
broker, one connection: the per-step cost, not throughput), and reads around that batch:

* statements and transactions: counted at the client (each hot statement is its own
  autocommit transaction), named after the ledger's SQL constants, and checked against
  ``pg_stat_database.xact_commit``;
* rows: ``pg_stat_user_tables`` (inserted, updated, of which HOT, deleted) per table;
* bytes: ``pg_total_relation_size`` (heap, indexes, TOAST) growth per table;
* WAL: ``pg_current_wal_lsn()`` difference, and ``pg_stat_wal`` records, full-page images
  and syncs (a ``CHECKPOINT`` runs just before the batch, so each page's first change pays
  its full-page image once: the cost right after a checkpoint, amortised over the batch);
* CPU: user + system time of every PostgreSQL process (the postmaster's tree, exited
  backends included), and of this process (the worker side: executor, psycopg).

By default it starts a private PostgreSQL (the ``pgserver`` binaries, in a temporary
directory, deleted afterwards), so the WAL and CPU figures are this batch's alone: WAL is
cluster-wide. ``--database-url URL`` measures on that server instead (WAL and CPU then
include whatever else runs there, so they are left out). Backend statistics are flushed by
closing the batch's connections before they are read.

Each hot statement is also EXPLAINed (``enable_seqscan = off``), after ``--filler-runs``
finished runs with their history were added (so the plans are those of a ledger in use),
with the parameters of its first call: ``statements.<name>.access`` lists every table it
reads or writes and the index condition it reaches it by, which is how docs/scaling.md
checks that each touches one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import psycopg  # noqa: E402
import structlog  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

from harness.databases import create_database, drop_database  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger import effects as effect_sql  # noqa: E402
from ledger import evidence as evidence_sql  # noqa: E402
from ledger import steps as step_sql  # noqa: E402
from ledger.db import libpq_conninfo  # noqa: E402
from ledger.steps import StepStore  # noqa: E402
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, execute_step  # noqa: E402
from tasks.workflow import Registry  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402

SHAPES = {"plain": "dbcost_plain", "model": "dbcost_model", "effect": "dbcost_effect"}

_STATS = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       pg_total_relation_size(relid) AS bytes
  FROM pg_stat_user_tables WHERE schemaname = 'onward'
"""
_WAL = "SELECT wal_records, wal_fpi, wal_bytes, wal_sync, wal_write FROM pg_stat_wal"
_XACT = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def statement_names() -> dict[str, str]:
    """Each SQL text the step path runs, by its constant's name (``steps._CLAIM`` …)."""
    names = {}
    for module in (step_sql, effect_sql, evidence_sql):
        short = module.__name__.rsplit(".", 1)[-1]
        for name, value in vars(module).items():
            if name.startswith("_") and isinstance(value, str) and "onward." in value:
                names[value] = f"{short}.{name.lstrip('_').lower()}"
    return names


class Counted:
    """Counts the statements a StepStore's connection runs, and keeps each one's first
    parameters (for EXPLAIN)."""

    def __init__(self, store: StepStore) -> None:
        self.names = statement_names()
        self.calls: Counter[str] = Counter()
        self.first: dict[str, tuple[str, dict[str, Any]]] = {}
        self.counting = False
        run = store.conn._run

        def counted(sql: str, params: dict[str, Any], many: bool, binary: bool = False) -> Any:
            if self.counting:
                name = self.names.get(sql, "other: " + " ".join(sql.split())[:40])
                self.calls[name] += 1
                self.first.setdefault(name, (sql, dict(params)))
            return run(sql, params, many, binary)

        store.conn._run = counted  # type: ignore[method-assign]


@contextmanager
def private_server() -> Iterator[tuple[str, int, Path]]:
    """A PostgreSQL of our own: (SQLAlchemy URL of its postgres database, postmaster pid,
    its data directory)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver

        where = Path(tempfile.mkdtemp(prefix="onward-dbcost-"))
        server = pgserver.get_server(where / "pg", cleanup_mode="delete")  # type: ignore[attr-defined]
    try:
        uri = server.get_uri("postgres").replace("postgresql://", "postgresql+psycopg://", 1)
        pid = server.get_pid()
        assert pid is not None, "pgserver started no postmaster"
        yield uri, int(pid), where / "pg"
    finally:
        server.cleanup()  # stops it and deletes its data directory
        shutil.rmtree(where, ignore_errors=True)


def pg_cpu_s(postmaster: int | None) -> float | None:
    """CPU seconds of the server so far: the postmaster, its live children, and (through
    the postmaster's children_* times) every child that has exited."""
    if postmaster is None:
        return None
    root = psutil.Process(postmaster)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += child_times.user + child_times.system
    return float(total)


def snapshot(conn: psycopg.Connection[dict[str, Any]]) -> dict[str, Any]:
    with conn.transaction():
        tables = {row["relname"]: row for row in conn.execute(_STATS)}
        wal = conn.execute(_WAL).fetchone()
        lsn = conn.execute("SELECT pg_current_wal_lsn() AS lsn").fetchone()
        xact = conn.execute(_XACT).fetchone()
    assert wal is not None and lsn is not None and xact is not None
    return {"tables": tables, "wal": wal, "lsn": lsn["lsn"], "xact": xact["xact_commit"]}


def wait_backends_gone(conn: psycopg.Connection[dict[str, Any]], timeout: float = 30) -> None:
    """Closed connections' backends flush their statistics as they exit: wait for that."""
    deadline = time.monotonic() + timeout
    query = ("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid()")
    while True:
        row = conn.execute(query).fetchone()
        if row is not None and row["n"] == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{row} other sessions still on the bench database")
        time.sleep(0.05)


def config(ledger: Ledger) -> ExecutorConfig:
    s = ledger.settings
    return ExecutorConfig(keys=ledger.keys, max_state_bytes=s.max_state_bytes,
                          retry_base_s=0.0, retry_max_s=0.0,
                          max_artifact_bytes=s.max_artifact_bytes,
                          max_json_depth=s.max_json_depth)


def drive(store: StepStore, registry: Registry, cfg: ExecutorConfig, seqs: dict[UUID, int],
          steps: int) -> None:
    """``steps`` steps, round-robin over the runs in ``seqs`` (their seqs kept up to date)."""
    order = list(seqs)
    for i in range(steps):
        run_id = order[i % len(order)]
        report = execute_step(store, registry, cfg, StepMessage(run_id=run_id, seq=seqs[run_id]),
                              worker="dbcost:0", publish=lambda *args: None)
        if report.kind is not ReportKind.COMMITTED:
            raise RuntimeError(f"step {seqs[run_id]} of {run_id} did not commit: {report}")
        seqs[run_id] += 1


def measure_shape(url: str, server: tuple[int, Path] | None, shape: str,
                  args: argparse.Namespace, registry: Registry) -> dict[str, Any]:
    postmaster = server[0] if server else None
    settings = WorkerSettings(database_url=url, broker_url="redis://unused",
                              start_unadvertised=True)
    ledger = Ledger.from_env(settings)
    # random text, as incompressible as hex is: a state of repeated characters would be
    # compressed to nothing once TOAST takes it (past about 2 KB)
    seqs = {ledger.start_run(SHAPES[shape], {"pad": secrets.token_hex(args.state_bytes // 2)}): 0
            for _ in range(args.runs)}
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    counted = Counted(store)
    cfg = config(ledger)
    drive(store, registry, cfg, seqs, args.runs * 3)  # warm: caches, the runs' first steps
    with psycopg.connect(libpq_conninfo(url), autocommit=True, row_factory=dict_row) as conn:
        store.close()  # the warm-up's backends flush their statistics as they exit
        ledger.engine.dispose()
        wait_backends_gone(conn)
        conn.execute("CHECKPOINT")
        before, cpu_before = snapshot(conn), pg_cpu_s(postmaster)
        client_before, wall_before = time.process_time(), time.perf_counter()
        counted.counting = True
        drive(store, registry, cfg, seqs, args.steps)
        counted.counting = False
        wall = time.perf_counter() - wall_before
        client_cpu = time.process_time() - client_before
        cpu_after = pg_cpu_s(postmaster)
        store.close()
        ledger.engine.dispose()
        wait_backends_gone(conn)
        after = snapshot(conn)
        lsn_bytes = conn.execute("SELECT pg_wal_lsn_diff(%s, %s) AS d",
                                 (after["lsn"], before["lsn"])).fetchone()
        fill(conn, args.filler_runs)
        plans = {name: access(conn, sql, params) for name, (sql, params)
                 in counted.first.items()}
        if args.explain_others:
            others = other_statements(conn, counted, counted.first["steps.commit"][1])
    result = summarize(args, before, after, counted, plans, float(lsn_bytes["d"]) if lsn_bytes
                       else 0.0, None if cpu_after is None or cpu_before is None
                       else cpu_after - cpu_before, client_cpu, wall, postmaster is not None)
    if args.explain_others:
        result["other_statements"] = others
    if server is not None:
        result["wal_bytes_per_step_by_kind"] = {
            kind: round(size / args.steps, 1) for kind, size
            in wal_by_kind(server[1], before["lsn"], after["lsn"]).items()}
    return result


_WALDUMP_ROW = re.compile(r"^(\w+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+"
                          r"(\d+)\s+\(\s*[\d.]+\)\s+(\d+)")


def wal_by_kind(pgdata: Path, start: str, end: str) -> dict[str, int]:
    """WAL bytes between two LSNs by resource manager (Heap, Btree, Transaction …), records
    and full-page images together: ``pg_waldump --stats`` of the private server's WAL."""
    import pgserver

    waldump = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_waldump"
    shown = subprocess.run([str(waldump), "--stats", "-p", str(pgdata / "pg_wal"), "-s", start,
                            "-e", end], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in shown.splitlines():
        match = _WALDUMP_ROW.match(line.strip())
        if match and match.group(1) != "Total" and int(match.group(5)):
            found[match.group(1)] = int(match.group(5))
    return found


def summarize(args: argparse.Namespace, before: dict[str, Any], after: dict[str, Any],
              counted: Counted, plans: dict[str, list[dict[str, str]]], wal_bytes: float,
              pg_cpu: float | None, client_cpu: float, wall: float,
              private: bool) -> dict[str, Any]:
    n = args.steps

    def per(value: float) -> float:
        return float(round(value / n, 3))

    rows: dict[str, dict[str, float]] = {}
    grown = 0
    for table, now in after["tables"].items():
        then = before["tables"].get(table, {})
        delta = {k: now[k] - then.get(k, 0) for k in
                 ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "bytes")}
        if any(delta.values()):
            rows[table] = {"inserted": per(delta["n_tup_ins"]),
                           "updated": per(delta["n_tup_upd"]),
                           "hot_updated": per(delta["n_tup_hot_upd"]),
                           "deleted": per(delta["n_tup_del"]), "bytes": per(delta["bytes"])}
            grown += delta["bytes"]
    wal = {k: after["wal"][k] - before["wal"][k] for k in after["wal"]}
    statements = sum(counted.calls.values())
    result: dict[str, Any] = {
        "steps": n, "runs": args.runs, "state_bytes": args.state_bytes,
        "statements_per_step": per(statements),
        "transactions_per_step": per(after["xact"] - before["xact"]),
        "statements": {name: {"per_step": per(calls), "access": plans.get(name, [])}
                       for name, calls in sorted(counted.calls.items())},
        "rows_per_step": rows,
        "table_bytes_per_step": per(grown),
        "client_cpu_ms_per_step": round(client_cpu * 1000 / n, 3),
        "wall_ms_per_step": round(wall * 1000 / n, 3),
    }
    if private:
        result |= {"wal_bytes_per_step": per(wal_bytes),
                   "wal_records_per_step": per(wal["wal_records"]),
                   "wal_fpi_per_step": per(wal["wal_fpi"]),
                   "wal_syncs_per_step": per(wal["wal_sync"]),
                   "pg_cpu_ms_per_step": round((pg_cpu or 0) * 1000 / n, 3)}
    return result


def access(conn: psycopg.Connection[dict[str, Any]], sql: str,
           params: dict[str, Any]) -> list[dict[str, str]]:
    """Every table ``sql`` reaches and how (EXPLAIN, sequential scans discouraged)."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    found: list[dict[str, str]] = []
    walk(row["QUERY PLAN"][0]["Plan"], found.append)
    return found


def walk(node: dict[str, Any], add: Callable[[dict[str, str]], None]) -> None:
    if "Relation Name" in node:
        kind = node["Node Type"]
        if kind == "ModifyTable":
            kind = node.get("Operation", kind)
        entry = {"table": node["Relation Name"], "how": kind}
        for field, name in (("Index Name", "index"), ("Index Cond", "cond"),
                            ("Recheck Cond", "cond"), ("Filter", "filter")):
            if node.get(field):
                entry.setdefault(name, node[field])
        add(entry)
    for child in node.get("Plans", []):
        walk(child, add)


_MADE_UP: dict[str, Any] = {
    "retry": False, "park": False, "spend": True, "reconciled": False, "delay": 1.0,
    "resend_in": 1.0, "ttl": 30.0, "cover_s": 30.0, "poll": 0, "attempt": 1, "tokens": 0,
    "cost_usd": 0, "limit": 500, "stall_s": 60.0, "grace": 30.0, "republish": 30.0,
    "republish_max": 120.0, "kind": "call", "status": "completed", "outcome": "completed",
    "effect_type": "dbcost.write", "reason": "integrity", "sha": "0" * 64,
}
SWEEPS = ("recovery._park_exhausted", "recovery._requeue_expired", "recovery._resend_stalled",
          "waits._due_approvals", "waits._wake_signalled", "waits._signal_timeouts",
          "waits._deadlines", "outbox._due", "audit_chain._unsealed")


_FILLER = [
    # i %% 10: 0 running with a live lease (a step in flight), 1 running and queued, 2 waiting
    # for a timer, 3 waiting for an approval, 4 waiting for an accepted effect, 5-9 finished
    """INSERT INTO onward.runs (id, tenant_id, workflow, status, max_attempts, seq, head_hash,
                               lease_owner, lease_expires_at, waiting_on)
       SELECT gen_random_uuid(), 't' || (i %% 10), 'filler',
              CASE WHEN i %% 10 < 2 THEN 'running' WHEN i %% 10 < 5 THEN 'waiting'
                   ELSE 'completed' END,
              3, 5, md5(i::text), CASE WHEN i %% 10 = 0 THEN 'w' END,
              CASE WHEN i %% 10 = 0 THEN now() + interval '30 seconds' END,
              CASE i %% 10 WHEN 3 THEN 'approval' WHEN 4 THEN 'effect' END
         FROM generate_series(1, %(n)s) AS i""",
    """INSERT INTO onward.checkpoints (run_id, seq, hash, key_id, envelope_version, outcome,
                                      state, lease_epoch)
       SELECT id, s, md5(id::text || s), 'k1', 2, 'goto', '{}', 1
         FROM onward.runs, generate_series(0, 5) AS s WHERE workflow = 'filler'""",
    """INSERT INTO onward.step_attempts (run_id, lease_epoch, seq, attempt, worker, outcome)
       SELECT id, s, s, 1, 'w', 'committed'
         FROM onward.runs, generate_series(1, 5) AS s WHERE workflow = 'filler'""",
    """INSERT INTO onward.outbox (run_id, seq, due_at)
       SELECT id, seq, CASE WHEN status = 'running' THEN now() ELSE now() + interval '1 hour' END
         FROM onward.runs WHERE workflow = 'filler'
          AND ((status = 'running' AND lease_owner IS NULL) OR waiting_on IS NULL)
          AND status <> 'completed'""",
    """INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, step,
                                  command_id, tool_class, request_hash, status)
       SELECT md5(id::text), 'filler', id, tenant_id, 1, 's', 'c', 'idempotent_write',
              md5(id::text), CASE WHEN waiting_on = 'effect' THEN 'accepted'
                                  ELSE 'completed' END
         FROM onward.runs WHERE workflow = 'filler'""",
    """INSERT INTO onward.effect_attempts (effect_type, effect_id, attempt, kind, worker,
                                          idempotency_key, outcome)
       SELECT effect_type, effect_id, 1, 'call', 'w', effect_id, status
         FROM onward.effects WHERE effect_type = 'filler'""",
    """INSERT INTO onward.evidence (run_id, command_id, kind, seq, step, source, request_hash,
                                   response, lease_epoch)
       SELECT id, 'c', 'llm', 1, 's', 'm', md5(id::text), '{}', 1
         FROM onward.runs WHERE workflow = 'filler'""",
    """INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, step, action,
                                    artifact_hash, artifact, approvers, expires_at, status)
       SELECT gen_random_uuid(), id, tenant_id, 1, 1, 's', 'a', md5(id::text), '{}', '[]',
              now() + interval '1 day',
              CASE WHEN waiting_on = 'approval' THEN 'pending' ELSE 'approved' END
         FROM onward.runs WHERE workflow = 'filler'""",
    """INSERT INTO onward.signals (run_id, name, payload, consumed_seq)
       SELECT id, 'go', '{}', 1 FROM onward.runs WHERE workflow = 'filler'""",
    "ANALYZE",
]


def fill(conn: psycopg.Connection[dict[str, Any]], runs: int) -> None:
    """Finished runs with their history, so the planner sees tables of a ledger in use (on
    a table of a few rows any index, or none, costs the same) before the EXPLAINs."""
    found = conn.execute("SELECT count(*) AS n FROM onward.runs WHERE workflow = 'filler'")
    if (row := found.fetchone()) is not None and row["n"]:
        return  # an earlier shape filled this database
    for statement in _FILLER:
        conn.execute(statement, {"n": runs})


def other_statements(conn: psycopg.Connection[dict[str, Any]], counted: Counted,
                     base: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """EXPLAIN the step path's statements this batch did not run (fail, park, release,
    defer …) and the sweeps, with the parameters of a commit where the names match and
    made-up ones otherwise: which tables each reaches, and by which index condition."""
    import importlib

    found: dict[str, list[dict[str, str]]] = {}
    for sql, name in counted.names.items():
        if name not in counted.calls:
            found[name] = access(conn, sql, params_for(sql, base))
    for dotted in SWEEPS:
        module, attr = dotted.split(".")
        value = getattr(importlib.import_module(f"ledger.{module}"), attr.upper())
        sql = value if isinstance(value, str) else re.sub(
            r"(?<![:\w]):(\w+)", r"%(\1)s", value.text.replace("%", "%%"))
        found[f"{module}.{attr.lstrip('_')}"] = access(conn, sql, params_for(sql, base))
    return found


def params_for(sql: str, base: dict[str, Any]) -> dict[str, Any]:
    names = set(re.findall(r"%\((\w+)\)s", sql))
    return {n: base.get(n, _MADE_UP.get(n, [base["run_id"]] if n == "ids" else None))
            for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parser.add_argument("--steps", type=int, default=2000, help="measured steps per shape")
    parser.add_argument("--runs", type=int, default=20, help="runs the steps go round")
    parser.add_argument("--state-bytes", type=int, default=1000, help="size of each state")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="plain,model,effect")
    parser.add_argument("--database-url", help="measure on this server (not private)")
    parser.add_argument("--filler-runs", type=int, default=20_000,
                        help="finished runs added before the EXPLAINs (realistic plans)")
    parser.add_argument("--explain-others", action="store_true",
                        help="also EXPLAIN the step statements not run and the sweeps")
    args = parser.parse_args()
    structlog.configure(  # the executor's debug lines would go to stdout, the JSON's place
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    registry = Registry()
    registry.load_modules(["bench.dbcost_flows"])
    with private_or_given(args.database_url) as (admin_url, server):
        name, url = create_database(admin_url, "onward_dbcost")
        try:
            shapes = {shape: measure_shape(url, server, shape, args, registry)
                      for shape in args.shapes.split(",")}
            facts = server_facts(url)
        finally:
            drop_database(admin_url, name)
    load1, load5, _ = os.getloadavg()
    print(json.dumps({"server": facts, "private_server": server is not None,
                      "load_1min": round(load1, 2), "load_5min": round(load5, 2),
                      "cpus": os.cpu_count(), "shapes": shapes}))


@contextmanager
def private_or_given(url: str | None) -> Iterator[tuple[str, tuple[int, Path] | None]]:
    if url:
        yield url, None
        return
    with private_server() as (admin_url, pid, pgdata):
        yield admin_url, (pid, pgdata)


def server_facts(url: str) -> dict[str, Any]:
    with psycopg.connect(libpq_conninfo(url), row_factory=dict_row) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        facts = {"version": version["server_version"] if version else None}
        for setting in ("synchronous_commit", "fsync", "full_page_writes", "wal_level",
                        "shared_buffers", "checkpoint_timeout", "max_wal_size"):
            row = conn.execute(f"SHOW {setting}").fetchone()
            facts[setting] = row[setting] if row else None
    return facts


if __name__ == "__main__":
    main()
