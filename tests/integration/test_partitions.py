"""Step attempts partitioned by month (issue 15 item 5; migration 0038, ledger/partitions.py).

Real PostgreSQL; runs executed in-process through the real executor with the ledger's clock
(``onward.now()``) moved months away, so that their attempts fall in other months: a write
in a month with no partition yet lands in the default partition and moves into its month's
partition when that is made; a month made ahead receives its writes directly; expiry drops
a whole ended month, audited, only when the retention policies let go of every run in it;
the roles reach partitions only through the parent, whose row-level security applies.
"""

from __future__ import annotations

import itertools
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ledger import Ledger, OutcomeKind, RunStatus, partitions, retention
from ledger.corpora import Corpora
from ledger.corpus import Selection, pinned_txn
from ledger.migrate import downgrade, upgrade
from ledger.retention import parse_policies
from ledger.schema import runs
from ledger.steps import Advance, Claim, StepStore, Successor
from tests.support import clock, reads
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver_fixture
from tests.support.plans import explain, explaining
from workers.reaper import Reaper

MODULES = ["tests.workflows"]


drv = driver_fixture(MODULES)


def _month(offset: timedelta) -> str:
    return (datetime.now(UTC) + offset).strftime("%Y_%m")


def _run_at(ledger: Ledger, drv: Driver, offset: timedelta) -> UUID:
    """A two-step run executed with the database's clock ``offset`` away: its attempts'
    started_at (the claim's onward.now()) fall in that month."""
    clock.set_on_store(drv.store, offset)
    engine = sa.create_engine(ledger.url)
    clock.follow_engine(engine, [offset])
    try:
        run_id = Ledger(engine, ledger.settings).start_run("test_chain", {"steps": 2})
    finally:
        engine.dispose()
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


def _homes(ledger: Ledger, run_id: UUID) -> set[str]:
    """The partitions the run's attempts are stored in."""
    with ledger.engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT tableoid::regclass::text FROM onward.step_attempts WHERE run_id = :r"),
            {"r": run_id}).scalars())


def _names(ledger: Ledger) -> list[str]:
    with ledger.engine.connect() as conn:
        return [p.name for p in partitions.partitions_txn(conn, "step_attempts")]


def _as(ledger: Ledger, role: str) -> str:
    return make_url(ledger.url).set(username=role, drivername="postgresql").render_as_string(
        hide_password=False)


def test_partitions__made_ahead_and_reached_only_through_the_parent(ledger: Ledger) -> None:
    """The migration made this month's partition and the next three's, and a default; the
    application and operator roles read attempts through ``step_attempts`` (its policies
    apply) but have no privilege on a partition itself; only the operator may make or drop
    partitions."""
    names = _names(ledger)
    now = datetime.now(UTC)
    for ahead in range(4):
        year, month = divmod(now.month - 1 + ahead, 12)
        assert f"step_attempts_{now.year + year}_{month + 1:02d}" in names, names
    assert names[-1] == "step_attempts_default"
    for role in ("onward_app", "onward_operator"):
        with psycopg.connect(_as(ledger, role)) as conn:
            conn.execute("SELECT count(*) FROM onward.step_attempts")
            for part in (names[0], "step_attempts_default"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT count(*) FROM onward.{part}")
                conn.rollback()
    with psycopg.connect(_as(ledger, "onward_app")) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT onward.ensure_partitions('step_attempts', 3)")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT onward.drop_partition('step_attempts', %s)", (names[0],))
    with psycopg.connect(_as(ledger, "onward_operator")) as conn:
        conn.execute("SELECT onward.ensure_partitions('step_attempts', 3)").fetchall()


def test_partitions__a_write_in_a_new_month_lands_in_its_partition(
        ledger: Ledger, drv: Driver) -> None:
    """Attempts of a month with no partition yet go to the default partition; ``ensure``
    makes that month's partition and moves them in; the next attempts of that month land in
    it directly. Months are whole UTC months."""
    later = timedelta(days=250)  # beyond the months made ahead
    month = f"onward.step_attempts_{_month(later)}"
    first = _run_at(ledger, drv, later)
    assert _homes(ledger, first) == {"onward.step_attempts_default"}
    made = partitions.ensure(ledger.engine)
    assert month.removeprefix("onward.") in made
    assert _homes(ledger, first) == {month}  # moved, none lost
    second = _run_at(ledger, drv, later)
    assert _homes(ledger, second) == {month}
    with ledger.engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM onward.step_attempts_default"))
        assert left.scalar_one() == 0
        lo, hi = conn.execute(sa.text(
            "SELECT min(started_at), max(started_at) FROM onward.step_attempts "
            "WHERE run_id = ANY(:ids)"), {"ids": [first, second]}).one()
    assert lo.astimezone(UTC).strftime("%Y_%m") == hi.astimezone(UTC).strftime("%Y_%m")
    assert partitions.ensure(ledger.engine) == []  # nothing more to make


