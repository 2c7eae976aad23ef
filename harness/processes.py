"""Real processes for tests, benchmarks and the demo: ``onward`` workers, dispatchers and
reapers (or any Python module), each in its own session with its own log file.

Nothing here fakes a part of onward: each process is the command an operator runs, against
a real PostgreSQL and a real Redis. A process leads its own process group, so a Celery
worker and its pool children can be SIGKILLed together, as when a host dies. On Linux each
is also told to stop (SIGTERM) when the process that started it dies: a test run killed
before its teardown (pytest-xdist kills a worker whose teardown outlasts 10 s after Ctrl-C;
a crash; SIGKILL) leaves no dispatcher, reaper or worker running against its database.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.errors import ProcessExited, TimedOut
from harness.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: processes start here, with it first on PYTHONPATH."""


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stop_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent SIGTERM (a warm shutdown) when this process
    dies, by prctl(PR_SET_PDEATHSIG); kept across exec. Linux only. The signal follows the
    death of the *thread* that forked, so it is armed only for children of the main thread
    (a helper thread that ends would stop them early)."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


@dataclass
class Proc:
    """One subprocess; ``killed`` and ``stopped`` say that its end was ours, on purpose."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False  # SIGKILLed with kill_tree()
    stopped: bool = False  # asked to stop with stop() or stop_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def ended_by_us(self) -> bool:
        return self.killed or self.stopped

    def children(self) -> list[int]:
        """Live descendants (zombies left out): a worker's pool children."""
        found = []
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
        return found

    def tree(self) -> list[int]:
        """This process and its live descendants."""
        return [self.pid, *self.children()] if self.alive() else self.children()

    def step_pids(self) -> list[int]:
        """The pids that run a worker's steps: the prefork children, or the process itself
        (threads, gevent pools)."""
        return [self.pid, *self.children()]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return self.log()[-chars:]

    def ready(self) -> bool:
        """A Celery worker's pool is up (it logs ``ready.``)."""
        return "ready." in self.log()

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill_tree(self) -> None:
        """SIGKILL the process and everything under it at once: no warm shutdown, no ack."""
        self.killed = True
        self._sigkill()

    def _sigkill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # its own session: only its tree, at once
        pids = [*self.children(), self.pid]  # any that left the group
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state): go on
            self.popen.wait(timeout=10)

    def terminate(self) -> None:
        """Ask for a warm shutdown (a worker finishes its step, then exits); stopped
        children are continued first, since they would block it."""
        self.stopped = True
        if not self.alive():
            return
        for pid in self.children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        """Wait for the exit until ``deadline`` (monotonic), then SIGKILL what is left."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        self._sigkill()  # also pool children of a worker that died hard

    def stop(self, timeout: float = 15.0) -> None:
        self.terminate()
        self.finish(time.monotonic() + timeout)


def stop_all(procs: Iterable[Proc], timeout: float = 15.0) -> None:
    """Stop several processes in parallel: all are asked first, then waited for together."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.finish(deadline)


@dataclass
class Processes:
    """Starts Python processes from the repository root with ``env`` over this process's
    environment, each in its own session, logging to ``log_dir/NN-name.log``."""

    env: dict[str, str]
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)
    started: int = 0

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, *,
              cwd: Path = ROOT) -> Proc:
        """``python ARGV...``, e.g. ``["-m", "examples.provider", "--port", "0"]``, from
        ``cwd`` (the repository root unless told)."""
        full_env = {**os.environ, **self.env, **(env or {})}
        path = full_env.get("PYTHONPATH", "")
        if path.split(os.pathsep)[0] != str(ROOT):
            full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), path]))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{self.started:02d}-{name}.log"
        self.started += 1
        with open(log_path, "wb") as handle:  # the child keeps its own descriptor
            popen = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=full_env,
                                     stdout=handle, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_stop_with_parent())
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def onward(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        """An ``onward`` command, e.g. ``["dispatcher"]`` or ``["metrics", "--port", "0"]``."""
        return self.start(name, ["-m", "console", *args], env)

    def worker(self, name: str, *, concurrency: int = 2, node: str | None = None,
               env: dict[str, str] | None = None, pool: str | None = None) -> Proc:
        """``onward worker [-P POOL] -c N --name NODE`` (node defaults to name@host)."""
        node = node or f"{name}@{socket.gethostname()}"
        pool_args = ["-P", pool] if pool else []
        return self.onward(name, ["worker", *pool_args, "-c", str(concurrency), "--name", node],
                           env)

    def exited(self) -> list[Proc]:
        """Processes that ended without us ending them."""
        return [p for p in self.procs if not p.alive() and not p.ended_by_us()]

    def check_alive(self) -> None:
        """Raise ProcessExited, with its log, if a process ended without us ending it."""
        for proc in self.exited():
            raise ProcessExited(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")

    def stop_all(self, timeout: float = 15.0) -> None:
        stop_all(reversed(self.procs), timeout)

    def logs(self, chars: int = 4000) -> str:
        return "\n".join(f"===== {p.name} ({p.pid}) =====\n{p.tail(chars)}" for p in self.procs)


def wait_ready(procs: list[Proc], timeout: float = 90.0) -> None:
    """Wait until every worker in ``procs`` is ready; ProcessExited if one exits first."""
    def ready() -> bool:
        for proc in procs:
            if not proc.alive():
                raise ProcessExited(f"{proc.name} exited ({proc.popen.returncode}) before it "
                                    f"was ready:\n{proc.tail()}")
        return all(proc.ready() for proc in procs)

    wait_for(ready, timeout=timeout, what=", ".join(p.name for p in procs) + " to be ready",
             seen=lambda: {p.name: p.tail(300) for p in procs if not p.ready()})


def wait_answers_ping(app: Any, proc: Proc, node: str, timeout: float = 120.0) -> None:
    """A Celery worker is ready when it answers a remote-control ping (at any log level)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ProcessExited(f"{proc.name} exited:\n{proc.tail()}")
        if app.control.ping(destination=[node], timeout=0.5):
            return
    raise TimedOut(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.tail()}")
