"""Encryption at rest of what is sensitive (issue 15 item 1; docs/security.md).

A sensitive value is stored *sealed*: AES-GCM under a data key of its tenant, with
associated data binding it to its tenant, run, seq and field, so a ciphertext moved to
another place does not open. The stored form is ``{"$sealed": envelope}`` with

* ``v`` the envelope version, ``k`` the data key's id, ``s`` the seq and ``f`` the field it
  was sealed for (hints for ``onward keys rotate``: opening builds the associated data from
  where the reader found the value, never from these);
* ``n``, ``c``: the nonce and the ciphertext (base64);
* ``d``: ``key_id:HMAC`` with the checkpoint key of the place and the plaintext. MACs, hash
  chains and ``onward verify`` cover ``{"$sealed": d}`` instead of the envelope
  (``ledger.checkpoints.digest_form``): they verify without any data key, after a tenant's
  keys are erased, and across a rotation (which changes ``k``, ``n`` and ``c`` only). Opening
  checks ``d`` too, so a ciphertext of the same place swapped in is refused.

Data keys are random, one active per tenant, kept in ``onward.tenant_keys`` only wrapped
(AES-GCM) by a master key from the settings (``ONWARD_ENCRYPTION_KEYS`` or a key file).
Erasing a tenant destroys its wrapped keys: its sealed values can no longer be read.

``cryptography`` is imported only when keys are configured.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ledger import sql
from ledger.checkpoints import SEALED_KEY, canonical_json, sealed_envelope
from ledger.exceptions import EncryptionUnavailable, SealedValueUnreadable
from ledger.settings import OnwardSettings

__all__ = [
    "ENVELOPE_VERSION",
    "ERROR_FIELD",
    "LOCAL_KEY_FILE",
    "MASK",
    "REQUEST_FIELD",
    "RESULT_FIELD",
    "Keyring",
    "Place",
    "approval_field",
    "is_sealed",
    "local_master_keys",
    "masked",
    "master_keys_text",
    "open_value",
    "parse_master_keys",
    "seal_value",
    "sealed_text",
    "shown_value",
    "signal_field",
]

ENVELOPE_VERSION = 1
MASK = "***"
_NONCE = 12


@dataclass(frozen=True)
class Place:
    """Where a sealed value belongs; its associated data."""

    tenant: str
    run_id: UUID | str
    seq: int
    field: str

    @cached_property
    def aad(self) -> bytes:
        return canonical_json(["onward-sealed-v1", self.tenant, str(self.run_id), self.seq,
                               self.field])


def approval_field(approval_id: Any) -> str:
    """The field a sealed approval artifact is bound to."""
    return f"approval:{approval_id}:artifact"


RESULT_FIELD = "result"
"""The field a sealed finish result (``runs.result``) is bound to, at the seq it ended at."""

ERROR_FIELD = "error.message"
"""The field a sealed step error's message (``runs.last_error``) is bound to, at the seq
whose step failed (a workflow with sensitive fields: tasks/sensitive.py ``seal_error``)."""

REQUEST_FIELD = "error.request"
"""The field the request a diverged replay's report quotes (``runs.last_error.request``: a
prompt, an effect's payload) is bound to when sealed, at the seq it diverged at."""


def signal_field(signal_id: int) -> str:
    """The field a sealed signal payload is bound to (its row id: one signal, one field)."""
    return f"signal:{int(signal_id)}:payload"


def is_sealed(value: Any) -> bool:
    return sealed_envelope(value) is not None


