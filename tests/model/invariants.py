"""The invariants of docs/design.md section 13, as checks over the ledger and the outside world
(docs/guarantees.md, "What the model-based test checks", states them for users).

The test runs every check after every rule. Checks that the ledger alone can answer are one
SQL query each, sent together in one round trip (``SQL_CHECKS``: each row is a violation);
the others compare the ledger with what the fake provider and model saw. A check is
switched off only by name, through ``DISABLED`` in tests/model/test_protocol.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger import Ledger, compacted
from ledger.vocabulary import LaunchMode
from tests.model import known
from tests.model.flows import APPROVAL_LIFETIME, SIGNAL_TIMEOUT, SLEEP
from tests.model.world import CALL_COST_USD, CALL_TOKENS, USD_PER_TOKEN, World

CLOCK_TOLERANCE_S = 5.0


CALLS_AGAIN = (LaunchMode.LIVE, LaunchMode.BRANCH)
"""The forks whose steps call the world again, under keys of their own."""
IRREVERSIBLE = ("crm", "crm_slow", "blind")
"""The provider's collections the flows reach through irreversible tools (flows.TOOLS)."""


@dataclass(frozen=True)
class Fork:
    """A replay or branch the test made (tests/model/forks.py): from which run and
    checkpoint, the plan position (``pc``) of the state it starts from (None: unreadable),
    how it was launched."""

    parent: UUID
    seq: int
    pc: int | None
    mode: LaunchMode
    allow_irreversible: bool


@dataclass
class RunBook:
    """What the test knows of each run it created: the spend it started with (a replay
    with inherited budgets starts with its parent's), and its last verified history."""

    started_tokens: dict[UUID, int] = field(default_factory=dict)
    started_cost: dict[UUID, Decimal] = field(default_factory=dict)
    verified: dict[UUID, tuple[Any, ...]] = field(default_factory=dict)
    order: dict[UUID, int] = field(default_factory=dict)  # creation order
    # runs whose waiting head got a control this code cannot read (the newer_control rule),
    # with that head's seq: the step after it never runs
    unreadable: dict[UUID, int] = field(default_factory=dict)
    # encryption at rest: whether the example runs with keys, and erased its tenant's keys;
    # each run's sensitive note (a replay or branch inherits its source's)
    sealed: bool = False
    erased: bool = False
    notes: dict[UUID, str] = field(default_factory=dict)
    opened: dict[UUID, tuple[Any, ...]] = field(default_factory=dict)  # last checked opened
    # retention: what each run on legal hold or in a corpus held when it was first seen kept
    # (``keep_fingerprints``), and the kinds compacted of a run, with its head seq then
    kept: dict[UUID, tuple[Any, ...]] = field(default_factory=dict)
    keeping: bool = False  # a hold or pin was made (before that, nothing is kept)
    compacted: dict[UUID, dict[str, int]] = field(default_factory=dict)
    # runs imported into the second ledger whose import is not checked yet
    imported: list[UUID] = field(default_factory=list)
    # waits: the approvals the test decided (approved, rejected), and the runs made runnable
    # at a wait in the database (the edit_wait rule), with the wait's seq
    decisions: dict[UUID, str] = field(default_factory=dict)
    edited: dict[UUID, int] = field(default_factory=dict)
    # signed rows edited in the database without the key (tests/model/tampering.py): what
    # was edited of each run; the lowest checkpoint edited, and a head edited (its seq); the
    # fingerprint a tampered run was last seen reported by verify at
    tampered: dict[UUID, list[str]] = field(default_factory=dict)
    tampered_checkpoints: dict[UUID, int] = field(default_factory=dict)
    tampered_heads: dict[UUID, int] = field(default_factory=dict)
    tamper_checked: dict[UUID, tuple[Any, ...]] = field(default_factory=dict)
    # the replays and branches made (tests/model/forks.py), by the new run's id
    forks: dict[UUID, Fork] = field(default_factory=dict)


@dataclass
class Context:
    conn: Connection
    ledger: Ledger
    world: World
    book: RunBook
    worker_errors: list[str]
    plain: Ledger | None = None  # the same ledger without encryption keys (verify needs none)
    target: Ledger | None = None  # the second ledger runs are imported into


CANARY = "CANARY-"
"""How every sensitive note starts (tests/model/flows.py ``Plan.note``): no ledger row may
hold it in plain text when the example runs with encryption keys (a ciphertext is base64,
which has no ``-``)."""
UNREADABLE_MARK = "*** (unreadable)"
"""What a reader is shown of a sealed value whose keys were erased (ledger/crypto.py)."""


