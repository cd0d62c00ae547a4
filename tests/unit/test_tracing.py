"""Trace context from create to handler (schedulerd/tracing.py, schedulerd/sdk/tracing.py):
the W3C header checks, the daemon's spans and the handler's span, recorded by the
OpenTelemetry SDK's in-memory exporter; and nothing of opentelemetry imported unless asked."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest
from multidict import CIMultiDict

from schedulerd import tracing
from schedulerd.sdk import tracing as sdk_tracing
from schedulerd.sdk.worker import Task, Worker, _in_span

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


# -- W3C Trace Context checks ---------------------------------------------------------------

@pytest.mark.parametrize("value, kept", [
    (PARENT, PARENT),
    (f"00-{TRACE_ID}-{PARENT_ID}-00", f"00-{TRACE_ID}-{PARENT_ID}-00"),  # not sampled: still the context
    (f"01-{TRACE_ID}-{PARENT_ID}-01-later-fields", f"01-{TRACE_ID}-{PARENT_ID}-01"),  # a later version's own part
    (f"01-{TRACE_ID}-{PARENT_ID}-01", f"01-{TRACE_ID}-{PARENT_ID}-01"),
    (f"00-{TRACE_ID}-{PARENT_ID}-01-extra", None),  # version 00 is exactly 55 characters
    (f"01-{TRACE_ID}-{PARENT_ID}-01x", None),  # a later version's extra must start with "-"
    (f"ff-{TRACE_ID}-{PARENT_ID}-01", None),  # version ff is invalid
    (f"00-{TRACE_ID.upper()}-{PARENT_ID}-01", None),  # lowercase hex only
    (f"00-{'0' * 32}-{PARENT_ID}-01", None),  # all-zero trace id
    (f"00-{TRACE_ID}-{'0' * 16}-01", None),  # all-zero parent id
    (f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01", None),
    (f"00_{TRACE_ID}_{PARENT_ID}_01", None),
    ("", None), (None, None),
])
def test_traceparent_is_checked_per_w3c(value: str | None, kept: str | None) -> None:
    assert tracing.traceparent(value) == kept


def test_tracestate_is_checked_per_w3c() -> None:
    assert tracing.tracestate(["rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"]) == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert tracing.tracestate(["a=1", "b=2"]) == "a=1,b=2"  # several headers are one list
    assert tracing.tracestate(["a=1,,  ,b=2"]) == "a=1,b=2"  # empty members are allowed and dropped
    assert tracing.tracestate(["tenant@system=v"]) == "tenant@system=v"
    assert tracing.tracestate(["a=1 2 "]) == "a=1 2"  # a space inside a value; around a member, dropped
    members = [f"k{i}=v" for i in range(tracing.TRACESTATE_MEMBERS_MAX)]
    assert tracing.tracestate([",".join(members)]) == ",".join(members)
    assert tracing.tracestate([",".join([*members, "one=more"])]) is None  # over 32 members
    assert tracing.tracestate(["k=" + "v" * 255 + ",l=" + "v" * 255]) is None  # over 512 characters
    for bad in ("Upper=1", "a=1,a=2", "a", "=1", "a=", "a=x=y", "a=1\t2", "a=\u00e9", "1abc=1"):
        assert tracing.tracestate([bad]) is None, bad
    assert tracing.tracestate([]) is None


def test_a_create_keeps_only_a_valid_context() -> None:
    assert tracing.from_headers(CIMultiDict(traceparent=PARENT, tracestate="a=1")) == {
        "traceparent": PARENT, "tracestate": "a=1"}
    assert tracing.from_headers(CIMultiDict(traceparent=PARENT, tracestate="A=1")) == {"traceparent": PARENT}
    # An invalid or repeated traceparent: the context, its tracestate too, is ignored.
    assert tracing.from_headers(CIMultiDict(traceparent="00-nope", tracestate="a=1")) == {}
    assert tracing.from_headers(CIMultiDict([("traceparent", PARENT), ("traceparent", PARENT)])) == {}
    assert tracing.from_headers(CIMultiDict()) == {}


# -- the daemon's spans ---------------------------------------------------------------------

@pytest.fixture
def daemon_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
    assert not tracing.on()


def test_the_create_span_is_a_child_of_the_producers_context(daemon_spans: InMemorySpanExporter) -> None:
    with tracing.create_span({"traceparent": PARENT, "tracestate": "a=1"}, [{"job_id": "j", "queue": "mail"}]):
        pass
    with tracing.create_span({}, [{"job_id": "k"}, {"job_id": "l", "queue": "other"}]):
        pass
    traced, untraced = daemon_spans.get_finished_spans()
    assert traced.name == "create mail" and traced.kind == trace.SpanKind.SERVER
    assert f"{traced.context.trace_id:032x}" == TRACE_ID and f"{traced.parent.span_id:016x}" == PARENT_ID
    assert traced.parent.trace_state.to_header() == "a=1"
    assert dict(traced.attributes) == {"messaging.system": "schedulerd", "messaging.operation": "create",
                                       "messaging.batch.message_count": 1, "messaging.destination.name": "mail",
                                       "schedulerd.job_id": "j"}
    assert untraced.name == "create" and untraced.parent is None  # two queues; a new trace
    assert "messaging.destination.name" not in untraced.attributes


def test_claim_lease_and_ack_spans_link_each_jobs_context(daemon_spans: InMemorySpanExporter) -> None:
    other = f"00-{'a' * 32}-{'b' * 16}-01"
    tracing.record("lease", "receive", "SERVER", [("r1", "q", {"traceparent": PARENT}),
                                                  ("r2", "q", {"traceparent": other, "tracestate": "x=1"}),
                                                  ("r3", "q", None), ("r4", "q", {"traceparent": None})])
    tracing.record("ack", "settle", "SERVER", [("r1", "q", {"traceparent": PARENT})])
    tracing.record("claim", "publish", "INTERNAL", [])  # nothing claimed: no span
    lease, ack = daemon_spans.get_finished_spans()
    assert lease.name == "lease q" and lease.parent is None and lease.kind == trace.SpanKind.SERVER
    assert lease.attributes["messaging.operation"] == "receive"
    assert lease.attributes["messaging.batch.message_count"] == 4
    assert [(f"{link.context.trace_id:032x}", link.attributes["messaging.message.id"]) for link in lease.links] == [
        (TRACE_ID, "r1"), ("a" * 32, "r2")]
    assert ack.name == "ack q" and ack.attributes["messaging.message.id"] == "r1"
    assert f"{ack.links[0].context.span_id:016x}" == PARENT_ID


def test_spans_are_off_until_enabled() -> None:
    assert not tracing.on()
    with tracing.create_span({"traceparent": PARENT}, [{"job_id": "j"}]):
        pass
    tracing.record("lease", "receive", "SERVER", [("r1", "q", {"traceparent": PARENT})])  # no tracer: nothing


@pytest.mark.parametrize("environ, wanted", [
    ({}, False), ({"OTEL_SERVICE_NAME": "s"}, True), ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "s"}, False),
    ({"OTEL_SERVICE_NAME": "s", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),  # where to, but not that: off
])
def test_the_environment_turns_spans_on(environ: dict[str, str], wanted: bool) -> None:
    assert tracing.wanted(environ) is wanted


# -- nothing imported unless asked ----------------------------------------------------------

def _loaded_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    probe = code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                         env=env)
    return {m for m in out.stdout.split() if m == "opentelemetry" or m.startswith("opentelemetry.")}


def test_nothing_of_opentelemetry_is_imported_unless_tracing_is_asked_for() -> None:
    # Installed here (the test extra), and still not loaded by the daemon, its setup without
    # OTEL_* set, or the worker SDK running a handler.
    code = ("import asyncio, schedulerd.main, schedulerd.node, schedulerd.tracing as t\n"
            "from datetime import datetime, timezone\n"
            "from schedulerd.sdk.worker import Task, Worker\n"
            "assert t.setup({}) is False\n"
            "w = Worker(['http://127.0.0.1:1'])\n"
            "w.handler('q')(lambda task: None)\n"
            "now = datetime.now(timezone.utc)\n"
            f"task = Task('r', 'j', 'q', now, 1, 1, 'k', now, None, traceparent={PARENT!r})\n"
            "async def go():\n"
            "    from concurrent.futures import ThreadPoolExecutor\n"
            "    w._executor = ThreadPoolExecutor(1)\n"
            "    assert await w._call(task, 0.0) == ('ack', None)\n"
            "asyncio.run(go())")
    assert _loaded_after(code, env={"PATH": "/usr/bin:/bin"}) == set()


def test_without_the_extra_an_otel_environment_changes_nothing() -> None:
    # opentelemetry made unimportable: setup says no, the node's helpers stay no-ops.
    code = ("import sys\nsys.modules['opentelemetry'] = None\n"
            "import schedulerd.tracing as t\n"
            "assert t.setup({'OTEL_SERVICE_NAME': 'schedulerd'}) is False and not t.on()\n"
            "sys.modules.pop('opentelemetry')")
    assert _loaded_after(code) == set()


# -- the handler's span ---------------------------------------------------------------------

@pytest.fixture
def handler_spans() -> InMemorySpanExporter:
    """An in-memory exporter of this test's own on the global provider, set as an application
    sets it (once a process: another test may have set it already)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    assert sdk_tracing._tracer() is not None
    return exporter


