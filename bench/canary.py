#!/usr/bin/env python
"""Where customer data and tool credentials end up: canaries through the sales-offer agent.

    .venv/bin/python bench/canary.py                 # 20 runs, a report on stderr
    .venv/bin/python bench/canary.py --json          # one JSON line on stdout

What it does, on real processes (issue 15 items 2 and 3, docs/security.md):

1. creates a database of its own on the configured PostgreSQL server (embedded by default,
   or ONWARD_DATABASE_URL), migrated, dropped at the end; a queue of its own on the
   configured broker (embedded Redis, or ONWARD_BROKER_URL);
2. starts the reference provider requiring a bearer token (the *credential canary*), and
   ``onward dispatcher`` and ``onward reaper`` connected as ``onward_operator``, logging at
   DEBUG; the workers get the token only as ``ONWARD_SECRET_EXAMPLE_PROVIDER_TOKEN``, which
   the provider client resolves by reference (``secret://example_provider_token``) at each
   request;
3. starts ``--runs`` runs of ``sales_offer_agent`` (examples/sales.py), split between two
   tenants, through ``Ledger`` connected as ``onward_app``, each with the *field canary* in
   its customer field (``customer_id``: it goes into the state, the model prompt, the
   approval's artifact, the CRM payload and the e-mail);
4. scans every key of the broker's Redis database while the first step messages wait in
   the queue, then starts ``onward worker`` (as ``onward_operator``), approves every offer as
   a sales lead of its tenant, waits for every run to complete, and scans again;
5. scans every row of every table in the ``onward`` schema (as the database's owner, each
   value as text, bytes as they are stored) and every onward process's log;
6. as ``onward_app``: counts the rows each tenant sees of the other tenant's, and the rows
   a transaction that sets no tenant sees, in every table under row-level security.

Prints one JSON line (``--json``): ``canary_plaintext_hits`` (places where either canary was
found in plain text: a row, a Redis key, a log line), split into ``credential_hits`` and
``field_hits`` with ``hits_by_place`` (where ``control`` counts a tenant's name, stored
plain by design: that it is found shows each scan reads what it claims to),
``places_scanned``, ``cross_tenant_rows_seen`` and ``unset_tenant_rows_seen``. Every
process runs with encryption keys (issue 15 item 1,
docs/security.md): the customer field is marked sensitive in the agent's state; where the
field canary is still found in plain text (what is not sealed yet), the bench says where;
nothing is hidden. Exits 1 when the
credential canary is found anywhere, a tenant sees another's row, a transaction without a
tenant sees any, or a run does not complete.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, cast
from uuid import UUID

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from harness.databases import create_database, drop_database, redact  # noqa: E402
from harness.processes import Proc, Processes  # noqa: E402
from harness.processes import wait_answers_ping as wait_ready  # noqa: E402
from harness.provider import ReferenceProvider  # noqa: E402
from ledger import Ledger, RunStatus  # noqa: E402
from ledger.db import database_url, libpq_conninfo  # noqa: E402
from ledger.vocabulary import Role  # noqa: E402
from tasks.credentials import env_name  # noqa: E402
from tasks.workflow import Registry  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.broker import broker_url  # noqa: E402
from workers.settings import WorkerSettings  # noqa: E402

WORKFLOW, MODULE = "sales_offer_agent", "examples.sales"
TENANTS = ("canary_a", "canary_b")
APP, OPERATOR = "onward_app", "onward_operator"
CREDENTIAL_NAME = "example_provider_token"

OWN_ROWS = {
    "tenant": "tenant_id = %(t)s",
    "run": "run_id IN (SELECT id FROM onward.runs WHERE tenant_id = %(t)s)",
    "effect": ("(effect_type, effect_id) IN (SELECT effect_type, effect_id FROM onward.effects "
               "WHERE tenant_id = %(t)s)"),
    "artifact": ("sha256 IN (SELECT artifact_sha256 FROM onward.evidence WHERE run_id IN "
                 "(SELECT id FROM onward.runs WHERE tenant_id = %(t)s))"),
}
"""Which rows of a protected table are a tenant's, by what the table holds."""


def log(message: str) -> None:
    print(f"[canary] {message}", file=sys.stderr, flush=True)


def as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


class Scan:
    """Where each canary was found: place -> canary -> hits."""

    def __init__(self, canaries: dict[str, bytes]) -> None:
        self.canaries = canaries
        self.hits: dict[str, Counter[str]] = defaultdict(Counter)
        self.places: list[str] = []

    def look(self, place: str, blob: bytes) -> None:
        for name, canary in self.canaries.items():
            if canary in blob:
                self.hits[place][name] += 1

    def total(self, name: str | None = None) -> int:
        """Hits of canary ``name``; None: of every canary but the control (which is plain
        by design: it shows the scan reads what it claims to)."""
        return sum(n for counts in self.hits.values() for key, n in counts.items()
                   if key == name or (name is None and key != "control"))


def as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str).encode()
    return str(value).encode()


