"""The corpus replay report as pure data: ignored fields, JSON and request diffs, the
pass/fail policy, and the JUnit XML and Markdown a CI system and a reviewer read."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tasks.corpus.compare import Kind
from tasks.corpus.diff import json_diff, request_diff, without
from tasks.corpus.replayer import ReplayOptions, RunOutcome
from tasks.corpus.report import Policy, summarize, to_junit, to_markdown
from tasks.corpus.runner import CorpusReplay


def test_without__removes_pointers_with_wildcards_and_leaves_the_input_alone() -> None:
    """Invariant: ignored fields are left out of a copy; ``*`` matches any key or index."""
    doc = {"a": 1, "items": [{"at": 1, "x": 2}, {"at": 3, "x": 4}], "m": {"k": {"at": 5}}}
    assert without(doc, ("/items/*/at", "/m/*/at", "/a")) == {
        "items": [{"x": 2}, {"x": 4}], "m": {"k": {}}}
    assert doc["a"] == 1 and doc["items"][0]["at"] == 1


def test_json_diff__one_line_per_change_and_long_text_as_a_unified_diff() -> None:
    """Invariant: equal documents have no diff; each change is one line, a multi-line
    string a unified diff under its path."""
    assert json_diff({"a": 1}, {"a": 1}) == []
    lines = json_diff({"a": 1, "b": "x\ny", "c": 0}, {"a": 2, "b": "x\nz", "d": 1})
    assert "~ /a: 1 → 2" in lines and "- /c: 0" in lines and "+ /d: 1" in lines
    assert "    -y" in lines and "    +z" in lines


def test_request_diff__shows_messages_as_text() -> None:
    """Invariant: a model request diff reads as the messages' text, not escaped JSON."""
    before = {"model": "m", "messages": [{"role": "user", "content": "Hi\nthere"}], "params": {}}
    after = {"model": "m", "messages": [{"role": "user", "content": "Hi\nyou"}], "params": {}}
    lines = request_diff(before, after)
    assert "-there" in lines and "+you" in lines and " [user]" in lines


def _replay(*outcomes: RunOutcome) -> CorpusReplay:
    return CorpusReplay({"corpus": "c", "digest": "0" * 64, "runs": len(outcomes)},
                        ReplayOptions(("m",)), list(outcomes), 1.5, 1)


def _run(name: str, kind: Kind | None, workflow: str = "wf") -> RunOutcome:
    finding = None if kind is None else {
        "kind": kind.value, "message": f"{kind.value} <here> & there", "seq": 2, "step": "s",
        "call": None, "command_id": None, "diff": ["- a", "+ b"]}
    return RunOutcome(name, workflow, 1, "completed", 3, identical=kind is None,
                      finding=finding, seconds=0.25)


def test_policy__counts_kinds_allowed_and_the_limit() -> None:
    """Invariant: a replay passes when the divergent runs of kinds not allowed are within
    --max-divergent; skipped runs never fail it, unless nothing was replayed."""
    replay = _replay(_run("1", None), _run("2", Kind.STATE), _run("3", Kind.REQUEST),
                     _run("4", Kind.NO_CODE, "other"))
    summary = summarize(replay, Policy())
    assert (summary.identical, summary.divergent, summary.skipped, summary.passed) == \
        (1, 2, 1, False)
    assert summary.by_kind == {"state": 1, "request_differs": 1}
    assert summarize(replay, Policy.parse(["state", "request_differs"])).passed
    assert summarize(replay, Policy.parse(["state"], "1")).passed
    assert not summarize(replay, Policy.parse([], "25%")).passed
    assert summarize(replay, Policy.parse([], "50%")).passed
    assert not summarize(_replay(_run("5", Kind.NO_CODE)), Policy()).passed


def test_junit__one_case_per_run_failures_skips_and_escaped_text() -> None:
    """Invariant: the JUnit XML parses, has one test case per run grouped by workflow,
    failures for divergences not allowed (with the diff), skips for runs without code,
    and data is escaped, never markup."""
    replay = _replay(_run("1", None), _run("2", Kind.STATE), _run("3", Kind.REQUEST),
                     _run("4", Kind.NO_CODE, "other"))
    policy = Policy.parse(["request_differs"])
    root = ET.fromstring(to_junit(replay, summarize(replay, policy), policy))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"1", "2", "3", "4"}
    failure = cases["2"].find("failure")
    assert failure is not None and failure.get("message") == "state: state <here> & there"
    assert failure.text == "- a\n+ b"
    assert cases["3"].find("failure") is None and cases["4"].find("skipped") is not None


def test_markdown__summary_tables_and_each_divergent_run_with_its_diff() -> None:
    """Invariant: the Markdown says passed or FAILED, has a row per workflow and per
    distinct divergence, and shows an example run of each with its diff."""
    replay = _replay(_run("1", None), _run("2", Kind.STATE))
    text = to_markdown(replay, summarize(replay, Policy()), Policy())
    assert text.startswith("## Corpus replay: FAILED")
    assert "| `wf` | 2 | 1 | 1 | 0 | 0 |" in text
    assert "| state | `s` (seq 2) | state <here> & there | 1 |" in text
    assert "**`2`**" in text and "```diff" in text and "  + b" in text
