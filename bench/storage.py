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

With ``--phases``, ``restore_phases_ms_at_step_N`` (and at step 10) splits that restore
into its parts, each the median of ``--samples`` timed apart: the claim statement (and the
state artifact's ``SELECT body`` alone), then the Python side: the artifact's sha256, its
parse, applying the deltas since the snapshot, their chain digests, ``Claim.from_row`` (the
four before it together, and the claim's other fields), ``restore`` (MACs, sealed fields,
the step's copy, validation: ``copy`` and ``validate`` alone), and the CPU time of this
process for one claim + restore (wall times on a busy machine are mostly waiting for a core).

With ``--as-worker``, this process is first set up as a started worker sets up its own:
glibc's allocator keeps what it frees (``ONWARD_MALLOC_KEEP_FREED``, workers/allocator.py),
so the restores reuse the heap's pages, and what its imports built is frozen out of the
garbage collector's reach (``ONWARD_GC_FREEZE``, workers/gcfreeze.py). By default both are
left as glibc and Python set them.
"""

from __future__ import annotations

import argparse
import hashlib
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
from psycopg.types.json import Jsonb  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from bench._common import measured_in_scratch_database  # noqa: E402
from ledger import Ledger, states  # noqa: E402
from ledger.checkpoints import artifact_ref, canonical_json  # noqa: E402
from ledger.db import HEAD_REVISION, database_url, libpq_conninfo  # noqa: E402
from ledger.sql import statement  # noqa: E402
from ledger.steps import Claim, StepStore  # noqa: E402
from tasks import Registry, StepContext, Workflow  # noqa: E402
from tasks.executor import ExecutorConfig, ReportKind, StepMessage, execute_step  # noqa: E402
from tasks.restore import Restored, restore  # noqa: E402
from workers.allocator import keep_freed_memory  # noqa: E402
from workers.gcfreeze import freeze_startup_objects  # noqa: E402
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


_ARTIFACT = "SELECT body FROM onward.artifacts WHERE sha256 = %(sha)s"


def _timed(took: dict[str, list[float]], name: str, since: float) -> float:
    now = time.perf_counter()
    took.setdefault(name, []).append((now - since) * 1000)
    return now


def restore_phases_ms(url: str, store: StepStore, registry: Registry, ledger: Ledger,
                      run_id: UUID, seq: int, samples: int) -> dict[str, float]:
    """Median milliseconds of each part of a claim + restore of ``run_id`` at ``seq``."""
    took: dict[str, list[float]] = {}
    params = {"run_id": run_id, "seq": seq, "owner": "storage:0", "ttl": 600,
              "bind": Jsonb({}), "revision": HEAD_REVISION,
              "leases": Jsonb({})}
    workflow: Workflow[Any] = chat
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        for _ in range(samples + 1):
            cpu, started = time.process_time(), time.perf_counter()
            row = store.conn.one(statement("claim"), params, binary=True)
            if row is None:
                raise RuntimeError(f"could not claim {run_id} at {seq}")
            at = _timed(took, "claim_statement", started)
            claim = Claim.from_row(row)
            at = _timed(took, "claim_from_row", at)
            restored = restore(ledger.keys, registry, claim)
            _timed(took, "restore", at)
            took.setdefault("cpu_claim_and_restore", []).append(
                (time.process_time() - cpu) * 1000)
            if not isinstance(restored, Restored):
                raise RuntimeError(f"restore of {run_id} at {seq} refused: {restored}")
            conn.execute(_HAND_BACK, {"run_id": run_id})
            _parts(took, conn, row, workflow, restored.opened)
    return {name: round(statistics.median(values[1:]), 3) for name, values in took.items()}


def _parts(took: dict[str, list[float]], conn: psycopg.Connection[Any], row: dict[str, Any],
           workflow: Workflow[Any], opened: Any) -> None:
    """The Python side of one restore, timed part by part (what ``Claim.from_row`` and
    ``restore`` do together), and the state artifact's statement alone."""
    at = time.perf_counter()
    artifact = row["state_artifact"]
    base = row["chain_base"] if row["cp_snapshot_seq"] is not None else row["cp_state"]
    if artifact is not None:
        ref = artifact_ref(base)
        assert ref is not None
        conn.execute(_ARTIFACT, {"sha": ref["sha256"]}, prepare=True, binary=True).fetchone()
        at = _timed(took, "artifact_select_alone", at)
        hashlib.sha256(artifact).hexdigest()
        at = _timed(took, "artifact_sha256", at)
        base = states.parse_json(artifact)
        at = _timed(took, "artifact_parse", at)
    owned: dict[int, Any] = {}
    for delta in row["chain_deltas"] or []:
        base = states.apply(base, delta, owned=owned)
    at = _timed(took, "deltas_apply", at)
    digest = states.snapshot_digest(row["chain_base"] or {})
    for delta in row["chain_deltas"] or []:
        digest = states.chain_digest(digest, delta)
    at = _timed(took, "deltas_chain_digest", at)
    copied = states.copy_json(opened)
    at = _timed(took, "restore_copy", at)
    workflow.state.model_validate(copied)
    _timed(took, "restore_validate", at)


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
        assert final is not None  # a state of its own (not stored apart): inline here
        content = len(canonical_json(final))
        short_run = ledger.start_run("storage_chat", start)
        early = min(10, args.steps)
        drive(store, registry, cfg, short_run, early)
        one_snapshot = ledger.start_run("storage_chat", final)
        at_end = restore_p50_ms(url, store, registry, ledger, long_run, args.steps,
                                args.samples)
        at_early = restore_p50_ms(url, store, registry, ledger, short_run, early, args.samples)
        alone = restore_p50_ms(url, store, registry, ledger, one_snapshot, 0, args.samples)
        phases = {f"restore_phases_ms_at_step_{at}": restore_phases_ms(
            url, store, registry, ledger, run, at, args.samples)
            for run, at in ((long_run, args.steps), (short_run, early))} if args.phases else {}
        with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
            kinds = conn.execute(_KINDS, {"run_id": long_run}).fetchone()
    finally:
        store.close()
        ledger.engine.dispose()
    return {
        "steps": args.steps, "message_bytes": args.message_bytes,
        "snapshot_every": args.snapshot_every, "as_worker": args.as_worker,
        "content_bytes": content, "stored_bytes": stored,
        "stored_per_content": round(stored / content, 3),
        "snapshots": kinds[0] if kinds else None, "deltas": kinds[1] if kinds else None,
        f"restore_p50_ms_at_step_{args.steps}": at_end,
        f"restore_p50_ms_at_step_{early}": at_early,
        "restore_p50_ms_same_state_one_snapshot": alone,
        "restore_ratio_last_vs_early": round(at_end / at_early, 2),
        "restore_chain_overhead": round(at_end / alone, 2),
        **phases,
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
    parser.add_argument("--phases", action="store_true",
                        help="also time each part of the restores at the last step and step 10")
    parser.add_argument("--as-worker", action="store_true",
                        help="set this process's allocator and collector up as a worker's")
    args = parser.parse_args()
    if args.as_worker:
        keep_freed_memory()
        freeze_startup_objects()
    structlog.configure(  # the executor's debug lines would go to stdout, the JSON's place
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    result = measured_in_scratch_database("onward_storage", lambda url: measure(url, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
