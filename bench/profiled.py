"""Run a bench worker under cProfile: every prefork child, and the parent once it is ready.

    python -m bench.profiled console worker -c 2 ...  # the `onward` CLI, unchanged
    python -m bench.profiled plain                     # bench/plain_celery.py's worker

BENCH_PROFILE_DIR is where ``<label>-<role>-<pid>.prof`` files go (written at shutdown);
BENCH_PROFILE_CLOCK is ``cpu`` (time.process_time, the default) or ``wall``. Used by
``bench/steps.py --profile DIR``; the product code is not touched.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from celery import signals

_DIR = Path(os.environ.get("BENCH_PROFILE_DIR", "bench-profile"))
_LABEL = os.environ.get("BENCH_PROFILE_LABEL", "worker")
_TIMER = time.process_time if os.environ.get("BENCH_PROFILE_CLOCK", "cpu") == "cpu" \
    else time.perf_counter
_state: dict[str, Any] = {}


def _start(role: str) -> None:
    old = _state.get("profile")
    if old is not None:
        old.disable()  # a forked child inherits its parent's profiler
    profile = cProfile.Profile(_TIMER)
    _state.update(profile=profile, role=role, pid=os.getpid())
    profile.enable()


def _dump() -> None:
    profile = _state.get("profile")
    if profile is None or _state.get("pid") != os.getpid():
        return
    profile.disable()
    _DIR.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(str(_DIR / f"{_LABEL}-{_state['role']}-{os.getpid()}.prof"))
    _state["profile"] = None


def _on_child_init(**_: Any) -> None:
    _start("child")


def _on_ready(**_: Any) -> None:
    _start("parent")


def _on_exit(**_: Any) -> None:
    _dump()


signals.worker_process_init.connect(_on_child_init, weak=False)
signals.worker_ready.connect(_on_ready, weak=False)
signals.worker_process_shutdown.connect(_on_exit, weak=False)
signals.worker_shutdown.connect(_on_exit, weak=False)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m bench.profiled MODULE|plain [args]")
    target, args = sys.argv[1], sys.argv[2:]
    if target == "plain":
        from bench.plain_celery import main as plain_main

        plain_main()
        return
    sys.argv = [target, *args]
    runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
