"""Real onward processes for tests: celery workers, dispatchers, reapers, as subprocesses.

Nothing here fakes a part of onward: each process is the same ``onward`` command an
operator runs, against a real PostgreSQL and a real Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], T], *, timeout: float, what: str,
             interval: float = 0.05, seen: Callable[[], Any] | None = None) -> T:
    """Poll until ``predicate()`` is truthy; fail with what was seen at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"; last seen: {seen()!r}" if seen is not None else f"; last value: {value!r}"
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def step_pids(self) -> list[int]:
        """The pids that run steps: the prefork children, or the process itself."""
        return [self.pid, *self.children()]

    def children(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill_tree(self) -> None:
        """SIGKILL the process and all its children (a whole worker host dying)."""
        for pid in [*self.children(), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        for pid in self.children():  # a SIGSTOPped child would block a warm shutdown
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_tree()


@dataclass
class Cluster:
    """Starts onward processes with one environment (database, broker, queue, home)."""

    env: dict[str, str]
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    def _start(self, name: str, args: list[str], extra_env: dict[str, str] | None) -> Proc:
        env = {**os.environ, **self.env, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        index = len(self.procs)
        log_path = self.log_dir / f"{index:02d}-{name}.log"
        handle = open(log_path, "wb")  # noqa: SIM115 - owned by the process for its lifetime
        popen = subprocess.Popen(
            [sys.executable, "-m", "console", *args],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, *, concurrency: int = 2, env: dict[str, str] | None = None,
               name: str = "worker", wait_ready: bool = True, pool: str = "prefork") -> Proc:
        """``onward worker -P pool -c concurrency``: prefork children run the steps, or (threads,
        gevent) the worker process itself does."""
        proc = self._start(name, ["worker", "-P", pool, "-c", str(concurrency), "--name",
                                  f"{name}-{len(self.procs)}@test"], env)
        if wait_ready:
            wait_for(lambda: "ready." in proc.log() or not proc.alive(), timeout=60,
                     what=f"{name} to be ready")
            if not proc.alive():
                raise AssertionError(f"{name} exited:\n{proc.log()[-3000:]}")
        return proc

    def command(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        """Any other ``onward`` command, e.g. ``["metrics", "--port", "9464"]``."""
        return self._start(name, args, env)

    def dispatcher(self, env: dict[str, str] | None = None) -> Proc:
        return self._start("dispatcher", ["dispatcher"], env)

    def reaper(self, env: dict[str, str] | None = None) -> Proc:
        return self._start("reaper", ["reaper"], env)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} ({p.pid}) =====\n{p.log()[-4000:]}" for p in self.procs)