# -- checks the ledger answers alone: each row is one violation ---------------------------------
SQL_CHECKS: dict[str, str] = {
    # 1. at most one commit per (run, seq) ...
    "one_commit_per_seq": """
        SELECT format('run %s seq %s: %s attempts committed', run_id, seq, count(*))
          FROM onward.step_attempts WHERE outcome = 'committed'
         GROUP BY run_id, seq HAVING count(*) > 1""",
    # ... and a committed step is never claimed again
    "committed_step_never_reclaimed": """
        SELECT format('run %s seq %s: claimed again (epoch %s, %s) after checkpoint %s '
                      'committed', a.run_id, a.seq, a.lease_epoch, a.worker, c.seq)
          FROM onward.step_attempts a
          JOIN onward.checkpoints c ON c.run_id = a.run_id AND c.seq = a.seq + 1
         WHERE a.started_at > c.created_at""",
    # 2. no effect that may have reached the provider is left unresolved on a dead run
    "no_unresolved_effect_on_a_dead_run": """
        SELECT format('effect %s %s of %s run %s is %s after a call attempt', e.effect_type,
                      left(e.effect_id, 16), r.status, e.run_id, e.status)
          FROM onward.effects e JOIN onward.runs r ON r.id = e.run_id
         WHERE e.status IN ('pending', 'accepted')
           AND r.status IN ('completed', 'failed', 'diverged')
           AND EXISTS (SELECT 1 FROM onward.effect_attempts a
                        WHERE a.effect_type = e.effect_type AND a.effect_id = e.effect_id
                          AND a.kind = 'call')""",
    # ... nor left unresolved behind a commit: a step that went on past an effect of its own
    # (a retry whose body took another path, not making the call an earlier attempt made)
    # resolved it first (found: completed; missing or never sent: unsent), or parked
    "no_effect_left_behind_a_commit": """
        SELECT format('effect %s %s of run %s is %s at seq %s, but the run committed past it '
                      '(it is %s at seq %s)', e.effect_type, left(e.effect_id, 16), e.run_id,
                      e.status, e.seq, r.status, r.seq)
          FROM onward.effects e JOIN onward.runs r ON r.id = e.run_id
         WHERE e.status IN ('pending', 'accepted') AND e.seq < r.seq""",
    # ... and one that reached (or may have reached) the provider is never ``failed`` unless
    # the provider refused it (:acted holds the keys the provider created objects for)
    "reached_effect_never_failed": """
        SELECT format('effect %s %s of run %s is failed, but %s (error %s)', e.effect_type,
                      left(e.effect_id, 16), e.run_id,
                      CASE WHEN e.effect_id = ANY(CAST(:acted AS text[]))
                           THEN 'the provider created an object for its key'
                           ELSE format('its last call ended %s', coalesce(last.outcome,
                                                                          'unrecorded')) END,
                      e.error)
          FROM onward.effects e
          LEFT JOIN LATERAL (SELECT a.outcome FROM onward.effect_attempts a
                              WHERE a.effect_type = e.effect_type AND a.effect_id = e.effect_id
                                AND a.kind = 'call' ORDER BY a.attempt DESC LIMIT 1) last ON true
         WHERE e.status = 'failed'
           AND (e.effect_id = ANY(CAST(:acted AS text[]))
                OR (last IS NOT NULL AND coalesce(last.outcome, 'unknown') = 'unknown'))""",
    # 3. every run is terminal, parked, or has a way forward: an outbox row or a lease if it
    #    runs; a pending approval, or a signal not yet arrived, if it waits
    "way_forward": """
        SELECT format('run %s is %s at seq %s (waiting_on %s, lease %s) with no way forward',
                      r.id, r.status, r.seq, r.waiting_on, r.lease_owner)
          FROM onward.runs r
         WHERE (r.status = 'running' AND r.lease_owner IS NULL
                AND NOT EXISTS (SELECT 1 FROM onward.outbox o
                                 WHERE o.run_id = r.id AND o.seq = r.seq))
            OR (r.status = 'waiting' AND NOT coalesce(
                (r.waiting_on LIKE 'approval:%' AND EXISTS (
                    SELECT 1 FROM onward.approvals a
                     WHERE a.id::text = substr(r.waiting_on, 10) AND a.status = 'pending'
                       AND a.run_id = r.id AND a.seq = r.seq))
                OR (r.waiting_on LIKE 'signal:%' AND NOT EXISTS (
                    SELECT 1 FROM onward.signals s
                     WHERE s.run_id = r.id AND 'signal:' || s.name = r.waiting_on
                       AND s.consumed_seq IS NULL)), false))""",
    # ... and a run that stops leaves no outbox row behind
    "no_outbox_row_of_a_stopped_run": """
        SELECT format('outbox row for run %s seq %s, which is %s', o.run_id, o.seq, r.status)
          FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id
         WHERE r.status <> 'running'""",
    # 7. one clock: a wait a step asked for is that long after its checkpoint, on the
    #    database's clock (approval expiry, signal timeout, timer). An evidence replay does
    #    not wait: it follows its source's decision (the approval it names is the source's,
    #    asked for at the source's checkpoint), so its waits are not held to this.
    "one_clock": f"""
        SELECT format('run %s seq %s: a %s wait of %ss ends %ss after its checkpoint on the '
                      'database clock', run_id, seq, kind, wanted, round(lifetime::numeric, 1))
          FROM (SELECT c.run_id, c.seq, c.control->>'kind' AS kind,
                       CASE c.control->>'kind' WHEN 'approval' THEN
                            {APPROVAL_LIFETIME.total_seconds()}
                            WHEN 'signal' THEN {SIGNAL_TIMEOUT.total_seconds()}
                            ELSE {SLEEP.total_seconds()} END AS wanted,
                       extract(epoch FROM CASE c.control->>'kind'
                            WHEN 'approval' THEN a.expires_at
                            WHEN 'signal' THEN (c.control->>'timeout_at')::timestamptz
                            ELSE (c.control->>'until')::timestamptz END - c.created_at)
                           AS lifetime
                  FROM onward.checkpoints c
                  JOIN onward.runs r ON r.id = c.run_id
                  LEFT JOIN onward.approvals a ON a.id::text = c.control->>'approval_id'
                 WHERE c.outcome = 'wait' AND r.mode IS DISTINCT FROM 'evidence'
                   AND c.control->>'kind' IN ('approval', 'signal', 'timer')) w
         WHERE lifetime IS NULL OR abs(lifetime - wanted) > {CLOCK_TOLERANCE_S}""",
    # budgets are never exceeded by more than one call's spend, counted as the model billed
    # it (crashes, retries, replays included) on top of what the run started with
    "budgets_hold": f"""
        SELECT format('run %s: %s tokens / $%s spent (the ledger counts %s / $%s) against '
                      'a budget of %s tokens / $%s', r.id, b.tokens + b.start_tokens,
                      b.cost + b.start_cost, r.used_tokens, r.used_cost_usd, r.budget_tokens,
                      r.budget_cost_usd)
          FROM onward.runs r
          JOIN unnest(CAST(:runs AS uuid[]), CAST(:tokens AS int[]), CAST(:cost AS numeric[]),
                      CAST(:start_tokens AS int[]), CAST(:start_cost AS numeric[]))
               AS b(run_id, tokens, cost, start_tokens, start_cost) ON b.run_id = r.id
         WHERE b.tokens + b.start_tokens > r.budget_tokens + {CALL_TOKENS}
            OR b.cost + b.start_cost > r.budget_cost_usd + {CALL_COST_USD}""",
}


