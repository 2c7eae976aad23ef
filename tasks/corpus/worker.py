"""What runs in each replay process (tasks/corpus/runner.py): it imports only what a replay
needs (not the migrations, not the CLI), so the processes start quickly."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import structlog
from pydantic import SecretStr

from ledger import Ledger, OnwardSettings
from ledger.crypto import master_keys_text
from ledger.db import engine_of_its_own
from tasks import faults
from tasks.corpus.replayer import Replayer, ReplayOptions

__all__ = ["init_worker", "ledger_for", "quiet", "replay_chunk", "replayer_for"]


_replayers: dict[str, Replayer] = {}


def init_worker() -> None:
    """A replay process runs no fault points and logs nothing but failures of its own:
    the report says what each replay did."""
    os.environ.pop("ONWARD_FAULTS", None)
    faults.arm_from_env()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """``init_worker``'s quiet logging, for replays in this process, then put back."""
    previous = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        yield
    finally:
        structlog.configure(**previous)


def replay_chunk(payload: str) -> str:
    """Replay the runs a payload names (JSON in, JSON out): one task of the pool. A worker
    process keeps its replayer for the pool's life (the pool ends with the replay)."""
    data = json.loads(payload)
    key = json.dumps([data["url"], data["options"]], sort_keys=True)
    replayer = _replayers.get(key)
    if replayer is None:
        replayer = _replayers[key] = replayer_for(data)
    return json.dumps([replayer.replay(UUID(r)).as_json() for r in data["runs"]])


def replayer_for(data: dict[str, Any]) -> Replayer:
    settings = OnwardSettings(**{**data["settings"], "database_url": data["url"]})
    return Replayer(ledger_for(settings, data["url"]), ReplayOptions.from_json(data["options"]))


def ledger_for(settings: OnwardSettings, url: str) -> Ledger:
    """A ledger on the scratch database, with an engine of its own (disposed by its user)."""
    update: dict[str, Any] = {"database_url": url}
    keys = master_keys_text(settings)  # the embedded default's, read from its home
    if keys is not None:
        update["encryption_keys"] = SecretStr(keys)
    scratch = settings.model_copy(update=update)
    return Ledger(engine_of_its_own(url, pool_size=2), scratch)
