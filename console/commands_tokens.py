"""``onward tokens``: who may do what (admin). A token names an actor, a role, approver
roles and a tenant, and expires; its secret is printed once and only its hash is kept."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

import typer
from rich.table import Table

from console.common import (
    EXIT_REFUSED,
    JsonFlag,
    err,
    fail,
    open_ledger,
    out,
    print_json,
    reported,
    when,
)
from console.safe import id_column
from ledger.tokens import TokenRequest
from ledger.vocabulary import AuditAction, Role

__all__ = ["parse_ttl", "tokens_app", "tokens_create", "tokens_ls", "tokens_revoke"]


tokens_app = typer.Typer(help="Tokens: who may do what (admin): create, ls, revoke.",
                         no_args_is_help=True)

_TTL = re.compile(r"^(\d+)\s*([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_ttl(value: str) -> timedelta:
    """``90m``, ``12h``, ``30d``, ``4w``."""
    match = _TTL.match(value.strip())
    if not match:
        fail(f"--expires {value!r}: give e.g. 12h, 30d or 4w", EXIT_REFUSED)
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


@tokens_app.command("create")
def tokens_create(
    actor: Annotated[str, typer.Argument(help="Who the token names (on every audit row).")],
    role: Annotated[Role, typer.Option(
        help="viewer: reads; approver: also decide approvals; operator: also start, signal, "
             "continue, replay, branch, cancel; admin: also repeat effects, manage tokens.")]
    = Role.VIEWER,
    approver_role: Annotated[list[str] | None, typer.Option(
        "--approver-role", help="An approver role (approvals naming role:NAME), repeatable.")]
    = None,
    expires: Annotated[str, typer.Option(help="Lifetime: 12h, 30d, 4w (at most a year).")]
    = "30d",
    note: Annotated[str | None, typer.Option(help="What it is for (audited).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a token in your tenant and print its secret ONCE (only its hash is kept)."""
    ledger = open_ledger(AuditAction.TOKEN_CREATE)
    request = TokenRequest(actor=actor, role=role, tenant_id=ledger.actor.tenant_id,
                           ttl=parse_ttl(expires), approver_roles=tuple(approver_role or ()),
                           note=note)
    with reported():
        issued = ledger.create_token(request)
    token = issued.token
    if as_json:
        print_json({"token": issued.secret, "id": str(token.id), "actor": token.actor,
                    "role": token.role.value, "approver_roles": list(token.approver_roles),
                    "tenant_id": token.tenant_id, "expires_at": token.expires_at.isoformat()})
        return
    err.print(f"token {token.id} for {token.actor!r}: {token.role.value}"
              + (f", approver roles {', '.join(token.approver_roles)}"
                 if token.approver_roles else "")
              + f", tenant {token.tenant_id!r}, expires {when(token.expires_at)}",
              markup=False, highlight=False)
    err.print("the secret below is shown once; give it as ONWARD_TOKEN, or put it in "
              "~/.config/onward/token (chmod 600)", markup=False, highlight=False)
    print(issued.secret)


@tokens_app.command("ls")
def tokens_ls(
    all_tokens: Annotated[bool, typer.Option("--all", help="Include revoked and expired.")]
    = False,
    as_json: JsonFlag = False,
) -> None:
    """Your tenant's tokens (admin): never their secrets."""
    ledger = open_ledger(AuditAction.TOKEN_CREATE)
    with reported():
        found = ledger.tokens(include_inactive=all_tokens)
    if as_json:
        print_json(found)
        return
    table = Table(id_column("id"), "actor", "role", "approver roles", "expires", "last used",
                  "revoked", "note")
    for t in found:
        table.add_row(str(t.id), t.actor, t.role.value, ", ".join(t.approver_roles) or "-",
                      when(t.expires_at), when(t.last_used_at),
                      f"{when(t.revoked_at)} by {t.revoked_by}" if t.revoked_at else "-",
                      t.note or "")
    out.print(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (or 8+ first characters).")],
    reason: Annotated[str | None, typer.Option("--reason", "-r", help="Why (audited).")]
    = None,
) -> None:
    """Revoke a token now: it authenticates nothing from here on, open sessions included."""
    ledger = open_ledger(AuditAction.TOKEN_REVOKE)
    with reported():
        revoked = ledger.revoke_token(token_id, reason)
    out.print(f"revoked token {revoked.id} of {revoked.actor!r}", markup=False, highlight=False)