def _plaintext_query(tables: list[str]) -> str:
    """Rows of ``tables`` whose text holds a sensitive note in plain text."""
    rows = " UNION ALL ".join(f"SELECT '{t}', x::text FROM onward.{t} x" for t in tables)
    return f"""
        SELECT format('onward.%s holds a sensitive value in plain text: %s', t,
                      left(body, 160))
          FROM ({rows}) AS q(t, body) WHERE strpos(body, '{CANARY}') > 0"""


def _tables() -> list[str]:
    from ledger.schema import metadata

    return [t.name for t in metadata.sorted_tables]


SEALED_SQL_CHECKS: dict[str, str] = {
    # encryption at rest: with keys configured, no row holds a sensitive note in plain text
    # (states, the input, results, effects' payloads, signal payloads, step errors ...)
    "no_plaintext_at_rest": _plaintext_query(_tables()),
}
SQL_CHECKS.update(SEALED_SQL_CHECKS)


def _sql_params(ctx: Context) -> dict[str, Any]:
    """What the outside world saw, for the checks that compare it with the ledger."""
    runs = sorted(ctx.book.started_tokens, key=str)
    billed = (ctx.world.model.heard_tokens if known.LOST_MODEL_ANSWERS_UNCOUNTED
              else ctx.world.model.tokens)
    tokens = [billed[r] for r in runs]
    return {
        "acted": sorted({o.key for o in ctx.world.provider.objects}),
        "runs": runs, "tokens": tokens,
        "cost": [Decimal(str(round(t * USD_PER_TOKEN, 6))) for t in tokens],
        "start_tokens": [ctx.book.started_tokens[r] for r in runs],
        "start_cost": [ctx.book.started_cost.get(r, Decimal(0)) for r in runs],
    }


def _sql_checks(ctx: Context, names: list[str]) -> dict[str, list[str]]:
    if not names:
        return {}
    if not ctx.book.sealed:
        names = [n for n in names if n not in SEALED_SQL_CHECKS]
    union = "\nUNION ALL\n".join(
        f"SELECT '{name}' AS name, detail FROM ({SQL_CHECKS[name]}) AS q{i}(detail)"
        for i, name in enumerate(names))
    found: dict[str, list[str]] = {}
    for name, detail in ctx.conn.execute(sa.text(union), _sql_params(ctx)):
        found.setdefault(name, []).append(detail)
    return found


# -- checks against the outside world ------------------------------------------------------------
def committed_step_never_runs(ctx: Context) -> list[str]:
    """1. Noted as each step body starts (``WORLD.on_body``): its seq+1 must not exist yet."""
    return list(ctx.world.violations.get("reran", []))


def waits_keep_their_meaning(ctx: Context) -> list[str]:
    """Noted by the steps that resume a wait: the decision or the signal payload is there."""
    return list(ctx.world.violations.get("wait_meaning", []))


