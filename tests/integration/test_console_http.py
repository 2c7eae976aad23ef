"""The console over HTTP (in-process ASGI client, real PostgreSQL): the API's authentication
(401), role checks before anything happens (403, audited), problem+json errors, cursor
pages, tenant scope, approvals through the API, and the page's sign-in, CSRF and role-aware
actions."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from console.http.app import create_app
from console.http.pages import COOKIE, csrf_of
from ledger import Ledger, RunStatus
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.support import reads
from tests.support.driver import Driver, driver
from tests.support.not_plain import NOT_PLAIN

MODULES = ["tests.workflows_ops", "tests.workflows_waits"]


@pytest.fixture()
def drv(settings_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    env = {**settings_env, "ONWARD_WORKFLOWS": ",".join(MODULES),
           "ONWARD_TEST_OPS_CALLS": str(tmp_path / "tool.log"),
           "ONWARD_FAKE_LLM_LOG": str(tmp_path / "llm.log")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with driver(Ledger.from_env(), MODULES) as running:
        yield running


@pytest.fixture()
def client(drv: Driver) -> Iterator[TestClient]:
    with TestClient(create_app(Ledger.from_env())) as http:
        yield http


def token(ledger: Ledger, actor: str, role: str, *approver_roles: str,
          tenant: str = "default") -> str:
    admin = ledger.acting_as("root", "admin", tenant_id=tenant)
    return admin.create_token(TokenRequest(actor, Role(role), tenant, timedelta(hours=1),
                                           tuple(approver_roles))).secret


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_api__401_without_a_token_and_problem_json(client: TestClient, drv: Driver) -> None:
    """Invariant: every API route needs a token: none, or a bad one, is 401 with a problem
    document and WWW-Authenticate, and nothing happens."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "http"})
    for method, path in (("GET", "/api/v1/runs"), ("POST", f"/api/v1/runs/{run_id}/cancel")):
        answer = client.request(method, path, json={"reason": "x"})
        assert answer.status_code == 401
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.json()["status"] == 401
    answer = client.get("/api/v1/runs", headers=auth("onw_guessed"))
    assert answer.status_code == 401
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING


