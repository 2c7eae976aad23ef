"""Why step counters are not updated by the commit statement: the bare durable step
transaction (bench/baretx.py) with and without one more statement that adds 1 to a counter
row shared by every client (what "steps committed per workflow version" in the commit would
be), interleaved A/B rounds.

    python bench/counter_contention.py [--clients 4] [--seconds 4] [--rounds 3]

Prints tx/s and p99 per side, median over rounds. Uses a database of its own on the server
ONWARD_DATABASE_URL names (or the embedded one), dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import baretx  # noqa: E402
from harness.databases import create_database, drop_database  # noqa: E402
from ledger import OnwardSettings  # noqa: E402
from ledger.db import database_url, libpq_conninfo  # noqa: E402

_COUNTERS = "CREATE TABLE IF NOT EXISTS bench.counters (k text PRIMARY KEY, n bigint NOT NULL)"
_COUNT = """
INSERT INTO bench.counters (k, n) VALUES ('test_chain:1:steps_committed', 1)
ON CONFLICT (k) DO UPDATE SET n = bench.counters.n + 1
"""


def _client(conninfo: str, seconds: float, count: bool, start: Any, results: Any) -> None:
    with psycopg.connect(conninfo) as conn:
        run_id = conn.execute(baretx._NEW_RUN).fetchone()[0]  # type: ignore[index]
        conn.commit()
        seq, lat = 0, []
        start.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            params = {"run_id": run_id, "seq": seq, "next": seq + 1, "hash": f"{seq + 1:064x}",
                      "parent": f"{seq:064x}", "state": psycopg.types.json.Jsonb(baretx.STATE)}
            conn.execute(baretx._UPDATE, params)
            conn.execute(baretx._CHECKPOINT, params)
            conn.execute(baretx._OUTBOX, params)
            if count:
                conn.execute(_COUNT)
            conn.commit()
            lat.append((time.perf_counter() - began) * 1000)
            seq += 1
        results.put(lat)


def measure(conninfo: str, clients: int, seconds: float, count: bool) -> dict[str, float]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(baretx._RESET)
    start = mp.Event()
    results: mp.queues.Queue[list[float]] = mp.Queue()
    procs = [mp.Process(target=_client, args=(conninfo, seconds, count, start, results))
             for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    lat = [x for _ in procs for x in results.get(timeout=seconds + 60)]
    for p in procs:
        p.join()
    lat.sort()
    return {"tx_per_s": len(lat) / seconds, "p50_ms": lat[len(lat) // 2],
            "p99_ms": lat[int(len(lat) * 0.99)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    admin = database_url(OnwardSettings())
    name, url = create_database(admin, "onward_bench_counters")
    try:
        conninfo = libpq_conninfo(url)
        baretx.setup(conninfo)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(_COUNTERS)
        sides: dict[str, list[dict[str, float]]] = {"bare": [], "with_counter": []}
        for _ in range(args.rounds):
            for side in sides:
                sides[side].append(measure(conninfo, args.clients, args.seconds,
                                           side == "with_counter"))
        out: dict[str, Any] = {
            side: {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
            for side, rows in sides.items()}
        out["tx_ratio"] = round(out["with_counter"]["tx_per_s"] / out["bare"]["tx_per_s"], 3)
        print(json.dumps(out))
    finally:
        drop_database(admin, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