def masked(value: Any) -> Any:
    """``value`` with every sealed value shown as ``***`` (what a viewer sees)."""
    if sealed_envelope(value) is not None:
        return MASK
    if isinstance(value, dict):
        return {key: masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [masked(item) for item in value]
    return value


def parse_master_keys(text: str) -> dict[str, bytes]:
    """``id=KEY,id=KEY`` (or one a line), each KEY 32 bytes as 64 hex digits or base64."""
    keys: dict[str, bytes] = {}
    for entry in filter(None, (e.strip() for e in text.replace("\n", ",").split(","))):
        if entry.startswith("#"):
            continue
        key_id, sep, encoded = entry.partition("=")
        key_id, encoded = key_id.strip(), encoded.strip()
        if not sep or not key_id or not encoded:
            raise EncryptionUnavailable("encryption keys must look like 'id=KEY,id=KEY' "
                                        "(ONWARD_ENCRYPTION_KEYS or its key file)")
        keys[key_id] = _key_bytes(key_id, encoded)
    return keys


def _key_bytes(key_id: str, encoded: str) -> bytes:
    for decode in (bytes.fromhex, _b64):
        try:
            raw = decode(encoded)
        except (ValueError, binascii.Error):
            continue
        if len(raw) == 32:
            return raw
    raise EncryptionUnavailable(f"encryption key {key_id!r} is not 32 bytes as 64 hex digits "
                                "or base64 (make one with `onward keys new`)")


def _b64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@lru_cache(maxsize=256)
def _aesgcm(key: bytes) -> Any:
    """The AES-GCM cipher of ``key`` (kept: making one costs more than sealing a value)."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - a dependency of onward
        raise EncryptionUnavailable("encryption keys are configured but the 'cryptography' "
                                    "package is not installed") from exc
    return AESGCM(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


_ACTIVE = sql.text("tenant_key_active")
_BY_ID = sql.text("tenant_key_by_id")
_ERASED = sql.text("tenant_keys_destroyed")
_CREATE = sql.text("tenant_key_create")
_ERASE = sql.text("tenant_keys_destroy")
_LOCK = sql.text("tenant_keys_lock")
_LOCK_SHARED = sql.text("tenant_keys_lock_shared")
_SET_TENANT = sql.text("set_tenant")


class Keyring:
    """Master keys, the tenants' data keys (read from the ledger and cached), and the
    checkpoint key that makes each sealed value's digest."""

    def __init__(self, masters: dict[str, bytes], active: str, *,
                 digest_keys: dict[str, bytes], digest_key_id: str,
                 url: str | None = None, engine: Engine | None = None,
                 cache_s: float = 60.0) -> None:
        if active not in masters:
            raise EncryptionUnavailable(f"the active encryption key {active!r} is not among "
                                        f"the configured ones ({sorted(masters)})")
        self.masters, self.active = masters, active
        self.digest_keys, self.digest_key_id = digest_keys, digest_key_id
        self._url, self._engine = url, engine
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, bytes, float]] = {}  # key id -> tenant, key, when
        # what this process sealed or opened, by place and ciphertext: a worker restoring
        # the state it committed a step ago does not decrypt it again
        self._opened: dict[tuple[str, str, str, int, str], bytes] = {}
        self._active: dict[str, tuple[str, float]] = {}  # tenant -> key id, when

    @classmethod
    def from_settings(cls, settings: OnwardSettings, *, digest_keys: dict[str, bytes],
                      digest_key_id: str) -> Keyring | None:
        """The keyring the settings configure, or None when they configure no key."""
        text = master_keys_text(settings)
        if text is None:
            return None
        masters = parse_master_keys(text)
        if not masters:
            return None
        active = settings.encryption_key_id or next(iter(masters))
        keyring = cls(masters, active, digest_keys=digest_keys, digest_key_id=digest_key_id,
                      cache_s=settings.encryption_key_cache_s)
        keyring._settings = settings
        return keyring

    _settings: OnwardSettings | None = None

    # -- the database of data keys ----------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            from ledger.db import database_url, normalize_url

            url = self._url or (database_url(self._settings) if self._settings else None)
            if url is None:
                raise EncryptionUnavailable("the keyring has no database to read data keys from")
            self._engine = sa.create_engine(normalize_url(url), pool_size=1, max_overflow=2,
                                            pool_pre_ping=True)
        return self._engine

    def use_engine(self, engine: Engine) -> None:
        """Read data keys through ``engine`` (one the process already has)."""
        self._engine = engine

    def _in_tenant(self, tenant: str, work: Callable[[sa.Connection], Any]) -> Any:
        with self.engine.begin() as conn:
            conn.execute(_SET_TENANT, {"tenant": tenant, "local": True})
            return work(conn)

    def _wrap_aad(self, tenant: str, key_id: str) -> bytes:
        return canonical_json(["onward-data-key-v1", tenant, key_id])

    def wrap(self, tenant: str, key_id: str, key: bytes, master_id: str | None = None) -> bytes:
        master_id = master_id or self.active
        nonce = os.urandom(_NONCE)
        return nonce + bytes(_aesgcm(self.masters[master_id]).encrypt(
            nonce, key, self._wrap_aad(tenant, key_id)))

    def unwrap(self, tenant: str, key_id: str, master_id: str | None,
               wrapped: bytes | None) -> bytes:
        if wrapped is None:
            raise SealedValueUnreadable(f"tenant {tenant}'s data key {key_id} was erased: "
                                        "what it sealed can no longer be read")
        master = self.masters.get(master_id or "")
        if master is None:
            raise SealedValueUnreadable(
                f"tenant {tenant}'s data key {key_id} is wrapped by master key {master_id!r}, "
                f"which is not configured (configured: {sorted(self.masters)}); add it to "
                "ONWARD_ENCRYPTION_KEYS, or run `onward keys rotate` while it still is")
        try:
            return bytes(_aesgcm(master).decrypt(wrapped[:_NONCE], wrapped[_NONCE:],
                                                 self._wrap_aad(tenant, key_id)))
        except _invalid_tag() as exc:
            raise SealedValueUnreadable(
                f"tenant {tenant}'s data key {key_id} does not unwrap with master key "
                f"{master_id!r} (a wrong key under that id, or an edited row)") from exc

    def _active_key(self, tenant: str) -> tuple[str, bytes]:
        now = time.monotonic()
        with self._lock:
            cached = self._active.get(tenant)
            if cached is not None and now - cached[1] < self.cache_s:
                entry = self._keys.get(cached[0])
                if entry is not None:
                    return cached[0], entry[1]

        def find_or_create(conn: sa.Connection) -> tuple[str, bytes]:
            row = conn.execute(_ACTIVE, {"tenant": tenant}).mappings().first()
            if row is None:  # a first key: never beside an erasure (it waits for it)
                conn.execute(_LOCK_SHARED, {"tenant": tenant})
                if conn.execute(_ERASED, {"tenant": tenant}).scalar():
                    raise SealedValueUnreadable(
                        f"tenant {tenant}'s data keys were erased: nothing more is sealed "
                        "for it (`onward keys erase-tenant`)")
                key_id = f"dk-{os.urandom(8).hex()}"
                key = os.urandom(32)
                conn.execute(_CREATE, {"tenant": tenant, "key_id": key_id,
                                       "master": self.active,
                                       "wrapped": self.wrap(tenant, key_id, key)})
                row = conn.execute(_ACTIVE, {"tenant": tenant}).mappings().one()
            return row["key_id"], self.unwrap(tenant, row["key_id"], row["master_key_id"],
                                              bytes(row["wrapped"]))

        key_id, key = self._in_tenant(tenant, find_or_create)
        with self._lock:
            self._keys[key_id] = (tenant, key, now)
            self._active[tenant] = (key_id, now)
        return key_id, key

    def _data_key(self, tenant: str, key_id: str) -> bytes:
        now = time.monotonic()
        with self._lock:
            cached = self._keys.get(key_id)
        if cached is not None and now - cached[2] < self.cache_s and cached[0] == tenant:
            return bytes(cached[1])

        def find(conn: sa.Connection) -> Any:
            return conn.execute(_BY_ID, {"key_id": key_id}).mappings().first()

        row = self._in_tenant(tenant, find)
        if row is None or row["tenant_id"] != tenant:
            raise SealedValueUnreadable(f"data key {key_id} is not one of tenant {tenant}'s "
                                        "(moved from another tenant, or unknown)")
        wrapped = bytes(row["wrapped"]) if row["wrapped"] is not None else None
        key = self.unwrap(tenant, key_id, row["master_key_id"], wrapped)
        with self._lock:
            self._keys[key_id] = (tenant, key, now)
        return key

    def erase_tenant(self, tenant: str) -> int:
        """Destroy every data key of ``tenant`` (its wrapped copies in the ledger): what
        they sealed can no longer be read, by anyone; MACs and chains still verify. Returns
        how many keys were destroyed. Processes that cached a key drop it within
        ``encryption_key_cache_s``."""
        def erase(conn: sa.Connection) -> int:
            # after any import or first key in flight for the tenant has committed: its
            # keys are then seen and destroyed too, and none is added after this commits
            conn.execute(_LOCK, {"tenant": tenant})
            return int(conn.execute(_ERASE, {"tenant": tenant}).rowcount or 0)

        erased: int = self._in_tenant(tenant, erase)
        self.forget(tenant)
        return erased

    def forget(self, tenant: str | None = None) -> None:
        """Drop cached data keys (of one tenant, or all) and the values they opened."""
        with self._lock:
            self._opened = {k: v for k, v in self._opened.items()
                            if tenant is not None and k[0] != tenant}
            if tenant is None:
                self._keys.clear()
                self._active.clear()
                return
            self._active.pop(tenant, None)
            for key_id in [k for k, v in self._keys.items() if v[0] == tenant]:
                del self._keys[key_id]

    # -- sealing and opening ----------------------------------------------------------------
    def digest(self, place: Place, body: bytes, key_id: str | None = None) -> str:
        key_id = key_id or self.digest_key_id
        key = self.digest_keys.get(key_id)
        if key is None:
            raise SealedValueUnreadable(f"a sealed value's digest names checkpoint key "
                                        f"{key_id!r}, which is not configured")
        mac = hmac.new(key, place.aad + b"\x00" + body, hashlib.sha256).hexdigest()
        return f"{key_id}:{mac}"

    def seal(self, value: Any, place: Place) -> dict[str, Any]:
        """``value`` sealed for ``place``."""
        body = canonical_json(value)
        key_id, key = self._active_key(place.tenant)
        return {SEALED_KEY: self._envelope(body, place, key_id, key,
                                           self.digest(place, body))}

    def _envelope(self, body: bytes, place: Place, key_id: str, key: bytes,
                  digest: str) -> dict[str, Any]:
        nonce = os.urandom(_NONCE)
        cipher = base64.b64encode(_aesgcm(key).encrypt(nonce, body, place.aad)).decode()
        self._remember(place, cipher, body)
        return {"v": ENVELOPE_VERSION, "k": key_id, "s": place.seq, "f": place.field,
                "n": base64.b64encode(nonce).decode(), "c": cipher, "d": digest}

    _REMEMBERED = 4096

    def _remember(self, place: Place, cipher: str, body: bytes) -> None:
        with self._lock:
            if len(self._opened) >= self._REMEMBERED:
                self._opened.pop(next(iter(self._opened)))
            self._opened[(place.tenant, str(place.run_id), place.field, place.seq,
                          cipher)] = body

    def open(self, value: Any, *, tenant: str, run_id: UUID | str, field: str,
             seq: int | None = None, seq_at_most: int | None = None) -> Any:
        """The plaintext of ``value`` found at (tenant, run, field): sealed at ``seq``
        exactly, or at any seq up to ``seq_at_most`` (a state field kept unchanged from an
        earlier checkpoint). A value that is not sealed (written before encryption was on)
        is returned as it is. Raises SealedValueUnreadable, never guesses."""
        envelope = sealed_envelope(value)
        if envelope is None:
            return value
        sealed_at = envelope.get("s")
        if (not isinstance(sealed_at, int) or (seq is not None and sealed_at != seq)
                or (seq_at_most is not None and sealed_at > seq_at_most)):
            raise SealedValueUnreadable(
                f"the sealed {field} of run {run_id} names seq {sealed_at!r}, not where it was "
                "found (moved from another checkpoint?)")
        if envelope.get("v") != ENVELOPE_VERSION:
            raise SealedValueUnreadable(f"the sealed {field} of run {run_id} has envelope "
                                        f"version {envelope.get('v')!r}, which this code does "
                                        f"not know ({ENVELOPE_VERSION})")
        place = Place(tenant, run_id, sealed_at, field)
        remembered = self._opened.get((tenant, str(run_id), field, sealed_at,
                                       str(envelope.get("c"))))
        if remembered is not None and self._known_key(tenant, str(envelope.get("k"))):
            return json.loads(remembered)
        key = self._data_key(tenant, str(envelope.get("k")))
        try:
            body = bytes(_aesgcm(key).decrypt(_b64(str(envelope["n"])),
                                              _b64(str(envelope["c"])), place.aad))
        except (_invalid_tag(), KeyError, ValueError, binascii.Error) as exc:
            raise SealedValueUnreadable(
                f"the sealed {field} of run {run_id} (tenant {tenant}, seq {sealed_at}) does "
                "not open: it was moved from another tenant, run, seq or field, or edited")\
                from exc
        digest_id = str(envelope["d"]).rpartition(":")[0]
        if not hmac.compare_digest(self.digest(place, body, digest_id), str(envelope["d"])):
            raise SealedValueUnreadable(f"the sealed {field} of run {run_id} does not match "
                                        "its digest (its ciphertext was swapped)")
        self._remember(place, str(envelope["c"]), body)
        return json.loads(body)

    def _known_key(self, tenant: str, key_id: str) -> bool:
        """Whether ``key_id`` is a data key of ``tenant`` this process holds, fresh (an
        erased key stops opening remembered values when its cache entry expires)."""
        with self._lock:
            cached = self._keys.get(key_id)
        return (cached is not None and cached[0] == tenant
                and time.monotonic() - cached[2] < self.cache_s)

    def reseal(self, value: Any, *, tenant: str, run_id: UUID | str) -> Any:
        """``value`` with every sealed value under a data key other than its tenant's active
        one sealed again under the active one (same place, same digest): what
        ``onward keys rotate`` writes. Returns ``value`` itself when nothing changed."""
        envelope = sealed_envelope(value)
        if envelope is not None:
            active_id, active = self._active_key(tenant)
            if envelope.get("k") == active_id:
                return value
            field, seq = str(envelope.get("f")), envelope.get("s")
            plain = self.open(value, tenant=tenant, run_id=run_id, field=field, seq=seq)
            place = Place(tenant, run_id, int(seq), field)  # type: ignore[arg-type]
            return {SEALED_KEY: self._envelope(canonical_json(plain), place, active_id,
                                               active, str(envelope["d"]))}
        if isinstance(value, dict):
            changed = {key: self.reseal(item, tenant=tenant, run_id=run_id)
                       for key, item in value.items()}
            same = all(changed[key] is value[key] for key in value)
            return value if same else changed
        if isinstance(value, list):
            items = [self.reseal(item, tenant=tenant, run_id=run_id) for item in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value


LOCAL_KEY_FILE = "encryption.keys"
"""The embedded default's master key file, under ``ONWARD_HOME`` (made on first use)."""


def local_master_keys(path: Path) -> str:
    """The text of the embedded default's master key file (``local-<8 hex>=KEY``), made
    with a new random key (mode 0600, atomically: exactly one process creates it) when
    missing. Like the embedded checkpoint key, it protects a development ledger's dumps and
    backups, not against whoever reads the home directory; set ONWARD_ENCRYPTION_KEYS in
    production. Its id is new with each file: a lost file replaced by a new one is then
    reported as the missing master key it is (``Keyring.unwrap``), not as a wrong key."""
    if not path.exists():
        tmp = path.with_suffix(f".{os.urandom(4).hex()}.tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(f"local-{os.urandom(4).hex()}={os.urandom(32).hex()}\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: use its key
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text()


def master_keys_text(settings: OnwardSettings) -> str | None:
    """The master keys ``settings`` configure, as ``id=KEY`` text: ONWARD_ENCRYPTION_KEYS,
    else the key file, else (the embedded default: no database or broker URL) the home's
    key file, made when missing; None when none is configured. A process given another
    database URL for the same ledger's data (a corpus replay's scratch ledger) takes them
    as ``encryption_keys``: it is no longer the embedded default, its keys are the same."""
    if settings.encryption_keys is not None:
        return settings.encryption_keys.get_secret_value()
    if settings.encryption_key_file is not None:
        try:
            return Path(settings.encryption_key_file).expanduser().read_text()
        except OSError as exc:
            raise EncryptionUnavailable(
                f"cannot read ONWARD_ENCRYPTION_KEY_FILE: {exc}") from exc
    if settings.embedded:  # the embedded default is encrypted at rest too
        return local_master_keys(settings.home_dir / LOCAL_KEY_FILE)
    return None


def seal_value(crypt: Keyring | None, value: Any, place: Place) -> Any:
    """``value`` sealed for ``place`` when a keyring is configured (and it is not sealed
    already, nor None); else ``value`` as it is."""
    if crypt is None or value is None or sealed_envelope(value) is not None:
        return value
    return crypt.seal(value, place)


def sealed_text(crypt: Keyring | None, text: Any, place: Place) -> Any:
    """An error's ``text`` sealed for ``place`` (``seal_value``); ``***`` for a tenant whose
    keys were erased (nothing more can be sealed for it: the failure is still recorded,
    its text is not)."""
    try:
        return seal_value(crypt, text, place)
    except SealedValueUnreadable:
        return MASK


def open_value(crypt: Keyring | None, value: Any, *, tenant: str, run_id: UUID | str,
               field: str, seq: int | None = None, seq_at_most: int | None = None) -> Any:
    """``value`` opened (``Keyring.open``); a plain value as it is. Raises
    SealedValueUnreadable for a sealed value where no keyring is configured."""
    if sealed_envelope(value) is None:
        return value
    if crypt is None:
        raise SealedValueUnreadable(
            f"the {field} of run {run_id} is sealed, and this process has no encryption keys "
            "(set ONWARD_ENCRYPTION_KEYS or ONWARD_ENCRYPTION_KEY_FILE as the workers have it)")
    return crypt.open(value, tenant=tenant, run_id=run_id, field=field, seq=seq,
                      seq_at_most=seq_at_most)


def shown_value(crypt: Keyring | None, value: Any, *, may_see: bool, tenant: str,
                run_id: UUID | str, field: str, seq: int | None = None,
                seq_at_most: int | None = None) -> Any:
    """What a reader is shown of a stored ``value``: a plain value as it is; a sealed one
    opened for a reader who ``may_see`` it (in a process with the keys), else ``***``; one
    that does not open (an erased tenant's, a moved one) as ``*** (unreadable)``."""
    if sealed_envelope(value) is None:
        return value
    if not may_see or crypt is None:
        return MASK
    try:
        return crypt.open(value, tenant=tenant, run_id=run_id, field=field, seq=seq,
                          seq_at_most=seq_at_most)
    except SealedValueUnreadable:
        return f"{MASK} (unreadable)"
