"""``onward effects``: external writes across runs, one effect's attempts, the privileged
repeat (admin): a new call with its own recorded key, never hidden in a replay or a
continue, and the privileged resolve (admin): what a person found at the provider."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from console.common import (
    JsonFlag,
    LimitOpt,
    OffsetOpt,
    ReasonOpt,
    YesFlag,
    confirm,
    err,
    open_ledger,
    out,
    parse_json,
    plain,
    print_json,
    reported,
    short,
    when,
)
from console.safe import add_row, id_column, json_text, line
from ledger import Ledger
from ledger.api import REFUSALS
from ledger.effects import Effect, EffectAttempt
from ledger.exceptions import InvalidInput
from ledger.operations import Finding, resolve_plan
from ledger.vocabulary import AuditAction, EffectAttemptOutcome, EffectStatus

__all__ = [
    "EffectArg",
    "TypeOpt",
    "effects_app",
    "effects_ls",
    "effects_repeat",
    "effects_resolve",
    "effects_show",
]


effects_app = typer.Typer(help="External effects: list, inspect, repeat and resolve (admin).",
                          no_args_is_help=True)

EffectArg = Annotated[str, typer.Argument(help="Effect id (or a unique prefix, 8+ chars).")]
TypeOpt = Annotated[str | None, typer.Option("--type", help="The effect type (tool name).")]


@effects_app.command("ls")
def effects_ls(
    run: Annotated[str | None, typer.Option(help="Only this run's effects (id or prefix).")]
    = None,
    status: Annotated[EffectStatus | None, typer.Option(help="Only in this status.")] = None,
    effect_type: TypeOpt = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
    as_json: JsonFlag = False,
) -> None:
    """List effects, newest first."""
    ledger = open_ledger()
    with reported():
        run_id = ledger.resolve_run(run) if run else None
        found = ledger.find_effects(run_id=run_id, status=status, effect_type=effect_type,
                                    limit=limit, offset=offset)
    if as_json:
        print_json(found)
        return
    table = Table(id_column("effect id"), "type", "run", "command", "status", "attempts",
                  "recipient", "provider ref", "created")
    for e in found:
        add_row(table, short(e.effect_id, 16), e.effect_type, e.run_id, e.command_id,
                e.status.value, e.attempts, e.recipient or "-", e.provider_ref or "-",
                when(e.created_at))
    out.print(table)


@effects_app.command("show")
def effects_show(effect_id: EffectArg, effect_type: TypeOpt = None,
                 as_json: JsonFlag = False) -> None:
    """One effect: what was asked, of whom, and every call, lookup, poll and repeat.
    Each inspection is itself audited."""
    ledger = open_ledger(AuditAction.INSPECT)
    with reported():
        effect = ledger.find_effect(effect_id, effect_type)
        ledger.inspected(run_id=effect.run_id, effect_id=effect.effect_id)
        attempts = ledger.effect_attempts(effect)
    if as_json:
        print_json({"effect": effect, "attempts": attempts})
        return
    out.print(line((effect.effect_type, "bold"), " ", effect.effect_id))
    out.print(line(f"run {effect.run_id} seq {effect.seq} step ", effect.step, " command ",
                   effect.command_id, f" ({effect.tool_class})"), soft_wrap=True)
    out.print(line("status ", (effect.status.value, "bold"), "  provider ref ",
                   effect.provider_ref or "-", "  recipient ", effect.recipient or "-",
                   f"  reconciled {effect.reconciled}"), soft_wrap=True)
    kept = json_text(effect.payload) if effect.payload is not None else "(not kept)"
    out.print(line("payload: ", kept), soft_wrap=True)
    if effect.error:
        out.print(line(("error:", "red"), " ", json_text(effect.error)), soft_wrap=True)
    table = Table("attempt", "kind", "key", "worker", "started", "outcome", "provider ref",
                  "error", title="attempts")
    for a in attempts:
        add_row(table, a.attempt, a.kind, short(a.idempotency_key, 16), a.worker,
                when(a.started_at), a.outcome or "(unknown)", a.provider_ref or "-",
                short((a.error or {}).get("message"), 40))
    out.print(table)


@effects_app.command("repeat")
def effects_repeat(effect_id: EffectArg, effect_type: TypeOpt = None, reason: ReasonOpt = None,
                   yes: YesFlag = False, as_json: JsonFlag = False) -> None:
    """PRIVILEGED (admin): call the tool again for this effect with a NEW recorded key. The
    provider will create a new object. Shows what will be sent first, and where: an effect
    of a simulation only goes to the tool's sandbox, one of an evidence replay is refused."""
    from tasks.operator import check_repeat, plan_repeat, repeat_effect

    ledger = open_ledger(AuditAction.REPEAT_EFFECT)
    effect = _effect(ledger, effect_id, effect_type, AuditAction.REPEAT_EFFECT)
    with reported():
        plan = plan_repeat(ledger, effect)
        check_repeat(ledger, plan, reason)  # refused before the question, as after it
    shown = plan.as_dict()
    latest = shown["latest_attempt"] or {}
    say = err if as_json else out  # with --json, stdout carries the JSON only
    say.print(line(("repeat", "bold"), " ", shown["effect_type"], " effect ",
                   shown["effect_id"]), soft_wrap=True)
    say.print(line("  recipient:      ", shown["recipient"] or "-"), soft_wrap=True)
    say.print(line("  payload:        ", json_text(shown["payload"])), soft_wrap=True)
    say.print(line("  status:         ", shown["status"], " (provider ref ",
                   shown["provider_ref"] or "-", ")"), soft_wrap=True)
    say.print(line("  latest attempt: ", str(latest.get("kind", "-")),
                   f" #{latest.get('attempt', '-')} → ", latest.get("outcome") or "unknown"))
    say.print(line("  dedup method:   ", shown["dedup"]))
    say.print(line("  run mode:       ", shown["run_mode"], " (sends to: ", shown["sends_to"], ")"))
    say.print(line("  attempts now:   ", str(shown["attempts"]),
                   " (the repeat is refused if this changes before it starts)"))
    say.print("  this sends the payload again under a NEW key: the provider will not "
              "deduplicate it against the original")
    with reported():
        confirm("repeat this effect?", yes)
        done = repeat_effect(ledger, plan, reason)
    if as_json:
        print_json({"outcome": done.outcome, "provider_ref": done.provider_ref,
                    "attempt": done.started.attempt, "key": done.started.idempotency_key,
                    "error": done.error, "effect": plain(done.effect)})
        return
    color = "green" if done.outcome is EffectAttemptOutcome.COMPLETED else "red"
    out.print(line((done.outcome, color), f": attempt {done.started.attempt} (repeat "
                   f"{done.started.number}) key ", done.started.idempotency_key, " → ",
                   done.provider_ref or "-",
                   f"; {done.error['message']}" if done.error else ""), soft_wrap=True)
    if done.outcome not in (EffectAttemptOutcome.COMPLETED, EffectAttemptOutcome.ACCEPTED):
        raise typer.Exit(1)