def test_api__viewer_403_audited_operator_acts(client: TestClient, drv: Driver) -> None:
    """Invariant: a viewer's cancel is 403 before anything happens and leaves one refused
    audit row naming the viewer; an operator's cancel works; bad input is 422."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "http"})
    vic, olga = token(drv.ledger, "vic", "viewer"), token(drv.ledger, "olga", "operator")
    answer = client.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": "x"},
                         headers=auth(vic))
    assert answer.status_code == 403 and "operator role" in answer.json()["detail"]
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING
    assert client.post(f"/api/v1/runs/{run_id}/cancel", json={},
                       headers=auth(olga)).status_code == 422
    answer = client.post(f"/api/v1/runs/{str(run_id)[:13]}/cancel", json={"reason": "stop"},
                         headers=auth(olga))
    assert answer.status_code == 200, answer.text
    rows = [(a.actor, a.action, a.outcome) for a in reversed(drv.ledger.audit(run_id=run_id))]
    assert rows == [("vic", "cancel", "refused"), ("olga", "cancel", "done")]
    assert client.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": "again"},
                       headers=auth(olga)).status_code == 409


def test_api__pages_with_a_cursor_in_the_tenant(client: TestClient, drv: Driver) -> None:
    """Invariant: lists page by cursor without repeats or gaps, and show the token's tenant
    only."""
    started = [drv.ledger.start_run("test_ops_notes", {"topic": f"p{i}"}) for i in range(5)]
    olga = token(drv.ledger, "olga", "viewer")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"workflow": "test_ops_notes", "limit": 2, **({"cursor": cursor} if cursor
                                                                 else {})}
        body = client.get("/api/v1/runs", params=params, headers=auth(olga)).json()
        seen += [r["id"] for r in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert set(map(str, started)) <= set(seen) and len(seen) == len(set(seen))
    acme = token(drv.ledger, "olaf", "admin", tenant="acme")
    assert client.get("/api/v1/runs", headers=auth(acme)).json()["items"] == []
    assert client.get(f"/api/v1/runs/{started[0]}", headers=auth(acme)).status_code == 404


def test_api__approve_with_the_tokens_approver_role(client: TestClient, drv: Driver) -> None:
    """Invariant: an approval naming role:sales_lead is refused to an approver without it
    (409, audited) and decided by one with it; the run resumes."""
    run_id = drv.ledger.start_run("test_review", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    plain = token(drv.ledger, "dana", "approver")
    lead = token(drv.ledger, "dana", "approver", "sales_lead")
    [listed] = client.get("/api/v1/approvals", params={"mine": "true"},
                          headers=auth(lead)).json()["items"]
    assert client.get("/api/v1/approvals", params={"mine": "true"},
                      headers=auth(plain)).json()["items"] == []
    body = {"artifact_hash": listed["artifact_hash"], "comment": "ok"}
    refused = client.post(f"/api/v1/approvals/{listed['id']}/approve", json=body,
                          headers=auth(plain))
    assert refused.status_code == 409 and "may not approve" in refused.json()["detail"]
    done = client.post(f"/api/v1/approvals/{listed['id']}/approve", json=body,
                       headers=auth(lead))
    assert done.status_code == 200 and done.json()["decided_by"] == "dana"
    assert drv.drive(run_id).status is RunStatus.COMPLETED


def test_api__approvals_are_named_by_a_unique_prefix_as_in_the_cli(
        client: TestClient, drv: Driver) -> None:
    """Invariant: the approval routes take the id or a unique prefix of it (6+ digits), as
    ``onward approvals approve`` does; a prefix two approvals share is 422 naming both and
    an unknown one 404, each an audited refusal that decides nothing."""
    waiting = [drv.ledger.start_run("test_ops_notes", {"topic": "http", "approve": True})
               for _ in range(2)]
    assert {drv.drive(r).status for r in waiting} == {RunStatus.WAITING}
    olga = auth(token(drv.ledger, "olga", "operator"))
    listed = client.get("/api/v1/approvals", headers=olga).json()["items"]
    ids = sorted(a["id"] for a in listed)
    # uuid7: both begin with the time they were asked (the first 6 digits change every 4.7 h)
    shared = ids[0][:next(i for i, (a, b) in enumerate(zip(*ids, strict=True)) if a != b)]
    assert len(shared) >= 6, ids
    hashes = {a["id"]: a["artifact_hash"] for a in listed}
    body = {"artifact_hash": hashes[ids[0]], "comment": "ok"}
    ambiguous = client.post(f"/api/v1/approvals/{shared}/approve", json=body, headers=olga)
    assert ambiguous.status_code == 422 and all(i in ambiguous.json()["detail"] for i in ids)
    unknown = "0" * 8
    assert client.post(f"/api/v1/approvals/{unknown}/reject", json=body,
                       headers=olga).status_code == 404
    assert client.get(f"/api/v1/approvals/{unknown}", headers=olga).status_code == 404
    first, second = (i[:len(shared) + 2] for i in ids)
    assert client.get(f"/api/v1/approvals/{first}", headers=olga).json()["id"] == ids[0]
    done = client.post(f"/api/v1/approvals/{first}/approve", json=body, headers=olga)
    assert done.status_code == 200 and done.json()["status"] == "approved", done.text
    body = {"artifact_hash": hashes[ids[1]], "comment": "no"}
    done = client.post(f"/api/v1/approvals/{second}/reject", json=body, headers=olga)
    assert done.status_code == 200 and done.json()["status"] == "rejected", done.text
    decisions = sorted((a.action, a.outcome, str(a.approval_id)) for a in drv.ledger.audit()
                       if a.action in ("approve", "reject"))
    assert decisions == [("approve", "done", ids[0]), ("approve", "refused", "None"),
                         ("reject", "done", ids[1]), ("reject", "refused", "None")]


def test_page__sign_in_csrf_and_role_aware_actions(client: TestClient, drv: Driver) -> None:
    """Invariant: the page needs a sign-in; a viewer sees no action buttons and a POST made
    anyway is 403 (audited); a POST without the CSRF value does nothing; an operator sees
    the actions."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "page"})
    vic, olga = token(drv.ledger, "vic", "viewer"), token(drv.ledger, "olga", "operator")
    assert client.get("/", follow_redirects=False).headers["location"] == "/login"
    signed = client.get(f"/login?token={vic}", follow_redirects=False)
    assert signed.status_code == 303 and "httponly" in signed.headers["set-cookie"].lower()
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and str(run_id) in page.text
    assert "cancel the run" not in page.text and "Actions" not in page.text
    form = {"reason": "x", "confirm": "yes", "csrf": csrf_of(vic)}
    assert client.post(f"/runs/{run_id}/cancel", data=form).status_code == 403
    client.cookies.clear()
    client.cookies.set(COOKIE, olga)
    assert "cancel the run" in client.get(f"/runs/{run_id}").text
    stale = client.post(f"/runs/{run_id}/cancel", data={**form, "csrf": "forged"})
    assert stale.status_code == 403 and "CSRF" in stale.text
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING
    done = client.post(f"/runs/{run_id}/cancel", data={**form, "csrf": csrf_of(olga)},
                       follow_redirects=False)
    assert done.status_code == 303
    assert drv.ledger.get_run(run_id).status is RunStatus.CANCELLED
    assert client.get("/").status_code == 200 and client.get("/audit").status_code == 200


