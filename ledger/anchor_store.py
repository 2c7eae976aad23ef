"""Where anchors are kept: an append-only location outside the ledger (docs/guarantees.md,
"Rollback of the whole database").

An ``AnchorStore`` lists, reads and creates named objects, and never replaces one: that is
the whole interface a backend implements (a directory here; an object store with object lock
is the same three calls: list by prefix, get, put-if-absent). Names sort in the order the
anchors were taken, so the last name is the latest anchor.
"""

from __future__ import annotations

import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from ledger.exceptions import AnchorUnavailable, InvalidInput

__all__ = [
    "NAME",
    "AnchorStore",
    "DirectoryStore",
    "anchor_name",
    "find_anchor",
    "open_store",
    "taken_at_of",
]


NAME = re.compile(r"^anchor-(\d{8}T\d{6}\.\d{6}Z)-([0-9a-f]{16})\.jsonl\.gz$")
"""``anchor-<time taken, UTC>-<first 16 hex digits of the root>.jsonl.gz``."""


def anchor_name(taken_at: datetime, root: str) -> str:
    """The name an anchor taken at ``taken_at`` (the database's clock) with ``root`` gets."""
    return f"anchor-{taken_at.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}-{root[:16]}.jsonl.gz"


def taken_at_of(name: str) -> datetime:
    """When the anchor called ``name`` was taken (read from its name, not its body)."""
    found = NAME.match(name)
    if found is None:
        raise InvalidInput(f"{name!r} is not an anchor's name (anchor-<time>-<root>.jsonl.gz)")
    return datetime.strptime(found.group(1), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


class AnchorStore(Protocol):
    """An append-only set of named anchors."""

    location: str

    def names(self) -> list[str]:
        """Every anchor's name, oldest first."""

    def read(self, name: str) -> bytes:
        """The bytes of the anchor called ``name``."""

    def create(self, name: str, data: bytes) -> str:
        """Store a new anchor; refuse (AnchorUnavailable) if ``name`` exists. Returns where
        it is (a path or URL to give ``onward verify --anchor``)."""


class DirectoryStore:
    """Anchors as files of one directory, each written once: to a temporary file, flushed to
    disk, then linked under its name (which fails if the name exists, so nothing is ever
    overwritten) and made read-only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.location = str(directory)

    def names(self) -> list[str]:
        try:
            return sorted(entry.name for entry in os.scandir(self.directory)
                          if NAME.match(entry.name))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise AnchorUnavailable(f"cannot list the anchors in {self.directory}: {exc}") from exc

    def read(self, name: str) -> bytes:
        if NAME.match(name) is None:
            raise InvalidInput(f"{name!r} is not an anchor's name")
        try:
            return (self.directory / name).read_bytes()
        except OSError as exc:
            raise AnchorUnavailable(f"cannot read anchor {name} in {self.directory}: "
                                    f"{exc}") from exc

    def create(self, name: str, data: bytes) -> str:
        if NAME.match(name) is None:
            raise InvalidInput(f"{name!r} is not an anchor's name")
        final = self.directory / name
        tmp = self.directory / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o444)
            os.link(tmp, final)  # atomic, and refuses an existing name
            _fsync_directory(self.directory)
        except FileExistsError as exc:
            raise AnchorUnavailable(f"anchor {name} already exists in {self.directory}; "
                                    "anchors are never overwritten") from exc
        except OSError as exc:
            raise AnchorUnavailable(f"cannot write anchor {name} in {self.directory}: "
                                    f"{exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return str(final)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_store(location: str) -> AnchorStore:
    """The store ``ONWARD_ANCHOR_LOCATION`` names: a directory path or a ``file://`` URL."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else location
        if not path:
            raise InvalidInput("ONWARD_ANCHOR_LOCATION is empty: name a directory")
        return DirectoryStore(Path(path).expanduser())
    raise InvalidInput(
        f"ONWARD_ANCHOR_LOCATION {location!r}: only a directory (a path or file:// URL) is "
        "supported so far; name a directory, and copy what it holds to write-once storage")


def find_anchor(path: str | None, location: str | None) -> tuple[str, bytes, bool]:
    """The anchor to compare with: the file ``path``, the latest anchor in the directory
    ``path``, or (no path) the latest in ``location`` (ONWARD_ANCHOR_LOCATION). Returns
    (name, bytes, whether it is the latest of the configured location)."""
    if path is not None and Path(path).expanduser().is_file():
        file = Path(path).expanduser()
        try:
            return file.name, file.read_bytes(), False
        except OSError as exc:
            raise AnchorUnavailable(f"cannot read the anchor {file}: {exc}") from exc
    if path is None and not location:
        raise InvalidInput("no anchor to compare with: set ONWARD_ANCHOR_LOCATION, or give "
                           "an anchor file or directory")
    where = path if path is not None else location
    store = open_store(where or "")
    if path is not None and not Path(store.location).is_dir():
        raise InvalidInput(f"{path} is neither an anchor file nor a directory of anchors")
    names = store.names()
    if not names:
        raise InvalidInput(f"no anchor in {store.location} yet: write one with `onward anchor`")
    return names[-1], store.read(names[-1]), path is None
