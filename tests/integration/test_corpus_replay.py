"""Offline corpus replay against a real PostgreSQL (docs/corpus.md#offline-replay): a
scratch ledger per replay, steps executed in-process through the real executor, and the
report of each kind of divergence. The recorded runs are driven in-process too
(tests/support/driver.py); ``tests/workflows_corpus.py`` stands for candidate code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import Ledger, OnwardSettings
from ledger.bundle import read_bundle
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.vocabulary import Role
from tasks.corpus.compare import Kind
from tasks.corpus.replayer import ReplayOptions, RunOutcome
from tasks.corpus.report import Policy, summarize
from tasks.corpus.runner import CorpusReplay, replay_bundle
from tests.support.corpus import record_flow, record_note, record_timeouts, table_digest
from tests.support.driver import Driver, driver
from tests.support.model_server import ModelServer, model_server_in_thread

MODULES = ["tests.workflows_corpus", "tests.workflows_ops"]


@pytest.fixture()
def drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(tmp_path / "tool.log"))
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    monkeypatch.delenv("ONWARD_TEST_CORPUS_VARIANT", raising=False)
    with driver(ledger.acting_as("olga", Role.OPERATOR), MODULES) as running:
        yield running


def replay(drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch,
           variant: str = "", **options: object) -> CorpusReplay:
    """Replay corpus ``c`` of the test ledger with the candidate code ``variant``."""
    monkeypatch.setenv("ONWARD_TEST_CORPUS_VARIANT", variant)
    bundle = read_bundle(Corpora(drv.ledger).snapshot("c"), drv.ledger.keys)
    return replay_bundle(settings, bundle, ReplayOptions(tuple(MODULES), **options),  # type: ignore[arg-type]
                         jobs=1)


def only(result: CorpusReplay) -> RunOutcome:
    assert len(result.outcomes) == 1
    return result.outcomes[0]


def test_replay__same_code_is_identical_with_the_same_effect_keys_and_writes_nothing(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: replayed against the code that recorded them, runs with a model call, a
    read, effects, a timer, a signal and an approval are identical, checkpoint by
    checkpoint, with the same effect keys in the same order; reading the corpus and
    replaying it write nothing to the source ledger (every row of every table unchanged)."""
    runs = [record_flow(drv, "seat"), record_flow(drv, "desk"),
            record_note(drv, "n", approve=True)]
    Corpora(drv.ledger).add("c", Selection())
    before = table_digest(drv.ledger.engine)
    result = replay(drv, settings, monkeypatch)
    assert table_digest(drv.ledger.engine) == before
    assert [o.run_id for o in result.outcomes] == sorted(map(str, runs))
    for outcome in result.outcomes:
        assert outcome.identical, outcome.finding
        assert outcome.same_effect_keys
        assert outcome.steps_replayed == outcome.steps_recorded
        assert outcome.replay_status == "completed"
    summary = summarize(result, Policy())
    assert (summary.identical, summary.divergent, summary.passed) == (3, 0, True)


@pytest.mark.parametrize(("variant", "kind", "seq", "step"), [
    ("prompt", Kind.REQUEST, 0, "classify"),
    ("extra_read", Kind.UNRECORDED, 1, "price"),
    ("skip_effect", Kind.NOT_MADE, 2, "book"),
    ("path", Kind.NEXT_STEP, 2, "book"),
    ("state", Kind.STATE, 2, "book"),
    ("result", Kind.RESULT, 5, "confirm"),
    ("crash", Kind.ERROR, 3, "await_go"),
])
def test_replay__each_code_change_is_reported_at_its_first_point(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch,
        variant: str, kind: Kind, seq: int, step: str) -> None:
    """Invariant: a code change is reported as the kind of divergence it makes, at the seq
    and step where it first shows (not later, not as something else), and the replay never
    calls anything: the outside world saw only the recorded run's calls."""
    record_flow(drv, "seat")
    Corpora(drv.ledger).add("c", Selection())
    outcome = only(replay(drv, settings, monkeypatch, variant))
    assert not outcome.identical
    finding = outcome.finding or {}
    assert (finding["kind"], finding["seq"], finding["step"]) == (kind.value, seq, step), finding


