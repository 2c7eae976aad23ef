"""Settings of onward's processes (worker, dispatcher, reaper, the CLI's servers), read from
the environment (prefix ``ONWARD_``); docs/configuration.md lists them all.

``WorkerSettings`` is the ledger's ``OnwardSettings`` plus what only these processes read:
the queue, leases and retries, eager continuation, the dispatcher's and the reaper's
periods. The ledger never reads them (``ledger`` does not import ``workers``). The broker's
URL is the ledger's setting: with the database's, it tells the embedded default."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.settings import OnwardSettings

__all__ = ["LogSettings", "WorkerSettings"]


class WorkerSettings(OnwardSettings):
    """A worker's, dispatcher's and reaper's settings: the ledger's and their own."""

    queue: str = Field(default="onward.steps", description="Broker queue for step messages.")
    lease_ttl_s: float = Field(default=30.0, gt=0, description="Lease length of a claimed step.")
    tool_lease_margin_s: float = Field(
        default=5.0, ge=0,
        description="Lease kept beyond a provider call's (or model call's, or a step's "
        "``timeout``) time limit, to record its answer.",
    )
    model_timeout_s: float = Field(
        default=120.0, gt=0,
        description="Time limit of one model call (ctx.llm) whose client declares none "
        "(``timeout_s``); the lease is extended to cover it before the call starts.",
    )
    retry_base_s: float = Field(default=0.5, ge=0, description="First retry delay after an error.")
    retry_max_s: float = Field(default=60.0, ge=0, description="Cap of the retry backoff.")
    outbox_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="The dispatcher leaves rows a worker publishes itself alone this long.",
    )
    outbox_republish_s: float = Field(
        default=30.0, gt=0, description="Republish a published row not consumed after this long."
    )
    outbox_republish_max_s: float = Field(
        default=120.0, gt=0,
        description="Cap of the republish backoff (x2 per publish): a lost message is sent "
        "again at most this long after its last publish.",
    )
    dispatcher_poll_s: float = Field(
        default=1.0, gt=0, description="Polling fallback when no NOTIFY arrives."
    )
    reaper_interval_s: float = Field(default=2.0, gt=0, description="Reaper sweep period.")
    stall_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A runnable run with no lease and no outbox row is re-sent after this long.",
    )
    worker_queue_ttl_s: float = Field(
        default=30.0, gt=0,
        description="A version queue counts as served this long after a worker advertised it.",
    )
    schema_check_s: float = Field(
        default=10.0, gt=0,
        description="How often a worker, dispatcher or reaper checks the ledger's schema "
                    "revision; one that changed (an upgrade) stops it.",
    )
    handback_limit: int = Field(
        default=10, ge=1,
        description="A run whose workflow, or the workflow version it is bound to, the worker "
        "that claims it lacks is handed back (its attempts unspent, backing off 1 s, 2 s, "
        "4 s ... up to worker_queue_ttl_s); after this many hand-backs in a row (a commit "
        "resets the count) it is parked no_worker_for_version.",
    )
    anchor_location: str | None = Field(
        default=None,
        description="Where anchors (signed digests of every run's head) are written: a "
        "directory or file:// URL outside the database's reach; unset: no anchors.",
    )
    anchor_interval_s: float = Field(
        default=3600.0, gt=0,
        description="The reaper writes an anchor this often when anchor_location is set.",
    )
    retention_interval_s: float = Field(
        default=3600.0, gt=0,
        description="The reaper applies the retention policies this often.",
    )
    checkpoint_snapshot_every: int = Field(
        default=16, ge=1,
        description="A checkpoint stores its state as a delta from its parent's, with a full "
        "snapshot once the chain since the last one is this many steps long and its deltas "
        "weigh half the state (docs/design.md section 9); 1: every state in full.",
    )
    eager_steps: int = Field(
        default=16, ge=0,
        description="After committing a step, a worker runs up to this many of the run's next "
        "steps itself (each claimed by the commit before it and committed through the ledger) "
        "before handing the run back to the broker; 0 sends every step through the broker.",
    )
    eager_window_ms: float = Field(
        default=100.0, ge=0,
        description="Eager continuation stops once the delivered message has run this long, so "
        "one run cannot hold a worker process from the others.",
    )
    db_pool_max: int = Field(
        default=20, ge=1,
        description="Most ledger connections one worker process opens: a threads or gevent "
        "worker of -c N borrows one per statement from a pool of min(N, this); a prefork child "
        "uses one.",
    )
    task_events: bool = Field(
        default=False,
        description="Send Celery task events (task-sent, -received, -started, -succeeded or "
        "-failed) for every step, which Flower needs to list steps as tasks. Off by default: "
        "their publishes cost each step CPU in the worker (about a fifth of the interpreter's "
        "time at a few hundred steps a second); turn on for Flower.",
    )
    eager_events: bool = Field(
        default=True,
        description="Send Flower the task events (received, started, succeeded or failed) of "
        "each step run by eager continuation, so it lists them as tasks, when task events are "
        "on (ONWARD_TASK_EVENTS); off saves their three publishes per eager step and hides "
        "those steps from Flower.",
    )
    gc_freeze: bool = Field(
        default=True,
        description="Freeze the objects a worker holds once it has started (imports, "
        "workflows, model clients: gc.freeze, before the pool forks and when the worker is "
        "ready), so full garbage collections stop walking them; false leaves the collector "
        "as Python set it.",
    )
    malloc_keep_freed: bool = Field(
        default=True,
        description="Keep up to 64 MB of the memory a worker frees in its heap for the next "
        "step (glibc's mallopt thresholds, set before the pool forks), so restoring a large "
        "state does not have the kernel map and zero its pages again every time; false "
        "leaves the allocator as glibc set it.",
    )
    broker_ack_emulation: bool = Field(
        default=False,
        description="Redis ack emulation. Off by default: the outbox and the reaper redeliver.",
    )

    @classmethod
    def of(cls, settings: OnwardSettings) -> WorkerSettings:
        """``settings`` as a worker's: itself when it is one; otherwise its values, with the
        worker's own fields read from the environment (as ``OnwardSettings`` read them all
        before they moved here)."""
        if isinstance(settings, cls):
            return settings
        return cls(**{name: getattr(settings, name) for name in OnwardSettings.model_fields})


class LogSettings(BaseSettings):
    """How a process logs (``workers/logs.py``, docs/observability.md)."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid",
                                      env_ignore_empty=True)

    log_json: bool = Field(
        default=False,
        description="Every line a process writes is one JSON object (Celery's, kombu's and "
        "uvicorn's lines, warnings, tracebacks and what step code prints included).",
    )
    log_level: str = Field(
        default="INFO",
        description="Log level when a command is given none (``--loglevel`` wins).",
    )
