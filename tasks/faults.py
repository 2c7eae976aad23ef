"""Named fault points, armed from the environment of a real process.

    ONWARD_FAULTS="before_checkpoint_commit:kill:once,after_commit_before_publish@draft:exit"

Each entry is ``point[@step]:action[:once]``. Actions: ``kill`` (SIGKILL this process),
``exit`` (``os._exit(70)``), ``raise`` (``InjectedFault``), ``stop`` (SIGSTOP this process),
``sleep=SECONDS``. ``once`` fires a single time across every process sharing
``ONWARD_FAULTS_DIR`` (default ``$ONWARD_HOME/faults``), so a restarted worker does not die
again. Disarmed, ``point()`` is one dict lookup.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.exceptions import FaultSpecError, InjectedFault
from tasks.settings import FaultSettings

__all__ = ["POINTS", "Fault", "InjectedFault", "arm_from_env", "point"]


POINTS = frozenset(
    {
        "after_claim",
        "in_step",
        "after_effect_pending",
        "after_provider_response",
        "after_effect_recorded",
        "after_answer_refused",
        "before_checkpoint_commit",
        "after_checkpoint_commit",
        "after_commit_before_publish",
        "after_chained_commit",
        "dispatcher_after_publish_before_mark",
    }
)


@dataclass(frozen=True)
class Fault:
    point: str
    step: str | None
    action: str
    once: bool
    seconds: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> Fault:
        parts = spec.strip().split(":")
        if len(parts) < 2:
            raise FaultSpecError(f"fault {spec!r}: expected point[@step]:action[:once]")
        point, _, step = parts[0].partition("@")
        if point not in POINTS:
            raise FaultSpecError(f"fault {spec!r}: unknown point; known: {sorted(POINTS)}")
        action, _, arg = parts[1].partition("=")
        if action not in {"kill", "exit", "raise", "stop", "sleep"}:
            raise FaultSpecError(f"fault {spec!r}: unknown action {action!r}")
        once = len(parts) > 2 and parts[2] == "once"
        try:
            seconds = float(arg) if arg else 0.0
        except ValueError:
            raise FaultSpecError(
                f"fault {spec!r}: sleep needs seconds, e.g. sleep=1.5") from None
        return cls(point, step or None, action, once, seconds)


_armed: dict[str, list[Fault]] = {}
_marker_dir: Path | None = None


def arm_from_env() -> None:
    """(Re)read ONWARD_FAULTS; called at import and by worker processes after fork."""
    global _marker_dir
    _armed.clear()
    settings = FaultSettings()
    spec = settings.faults.strip()
    if not spec:
        return
    for entry in spec.split(","):
        if entry.strip():
            fault = Fault.parse(entry)
            _armed.setdefault(fault.point, []).append(fault)
    _marker_dir = settings.marker_dir
    _marker_dir.mkdir(parents=True, exist_ok=True)


def point(name: str, step: str | None = None) -> None:
    """Fire the faults armed at ``name`` (optionally only for ``step``)."""
    faults = _armed.get(name)
    if not faults:
        return
    for fault in faults:
        if fault.step is not None and fault.step != step:
            continue
        if fault.once and not _claim_once(fault):
            continue
        _fire(fault)


def _claim_once(fault: Fault) -> bool:
    assert _marker_dir is not None
    marker = _marker_dir / f"{fault.point}@{fault.step or '*'}.{fault.action}.fired"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _fire(fault: Fault) -> None:
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "exit":
        os._exit(70)
    elif fault.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.action == "sleep":
        time.sleep(fault.seconds)
    else:
        raise InjectedFault(f"fault injected at {fault.point}")


arm_from_env()