def calls_under_a_live_lease(ctx: Context) -> list[str]:
    """4. A provider or model call starts only under the caller's live lease, on a running
    run (noted as it starts)."""
    return list(ctx.world.violations.get("unleased_call", []))


def repeats_are_deliberate(ctx: Context) -> list[str]:
    """2. A person's repeat happens once per confirmation, and never reaches the real
    provider for a simulation's or an evidence replay's effect (noted by the repeat rule)."""
    return list(ctx.world.violations.get("repeat", []))


def model_paid_once(ctx: Context) -> list[str]:
    """Budgets: a model answer is paid for once; a re-executed step gets it from the record
    (only an answer lost on the way is ever asked for again)."""
    return [f"run {run} was answered {n} times for {prompt!r}"
            for run, prompt, n in ctx.world.model.paid_twice()]


def one_object_per_effect(ctx: Context) -> list[str]:
    """2. At most one provider object per intent of a run (per idempotency key, too),
    unless a person repeated it."""
    found = [f"provider holds {n} {collection} objects for run {run} intent {ref}/{intent}"
             for collection, run, ref, intent, n in ctx.world.provider.duplicate_intents()]
    keys = Counter((o.collection, o.key) for o in ctx.world.provider.objects)
    found += [f"provider holds {n} {c} objects for one idempotency key {k[:16]}…"
              for (c, k), n in keys.items() if n > 1]
    return found


def forks_resend_nothing(ctx: Context) -> list[str]:
    """2. A replay or branch never sends what the history it copied sent (no provider object
    of a fork for an intent before the plan position its state starts from); an evidence
    replay calls nothing (no provider object, no model call), a simulation nothing real; a
    live replay or a branch not allowed irreversible effects sends none (docs/operating.md,
    "Replay")."""
    if not ctx.book.forks:
        return []
    found = []
    for obj in ctx.world.provider.objects:
        fork = ctx.book.forks.get(obj.run_id) if obj.run_id is not None else None
        if fork is None or obj.by_person:
            continue
        what = (f"{fork.mode.value} run {obj.run_id} (of run {fork.parent} from checkpoint "
                f"{fork.seq}) made {obj.collection} object {obj.id} for intent "
                f"{obj.body.get('ref')}/{obj.body.get('intent')}")
        intent = obj.body.get("intent")
        if fork.mode not in CALLS_AGAIN:
            found.append(f"{what}: it sends nothing real")
        elif fork.pc is not None and isinstance(intent, int) and intent < fork.pc:
            found.append(f"{what}: its state starts at pc {fork.pc}, the parent sent that")
        elif obj.collection in IRREVERSIBLE and not fork.allow_irreversible:
            found.append(f"{what}: irreversible, and it was not allowed irreversible effects")
    found += [f"evidence replay {run} (of run {fork.parent}) made {ctx.world.model.calls[run]} "
              "model calls: it answers from records"
              for run, fork in ctx.book.forks.items()
              if fork.mode is LaunchMode.EVIDENCE and ctx.world.model.calls[run]]
    return found


def forks_refused_beside_unknown(ctx: Context) -> list[str]:
    """2. A live replay or branch starts, without ``allow_unresolved``, only when none of the
    parent's effects it would make again (at or after its checkpoint) may have reached the
    provider unknown to the ledger; one allowed them is not refused for them; a refused fork
    writes nothing (noted by tests/model/forks.py as each fork is made)."""
    return list(ctx.world.violations.get("fork", []))


def verify_clean(ctx: Context) -> list[str]:
    """5. ``Ledger.verify_run`` is clean on every run (rerun when its history changed, and
    after every compaction, rotation or erasure), verified without the encryption keys (a
    compacted run, an erased tenant's run still verify)."""
    found = []
    for r in ctx.conn.execute(sa.text("""
        SELECT r.id, r.seq, r.head_hash,
               (SELECT count(*) FROM onward.checkpoints c WHERE c.run_id = r.id) AS cps,
               (SELECT count(*) FROM onward.evidence e WHERE e.run_id = r.id) AS evidence
          FROM onward.runs r""")).mappings():
        fingerprint = (r["seq"], r["head_hash"], r["cps"], r["evidence"])
        if ctx.book.verified.get(r["id"]) == fingerprint:
            continue
        if r["id"] in ctx.book.tampered:
            continue  # tampering_detected: verify must report it
        problems = [str(p) for p in (ctx.plain or ctx.ledger).verify_run(r["id"])
                    if not (r["id"] in ctx.book.unreadable and UNREADABLE in p.detail)]
        if not problems:
            ctx.book.verified[r["id"]] = fingerprint
        found += problems
    return found


UNREADABLE = "records a wait control onward cannot read"
"""How verify names a head whose control this code cannot read (ledger/wait_control.py):
expected of the runs the newer_control rule wrote one for."""


