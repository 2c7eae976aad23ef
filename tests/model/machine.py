"""What tests/model/test_protocol.py's ProtocolMachine holds, declared once with its types
for the rule mixins it is made of (interleavings, tampering, wait_edits): each mixin derives
from ``MachineParts`` instead of declaring the attributes it reads again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypothesis.stateful import Bundle

from ledger import Ledger
from ledger.recovery import RecoveryStore
from tests.model.harness import Broker, Dispatcher, Worker
from tests.model.invariants import RunBook
from tests.model.world import World

if TYPE_CHECKING:
    from tests.model.test_protocol import Environment

__all__ = ["MachineParts"]


class MachineParts:
    """The state machine's attributes (annotations only: ProtocolMachine sets them)."""

    runs: Bundle[Any]
    env: Environment  # the database, clock and crash switch every example shares
    ledger: Ledger
    book: RunBook  # what the invariants remember between steps
    world: World  # the provider and the model, counting what they saw
    broker: Broker
    workers: list[Worker]
    dispatcher: Dispatcher
    reaper: RecoveryStore