def _cursor(value: object) -> str:
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def test_api__malformed_cursors_are_bad_input_not_server_errors(drv: Driver) -> None:
    """Invariant: a cursor is client input; one of the wrong shape on any list is a 422
    problem document naming the cursor, never a 500 (found by review: 12 of 13 were)."""
    drv.ledger.start_run("test_ops_notes", {"topic": "cursor"})
    viewer = auth(token(drv.ledger, "vic", "viewer"))
    probes = {
        "/api/v1/effects": ["x", -5, [1], 1.5],
        "/api/v1/approvals": [7, ["x"], ["2026-01-01", "nope"], "abc", ["2026-01-01", "x", 1]],
        "/api/v1/runs": [5, "not-a-uuid", ["x"]],
        "/api/v1/audit": ["x", [1], {"a": 1}, True],
    }
    with TestClient(create_app(Ledger.from_env()), raise_server_exceptions=False) as http:
        for path, values in probes.items():
            for value in values:
                answer = http.get(path, params={"cursor": _cursor(value)}, headers=viewer)
                assert answer.status_code == 422, (path, value, answer.text)
                assert "cursor" in answer.json()["detail"]
            assert http.get(path, params={"cursor": "%%%"}, headers=viewer).status_code == 422


def test_page__why_it_waits_reads_the_database_clock(drv: Driver) -> None:
    """Invariant (docs/design.md section 13, one clock): the console says a worker holds a
    run only while its lease is live by the database's clock, the clock `runs continue`
    uses; a console host whose clock is behind must not show an expired lease as held."""
    from console.http.pages import why_waiting
    from ledger.steps import Claim
    from tests.support.clock import follow_engine

    admin = drv.ledger.acting_as("root", "admin")
    run_id = admin.start_run("test_ops_notes", {"topic": "clock"})
    assert isinstance(drv.store.claim(run_id, 0, "w:1"), Claim)  # a 30 s lease, taken ...
    follow_engine(admin.engine, [timedelta(minutes=10)])  # ... 10 minutes ago, by the db
    admin.engine.dispose()
    run = admin.get_run(run_id)
    assert run is not None
    shown = why_waiting(admin, run) or ""
    assert not shown.startswith("running: worker"), shown
    assert admin.continue_run(run_id, "the worker is gone").previous_status is RunStatus.RUNNING


