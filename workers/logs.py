"""structlog setup shared by every onward process: one line per event, run id and seq bound."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure_logging(level: str | None = None) -> None:
    level_name = (level or os.environ.get("ONWARD_LOG_LEVEL", "INFO")).upper()
    numeric = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    renderer: structlog.typing.Processor
    if os.environ.get("ONWARD_LOG_JSON", "").lower() in ("1", "true", "yes"):
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
