"""A/B variant for bench/steps.py: onward with the Flower events of eager steps switched
off (workers/events.py), to measure what they cost.

    python bench/steps.py --variant bench.no_eager_events --no-broker-path --rounds 3

Every other event (task-sent, the delivered message's received/started/succeeded) stays on,
as `onward worker -E` sends them.
"""

from __future__ import annotations

import runpy
from typing import Any

from workers.events import EagerEvents


def _silent(self: EagerEvents, hostname: str, *events: Any) -> None:
    """No event for an eager step."""


EagerEvents._send = _silent  # type: ignore[method-assign]

if __name__ == "__main__":
    runpy.run_module("console", run_name="__main__")
