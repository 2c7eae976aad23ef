"""Replay a whole corpus offline (docs/corpus.md#offline-replay): verify the bundle, load it
into a scratch ledger, replay its runs in parallel processes, collect one outcome per run,
and drop the scratch ledger. Nothing is written anywhere else.

Worker processes are forked from a fresh server process that imported only
tasks/corpus/worker.py (``forkserver``): they share nothing with this one but the scratch
ledger's URL and the options, passed as JSON text, and send back JSON text.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from ledger import Ledger, OnwardSettings
from ledger.bundle import Bundle
from ledger.corpus_bundle import load_txn
from ledger.corpus_replays import ReplayCopy, copy_replays_txn
from ledger.crypto import master_keys_text
from ledger.db import wrap_driver_errors
from ledger.exceptions import IntegrityViolation
from ledger.scratch import scratch_database
from tasks.corpus.replayer import ReplayOptions, RunOutcome, verify_runs
from tasks.corpus.worker import init_worker, ledger_for, quiet, replay_chunk, replayer_for

__all__ = ["CorpusReplay", "Progress", "default_jobs", "replay_bundle"]


Progress = Callable[[int, int], None]
"""(runs done, runs in all): called as outcomes arrive."""


@dataclass
class CorpusReplay:
    """Every run's outcome, with what was replayed against what."""

    source: dict[str, Any]
    options: ReplayOptions
    outcomes: list[RunOutcome]
    seconds: float
    jobs: int
    copies: list[ReplayCopy] = field(default_factory=list)  # replays kept to open as branches


def replay_bundle(settings: OnwardSettings, bundle: Bundle, options: ReplayOptions, *,
                  jobs: int | None = None, scratch_url: str | None = None,
                  keep: Callable[[RunOutcome], bool] | None = None,
                  progress: Progress | None = None) -> CorpusReplay:
    """Replay every run of a verified ``bundle`` against ``options.modules``; ``keep``
    selects the replays to copy out (``--open-branches``) before the scratch ledger goes."""
    started = time.perf_counter()
    jobs = max(1, min(jobs or default_jobs(), len(bundle.run_ids)))
    with scratch_database(settings, scratch_url) as url:
        scratch = ledger_for(settings, url)
        try:
            with wrap_driver_errors("loading the bundle"), scratch.engine.begin() as conn:
                load_txn(conn, bundle, str(bundle.header.get("tenant_id")))
            outcomes = _replay_all(settings, scratch, bundle.run_ids, options, jobs, progress)
            copies = _copies(scratch, outcomes, keep) if keep is not None else []
        finally:
            scratch.engine.dispose()
    return CorpusReplay(_source(bundle), options, outcomes, time.perf_counter() - started,
                        jobs, copies)


def default_jobs() -> int:
    """Two replay processes per CPU: a replay spends much of its time waiting for
    PostgreSQL (two round trips per step), so one per CPU leaves them idle."""
    return 2 * (os.cpu_count() or 1)


def _source(bundle: Bundle) -> dict[str, Any]:
    return {"corpus": bundle.header.get("corpus"), "digest": bundle.digest,
            "exported_at": bundle.header.get("exported_at"),
            "tenant_id": bundle.header.get("tenant_id"), "runs": len(bundle.run_ids)}


def _replay_all(settings: OnwardSettings, scratch: Ledger, run_ids: list[UUID],
                options: ReplayOptions, jobs: int, progress: Progress | None) -> list[RunOutcome]:
    """Replay in ``jobs`` processes while this one verifies every run: a run that does not
    verify refuses the whole replay (nothing is reported from unverified records; the
    replays meanwhile call nothing outside the scratch ledger)."""
    order = {str(run_id): i for i, run_id in enumerate(run_ids)}
    chunks = [run_ids[i::jobs * 4] for i in range(jobs * 4)]
    payloads = [json.dumps({"url": scratch.url, "settings": _settings_json(settings),
                            "options": options.as_json(), "runs": [str(r) for r in chunk]})
                for chunk in chunks if chunk]
    outcomes: list[RunOutcome] = []
    with _mapped(payloads, jobs) as results:
        _refuse_unverified(verify_runs(scratch, run_ids))
        for result in results:
            outcomes.extend(RunOutcome.from_json(o) for o in json.loads(result))
            if progress is not None:
                progress(len(outcomes), len(run_ids))
    return sorted(outcomes, key=lambda o: order[o.run_id])


@contextlib.contextmanager
def _mapped(payloads: list[str], jobs: int) -> Iterator[Iterator[str]]:
    """The replays' results as they come; with ``jobs`` > 1 they are already running in
    their processes when this yields."""
    if jobs == 1:  # in this process, with a replayer of its own, closed afterwards
        with quiet(), contextlib.closing(replayer_for(json.loads(payloads[0]))) as replayer:
            yield (json.dumps([replayer.replay(UUID(r)).as_json()
                               for r in json.loads(payload)["runs"]]) for payload in payloads)
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tasks.corpus.worker"])
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                             initializer=init_worker) as pool:
        try:
            yield pool.map(replay_chunk, payloads)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # nothing more to replay: refused or stopped
            raise


def _settings_json(settings: OnwardSettings) -> dict[str, Any]:
    """The ledger's settings a replay process needs (not the CLI's token, nor a worker's:
    ``settings`` may be either's, which extend ``OnwardSettings``), as JSON; the master
    encryption keys as their value (JSON masks a secret as ``**********``, with which the
    replays could not open sealed values; the embedded default's come from its home's key
    file, which a scratch ledger with a URL of its own would not read): they go to the
    replay processes only, in the payload, never to a log."""
    data = settings.model_dump(mode="json",
                               include=set(OnwardSettings.model_fields) - {"database_url"})
    keys = master_keys_text(settings)  # the embedded default's too: from its home's file
    if keys is not None:
        data["encryption_keys"] = keys
    return data


def _refuse_unverified(broken: dict[str, list[str]]) -> None:
    if broken:
        shown = "; ".join(problems[0] for problems in list(broken.values())[:3])
        raise IntegrityViolation(
            f"{len(broken)} run(s) of the bundle do not verify with the keys configured here, "
            f"so nothing is reported: {shown} (are these the MAC keys of the ledger the bundle "
            "came from?)")


def _copies(scratch: Ledger, outcomes: list[RunOutcome],
            keep: Callable[[RunOutcome], bool]) -> list[ReplayCopy]:
    wanted = [o for o in outcomes if o.replay_run_id and keep(o)]
    with wrap_driver_errors("reading replays"), scratch.engine.connect() as conn:
        return copy_replays_txn(conn, [UUID(str(o.replay_run_id)) for o in wanted])