def _task(queue: str, traceparent: str | None = PARENT, tracestate: str | None = "a=1") -> Task:
    now = datetime.now(timezone.utc)
    return Task("run-1", "job-1", queue, now, 2, 7, "job-1:x", now, {}, traceparent=traceparent,
                tracestate=tracestate)


def _check_process_span(span: Any, queue: str, linked: bool = True) -> None:
    assert span.name == f"process {queue}" and span.kind == trace.SpanKind.CONSUMER
    assert dict(span.attributes) == {"messaging.system": "schedulerd", "messaging.operation": "process",
                                     "messaging.destination.name": queue, "messaging.message.id": "run-1",
                                     "schedulerd.job_id": "job-1", "schedulerd.attempt": 2}
    assert span.parent is None  # a link to the producer, not a child of it: each run its own trace
    if linked:
        (link,) = span.links
        assert f"{link.context.trace_id:032x}" == TRACE_ID and f"{link.context.span_id:016x}" == PARENT_ID
        assert link.context.trace_state.to_header() == "a=1"
    else:
        assert not span.links


def test_a_thread_handler_runs_in_its_span(handler_spans: InMemorySpanExporter) -> None:
    inside: list[Any] = []

    def handler(task: Task) -> None:
        inside.append(trace.get_current_span().get_span_context())
        if task.queue == "fails":
            raise RuntimeError("boom")

    thread = threading.Thread(target=_in_span, args=(handler, _task("work")))
    thread.start()
    thread.join()
    with pytest.raises(RuntimeError):
        _in_span(handler, _task("fails", traceparent=None))
    ok, failed = handler_spans.get_finished_spans()
    _check_process_span(ok, "work")
    assert inside[0] == ok.context  # the handler's own spans are children of it
    _check_process_span(failed, "fails", linked=False)
    assert failed.status.status_code == trace.StatusCode.ERROR


