"""Checkpoint states stored as deltas (docs/design.md section 9): a checkpoint stores its
state either in full (a snapshot) or as an RFC 6902 JSON Patch from its parent's state,
and every reader of a state gets it reconstructed here.

A delta row names the snapshot its chain starts from (``snapshot_seq``), so a restore
reads the snapshot and the deltas after it in one statement. The MAC of a delta row covers
the reconstructed state through its chain digest (envelope 3, ``CheckpointBody.state_chain``):
``chain_digest`` of its parent's digest and its own delta, down to the snapshot, whose
digest is the sha256 of its state's canonical JSON (for a snapshot stored as an artifact,
the artifact's sha256, checked against its bytes). The state at the end of a chain is a
function of the snapshot and the deltas, so the digest binds it: a tampered delta or
snapshot gives another digest and the MAC fails, exactly as a tampered state does, while a
restore hashes what it read (the snapshot's stored bytes, the deltas' small canonical
JSON) instead of writing the whole reconstructed state out again as canonical JSON, which
cost most of a large state's restore. Envelope 2 deltas signed the reconstructed state
itself, and still verify so.

A new checkpoint is a snapshot when its chain has grown to ``snapshot_every`` steps and its
deltas together weigh at least three quarters of the state, or when one delta is no
smaller than the state: a restore then reads at most ``snapshot_every`` rows, or a
snapshot and deltas lighter than three quarters of the state. A state that grows by a
message per step so stores at most about 2.5 times its content (snapshots at sizes growing
about fourfold, plus one copy of every message), where a snapshot every N steps would
store about steps/2N times it (31 times for 1,000 steps and N = 16): for a state that
grows, a bounded number of rows and storage linear in content exclude each other, and
this rule bounds what a restore reads by the state's size instead.

Patches are made and applied here rather than with ``jsonpatch``: the diff is
correct by construction (``add``, ``remove`` and ``replace`` only; a list that grew at
its end gains ``add … /-``), and applying copies only the containers on an operation's path
(the states of a run's rows share everything else), where ``jsonpatch`` deep-copies the
whole document per patch and would make reading a history cost its length squared.
tests/unit/test_states.py checks the patches against ``jsonpatch`` itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpointer
import pydantic_core
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.checkpoints import artifact_ref, canonical_json, covered_json, sha256_hex
from ledger.exceptions import IntegrityViolation, InvalidInput, OperationRefused
from ledger.schema import artifacts, checkpoints

__all__ = [
    "SNAPSHOT_EVERY",
    "Stored",
    "apply",
    "chain_digest",
    "chain_states",
    "checkpoint_row_txn",
    "checkpoint_rows_txn",
    "copy_json",
    "diff",
    "needed_artifacts",
    "parse_json",
    "rebuild",
    "reconstruct",
    "snapshot_digest",
    "state_of",
    "store_as",
]


SNAPSHOT_EVERY = 16
"""Default of ``ONWARD_CHECKPOINT_SNAPSHOT_EVERY``."""


def snapshot_digest(state: Any) -> str:
    """The chain digest a snapshot's stored ``state`` starts: the sha256 of the state's
    canonical JSON as MACs cover it (``covered_json``: a sealed field as its digest), or an
    artifact reference's own sha256, which names the stored bytes."""
    ref = artifact_ref(state)
    return str(ref["sha256"]) if ref is not None else sha256_hex(covered_json(state))


def chain_digest(parent: str, delta: Any) -> str:
    """The chain digest of a checkpoint stored as ``delta`` from a parent whose chain
    digest is ``parent``: over the delta's canonical JSON as MACs cover it (a sealed value
    as its digest, so the chain stays the same when values are sealed again)."""
    body = covered_json(delta)
    return hashlib.sha256(b"onward-delta\n" + parent.encode() + b"\n" + body).hexdigest()


def copy_json(value: Any) -> Any:
    """A copy of plain JSON ``value`` sharing no container with it (strings, numbers and
    the rest are immutable): what ``json.loads(json.dumps(value))`` gives, at a fraction of
    its cost for a large state."""
    kind = type(value)
    if kind is dict:  # a C copy, then containers replaced: most of a state's values are scalars
        copied = value.copy()
        for key, item in value.items():
            kind = type(item)
            if kind is dict or kind is list:
                copied[key] = copy_json(item)
        return copied
    if kind is list:
        return [copy_json(item) if type(item) is dict or type(item) is list else item
                for item in value]
    return value


