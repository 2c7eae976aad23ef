"""A reference tool provider: a real HTTP service standing for a CRM, billing or mail API.

It has its own persistent store (a file of its own; it is the outside world, not onward),
honours ``Idempotency-Key`` the way Stripe-like APIs do, and can misbehave on purpose.

    python -m examples.provider --port 0 --port-file /tmp/provider.port --db /tmp/provider.db

API
  POST /v1/<collection>            create; header Idempotency-Key; JSON body
                                   same key + same body -> the same object (200, or 202 while
                                   processing); same key + other body -> 409
  GET  /v1/<collection>/<id>       the object (status "processing" until it completes)
  GET  /v1/<collection>/by-key/<k> look an object up by the key that created it (404 if none;
                                   501 when lookups are switched off)
  GET  /admin/stats                objects, keys, duplicate objects per key, requests
  GET  /admin/objects              every object
  POST /admin/config               {"key_ttl_s", "async_complete_s", "lookup", "slow_s"}
  POST /admin/faults               {"collection", "drop_response": n, "commit_error_500": n,
                                   "error_500": n, "error_429": n} — the next n creates in
                                   that collection act, then drop the connection without
                                   answering / act, then answer 500 (the object exists: a
                                   write's 5xx proves nothing) / answer 500 without acting /
                                   answer 429 with Retry-After (setting retry_after_s) without
                                   acting;
                                   {"collection", "slow": n, "slow_s": s} — the next n
                                   creates wait s seconds before acting (a call longer than
                                   the caller's lease); {"collection", "hold": n, "hold_s": s}
                                   — the next n creates act, then hold their answer s seconds
                                   (a call that landed while its caller gave up);
                                   {"collection", "lookup_error_500": n, "lookup_slow": n,
                                   "lookup_slow_s": s, "status_error_500": n,
                                   "status_slow": n, "status_slow_s": s} — the next n
                                   lookups by key / status reads (GET of one object) in that
                                   collection answer 500, or wait s seconds before answering
  POST /admin/reset                forget everything
A create may also carry ``X-Fault: drop-response | commit-error-500 | error-500 | slow=<s>``.

With ``ONWARD_EXAMPLE_PROVIDER_TOKEN`` set, every ``/v1`` request must carry
``Authorization: Bearer <that token>`` (401 otherwise); the client reads its copy by
reference at each request (examples/provider_client.py, docs/security.md).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sqlite3
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from examples.settings import ExampleSettings

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    id TEXT PRIMARY KEY, collection TEXT NOT NULL, idempotency_key TEXT,
    body_hash TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL,
    created_at REAL NOT NULL, complete_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS objects_key ON objects (collection, idempotency_key);
CREATE TABLE IF NOT EXISTS idempotency (
    collection TEXT NOT NULL, key TEXT NOT NULL, object_id TEXT NOT NULL,
    body_hash TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (collection, key)
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

DEFAULTS: dict[str, Any] = {
    "key_ttl_s": 86400.0,  # how long an Idempotency-Key is remembered for dedupe
    "async_complete_s": 0.0,  # > 0: creates answer 202 and complete after this long
    "lookup": True,  # GET by-key available
    "slow_s": 0.0,  # delay every create
    "retry_after_s": 1,  # the Retry-After header of an injected 429
}


FAULTS = ("drop_response", "commit_error_500", "error_500", "error_429", "slow", "hold",
          "lookup_error_500", "lookup_slow", "status_error_500", "status_slow")
"""What ``POST /admin/faults`` arms, each for the next n requests of one collection."""


class DropResponse(Exception):
    """Act, then close the connection without answering."""


class Store:
    """The provider's own state, in one SQLite file (thread-safe through one lock)."""

    def __init__(self, path: Path) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL without an fsync per write: durable across a crash of this process (what tests
        # and the chaos bench do to it), and fast enough for bench/agents.py's bursts of
        # hundreds of writes at once
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def setting(self, name: str) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else DEFAULTS[name]

    def configure(self, values: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            for name, value in values.items():
                if name not in DEFAULTS:
                    raise ValueError(f"unknown setting {name!r}; known: {sorted(DEFAULTS)}")
                self.db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)",
                                (name, json.dumps(value)))
            return {name: self.setting(name) for name in DEFAULTS}

    def bump(self, name: str, by: int = 1) -> None:
        self.db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE "
                        "SET value = value + ?", (name, by, by))

    def take_fault(self, collection: str, fault: str) -> bool:
        """Consume one armed fault of this kind for this collection."""
        name = f"fault:{collection}:{fault}"
        row = self.db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        if row and row[0] > 0:
            self.db.execute("UPDATE counters SET value = value - 1 WHERE name = ?", (name,))
            return True
        return False

    def arm_fault(self, collection: str, fault: str, count: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)",
                        (f"fault:{collection}:{fault}", count))

    def take_delay(self, collection: str, fault: str, counter: str) -> float:
        """Seconds an armed delay ``fault`` (``slow``, ``hold``, ``lookup_slow``,
        ``status_slow``) holds this request, counted in ``counter``; 0 when none is armed."""
        with self.lock:
            if not self.take_fault(collection, fault):
                return 0.0
            self.bump(counter)
            row = self.db.execute("SELECT value FROM counters WHERE name = ?",
                                  (f"fault:{collection}:{fault}_ms",)).fetchone()
            return (row[0] if row else 0) / 1000.0

    def take_slow(self, collection: str) -> float:
        """Seconds to hold this create before acting: an armed ``slow`` fault, or 0."""
        return self.take_delay(collection, "slow", "slow_requests")

    def take_hold(self, collection: str) -> float:
        """Seconds to hold this create's answer after acting: an armed ``hold`` fault, or 0
        (the object exists while the caller still waits: a call that "may have landed")."""
        return self.take_delay(collection, "hold", "held_responses")

    def take_read_fault(self, collection: str, read: str) -> tuple[float, bool]:
        """What an armed fault does to this ``read`` (``lookup`` or ``status``): seconds to
        wait before answering, and whether to answer 500 instead of the object."""
        delay = self.take_delay(collection, f"{read}_slow", f"{read}_slow_requests")
        with self.lock:
            failing = self.take_fault(collection, f"{read}_error_500")
            if failing:
                self.bump(f"{read}_errors_500")
        return delay, failing

    def view(self, row: tuple[Any, ...]) -> dict[str, Any]:
        object_id, collection, key, _hash, body, status, created, complete_at = row
        if status == "processing" and time.time() >= complete_at:
            status = "completed"
            self.db.execute("UPDATE objects SET status = 'completed' WHERE id = ?", (object_id,))
        return {"id": object_id, "collection": collection, "idempotency_key": key,
                "status": status, "created_at": created, "body": json.loads(body)}

    def create(self, collection: str, key: str | None, body: dict[str, Any],
               fault: str) -> tuple[int, dict[str, Any]]:
        body_hash = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self.lock:
            self.bump("requests")
            if fault == "error-500" or self.take_fault(collection, "error_500"):
                self.bump("errors_500")
                return 500, {"error": "internal error (injected); nothing was created"}
            if self.take_fault(collection, "error_429"):
                self.bump("rejected_429")
                return 429, {"error": "rate limited (injected); nothing was created"}
            now = time.time()
            if key is not None:
                ttl = float(self.setting("key_ttl_s"))
                self.db.execute("DELETE FROM idempotency WHERE created_at < ?", (now - ttl,))
                seen = self.db.execute(
                    "SELECT object_id, body_hash FROM idempotency WHERE collection = ? AND key = ?",
                    (collection, key)).fetchone()
                if seen is not None:
                    if seen[1] != body_hash:
                        self.bump("conflicts_409")
                        return 409, {"error": "Idempotency-Key reused with a different body"}
                    self.bump("dedupe_hits")
                    obj = self.get(collection, seen[0])
                    assert obj is not None
                    return (202 if obj["status"] == "processing" else 200), obj
            delay = float(self.setting("async_complete_s"))
            object_id = f"{collection[:3]}_{uuid.uuid4().hex[:16]}"
            self.db.execute(
                "INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (object_id, collection, key, body_hash, json.dumps(body),
                 "processing" if delay > 0 else "completed", now, now + delay))
            if key is not None:
                self.db.execute("INSERT INTO idempotency VALUES (?, ?, ?, ?, ?)",
                                (collection, key, object_id, body_hash, now))
            self.bump("created")
            obj = self.get(collection, object_id)
            assert obj is not None
            if fault == "commit-error-500" or self.take_fault(collection, "commit_error_500"):
                self.bump("committed_errors_500")  # acted, then failed: the object exists
                return 500, {"error": "internal error (injected) after the write committed"}
            if fault == "drop-response" or self.take_fault(collection, "drop_response"):
                self.bump("dropped_responses")
                raise DropResponse()
            return (202 if delay > 0 else 201), obj

    def get(self, collection: str, object_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM objects WHERE collection = ? AND id = ?",
                              (collection, object_id)).fetchone()
        return self.view(row) if row else None

    def by_key(self, collection: str, key: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT * FROM objects WHERE collection = ? AND idempotency_key = ? "
            "ORDER BY created_at LIMIT 1", (collection, key)).fetchone()
        return self.view(row) if row else None

    def stats(self) -> dict[str, Any]:
        with self.lock:
            objects = self.db.execute("SELECT count(*) FROM objects").fetchone()[0]
            per_key = self.db.execute(
                "SELECT collection, idempotency_key, count(*) FROM objects "
                "WHERE idempotency_key IS NOT NULL GROUP BY 1, 2").fetchall()
            by_collection = dict(self.db.execute(
                "SELECT collection, count(*) FROM objects GROUP BY 1").fetchall())
            counters = dict(self.db.execute("SELECT name, value FROM counters "
                                            "WHERE name NOT LIKE 'fault:%'").fetchall())
        return {
            "objects": objects,
            "keys": len(per_key),
            "duplicate_objects": sum(count - 1 for _, _, count in per_key),
            "by_collection": by_collection,
            **counters,
        }

    def all_objects(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute("SELECT * FROM objects ORDER BY created_at").fetchall()
            return [self.view(r) for r in rows]

    def reset(self) -> None:
        with self.lock:
            for table in ("objects", "idempotency", "settings", "counters"):
                self.db.execute(f"DELETE FROM {table}")


class Handler(BaseHTTPRequestHandler):
    store: Store
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on each connection: the headers and the body are two writes, and with
    # Nagle's algorithm the body of every answer after the first on a kept-alive connection
    # waited ~40 ms for the client's delayed acknowledgement of the headers.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if code == 429:
            self.send_header("Retry-After", str(self.store.setting("retry_after_s")))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _authorized(self, parts: list[str]) -> bool:
        token = ExampleSettings().example_provider_token
        if not token or not parts or parts[0] != "v1":
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def _read_fault(self, collection: str, read: str) -> bool:
        """Apply an armed ``lookup`` / ``status`` fault: wait its delay (a read slower than
        its caller's time limit); True when the read must answer 500."""
        delay, failing = self.store.take_read_fault(collection, read)
        if delay:
            time.sleep(delay)
        return failing

    def do_GET(self) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if not self._authorized(parts):
            return self._send(401, {"error": "a valid API token is required"})
        if parts == ["admin", "stats"]:
            return self._send(200, self.store.stats())
        if parts == ["admin", "objects"]:
            return self._send(200, self.store.all_objects())
        if len(parts) == 4 and parts[0] == "v1" and parts[2] == "by-key":
            if not self.store.setting("lookup"):
                return self._send(501, {"error": "lookup by key is not supported"})
            if self._read_fault(parts[1], "lookup"):
                return self._send(500, {"error": "internal error (injected) in a lookup"})
            found = self.store.by_key(parts[1], parts[3])
            return self._send(200, found) if found else self._send(404, {"error": "no object"})
        if len(parts) == 3 and parts[0] == "v1":
            if self._read_fault(parts[1], "status"):
                return self._send(500, {"error": "internal error (injected) in a status read"})
            found = self.store.get(parts[1], parts[2])
            return self._send(200, found) if found else self._send(404, {"error": "no object"})
        return self._send(404, {"error": "no route"})

    def do_POST(self) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if not self._authorized(parts):
            return self._send(401, {"error": "a valid API token is required"})
        try:
            body = self._body()
        except ValueError:
            return self._send(400, {"error": "body is not JSON"})
        if parts == ["admin", "config"]:
            try:
                return self._send(200, self.store.configure(body))
            except ValueError as exc:
                return self._send(400, {"error": str(exc)})
        if parts == ["admin", "faults"]:
            for fault in FAULTS:
                if fault in body:
                    self.store.arm_fault(body["collection"], fault, int(body[fault]))
            for delay in ("slow_s", "hold_s", "lookup_slow_s", "status_slow_s"):
                if delay in body:
                    self.store.arm_fault(body["collection"], f"{delay[:-2]}_ms",
                                         round(float(body[delay]) * 1000))
            return self._send(200, {"armed": body})
        if parts == ["admin", "reset"]:
            self.store.reset()
            return self._send(200, {"reset": True})
        if len(parts) == 2 and parts[0] == "v1":
            if not isinstance(body, dict):
                return self._send(400, {"error": "body must be a JSON object"})
            fault = self.headers.get("X-Fault", "")
            slow = float(self.store.setting("slow_s"))
            if fault.startswith("slow="):
                slow = float(fault.split("=", 1)[1])
            slow = max(slow, self.store.take_slow(parts[1]))
            if slow:
                time.sleep(slow)
            try:
                code, payload = self.store.create(parts[1], self.headers.get("Idempotency-Key"),
                                                  body, fault)
            except DropResponse:
                self.close_connection = True
                self.connection.shutdown(2)  # the object exists; the caller hears nothing
                return None
            hold = self.store.take_hold(parts[1]) if code in (200, 201, 202) else 0.0
            if hold:
                time.sleep(hold)  # acted; the answer comes late (or to nobody)
            return self._send(code, payload)
        return self._send(404, {"error": "no route"})


class ProviderServer(ThreadingHTTPServer):
    """The provider's HTTP server on 127.0.0.1:``port`` (a free port when 0), its store in
    the SQLite file ``db``."""

    request_queue_size = 256  # many workers at once (bench/agents.py)
    daemon_threads = True

    def __init__(self, port: int, db: Path) -> None:
        self.store = Store(db)
        super().__init__(("127.0.0.1", port), type("BoundHandler", (Handler,),
                                                   {"store": self.store}))

    def server_close(self) -> None:
        super().server_close()
        self.store.db.close()


def serve(port: int, db: Path, port_file: Path | None = None) -> None:
    server = ProviderServer(port, db)
    actual = server.server_address[1]
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(actual))
        tmp.replace(port_file)
    print(f"provider listening on http://127.0.0.1:{actual} (store {db})", flush=True)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--db", type=Path, default=Path(".onward/provider.db"))
    parser.add_argument("--port-file", type=Path, default=None)
    args = parser.parse_args()
    args.db.parent.mkdir(parents=True, exist_ok=True)
    serve(args.port, args.db, args.port_file)


if __name__ == "__main__":
    main()
