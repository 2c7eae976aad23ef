"""The console in a real browser (Chromium through playwright) against a real console
server and a real PostgreSQL; steps run in the test process (tests/support/driver.py).

Set ONWARD_UPDATE_SCREENSHOTS=1 to refresh the screenshots in docs/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from ledger import Ledger, RunStatus
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.support.driver import Driver, driver

MODULES = ["tests.workflows_ops", "tests.workflows_waits"]
DOCS = Path(__file__).resolve().parents[2] / "docs"


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


def token(ledger: Ledger, actor: str, role: str, *approver_roles: str) -> str:
    return ledger.create_token(TokenRequest(actor, Role(role), "default", timedelta(hours=1),
                                            tuple(approver_roles))).secret


def screenshot(page: Page, name: str) -> None:
    if os.environ.get("ONWARD_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(DOCS / name), full_page=False)


def test_browser__approver_approves_an_offer_and_the_run_completes(
        page: Page, console_url: str, drv: Driver) -> None:
    """Invariant: a sales lead signs in with the link, sees the offer exactly as hashed and
    who may decide, approves it with a reason, and the run goes on to complete."""
    run_id = drv.ledger.start_run("test_review", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    dana = token(drv.ledger, "dana", "approver", "sales_lead")
    page.goto(f"{console_url}/login?token={dana}")
    expect(page.locator("header .who")).to_contain_text("dana · approver")
    assert "token=" not in page.url
    page.goto(f"{console_url}/approvals")
    card = page.locator(".approval").first
    expect(card).to_contain_text("alice, role:sales_lead")
    expect(card.locator("pre.artifact")).to_contain_text('{"doc":"offer v1')
    screenshot(page, "console-approvals.png")
    card.locator("input[name=comment]").fill("price is within policy")
    card.get_by_role("button", name="approve this artifact").click()
    expect(page.locator(".note.done")).to_contain_text("approved")
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    page.goto(f"{console_url}/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#run-audit")).to_contain_text("price is within policy")


def test_browser__operator_branches_a_parked_run_and_sees_the_diff(
        page: Page, console_url: str, drv: Driver) -> None:
    """Invariant: an operator previews a JSON Patch on a parked run's checkpoint (the diff,
    before anything starts), then branches it; the branch is a new run linked to its
    parent, and the parent is untouched."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "pricing"})
    drv.step(run_id, 0)
    with drv.ledger.engine.begin() as conn:  # the reaper parks crash loops like this
        conn.execute(sa.text("UPDATE onward.runs SET status = 'needs_review', "
                             "parked_reason = 'crash loop: 3 workers died in step review' "
                             "WHERE id = :id"), {"id": run_id})
    olga = token(drv.ledger, "olga", "operator")
    page.goto(f"{console_url}/login?token={olga}")
    expect(page.locator(".count-needs_review b")).not_to_have_text("0")
    screenshot(page, "console-runs.png")
    page.goto(f"{console_url}/runs/{run_id}")
    expect(page.locator("#why")).to_contain_text("crash loop")
    form = page.locator("form#branch")
    form.locator("textarea[name=patch]").fill(
        '[{"op": "replace", "path": "/channel", "value": "sports"}]')
    form.get_by_role("button", name="preview the diff").click()
    expect(page.locator("#branch-diff")).to_contain_text('"sports"')
    expect(page.locator("#branch-diff")).to_contain_text('"news"')
    screenshot(page, "console-run.png")
    form.locator("input[name=reason]").fill("post to sports instead")
    form.locator("input[name=confirm]").check()
    form.get_by_role("button", name="branch", exact=True).click()
    expect(page.locator(".lineage")).to_contain_text(f"branch of {run_id}")
    [child] = drv.ledger.children(run_id)
    assert child.branch_patch == [{"op": "replace", "path": "/channel", "value": "sports"}]
    assert drv.ledger.get_run(run_id).status is RunStatus.NEEDS_REVIEW


def test_browser__viewer_sees_no_actions_and_is_refused_when_posting(
        page: Page, console_url: str, drv: Driver) -> None:
    """Invariant: a viewer's run page has no action forms; a POST made anyway (with the
    page's own CSRF value) is 403 and changes nothing; an unauthenticated API call is 401."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "pricing"})
    vic = token(drv.ledger, "vic", "viewer")
    page.goto(f"{console_url}/login?token={vic}")
    page.goto(f"{console_url}/runs/{run_id}")
    expect(page.locator("#summary")).to_be_visible()
    assert page.locator("form[action$='/cancel'], form#branch, .actions").count() == 0
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(f"{console_url}/runs/{run_id}/cancel",
                               form={"reason": "x", "confirm": "yes", "csrf": csrf or ""})
    assert answer.status == 403
    assert drv.ledger.get_run(run_id).status is RunStatus.RUNNING
    anonymous = httpx.post(f"{console_url}/api/v1/runs/{run_id}/cancel",
                           json={"reason": "x"})
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"] == "application/problem+json"
