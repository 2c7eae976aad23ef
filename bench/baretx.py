"""The bare durable step transaction: the PostgreSQL reference for ``bench/steps.py``.

One transaction = UPDATE the run (seq + 1 WHERE id AND seq), INSERT a checkpoint (about 1,000
bytes of jsonb), INSERT an outbox row, COMMIT; four statements and a commit, psycopg 3 with its
defaults (autocommit off, auto-prepare after 5 executions). Each client is its own process with
its own run row (perf-baselines.md rows 1a/1b). The tables are copies of onward's
(``LIKE ... INCLUDING ALL`` plus the foreign keys) in a ``bench`` schema, so the dispatcher
never sees these outbox rows.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SETUP = [
    "CREATE SCHEMA IF NOT EXISTS bench",
    "CREATE TABLE IF NOT EXISTS bench.runs (LIKE onward.runs INCLUDING ALL)",
    """CREATE TABLE IF NOT EXISTS bench.checkpoints (LIKE onward.checkpoints INCLUDING ALL,
           FOREIGN KEY (run_id) REFERENCES bench.runs (id) ON DELETE CASCADE)""",
    """CREATE TABLE IF NOT EXISTS bench.outbox (LIKE onward.outbox INCLUDING ALL,
           FOREIGN KEY (run_id) REFERENCES bench.runs (id) ON DELETE CASCADE)""",
]

_RESET = "TRUNCATE bench.outbox, bench.checkpoints, bench.runs"
_NEW_RUN = """
INSERT INTO bench.runs (id, tenant_id, workflow, status, max_attempts, head_hash)
VALUES (gen_random_uuid(), 'bench', 'bare_tx', 'running', 3, 'h0') RETURNING id
"""
_UPDATE = """
UPDATE bench.runs SET seq = seq + 1, head_hash = %(hash)s, updated_at = now()
 WHERE id = %(run_id)s AND seq = %(seq)s
"""
_CHECKPOINT = """
INSERT INTO bench.checkpoints (run_id, seq, parent_hash, hash, key_id, envelope_version, step,
                               next_step, outcome, state, workflow_version, lease_epoch)
VALUES (%(run_id)s, %(next)s, %(parent)s, %(hash)s, 'k1', 1, 'tick', 'tick', 'goto', %(state)s,
        1, 0)
"""
_OUTBOX = """
INSERT INTO bench.outbox (run_id, seq, worker_publishes) VALUES (%(run_id)s, %(next)s, true)
"""
STATE = {"payload": "x" * 960, "done": 0}  # about 1,000 bytes of jsonb


def setup(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in SETUP:
            conn.execute(statement)


def _client(conninfo: str, run_id: Any, seconds: float, ready: Any, start: Any,
            results: Any) -> None:
    hashes = [f"{i:064x}" for i in range(2)]
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        ready.put(1)
        start.wait()
        seq = 0
        latencies: list[float] = []
        begun = time.perf_counter()
        deadline = begun + seconds
        while True:
            t = time.perf_counter()
            if t >= deadline:
                break
            params = {"run_id": run_id, "seq": seq, "next": seq + 1, "hash": hashes[seq % 2],
                      "parent": hashes[(seq + 1) % 2], "state": Jsonb(STATE)}
            cur = conn.execute(_UPDATE, params)
            if cur.rowcount != 1:
                raise RuntimeError(f"bare tx: run {run_id} is not at seq {seq}")
            conn.execute(_CHECKPOINT, params)
            conn.execute(_OUTBOX, params)
            conn.commit()
            latencies.append(time.perf_counter() - t)
            seq += 1
        results.put((seq, time.perf_counter() - begun, latencies))


def measure(conninfo: str, clients: int, seconds: float) -> dict[str, float]:
    """Transactions per second of ``clients`` processes over ``seconds``, and their latency."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(_RESET)
        run_ids = [conn.execute(_NEW_RUN).fetchone()[0] for _ in range(clients)]  # type: ignore[index]
    # fork: the clients start in milliseconds (spawn re-imports for seconds on a busy machine);
    # they open their own connections and touch nothing inherited.
    ctx = mp.get_context("fork")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_client, args=(conninfo, run_id, seconds, ready, start, results),
                         daemon=True) for run_id in run_ids]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=60)
        start.set()
        outcome = [results.get(timeout=seconds + 60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    total = sum(n for n, _, _ in outcome)
    window = max(elapsed for _, elapsed, _ in outcome)
    latencies = sorted(x for _, _, lat in outcome for x in lat)
    return {
        "tx_per_s": total / window,
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else float("nan"),
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else float("nan"),
    }
