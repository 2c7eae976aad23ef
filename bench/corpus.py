"""Corpus replay at size: record R runs of the research agent (five steps, four model calls
each), pin them, and replay the corpus offline twice: against the code that recorded it
(every run must be identical) and against version 2 of the agent (examples/research_v2.py:
every run must diverge, where expected).

    python bench/corpus.py [--runs 1000] [--jobs N] [--record-jobs 2] [--json]

Creates a database of its own on the server ONWARD_DATABASE_URL names (or the embedded
one) and a model server on loopback answering at once (the outside world while recording;
a replay asks it nothing: the bench checks its request count). Runs are recorded in
``--record-jobs`` processes, each driving its share through the real executor
(tests/support/driver.py). Each replay is timed as a user waits for it: the corpus read in
a READ ONLY transaction, the bundle checked, a scratch database created, migrated, loaded,
every run verified and replayed in ``--jobs`` processes, the report built, the scratch
database dropped. Target: 1,000 five-step runs replayed in under 60 s. The bench's
database is dropped at the end.

One JSON line: ``runs``, ``seconds``, ``runs_per_s``, ``identical``, ``divergent``,
``expected_divergent`` for the same code, and the same keys under ``changed`` for version 2.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.databases import create_database, drop_database  # noqa: E402
from harness.model_server import ModelServer  # noqa: E402
from harness.processes import Processes  # noqa: E402
from ledger import Ledger, OnwardSettings, RunStatus  # noqa: E402
from ledger.bundle import read_bundle  # noqa: E402
from ledger.corpora import Corpora  # noqa: E402
from ledger.corpus import Selection  # noqa: E402
from ledger.db import database_url  # noqa: E402
from tasks.corpus.compare import Kind  # noqa: E402
from tasks.corpus.replayer import ReplayOptions  # noqa: E402
from tasks.corpus.report import Policy, summarize  # noqa: E402
from tasks.corpus.runner import CorpusReplay, replay_bundle  # noqa: E402

TARGET_S = 60.0
SAME, CHANGED = "examples.research", "examples.research_v2"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def record_share(payload: str) -> str:
    """Drive the runs a payload names to their end (one recording process)."""
    from tasks.corpus.worker import init_worker
    from tests.support.driver import driver

    init_worker()  # quiet: no step logs
    data = json.loads(payload)
    os.environ["ONWARD_MODEL_URL"] = data["model_url"]
    ledger = Ledger.from_env(OnwardSettings(database_url=data["url"]))
    with driver(ledger, [SAME]) as drv:
        done = sum(drv.drive(UUID(r)).status is RunStatus.COMPLETED for r in data["runs"])
    return json.dumps(done)


def record(ledger: Ledger, url: str, model_url: str, runs: int, jobs: int) -> list[UUID]:
    run_ids = [ledger.start_run("research_agent", {"topic": f"bench-{i:04d}"},
                                allow_unadvertised=True)  # no worker: the bench drives them
               for i in range(runs)]
    payloads = [json.dumps({"url": url, "model_url": model_url,
                            "runs": [str(r) for r in run_ids[i::jobs]]}) for i in range(jobs)]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        completed = sum(json.loads(done) for done in pool.map(record_share, payloads))
    if completed != runs:
        raise SystemExit(f"only {completed} of {runs} recorded runs completed")
    return run_ids


def expected_divergent(ledger: Ledger, run_ids: list[UUID]) -> dict[str, int]:
    """What version 2 must report for each run: its new validation step where a source is
    not vetted, else its new draft prompt."""
    from examples.research_v2 import vetted

    expected = {Kind.NEXT_STEP.value: 0, Kind.REQUEST.value: 0}
    for run_id in run_ids:
        state = ledger.checkpoints(run_id)[1].state
        assert state is not None
        sources = state["sources"]
        kind = Kind.REQUEST if all(vetted(s) for s in sources) else Kind.NEXT_STEP
        expected[kind.value] += 1
    return expected


def figures(replay: CorpusReplay, expected: int) -> dict[str, Any]:
    summary = summarize(replay, Policy())
    return {"runs": summary.runs, "seconds": round(replay.seconds, 2),
            "runs_per_s": round(summary.runs / replay.seconds, 1),
            "identical": summary.identical, "divergent": summary.divergent,
            "expected_divergent": expected, "by_kind": summary.by_kind,
            "jobs": replay.jobs, "code": replay.options.modules[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=None,
                        help="replay processes (default: two per CPU)")
    parser.add_argument("--record-jobs", type=int, default=2, help="recording processes")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()

    settings = OnwardSettings()
    name, url = create_database(database_url(settings), "onward_bench_corpus")
    workdir = Path(tempfile.mkdtemp(prefix="onward-bench-corpus-"))
    processes = Processes(env={}, log_dir=workdir)
    model = ModelServer.start(processes, workdir, "--latency-ms", "0", "--jitter", "0")
    try:
        bench = settings.model_copy(update={"database_url": url})
        ledger = Ledger.from_env(bench)
        started = time.perf_counter()
        log(f"recording {args.runs} runs of research_agent in {args.record_jobs} processes …")
        run_ids = record(ledger, url, model.url, args.runs, args.record_jobs)
        recorded_s = time.perf_counter() - started
        expected = expected_divergent(ledger, run_ids)
        Corpora(ledger).add("bench", Selection())
        asked = model.stats()["requests"]
        results = {}
        for code in (SAME, CHANGED):
            log(f"replaying against {code} …")
            bundle = read_bundle(Corpora(ledger).snapshot("bench"), ledger.keys)
            replay = replay_bundle(bench, bundle, ReplayOptions((code,), label="bench"),
                                   jobs=args.jobs)
            results[code] = figures(replay, 0 if code == SAME else sum(expected.values()))
        if model.stats()["requests"] != asked:
            raise SystemExit("a replay asked the model server something")
    finally:
        model.stop()
        drop_database(database_url(settings), name)
    same, changed = results[SAME], results[CHANGED]
    out = {**same, "changed": {**changed, "expected_by_kind": expected},
           "record_seconds": round(recorded_s, 1), "target_s": TARGET_S,
           "target_met": same["seconds"] < TARGET_S and changed["seconds"] < TARGET_S}
    if not args.json:
        for label, row in (("same code", same), ("version 2", changed)):
            log(f"{label:>10}: {row['runs']} runs in {row['seconds']:.1f} s "
                f"({row['runs_per_s']:.0f} runs/s): {row['identical']} identical, "
                f"{row['divergent']} divergent (expected {row['expected_divergent']})")
    print(json.dumps(out))
    wrong = (same["identical"] != same["runs"]
             or changed["by_kind"] != {k: v for k, v in expected.items() if v})
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
