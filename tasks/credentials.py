"""Tool credentials by reference (issue 15 item 3; docs/security.md).

A tool's code names the credential it needs, ``secret://NAME``, and reads its value with
``resolve`` when it makes the request: from the environment (``ONWARD_SECRET_NAME``, the
name upper-cased, ``-`` and ``.`` as ``_``) or from the file ``NAME`` in
``ONWARD_SECRETS_DIR`` (a mounted Kubernetes or Docker secret). The value is never an
argument of ``ctx.effect``, never in a state, and so never in an effect, an attempt,
evidence, a checkpoint, an audit row or a broker message: none of them can hold what they
are never given. What the ledger may record is the reference.

Every value resolved in a process is remembered there (in memory only) so that ``redact``
can take it out of text that leaves the process: log lines (``RedactingFilter``, the
structlog processor ``redact_event``) and a provider's error message before it is recorded;
and so that a step that copies one into a state, an effect payload, an approval artifact or
a result is refused before anything is recorded (``held_in``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import MutableMapping
from typing import Any

from tasks.exceptions import CredentialUnavailable
from tasks.settings import CredentialSettings

__all__ = [
    "MASK",
    "MIN_REDACTED",
    "SCHEME",
    "RedactingFilter",
    "env_name",
    "held_in",
    "is_reference",
    "lookup",
    "redact",
    "redact_event",
    "redact_value",
    "reference",
    "resolve",
]


SCHEME = "secret://"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,127}$")
MASK = "***"
MIN_REDACTED = 6  # shorter values would mask ordinary words: refuse them as credentials

_known: set[str] = set()
_lock = threading.Lock()


def reference(name: str) -> str:
    """``secret://NAME``, checked."""
    _check_name(name)
    return SCHEME + name


def is_reference(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def env_name(name: str) -> str:
    """The environment variable that holds credential ``name``."""
    return "ONWARD_SECRET_" + re.sub(r"[-.]", "_", name).upper()


def resolve(ref: str) -> str:
    """The value of credential ``ref`` (``secret://NAME``), read now; raises
    CredentialUnavailable, naming the reference and where it was looked for (never a value)."""
    value = lookup(ref)
    if value is None:
        name = _name_of(ref)
        where = CredentialSettings().secrets_dir
        raise CredentialUnavailable(
            f"credential {ref} is not configured: set {env_name(name)}"
            + (f" or create {where / name}" if where else " or ONWARD_SECRETS_DIR"))
    return value


def lookup(ref: str) -> str | None:
    """``resolve``, or None when the credential is not configured (an optional one)."""
    name = _name_of(ref)
    value = os.environ.get(env_name(name))  # a credential's value, not a setting
    if value is None:
        directory = CredentialSettings().secrets_dir
        path = directory / name if directory else None
        if path is not None and path.is_file():
            value = path.read_text().rstrip("\r\n")
    if value is None:
        return None
    if len(value) < MIN_REDACTED:
        raise CredentialUnavailable(f"credential {ref} is shorter than {MIN_REDACTED} "
                                    "characters: not a credential onward can keep out of logs")
    with _lock:
        _known.add(value)
    return value


def redact(text: str) -> str:
    """``text`` with every credential value this process resolved replaced by ``***``."""
    if not _known:
        return text
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def held_in(body: bytes) -> bool:
    """Whether canonical JSON ``body`` (a state, a payload, a result) holds the value of a
    credential this process resolved, as is or JSON-escaped: the caller refuses to record
    it (a step copied a credential where only its reference belongs)."""
    if not _known:
        return False
    return any(value.encode() in body
               or json.dumps(value, ensure_ascii=False)[1:-1].encode() in body
               for value in list(_known))


def redact_value(value: Any) -> Any:
    """``redact`` through strings, lists and dict values (a log event's fields)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value


def redact_event(_logger: Any, _name: str,
                 event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: no resolved credential in any field of a log event."""
    if not _known:
        return event_dict
    return {key: redact_value(item) for key, item in event_dict.items()}


class RedactingFilter(logging.Filter):
    """A logging filter for the standard library's records (Celery, httpx, kombu): the
    formatted message and the exception text with every resolved credential masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _known:
            record.msg, record.args = redact(record.getMessage()), None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact(record.exc_text)
        return True


def _name_of(ref: str) -> str:
    if not is_reference(ref):  # perhaps a value given by mistake: never shown
        raise CredentialUnavailable(f"a credential is named by a reference, {SCHEME}NAME; "
                                    "this is not one (its text is not shown)")
    name = ref[len(SCHEME):]
    _check_name(name)
    return name


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise CredentialUnavailable(f"{name!r} is not a credential name: a letter, then "
                                    "letters, digits, _ . - (up to 128)")