def unreadable_control_parks(ctx: Context) -> list[str]:
    """A run whose wait control this code cannot read (written, signed, by a newer onward)
    is never run past it on a guess: whatever ends its wait (a signal, a decision, the timer,
    the reaper's expiry or timeout, a continue), the step after it does not run; once the
    run is parked, it is parked ``invalid_control``."""
    found = []
    for run_id, seq in ctx.book.unreadable.items():
        row = ctx.conn.execute(sa.text("""
            SELECT r.status, r.parked_reason,
                   EXISTS (SELECT 1 FROM onward.checkpoints c
                            WHERE c.run_id = r.id AND c.seq > :seq) AS ran
              FROM onward.runs r WHERE r.id = :run"""), {"run": run_id, "seq": seq}).first()
        if row is None:
            continue
        status, parked, ran = row
        if ran or status == "completed":
            found.append(f"run {run_id}: ran past checkpoint {seq}, whose wait control this "
                         f"code cannot read (it is {status})")
        elif status == "needs_review" and parked != "invalid_control":
            found.append(f"run {run_id}: parked {parked!r} for checkpoint {seq}, whose wait "
                         "control this code cannot read (expected invalid_control)")
    return found


# -- waits made runnable outside onward, and continued (tests/model/wait_edits.py) ----------------
PARKED_BEFORE_THE_WAIT = ("integrity", "attempts_exhausted", "no_worker_for_version",
                          "incompatible_version", "invalid_state", "unknown_step")
"""Why a run edited at a wait may be parked there: ``integrity`` (its claim found the wait
had not ended), or what parks a claim before the wait is looked at (crashes spent its
attempts, the code deployed cannot run it)."""


def steps_follow_their_events(ctx: Context) -> list[str]:
    """A step after a wait starts only once the wait ended, as the model saw it end: the
    timer's time, a signal consumed at that seq or the timeout, the test's approval or
    rejection or the approval's time (noted as each step body starts), however the run was
    made runnable (an edit in the database, a continue)."""
    return list(ctx.world.violations.get("no_event", []))


def edited_waits_park(ctx: Context) -> list[str]:
    """A run made runnable at a wait in the database and stopped there is parked
    ``integrity`` (``PARKED_BEFORE_THE_WAIT``), until a continue puts it back on its wait (a
    newer onward's control written on it since parks it ``invalid_control``: not looked at
    here, ``unreadable_control_parks`` is)."""
    edited = {r: s for r, s in ctx.book.edited.items() if r not in ctx.book.unreadable}
    if not edited:
        return []
    runs, seqs = zip(*edited.items(), strict=True)
    return [f"run {run_id}, made runnable at its wait (seq {seq}) in the database, is parked "
            f"{reason!r} there, expected integrity ({message})"
            for run_id, seq, reason, message in ctx.conn.execute(sa.text("""
                SELECT r.id, r.seq, r.parked_reason, r.last_error->>'message'
                  FROM onward.runs r
                  JOIN unnest(CAST(:runs AS uuid[]), CAST(:seqs AS int[])) AS e(run_id, seq)
                       ON e.run_id = r.id AND e.seq = r.seq
                 WHERE r.status = 'needs_review'
                   AND NOT (r.parked_reason = ANY(CAST(:allowed AS text[])))"""),
                {"runs": list(runs), "seqs": list(seqs),
                 "allowed": list(PARKED_BEFORE_THE_WAIT)})]


def continue_rewaits(ctx: Context) -> list[str]:
    """A continued run whose head is a wait that has not ended is back on that wait: waiting
    for its signal (or resumed by one kept meanwhile) or its pending approval, or a timer's
    step due at its time (noted by the continue_at_wait rule)."""
    return list(ctx.world.violations.get("continue_wait", []))


# -- retention (ledger/retention.py, ledger/partitions.py) ---------------------------------------
DROPPED = "CAST('{\"$dropped\": true}' AS jsonb)"

KEEP_FINGERPRINT = f"""
    SELECT r.id,
           (SELECT count(*) FROM onward.checkpoints c
             WHERE c.run_id = r.id AND c.compacted_mac IS NOT NULL) AS checkpoints,
           (SELECT count(*) FROM onward.evidence e
             WHERE e.run_id = r.id AND e.response ? '$compacted') AS evidence,
           (SELECT count(*) FROM onward.effects f
             WHERE f.run_id = r.id AND f.payload = {DROPPED}) AS effects,
           (SELECT count(*) FROM onward.approvals a
             WHERE a.run_id = r.id AND a.artifact = {DROPPED}) AS approvals,
           (SELECT count(*) FROM onward.signals s
             WHERE s.run_id = r.id AND s.payload ? '$compacted') AS signals,
           coalesce(r.result ? '$compacted', false) AS result,
           (SELECT count(*) FROM onward.step_attempts a WHERE a.run_id = r.id) AS attempts
      FROM onward.runs r
     WHERE r.legal_hold IS NOT NULL
        OR EXISTS (SELECT 1 FROM onward.corpus_runs p WHERE p.run_id = r.id)"""
"""Each run on legal hold or pinned in a corpus: what of it is compacted (rows per kind),
and its step attempts (last)."""


