"""A NUL character anywhere a client can put one (path, query, JSON body) is bad input:
4xx with a problem document that names it, never a 500 (PostgreSQL text refuses NUL)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from console.http.app import create_app
from ledger import Ledger
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role

NUL = "a\x00b"
RUN = "0190f5e4-0000-7000-8000-000000000000"

REQUESTS: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]] = [
    ("GET", "/api/v1/runs", {"workflow": NUL}, None),
    ("GET", "/api/v1/runs/a%00b", None, None),
    ("GET", "/api/v1/effects", {"effect_type": NUL}, None),
    ("GET", "/api/v1/effects/a%00b", None, None),
    ("GET", "/api/v1/effects/e1", {"effect_type": NUL}, None),
    ("GET", "/api/v1/audit", {"action": NUL}, None),
    ("GET", "/api/v1/audit", {"actor": NUL}, None),
    ("GET", "/api/v1/audit", {"run": NUL}, None),
    ("GET", "/api/v1/approvals", {"run": NUL}, None),
    ("POST", "/api/v1/runs", None, {"workflow": NUL}),
    ("POST", "/api/v1/runs", None, {"workflow": "w", "idempotency_key": NUL}),
    ("POST", "/api/v1/runs", None, {"workflow": "w", "conversation_id": NUL}),
    ("POST", "/api/v1/runs", None, {"workflow": "w", "input": {NUL: 1}}),
    ("POST", f"/api/v1/runs/{RUN}/cancel", None, {"reason": NUL}),
    ("POST", f"/api/v1/runs/{RUN}/continue", None, {"reason": NUL}),
    ("POST", f"/api/v1/runs/{RUN}/replay", None, {"reason": NUL}),
    ("POST", f"/api/v1/runs/{RUN}/signals", None, {"name": NUL}),
    ("POST", f"/api/v1/runs/{RUN}/signals", None, {"name": "n", "payload": NUL}),
    ("POST", f"/api/v1/runs/{RUN}/branch", None,
     {"reason": NUL, "patch": [{"op": "add", "path": "/x", "value": 1}]}),
    ("POST", f"/api/v1/runs/{RUN}/branch/preview", None,
     {"patch": [{"op": "add", "path": NUL, "value": NUL}]}),
    ("POST", f"/api/v1/approvals/{RUN}/approve", None, {"shown_hash": "0" * 64,
                                                         "comment": NUL}),
    ("POST", "/api/v1/effects/a%00b/repeat", None, {"reason": "r"}),
    ("POST", "/api/v1/effects/e1/repeat", None, {"reason": NUL}),
    ("GET", "/api/v1/effects/aaaaaaaaa%00b", None, None),
    ("GET", "/api/v1/effects/aaaaaaaaab", {"effect_type": NUL}, None),
    ("POST", "/api/v1/effects/aaaaaaaa%00b/repeat", None, {"reason": "r"}),
    ("POST", "/api/v1/effects/aaaaaaaaab/repeat", None, {"reason": "r", "effect_type": NUL}),
    ("POST", "/api/v1/effects/aaaaaaaa%00b/resolve", None,
     {"reason": "r", "finding": "not_sent", "attempts": 0}),
    ("POST", "/api/v1/effects/aaaaaaaaab/resolve", None,
     {"reason": "r", "finding": "not_sent", "attempts": 0, "effect_type": NUL}),
    ("GET", "/api/v1/runs/aaaaaa%00b", None, None),
    ("POST", "/api/v1/runs/aaaaaa%00b/cancel", None, {"reason": "r"}),
    ("POST", "/api/v1/runs/aaaaaa%00b/verify", None, None),
    ("GET", "/api/v1/runs/aaaaaa%00b/diff", {"from": 0, "to": 1}, None),
    ("GET", "/api/v1/runs/aaaaaa%00b/wait", {"timeout": 0}, None),
    ("GET", "/api/v1/effects", {"run": "aaaaaa\x00b"}, None),
    ("POST", "/api/v1/approvals/0190f5e4-0000-7000-8000-000000000000/reject", None,
     {"shown_hash": "0" * 64, "comment": "ok\x00"}),
    ("POST", "/api/v1/effects/e1/resolve", None,
     {"reason": "r", "finding": "completed", "provider_ref": NUL, "attempts": 0}),
]


def test_api__nul_is_bad_input_never_a_server_error(ledger: Ledger) -> None:
    """Invariant: a request carrying NUL is answered 422 with a problem document that names
    the NUL, whatever else is wrong with it (an unknown run, a short effect id); the server
    never fails with 500. Without a token it is still 401 (authentication comes first)."""
    secret = ledger.create_token(
        TokenRequest("fuzz", Role.ADMIN, "default", timedelta(hours=1))).secret
    with TestClient(create_app(ledger), raise_server_exceptions=False) as http:
        for method, path, params, body in REQUESTS:
            answer = http.request(method, path, params=params, json=body,
                                  headers={"Authorization": f"Bearer {secret}"})
            assert answer.status_code == 422, (method, path, answer.status_code, answer.text)
            assert answer.headers["content-type"] == "application/problem+json"
            assert "NUL" in answer.json()["detail"], (method, path, answer.text)
        anonymous = http.post(f"/api/v1/runs/{RUN}/cancel", json={"reason": NUL})
        assert anonymous.status_code == 401