def test_replay__an_expired_approval_and_a_timed_out_signal_are_followed(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a recorded run whose approval expired (it went on to ``on_expire``) and
    whose signal wait then timed out (``on_timeout``) replays identically: the replay
    follows where the recorded run went after each wait, and ``ctx.decision`` reads the
    expired approval as the recorded step did."""
    record_timeouts(drv)
    Corpora(drv.ledger).add("c", Selection())
    outcome = only(replay(drv, settings, monkeypatch))
    assert outcome.identical, outcome.finding
    assert outcome.steps_replayed == outcome.steps_recorded == 4


def test_replay__a_changed_prompt_shows_the_diff_of_the_two_requests(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: for a model call that asks something else, the report shows both
    requests as a diff (the recorded prompt is kept as the artifact its hash names)."""
    record_flow(drv, "seat")
    Corpora(drv.ledger).add("c", Selection())
    finding = only(replay(drv, settings, monkeypatch, "prompt")).finding or {}
    assert "-What kind of item is seat?" in finding["diff"]
    assert "+Classify the item seat in one word." in finding["diff"]


def test_replay__ignored_fields_and_allowed_kinds(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a state field that differs on every replay (the time) is a state
    divergence unless ``--ignore-field`` leaves it out; an allowed kind does not fail the
    replay, other kinds still do, and ``--max-divergent`` tolerates a count or a share."""
    monkeypatch.setenv("ONWARD_TEST_CORPUS_VARIANT", "clock")
    record_flow(drv, "seat")
    Corpora(drv.ledger).add("c", Selection())
    timed = replay(drv, settings, monkeypatch, "clock")
    assert only(timed).kind == Kind.STATE.value
    assert only(replay(drv, settings, monkeypatch, "clock", ignore=("/when",))).identical
    assert summarize(timed, Policy()).passed is False
    assert summarize(timed, Policy.parse(["state"])).passed is True
    assert summarize(timed, Policy.parse(["result"])).passed is False
    assert summarize(timed, Policy.parse([], "1")).passed is True
    assert summarize(timed, Policy.parse([], "50%")).passed is False
    with pytest.raises(ValueError, match="--allow"):
        Policy.parse(["nonsense"])


def test_replay__a_workflow_the_code_lacks_is_skipped_not_failed(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a run whose workflow the candidate code does not define is reported as
    skipped (no_code), not replayed; a replay that skips every run does not pass."""
    record_note(drv, "n")
    Corpora(drv.ledger).add("c", Selection())
    bundle = read_bundle(Corpora(drv.ledger).snapshot("c"), drv.ledger.keys)
    result = replay_bundle(settings, bundle, ReplayOptions(("tests.workflows_corpus",)), jobs=1)
    assert only(result).kind == Kind.NO_CODE.value
    summary = summarize(result, Policy())
    assert (summary.skipped, summary.passed) == (1, False)


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    """The model server the research agent records its answers from (the outside world)."""
    import examples.research

    with model_server_in_thread(latency_ms=1) as server:
        monkeypatch.setenv("ONWARD_MODEL_URL", server.url)
        examples.research._Model._client.cache_clear()  # built once per process, from the env
        yield server
    examples.research._Model._client.cache_clear()


def test_replay__the_research_agents_second_version_against_the_first_ones_runs(
        ledger: Ledger, settings: OnwardSettings, model: ModelServer) -> None:
    """Invariant: the README's example: replayed against examples.research_v2, a research
    run whose sources are all vetted diverges where v2 asks the model with the new prompt
    (with the two prompts' diff), the others where v2 goes to its new validation step;
    against examples.research (the code that recorded them) every run is identical. The
    replays ask the model server nothing."""
    from examples.research_v2 import vetted
    from tasks.corpus.report import groups
    runs: dict[str, bool] = {}
    with driver(ledger, ["examples.research"]) as drv:
        for i in range(6):
            run_id = ledger.start_run("research_agent", {"topic": f"topic-{i:02d}"})
            drv.drive(run_id)
            sources = ledger.checkpoints(run_id)[1].state["sources"]
            runs[str(run_id)] = all(vetted(s) for s in sources)
    assert set(runs.values()) == {True, False}, "the topics should exercise both paths"
    asked = model.stats()["requests"]
    Corpora(ledger).add("c", Selection())
    bundle = read_bundle(Corpora(ledger).snapshot("c"), ledger.keys)
    same = replay_bundle(settings, bundle, ReplayOptions(("examples.research",)), jobs=1)
    assert all(o.identical for o in same.outcomes)
    v2 = replay_bundle(settings, bundle, ReplayOptions(("examples.research_v2",)), jobs=1)
    for outcome in v2.outcomes:
        finding = outcome.finding or {}
        if runs[outcome.run_id]:
            assert (finding["kind"], finding["step"]) == ("request_differs", "draft")
            assert any(line.startswith("+Write a short, neutral report on topic-")
                       for line in finding["diff"]), finding["diff"]
        else:
            assert (finding["kind"], finding["step"]) == ("next_step", "extract_claims")
            assert finding["diff"] == ["- goto draft", "+ goto check_claims"]
        assert outcome.replayed_version == 2
    assert len(groups(v2, Policy())) == 2
    assert model.stats()["requests"] == asked