def keep_fingerprints(conn: Connection) -> dict[UUID, tuple[Any, ...]]:
    return {row[0]: tuple(row[1:]) for row in conn.execute(sa.text(KEEP_FINGERPRINT))}


def kept_runs_untouched(ctx: Context) -> list[str]:
    """Retention never takes anything of a run on legal hold or pinned in a corpus: from when
    it is first seen kept (or held or pinned by a rule, which records it then), nothing more
    of it is compacted and none of its step attempts go (by compaction or a partition drop),
    however the hold or pin raced the retention pass."""
    if not ctx.book.keeping:
        return []
    found = []
    now = keep_fingerprints(ctx.conn)
    for run_id in [r for r in ctx.book.kept if r not in now]:
        del ctx.book.kept[run_id]  # released or unpinned: retention may take it again
    for run_id, current in now.items():
        before = ctx.book.kept.get(run_id)
        if before is not None and current[:-1] != before[:-1]:
            found.append(f"run {run_id} is kept (legal hold or corpus) but was compacted: "
                         f"compacted rows {before[:-1]} -> {current[:-1]} (checkpoints, "
                         "evidence, effects, approvals, signals, result)")
        if before is not None and current[-1] < before[-1]:
            found.append(f"run {run_id} is kept (legal hold or corpus) but lost step attempts: "
                         f"{before[-1]} -> {current[-1]}")
        ctx.book.kept[run_id] = current
    return found


COMPACTED = f"""
    WITH c(run_id, kind, seq) AS (
        SELECT * FROM unnest(CAST(:runs AS uuid[]), CAST(:kinds AS text[]),
                             CAST(:seqs AS int[])))
    SELECT format('run %s: checkpoint %s keeps a state (or no digest) after its states were '
                  'compacted', c.run_id, k.seq)
      FROM c JOIN onward.checkpoints k ON k.run_id = c.run_id AND k.seq <= c.seq
     WHERE c.kind = 'states' AND (k.compacted_mac IS NULL OR k.state IS NOT NULL
           OR k.state_delta IS NOT NULL
           OR coalesce(k.state_sha256, '') !~ '^[0-9a-f]{{64}}$')
    UNION ALL
    SELECT format('run %s: its result is kept whole after its states were compacted', c.run_id)
      FROM c JOIN onward.runs r ON r.id = c.run_id
     WHERE c.kind = 'states' AND r.seq = c.seq AND r.result_mac IS NOT NULL
       AND r.result IS NOT NULL AND NOT (r.result ? '$compacted')
    UNION ALL
    SELECT format('run %s: signal %s keeps its payload after its states were compacted',
                  c.run_id, s.id)
      FROM c JOIN onward.signals s ON s.run_id = c.run_id AND s.consumed_seq <= c.seq
     WHERE c.kind = 'states' AND s.mac IS NOT NULL AND NOT (s.payload ? '$compacted')
    UNION ALL
    SELECT format('run %s: recorded answer %s keeps its response after its evidence was '
                  'compacted', c.run_id, e.command_id)
      FROM c JOIN onward.evidence e ON e.run_id = c.run_id AND e.seq <= c.seq
     WHERE c.kind = 'evidence'
       AND (e.artifact_sha256 IS NOT NULL OR NOT (e.response ? '$compacted'))
    UNION ALL
    SELECT format('run %s: effect %s keeps its payload after its artifacts were compacted',
                  c.run_id, left(f.effect_id, 16))
      FROM c JOIN onward.effects f ON f.run_id = c.run_id AND f.seq <= c.seq
     WHERE c.kind = 'artifacts' AND f.payload IS NOT NULL AND f.payload <> {DROPPED}
    UNION ALL
    SELECT format('run %s: approval %s keeps its artifact after its artifacts were compacted',
                  c.run_id, a.id)
      FROM c JOIN onward.approvals a ON a.run_id = c.run_id AND a.seq <= c.seq
     WHERE c.kind = 'artifacts' AND a.artifact IS DISTINCT FROM {DROPPED}
    UNION ALL
    SELECT format('run %s: step attempt of seq %s kept after its attempts were compacted',
                  c.run_id, a.seq)
      FROM c JOIN onward.step_attempts a ON a.run_id = c.run_id AND a.seq < c.seq
     WHERE c.kind = 'attempts'"""


def compacted_holds_digests(ctx: Context) -> list[str]:
    """What retention compacted stays compacted to digests: for each kind it compacted of a
    run (recorded from its audit row, with the run's head then), every checkpoint up to that
    head holds no state and a sha256, the result and consumed signals' payloads are sealed
    digests (states); every recorded answer is a digest (evidence); effects' payloads and
    approvals' artifacts are dropped (artifacts); no step attempt is left (attempts).
    ``verify_clean`` checks each such run still verifies."""
    entries = [(run, kind, seq) for run, kinds in ctx.book.compacted.items()
               for kind, seq in kinds.items()]
    if not entries:
        return []
    runs, kinds, seqs = (list(column) for column in zip(*entries, strict=True))
    return [row[0] for row in ctx.conn.execute(
        sa.text(COMPACTED), {"runs": runs, "kinds": kinds, "seqs": seqs})]


