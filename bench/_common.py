"""What the benches that measure in a database of their own share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.databases import create_database, drop_database
from ledger import OnwardSettings
from ledger.db import database_url

__all__ = ["backend_cpu_s", "measured_in_scratch_database"]


def measured_in_scratch_database(prefix: str,
                                 measure: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """``measure(url)`` run in a database of its own on the server of
    ``ONWARD_DATABASE_URL`` (``<prefix>_<random>``, migrated, dropped afterwards), with the
    machine's 1-minute load average and CPU count after it, which say how busy the figures
    were measured."""
    admin_url = database_url(OnwardSettings())
    name, url = create_database(admin_url, prefix)
    try:
        result = measure(url)
    finally:
        drop_database(admin_url, name)
    load1, _, _ = os.getloadavg()
    return {**result, "load_1min": round(load1, 2), "cpus": os.cpu_count()}


def backend_cpu_s(pid: int) -> float | None:
    """CPU seconds of a local PostgreSQL backend (None: not on this host): its time on a
    CPU from ``/proc/<pid>/schedstat``, in nanoseconds, else user + system time from
    ``/proc/<pid>/stat``, in the kernel's ticks (10 ms: a figure per statement needs
    thousands of them)."""
    proc = Path(f"/proc/{pid}")
    try:
        return int((proc / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