def parse_json(body: bytes) -> Any:
    """A stored state's JSON (canonical JSON this module wrote) as Python values: what
    ``json.loads`` gives, parsed by pydantic's JSON parser, which reads a 2 MB state in
    about a third of the time (tests/unit/test_states.py holds the two to the same result).
    Its parser stops at 200 levels of nesting, where a state may nest up to
    ``ONWARD_MAX_JSON_DEPTH`` (at most 500): a deeper one is read by ``json.loads``."""
    try:
        return pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            return _parse_deep(body)
        raise IntegrityViolation(f"a stored state is not JSON ({exc})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_deep(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise IntegrityViolation(f"a stored state is not JSON ({exc})") from None


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1``, ``1.0`` and ``true`` differ (Python's ``==`` says they are equal)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """An RFC 6902 patch that turns ``old`` into ``new`` (both plain JSON)."""
    if type(old) is dict and type(new) is dict:
        ops: list[dict[str, Any]] = [{"op": "remove", "path": f"{path}/{_escape(k)}"}
                                     for k in old if k not in new]
        for key, value in new.items():
            where = f"{path}/{_escape(key)}"
            if key not in old:
                ops.append({"op": "add", "path": where, "value": value})
            else:
                ops.extend(diff(old[key], value, where))
        return ops
    if type(old) is list and type(new) is list:
        ops = []
        for index in range(min(len(old), len(new))):
            ops.extend(diff(old[index], new[index], f"{path}/{index}"))
        ops.extend({"op": "add", "path": f"{path}/-", "value": value}
                   for value in new[len(old):])
        ops.extend({"op": "remove", "path": f"{path}/{index}"}
                   for index in range(len(old) - 1, len(new) - 1, -1))
        return ops
    if _same(old, new):
        return []
    return [{"op": "replace", "path": path, "value": new}]


def _writable(container: Any, owned: dict[int, Any] | None) -> Any:
    """``container`` itself when ``owned`` holds it (a copy this rebuild made, which nothing
    else holds), else a shallow copy of it (recorded in ``owned`` when given)."""
    if owned is not None and id(container) in owned:
        return container
    copied = dict(container) if type(container) is dict else list(container)
    if owned is not None:
        owned[id(copied)] = copied  # kept alive here, so its id names it for the whole rebuild
    return copied


def _apply_op(doc: Any, parts: Sequence[str], op: str, value: Any,
              owned: dict[int, Any] | None = None) -> Any:
    """``doc`` with one operation applied, copying only the containers on its path (once per
    rebuild when ``owned`` is given: ``_writable``)."""
    if not parts:
        if op == "replace":
            return value
        raise ValueError(f"{op} of the whole document")
    head, rest = parts[0], parts[1:]
    if type(doc) is dict:
        copied: Any = _writable(doc, owned)
        if rest:
            copied[head] = _apply_op(doc[head], rest, op, value, owned)
        elif op == "add":
            copied[head] = value
        elif op == "replace":
            if head not in doc:
                raise ValueError(f"replace of a missing member {head!r}")
            copied[head] = value
        else:
            del copied[head]
        return copied
    if type(doc) is list:
        index = len(doc) if head == "-" else int(head)
        if head != "-" and (not head.isdigit() or str(index) != head):
            raise ValueError(f"{head!r} is not an array index")
        if op == "add" and not rest and index > len(doc):
            raise ValueError(f"add at index {index} past the end")
        copied = _writable(doc, owned)
        if rest:
            copied[index] = _apply_op(doc[index], rest, op, value, owned)
        elif op == "add":
            copied.insert(index, value)
        elif op == "replace":
            if index >= len(doc):
                raise ValueError(f"replace of a missing element {index}")
            copied[index] = value
        else:
            del copied[index]
        return copied
    raise ValueError(f"{head!r} is below a value that is not a container")


def _parts(path: Any) -> Sequence[str]:
    """An RFC 6901 pointer's reference tokens (``jsonpointer``'s, without it for the pointers
    ``diff`` writes, which escape nothing)."""
    if type(path) is str and path.startswith("/") and "~" not in path:
        return path.split("/")[1:]
    return jsonpointer.JsonPointer(path).parts


def apply(state: Any, delta: Any, *, owned: dict[int, Any] | None = None) -> Any:
    """``state`` with the patch ``delta`` applied; ``state`` itself is left unchanged (the
    result shares every container the patch does not touch). Raises IntegrityViolation for
    a patch that is not one ``diff`` makes or does not apply.

    ``owned`` (a rebuild's, empty at its start): containers already copied by an earlier
    patch of the same rebuild are changed in place instead of copied again, so a chain of N
    appends to a list of L items costs N + L, not N times L; only the last state of the
    chain may then be used (the ones before it were changed)."""
    if not isinstance(delta, list):
        raise IntegrityViolation("a checkpoint's delta is not a JSON Patch (edited?)")
    try:
        for op in delta:
            kind = op["op"]
            if kind not in ("add", "remove", "replace"):
                raise ValueError(f"operation {kind!r}")
            state = _apply_op(state, _parts(op["path"]), kind, op.get("value"), owned)
    except (KeyError, IndexError, TypeError, ValueError,
            jsonpointer.JsonPointerException) as exc:
        raise IntegrityViolation(
            f"a checkpoint's delta does not apply to its parent's state ({exc}): it was "
            "edited, or a row of its chain is missing") from None
    return state


@dataclass(frozen=True)
class Stored:
    """How a new checkpoint stores its state: ``state`` in full (a snapshot, possibly an
    artifact reference), or ``delta`` from its parent within the chain of ``snapshot_seq``."""

    state: dict[str, Any] | None
    delta: list[dict[str, Any]] | None = None
    snapshot_seq: int | None = None
    chain_bytes: int | None = None  # the deltas' bytes since the snapshot, this one included

    @property
    def is_delta(self) -> bool:
        return self.delta is not None


def store_as(parent: Mapping[str, Any] | None, new: dict[str, Any], state_bytes: int, *,
             snapshot_seq: int | None, chain_bytes: int, seq: int,
             snapshot_every: int) -> Stored:
    """Whether checkpoint ``seq`` (state ``new``, ``state_bytes`` long in canonical JSON)
    stores a delta from ``parent`` (the state of ``seq - 1``, whose chain starts at
    ``snapshot_seq`` with ``chain_bytes`` of deltas) or a snapshot (module docstring)."""
    if parent is None or snapshot_seq is None or snapshot_every <= 1:
        return Stored(new)
    delta = diff(parent, new)
    delta_bytes = len(canonical_json(delta))
    chain = chain_bytes + delta_bytes
    if delta_bytes >= state_bytes:
        return Stored(new)
    if seq - snapshot_seq >= snapshot_every and 4 * chain >= 3 * state_bytes:
        return Stored(new)
    return Stored(None, delta, snapshot_seq, chain)


def _resolved(state: Any, artifact_body: bytes | None) -> Any:
    """A snapshot's state itself: an artifact reference resolved from ``artifact_body``."""
    ref = artifact_ref(state)
    if ref is None:
        return state
    if artifact_body is None or sha256_hex(artifact_body) != ref["sha256"]:
        raise IntegrityViolation(f"the state artifact {ref['sha256'][:12]}… is missing or "
                                 "does not match its hash")
    return parse_json(artifact_body)


def reconstruct(base: Any, deltas: Iterable[Any], *, artifact_body: bytes | None = None) -> Any:
    """The state at the end of a chain: the snapshot's stored state ``base`` (resolved from
    ``artifact_body`` when it is an artifact reference) with ``deltas`` applied in order."""
    return rebuild(base, deltas, artifact_body=artifact_body)[0]


def rebuild(base: Any, deltas: Iterable[Any], *,
            artifact_body: bytes | None = None) -> tuple[Any, str | None]:
    """``reconstruct``, and the chain digest of the state at the end of the chain (None
    when there is no delta: a snapshot signs its state itself)."""
    state = _resolved(base, artifact_body)
    digest: str | None = None
    owned: dict[int, Any] = {}  # only the last state is kept: each container is copied once
    for delta in deltas:
        state = apply(state, delta, owned=owned)
        digest = _next_digest(base, digest, delta)
    return state, digest


def _next_digest(snapshot: Any, parent: str | None, delta: Any) -> str:
    try:
        return chain_digest(parent if parent is not None else snapshot_digest(snapshot), delta)
    except InvalidInput as exc:  # applied, but not JSON a commit could have written
        raise IntegrityViolation(f"a checkpoint's delta is not canonical JSON ({exc}): it "
                                 "was edited") from None


def chain_states(rows: Sequence[Mapping[str, Any]],
                 artifact_bodies: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """``rows`` (one run's checkpoint rows, oldest first) with each delta row's ``state``
    set to its reconstructed state and ``state_chain`` to its chain digest: the form
    ``CheckpointBody.from_row`` signs. A row whose
    state cannot be rebuilt (its chain is broken, a delta does not apply) gets ``state``
    None and ``state_problem`` saying why, and ``state_problem_here`` True on the row
    where the chain broke (a delta that does not apply; not a row after a gap or after
    another such row, whose cause is reported where it is); a snapshot keeps its state as
    stored (an artifact reference stays one)."""
    out: list[dict[str, Any]] = []
    current: Any = None
    snapshot: Any = None  # the stored state of the chain's snapshot
    digest: str | None = None
    problem: str | None = "its chain has no snapshot before it"
    previous_seq: int | None = None
    for source in rows:
        row = dict(source)
        row.setdefault("state_problem", None)
        row["state_chain"] = None
        here = False
        if row.get("state_delta") is None:
            current, problem = _snapshot_state(row, artifact_bodies)
            snapshot, digest = row.get("state"), None
        elif problem is None and previous_seq == row["seq"] - 1:
            try:
                current = apply(current, row["state_delta"])
                digest = _next_digest(snapshot, digest, row["state_delta"])
                row["state"], row["state_chain"] = current, digest
            except IntegrityViolation as exc:
                current, problem, here = None, str(exc), True
        elif problem is None:
            current, problem = None, f"checkpoint {row['seq'] - 1} of its chain is missing"
        if row.get("state_delta") is not None and problem is not None:
            row["state"], row["state_chain"], row["state_problem"] = None, None, problem
        row["state_problem_here"] = here
        previous_seq = row["seq"]
        out.append(row)
    return out


def _snapshot_state(row: Mapping[str, Any],
                    artifact_bodies: Mapping[str, bytes]) -> tuple[Any, str | None]:
    """The state a snapshot row starts a chain with, or why it cannot start one."""
    if row.get("state") is None:
        return None, f"checkpoint {row['seq']}'s state was compacted or removed"
    ref = artifact_ref(row["state"])
    try:
        return _resolved(row["state"], artifact_bodies.get(ref["sha256"]) if ref else None), None
    except IntegrityViolation as exc:
        return None, str(exc)


def needed_artifacts(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sha256 of every snapshot's state artifact some delta row after it builds on."""
    wanted: list[str] = []
    last: str | None = None
    for row in rows:
        if row.get("state_delta") is None:
            ref = artifact_ref(row.get("state"))
            last = ref["sha256"] if ref else None
        elif last is not None and last not in wanted:
            wanted.append(last)
    return wanted


def _artifact_bodies_txn(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    wanted = needed_artifacts(rows)
    if not wanted:
        return {}
    found = conn.execute(sa.select(artifacts.c.sha256, artifacts.c.body)
                         .where(artifacts.c.sha256.in_(wanted))).all()
    return {sha: bytes(body) for sha, body in found}


def checkpoint_rows_txn(conn: Connection, run_id: Any, *,
                        upto: int | None = None) -> list[dict[str, Any]]:
    """The run's checkpoint rows, oldest first (up to seq ``upto``), each with its state
    (``chain_states``): how verify, the corpus and the console read a history."""
    query = sa.select(checkpoints).where(checkpoints.c.run_id == run_id)
    if upto is not None:
        query = query.where(checkpoints.c.seq <= upto)
    rows = [dict(r) for r in conn.execute(query.order_by(checkpoints.c.seq)).mappings()]
    return chain_states(rows, _artifact_bodies_txn(conn, rows))


_CHAIN_START = (sa.select(sa.func.coalesce(checkpoints.c.snapshot_seq, checkpoints.c.seq))
                .where(checkpoints.c.run_id == sa.bindparam("run_id"),
                       checkpoints.c.seq == sa.bindparam("seq"))
                .scalar_subquery())


def checkpoint_row_txn(conn: Connection, run_id: Any, seq: int) -> dict[str, Any] | None:
    """Checkpoint ``seq`` of the run with its state (reconstructed from its chain when it
    is a delta; ``state_problem`` says why when it cannot be), or None if there is none."""
    rows = [dict(r) for r in conn.execute(
        sa.select(checkpoints).where(checkpoints.c.run_id == run_id,
                                     checkpoints.c.seq.between(_CHAIN_START, seq))
        .order_by(checkpoints.c.seq), {"run_id": run_id, "seq": seq}).mappings()]
    if not rows or rows[-1]["seq"] != seq:
        return None
    return chain_states(rows, _artifact_bodies_txn(conn, rows))[-1]


def state_of(row: Mapping[str, Any]) -> Any:
    """A materialized row's state, or IntegrityViolation saying why it has none
    (OperationRefused for a state retention compacted)."""
    if row.get("compacted_mac") is not None:
        raise OperationRefused(
            f"run {row['run_id']}: the state of checkpoint {row['seq']} was compacted by "
            "retention (docs/operating.md#retention): there is nothing to copy or show")
    if row.get("state") is None:
        raise IntegrityViolation(
            f"run {row['run_id']}: the state of checkpoint {row['seq']} cannot be read: "
            f"{row.get('state_problem') or 'it was compacted'}")
    return row["state"]