def scan_tables(url: str, scan: Scan) -> None:
    """Every row of every onward table, as the owner (row-level security bypassed by a
    superuser; a non-superuser owner would see only what the policies allow)."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'onward' ORDER BY 1")]
        for table in tables:
            rows = 0
            for row in conn.execute(f'SELECT * FROM onward."{table}"'):
                rows += 1
                scan.look(f"postgres:onward.{table}", b"\x00".join(as_bytes(v) for v in row))
            scan.places.append(f"postgres:onward.{table} ({rows} rows)")


def scan_redis(client: redis.Redis, scan: Scan, moment: str) -> int:
    """Every key of the broker's database and every value it holds (queued messages are
    list items; kombu's unacked messages a hash)."""
    keys = items = 0
    for key in client.scan_iter(count=500):
        keys += 1
        kind = client.type(key)
        values: list[bytes] = [key]
        if kind == b"string":
            values.append(cast(bytes | None, client.get(key)) or b"")
        elif kind == b"list":
            values += cast(list[bytes], client.lrange(key, 0, -1))
        elif kind == b"hash":
            pairs = cast(dict[bytes, bytes], client.hgetall(key))
            values += [b"%s=%s" % pair for pair in pairs.items()]
        elif kind == b"set":
            values += list(cast(set[bytes], client.smembers(key)))
        elif kind == b"zset":
            scored = cast(list[tuple[bytes, float]], client.zrange(key, 0, -1, withscores=True))
            values += [member for member, _ in scored]
        items += len(values) - 1
        for value in values:
            scan.look(f"redis:{moment}", value)
    scan.places.append(f"redis:{moment} ({keys} keys, {items} values)")
    return keys


def scan_logs(procs: list[Proc], scan: Scan) -> None:
    for proc in procs:
        lines = proc.log_path.read_bytes().splitlines()
        for line in lines:
            scan.look(f"log:{proc.name}", line)
        scan.places.append(f"log:{proc.name} ({len(lines)} lines)")


def queued(client: redis.Redis, queue: str) -> int:
    return sum(client.llen(key) for key in client.scan_iter(match=f"{queue}*")
               if client.type(key) == b"list")


def protected_tables(url: str) -> dict[str, str]:
    """Each table under row-level security and how its rows name their tenant."""
    found: dict[str, str] = {}
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for table, columns in conn.execute(
                "SELECT c.relname, array_agg(a.attname::text) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
                "WHERE n.nspname = 'onward' AND c.relrowsecurity GROUP BY c.relname"):
            found[table] = ("tenant" if "tenant_id" in columns else "run" if "run_id" in columns
                            else "effect" if "effect_id" in columns else "artifact")
    return found