def test_partitions__expiry_drops_a_month_only_when_every_run_in_it_may_go(
        ledger: Ledger, drv: Driver) -> None:
    """With a 1-day policy, an ended month whose runs all finished long ago is dropped
    whole, with an audit row for its tenant, and its runs still verify (the attempts are
    history of the executions, not signed content); a month holding a run on legal hold is
    kept, saying why; this month is never dropped; without a policy nothing is."""
    policies = parse_policies("*/*=1")
    gone = _run_at(ledger, drv, timedelta(days=-100))
    held = _run_at(ledger, drv, timedelta(days=-200))
    ledger.hold(held, "litigation 2026-17")
    assert partitions.ensure(ledger.engine)  # the two past months, from the default
    gone_month, held_month = (f"step_attempts_{_month(timedelta(days=d))}"
                              for d in (-100, -200))

    assert partitions.expire(ledger.engine, ledger.keys, []).dropped == []
    with ledger.engine.connect() as conn:
        plan = partitions.plan_txn(conn, policies)
    assert plan[gone_month] is None and "legal hold" in str(plan[held_month])

    done = partitions.expire(ledger.engine, ledger.keys, policies)
    assert done.dropped == [gone_month] and done.rows == 2
    assert "legal hold" in done.kept[held_month]
    names = _names(ledger)
    assert gone_month not in names and held_month in names
    assert f"step_attempts_{_month(timedelta(0))}" in names
    assert _homes(ledger, gone) == set()
    assert _homes(ledger, held) == {f"onward.{held_month}"}
    assert ledger.verify_run(gone) == []
    with ledger.engine.connect() as conn:
        audit = conn.execute(sa.text(
            "SELECT tenant_id, action, details FROM onward.audit "
            "WHERE details ->> 'partition' = :p"), {"p": gone_month}).one()
    assert audit.action == "retention" and audit.tenant_id == ledger.settings.tenant_id
    assert audit.details["rows"] == 2 and audit.details["table"] == "step_attempts"

    with ledger.engine.connect() as conn:
        this_month = f"step_attempts_{_month(timedelta(0))}"
        with pytest.raises(sa.exc.DBAPIError, match="this month or later"):
            conn.execute(sa.text("SELECT onward.drop_partition('step_attempts', :p)"),
                         {"p": this_month})


def test_partitions__the_reaper_makes_months_ahead_and_expires_ended_ones(
        ledger: Ledger, drv: Driver) -> None:
    """One pass of the reaper: the month of attempts that sat in the default partition gets
    its partition, and, the 1-day policy letting go of its only run, is dropped, audited by
    the reaper; the months ahead stay."""
    old = _run_at(ledger, drv, timedelta(days=-100))
    month = f"step_attempts_{_month(timedelta(days=-100))}"
    assert _homes(ledger, old) == {"onward.step_attempts_default"}
    reaper = Reaper(ledger.settings.model_copy(update={"retention_policies": "*/*=1"}))
    try:
        reaper.partitions_if_due()
    finally:
        reaper.engine.dispose()
    assert _homes(ledger, old) == set()
    names = _names(ledger)
    assert month not in names and f"step_attempts_{_month(timedelta(0))}" in names
    with ledger.engine.connect() as conn:
        actor = conn.execute(sa.text(
            "SELECT actor FROM onward.audit WHERE details ->> 'partition' = :p"),
            {"p": month}).scalar_one()
    assert actor == "onward-reaper"


def test_partitions__the_migration_keeps_every_attempt_both_ways(
        ledger: Ledger, drv: Driver) -> None:
    """Downgrading 0038 copies the attempts back into an unpartitioned table and upgrading
    copies them into partitions again, months apart included: none is lost or changed."""
    for offset in (timedelta(0), timedelta(days=-100)):
        _run_at(ledger, drv, offset)
    drv.store.close()  # its prepared statements name the table being replaced

    def rows() -> list[tuple[object, ...]]:
        with ledger.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(
                "SELECT * FROM onward.step_attempts ORDER BY run_id, lease_epoch"))]

    before = rows()
    assert len(before) == 4
    downgrade(ledger.engine, "0037")
    assert rows() == before
    upgrade(ledger.engine)
    assert rows() == before
    assert _names(ledger)[-1] == "step_attempts_default"


def test_partitions__only_the_operator_role_expires_months(ledger: Ledger) -> None:
    """As onward_app (one tenant's view), plan and expire touch no partition and say to
    connect as onward_operator: another tenant's runs could keep a month it cannot see."""
    app = sa.create_engine(_as(ledger, "onward_app"))
    try:
        policies = parse_policies("*/*=1")
        with app.connect() as conn:
            assert list(partitions.plan_txn(conn, policies)) == ["*"]
        done = partitions.expire(app, ledger.keys, policies)
    finally:
        app.dispose()
    assert done.dropped == [] and "onward_operator" in done.kept["*"]


def _waiting_for_keep_lock(ledger: Ledger) -> bool:
    with ledger.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = :k"), {"k": retention.KEEP_LOCK}).scalar_one())


