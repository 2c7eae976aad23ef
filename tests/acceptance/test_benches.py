"""The benchmark scripts still run end to end (they are how the speed targets are measured,
and nothing else exercises them): each is run tiny, on the test servers, and its JSON line
is checked for what it must report. No speed is asserted: timings on a shared machine mean
nothing in a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support.cluster import ROOT

pytestmark = pytest.mark.acceptance


def _bench(script: str, args: list[str], server_urls: dict[str, str],
           timeout: float = 300) -> dict[str, Any]:
    """Run ``bench/<script>`` (``python -m bench.<script>`` for a package) with --json
    against the test servers; its one JSON line."""
    env = {**os.environ, "ONWARD_DATABASE_URL": server_urls["database"],
           "ONWARD_BROKER_URL": server_urls["broker"], "ONWARD_HOME": server_urls["home"]}
    command = [f"bench/{script}"] if script.endswith(".py") else ["-m", f"bench.{script}"]
    done = subprocess.run([sys.executable, *command, "--json", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"{script} printed {done.stdout!r}"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def test_bench_steps__reports_every_figure_and_ratio(server_urls: dict[str, str]) -> None:
    """bench/steps.py, one tiny round: onward (defaults and every step through the broker),
    plain Celery and the bare transaction all ran and produced positive rates; the issue's
    JSON keys are present, and the ratios are the quotients of the rates they name."""
    out = _bench("steps.py", ["--rounds", "1", "--chain-steps", "30", "--fanout-runs", "6",
                              "--fanout-steps", "3", "--bare-seconds", "0.5",
                              "--bare-clients", "2"], server_urls)

    for key in ("chain_steps_per_s", "fanout_steps_per_s", "celery_chain_per_s",
                "celery_fanout_per_s", "bare_tx_per_s", "p50_ms", "p99_ms", "celery_p50_ms",
                "broker_chain_per_s", "broker_fanout_per_s"):
        assert out[key] is not None and out[key] > 0, (key, out)
    assert out["chain_ratio_vs_celery"] == pytest.approx(
        out["chain_steps_per_s"] / out["celery_chain_per_s"], rel=0.01)
    assert out["fanout_ratio_vs_celery"] == pytest.approx(
        out["fanout_steps_per_s"] / out["celery_fanout_per_s"], rel=0.01)
    assert set(out["targets_met"]) == {"fanout_1.0x", "chain_1.0x", "p50_1.0x"}


def test_bench_waiting__waiting_runs_hold_nothing(server_urls: dict[str, str]) -> None:
    """bench/waiting.py with 40 runs: while they wait for approval no broker message, lease
    or step attempt exists, and after the approvals every run completes once."""
    out = _bench("waiting.py", ["--runs", "40", "--window", "1", "--clients", "2",
                                "--no-baseline"], server_urls)

    assert out["waiting_runs"] == 40
    assert (out["broker_messages_while_waiting"] or 0) == 0
    assert out["leases_held_while_waiting"] == 0
    assert out["step_attempts_while_waiting"] == 0
    assert out["duplicate_commits"] == 0
    assert out["resume_steps_per_s"] > 0


def test_bench_chaos__tiny_run_loses_and_duplicates_nothing(server_urls: dict[str, str]) -> None:
    """python -m bench.chaos, tiny: 6 runs x 2 irreversible effects while a pool child, a
    whole worker and a dispatcher are SIGKILLed, the bench's own PostgreSQL is crashed and
    started again, worker and dispatcher connections are terminated, the provider drops a
    response, answers a 500 and holds one create longer than the lease before acting.
    Counted from the ledger and from the provider separately:
    no run lost, no duplicate object or commit, no orphan pending effect, and exactly the
    one planned park (a write whose tool has no lookup).

    The broker is the suite's Redis database (``--broker-db -1``), which other tests use at
    the same time, so it is not flushed (``--no-flush``; test_broker_loss.py flushes one of
    its own)."""
    out = _bench("chaos", [
        "--runs", "6", "--steps", "2", "--window", "12", "--settle", "90",
        "--child-kills", "2", "--tree-kills", "1", "--dispatcher-kills", "1",
        "--pg-restarts", "1", "--backend-kills", "2", "--long-calls", "1",
        "--drop-waves", "1", "--error-waves", "1", "--blind-runs", "1", "--no-async",
        "--broker-db", "-1", "--no-flush",
    ], server_urls)

    assert out["pass"], out["failures"]
    assert out["lost_runs"] == 0
    assert out["duplicate_provider_objects"] == 0
    assert out["duplicate_commits"] == 0
    assert out["orphan_pending_effects"] == 0
    assert out["parked"] == out["expected_parked"] == 1
    assert out["postgres_restarts"] == 1
    assert out["backend_kills"] >= 1
    assert out["long_calls"] == 1
    assert out["kills"] >= 3


def test_bench_agents__reports_every_field(server_urls: dict[str, str]) -> None:
    """bench/agents.py, tiny (threads -c 8, 100 ms model, 8 runs x 3 steps, a quota phase of
    4 runs at 2 concurrent): every field the issue lists is in the JSON, the model server
    saw the onward side's calls in flight together, the ratio is the quotient of the rates,
    and in the quota phase, whose client declares the server's limit, no 429 was met and
    the server never held more than the limit."""
    out = _bench("agents.py", ["--runs", "8", "--steps", "3", "--latency-ms", "100",
                               "--pool", "threads", "-c", "8", "--quota-runs", "4",
                               "--quota-concurrency", "2", "--quota-rate", "50",
                               "--deadline", "120"], server_urls)

    for key in ("inflight_max", "inflight_avg", "steps_per_s", "celery_steps_per_s",
                "ratio_vs_celery", "ideal_steps_per_s", "worker_rss_mb", "cpu_ms_per_step",
                "overhead_p50_ms", "overhead_p99_ms", "model_429s", "model_max_concurrency",
                "model_limit_concurrency", "throttled_fleet_cpu_s"):
        assert key in out and out[key] is not None, (key, out)
    assert out["steps_per_s"] > 0 and out["celery_steps_per_s"] > 0
    assert 1 < out["inflight_max"] <= 8
    assert out["ratio_vs_celery"] == pytest.approx(
        out["steps_per_s"] / out["celery_steps_per_s"], rel=0.01)
    assert out["model_max_concurrency"] <= out["model_limit_concurrency"] == 2
    assert out["model_429s"] == 0


def test_bench_agents__async_steps_on_both_sides(server_urls: dict[str, str]) -> None:
    """bench/agents.py --async, tiny: the async def variant of the agent ran on the onward
    side (every run finished) and its awaited calls on the plain Celery side, both with calls
    in flight together at the model server; spread over two SDK clients per process."""
    out = _bench("agents.py", ["--async", "--runs", "6", "--steps", "3", "--latency-ms", "100",
                               "--pool", "threads", "-c", "6", "--quota-runs", "0",
                               "--model-clients", "2", "--deadline", "120"], server_urls)

    assert out["async_steps"] is True and out["model_clients"] == 2
    assert out["steps_per_s"] > 0 and out["celery_steps_per_s"] > 0
    assert 1 < out["inflight_max"] <= 6 and 1 < out["celery_inflight_max"] <= 6
    assert out["celery_lost_chains"] == 0


def test_bench_corpus__replays_identical_then_divergent_where_expected(
        server_urls: dict[str, str]) -> None:
    """bench/corpus.py with 12 runs: replayed against the code that recorded them, every run
    is identical; against version 2 of the research agent, every run diverges, each the way
    its recorded sources say (the new validation step, or the new draft prompt); the JSON
    line has the issue's keys for both."""
    out = _bench("corpus.py", ["--runs", "12", "--record-jobs", "1"], server_urls, timeout=600)

    for row in (out, out["changed"]):
        for key in ("runs", "seconds", "runs_per_s", "identical", "divergent",
                    "expected_divergent"):
            assert row[key] is not None, (key, row)
    assert (out["runs"], out["identical"], out["divergent"], out["expected_divergent"]) == \
        (12, 12, 0, 0)
    changed = out["changed"]
    assert (changed["identical"], changed["divergent"], changed["expected_divergent"]) == \
        (0, 12, 12)
    assert changed["by_kind"] == {k: v for k, v in changed["expected_by_kind"].items() if v}


