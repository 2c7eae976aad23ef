"""Who the CLI acts as (docs/operating.md, "Who may do what").

1. A token (``ONWARD_TOKEN``, or the file ``ONWARD_TOKEN_FILE``, default
   ``~/.config/onward/token``, readable by its owner only): the token's actor, role,
   approver roles and tenant.
2. No token, the embedded default (no ``ONWARD_DATABASE_URL``) and the OS user who owns the
   embedded database (or root, for whom pgserver runs it as its own user): a local admin
   named ``ONWARD_ACTOR`` (default: the OS user).
3. No token, a configured database and ``ONWARD_AUTH=off``: the same local admin, and every
   command says so on stderr.
4. Otherwise: refused, saying how to get a token.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from console.settings import ConsoleSettings
from ledger import Ledger, OnwardSettings
from ledger.audit import Actor
from ledger.exceptions import Unauthenticated
from ledger.vocabulary import Role

__all__ = [
    "cli_ledger",
    "default_token_file",
    "local_admin",
    "owns_embedded_database",
    "presented_token",
]


def default_token_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "onward" / "token"


def presented_token(settings: ConsoleSettings) -> str | None:
    """The token the CLI was given, if any; refuses a token file others can read."""
    if settings.token is not None:
        return settings.token.get_secret_value().strip()
    path = settings.token_file or default_token_file()
    if not path.exists():
        if settings.token_file is not None:
            raise Unauthenticated(f"ONWARD_TOKEN_FILE {path} does not exist")
        return None
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Unauthenticated(f"the token file {path} is readable by others: "
                              f"chmod 600 {path} (and consider revoking that token)")
    return path.read_text().strip()


# pgserver will not run PostgreSQL as root: started by root, the server and its data
# directory belong to this system user, which pgserver creates for the purpose.
_PGSERVER_ROOT_USER = "pgserver"


def owns_embedded_database(settings: OnwardSettings) -> bool:
    """Whether this OS user owns the embedded database (``ONWARD_HOME/pg``), and so may act
    as its local admin: its owner, or root when pgserver ran the server for root as
    ``_PGSERVER_ROOT_USER`` (root reads that data directory and the home's keys anyway)."""
    pgdata = settings.home_dir / "pg"
    if not pgdata.exists():
        return False
    owner = pgdata.stat().st_uid
    if owner == os.getuid():
        return True
    return os.getuid() == 0 and _user_name(owner) == _PGSERVER_ROOT_USER


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry for that uid
        return None


def local_admin(settings: OnwardSettings) -> Actor:
    return Actor(settings.actor, Role.ADMIN, settings.tenant_id)


def cli_ledger(settings: ConsoleSettings | None = None,
               warn: object = None) -> Ledger:
    """The ledger acting as whoever runs this CLI (see the module docstring).

    ``warn`` receives the notice printed when auth is off (a callable taking a str)."""
    settings = settings or ConsoleSettings()
    ledger = Ledger.from_env(settings)
    token = presented_token(settings)
    if token:
        return ledger.authenticate(token)
    if settings.database_url is None and owns_embedded_database(settings):
        return ledger.with_actor(local_admin(settings))
    if not settings.auth:
        if callable(warn):
            warn(f"auth is off (ONWARD_AUTH=off): acting as admin {settings.actor!r} of "
                 f"tenant {settings.tenant_id!r} without a token")
        return ledger.with_actor(local_admin(settings))
    where = ("a database this OS user does not own" if settings.database_url is None
             else "a configured database (ONWARD_DATABASE_URL)")
    raise Unauthenticated(
        f"this CLI talks to {where}: give it a token (ONWARD_TOKEN=onw_… or the file "
        f"{settings.token_file or default_token_file()}, mode 600) from an admin's "
        "`onward tokens create NAME --role …`, or switch auth off for this shell with "
        "ONWARD_AUTH=off")