def test_partitions__a_hold_committed_during_the_drop_check_keeps_the_month(
        ledger: Ledger, drv: Driver) -> None:
    """The race between a partition drop and a legal hold: a hold whose transaction is in
    progress when the drop starts (here: its row written, not committed) makes the drop
    wait, and once the hold commits, the drop's check sees it and keeps the month. Without
    the keep lock the drop's check read the run as not held, dropped the month, and the hold
    then committed on a run whose attempts were gone."""
    policies = parse_policies("*/*=1")
    run_id = _run_at(ledger, drv, timedelta(days=-100))
    assert partitions.ensure(ledger.engine)
    month = f"step_attempts_{_month(timedelta(days=-100))}"
    done: dict[str, partitions.Expired] = {}
    with ledger.engine.connect() as holding:
        with holding.begin():
            retention.keep_shared_txn(holding)  # what Ledger.hold does before it writes
            holding.execute(sa.text("UPDATE onward.runs SET legal_hold = 'litigation' "
                                    "WHERE id = :r"), {"r": run_id})
            dropper = threading.Thread(target=lambda: done.setdefault(
                "expired", partitions.expire(ledger.engine, ledger.keys, policies)))
            dropper.start()
            wait_for(lambda: _waiting_for_keep_lock(ledger), timeout=20,
                     what="the drop to wait for the hold", interval=0.02)
        dropper.join(timeout=30)
    assert not dropper.is_alive()
    assert done["expired"].dropped == [] and "legal hold" in done["expired"].kept[month]
    assert _homes(ledger, run_id) == {f"onward.{month}"}


def test_partitions__a_hold_or_pin_waits_for_a_drop_in_progress(
        ledger: Ledger, drv: Driver) -> None:
    """Ledger.hold and a corpus pin take the keep lock shared: while a drop holds it (from
    its check to its commit) they wait, so neither lands between the check and the drop."""
    run_id = _run_at(ledger, drv, timedelta(0))
    with ledger.engine.connect() as dropping:
        with dropping.begin():
            retention.keep_exclusive_txn(dropping)
            holder = threading.Thread(target=ledger.hold, args=(run_id, "litigation"))
            holder.start()
            wait_for(lambda: _waiting_for_keep_lock(ledger), timeout=20,
                     what="the hold to wait for the drop", interval=0.02)
            assert holder.is_alive()
        holder.join(timeout=30)
    assert not holder.is_alive()
    with ledger.engine.begin() as conn:
        assert conn.execute(sa.select(runs.c.legal_hold).where(runs.c.id == run_id)
                            ).scalar_one() == "litigation"
        retention.keep_exclusive_txn(conn)
        pinner = threading.Thread(target=lambda: Corpora(ledger).add(
            "keep-race", Selection(run_ids=(run_id,))))
        pinner.start()
        wait_for(lambda: _waiting_for_keep_lock(ledger), timeout=20,
                 what="the pin to wait for the drop", interval=0.02)
    pinner.join(timeout=30)
    assert not pinner.is_alive()
    with ledger.engine.connect() as conn:
        assert run_id in pinned_txn(conn, [run_id])


def _partitions_probed(url: str, query: str, params: dict[str, Any]) -> list[str]:
    """The step_attempts partitions the plan of ``query``'s ``attempt`` CTE (the
    close_attempt fragment, ledger/sql/steps.sql) updates, as EXPLAIN shows it with
    ``params`` bound (nothing is executed)."""
    plan = explain(url, query, params)
    start = plan.index("  CTE attempt")
    section = itertools.takewhile(lambda line: line.startswith("    "), plan[start + 1:])
    return re.findall(r"Update on (step_attempts_\w+)", "\n".join(section))


def test_partitions__a_step_ends_its_attempt_in_its_month_s_partition_only(
        ledger: Ledger) -> None:
    """The statements that end a lease close the lease's attempt naming its partition key
    (``started_at``, which is the claim's ``claimed_at``): PostgreSQL prunes the update to
    that month's partition instead of probing all five. And the attempt is closed: the
    claim's ``claimed_at`` is exactly its attempt's ``started_at``, for a claim and for the
    claim a chained commit takes."""
    store = StepStore(ledger.url, ledger.keys, lease_ttl_s=30)
    seen: list[list[str]] = []
    explaining(store, "attempt AS (",
               lambda query, params: seen.append(_partitions_probed(ledger.url, query, params)))
    try:
        run_id = ledger.start_run("test_chain", {"steps": 3})
        claim = store.claim(run_id, 0, "w")
        assert isinstance(claim, Claim)
        chained = store.commit(claim, Advance(
            step="tick", outcome=OutcomeKind.GOTO, next_step="tick",
            state={"steps": 3, "done": 1, "sleep_ms": 0}, workflow_version=1,
            next_max_attempts=3), successor=Successor("w"))
        assert isinstance(chained, Claim)
        assert store.fail(chained, "tick", {"type": "Boom", "message": "x"}, retry_in_s=None)
    finally:
        store.close()
    month = f"step_attempts_{_month(timedelta(0))}"
    assert seen == [[month], [month]], seen
    closed = reads.attempts(ledger.engine, run_id)
    assert [(a["outcome"], a["ended_at"] is not None) for a in closed] == [
        ("committed", True), ("failed", True)], closed