def test_bench_dbcost__counts_each_step_statement_and_row(server_urls: dict[str, str]) -> None:
    """bench/dbcost.py, tiny, on its own private PostgreSQL: a plain step is two statements
    (claim, commit) and two transactions, an external write five; each step inserts one
    checkpoint; WAL and CPU are measured; every statement run was EXPLAINed."""
    out = _bench("dbcost.py", ["--steps", "40", "--runs", "4", "--shapes", "plain,effect",
                               "--filler-runs", "200", "--explain-others"], server_urls)
    plain, effect = out["shapes"]["plain"], out["shapes"]["effect"]
    assert out["private_server"] is True
    assert set(plain["statements"]) == {"steps.claim", "steps.commit"}
    assert plain["statements_per_step"] == 2.0 and effect["statements_per_step"] == 5.0
    assert plain["transactions_per_step"] == pytest.approx(2.0, abs=0.5)
    assert plain["rows_per_step"]["checkpoints"]["inserted"] == 1.0
    assert effect["rows_per_step"]["effects"]["inserted"] == 1.0
    for shape in (plain, effect):
        assert shape["wal_bytes_per_step"] > 0 and shape["pg_cpu_ms_per_step"] > 0
        assert all(s["access"] for s in shape["statements"].values())
    assert "steps.fail" in plain["other_statements"]


