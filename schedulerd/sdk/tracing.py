"""The handler's span: with OpenTelemetry configured by the application, each task's
handler runs inside a consumer span `process <queue>` linked to the context its job was
created in (the task's `traceparent`), per OpenTelemetry's messaging conventions: a link,
not a parent, so each run of a repeating job is a trace of its own that points back at
the request that made the job (docs/decisions.md, "Trace context on jobs").

Nothing here imports opentelemetry: an application that configured a TracerProvider has
imported it already, so one that has not is read from sys.modules as "no tracing", and a
worker without the package runs exactly as before."""
from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from schedulerd.sdk.worker import Task

MESSAGING_SYSTEM = "schedulerd"


def _tracer() -> Any:
    """The configured provider's tracer, or None (no opentelemetry imported, or its provider
    is still the default proxy: nothing would be exported)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer("schedulerd.sdk")


@contextlib.contextmanager
def handler_span(task: Task) -> Iterator[Any]:
    """Run the body inside the task's consumer span (current in this thread or task); yields
    the span, or None when tracing is off. An exception out of the body is recorded on it."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    links = []
    if task.traceparent:
        carrier = {"traceparent": task.traceparent}
        if task.tracestate:
            carrier["tracestate"] = task.tracestate
        producer = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
        if producer.is_valid:
            links.append(trace.Link(producer))
    attributes = {"messaging.system": MESSAGING_SYSTEM, "messaging.operation": "process",
                  "messaging.destination.name": task.queue, "messaging.message.id": task.run_id,
                  "schedulerd.job_id": task.job_id, "schedulerd.attempt": task.attempt}
    with tracer.start_as_current_span(f"process {task.queue}", kind=trace.SpanKind.CONSUMER, links=links,
                                      attributes=attributes) as span:
        yield span


def failed(span: Any, reason: str) -> None:
    """Mark a span failed whose handler's failure came back as text (a process handler's nack)."""
    if span is not None:
        from opentelemetry.trace import Status, StatusCode
        span.set_status(Status(StatusCode.ERROR, reason))
