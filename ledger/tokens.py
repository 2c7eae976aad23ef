"""Tokens: who may do what (docs/operating.md, "Who may do what").

A token is 256 random bits shown once when it is created; the ledger keeps only its SHA-256,
with the actor it names, the role, the approver roles, the tenant it is scoped to, an
expiry and a revocation. Presenting the secret (CLI ``ONWARD_TOKEN``, HTTP ``Authorization:
Bearer``) yields the ``Actor`` every command runs as.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from uuid6 import uuid7

from ledger.audit import Actor
from ledger.exceptions import InvalidInput, Unauthenticated, UnknownToken
from ledger.schema import tokens
from ledger.vocabulary import Role

__all__ = [
    "MAX_TTL",
    "PREFIX",
    "Issued",
    "Token",
    "TokenRequest",
    "authenticate_txn",
    "digest",
    "find_txn",
    "issue_txn",
    "list_txn",
    "revoke_txn",
]


PREFIX = "onw_"
"""Every secret starts with this, so secret scanners and people recognise one."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:+-]{0,127}$")
MAX_TTL = timedelta(days=366)


@dataclass(frozen=True)
class Token:
    """A token's record (never its secret)."""

    id: UUID
    actor: str
    role: Role
    approver_roles: tuple[str, ...]
    tenant_id: str
    note: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    last_used_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> Token:
        fields = {name: row[name] for name in cls.__dataclass_fields__}
        fields["role"] = Role(row["role"])
        fields["approver_roles"] = tuple(row["approver_roles"])
        return cls(**fields)

    def actor_of(self) -> Actor:
        return Actor(self.actor, self.role, self.tenant_id, self.approver_roles, self.id)


@dataclass(frozen=True)
class Issued:
    """A new token: its record, and the secret, which exists only here."""

    token: Token
    secret: str


@dataclass(frozen=True)
class TokenRequest:
    actor: str
    role: Role
    tenant_id: str
    ttl: timedelta
    approver_roles: tuple[str, ...] = ()
    note: str | None = None

    def validated(self) -> TokenRequest:
        for name in (self.actor, *self.approver_roles):
            if not _NAME.match(name):
                raise InvalidInput(f"{name!r} is not a usable name: letters, digits and "
                                   "_ . @ : + - only, up to 128 characters")
        if not timedelta(0) < self.ttl <= MAX_TTL:
            raise InvalidInput(f"a token lives between 1 second and {MAX_TTL.days} days; "
                               "create a new one before it expires")
        return self


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_txn(conn: Connection, request: TokenRequest, created_by: str) -> Issued:
    """Create a token; the secret is returned once and never stored."""
    request = request.validated()
    secret = PREFIX + secrets.token_urlsafe(32)
    row = conn.execute(
        tokens.insert().values(
            id=uuid7(), token_hash=digest(secret), actor=request.actor,
            role=request.role.value, approver_roles=list(request.approver_roles),
            tenant_id=request.tenant_id, note=request.note, created_by=created_by,
            expires_at=sa.func.onward.now() + request.ttl,
        ).returning(*tokens.c)
    ).mappings().one()
    return Issued(Token.from_row(row), secret)


def authenticate_txn(conn: Connection, secret: str) -> Token:
    """The live token this secret names; Unauthenticated otherwise (without saying which
    of unknown, expired or revoked, to whoever holds a guessed or stolen secret)."""
    if not secret.startswith(PREFIX) or len(secret) > 200:
        raise Unauthenticated("not an onward token (they start with onw_)")
    hashed = digest(secret)
    # row-level security lets whoever presents a token's hash read that token (docs/security.md)
    conn.execute(sa.select(sa.func.set_config("onward.token_hash", hashed, True)))
    row = conn.execute(
        sa.select(tokens, (tokens.c.expires_at > sa.func.onward.now()).label("live"))
        .where(tokens.c.token_hash == hashed)
    ).mappings().first()
    if row is None or row["revoked_at"] is not None or not row["live"]:
        raise Unauthenticated("this token is unknown, expired or revoked: ask an admin for "
                              "a new one (onward tokens create)")
    conn.execute(  # at most one write a minute per token
        tokens.update().where(
            tokens.c.id == row["id"],
            sa.or_(tokens.c.last_used_at.is_(None),
                   tokens.c.last_used_at < sa.func.onward.now() - timedelta(minutes=1)))
        .values(last_used_at=sa.func.onward.now()))
    return Token.from_row(row)


def list_txn(conn: Connection, tenant_id: str, *, include_inactive: bool = False) -> list[Token]:
    query = sa.select(tokens).where(tokens.c.tenant_id == tenant_id).order_by(tokens.c.id)
    if not include_inactive:
        query = query.where(tokens.c.revoked_at.is_(None),
                            tokens.c.expires_at > sa.func.onward.now())
    return [Token.from_row(r) for r in conn.execute(query).mappings()]


def revoke_txn(conn: Connection, token_id: UUID, tenant_id: str, by: str) -> Token:
    """Revoke now; a revoked token authenticates nothing, already-open sessions included."""
    row = conn.execute(
        tokens.update()
        .where(tokens.c.id == token_id, tokens.c.tenant_id == tenant_id)
        .values(revoked_at=sa.func.coalesce(tokens.c.revoked_at, sa.func.onward.now()),
                revoked_by=sa.func.coalesce(tokens.c.revoked_by, by))
        .returning(*tokens.c)
    ).mappings().first()
    if row is None:
        raise UnknownToken(f"no token {token_id} in tenant {tenant_id!r}")
    return Token.from_row(row)


def find_txn(conn: Connection, prefix: str, tenant_id: str) -> UUID:
    """A token id from its full text or a unique prefix (8+ characters)."""
    text = prefix.strip().lower()
    if len(text) < 8 or not re.fullmatch(r"[0-9a-f-]+", text):
        raise InvalidInput("give a token id (or 8+ of its first characters), not a secret")
    ids = list(conn.execute(
        sa.select(tokens.c.id).where(tokens.c.tenant_id == tenant_id,
                                     sa.cast(tokens.c.id, sa.Text).startswith(text))
        .limit(2)).scalars())
    if not ids:
        raise UnknownToken(f"no token {prefix} in tenant {tenant_id!r}")
    if len(ids) > 1:
        raise InvalidInput(f"token id prefix {prefix} is ambiguous; give more of it")
    return UUID(str(ids[0]))
