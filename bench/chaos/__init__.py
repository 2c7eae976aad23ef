"""Chaos benchmark: R runs x K irreversible effects while processes are SIGKILLed, the
broker is flushed and the provider misbehaves; then the ledger and the provider are counted
independently (docs/design.md sections 4, 5 and 7; docs/guarantees.md).

    .venv/bin/python -m bench.chaos                      # defaults: 40 runs x 5 steps, seed 1
    .venv/bin/python -m bench.chaos --seed 7 --runs 60 --steps 4
    .venv/bin/python -m bench.chaos --runs 1000          # window, settle and chaos scale up
    .venv/bin/python -m bench.chaos --json               # quieter stderr; JSON on stdout

(from the repository root; ``make chaos`` runs the first). The modules, in the order a run
goes through them: config (options), servers (database, broker, provider), fleet (the
onward processes), plan (the seeded schedule), state (what the actions share), loop (the
run), kills, pauses and outages (the chaos actions), runs (starting and watching runs),
count and verdict (the counting and the pass bar), cli (the entry point); agent is the
workflow the workers run. Processes and servers come from harness/.

What it sets up (nothing shared with other users of the servers is touched):

* its own PostgreSQL server whenever it restarts PostgreSQL (``--pg-restarts``, 1 or more by
  default): a throwaway cluster initdb'd in a temporary directory with the binaries the
  ``pgserver`` package ships, on a free loopback port (harness/postgres.py), removed at the
  end. A server somebody else uses is never restarted. With ``--pg-restarts 0`` it uses the
  configured server (embedded by default, or the server of ONWARD_DATABASE_URL);
* its own database on that server, migrated with ``ledger.migrate.upgrade``; dropped at the
  end when the pass bar holds, kept (name printed) when it does not;
* its own queue name, on its own Redis database number of the configured broker (the first
  empty one of 1..14 unless ``--broker-db``), because it FLUSHDBs that database once;
* the reference provider (examples/provider.py, a real HTTP service with its own store),
  with a short key retention (``key_ttl_s``) so that a blind resend would create a duplicate;
* real ``onward`` processes: 2 workers (``-c 2``), 2 dispatchers, 1 reaper, with a 3 s lease
  (extended over a provider call to its time limit + 1 s) and fast reaper/dispatcher
  timings.

The workload (bench/chaos/agent.py): R runs started in waves during the chaos window; each
step makes one irreversible write through a tool with a lookup by key. ``--blind-runs`` runs
make one of their writes through a tool with no lookup and no provider dedupe, and the
provider drops exactly those responses: those runs must park (``effect_outcome_unknown``)
and are the expected parks.

Chaos, at seeded random moments (``--seed``):

* SIGKILL of the prefork child that holds a lease (``onward.runs.lease_owner`` "host:pid");
* SIGKILL of a whole worker process tree (``--tree-kills``, 3 by default), restarted with
  named fault points armed, spread over the restarts (after_effect_pending,
  after_provider_response, after_effect_recorded, before_checkpoint_commit,
  after_commit_before_publish, after_chained_commit, each ``kill:once``: the pool child
  dies there once and the worker replaces it);
* SIGKILL of a dispatcher, restarted (once with dispatcher_after_publish_before_mark armed);
* FLUSHDB of the broker's Redis database, once;
* PostgreSQL stopped mid-batch (``pg_ctl stop -m immediate``: a crash, recovered from the
  WAL) and started again after 0.5-3 s (``--pg-restarts``);
* ``pg_terminate_backend`` of one database connection of a worker (pool children and
  master) or of a dispatcher, alternately (``--backend-kills``; each process's connections
  carry ``application_name`` chaos-<role><slot>.g<gen> through PGAPPNAME);
* effect calls longer than the lease: the provider holds the next few creates
  ``--long-call-s`` seconds (the lease TTL + 1 s by default) before acting
  (``--long-calls``); the tools' time limit (``ONWARD_TOOL_TIMEOUT_S``) is 2 s more, so
  such a call outlives the lease TTL but not its own limit;
* provider faults: dropped responses and HTTP 500s on the lookup tool's collection, and a
  period of asynchronous completion (202 + status polling);

The counts of each kind of chaos are given per minute of chaos window (``--window``, by
default 60 s or 0.1 s per step of work, whichever is longer), so ``--runs 1000`` gets
proportionally more of each (whole-worker, dispatcher and PostgreSQL restarts, which cost
seconds of CPU each, up to a bound); a count given on the command line is used as is.
Above 1,000 steps of work each worker runs 4 pool children instead of 2 (``--concurrency``).
* opt-in, a stale lease holder: ``--pauses N`` SIGSTOPs lease holders, ``--stop-point``
  arms ``after_effect_pending:stop:once`` (the child stops itself after recording the intent,
  before calling); each is SIGCONTed once another worker has taken the step over and
  committed it (design scenario 16, "lease holder paused past TTL, then resumes").

When every run is terminal or parked (or the deadline passes) it counts, from the ledger and
from the provider separately, and prints progress to stderr and ONE JSON line to stdout:

* ``lost_runs``: runs neither completed nor parked as expected;
* ``duplicate_provider_objects``: provider objects sharing an idempotency key beyond the
  first (provider's /admin/stats); ``duplicate_objects_by_payload``: objects for the same
  (run, step) beyond the first, from the objects' bodies (catches an unstable key);
* ``duplicate_commits``: (run, seq) committed twice (``ledger.batch_stats``);
* ``orphan_pending_effects``: effects still pending/accepted after settling, other than the
  one unknown write of each expected park;
* ``parked`` / ``expected_parked``;
* ``postgres_restarts``, ``backend_kills``, ``long_calls`` (creates the provider held past
  the lease): how much of the heavier chaos happened;
* cross-checks: every provider object's key is a completed effect in the ledger (or the
  unconfirmed write of an expected park) and every completed effect has its object, with
  the same provider id; every completed run's result lists the provider's ids;
  provider_objects == expected_provider_objects + provider_objects_unconfirmed.

Exit status: 0 when the pass bar holds (zero lost, duplicates, orphans and mismatches;
parked == expected_parked), 1 when it does not, 2 when the bench could not run.
"""