def retention_keeps_what_it_must(ctx: Context) -> list[str]:
    """Noted by the retention rules: a partition drop or a compaction took attempts or
    payloads of a run its policies keep (not finished, or finished too recently)."""
    return list(ctx.world.violations.get("retention", []))


# -- encryption at rest (ledger/crypto.py) --------------------------------------------------------
def _opened_problems(ledger: Ledger, run_id: UUID, note: str, erased: bool) -> list[str]:
    """Where what ``ledger`` shows of the run's sealed values is not what was written (or,
    after the tenant's keys were erased, is anything but unreadable)."""
    expected = UNREADABLE_MARK if erased else note
    found = [f"run {run_id} checkpoint {cp.identity.seq}: its note reads "
             f"{cp.state['note']!r}, expected {expected!r}"
             for cp in ledger.checkpoints(run_id)
             if isinstance(cp.state, dict) and "note" in cp.state
             and cp.state["note"] != expected]
    run = ledger.get_run(run_id)
    assert run is not None
    result: Any = run.result
    if isinstance(result, dict) and compacted.digest_of(result) is None \
            and ("note" in result or run.status == "completed"):
        shown: Any = result.get("note")  # a finish result holds the note; a failure's not
    else:
        shown = result if isinstance(result, str) else expected
    if shown != expected:
        found.append(f"run {run_id} ({run.status}): its result reads {result!r}, expected "
                     f"its note {expected!r}")
    for signal in ledger.signals(run_id):
        payload = signal["payload"]
        if compacted.digest_of(payload) is not None:
            continue
        shown = payload.get("note") if isinstance(payload, dict) else payload
        if shown != expected:
            found.append(f"run {run_id}: signal {signal['id']} reads {payload!r}, expected "
                         f"its note {expected!r}")
    return found


def opened_values_match(ctx: Context) -> list[str]:
    """With encryption keys: what an admin is shown of a run's sealed values is what was
    written (its note in every state, its finish result, the signals' payloads), through
    rotations; once the tenant's keys are erased, every one of them reads unreadable, never
    its plain text. Rerun when the run changed, and after every keys or retention rule."""
    if not ctx.book.sealed:
        return []
    found = []
    for row in ctx.conn.execute(sa.text("""
        SELECT r.id, r.seq, r.head_hash, r.status,
               (SELECT count(*) FROM onward.signals s WHERE s.run_id = r.id) AS signals
          FROM onward.runs r""")):
        fingerprint = tuple(row[1:])
        note = ctx.book.notes.get(row[0])
        if note is None or ctx.book.opened.get(row[0]) == fingerprint:
            continue
        problems = _opened_problems(ctx.ledger, row[0], note, ctx.book.erased)
        if not problems:
            ctx.book.opened[row[0]] = fingerprint
        found += problems
    return found


# -- corpus bundles (ledger/corpus_bundle.py) ------------------------------------------------------
def _signal_rows(ledger: Ledger, run_id: UUID) -> list[tuple[Any, ...]]:
    with ledger.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT id, name, consumed_seq, mac FROM onward.signals WHERE run_id = :r "
            "AND consumed_seq IS NOT NULL ORDER BY id"), {"r": run_id})]


def _shown(ledger: Ledger, run_id: UUID) -> tuple[Any, ...]:
    run = ledger.get_run(run_id)
    assert run is not None
    return (run.status, run.seq, run.result,
            [(cp.identity.seq, cp.state) for cp in ledger.checkpoints(run_id)],
            [(s["id"], s["payload"]) for s in ledger.signals(run_id)
             if s["consumed_seq"] is not None])


def imports_verify(ctx: Context) -> list[str]:
    """A finished run exported in a corpus bundle and imported into another ledger (same
    checkpoint and master keys) verifies there, keeps its consumed signals with their ids,
    names, seqs and MACs, and shows the same states, result and signal payloads there as
    here (sealed ones opened with the data keys the bundle carried; once erased here, they
    still open there, as documented); with keys, the other ledger holds no sensitive value
    in plain text either."""
    found = list(ctx.world.violations.get("import", []))
    if ctx.target is None or not ctx.book.imported:
        return found
    for run_id in ctx.book.imported:
        found += [f"imported run {run_id} does not verify there: {p}"
                  for p in ctx.target.verify_run(run_id)]
        here, there = _signal_rows(ctx.ledger, run_id), _signal_rows(ctx.target, run_id)
        if here != there:
            found.append(f"imported run {run_id}: its signals (id, name, seq, mac) are {there} "
                         f"there, {here} here")
        here_shown, there_shown = _shown(ctx.ledger, run_id), _shown(ctx.target, run_id)
        if ctx.book.erased:  # erased here, not there: a bundle is a copy (docs/security.md)
            here_shown, there_shown = here_shown[:2], there_shown[:2]
        if here_shown != there_shown:
            found.append(f"imported run {run_id} shows {there_shown} there, {here_shown} here")
    if ctx.book.sealed:
        with ctx.target.engine.connect() as conn:
            found += [f"in the ledger imported into: {r[0]}" for r in conn.execute(
                sa.text(SEALED_SQL_CHECKS["no_plaintext_at_rest"]))]
    if not found:
        ctx.book.imported.clear()
    return found


