"""A worker's advertisement (workers/advertise.py): a clean stop removes its row for good."""

from __future__ import annotations

import threading

from ledger.db import database_url
from ledger.fleet import FleetStore
from workers.advertise import Advertiser
from workers.settings import WorkerSettings


class _HeldAdvertiser(Advertiser):
    """An advertiser whose next advertisement, once under way, waits for ``go``: the moment
    a stop can come while the thread is between its loop check and its write."""

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings, [], node="worker-advertise-test", concurrency=2)
        self.under_way = threading.Event()
        self.go = threading.Event()

    def advertise(self) -> None:
        if threading.current_thread() is self:
            self.under_way.set()
            self.go.wait(30)
        super().advertise()


def _rows(settings: WorkerSettings, node: str) -> list[object]:
    store = FleetStore(database_url(settings))
    return [w for w in store.workers(within_s=3600) if w.node == node]


def test_retire__an_advertisement_under_way_does_not_write_the_row_back(
        settings: WorkerSettings) -> None:
    """A stop during an advertisement: the row is removed after that advertisement, never
    before it (before, the worker was listed live after its clean stop)."""
    advertiser = _HeldAdvertiser(settings)
    advertiser.advertise()  # as the worker does before its first message
    assert len(_rows(settings, advertiser.node)) == 1
    advertiser.start()
    assert advertiser.under_way.wait(30), "the advertising thread never advertised"

    retiring = threading.Thread(target=advertiser.retire)
    retiring.start()
    retiring.join(1.0)  # without the wait in retire, the row is removed by now
    advertiser.go.set()
    retiring.join(30)
    advertiser.join(30)

    assert not retiring.is_alive() and not advertiser.is_alive()
    assert _rows(settings, advertiser.node) == []
