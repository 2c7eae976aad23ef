"""OpenTelemetry traces, optional: ``pip install 'onward[otel]'`` and ``ONWARD_OTEL=1``.

One trace per run. It starts where the application called ``start_run`` (a span of its
own, child of whatever span the application has open); its W3C ``traceparent`` is kept on
the run and on each outbox row (``runs.trace_context``, ``outbox.trace_context``), so the
next step's span continues it on whichever worker claims the message, after a broker hop,
a crash, a wait of days or a restart of the whole fleet. Each step attempt is one span
(``<workflow>.<step>``, attributes ``onward.run_id``, ``onward.seq``, ``onward.attempt``,
``onward.workflow``, ``onward.workflow_version``), with a span per model call, read and
effect inside it.

Off (the default, or the extra not installed): every function here returns at its first
line; nothing is imported, no context is stored, and the hot path's statements carry a NULL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from ledger.exceptions import TracingUnavailable
from ledger.settings import TracingSettings

__all__ = [
    "available",
    "current_context",
    "describe_step",
    "disable",
    "enable",
    "enabled",
    "flush",
    "name_run",
    "name_step",
    "requested",
    "span",
    "start_run_span",
    "step_span",
]


_tracer: Any = None  # an opentelemetry Tracer once enabled
_api: Any = None  # the opentelemetry.trace module once enabled
_PROPAGATOR: Any = None


def requested() -> bool:
    """Whether ``ONWARD_OTEL`` asks this process to trace."""
    return TracingSettings().otel


def available() -> None:
    """Refuse to start a process that ONWARD_OTEL asks to trace without the extra."""
    if not requested():
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise TracingUnavailable("ONWARD_OTEL=1 needs the OpenTelemetry SDK and OTLP "
                                 "exporter: pip install 'onward[otel]'") from exc


def disable() -> None:
    """Stop tracing in this process (tests)."""
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def enable(service: str, *, configure: bool = True) -> bool:
    """Turn tracing on in this process if ``ONWARD_OTEL`` asks for it. ``configure``
    (onward's own processes) installs a tracer provider exporting OTLP over HTTP to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` unless the process already has one; an application
    keeps its own provider (``configure=False``)."""
    global _tracer, _api, _PROPAGATOR
    if not requested():
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise TracingUnavailable("ONWARD_OTEL=1 needs OpenTelemetry: "
                                 "pip install 'onward[otel]'") from exc
    if configure:
        _install_provider(trace, service)
    _api, _PROPAGATOR = trace, TraceContextTextMapPropagator()
    _tracer = trace.get_tracer("onward")
    return True


def _install_provider(trace: Any, service: str) -> None:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # the process configured its own
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable("ONWARD_OTEL=1 needs the OpenTelemetry SDK and OTLP "
                                 "exporter: pip install 'onward[otel]'") from exc
    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name,
                                                        "process.pid": os.getpid()}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def flush() -> None:
    """Export what is buffered (before a process exits)."""
    if _api is not None:
        provider = _api.get_tracer_provider()
        if hasattr(provider, "force_flush"):
            provider.force_flush(5000)


def current_context() -> str | None:
    """The W3C traceparent of the span open now, to store with what this span causes."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def start_run_span(workflow: str) -> Iterator[Any]:
    """The root of a run's trace (or a child of the application's open span)."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(f"start_run {workflow}", kind=_api.SpanKind.PRODUCER,
                                       attributes={"onward.workflow": workflow}) as span:
        yield span


def name_run(span: Any, run_id: UUID) -> None:
    """The run id on ``start_run``'s span (a trace backend finds a run's trace by it)."""
    if span is not None:
        span.set_attribute("onward.run_id", str(run_id))


@contextmanager
def step_span(parent: str | None, run_id: UUID | str, seq: int) -> Iterator[Any]:
    """One step attempt, continuing the trace ``parent`` (a traceparent) names."""
    if _tracer is None:
        yield None
        return
    context = _PROPAGATOR.extract({"traceparent": parent}) if parent else None
    with _tracer.start_as_current_span(
            "onward.step", context=context, kind=_api.SpanKind.CONSUMER,
            attributes={"onward.run_id": str(run_id), "onward.seq": seq}) as span:
        yield span


def describe_step(run_id: UUID, seq: int, attempt: int, workflow: str,
                  version: int | None, step: str | None) -> None:
    """Attributes of the step span open now, once the claim says what the step is."""
    if _tracer is None:
        return
    span = _api.get_current_span()
    span.set_attributes({"onward.run_id": str(run_id), "onward.seq": seq,
                         "onward.attempt": attempt, "onward.workflow": workflow,
                         "onward.workflow_version": version if version is not None else 0})
    if step:
        span.update_name(f"{workflow}.{step}")


def name_step(name: str, outcome: str, failed: bool, version: int | None = None) -> None:
    """The step span's final name, outcome (an error status if it did not commit) and the
    workflow version that ran it (a run's first step binds it)."""
    if _tracer is None:
        return
    span = _api.get_current_span()
    span.update_name(name)
    span.set_attribute("onward.outcome", outcome)
    if version is not None:
        span.set_attribute("onward.workflow_version", version)
    if failed:
        span.set_status(_api.Status(_api.StatusCode.ERROR, outcome))


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A child span inside a step (a model call, a read, an effect)."""
    if _tracer is None:
        yield None
        return
    clean = {k: v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, attributes=clean) as opened:
        yield opened
