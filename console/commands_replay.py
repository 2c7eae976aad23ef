"""``onward corpus replay NAME|FILE --code MODULE``: replay a corpus against candidate code
offline and report where each run diverges (docs/corpus.md#offline-replay).

Exit codes: 0 the replay passed (no divergence beyond what --allow and --max-divergent
let through), 1 it did not, 2 refused (bad input, a bundle or run that does not verify).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.table import Table
from rich.text import Text

from console.commands_corpus import corpus_app
from console.common import (
    EXIT_FAILED,
    EXIT_REFUSED,
    err,
    fail,
    open_ledger,
    out,
    reported,
    short,
)
from console.safe import add_row, line, visible
from ledger import Ledger
from ledger.bundle import Bundle, read_bundle
from ledger.corpora import Corpora
from ledger.corpus_replays import open_replays_txn
from ledger.vocabulary import AuditAction
from tasks.corpus.compare import SEALED_REQUEST, Kind
from tasks.corpus.replayer import ReplayOptions, RunOutcome
from tasks.corpus.report import (
    IDENTICAL,
    SKIPPED,
    Policy,
    Summary,
    dumps,
    groups,
    headline,
    summarize,
    to_json,
    to_junit,
    to_markdown,
    verdict_of,
)
from tasks.corpus.runner import CorpusReplay, replay_bundle
from tasks.workflow import Registry

__all__ = ["KINDS", "corpus_replay"]


KINDS = ", ".join(k.value for k in Kind)


# The options of ``onward corpus replay``, named so that its signature reads as a list
_Source = Annotated[str, typer.Argument(help="A corpus of this ledger, or a bundle file.")]
_Code = Annotated[list[str], typer.Option(
    "--code", help="Module(s) defining the candidate workflows (repeatable or "
    "comma-separated), importable from PYTHONPATH.")]
_Jobs = Annotated[int | None, typer.Option(min=1, help="Replay processes (default: "
                                           "two per CPU).")]
_Versions = Annotated[str, typer.Option(
    help="recorded: each step runs with the version the recorded step ran with when the "
    "code has it (faithful for runs that migrated); latest: the code's latest version "
    "from the start.")]
_Allow = Annotated[list[str] | None, typer.Option(
    "--allow", help=f"A kind of divergence that does not fail the replay (repeatable): "
    f"{KINDS}.")]
_IgnoreField = Annotated[list[str] | None, typer.Option(
    "--ignore-field", help="A JSON pointer left out of states and results when they are "
    "compared, '*' for any key or index (repeatable), e.g. /generated_at.")]
_MaxDivergent = Annotated[str, typer.Option(
    help="Divergent runs tolerated: a count (3) or a share of the runs (2.5%).")]
_Output = Annotated[str, typer.Option(
    "--format", help="What stdout gets: table, markdown, junit or json.")]
_Markdown = Annotated[Path | None, typer.Option(help="Also write Markdown here.")]
_Junit = Annotated[Path | None, typer.Option(help="Also write JUnit XML here.")]
_JsonFile = Annotated[Path | None, typer.Option("--json", help="Also write JSON here.")]
_Diffs = Annotated[int, typer.Option(min=0, help="Divergent runs shown with their diff.")]
_OpenBranches = Annotated[bool, typer.Option(
    "--open-branches", help="Open each divergent run's replay in this ledger, under its "
    "recorded run, for inspection (operator role; audited).")]
_Reason = Annotated[str | None, typer.Option(
    "--reason", "-r", help="Why (with --open-branches: kept in the audit log).")]
_ShowSealed = Annotated[bool, typer.Option(
    "--show-sealed", help="Show a request that differs as a diff even where it is stored "
    "sealed (encryption at rest), in every output and file the report goes to; otherwise "
    "its hashes. Not for a viewer; audited.")]
_ScratchUrl = Annotated[str | None, typer.Option(
    help="An empty database to replay in (default: a throwaway database on the ledger's "
    "server).")]


@corpus_app.command("replay")
def corpus_replay(
    source: _Source, code: _Code, jobs: _Jobs = None, versions: _Versions = "recorded",
    allow: _Allow = None, ignore_field: _IgnoreField = None, max_divergent: _MaxDivergent = "0",
    output: _Output = "table", markdown: _Markdown = None, junit: _Junit = None,
    json_file: _JsonFile = None, diffs: _Diffs = 3, open_branches: _OpenBranches = False,
    reason: _Reason = None, scratch_url: _ScratchUrl = None, show_sealed: _ShowSealed = False,
) -> None:
    """Replay every run of a corpus (NAME) or bundle (FILE) against candidate code, offline:
    no broker, no workers, nothing sent, nothing written to the ledger. Model calls and reads
    are answered from the recorded evidence, effects from the effect log, approvals and
    signals from what was decided. Prints where each run diverged."""
    _check_options(output, versions, open_branches, reason)
    policy = _policy(allow, max_divergent)
    modules = _modules(code)
    ledger = open_ledger(AuditAction.REPLAY if open_branches else None)
    if show_sealed:  # refused (audited) for a viewer before anything is read
        with reported():
            ledger.showing_sealed(f"corpus replay {source} --show-sealed",
                                  {"source": source, "code": list(modules)})
    bundle, label = _bundle(ledger, source)
    options = ReplayOptions(modules, versions, tuple(ignore_field or ()), label, show_sealed)
    _announce(bundle, label, modules)
    keep = (lambda o: _openable(o, policy)) if open_branches else None
    with reported():
        replay = replay_bundle(ledger.settings, bundle, options, jobs=jobs,
                               scratch_url=scratch_url, keep=keep)
    summary = summarize(replay, policy)
    _write_files(replay, summary, policy, markdown, junit, json_file, diffs)
    _print(replay, summary, policy, output, diffs)
    if open_branches:
        _open(ledger, replay, reason or "", modules)
    if not summary.passed:
        raise typer.Exit(EXIT_FAILED)


def _check_options(output: str, versions: str, open_branches: bool,
                   reason: str | None) -> None:
    """Refuse (exit 2) an output format or versions choice that does not exist, and
    --open-branches without the --reason its audit row keeps."""
    if output not in ("table", "markdown", "junit", "json"):
        fail(f"--format {output!r}: table, markdown, junit or json", EXIT_REFUSED)
    if versions not in ("recorded", "latest"):
        fail(f"--versions {versions!r}: recorded or latest", EXIT_REFUSED)
    if open_branches and not reason:
        fail("--open-branches writes to the ledger: give --reason (kept in the audit log)",
             EXIT_REFUSED)


def _policy(allow: list[str] | None, max_divergent: str) -> Policy:
    """What the replay tolerates (--allow, --max-divergent); refused (exit 2) if unreadable."""
    try:
        return Policy.parse(allow or [], max_divergent)
    except ValueError as exc:
        fail(str(exc), EXIT_REFUSED)


def _modules(code: list[str]) -> tuple[str, ...]:
    """The candidate code's modules (--code, repeatable or comma-separated), loaded once
    here so that an import error is refused (exit 2) before anything is replayed."""
    modules = tuple(m.strip() for part in code for m in part.split(",") if m.strip())
    _check_code(modules)
    return modules


def _announce(bundle: Bundle, label: str, modules: tuple[str, ...]) -> None:
    """Say on stderr which pinned runs the bundle leaves out, and what is replayed."""
    for left_out in bundle.header.get("skipped") or []:
        err.print(line(f"note: pinned run {left_out.get('run_id')} is left out: it is "
                       f"{left_out.get('status')} (continued after it was pinned)"))
    err.print(line(f"replaying {len(bundle.run_ids)} run(s) of {label} against "
                   f"{', '.join(modules)} …"))


def _check_code(modules: tuple[str, ...]) -> None:
    if not modules:
        fail("--code: name the module(s) that define the candidate workflows", EXIT_REFUSED)
    try:
        Registry().load_modules(list(modules))
    except Exception as exc:  # an import error of the candidate code, whatever it is
        fail(f"--code {', '.join(modules)}: cannot load the candidate code: "
             f"{type(exc).__name__}: {exc}", EXIT_REFUSED)


def _bundle(ledger: Ledger, source: str) -> tuple[Bundle, str]:
    """The bundle of a file (checked with the keys configured here), or of a corpus of this
    ledger, read in a READ ONLY transaction that writes nothing."""
    path = Path(source)
    with reported():
        if path.is_file():
            return read_bundle(path, ledger.keys), f"bundle {path.name}"
        data = Corpora(ledger).snapshot(source)
        return read_bundle(data, ledger.keys), f"corpus {source}"
    raise AssertionError("unreachable")  # pragma: no cover - reported() exits


def _openable(outcome: RunOutcome, policy: Policy) -> bool:
    return verdict_of(outcome, policy) not in (IDENTICAL, SKIPPED) and \
        outcome.replay_status not in (None, "running", "waiting")


def _write_files(replay: CorpusReplay, summary: Summary, policy: Policy,
                 markdown: Path | None, junit: Path | None, json_file: Path | None,
                 diffs: int) -> None:
    if markdown is not None:
        markdown.write_text(to_markdown(replay, summary, policy, diffs=max(diffs, 20)))
    if junit is not None:
        junit.write_text(to_junit(replay, summary, policy))
    if json_file is not None:
        json_file.write_text(dumps(to_json(replay, summary, policy)) + "\n")


def _print(replay: CorpusReplay, summary: Summary, policy: Policy, output: str,
           diffs: int) -> None:
    if output == "json":
        print(dumps(to_json(replay, summary, policy)))
    elif output == "markdown":
        sys.stdout.write(to_markdown(replay, summary, policy, diffs=diffs))
    elif output == "junit":
        sys.stdout.write(to_junit(replay, summary, policy))
    else:
        _table(replay, summary, policy, diffs)


def _table(replay: CorpusReplay, summary: Summary, policy: Policy, diffs: int) -> None:
    style = "green" if summary.passed else "red"
    out.print(line(("passed" if summary.passed else "FAILED", f"bold {style}"), ": ",
                   headline(summary), f" in {replay.seconds:.1f} s ({replay.jobs} processes)"))
    by_workflow = Table("workflow", "runs", "identical", "divergent", "allowed", "skipped")
    for workflow, row in summary.by_workflow.items():
        add_row(by_workflow, workflow, *(row.get(k, 0) for k in
                                         ("runs", "identical", "divergent", "allowed",
                                          "skipped")))
    out.print(by_workflow)
    found = groups(replay, policy)
    if found:
        table = Table("divergence", "where", "what", "runs", "e.g. run")
        for group in found:
            add_row(table, group.verdict, f"{group.step} (seq {group.seq})", group.what,
                    len(group.runs), short(group.runs[0].run_id, 13))
        out.print(table)
    for group in found[:diffs]:
        if (group.runs[0].finding or {}).get("diff"):
            _diff(group.runs[0])
    if any(str(shown).endswith(SEALED_REQUEST) for group in found[:diffs]
           for shown in (group.runs[0].finding or {}).get("diff") or ()):
        out.print(line("(a request stored sealed is shown by its hashes: --show-sealed shows "
                       "its diff to an approver, operator or admin, audited)"))
    if found and diffs < len(found):
        out.print(line(f"({len(found) - diffs} more divergence(s): --diffs N shows more; "
                       "--markdown FILE or --format json lists every run)"))
    out.print(line(summary.why))


def _diff(outcome: RunOutcome) -> None:
    finding = outcome.finding or {}
    out.print(line(("run ", "bold"), outcome.run_id, f" ({outcome.workflow}), seq "
                   f"{finding.get('seq')}, {finding.get('kind')}:"))
    for text in finding.get("diff") or []:
        color = "green" if text.startswith("+") else "red" if text.startswith("-") else ""
        out.print(Text(visible(text), style=color), soft_wrap=True)


def _open(ledger: Ledger, replay: CorpusReplay, reason: str, modules: tuple[str, ...]) -> None:
    details: dict[UUID, dict[str, Any]] = {}
    for outcome in replay.outcomes:
        if outcome.replay_run_id:
            details[UUID(outcome.replay_run_id)] = {
                "corpus": replay.source.get("corpus"), "bundle": replay.source.get("digest"),
                "code": list(modules), "finding": {k: (outcome.finding or {}).get(k) for k in
                                                   ("kind", "seq", "step", "message")}}

    with reported():
        opened = ledger._command(
            AuditAction.REPLAY, lambda conn: open_replays_txn(
                conn, ledger.actor, ledger.keys, replay.copies, details, reason),
            reason=reason)
    err.print(line(("opened", "green"), f" {len(opened)} divergent replay(s) for inspection: "
                   "onward runs show RUN (or the console's run page)"))
    for run_id in opened:
        err.print(line(f"  {run_id}"))
