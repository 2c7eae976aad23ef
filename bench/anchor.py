#!/usr/bin/env python
"""How long an anchor takes (``onward anchor``, the reaper's schedule), by ledger size.

    .venv/bin/python bench/anchor.py --runs 100000        # one JSON line on stdout

Creates its own database on the configured PostgreSQL server (ONWARD_DATABASE_URL, or the
embedded one), fills it with ``--runs`` runs (a run row with a signed head, and the
checkpoint at its head: what an anchor reads and what a comparison joins; seqs 0..49),
then times, each on its own:

* ``first_anchor_s``: the first anchor (no earlier one to compare with): read every head in
  one snapshot, check each head MAC, Merkle root, gzip, write the file;
* ``compare_s``: ``onward verify --anchor``'s work: read and verify that file (MAC, root,
  order), compare every run with the ledger;
* ``next_anchor_s``: a second anchor, which first compares with the latest (what the reaper
  does every ONWARD_ANCHOR_INTERVAL_S);

each as ``{"wall": seconds, "cpu": seconds of this process}`` (the rest of the wall time is
PostgreSQL's, or waiting for a core on a busy machine),

and the anchor's size (``bytes``, ``bytes_per_run``). Drops the database at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from harness.databases import create_database, drop_database  # noqa: E402
from ledger import signed  # noqa: E402
from ledger.anchor_store import DirectoryStore  # noqa: E402
from ledger.anchoring import check_against, publish  # noqa: E402
from ledger.checkpoints import CheckpointKeys  # noqa: E402
from ledger.db import database_url, libpq_conninfo  # noqa: E402
from ledger.settings import OnwardSettings  # noqa: E402

T = TypeVar("T")


def fill(url: str, keys: CheckpointKeys, runs: int) -> None:
    """``runs`` runs, each with a signed head and the checkpoint at that head (COPY)."""
    rng = random.Random(7)
    with psycopg.connect(libpq_conninfo(url)) as conn, conn.cursor() as cur:
        heads = []
        for _ in range(runs):
            run_id, seq = uuid.uuid4(), rng.randrange(50)
            digest = rng.randbytes(32).hex()
            heads.append((run_id, seq, digest,
                          keys.sign(signed.head(run_id, seq, digest))))
        with cur.copy("COPY onward.runs (id, tenant_id, workflow, status, max_attempts, seq, "
                      "head_hash, head_mac) FROM STDIN") as copy:
            for run_id, seq, digest, mac in heads:
                copy.write_row((run_id, f"tenant-{run_id.int % 10}", "bench_anchor",
                                "running", 3, seq, digest, mac))
        with cur.copy("COPY onward.checkpoints (run_id, seq, hash, key_id, envelope_version, "
                      "outcome, state, lease_epoch) FROM STDIN") as copy:
            for run_id, seq, digest, _ in heads:
                copy.write_row((run_id, seq, digest, keys.current, 2, "goto", "{}", 0))
        conn.commit()
        cur.execute("ANALYZE onward.runs")
        cur.execute("ANALYZE onward.checkpoints")
        conn.commit()


def timed(work: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """What ``work`` returns, with its wall time and this process's CPU time, in seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    done = work()
    return done, {"wall": round(time.perf_counter() - wall, 2),
                  "cpu": round(time.process_time() - cpu, 2)}


def measure(runs: int) -> dict[str, object]:
    settings = OnwardSettings()
    keys = CheckpointKeys.from_settings(settings)
    name, url = create_database(database_url(settings), "onward_bench_anchor")
    try:
        engine = sa.create_engine(url)
        started = time.perf_counter()
        fill(url, keys, runs)
        filled = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as where:
            store = DirectoryStore(Path(where))
            first, first_s = timed(lambda: publish(engine, keys, store))
            compared, compare_s = timed(
                lambda: check_against(engine, keys, first.name, store.read(first.name)))
            time.sleep(0.01)  # another name (anchors are named by the database's clock)
            _, next_s = timed(lambda: publish(engine, keys, store))
        engine.dispose()
    finally:
        drop_database(database_url(settings), name)
    load1, _, _ = os.getloadavg()
    return {"runs": runs, "fill_s": round(filled, 2), "first_anchor_s": first_s,
            "compare_s": compare_s, "next_anchor_s": next_s,
            "problems": len(compared.problems), "bytes": first.size,
            "bytes_per_run": round(first.size / max(runs, 1), 1),
            "load_1min": round(load1, 2), "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs)))


if __name__ == "__main__":
    main()