@effects_app.command("resolve")
def effects_resolve(
    effect_id: EffectArg,
    effect_type: TypeOpt = None,
    completed: Annotated[bool, typer.Option(
        "--completed", help="The provider holds the object: give its --provider-ref (and "
                            "--result).")] = False,
    not_sent: Annotated[bool, typer.Option(
        "--not-sent", help="The provider holds nothing for the effect's key: it is closed "
                           "unsent and the run's step sends it again with the SAME key.")]
    = False,
    provider_ref: Annotated[str | None, typer.Option(
        "--provider-ref", help="The provider's reference of the object you found.")] = None,
    result: Annotated[str | None, typer.Option(
        "--result", help="What the provider holds, as a JSON object (the step gets it as "
                         "the effect's result; default {}).")] = None,
    allow_in_flight: Annotated[bool, typer.Option(
        "--allow-in-flight",
        help="--not-sent although a call may still land at the provider (refused otherwise "
             "until ONWARD_CALL_LANDING_S past the cover of a call never seen to end, or "
             "past the end of one that ended without an answer): you know it cannot (its "
             "worker is gone, the provider shows no such request). Audited.")]
    = False,
    reason: ReasonOpt = None,
    yes: YesFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """PRIVILEGED (admin): record what you found at the provider for an effect whose outcome
    onward cannot learn (a run parked effect_outcome_unknown, effect_unpollable or
    effect_stalled), then `onward runs continue` the run. Nothing is sent by this command.
    Shows what will be recorded first."""
    ledger = open_ledger(AuditAction.RESOLVE_EFFECT)
    effect = _effect(ledger, effect_id, effect_type, AuditAction.RESOLVE_EFFECT)
    with reported():
        finding, answer = _finding(ledger, effect, completed, not_sent, result, reason)
        attempts = ledger.effect_attempts(effect)
    plan = resolve_plan(effect, finding, provider_ref, answer)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.resolve_effect(effect.effect_type, effect.effect_id, reason, plan,
                              finding=finding, provider_ref=provider_ref, result=answer,
                              allow_in_flight=allow_in_flight, dry_run=True)
    _show_resolve(plan, attempts, err if as_json else out)  # with --json, stdout: the JSON
    with reported():
        confirm("record this finding?", yes)
        done = ledger.resolve_effect(effect.effect_type, effect.effect_id, reason, plan,
                                     finding=finding, provider_ref=provider_ref,
                                     result=answer, allow_in_flight=allow_in_flight)
    if as_json:
        print_json({"finding": finding.value, "effect": plain(done)})
        return
    out.print(line(("recorded", "green"), f": effect {done.status.value}; now `onward runs "
                   f"continue {done.run_id}` to let the run go on"), soft_wrap=True)


def _effect(ledger: Ledger, text: str, effect_type: str | None,
            action: AuditAction) -> Effect:
    """The effect ``text`` names (its id, or a unique prefix of 8+ characters); an unknown
    or ambiguous one is an audited refusal of ``action`` (exit 2), as for runs."""
    with reported():
        try:
            return ledger.find_effect(text, effect_type)
        except REFUSALS as exc:
            whole = text if re.fullmatch(r"[0-9a-f]{64}", text) else None
            raise ledger.refuse(action, exc, effect_id=whole) from None
    raise AssertionError("unreachable")  # pragma: no cover - reported() exits


def _finding(ledger: Ledger, effect: Effect, completed: bool, not_sent: bool,
             result: str | None, reason: str | None) -> tuple[Finding, dict[str, Any] | None]:
    """The finding the options name, or an audited refusal (exit 2)."""
    problem = None
    if completed == not_sent:
        problem = "say what you found: --completed (with --provider-ref) or --not-sent"
    elif not_sent and result is not None:
        problem = "--result goes with --completed: a write that did not happen has none"
    answer: Any = None
    if problem is None and result is not None:
        try:
            answer = parse_json(result)
        except ValueError as exc:
            problem = f"--result is not JSON: {exc}"
    if problem is not None:
        raise ledger.refuse(AuditAction.RESOLVE_EFFECT, InvalidInput(problem), reason=reason,
                            run_id=effect.run_id, effect_id=effect.effect_id)
    return (Finding.COMPLETED if completed else Finding.NOT_SENT), answer


def _show_resolve(plan: dict[str, Any], attempts: list[EffectAttempt], say: Console) -> None:
    say.print(line(("resolve", "bold"), " ", plan["effect_type"], " effect ",
                   plan["effect_id"]), soft_wrap=True)
    say.print(line("  run:            ", plan["run_id"], f" seq {plan['seq']} command ",
                   plan["command_id"]), soft_wrap=True)
    say.print(line("  recipient:      ", plan["recipient"] or "-"), soft_wrap=True)
    say.print(line("  payload:        ", json_text(plan["payload"])), soft_wrap=True)
    say.print(line("  status now:     ", plan["status"]), soft_wrap=True)
    for a in attempts:
        say.print(line(f"  attempt {a.attempt}:      ", a.kind, " by ", a.worker, " → ",
                       a.outcome or "unknown", f" {a.provider_ref}" if a.provider_ref else ""),
                  soft_wrap=True)
    say.print(line("  you found:      ", (plan["finding"], "bold"),
                   f" (provider ref {plan['provider_ref']})" if plan["provider_ref"] else ""),
              soft_wrap=True)
    if plan["result"] is not None:
        say.print(line("  result:         ", json_text(plan["result"])), soft_wrap=True)
    say.print(line("  then:           ", plan["then"]), soft_wrap=True)
    say.print(line("  attempts now:   ", str(plan["attempts"]),
                   " (refused if this changes before it is recorded)"))