def test_api_and_page__resolve_an_effect_whose_outcome_is_unknown(
        client: TestClient, drv: Driver) -> None:
    """Invariant (review F11): a person records what they found at the provider through the
    API (admin only: an operator is 403, audited; a stale attempt count is 409) or the run
    page's resolve button (shown to an admin, only on an effect whose outcome is unknown);
    nothing is sent, and the continued run uses what was recorded."""
    from tests.workflows_outcomes import OUTSIDE

    OUTSIDE.reset()
    olga, ada = token(drv.ledger, "olga", "operator"), token(drv.ledger, "ada", "admin")
    with driver(Ledger.from_env(), ["tests.workflows_outcomes"]) as outcomes:
        runs = []
        for _ in range(2):
            OUTSIDE.lose_answers = 1
            run_id = outcomes.ledger.start_run("test_outcome_send", {"tool": "blind"})
            assert outcomes.drive(run_id).parked_reason == "effect_outcome_unknown"
            runs.append((run_id, outcomes.ledger.effects(run_id)[0]))
        (api_run, effect), (page_run, shown) = runs
        body = {"reason": "found it", "finding": "completed", "provider_ref": "obj_1",
                "result": {"id": "obj_1", "n": 1}, "attempts": effect.attempts}
        path = f"/api/v1/effects/{effect.effect_id}/resolve"
        assert client.post(path, json=body, headers=auth(olga)).status_code == 403
        stale = client.post(path, json={**body, "attempts": 0}, headers=auth(ada))
        assert stale.status_code == 409, stale.text
        answer = client.post(path, json=body, headers=auth(ada))
        assert answer.status_code == 200, answer.text
        assert answer.json()["effect"]["status"] == "completed"
        client.cookies.set(COOKIE, olga)
        assert "I checked the provider" not in client.get(f"/runs/{page_run}").text
        client.cookies.set(COOKIE, ada)
        assert "I checked the provider" in client.get(f"/runs/{page_run}").text
        form = {"reason": "found it", "finding": "completed", "provider_ref": "obj_2",
                "result": "{\"id\": \"obj_2\"}", "attempts": str(shown.attempts),
                "confirm": "yes",
                "csrf": csrf_of(ada)}
        done = client.post(f"/effects/{shown.effect_type}/{shown.effect_id}/resolve",
                           data=form, follow_redirects=False)
        assert done.status_code == 303, done.text
        assert "I checked the provider" not in client.get(f"/runs/{page_run}").text
        for run_id in (api_run, page_run):
            outcomes.ledger.continue_run(run_id, "the provider holds it")
            assert outcomes.drive(run_id).status is RunStatus.COMPLETED
    assert OUTSIDE.count() == 2  # one object per run, each sent once
    rows = [(a.actor, a.outcome) for a in reversed(drv.ledger.audit(action="resolve_effect"))]
    assert rows == [("olga", "refused"), ("ada", "refused"), ("ada", "done"), ("ada", "done")]
    OUTSIDE.reset()