def test_an_async_handler_runs_in_its_span(handler_spans: InMemorySpanExporter) -> None:
    worker = Worker(["http://127.0.0.1:1"])
    inside: list[Any] = []

    @worker.handler("async-q")
    async def handler(task: Task) -> dict[str, int]:
        inside.append(trace.get_current_span().get_span_context())
        return {"ok": 1}

    assert asyncio.run(worker._call(_task("async-q"), 0.0)) == ("ack", {"ok": 1})
    (span,) = handler_spans.get_finished_spans()
    _check_process_span(span, "async-q")
    assert inside == [span.context]


def test_a_process_handlers_failure_marks_its_span(handler_spans: InMemorySpanExporter) -> None:
    with sdk_tracing.handler_span(_task("proc")) as span:
        sdk_tracing.failed(span, "timeout: killed")
    (done,) = handler_spans.get_finished_spans()
    assert done.status.status_code == trace.StatusCode.ERROR and done.status.description == "timeout: killed"


@pytest.mark.parametrize("exporter", ["console", "otlp"])
def test_setup_builds_the_exporters_the_environment_names(exporter: str) -> None:
    # OTLP's exporter sends nothing until a span ends; none does here.
    assert tracing.setup({"OTEL_TRACES_EXPORTER": exporter, "OTEL_SERVICE_NAME": "schedulerd-test"})
    try:
        assert tracing.on()
        assert tracing._provider.resource.attributes["service.name"] == "schedulerd-test"
    finally:
        tracing.disable()
    with pytest.raises(ValueError, match="otlp or console"):
        tracing.setup({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not tracing.on()