# -- signed rows edited without the key (tests/model/tampering.py) --------------------------------
def tampered_never_read(ctx: Context) -> list[str]:
    """5. No step body is handed a value edited in the database without the key (a state, a
    recorded answer, an effect's result): the claim or the re-executed call that would read
    it parks the run ``integrity`` instead (noted by the flows as each value is handed)."""
    return list(ctx.world.violations.get("tampered_read", []))


def tampering_detected(ctx: Context) -> list[str]:
    """5. ``verify`` names every run with a signed row edited without the key; a run whose
    head checkpoint was edited never runs past it and, once parked, is parked ``integrity``
    (or for what parks a claim before its head is read); no replay or branch is made from
    an edited checkpoint or one after it (noted by those rules)."""
    found = list(ctx.world.violations.get("tampered_copy", []))
    for run_id, edits in ctx.book.tampered.items():
        row = ctx.conn.execute(sa.text("""
            SELECT r.seq, r.head_hash, r.status, r.parked_reason,
                   (SELECT count(*) FROM onward.checkpoints c WHERE c.run_id = r.id),
                   (SELECT count(*) FROM onward.evidence e WHERE e.run_id = r.id),
                   (SELECT count(*) FROM onward.effects f WHERE f.run_id = r.id)
              FROM onward.runs r WHERE r.id = :r"""), {"r": run_id}).first()
        if row is None:
            continue
        seq, _hash, status, parked, *_ = row
        head = ctx.book.tampered_heads.get(run_id)
        if head is not None and seq > head:
            found.append(f"run {run_id} ran past its head checkpoint {head}, edited in the "
                         f"database ({status} at seq {seq})")
        elif head is not None and status == "needs_review" \
                and parked not in PARKED_BEFORE_THE_WAIT:
            found.append(f"run {run_id}, its head checkpoint {head} edited in the database, "
                         f"is parked {parked!r}, expected integrity")
        if ctx.book.tamper_checked.get(run_id) == tuple(row):
            continue
        if not (ctx.plain or ctx.ledger).verify_run(run_id):
            found.append(f"run {run_id}: verify reports nothing, but these signed rows were "
                         f"edited in the database without the key: {edits}")
        else:
            ctx.book.tamper_checked[run_id] = tuple(row)
    return found


def workers_never_die_of_errors(ctx: Context) -> list[str]:
    """An error escaping ``execute_step`` (not a crash the test injected) loses the message
    and leaves the lease held: the executor turns every error into a ledger outcome."""
    return list(ctx.worker_errors)


PYTHON_CHECKS: dict[str, Callable[[Context], list[str]]] = {
    "committed_step_never_runs": committed_step_never_runs,
    "waits_keep_their_meaning": waits_keep_their_meaning,
    "one_object_per_effect": one_object_per_effect,
    "calls_under_a_live_lease": calls_under_a_live_lease,
    "model_paid_once": model_paid_once,
    "repeats_are_deliberate": repeats_are_deliberate,
    "forks_resend_nothing": forks_resend_nothing,
    "forks_refused_beside_unknown": forks_refused_beside_unknown,
    "verify_clean": verify_clean,
    "unreadable_control_parks": unreadable_control_parks,
    "steps_follow_their_events": steps_follow_their_events,
    "edited_waits_park": edited_waits_park,
    "continue_rewaits": continue_rewaits,
    "workers_never_die_of_errors": workers_never_die_of_errors,
    "tampered_never_read": tampered_never_read,
    "tampering_detected": tampering_detected,
    "kept_runs_untouched": kept_runs_untouched,
    "compacted_holds_digests": compacted_holds_digests,
    "retention_keeps_what_it_must": retention_keeps_what_it_must,
    "opened_values_match": opened_values_match,
    "imports_verify": imports_verify,
}

CHECKS = [*SQL_CHECKS, *PYTHON_CHECKS]


def check_all(ctx: Context, disabled: frozenset[str],
              timings: Counter[str] | None = None) -> dict[str, list[str]]:
    """Every enabled check; returns the violations found, by check name."""
    unknown = disabled - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown invariants disabled: {sorted(unknown)}; known: {CHECKS}")
    timings = timings if timings is not None else Counter()
    started = time.perf_counter()
    found = _sql_checks(ctx, [n for n in SQL_CHECKS if n not in disabled])
    timings["ms_sql_checks"] += round((time.perf_counter() - started) * 1000)
    for name, check in PYTHON_CHECKS.items():
        if name in disabled:
            continue
        started = time.perf_counter()
        violations = check(ctx)
        timings[f"ms_{name}"] += round((time.perf_counter() - started) * 1000)
        if violations:
            found[name] = violations
    return found
