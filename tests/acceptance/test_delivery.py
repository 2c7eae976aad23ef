"""At-least-once delivery made safe: duplicates, stale and hostile messages are no-ops.

One real ``onward worker`` serves every test of this module, once on the prefork pool (2
children), once on the threads pool (4 threads in one process) and once on the gevent
pool (4 greenlets); there
is no dispatcher and no reaper, so the only messages are the ones a test publishes itself
(through the product's own Celery app) and the ones the worker publishes after a commit.
Each test asserts on its own runs, and on whole-ledger counts where "nothing changed" is
the claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest

from ledger import Ledger
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.messages import Publisher

pytestmark = pytest.mark.acceptance

PICKLE_REFUSED = ("Received invalid task message: Refusing to deserialize untrusted content "
                  "of type pickle")


@pytest.fixture()
def settings_env(module_env: dict[str, str]) -> dict[str, str]:
    return module_env


@pytest.fixture(scope="module", params=["prefork", "threads", "gevent"])
def worker(module_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Proc]:
    proc = module_cluster.worker(concurrency=2 if request.param == "prefork" else 4,
                                 pool=request.param, name=f"worker-{request.param}")
    yield proc
    proc.stop()  # the other pool's worker must not consume this module's later messages


def _completed(ledger: Ledger, run_id: UUID, **more: int) -> dict[str, Any]:
    return reads.wait_run(
        ledger.engine, run_id, timeout=60, what=f"run {run_id} to complete ({more})",
        status="completed", until=lambda row: all(row[k] == v for k, v in more.items()))


def test_delivery__same_message_twice_commits_once(ledger: Ledger, publisher: Publisher,
                                                   shared_cluster: Cluster,
                                                   worker: Proc) -> None:
    """The message for seq 0 delivered twice: one claim, one commit per seq, one counted
    stale delivery; the run completes with checkpoints 0..3 and the broker queue drains."""
    run_id = ledger.start_run("test_chain", {"steps": 3})
    publisher.step(run_id, 0)
    publisher.step(run_id, 0)

    row = _completed(ledger, run_id, stale_deliveries=1)

    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0, 1, 2, 3]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1}
    assert [a["outcome"] for a in reads.attempts(ledger.engine, run_id)] == ["committed"] * 3
    assert (row["attempts_total"], row["lease_epoch"], row["seq"]) == (3, 3, 3)
    assert reads.outbox_rows(ledger.engine, run_id) == []
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")
    log = worker.log()
    assert f"run_id={run_id}" in log and "stale delivery" in log


def test_delivery__many_copies_at_once_commit_each_seq_once(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """Thundering duplicates: 20 copies of seq 0 for each of 4 runs, published back to back
    and taken by every thread, greenlet or child at once: each seq commits once, every other
    copy is one counted stale delivery (19 per run), nothing is left queued."""
    runs = [ledger.start_run("test_chain", {"steps": 3}) for _ in range(4)]
    for _ in range(20):
        for run_id in runs:
            publisher.step(run_id, 0)
    for run_id in runs:
        row = _completed(ledger, run_id, stale_deliveries=19)
        assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1, 2: 1}
        assert (row["attempts_total"], row["seq"]) == (3, 3)
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")
    assert worker.alive()


def test_delivery__stale_seq_is_a_noop(ledger: Ledger, publisher: Publisher,
                                       shared_cluster: Cluster, worker: Proc) -> None:
    """Messages for a seq the run has passed, for a seq it has not reached, and for a
    finished run change nothing but stale_deliveries: no attempt, checkpoint or outbox row
    is added, and a run waiting at seq 0 is not advanced by a message for seq 1."""
    waiting = ledger.start_run("test_chain", {"steps": 2})
    publisher.step(waiting, 1)  # ahead of the run: it sits at seq 0
    reads.wait_run(ledger.engine, waiting, timeout=30, what="the early message to be counted",
                   until=lambda row: row["stale_deliveries"] == 1)
    assert reads.attempts(ledger.engine, waiting) == []
    assert reads.checkpoint_seqs(ledger.engine, waiting) == [0]

    publisher.step(waiting, 0)
    _completed(ledger, waiting)
    before = reads.fingerprint(ledger.engine)
    for seq in (0, 1, 2, 9):  # passed, passed, the final seq of a completed run, never
        publisher.step(waiting, seq)
    row = reads.wait_run(ledger.engine, waiting, timeout=30, what="4 stale deliveries",
                         until=lambda row: row["stale_deliveries"] == 5)

    after = reads.fingerprint(ledger.engine)
    assert after == reads.Fingerprint(**{**before.__dict__,
                                         "stale_deliveries": before.stale_deliveries + 4})
    assert (row["status"], row["seq"], row["attempts_total"]) == ("completed", 2, 2)
    assert reads.committed_per_seq(ledger.engine, waiting) == {0: 1, 1: 1}


def test_delivery__pickle_message_is_refused(ledger: Ledger, publisher: Publisher,
                                             shared_cluster: Cluster, worker: Proc) -> None:
    """A pickle-serialized step message is never deserialized (accept_content is JSON
    only): the worker logs the refusal, discards the message, nothing in the ledger
    changes, and the same worker then runs the JSON message for the same run."""
    run_id = ledger.start_run("test_chain", {"steps": 2})
    refusals = worker.log().count(PICKLE_REFUSED)
    before = reads.fingerprint(ledger.engine)

    publisher.step(run_id, 0, serializer="pickle")

    wait_for(lambda: worker.log().count(PICKLE_REFUSED) == refusals + 1,
        timeout=30, what="the worker to refuse the pickle message")
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the message to be discarded")
    assert reads.fingerprint(ledger.engine) == before
    assert worker.alive()

    publisher.step(run_id, 0)
    row = _completed(ledger, run_id)
    assert (row["attempts_total"], row["stale_deliveries"]) == (2, 0)


def test_delivery__unknown_run_is_rejected_without_state_change(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """A message for a run id the ledger has never seen is acknowledged and dropped with a
    log line naming the run and the reason; the ledger is untouched."""
    ghost = uuid4()
    before = reads.fingerprint(ledger.engine)
    publisher.step(ghost, 0)
    line = wait_for(lambda: next((ln for ln in worker.log().splitlines()
                                  if str(ghost) in ln), None),
                    timeout=30, what="a log line about the unknown run")
    assert "unknown_run" in line
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the message to be consumed")
    assert reads.fingerprint(ledger.engine) == before


def test_delivery__malformed_messages_are_rejected_without_state_change(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """Step messages with a bad run id, a missing or non-integer seq, an extra field, or a
    body that is not a task message at all are each rejected with a log line; nothing in
    the ledger changes and the worker keeps serving good messages."""
    run_id = ledger.start_run("test_chain", {"steps": 2})
    log_before = worker.log()
    before = reads.fingerprint(ledger.engine)

    publisher.send({"run_id": "not-a-uuid", "seq": 0})
    publisher.send({"seq": 0})
    publisher.send({"run_id": str(run_id), "seq": "zero"})
    publisher.send({"run_id": str(run_id), "seq": 0, "state": {"done": 99}})
    publisher.raw(b"\x00not json{", content_type="application/json")
    publisher.raw(b'{"run_id": "%s", "seq": 0}' % str(run_id).encode(),
                  content_type="application/json")

    def rejections() -> dict[str, int]:
        log = worker.log()
        return {marker: log.count(marker) - log_before.count(marker) for marker in (
            "malformed step message rejected", "Can't decode message body",
            "Received and deleted unknown message")}

    wait_for(lambda: rejections() == {"malformed step message rejected": 4,
                                      "Can't decode message body": 1,
                                      "Received and deleted unknown message": 1},
             timeout=30, what="six rejections in the worker log", seen=rejections)
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")
    assert reads.fingerprint(ledger.engine) == before
    assert worker.alive()

    publisher.step(run_id, 0)
    row = _completed(ledger, run_id)
    assert (row["attempts_total"], row["stale_deliveries"]) == (2, 0)


def test_delivery__bodies_celery_cannot_unpack_are_refused_and_the_worker_goes_on(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """Step messages under an ``onward.step`` task header whose JSON body is not
    ``[args, kwargs, options]`` (a string, a number, kwargs that are not an object,
    positional args), whose content type kombu decodes as raw text (application/data),
    that is over 64 KiB (a step message names a run and a seq), or with a header Celery
    reads without checking it (``timelimit: [1]``, a retries that is text...), are each
    refused before Celery's handling reads them, with a
    log line naming what is wrong, and dropped: the worker stays up (Celery's consumer
    raised on them and the whole worker stopped, "Unrecoverable error"), nothing in the
    ledger changes, and the next good message runs the run."""
    run_id = ledger.start_run("test_chain", {"steps": 2})
    log_before = worker.log()
    before = reads.fingerprint(ledger.engine)
    step = {"task": "onward.step", "lang": "py"}
    good = b'[[], {"run_id": "%s", "seq": 0}, {}]' % str(run_id).encode()
    for body, content_type in ((b'"hello"', "application/json"), (b"5", "application/json"),
                               (b"[[], 5, {}]", "application/json"),
                               (b'[["%s", 0], {}, {}]' % str(run_id).encode(),
                                "application/json"),
                               (good, "application/data")):
        publisher.raw(body, content_type=content_type, headers={**step, "id": str(uuid4())})
    publisher.send({"run_id": str(run_id), "seq": 0, "pad": "x" * 1024 * 1024})
    for header in ({"timelimit": [1]}, {"timelimit": [None, "x"]}, {"retries": "1"},
                   {"ignore_result": "yes"}, {"root_id": 7}):
        publisher.raw(good, content_type="application/json",
                      headers={**step, "id": str(uuid4()), **header})

    def refused() -> int:
        log = worker.log()
        marker = "Received invalid task message: malformed step message"
        return log.count(marker) - log_before.count(marker)

    wait_for(lambda: refused() == 11 or not worker.alive(), timeout=30,
             what="eleven refusals in the worker log", seen=refused)
    assert "its timelimit header must be [hard, soft]" in worker.log()
    assert "over the 65536 a step message may have" in worker.log()
    assert worker.alive(), worker.tail()
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")
    assert "Unrecoverable error" not in worker.log()
    assert reads.fingerprint(ledger.engine) == before

    publisher.step(run_id, 0)
    row = _completed(ledger, run_id)
    assert (row["attempts_total"], row["stale_deliveries"]) == (2, 0)


def test_delivery__a_seq_of_another_type_or_out_of_range_is_malformed(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """A seq sent as a string, a boolean, a float, a negative number or one beyond what a
    checkpoint can have is rejected as malformed: "0" or true is not taken for a seq (it
    ran the step: the message named no seq the outbox ever sends), and nothing changes."""
    run_id = ledger.start_run("test_chain", {"steps": 2})
    log_before = worker.log()
    before = reads.fingerprint(ledger.engine)
    for seq in ("0", True, 0.0, -1, 2**31, 2**63):
        publisher.send({"run_id": str(run_id), "seq": seq})

    def rejected() -> int:
        marker = "malformed step message rejected"
        return worker.log().count(marker) - log_before.count(marker)

    wait_for(lambda: rejected() == 6, timeout=30, what="six rejections", seen=rejected)
    wait_for(lambda: publisher.queued() == 0, timeout=30, what="the queue to drain")
    assert reads.fingerprint(ledger.engine) == before
    publisher.step(run_id, 0)
    _completed(ledger, run_id)


def test_delivery__unknown_workflow_is_handed_back_unchanged(
        ledger: Ledger, publisher: Publisher, shared_cluster: Cluster, worker: Proc) -> None:
    """A run of a workflow this worker does not have (its own workers may be down for a
    deploy) is claimed, then handed back at once with a warning naming the workflow: the run
    stays runnable at seq 0, no lease, no new checkpoint, and no attempt spent (attempt and
    attempts_total 0: the attempt is recorded as 'released', not counted); the hand-back
    is counted and the step queued again for the dispatcher (1 s later), so a worker with
    the workflow can take it, and only ONWARD_HANDBACK_LIMIT hand-backs in a row park it;
    last_error says what to check."""
    run_id = ledger.start_run("no_such_workflow", {"x": 1})
    publisher.step(run_id, 0)
    reads.wait_run(ledger.engine, run_id, timeout=30, what="the run to be handed back",
                   until=lambda row: row["handbacks"] == 1 and row["lease_owner"] is None)
    wait_for(lambda: [a["outcome"] for a in reads.attempts(ledger.engine, run_id)]
             == ["released"], timeout=30, what="the attempt to be recorded as released")

    row = reads.run_row(ledger.engine, run_id)
    assert (row["status"], row["seq"], row["step"]) == ("running", 0, None)
    assert (row["attempt"], row["attempts_total"], row["handbacks"]) == (0, 0, 1)
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert row["last_error"]["type"] == "UnknownWorkflow"
    assert "'no_such_workflow'" in row["last_error"]["message"]
    assert "ONWARD_WORKFLOWS" in row["last_error"]["message"]
    assert reads.checkpoint_seqs(ledger.engine, run_id) == [0]
    [queued] = reads.outbox_rows(ledger.engine, run_id)
    assert (queued["seq"], queued["published_at"]) == (0, None)
    line = next(ln for ln in worker.log().splitlines()
                if str(run_id) in ln and "handed back" in ln)
    assert "warning" in line and "'no_such_workflow'" in line and "ONWARD_WORKFLOWS" in line
