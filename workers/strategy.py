"""The step task's message strategy: Celery's own, behind a check of the message's shape.

Celery's consumer unpacks a task message's body (``[args, kwargs, embed]`` in protocol 2,
``{"args", "kwargs", ...}`` in protocol 1) without checking it; a JSON body of another
shape under a ``task`` header (a string, a number, a two-element list) raised from the
consumer itself, and Celery 5 treats that as "Unrecoverable error": the whole worker
stopped, whatever steps it was running. A body over ``MAX_STEP_MESSAGE_BYTES`` is refused
before it is decoded; a header of the wrong type (``timelimit: [1]``), on which Celery
raises as it builds or hands over the request, is refused the same way. The check raises
``InvalidTaskError`` instead, which the consumer logs ("Received invalid task message:
malformed step message ...") and answers by dropping that one message; the ledger is
untouched and the worker goes on.
Selected with the task's ``Strategy`` option (``workers/app.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.strategy import default

__all__ = ["MAX_STEP_MESSAGE_BYTES", "message_shape_problem", "step_strategy"]

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
        problem = message_shape_problem(message.payload if body is None else body)
        if problem is not None:
            raise InvalidTaskError(f"malformed step message: {problem}")
        try:
            return handle(message, body, *args, **more)
        except MALFORMED_HEADERS as exc:
            # a header Celery reads without checking it (timelimit [1], a number for a
            # string...): the message is dropped, never the worker; the outbox re-sends a
            # step whose message is lost, so dropping one is always safe
            raise InvalidTaskError(
                f"malformed step message: Celery could not read its headers "
                f"({type(exc).__name__}: {str(exc)[:200]})") from exc

    return checked


MALFORMED_HEADERS = (TypeError, ValueError, KeyError, AttributeError, OverflowError)
"""What Celery's own handling raises on a header of the wrong type or shape."""


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
