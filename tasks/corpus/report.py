"""The divergence report of a corpus replay (docs/corpus.md#the-report): a summary by
workflow and by kind of divergence, each divergent run's first difference, and whether the
replay passes what the command allows. Rendered as JSON, Markdown (for a pull request) and
JUnit XML (for CI); the terminal table is console/commands_replay.py's."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tasks.corpus.compare import Kind
from tasks.corpus.replayer import RunOutcome
from tasks.corpus.runner import CorpusReplay

__all__ = [
    "IDENTICAL",
    "SKIPPED",
    "Group",
    "Policy",
    "Summary",
    "dumps",
    "groups",
    "headline",
    "label",
    "summarize",
    "to_json",
    "to_junit",
    "to_markdown",
    "verdict_of",
]


IDENTICAL = "identical"
SKIPPED = "skipped"


@dataclass(frozen=True)
class Policy:
    """What a replay may show and still pass: kinds allowed, and how many divergent runs
    (of the kinds not allowed) are tolerated, as a count or a fraction of the runs."""

    allow: frozenset[Kind] = frozenset()
    max_divergent: float = 0  # below 1 and given as a percentage: a fraction of the runs
    fraction: bool = False

    @classmethod
    def parse(cls, allow: list[str], max_divergent: str = "0") -> Policy:
        kinds = set()
        for name in allow:
            try:
                kinds.add(Kind(name))
            except ValueError:
                raise ValueError(f"--allow {name!r}: one of "
                                 f"{', '.join(k.value for k in Kind)}") from None
        text = max_divergent.strip()
        if not re.fullmatch(r"\d+(\.\d+)?%?", text):
            raise ValueError(f"--max-divergent {max_divergent!r}: a count (3) or a percentage "
                             "of the runs (2.5%)")
        if text.endswith("%"):
            return cls(frozenset(kinds), float(text[:-1]) / 100.0, True)
        return cls(frozenset(kinds), float(text), False)

    def limit(self, runs: int) -> float:
        return self.max_divergent * runs if self.fraction else self.max_divergent


@dataclass
class Summary:
    runs: int
    identical: int = 0
    divergent: int = 0  # of a kind not allowed
    allowed: int = 0  # divergent, of an allowed kind
    skipped: int = 0  # no code for the workflow
    effect_keys_differ: int = 0  # identical otherwise, but not the same effect keys
    by_workflow: dict[str, dict[str, int]] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    limit: float = 0
    passed: bool = True
    why: str = ""


def verdict_of(outcome: RunOutcome, policy: Policy) -> str:
    """identical, skipped, allowed:<kind> or the kind of divergence."""
    if outcome.identical:
        return IDENTICAL
    kind = outcome.kind or Kind.ERROR.value
    if kind == Kind.NO_CODE.value:
        return SKIPPED
    return f"allowed:{kind}" if Kind(kind) in policy.allow else kind


def summarize(replay: CorpusReplay, policy: Policy) -> Summary:
    summary = Summary(runs=len(replay.outcomes), limit=policy.limit(len(replay.outcomes)))
    kinds: Counter[str] = Counter()
    for outcome in replay.outcomes:
        verdict = verdict_of(outcome, policy)
        row = summary.by_workflow.setdefault(outcome.workflow, Counter())
        row["runs"] += 1
        if verdict == IDENTICAL:
            summary.identical += 1
            row["identical"] += 1
            summary.effect_keys_differ += not outcome.same_effect_keys
        elif verdict == SKIPPED:
            summary.skipped += 1
            row["skipped"] += 1
        else:
            allowed = verdict.startswith("allowed:")
            summary.allowed += allowed
            summary.divergent += not allowed
            row["allowed" if allowed else "divergent"] += 1
            kinds[outcome.kind or Kind.ERROR.value] += 1
    summary.by_workflow = {w: dict(c) for w, c in sorted(summary.by_workflow.items())}
    summary.by_kind = dict(kinds.most_common())
    _decide(summary)
    return summary


def _decide(summary: Summary) -> None:
    if summary.runs == summary.skipped:
        summary.passed, summary.why = False, "no run was replayed (does --code name the " \
                                             "modules that define the corpus's workflows?)"
    elif summary.divergent > summary.limit:
        summary.passed = False
        summary.why = (f"{summary.divergent} divergent run(s), {summary.limit:g} allowed "
                       "(--max-divergent; --allow KIND lets a kind pass)")
    else:
        summary.passed, summary.why = True, "within what the command allows"


def label(finding: dict[str, Any] | None) -> str:
    """A divergence in a few words: what a reviewer scans and runs are grouped by."""
    if not finding:
        return ""
    kind, call, command = finding.get("kind"), finding.get("call"), finding.get("command_id")
    diff = [str(line) for line in finding.get("diff") or []]
    if kind == Kind.REQUEST.value:
        return f"{call} {command} asks something else"
    if kind == Kind.UNRECORDED.value:
        return f"{call} {command} was never recorded"
    if kind == Kind.NOT_MADE.value:
        return f"recorded {call} {command} not made"
    if kind == Kind.NEXT_STEP.value and len(diff) == 2:
        return f"{diff[0][2:]} → {diff[1][2:]}"
    paths = [line[2:].split(":", 1)[0] for line in diff if line[:3] in ("~ /", "+ /", "- /")]
    if kind in (Kind.STATE.value, Kind.RESULT.value) and paths:
        return f"{'state' if kind == Kind.STATE.value else 'result'} " \
               f"{', '.join(paths[:3])}{' …' if len(paths) > 3 else ''}"
    return str(finding.get("message", ""))[:120]


@dataclass(frozen=True)
class Group:
    """Runs that diverged the same way: kind, step and what differed."""

    verdict: str
    step: str | None
    seq: int | None
    what: str
    runs: list[RunOutcome]


def groups(replay: CorpusReplay, policy: Policy) -> list[Group]:
    """The distinct divergences, the most frequent first (each with its runs)."""
    found: dict[tuple[str, str | None, str], list[RunOutcome]] = {}
    for outcome in replay.outcomes:
        verdict = verdict_of(outcome, policy)
        if verdict == IDENTICAL:
            continue
        finding = outcome.finding or {}
        key = (verdict, finding.get("step"), label(finding))
        found.setdefault(key, []).append(outcome)
    return [Group(verdict, step, (runs[0].finding or {}).get("seq"), what, runs)
            for (verdict, step, what), runs in sorted(found.items(),
                                                      key=lambda item: -len(item[1]))]


def headline(summary: Summary) -> str:
    parts = [f"{summary.runs} runs", f"{summary.identical} identical",
             f"{summary.divergent} divergent"]
    if summary.allowed:
        parts.append(f"{summary.allowed} allowed")
    if summary.skipped:
        parts.append(f"{summary.skipped} skipped")
    return ", ".join(parts)


# -- JSON ---------------------------------------------------------------------------------------
def to_json(replay: CorpusReplay, summary: Summary, policy: Policy) -> dict[str, Any]:
    return {
        "passed": summary.passed, "why": summary.why, "source": replay.source,
        "code": list(replay.options.modules), "versions": replay.options.versions,
        "ignored": list(replay.options.ignore),
        "allowed": sorted(k.value for k in policy.allow), "max_divergent": summary.limit,
        "seconds": round(replay.seconds, 3), "jobs": replay.jobs,
        "summary": {k: v for k, v in summary.__dict__.items() if k not in ("passed", "why")},
        "divergences": [{"verdict": g.verdict, "step": g.step, "seq": g.seq, "what": g.what,
                         "runs": [o.run_id for o in g.runs]} for g in groups(replay, policy)],
        "runs": [{**o.as_json(), "verdict": verdict_of(o, policy),
                  "what": label(o.finding)} for o in replay.outcomes],
    }


# -- Markdown -------------------------------------------------------------------------------------
def to_markdown(replay: CorpusReplay, summary: Summary, policy: Policy,
                *, diffs: int = 20) -> str:
    """The report as Markdown for a pull request: summary tables, then each divergent run's
    first difference (the first ``diffs`` with their diff)."""
    status = "passed" if summary.passed else "FAILED"
    lines = [f"## Corpus replay: {status}", "",
             f"{headline(summary)} — {_source(replay)} against "
             f"`{', '.join(replay.options.modules)}` in {replay.seconds:.1f} s. "
             f"{summary.why[:1].upper()}{summary.why[1:]}.", "",
             "| workflow | runs | identical | divergent | allowed | skipped |",
             "|---|---:|---:|---:|---:|---:|"]
    for workflow, row in summary.by_workflow.items():
        lines.append(f"| `{workflow}` | {row.get('runs', 0)} | {row.get('identical', 0)} | "
                     f"{row.get('divergent', 0)} | {row.get('allowed', 0)} | "
                     f"{row.get('skipped', 0)} |")
    found = groups(replay, policy)
    if found:
        lines += ["", "| divergence | where | what | runs |", "|---|---|---|---:|"]
        lines += [f"| {_md(g.verdict)} | `{g.step}` (seq {g.seq}) | {_md(g.what)} | "
                  f"{len(g.runs)} |" for g in found]
    for index, group in enumerate(found):
        lines += ["", f"### {_md(group.verdict)} at `{group.step}`: {_md(group.what)} "
                      f"({len(group.runs)} run{'s' if len(group.runs) > 1 else ''})", ""]
        lines += _md_run(group.runs[0], policy, with_diff=index < diffs)
        if len(group.runs) > 1:
            lines += ["", "<details><summary>every run</summary>", "",
                      *(f"- `{o.run_id}`" for o in group.runs), "", "</details>"]
    return "\n".join(lines) + "\n"


def _md_run(outcome: RunOutcome, policy: Policy, *, with_diff: bool) -> list[str]:
    finding = outcome.finding or {}
    where = f"seq {finding.get('seq')}, step `{finding.get('step')}`" \
        if finding.get("seq") is not None else "whole run"
    verdict = verdict_of(outcome, policy)
    lines = [f"e.g. **`{outcome.run_id}`** ({outcome.workflow}) — {_md(verdict)} at {where}: "
             f"{_md(str(finding.get('message', '')))}"]
    if with_diff and finding.get("diff"):
        lines += ["", "  ```diff", *(f"  {line}" for line in finding["diff"]), "  ```", ""]
    return lines


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _source(replay: CorpusReplay) -> str:
    source = replay.source
    return (f"corpus `{source.get('corpus')}` ({source.get('runs')} runs, bundle "
            f"sha256 {str(source.get('digest'))[:16]}…)")


# -- JUnit XML -------------------------------------------------------------------------------------
def to_junit(replay: CorpusReplay, summary: Summary, policy: Policy) -> str:
    """One test suite per workflow, one test case per run: a divergence of a kind not
    allowed is a failure (message: the first difference; text: its diff), a run without
    code is skipped, an allowed divergence passes with the divergence in its output."""
    suites = ET.Element("testsuites", name=f"onward corpus {replay.source.get('corpus')}",
                        tests=str(summary.runs), failures=str(summary.divergent),
                        skipped=str(summary.skipped), time=f"{replay.seconds:.3f}")
    by_workflow: dict[str, list[RunOutcome]] = {}
    for outcome in replay.outcomes:
        by_workflow.setdefault(outcome.workflow, []).append(outcome)
    for workflow, outcomes in sorted(by_workflow.items()):
        row = summary.by_workflow.get(workflow, {})
        suite = ET.SubElement(suites, "testsuite", name=workflow, tests=str(len(outcomes)),
                              failures=str(row.get("divergent", 0)),
                              skipped=str(row.get("skipped", 0)),
                              time=f"{sum(o.seconds for o in outcomes):.3f}")
        for outcome in outcomes:
            _junit_case(suite, outcome, policy)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _junit_case(suite: ET.Element, outcome: RunOutcome, policy: Policy) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"corpus.{outcome.workflow}",
                         name=outcome.run_id, time=f"{outcome.seconds:.3f}")
    verdict = verdict_of(outcome, policy)
    finding = outcome.finding or {}
    text = "\n".join(finding.get("diff") or [])
    message = f"{finding.get('kind')}: {finding.get('message', '')}"
    if verdict == SKIPPED:
        ET.SubElement(case, "skipped", message=message)
    elif verdict.startswith("allowed:"):
        ET.SubElement(case, "system-out").text = f"allowed {message}\n{text}"
    elif verdict != IDENTICAL:
        failure = ET.SubElement(case, "failure", message=message, type=verdict)
        failure.text = text
    elif outcome.note:
        ET.SubElement(case, "system-out").text = outcome.note


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
