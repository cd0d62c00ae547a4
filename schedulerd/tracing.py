"""Trace context from create to handler (issue 50): a create's W3C `traceparent` and
`tracestate` headers are stored with the job and delivered in each of its tasks; with the
`otel` extra installed and enabled, the daemon records spans for create, claim, lease and
ack (docs/decisions.md, "Trace context on jobs").

The header checks are pure and always on. OpenTelemetry is imported only by `setup`, and
only when it is installed and the OTEL_* environment asks for traces; until then every
span helper returns at its first line and nothing of opentelemetry is loaded. Spans are
recorded by the node that serves the request or proposes the entry, never in apply (which
runs again on every replica and on replay)."""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
from typing import Any, Iterable, Iterator, Mapping

log = logging.getLogger("schedulerd.tracing")

# W3C Trace Context (https://www.w3.org/TR/trace-context/), section 3.2: version "-"
# trace-id "-" parent-id "-" trace-flags, lowercase hex. A later version may append
# "-" and fields this build does not know: it reads the four it knows.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
TRACEPARENT_CHARS = 55  # version 00's length; the part of a later version this build keeps
_ZERO_TRACE_ID, _ZERO_PARENT_ID = "0" * 32, "0" * 16
# Section 3.3: at most 32 list members, and a header over 512 characters may be dropped.
TRACESTATE_MEMBERS_MAX = 32
TRACESTATE_CHARS_MAX = 512
_KEY_CHARS = r"[a-z0-9_\-*/]"
_TRACESTATE_MEMBER = re.compile(
    rf"(?:[a-z]{_KEY_CHARS}{{0,255}}|[a-z0-9]{_KEY_CHARS}{{0,240}}@[a-z]{_KEY_CHARS}{{0,13}})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])")
FIELDS = ("traceparent", "tracestate")  # the job fields, and the task fields a worker gets


def traceparent(value: str | None) -> str | None:
    """The header's value if it is a valid traceparent (a later version's cut to the fields
    of version 00), else None: W3C says a receiver ignores an invalid one, so does a create."""
    if value is None:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, _ = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE_ID or parent_id == _ZERO_PARENT_ID:
        return None
    rest = value[TRACEPARENT_CHARS:]
    if version == "00" and rest or rest and not rest.startswith("-"):
        return None
    return value[:TRACEPARENT_CHARS]


def tracestate(values: Iterable[str]) -> str | None:
    """The tracestate headers (several are one list, W3C 3.3.1) as one valid value, else None."""
    joined = ",".join(values)
    if not joined or len(joined) > TRACESTATE_CHARS_MAX:
        return None
    members = [m.strip(" \t") for m in joined.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return None
    keys = set()
    for member in members:
        if _TRACESTATE_MEMBER.fullmatch(member) is None:
            return None
        keys.add(member.split("=", 1)[0])
    if len(keys) != len(members):  # a key twice: the list is invalid
        return None
    return ",".join(members)


def from_headers(headers: Any) -> dict[str, str]:
    """A create request's trace context as job fields: none when its traceparent is absent,
    repeated or invalid (tracestate is then ignored too, W3C 3.3)."""
    parents = headers.getall("traceparent", ())
    parent = traceparent(parents[0]) if len(parents) == 1 else None
    if parent is None:
        return {}
    state = tracestate(headers.getall("tracestate", ()))
    return {"traceparent": parent} if state is None else {"traceparent": parent, "tracestate": state}


# --- spans (the `otel` extra) -------------------------------------------------------

_tracer: Any = None  # an opentelemetry Tracer once enabled; None means every helper is a no-op
_provider: Any = None
MESSAGING_SYSTEM = "schedulerd"
DEFAULT_QUEUE = "default"  # a spec without a queue is in it (storage/jobs.SPEC_DEFAULTS)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces: OTEL_SERVICE_NAME or OTEL_TRACES_EXPORTER set
    (not "none"), and OTEL_SDK_DISABLED not "true"."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return exporter != "none" and bool(exporter or environ.get("OTEL_SERVICE_NAME", "").strip())


def setup(environ: Mapping[str, str]) -> bool:
    """Turn spans on if the environment asks and the `otel` extra is installed: a
    TracerProvider whose exporters OTEL_TRACES_EXPORTER names (otlp, the default, or
    console), each configured by the standard OTEL_* variables. True when on."""
    if not wanted(environ):
        return False
    if not _installed():
        log.warning("tracing_off reason=OTEL_* is set but the otel extra is not installed "
                    "(pip install 'schedulerd[otel]')")
        return False
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or "schedulerd"})
    provider = TracerProvider(resource=resource.merge(OTELResourceDetector().detect()))
    for name in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name.strip().lower())))
    enable(provider)
    log.info("tracing_on exporters=%s", environ.get("OTEL_TRACES_EXPORTER") or "otlp")
    return True


