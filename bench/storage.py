#!/usr/bin/env python
"""Storage linear in content (issue 15 item 4): what a run whose state grows every step
stores, and what restoring it costs at its end.

    .venv/bin/python bench/storage.py                    # one JSON line on stdout
    .venv/bin/python bench/storage.py --steps 200 --message-bytes 1024

One run of a chat-like workflow gains a ``--message-bytes`` message (random hex: TOAST
cannot compress it away) per step for ``--steps`` steps, through the real executor
(``execute_step``: claim, restore, step, commit; no broker), in a database of its own on
the server of ``ONWARD_DATABASE_URL`` (created and dropped here), so the table sizes are
this run's alone:

* ``content_bytes``: the final state's canonical JSON;
* ``stored_bytes``: growth of ``pg_total_relation_size`` (heap, indexes, TOAST) of the
  checkpoints and artifacts tables (a large snapshot is stored as an artifact) over the
  run; ``stored_per_content`` is their quotient (full copies of every state would store
  about steps/2 times the content);
* ``restore_p50_ms_at_step_N``: the median time of a restore of the run at seq N (the
  claim statement, which reads the chain, then ``tasks.restore``: reconstruct, verify the
  MAC, validate the state), over ``--samples`` restores; between samples the lease is
  handed back in SQL so the same checkpoint is restored again. Step 10 is measured on a
  second run of the same workflow;
* ``restore_p50_ms_same_state_one_snapshot``: the same restore of a run started with the
  final state as its input (one snapshot, no chain): what the state's size costs by itself,
  whatever its history. The restore at the last step is compared with it: the chain adds
  ``restore_chain_overhead`` (a quotient).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import statistics
import sys
import time
from typing import Any
from uuid import UUID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psycopg  # noqa: E402
import structlog  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from bench._common import measured_in_scratch_database  # noqa: E402
from ledger import Ledger  # noqa: E402
from ledger.checkpoints import canonical_json  # noqa: E402
from ledger.db import database_url, libpq_conninfo  # noqa: E402
from ledger.steps import Claim, StepStore  # noqa: E402
from tasks import Registry, StepContext, Workflow  # noqa: E402
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, execute_step  # noqa: E402
from tasks.restore import Restored, restore  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402


class Message(BaseModel):
    role: str
    text: str


class Chat(BaseModel):
    size: int = 2048
    messages: list[Message] = []


chat = Workflow("storage_chat", version=1, state=Chat)


@chat.step(start=True)
def talk(ctx: StepContext, state: Chat) -> Any:
    text = secrets.token_hex(state.size // 2)
    return ctx.goto(talk, size=state.size,
                    messages=[*state.messages, Message(role="user", text=text)])


_SIZES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) AS bytes
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'onward' AND c.relname IN ('checkpoints', 'artifacts')
"""

_KINDS = """
SELECT count(*) FILTER (WHERE state_delta IS NULL), count(*) FILTER (WHERE state_delta IS NOT NULL)
  FROM onward.checkpoints WHERE run_id = %(run_id)s
"""

_HAND_BACK = """
UPDATE onward.runs SET lease_owner = NULL, lease_expires_at = NULL, attempt = 0
 WHERE id = %(run_id)s
"""


def stored_bytes(url: str) -> int:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        row = conn.execute(_SIZES).fetchone()
    return int(row[0]) if row else 0


def drive(store: StepStore, registry: Registry, cfg: ExecutorConfig, run_id: UUID,
          steps: int) -> None:
    for seq in range(steps):
        report = execute_step(store, registry, cfg, StepMessage(run_id=run_id, seq=seq),
                              worker="storage:0", publish=lambda *args: None)
        if report.kind is not ReportKind.COMMITTED:
            raise RuntimeError(f"step {seq} of {run_id} did not commit: {report}")


def restore_p50_ms(url: str, store: StepStore, registry: Registry, ledger: Ledger,
                   run_id: UUID, seq: int, samples: int) -> float:
    """Median milliseconds of claim + restore of ``run_id`` at ``seq``."""
    took = []
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        for _ in range(samples + 1):
            started = time.perf_counter()
            claim = store.claim(run_id, seq, "storage:0")
            if not isinstance(claim, Claim):
                raise RuntimeError(f"could not claim {run_id} at {seq}: {claim}")
            restored = restore(ledger.keys, registry, claim)
            took.append((time.perf_counter() - started) * 1000)
            if not isinstance(restored, Restored):
                raise RuntimeError(f"restore of {run_id} at {seq} refused: {restored}")
            conn.execute(_HAND_BACK, {"run_id": run_id})
    return round(statistics.median(took[1:]), 3)  # the first warms the statement cache


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = WorkerSettings(database_url=url, broker_url="redis://unused",
                              start_unadvertised=True, max_state_bytes=64 * 1024 * 1024,
                              checkpoint_snapshot_every=args.snapshot_every)
    ledger = Ledger.from_env(settings)
    registry = Registry()
    registry.register(chat)
    store = StepStore(database_url(settings), ledger.keys, lease_ttl_s=600,
                      snapshot_every=args.snapshot_every)
    cfg = ExecutorConfig(keys=ledger.keys, max_state_bytes=settings.max_state_bytes,
                         retry_base_s=0.0, retry_max_s=0.0,
                         max_artifact_bytes=settings.max_artifact_bytes,
                         max_json_depth=settings.max_json_depth)
    try:
        start = {"size": args.message_bytes, "messages": []}
        before = stored_bytes(url)
        long_run = ledger.start_run("storage_chat", start)
        drive(store, registry, cfg, long_run, args.steps)
        stored = stored_bytes(url) - before
        final = ledger.checkpoints(long_run)[-1].state
        content = len(canonical_json(final))
        short_run = ledger.start_run("storage_chat", start)
        early = min(10, args.steps)
        drive(store, registry, cfg, short_run, early)
        one_snapshot = ledger.start_run("storage_chat", final)
        at_end = restore_p50_ms(url, store, registry, ledger, long_run, args.steps,
                                args.samples)
        at_early = restore_p50_ms(url, store, registry, ledger, short_run, early, args.samples)
        alone = restore_p50_ms(url, store, registry, ledger, one_snapshot, 0, args.samples)
        with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
            kinds = conn.execute(_KINDS, {"run_id": long_run}).fetchone()
    finally:
        store.close()
        ledger.engine.dispose()
    return {
        "steps": args.steps, "message_bytes": args.message_bytes,
        "snapshot_every": args.snapshot_every,
        "content_bytes": content, "stored_bytes": stored,
        "stored_per_content": round(stored / content, 3),
        "snapshots": kinds[0] if kinds else None, "deltas": kinds[1] if kinds else None,
        f"restore_p50_ms_at_step_{args.steps}": at_end,
        f"restore_p50_ms_at_step_{early}": at_early,
        "restore_p50_ms_same_state_one_snapshot": alone,
        "restore_ratio_last_vs_early": round(at_end / at_early, 2),
        "restore_chain_overhead": round(at_end / alone, 2),
        "targets_met": {"stored_per_content_le_3": stored / content <= 3,
                        "restore_within_2x": at_end <= 2 * at_early},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--message-bytes", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=21, help="restores per figure")
    parser.add_argument("--snapshot-every", type=int, default=16,
                        help="ONWARD_CHECKPOINT_SNAPSHOT_EVERY (1: every state in full)")
    args = parser.parse_args()
    structlog.configure(  # the executor's debug lines would go to stdout, the JSON's place
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    result = measured_in_scratch_database("onward_storage", lambda url: measure(url, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
