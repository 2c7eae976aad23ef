"""Checkpoint envelopes: canonical bytes, keyed MACs chained to the parent, verification.

A checkpoint's ``hash`` is HMAC-SHA256 over the RFC 8785 canonical JSON of its identity
(run id, seq, parent hash, versions) and content. The key never lives in the database, so
an edit made at the database level cannot recompute a valid MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import rfc8785

from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.settings import OnwardSettings

if TYPE_CHECKING:
    from ledger.crypto import Keyring

__all__ = [
    "ARTIFACT_KEY",
    "ENVELOPE_VERSION",
    "CheckpointBody",
    "CheckpointKeys",
    "artifact_ref",
    "canonical_json",
    "check_parent_link",
    "sha256_hex",
    "verify_checkpoint",
]


ENVELOPE_VERSION = 3
"""The envelope new checkpoints are written with. 2: the MAC'd body names the run's
workflow. 3: a checkpoint stored as a delta signs its state's chain digest
(``state_chain``: the digest of its chain's snapshot and every delta since, ledger/states.py)
in place of the reconstructed state, so a restore checks the MAC without writing a large
state out again as canonical JSON; a snapshot signs its state as before. A checkpoint keeps
the version it was written with and verifies as such, so version 1 checkpoints (no
workflow in the body) and version 2 deltas (the whole state signed) still verify; the
version is itself in the body, so a checkpoint cannot be passed off as an older version."""
ARTIFACT_KEY = "$artifact"
"""A state stored apart is ``{"$artifact": {"sha256": …, "size": …}}`` in its checkpoint."""


def artifact_ref(state: Any) -> dict[str, Any] | None:
    """The artifact reference a checkpoint's state is, or None for an inline state."""
    if isinstance(state, dict) and len(state) == 1 and ARTIFACT_KEY in state:
        ref = state[ARTIFACT_KEY]
        return ref if isinstance(ref, dict) and isinstance(ref.get("sha256"), str) else None
    return None


SEALED_KEY = "$sealed"
"""A value sealed at rest is ``{"$sealed": {"v", "k", "s", "n", "c", "d"}}`` (ledger/crypto.py)."""
_SEALED_MARK = b'"$sealed"'


def sealed_envelope(value: Any) -> dict[str, Any] | None:
    """The envelope a sealed value is, or None for anything else."""
    if type(value) is dict and len(value) == 1 and SEALED_KEY in value:
        inner = value[SEALED_KEY]
        if type(inner) is dict and isinstance(inner.get("d"), str):
            return inner
    return None


def digest_form(value: Any) -> Any:
    """``value`` with every sealed value replaced by ``{"$sealed": digest}``: what MACs,
    chains and hashes cover, so they verify without the data keys and stay the same when
    ``onward keys rotate`` re-encrypts (the digest is keyed with the checkpoint key, over
    the plaintext and where it belongs: ledger/crypto.py)."""
    envelope = sealed_envelope(value)
    if envelope is not None:
        return {SEALED_KEY: envelope["d"]}
    if type(value) is dict:
        copied: dict[str, Any] | None = None
        for key, item in value.items():
            form = digest_form(item)
            if form is not item:
                copied = copied if copied is not None else dict(value)
                copied[key] = form
        return value if copied is None else copied
    if type(value) is list:
        items = [digest_form(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def covered_json(value: Any, *, sealing: bool = False) -> bytes:
    """The canonical JSON of what a MAC or hash covers of ``value`` (``digest_form``): the
    same bytes as ``canonical_json`` for a value that holds nothing sealed. ``sealing``
    (a process with encryption keys, whose values mostly hold sealed ones) walks first
    instead of encoding twice."""
    if sealing:
        return canonical_json(digest_form(value))
    body = canonical_json(value)
    if _SEALED_MARK in body:
        return canonical_json(digest_form(value))
    return body


_JS_SAFE_INT = 2**53 - 1  # RFC 8785 (I-JSON) integers; rfc8785 refuses larger ones


class _TooDeep(Exception):
    """Raised inside the walk when a value nests deeper than allowed."""


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, built once."""

_NOT_FAST = object()
"""What ``_fast_form`` returns for a value ``json.dumps`` cannot write as RFC 8785 does."""


def _fast_form(value: Any, room: int) -> Any:
    """``value`` in a form ``json.dumps(sort_keys, compact)`` writes exactly as RFC 8785 does,
    or ``_NOT_FAST``. That is ``value`` itself when it holds only exact str, int (I-JSON
    range), bool, None, list and dict with ASCII keys (so code point order is UTF-16 order);
    a copy when it also holds floats ECMAScript formats as ``repr`` does (see
    ``_fast_float``); anything else takes the rfc8785 path. ``room`` is how many levels of
    containers may still open (negative: no limit); one more raises _TooDeep.

    Scalars inside containers are checked inline (no call per string or number): this walk
    runs over every checkpoint, MAC'd body and recorded answer of every step."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value if -_JS_SAFE_INT <= value <= _JS_SAFE_INT else _NOT_FAST
    if kind is float:
        return _fast_float(value)
    if kind is dict:
        return _fast_dict(value, room)
    if kind is list:
        return _fast_list(value, room)
    return _NOT_FAST


def _fast_dict(value: dict[Any, Any], room: int) -> Any:
    """``_fast_form`` of a dict: itself, a copy with floats rewritten, or _NOT_FAST."""
    if room == 0:
        raise _TooDeep
    copied: dict[str, Any] | None = None
    for key, item in value.items():
        if type(key) is not str or not key.isascii():
            return _NOT_FAST
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -_JS_SAFE_INT <= item <= _JS_SAFE_INT:
                continue
            return _NOT_FAST
        form = _fast_form(item, room - 1)
        if form is not item:
            if form is _NOT_FAST:
                return _NOT_FAST
            copied = copied if copied is not None else dict(value)
            copied[key] = form
    return value if copied is None else copied


def _fast_list(value: list[Any], room: int) -> Any:
    """``_fast_form`` of a list: itself, a copy with floats rewritten, or _NOT_FAST."""
    if room == 0:
        raise _TooDeep
    listed: list[Any] | None = None
    for index, item in enumerate(value):
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -_JS_SAFE_INT <= item <= _JS_SAFE_INT:
                continue
            return _NOT_FAST
        form = _fast_form(item, room - 1)
        if form is not item:
            if form is _NOT_FAST:
                return _NOT_FAST
            listed = listed if listed is not None else list(value)
            listed[index] = form
    return value if listed is None else listed


def _fast_float(number: float) -> Any:
    """A float as ``json.dumps`` writes it the ECMAScript way (RFC 8785 section 3.2.2.3), or
    ``_NOT_FAST``: a whole number of magnitude up to 2**53 - 1 is written as that integer
    (ECMAScript writes 3.0 as 3, -0.0 as 0); any other in [1e-4, 1e16) as ``repr`` writes it,
    the same shortest round-trip digits in plain notation. Exponents, larger whole numbers,
    NaN and infinities go to rfc8785."""
    if number.is_integer():
        return int(number) if -_JS_SAFE_INT <= number <= _JS_SAFE_INT else _NOT_FAST
    return number if 1e-4 <= abs(number) < 1e16 else _NOT_FAST


def _depth(value: Any) -> int:
    """How many levels of containers ``value`` nests (0 for a scalar)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _nul_path(value: Any, path: str = "$") -> str | None:
    """Where ``value`` holds a NUL character (in a string or a key), or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                return f"{path} (a key)"
            found = _nul_path(item, f"{path}.{key}")
            if found is not None:
                return found
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def canonical_json(value: Any, *, max_depth: int | None = None) -> bytes:
    """RFC 8785 canonical JSON; raises InvalidInput for anything that is not plain JSON,
    holds a NUL character (PostgreSQL cannot store ``\\u0000`` in jsonb or text), or nests
    deeper than ``max_depth`` levels of objects and arrays (None: as deep as Python can).

    The common case (ASCII keys, floats of everyday magnitude) goes through the C json
    encoder, which writes those values byte for byte as RFC 8785 does (tests/unit/
    test_checkpoints.py checks it against the rfc8785 package); everything else through
    rfc8785 itself."""
    body: bytes | None = None
    try:
        form = _fast_form(value, -1 if max_depth is None else max_depth)
        if form is not _NOT_FAST:
            body = _CANONICAL.encode(form).encode()
    except _TooDeep:
        raise InvalidInput(f"value nests more than {max_depth} levels of objects and arrays "
                           "(ONWARD_MAX_JSON_DEPTH); flatten it") from None
    except (RecursionError, UnicodeEncodeError):
        pass  # rfc8785 below says what is wrong, or refuses it the same way
    if body is None:
        body = _rfc8785(value, max_depth)
    if b"\\u0000" in body:
        where = _nul_path(value)
        if where is not None:
            raise InvalidInput(f"value holds a NUL character (\\u0000) at {where}, which "
                               "PostgreSQL cannot store; remove or replace it")
    return body


def _rfc8785(value: Any, max_depth: int | None) -> bytes:
    try:
        if max_depth is not None and _depth(value) > max_depth:
            raise InvalidInput(f"value nests more than {max_depth} levels of objects and "
                               "arrays (ONWARD_MAX_JSON_DEPTH); flatten it")
        return rfc8785.dumps(value)
    except RecursionError:
        raise InvalidInput("value nests too deeply to be encoded (thousands of levels of "
                           "objects and arrays); flatten it") from None
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidInput(f"value is not plain JSON: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class CheckpointKeys:
    """The MAC keys by id; new checkpoints use ``current``; old ids still verify."""

    current: str
    keys: dict[str, bytes]
    crypt: Keyring | None = None  # seals and opens sensitive values; None: nothing sealed

    @classmethod
    def from_settings(cls, settings: OnwardSettings) -> CheckpointKeys:
        if settings.checkpoint_key:
            secret = settings.checkpoint_key.encode()
        else:
            secret = _local_key(settings.home_dir / "checkpoint.key")
        keys = {settings.checkpoint_key_id: secret}
        for entry in filter(None, (e.strip() for e in settings.checkpoint_old_keys.split(","))):
            key_id, sep, old_secret = entry.partition("=")
            if not sep or not key_id or not old_secret:
                raise InvalidInput(
                    "ONWARD_CHECKPOINT_OLD_KEYS must look like 'id=secret,id=secret'")
            if key_id == settings.checkpoint_key_id:
                raise InvalidInput(f"old checkpoint key id {key_id!r} is also the current key id")
            keys[key_id] = old_secret.encode()
        from ledger.crypto import Keyring

        crypt = Keyring.from_settings(settings, digest_keys=keys,
                                      digest_key_id=settings.checkpoint_key_id)
        return cls(current=settings.checkpoint_key_id, keys=keys, crypt=crypt)

    def mac(self, body: dict[str, Any], key_id: str | None = None) -> str:
        key_id = key_id or self.current
        key = self.keys.get(key_id)
        if key is None:
            raise IntegrityViolation(f"checkpoint MAC key id {key_id!r} is not configured")
        return hmac.new(key, covered_json(body, sealing=self.crypt is not None),
                        hashlib.sha256).hexdigest()


    def sign(self, body: dict[str, Any]) -> str:
        """``key_id:mac`` of ``body`` under the current key: what a row that is not a
        checkpoint stores (ledger/signed.py builds the bodies)."""
        return f"{self.current}:{self.mac(body)}"

    def check(self, body: dict[str, Any], signature: str | None, what: str) -> None:
        """Raise IntegrityViolation unless ``signature`` (``key_id:mac``) signs ``body``."""
        if not signature:
            raise IntegrityViolation(f"{what} is not signed (its MAC was removed, or it was "
                                     "written outside onward)")
        key_id, _, mac = signature.rpartition(":")
        if not hmac.compare_digest(self.mac(body, key_id or None), mac):
            raise IntegrityViolation(f"{what} does not match its MAC (edited outside onward)")


def _local_key(path: Path) -> bytes:
    """A development key kept beside the embedded servers (set ONWARD_CHECKPOINT_KEY in prod)."""
    if not path.exists():
        tmp = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        tmp.write_text(secrets.token_hex(32))
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)  # atomic: exactly one process creates the key
        except FileExistsError:
            pass  # another process won the race; use its key
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text().strip().encode()


@dataclass(frozen=True)
class CheckpointBody:
    """Everything a checkpoint's MAC covers."""

    run_id: UUID
    seq: int
    parent_hash: str | None
    step: str | None
    next_step: str | None
    outcome: str
    state: dict[str, Any]
    workflow_version: int | None
    control: dict[str, Any] | None = None  # a wait's continuations (approval, signal, timer)
    state_schema_version: int | None = None
    refs: dict[str, Any] | None = None  # evidence and effects the step used, budgets at start
    workflow: str | None = None  # envelope 2 on
    envelope_version: int = ENVELOPE_VERSION
    # envelope 3 on, a delta's chain digest (ledger/states.py chain_digest): what its MAC
    # signs in place of ``state``, which still holds the reconstructed state for readers
    state_chain: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> CheckpointBody:
        """The body of a stored ``onward.checkpoints`` row, as it was MAC'd."""
        return cls(run_id=row["run_id"], seq=row["seq"], parent_hash=row["parent_hash"],
                   step=row["step"], next_step=row["next_step"], outcome=row["outcome"],
                   state=row["state"], workflow_version=row["workflow_version"],
                   control=row["control"], state_schema_version=row["state_schema_version"],
                   refs=row["refs"], workflow=row["workflow"],
                   envelope_version=row["envelope_version"],
                   state_chain=row.get("state_chain"))

    def as_dict(self) -> dict[str, Any]:
        if not 1 <= self.envelope_version <= ENVELOPE_VERSION:
            raise IntegrityViolation(
                f"run {self.run_id}: checkpoint {self.seq} has envelope version "
                f"{self.envelope_version}, which this code does not know (1..{ENVELOPE_VERSION}):"
                " run the onward version that wrote it")
        body: dict[str, Any] = {
            "envelope_version": self.envelope_version,
            "run_id": str(self.run_id),
            "seq": self.seq,
            "parent_hash": self.parent_hash,
            "step": self.step,
            "next_step": self.next_step,
            "outcome": self.outcome,
            "state": self.state,
            "workflow_version": self.workflow_version,
            "control": self.control,
            "state_schema_version": self.state_schema_version,
            "refs": self.refs,
        }
        if self.envelope_version >= 2:
            body["workflow"] = self.workflow
        if self.envelope_version >= 3:  # a delta signs its chain digest, not the state
            body["state_chain"] = self.state_chain
            if self.state_chain is not None:
                body["state"] = None
        return body


def verify_checkpoint(keys: CheckpointKeys, body: CheckpointBody, stored_hash: str,
                      key_id: str, head_hash: str, parent_found: str | bool | None = True) -> None:
    """Check a restored checkpoint against its MAC, the run's recorded head and, when given
    (``parent_found``: the stored hash of checkpoint seq-1, or None if it is gone), the link
    to its parent. Cost: O(1) per step, whatever the history's length."""
    if stored_hash != head_hash:
        raise IntegrityViolation(
            f"run {body.run_id}: checkpoint {body.seq} hash {stored_hash[:12]}… is not the "
            f"run's recorded head {head_hash[:12]}… (history was rewritten or truncated)"
        )
    expected = keys.mac(body.as_dict(), key_id)
    if not hmac.compare_digest(expected, stored_hash):
        raise IntegrityViolation(
            f"run {body.run_id}: checkpoint {body.seq} does not match its MAC "
            "(a field was edited outside onward)"
        )
    check_parent_link(body, parent_found)


def check_parent_link(body: CheckpointBody, parent_found: str | bool | None) -> None:
    """Raise IntegrityViolation unless ``parent_found`` (the stored hash of checkpoint
    seq-1, None if it is gone, True: not checked) is the parent ``body`` names."""
    if parent_found is True:
        return
    if body.parent_hash is None:
        if body.seq != 0 and body.outcome != "fork":
            raise IntegrityViolation(f"run {body.run_id}: checkpoint {body.seq} has no parent "
                                     "but is neither the first checkpoint nor a fork")
        return
    if parent_found != body.parent_hash:
        state = "is missing" if parent_found is None else "does not match the chain"
        raise IntegrityViolation(f"run {body.run_id}: the parent of checkpoint {body.seq} "
                                 f"(seq {body.seq - 1}) {state}")

