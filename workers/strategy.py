"""The step task's message strategy: Celery's own, behind a check of the message's shape.

Celery's consumer unpacks a task message's body (``[args, kwargs, embed]`` in protocol 2,
``{"args", "kwargs", ...}`` in protocol 1) without checking it; a JSON body of another
shape under a ``task`` header (a string, a number, a two-element list) raised from the
consumer itself, and Celery 5 treats that as "Unrecoverable error": the whole worker
stopped, whatever steps it was running. A body over ``MAX_STEP_MESSAGE_BYTES`` is refused
before it is decoded; a header Celery reads without checking its type (``timelimit: [1]``,
on which it raised as it handed the request to the pool) is refused the same way. The check
raises ``InvalidTaskError`` instead, which the consumer logs ("Received invalid task message:
malformed step message ...") and answers by dropping that one message; the ledger is
untouched and the worker goes on (the outbox re-sends a step whose message is lost, so
dropping one is always safe).

Every check is made before Celery's handling starts, on the message alone. Nothing around
Celery's handling is caught: an exception it raises on a message that passed the checks is a
bug (in Celery, the pool or onward), not a malformed message, and it propagates as Celery
meant it to, instead of being logged as a refused message while the bug goes unseen.
Selected with the task's ``Strategy`` option (``workers/app.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.strategy import default

__all__ = ["MAX_STEP_MESSAGE_BYTES", "header_problem", "message_shape_problem", "step_strategy"]

MAX_STEP_MESSAGE_BYTES = 64 * 1024
"""The largest step message body a worker decodes: one names a run and a seq (about 150
bytes as the outbox sends it); anything larger is refused unread."""


def step_strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """Celery's default strategy for ``task``, refusing a message of the wrong shape."""
    handle: Callable[..., Any] = default(task, app, consumer, **kwargs)

    def checked(message: Any, body: Any, *args: Any, **more: Any) -> Any:
        size = len(message.body or b"")
        if size > MAX_STEP_MESSAGE_BYTES:  # refused before it is decoded
            raise InvalidTaskError(
                f"malformed step message: its body is {size} bytes, over the "
                f"{MAX_STEP_MESSAGE_BYTES} a step message may have (it names a run and a seq)")
        # body is None for protocol 2 (decoded here, as the default strategy would: a
        # content type outside accept_content raises ContentDisallowed, refused as before)
        payload = message.payload if body is None else body
        problem = message_shape_problem(payload) or header_problem(
            _headers_read(payload, message.headers))
        if problem is not None:
            raise InvalidTaskError(f"malformed step message: {problem}")
        return handle(message, body, *args, **more)

    return checked


def _headers_read(payload: Any, headers: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The headers Celery's request reads: the message's (protocol 2), or a protocol 1 or
    hybrid body's fields with the message's headers over them (``hybrid_to_proto2``)."""
    if isinstance(payload, dict):
        return {**payload, **(headers or {})}
    return headers or {}


_TEXT = (str, type(None))
_OPTIONAL_TEXT = ("shadow", "root_id", "parent_id", "group", "origin", "lang", "argsrepr",
                  "kwargsrepr", "eta", "expires")
"""Headers Celery reads as text when present (eta and expires: parsed by Celery, which
refuses a bad date itself)."""
_MAX_TIME_LIMIT_S = 2.0**31
"""Beyond this, a time limit overflows the pool's timers; a step's are minutes."""


def header_problem(headers: Mapping[str, Any]) -> str | None:
    """Why Celery cannot read ``headers`` (a task message's, protocol 2), or None: the
    headers its request reads without checking them (``celery.worker.request.Request``:
    id, task, timelimit, ignore_result, retries ...), each of the type it assumes."""
    for name in ("id", "task"):
        if not isinstance(headers.get(name), str) or not headers[name]:
            return f"its {name} header must be a non-empty string, not {headers.get(name)!r:.80}"
    for name in _OPTIONAL_TEXT:
        if not isinstance(headers.get(name), _TEXT):
            return (f"its {name} header must be a string, not "
                    f"{type(headers[name]).__name__} {headers[name]!r:.80}")
    problem = _time_limits_problem(headers.get("timelimit"))
    if problem is not None:
        return problem
    if not isinstance(headers.get("ignore_result"), (bool, type(None))):
        return ("its ignore_result header must be true or false, not "
                f"{headers['ignore_result']!r:.80}")
    for name in ("retries", "replaced_task_nesting", "group_index"):
        value = headers.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value < 2**31):
            return f"its {name} header must be a small non-negative integer, not {value!r:.80}"
    for name, kind in (("groups", list), ("stamped_headers", list), ("stamps", dict)):
        if not isinstance(headers.get(name), (kind, type(None))):
            return f"its {name} header must be a JSON {kind.__name__}, not {headers[name]!r:.80}"
    return None


def _time_limits_problem(limits: Any) -> str | None:
    """A ``timelimit`` header is absent, or [hard, soft] with each null or a number of
    seconds the pool's timers can hold."""
    if limits is None:
        return None
    if not isinstance(limits, (list, tuple)) or len(limits) != 2:
        return f"its timelimit header must be [hard, soft], not {limits!r:.80}"
    for limit in limits:
        if limit is None:
            continue
        if (isinstance(limit, bool) or not isinstance(limit, (int, float))
                or not math.isfinite(limit) or not 0 <= limit <= _MAX_TIME_LIMIT_S):
            return (f"its timelimit header must hold null or seconds (0 to "
                    f"{_MAX_TIME_LIMIT_S:.0f}), not {limit!r:.80}")
    return None


def message_shape_problem(payload: Any) -> str | None:
    """Why ``payload`` (a decoded task message body) is not one Celery can unpack, or None."""
    if isinstance(payload, dict):  # protocol 1 (or a hybrid with protocol 2 headers)
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    elif isinstance(payload, (list, tuple)) and len(payload) == 3:
        args, kwargs, embed = payload
        if embed is not None and not isinstance(embed, dict):
            return f"its options must be a JSON object, not {type(embed).__name__}"
    else:
        return (f"the body is {type(payload).__name__} {repr(payload)[:80]}, not "
                "[args, kwargs, options]")
    if not isinstance(args, (list, tuple)):
        return f"its args must be a JSON array, not {type(args).__name__}"
    if args:
        return f"onward.step takes keyword arguments only (run_id, seq), got {len(args)} args"
    if not isinstance(kwargs, dict):
        return f"its kwargs must be a JSON object, not {type(kwargs).__name__}"
    return None