def _installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.sdk.trace") is not None
    except ImportError:  # opentelemetry itself missing or blocked
        return False


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if name == "otlp":  # OTLP over HTTP/protobuf; endpoint, headers and timeout from OTEL_EXPORTER_OTLP_*
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    raise ValueError(f"OTEL_TRACES_EXPORTER: this build exports to otlp or console, not {name!r}")


def enable(provider: Any) -> None:
    """Record spans through `provider` (setup's; a test's with an in-memory exporter)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("schedulerd")


def disable() -> None:
    """Flush and stop recording: a node stopping, a test ending."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _context(fields: Any) -> Any:
    """The opentelemetry Context of a stored traceparent/tracestate (a job record or TaskPart)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    carrier = {"traceparent": _field(fields, "traceparent")}
    state = _field(fields, "tracestate")
    if state:
        carrier["tracestate"] = state
    return TraceContextTextMapPropagator().extract(carrier)


def _field(fields: Any, name: str) -> str | None:
    return fields.get(name) if isinstance(fields, dict) else getattr(fields, name, None)


def _link(fields: Any, attributes: dict[str, Any]) -> Any:
    from opentelemetry import trace
    return trace.Link(trace.get_current_span(_context(fields)).get_span_context(), attributes)


@contextlib.contextmanager
def create_span(trace_fields: dict[str, str], specs: list[dict[str, Any]]) -> Iterator[None]:
    """The create request's server span around the proposal of `specs`, a child of the
    producer's context when it sent one."""
    if _tracer is None or not specs:
        yield
        return
    from opentelemetry.trace import SpanKind
    queues = {spec.get("queue", DEFAULT_QUEUE) for spec in specs}
    attributes: dict[str, Any] = {"messaging.system": MESSAGING_SYSTEM, "messaging.operation": "create",
                                  "messaging.batch.message_count": len(specs)}
    if len(queues) == 1:
        attributes["messaging.destination.name"] = next(iter(queues))
    if len(specs) == 1:
        attributes["schedulerd.job_id"] = specs[0]["job_id"]
    name = f"create {next(iter(queues))}" if len(queues) == 1 else "create"
    parent = _context(trace_fields) if trace_fields else None
    with _tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes):
        yield


def record(verb: str, operation: str, kind_name: str, messages: list[tuple[str, str, Any]]) -> None:
    """One span `verb [queue]` for a claim, lease or ack of `messages` (run_id, queue, the
    job's trace fields or None), linked to each job's stored context: the messaging
    conventions link a batch's messages, whose context is the producer's, not this span's
    parent. `operation` is messaging.operation: a claim publishes runs to their queue
    ("publish"), a lease hands them out ("receive"), an ack settles them ("settle")."""
    if _tracer is None or not messages:
        return
    from opentelemetry.trace import SpanKind
    queues = {queue for _, queue, _ in messages}
    attributes: dict[str, Any] = {"messaging.system": MESSAGING_SYSTEM, "messaging.operation": operation,
                                  "messaging.batch.message_count": len(messages)}
    if len(queues) == 1:
        attributes["messaging.destination.name"] = next(iter(queues))
    if len(messages) == 1:
        attributes["messaging.message.id"] = messages[0][0]
    links = [_link(fields, {"messaging.message.id": run_id, "messaging.destination.name": queue})
             for run_id, queue, fields in messages if fields is not None and _field(fields, "traceparent")]
    name = f"{verb} {next(iter(queues))}" if len(queues) == 1 else verb
    _tracer.start_span(name, kind=getattr(SpanKind, kind_name), attributes=attributes, links=links).end()


def on() -> bool:
    """Whether spans are recorded (callers skip gathering what only a span needs)."""
    return _tracer is not None
