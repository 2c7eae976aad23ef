"""Logging shared by every onward process (worker, dispatcher, reaper, metrics, console).

structlog for onward's own events; the standard library's records (Celery, kombu, uvicorn,
warnings) go through the same processors. With ``ONWARD_LOG_JSON=1`` every line a process
writes is one JSON object: ``event``, ``level``, ``logger``, ``timestamp``, ``pid``, and
``run_id``, ``seq``, ``attempt``, ``effect_id`` where they apply (bound with structlog's
context variables, so Celery's own lines about a step carry them too); exceptions are
rendered into the object, never as loose traceback lines. Without it, lines are for people.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from tasks.credentials import RedactingFilter, redact_event
from workers.settings import LogSettings

__all__ = ["bind_step", "configure_logging", "json_logs", "unbind_step"]


def json_logs() -> bool:
    """Whether ``ONWARD_LOG_JSON`` asks for one JSON object per line."""
    return LogSettings().log_json


def _add_pid(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    event_dict.setdefault("pid", os.getpid())
    return event_dict


def _shared() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_pid,
        redact_event,  # no resolved tool credential in any line (docs/security.md)
    ]


def configure_logging(level: str | None = None, *, capture_stdout: bool = False) -> None:
    """Set up logging for this process. ``capture_stdout`` (workers) also turns what step
    code prints into log records, so in JSON mode no loose line reaches the output."""
    level_name = (level or LogSettings().log_level).upper()
    numeric = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    if not json_logs():
        _configure_console(numeric)
        return
    stream: TextIO = sys.__stderr__ or sys.stderr
    structlog.configure(
        processors=[*_shared(), structlog.processors.dict_tracebacks,
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared(), structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.dict_tracebacks,
                    structlog.processors.JSONRenderer()],
    ))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    logging.captureWarnings(True)
    _keep_celery_off_logging()
    if capture_stdout:
        _capture_stdout()


def _configure_console(numeric: int) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_event,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())


def _keep_celery_off_logging() -> None:
    """A receiver of Celery's ``setup_logging`` signal makes Celery leave logging alone in
    the worker and its pool children: no handler of its own, no plain-text formatter."""
    from celery import signals

    signals.setup_logging.connect(_logging_is_set_up, weak=False)


def _logging_is_set_up(**_kwargs: Any) -> None:
    """Logging was configured by onward (workers/logs.py)."""


def _capture_stdout() -> None:
    from celery.apps import worker as celery_worker
    from celery.utils.log import LoggingProxy

    sys.stdout = LoggingProxy(logging.getLogger("onward.stdout"), logging.INFO)
    sys.stderr = LoggingProxy(logging.getLogger("onward.stderr"), logging.WARNING)
    # Celery writes its shutdown notices straight to the file descriptor (it may be in a
    # signal handler): write them there too, as JSON.
    celery_worker.safe_say = _say_json


def _say_json(message: str, f: TextIO | None = None) -> None:
    """Celery's ``safe_say`` in JSON mode: one object, written with ``os.write``."""
    stream = f or sys.__stderr__
    if stream is None:
        return
    record = {"event": message.strip(), "level": "warning", "logger": "celery.apps.worker",
              "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
              "pid": os.getpid()}
    with contextlib.suppress(OSError, ValueError):
        os.write(stream.fileno(), (json.dumps(record) + "\n").encode())


def bind_step(run_id: object, seq: int, attempt: int | None = None) -> None:
    """Bind the step a process is on to every log line it writes until ``unbind_step``."""
    structlog.contextvars.bind_contextvars(run_id=str(run_id), seq=seq)
    if attempt is not None:
        structlog.contextvars.bind_contextvars(attempt=attempt)
    else:
        structlog.contextvars.unbind_contextvars("attempt")


def unbind_step() -> None:
    structlog.contextvars.unbind_contextvars("run_id", "seq", "attempt", "effect_id",
                                             "task_id")