def test_bench_anchor__anchors_and_compares_clean(server_urls: dict[str, str]) -> None:
    """bench/anchor.py with 300 runs: the anchor holds them all and the ledger compares
    clean with it."""
    out = _bench("anchor.py", ["--runs", "300"], server_urls)
    assert out["runs"] == 300 and out["problems"] == 0 and out["bytes_per_run"] > 0


def test_bench_canary__no_credential_and_no_tenant_crossing(server_urls: dict[str, str]) -> None:
    """bench/canary.py with 4 runs of the sales-offer agent in two tenants: the provider's
    token, read by reference, is nowhere in the ledger, the broker or the logs; no tenant
    sees another's row and a transaction without a tenant sees none. The customer field's
    canary, sealed (encryption at rest, issue 15 item 1), is nowhere in plain text; the
    control (a tenant's name, plain by design) is found in the runs table and the logs, which
    shows the scan reads what it claims to (a scan that read nothing would find nothing)."""
    out = _bench("canary.py", ["--runs", "4"], server_urls)

    assert out["completed"] == out["runs"] == 4
    assert out["credential_hits"] == 0, out["hits_by_place"]
    assert out["cross_tenant_rows_seen"] == 0 and out["unset_tenant_rows_seen"] == 0
    assert out["field_hits"] == 0 and out["canary_plaintext_hits"] == 0, out["hits_by_place"]
    assert out["control_hits"] > 0 and "postgres:onward.runs" in out["hits_by_place"]
    scanned = " ".join(out["places_scanned"])
    for place in ("postgres:onward.effects", "postgres:onward.audit", "redis:queued",
                  "log:worker", "log:dispatcher", "log:reaper"):
        assert place in scanned, (place, scanned)


def test_bench_storage__reports_storage_and_restore_figures(server_urls: dict[str, str]) -> None:
    """bench/storage.py, 40 steps of 512 bytes: the issue's keys are present and positive,
    the quotient is theirs, most checkpoints were stored as deltas, and ``--phases`` times
    the parts of both restores."""
    out = _bench("storage.py", ["--steps", "40", "--message-bytes", "512", "--samples", "3",
                                "--phases"], server_urls)

    for key in ("content_bytes", "stored_bytes", "stored_per_content",
                "restore_p50_ms_at_step_40", "restore_p50_ms_at_step_10",
                "restore_p50_ms_same_state_one_snapshot"):
        assert out[key] is not None and out[key] > 0, (key, out)
    assert out["stored_per_content"] == pytest.approx(
        out["stored_bytes"] / out["content_bytes"], rel=0.01)
    assert out["deltas"] > out["snapshots"] >= 1
    for step in (40, 10):
        phases = out[f"restore_phases_ms_at_step_{step}"]
        for part in ("claim_statement", "claim_from_row", "restore", "cpu_claim_and_restore",
                     "deltas_apply", "deltas_chain_digest", "restore_copy", "restore_validate"):
            assert phases[part] > 0, (step, part, phases)


def test_bench_partitions__reports_each_layout_and_its_probes(
        server_urls: dict[str, str]) -> None:
    """bench/partitions.py, tiny: a cost per step for each layout of step_attempts and each
    form of the close; the close as shipped (naming started_at) probes one index whatever
    the layout, by epoch one per partition (this month, three ahead and the default; and 24
    past months more)."""
    out = _bench("partitions.py", ["--ops", "20", "--rounds", "1", "--rows-per-month", "10"],
                 server_urls)
    for layout in ("flat", "months_5", "months_28"):
        assert out[f"{layout}_us_per_step"] > 0, out
        assert out[f"{layout}_by_epoch_us_per_step"] > 0, out
    assert [out[f"{layout}_close_index_probes"]
            for layout in ("flat", "months_5", "months_28")] == [1, 1, 1]
    assert [out[f"{layout}_by_epoch_close_index_probes"]
            for layout in ("flat", "months_5", "months_28")] == [1, 5, 29]


def test_bench_partitions_by_run__prunes_only_a_claim_naming_the_run(
        server_urls: dict[str, str]) -> None:
    """bench/partitions_by_run.py, tiny: checkpoints and evidence partitioned by month of
    run id; the claim as shipped plans every partition of both (5, then 29), the claim
    naming the run id one, and only that form makes PostgreSQL plan it at every call."""
    out = _bench("partitions_by_run.py", ["--steps", "20", "--rounds", "1"], server_urls)
    both = ("checkpoints", "evidence")
    for layout, parts in (("flat", 1), ("months_5", 5), ("months_29", 29)):
        assert out[f"{layout}_shipped_claim_plan_names"] == dict.fromkeys(both, parts), out
        assert out[f"{layout}_named_claim_plan_names"] == dict.fromkeys(both, 1), out
        assert out[f"{layout}_shipped_claim_cpu_us"] > 0, out
        assert out[f"{layout}_shipped_plans"]["claim"] == "generic", out
    assert out["months_5_named_plans"]["claim"] == "custom", out
