"""The console at size: the run page of a 10,000-step run, the runs list over 100,000 runs
with a filter, and the approvals inbox with 10,000 pending.

    python bench/console.py [--runs 100000] [--approvals 10000] [--steps 10000] [--json]

Creates a database of its own on the server ONWARD_DATABASE_URL names (or the embedded
one), fills it with bulk INSERT … SELECT (ledger/fill.py), serves the console (uvicorn on
loopback, in this process), and measures each page: the server's time (the HTTP request,
median of 5) and the browser's load time (Debian's Chromium through playwright, the
navigation's duration, median of 3). Every SELECT the pages ran is EXPLAINed: any
sequential scan on a table of more than 10,000 rows is printed. Target: each under 1 s.
The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import uvicorn
from sqlalchemy.engine import Connection

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.http.app import create_app  # noqa: E402
from harness.databases import create_database, drop_database  # noqa: E402
from ledger import Ledger, OnwardSettings  # noqa: E402
from ledger.db import database_url  # noqa: E402
from ledger.fill import fill_approvals_txn, fill_long_run_txn, fill_runs_txn  # noqa: E402
from ledger.tokens import TokenRequest  # noqa: E402
from ledger.vocabulary import Role  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402

TARGET_S = 1.0
LONG_RUN = "01a00000-0000-7000-8000-00000000beef"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fill(ledger: Ledger, runs: int, approvals: int, steps: int) -> dict[str, float]:
    took: dict[str, float] = {}
    bodies: list[tuple[str, Callable[[Connection], None]]] = [
        ("runs", lambda c: fill_runs_txn(c, "default", runs)),
        ("approvals", lambda c: fill_approvals_txn(c, "default", approvals)),
        ("long_run", lambda c: fill_long_run_txn(c, "default", LONG_RUN, steps)),  # type: ignore[arg-type]
    ]
    for name, body in bodies:
        started = time.perf_counter()
        with ledger.engine.begin() as conn:
            body(conn)
        took[name] = round(time.perf_counter() - started, 2)
        log(f"filled {name} in {took[name]} s")
    with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))
    return took


class Recorder:
    """The SELECTs the console ran (statement and parameters), to EXPLAIN afterwards."""

    def __init__(self, engine: sa.engine.Engine) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.on = False
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if self.on and statement.lstrip().upper().startswith("SELECT"):
            self.seen.append((statement, parameters))


def seq_scans(engine: sa.engine.Engine, recorded: list[tuple[str, Any]]) -> list[str]:
    """Sequential scans on tables of more than 10,000 rows, from EXPLAIN of each SELECT."""
    found: list[str] = []
    with engine.connect() as conn:
        sizes: dict[Any, float] = dict(conn.execute(sa.text(
            "SELECT relname, reltuples FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'onward' AND relkind = 'r'")).all())
        raw = conn.connection.driver_connection
        assert raw is not None
        for statement, parameters in {s: (s, p) for s, p in recorded}.values():
            with raw.cursor() as cursor:
                cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
                plan = cursor.fetchone()[0]
            for node in _nodes(plan[0]["Plan"]):
                table = node.get("Relation Name")
                if node["Node Type"] == "Seq Scan" and sizes.get(table, 0) > 10_000:
                    found.append(f"Seq Scan on {table} ({int(sizes[table])} rows): "
                                 f"{' '.join(statement.split())[:200]}")
    return found


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def serve(ledger: Ledger) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ledger), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the console did not start within 30 s")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def server_times(base: str, secret: str, pages: dict[str, str]) -> dict[str, dict[str, float]]:
    times: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=base, cookies={"onward_token": secret}, timeout=60) as http:
        for name, path in pages.items():
            samples = []
            for _ in range(5):
                started = time.perf_counter()
                answer = http.get(path)
                samples.append(time.perf_counter() - started)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: {answer.status_code} {answer.text[:300]}")
            times[name] = {"median_s": round(statistics.median(samples), 3),
                           "max_s": round(max(samples), 3), "bytes": len(answer.content)}
    return times


def browser_times(base: str, secret: str, pages: dict[str, str]) -> dict[str, float] | str:
    if not CHROMIUM.exists():
        return "no /usr/bin/chromium: apt-get install -y chromium"
    from playwright.sync_api import sync_playwright

    times: dict[str, float] = {}
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/login?token={secret}")
        for name, path in pages.items():
            samples = []
            for _ in range(3):
                page.goto(f"{base}{path}", wait_until="load")
                samples.append(page.evaluate(
                    "performance.getEntriesByType('navigation')[0].duration") / 1000)
            times[name] = round(statistics.median(samples), 3)
        browser.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--approvals", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--json", action="store_true", help="One JSON object on stdout.")
    args = parser.parse_args(argv)
    admin_url = database_url(OnwardSettings())
    name, url = create_database(admin_url, "onward_bench_console")
    try:
        ledger = Ledger.from_env(OnwardSettings(database_url=url))
        filled = fill(ledger, args.runs, args.approvals, args.steps)
        secret = ledger.create_token(TokenRequest(
            "bench", Role.ADMIN, "default", timedelta(hours=1), ("sales_lead",))).secret
        recorder = Recorder(ledger.engine)
        server, base = serve(ledger)
        pages = {"run_page": f"/runs/{LONG_RUN}", "runs_filtered":
                 "/?status=failed&workflow=sales_offer_agent",
                 "approvals_inbox": "/approvals"}
        recorder.on = True
        on_server = server_times(base, secret, pages)
        recorder.on = False
        in_browser = browser_times(base, secret, pages)
        scans = seq_scans(ledger.engine, recorder.seen)
        server.should_exit = True
    finally:
        drop_database(admin_url, name)
    slow = [n for n, t in on_server.items() if t["median_s"] >= TARGET_S]
    if isinstance(in_browser, dict):
        slow += [f"{n} (browser)" for n, t in in_browser.items() if t >= TARGET_S]
    result = {"runs": args.runs, "approvals": args.approvals, "steps": args.steps,
              "fill_s": filled, "server": on_server, "browser": in_browser,
              "seq_scans": scans, "target_s": TARGET_S, "slow": slow}
    for scan in scans:
        log(f"SEQUENTIAL SCAN: {scan}")
    if args.json:
        print(json.dumps(result))
    else:
        log(json.dumps(result, indent=2))
    return 1 if slow or scans else 0


if __name__ == "__main__":
    sys.exit(main())