def test_api__an_unreadable_body_is_named_and_writes_nothing(client: TestClient,
                                                             drv: Driver) -> None:
    """A start request whose body is not UTF-8, nests past what the parser takes, or holds
    an integer Python refuses to read is answered 400 with a problem document that says
    which (it said only "There was an error parsing the body"); no run is started."""
    headers = {**auth(token(drv.ledger, "ann", "operator")),
               "content-type": "application/json"}
    start = b'{"workflow": "test_ops_notes", "input": {"topic": '
    bodies = {
        start + b'"\xff\xfe"}}': "not UTF-8",
        start + b"[" * 100_000 + b"]" * 100_000 + b"}}": "nests objects and arrays too deeply",
        start + b"1" + b"0" * 5000 + b"}}": "not JSON onward can read",
    }
    before = reads.fingerprint(drv.ledger.engine)
    for body, said in bodies.items():
        answer = client.post("/api/v1/runs", content=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert said in answer.json()["detail"], answer.text
    assert reads.fingerprint(drv.ledger.engine) == before


def _parked_on_an_unknown_effect() -> UUID:
    """A run whose irreversible call acted at the provider and lost its answer: parked
    ``effect_outcome_unknown`` (the caller resets tests.workflows_outcomes.OUTSIDE)."""
    from tests.workflows_outcomes import OUTSIDE

    with driver(Ledger.from_env(), ["tests.workflows_outcomes"]) as outcomes:
        OUTSIDE.lose_answers = 1
        parent = outcomes.ledger.start_run("test_outcome_send", {"tool": "blind"})
        assert outcomes.drive(parent).parked_reason == "effect_outcome_unknown"
    return parent


def test_api_replay_branch__refused_while_the_parent_has_an_effect_of_unknown_outcome(
        client: TestClient, drv: Driver) -> None:
    """Invariant (as ``runs replay --mode live`` / ``runs branch``): while the parent has an
    effect whose outcome at the provider is unknown, POST .../replay (live) and .../branch
    are refused (409, the effect named, nothing created); with ``allow_unresolved`` they
    start (201); an evidence replay starts without it."""
    from tests.workflows_outcomes import OUTSIDE

    OUTSIDE.reset()
    try:
        parent = _parked_on_an_unknown_effect()
        [effect] = drv.ledger.effects(parent)
        headers = auth(token(drv.ledger, "olga", "operator"))
        replay = {"reason": "again", "mode": "live"}
        branch = {"reason": "again",
                  "patch": [{"op": "replace", "path": "/tool", "value": "blind"}]}
        for path, body in (("replay", replay), ("branch", branch)):
            answer = client.post(f"/api/v1/runs/{parent}/{path}", json=body, headers=headers)
            assert answer.status_code == 409, answer.text
            assert effect.effect_id in answer.json()["detail"]
        assert drv.ledger.children(parent) == []
        evidence = client.post(f"/api/v1/runs/{parent}/replay", headers=headers,
                               json={"reason": "look", "mode": "evidence"})
        assert evidence.status_code == 201, evidence.text
        for path, body in (("replay", replay), ("branch", branch)):
            answer = client.post(f"/api/v1/runs/{parent}/{path}", headers=headers,
                                 json={**body, "allow_unresolved": True})
            assert answer.status_code == 201, answer.text
        assert sorted(c.mode for c in drv.ledger.children(parent)) == [
            "branch", "evidence", "live"]
    finally:
        OUTSIDE.reset()


def test_page_replay_branch__the_forms_can_start_despite_an_effect_of_unknown_outcome(
        client: TestClient, drv: Driver) -> None:
    """Invariant (as ``--allow-unresolved`` and the API's ``allow_unresolved``): the run
    page's replay and branch forms have a box to start although the parent has an effect
    whose outcome at the provider is unknown; without it a live replay and a branch are
    refused (409, the effect named, nothing created), with it they start."""
    from tests.workflows_outcomes import OUTSIDE

    OUTSIDE.reset()
    try:
        parent = _parked_on_an_unknown_effect()
        [effect] = drv.ledger.effects(parent)
        olga = token(drv.ledger, "olga", "operator")
        client.cookies.set(COOKIE, olga)
        page = client.get(f"/runs/{parent}").text
        assert page.count('name="allow_unresolved" value="yes"') == 2  # replay and branch
        forms = {"replay": {"mode": "live", "from_seq": "0"},
                 "branch": {"from_seq": "0",
                            "patch": '[{"op": "replace", "path": "/tool", "value": "blind"}]'}}
        for command, form in forms.items():
            body = {**form, "reason": "again", "confirm": "yes", "csrf": csrf_of(olga)}
            children = len(drv.ledger.children(parent))
            refused = client.post(f"/runs/{parent}/{command}", data=body,
                                  follow_redirects=False)
            assert refused.status_code == 409, refused.text
            assert effect.effect_id in refused.text
            assert len(drv.ledger.children(parent)) == children
            started = client.post(f"/runs/{parent}/{command}",
                                  data={**body, "allow_unresolved": "yes"},
                                  follow_redirects=False)
            assert started.status_code == 303, started.text
        assert sorted(c.mode for c in drv.ledger.children(parent)) == ["branch", "live"]
    finally:
        OUTSIDE.reset()


# what json.loads reads in a request body but onward cannot store (a NUL, nesting past the
# parser and a giant integer were already refused: without_nul, 885d4fe)
BODY_CASES = ["nan", "infinity", "lone_surrogate"]


@pytest.mark.parametrize("bad", BODY_CASES)
def test_api__a_body_json_onward_cannot_store_is_422_with_what_and_where(
        client: TestClient, drv: Driver, bad: str) -> None:
    """Every API body that carries a person's JSON or text (a start's input, a signal's
    payload, a branch preview's patch, a resolve's result, a cancel's reason, an approval's
    comment) holding NaN, a float too large to be finite or a lone surrogate is 422 with a
    problem document saying what and where, before anything is read or written: NaN reached
    the ledger's checks (other words, or a 409 where the run's state refused first) and a
    lone surrogate in a text field ended in a server error when it was written."""
    value, said = NOT_PLAIN[bad]
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "http"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    effect_id = drv.ledger.effects(run_id)[0].effect_id
    ada = auth(token(drv.ledger, "ada", "admin"))
    requests = {
        "/api/v1/runs": '{"workflow": "test_ops_notes", "input": {"topic": %s}}',
        f"/api/v1/runs/{run_id}/signals": '{"name": "go", "payload": {"v": %s}}',
        f"/api/v1/runs/{run_id}/branch/preview":
            '{"patch": [{"op": "replace", "path": "/topic", "value": %s}]}',
        f"/api/v1/effects/{effect_id}/resolve":
            '{"reason": "r", "finding": "completed", "result": {"id": %s}, "attempts": 1}',
        f"/api/v1/runs/{run_id}/cancel": '{"reason": %s}',
        f"/api/v1/approvals/{run_id}/approve": '{"shown_hash": "' + "0" * 64
                                                + '", "comment": %s}',
    }
    before = reads.fingerprint(drv.ledger.engine)
    with TestClient(create_app(Ledger.from_env()), raise_server_exceptions=False) as http:
        for path, body in requests.items():
            answer = http.post(path, content=body % value,
                               headers={**ada, "content-type": "application/json"})
            assert answer.status_code == 422, (path, answer.status_code, answer.text)
            assert answer.headers["content-type"] == "application/problem+json"
            assert said in answer.json()["detail"], (path, answer.text)
    assert reads.fingerprint(drv.ledger.engine) == before


def test_api_and_page__json_nested_past_the_parser_in_a_cursor_or_a_form_is_refused(
        client: TestClient, drv: Driver) -> None:
    """A list cursor, the run page's branch-preview patch and the resolve form's result
    nesting past the parser are refused (422, "nests ... too deeply"), not a server error
    (json's RecursionError reached the client as a 500)."""
    import base64

    deep = "[" * 100_000 + "]" * 100_000
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "deep"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    effect = drv.ledger.effects(run_id)[0]
    ada = token(drv.ledger, "ada", "admin")
    past = "[" * 5_000 + "]" * 5_000  # past the parser (about 1,000), within a URL's length
    cursor = base64.urlsafe_b64encode(past.encode()).decode().rstrip("=")
    before = reads.fingerprint(drv.ledger.engine)
    with TestClient(create_app(Ledger.from_env()), raise_server_exceptions=False) as http:
        answer = http.get("/api/v1/audit", params={"cursor": cursor}, headers=auth(ada))
        assert answer.status_code == 422 and "cursor" in answer.json()["detail"], answer.text
        http.cookies.set(COOKIE, ada)
        form = {"from_seq": "0", "csrf": csrf_of(ada), "reason": "r", "confirm": "yes",
                "finding": "completed", "attempts": "1"}
        preview = http.post(f"/runs/{run_id}/branch/preview", data={**form, "patch": deep})
        assert preview.status_code == 422, preview.status_code
        assert "nests objects and arrays too deeply" in preview.text
        resolved = http.post(f"/effects/{effect.effect_type}/{effect.effect_id}/resolve",
                             data={**form, "result": deep})
        assert resolved.status_code == 422, resolved.status_code
        assert "nests objects and arrays too deeply" in resolved.text
    assert reads.fingerprint(drv.ledger.engine) == before


def test_api_branch__a_workflow_module_that_cannot_be_imported_is_a_problem_not_a_traceback(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's ONWARD_WORKFLOWS names a module that raises at import: POST .../branch
    (its state check imports the modules) answers a problem document (500) whose detail is
    the paragraph onward worker gives, no traceback, and starts nothing."""
    parent = drv.ledger.start_run("test_ops_notes", {"topic": "http"})
    assert drv.drive(parent).status is RunStatus.COMPLETED
    monkeypatch.setenv("ONWARD_WORKFLOWS", ",".join([*MODULES, "tests.workflows_broken"]))
    headers = auth(token(drv.ledger, "olga", "operator"))
    with TestClient(create_app(Ledger.from_env())) as http:
        answer = http.post(f"/api/v1/runs/{parent}/branch", headers=headers, json={
            "reason": "look", "from_seq": 2,
            "patch": [{"op": "replace", "path": "/channel", "value": "sports"}]})
    assert answer.status_code == 500, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["error"] == "WorkflowModuleUnimportable"
    assert problem["detail"] == (
        "cannot import workflow module 'tests.workflows_broken' (named in ONWARD_WORKFLOWS or "
        "--workflows): RuntimeError: tests.workflows_broken fails at import on purpose "
        "(raised while the module was imported)")
    assert "Traceback" not in answer.text
    assert drv.ledger.children(parent) == []
