"""Trace context from create to handler on one real node: a create's traceparent and
tracestate headers come back in each polled task, and a real Worker's handler span links
to the producer's context (schedulerd/tracing.py, schedulerd/sdk/tracing.py)."""
from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

import pytest

from schedulerd.sdk.client import Client
from schedulerd.sdk.worker import Task, Worker
from tests.integration.harness import http, wait_until

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def _post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def _exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the process's provider, set as an application sets it."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_a_creates_trace_context_reaches_the_task_and_the_handlers_span(make_cluster) -> None:
    node = make_cluster(1).nodes[0]
    status, _ = _post(node.url + "/v1/jobs", {"job_id": "traced", "schedule": {"at": "2020-01-01T00:00:00Z"},
                                              "queue": "polled"},
                      {"traceparent": PARENT, "tracestate": "vendor=1, other=2"})
    assert status == 201
    bad = {"job_id": "bad", "schedule": {"at": "2020-01-01T00:00:00Z"}, "queue": "polled"}
    status, _ = _post(node.url + "/v1/jobs:batch", {"jobs": [bad]},
                      {"traceparent": PARENT.upper()})  # invalid: ignored, not refused
    assert status == 200

    tasks: list[dict[str, Any]] = []

    def polled() -> bool:
        _, answer = _post(node.url + "/v1/tasks/poll", {"worker_id": "w", "queues": ["polled"], "max_tasks": 2}, {})
        tasks.extend(answer["tasks"])
        return len(tasks) == 2

    wait_until(polled, 10, "both tasks")
    by_job = {t["job_id"]: t for t in tasks}
    assert by_job["traced"]["traceparent"] == PARENT and by_job["traced"]["tracestate"] == "vendor=1,other=2"
    assert "traceparent" not in by_job["bad"] and "tracestate" not in by_job["bad"]
    # The job shows the context it keeps; a job created without one shows none.
    traced = http("GET", node.url + "/v1/jobs/traced")[1]
    assert (traced["traceparent"], traced["tracestate"]) == (PARENT, "vendor=1,other=2"), traced
    assert "traceparent" not in http("GET", node.url + "/v1/jobs/bad")[1]

    exporter = _exporter()
    seen: list[Task] = []
    worker = Worker(servers=[node.url], concurrency=2, wait_s=1)

    @worker.handler("handled")
    def handle(task: Task) -> None:
        seen.append(task)

    created = Client([node.url]).create_job({"job_id": "worked", "schedule": {"at": "2020-01-01T00:00:00Z"},
                                             "queue": "handled"}, traceparent=PARENT)  # the SDK sends the header
    assert created["traceparent"] == PARENT and "tracestate" not in created
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(seen) and bool(exporter.get_finished_spans()), 20, "the handler's span")
    finally:
        worker.stop()
        thread.join(15)
    assert seen[0].traceparent == PARENT and seen[0].tracestate is None
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "process handled"]
    assert span.kind == trace.SpanKind.CONSUMER and span.attributes["messaging.message.id"] == seen[0].run_id
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [TRACE_ID]