def _count(conn: psycopg.Connection[Any], query: str,
           params: dict[str, Any] | None = None) -> int:
    """The one number a ``SELECT count(*)`` returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def tenancy(url: str) -> tuple[int, int]:
    """(rows a tenant sees of others', rows a transaction without a tenant sees), as
    onward_app, over every protected table."""
    tables = protected_tables(url)
    cross = unset = 0
    with psycopg.connect(libpq_conninfo(as_role(url, APP))) as conn:
        for table, kind in tables.items():
            with conn.transaction():
                unset += _count(conn, f'SELECT count(*) FROM onward."{table}"')
            for tenant in TENANTS:
                with conn.transaction():
                    conn.execute("SELECT set_config('onward.tenant', %(t)s, true)",
                                 {"t": tenant})
                    cross += _count(
                        conn, f'SELECT count(*) FROM onward."{table}" WHERE NOT ({OWN_ROWS[kind]})',
                        {"t": tenant})
    return cross, unset


def run_batch(settings: WorkerSettings, app_url: str, runs: int, field: str,
              procs: Processes, start_worker: Any, timeout: float) -> list[UUID]:
    engine = sa.create_engine(app_url, pool_size=2)
    base = Ledger(engine, settings)
    ids: dict[UUID, str] = {}
    for n in range(runs):
        tenant = TENANTS[n % len(TENANTS)]
        ledger = base.acting_as("bench", Role.OPERATOR, tenant_id=tenant)
        # no worker has advertised the workflow's state schema yet (the first messages are
        # to wait in the queue): the application names the input's sensitive field itself
        ids[ledger.start_run(WORKFLOW, {"customer_id": f"{field}-{n}", "amount": 100 + n},
                             allow_unadvertised=True, sensitive=("customer_id",))] = tenant
    log(f"started {runs} runs in {len(TENANTS)} tenants as {APP}")
    start_worker()
    for run_id, tenant in ids.items():
        lead = base.acting_as("lena", Role.APPROVER, ("sales_lead",), tenant_id=tenant)
        outcome = lead.wait(run_id, timeout)
        if outcome.status is RunStatus.WAITING:
            asked = lead.approvals(run_id=run_id)[0]
            lead.approve(asked.id, artifact_hash=asked.artifact_hash, comment="fine")
    done = [run_id for run_id, tenant in ids.items()
            if base.acting_as("bench", Role.VIEWER, tenant_id=tenant)
            .wait(run_id, timeout, through_waits=True).status is RunStatus.COMPLETED]
    procs.check_alive()
    engine.dispose()
    return done


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON line on stdout")
    parser.add_argument("--timeout", type=float, default=120.0, help="per run, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the database and logs")
    return parser.parse_args(argv)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    base = WorkerSettings()
    admin_url, broker = database_url(base), broker_url(base)
    token = secrets.token_hex(4)
    field, credential = f"CANARYFIELD{secrets.token_hex(8)}", f"CANARYCRED{secrets.token_hex(8)}"
    queue = f"bench.canary.{token}"
    log(f"database server {redact(admin_url)}, broker {redact(broker)}, queue {queue}")
    db_name, db_url = create_database(admin_url, "onward_bench_canary")
    key = secrets.token_hex(32)
    master = f"canary={secrets.token_hex(32)}"  # encryption at rest (ledger/crypto.py)
    workdir = Path(tempfile.mkdtemp(prefix="onward-bench-canary-"))
    outside = Processes(env={"ONWARD_EXAMPLE_PROVIDER_TOKEN": credential},
                        log_dir=workdir / "provider")
    provider = ReferenceProvider.start(outside, workdir / "provider")
    env = {"ONWARD_DATABASE_URL": as_role(db_url, OPERATOR), "ONWARD_BROKER_URL": broker,
           "ONWARD_HOME": str(base.home_dir), "ONWARD_QUEUE": queue,
           "ONWARD_CHECKPOINT_KEY": key, "ONWARD_WORKFLOWS": MODULE,
           "ONWARD_ENCRYPTION_KEYS": master,
           "ONWARD_EXAMPLE_PROVIDER_URL": provider.url, "ONWARD_LOG_JSON": "1",
           env_name(CREDENTIAL_NAME): credential}
    settings = WorkerSettings(database_url=as_role(db_url, APP), broker_url=broker,
                              home=base.home_dir, queue=queue, checkpoint_key=key,
                              workflows=[MODULE], encryption_keys=SecretStr(master))
    procs = Processes(env=env, log_dir=workdir / "onward")
    client = redis.Redis.from_url(broker)
    # the control: a tenant's name, plain in every row of its runs by design; a scan that
    # read nothing would find it nowhere
    scan = Scan({"credential": credential.encode(), "field": field.encode(),
                 "control": TENANTS[0].encode()})
    ok = False
    try:
        onward = ["-m", "console"]
        procs.start("dispatcher", [*onward, "dispatcher", "--loglevel", "DEBUG"])
        procs.start("reaper", [*onward, "reaper", "--loglevel", "DEBUG"])

        def start_worker() -> None:
            deadline = time.monotonic() + 60
            while queued(client, queue) < args.runs and time.monotonic() < deadline:
                procs.check_alive()
                time.sleep(0.2)
            scan_redis(client, scan, "queued")  # the first steps' messages wait here
            node = f"bench-canary-{os.getpid()}@{socket.gethostname()}"
            worker = procs.start("worker", [*onward, "worker", "-c", "2", "--name", node,
                                            "--loglevel", "DEBUG"])
            wait_ready(create_app(settings, registry=Registry()), worker, node)
            log("worker ready; approving and waiting")

        completed = run_batch(settings, as_role(db_url, APP), args.runs, field, procs,
                              start_worker, args.timeout)
        log(f"{len(completed)} of {args.runs} runs completed")
        scan_redis(client, scan, "after")
        procs.stop_all()
        scan_tables(db_url, scan)
        scan_logs(procs.procs, scan)
        cross, unset = tenancy(db_url)
        result = {
            "canary_plaintext_hits": scan.total(),
            "credential_hits": scan.total("credential"),
            "field_hits": scan.total("field"),
            "control_hits": scan.total("control"),
            "hits_by_place": {place: dict(counts) for place, counts in sorted(scan.hits.items())},
            "places_scanned": scan.places,
            "cross_tenant_rows_seen": cross,
            "unset_tenant_rows_seen": unset,
            "runs": args.runs,
            "completed": len(completed),
            "payload_encryption": True,  # issue 15 item 1: sensitive values sealed
            # every run completed, so every request carried the token the provider requires
            "provider_requires_credential": True,
        }
        log(f"canary hits: credential {result['credential_hits']}, customer field "
            f"{result['field_hits']} (with payload encryption) in "
            f"{sorted(scan.hits)}; rows seen across tenants {cross}, without a tenant {unset}")
        if args.json:
            print(json.dumps(result), flush=True)
        ok = (result["credential_hits"] == 0 and cross == 0 and unset == 0
              and len(completed) == args.runs)
        return 0 if ok else 1
    finally:
        procs.stop_all()
        provider.stop()
        client.close()
        if args.keep:
            log(f"kept database {db_name} and logs in {workdir}")
        else:
            drop_database(admin_url, db_name)
        if not ok:
            log(f"logs in {workdir}")


if __name__ == "__main__":
    sys.exit(main())
