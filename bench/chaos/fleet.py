"""The bench's onward processes: workers, dispatchers and a reaper in numbered slots, each
restart a new generation with its own fault directory and database application_name."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harness.processes import Proc, Processes, stop_all

APP_PREFIX = "chaos-"  # application_name of the fleet's database connections


@dataclass
class Member:
    """One generation of one slot: ``worker0.g2`` is the third process in worker slot 0."""

    proc: Proc
    role: str  # worker | dispatcher | reaper
    slot: int
    gen: int
    faults: str = ""  # the ONWARD_FAULTS it was started with
    fault_dir: Path | None = None
    ready_at: float | None = None  # time.monotonic() when "ready." appeared in its log

    @property
    def name(self) -> str:
        return self.proc.name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def unfired(self) -> str:
        """The fault specs armed in this process that have not fired yet."""
        specs = [f.strip() for f in self.faults.split(",") if f.strip()]
        if not specs or self.fault_dir is None:
            return ",".join(specs)
        fired = {m.name.split("@")[0] + "." + m.name.split(".")[-2]
                 for m in self.fault_dir.glob("*.fired")}
        return ",".join(f for f in specs
                        if f"{f.split(':')[0].split('@')[0]}.{f.split(':')[1]}" not in fired)

    def all_fired(self) -> bool:
        """Whether every fault armed in this process (if any) has fired."""
        return not self.unfired()


class Fleet:
    """Starts and tracks the onward processes of this bench."""

    def __init__(self, env: dict[str, str], log_dir: Path, faults_root: Path,
                 concurrency: int) -> None:
        self.processes = Processes(env=env, log_dir=log_dir)
        self.faults_root = faults_root
        self.concurrency = concurrency
        self.gens: Counter[str] = Counter()
        self.current: dict[tuple[str, int], Member] = {}
        self.all: list[Member] = []

    def _start(self, role: str, slot: int, args: list[str], faults: str) -> Member:
        gen = self.gens[f"{role}{slot}"]
        self.gens[f"{role}{slot}"] += 1
        name = f"{role}{slot}.g{gen}"
        fault_dir = self.faults_root / name
        fault_dir.mkdir(parents=True, exist_ok=True)
        proc = self.processes.onward(name, args, {
            "ONWARD_FAULTS": faults, "ONWARD_FAULTS_DIR": str(fault_dir),
            "PGAPPNAME": f"{APP_PREFIX}{name}"})  # how kill_backend finds its connections
        member = Member(proc, role, slot, gen, faults=faults, fault_dir=fault_dir)
        self.current[(role, slot)] = member
        self.all.append(member)
        return member

    def worker(self, slot: int, faults: str = "") -> Member:
        node = f"chaos-w{slot}-g{self.gens[f'worker{slot}']}-{os.getpid()}@{socket.gethostname()}"
        return self._start("worker", slot, ["worker", "-c", str(self.concurrency),
                                            "--name", node], faults)

    def dispatcher(self, slot: int, faults: str = "") -> Member:
        return self._start("dispatcher", slot, ["dispatcher"], faults)

    def reaper(self, slot: int = 0) -> Member:
        return self._start("reaper", slot, ["reaper"], "")

    def live(self, role: str) -> list[Member]:
        return [m for (r, _), m in sorted(self.current.items()) if r == role and m.alive()]

    def workers_ready(self, for_s: float = 0.0) -> list[Member]:
        """Live workers whose pool is up (for at least ``for_s`` seconds)."""
        now = time.monotonic()
        for member in self.live("worker"):
            if member.ready_at is None and member.proc.ready():
                member.ready_at = now
        return [m for m in self.live("worker")
                if m.ready_at is not None and now - m.ready_at >= for_s]

    def armed(self) -> list[Member]:
        return [m for m in self.all if m.faults and m.fault_dir is not None]

    def fired(self) -> list[tuple[str, str]]:
        """(role, marker) for every named fault point that fired."""
        found = []
        for member in self.armed():
            assert member.fault_dir is not None
            for marker in sorted(member.fault_dir.glob("*.fired")):
                point = marker.name.split("@")[0]
                action = marker.name.split(".")[-2]
                found.append((member.role, point if action == "kill" else f"{point}:{action}"))
        return found

    def stop_markers(self) -> list[tuple[Path, int]]:
        """(marker, pid) of every ``stop`` fault that fired: that process is SIGSTOPped."""
        found = []
        for member in self.armed():
            assert member.fault_dir is not None
            for marker in member.fault_dir.glob("*.stop.fired"):
                with contextlib.suppress(OSError, ValueError):
                    found.append((marker, int(marker.read_text().strip())))
        return found

    def stop_all(self) -> None:
        stop_all(m.proc for m in reversed(self.all))
