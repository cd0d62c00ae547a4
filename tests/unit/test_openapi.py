"""The OpenAPI document cannot drift from the handlers: every route the app
serves is described, nothing else is, and the job schemas use jobspec's fields."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from schedulerd.api import app as api
from schedulerd.api import openapi, preview
from schedulerd.errors import InvalidJob
from schedulerd.jobspec import CREATE_FIELDS, OPTION_FIELDS, RANGES, parse_options
from schedulerd.limits import Limits
from schedulerd.api.openapi_schemas import job_create, job_patch


def stub_node() -> SimpleNamespace:
    """Enough of a Node to build the app; no request in these tests reaches Raft."""
    return SimpleNamespace(config=SimpleNamespace(limits=Limits(), lease_s=30.0, http_host="127.0.0.1",
                                                  allowed_hosts=(), allowed_origins=()),
                           groups=[], applied_listeners=[], group_listeners=[],
                           propose=None, clock=None)


def served_routes() -> set[tuple[str, str]]:
    app = api.make_app(stub_node(), leases=None)  # type: ignore[arg-type]
    return {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
            if route.method != "HEAD"}


def test_every_served_route_is_described_and_nothing_else() -> None:
    described = {(method, path) for path, ops in openapi.operations(Limits()).items() for method in ops}
    assert served_routes() - described == set(), "routes without an OpenAPI description"
    assert described - served_routes() == set(), "described routes the app does not serve"


def test_job_schemas_are_built_from_jobspec_fields() -> None:
    assert set(job_create(Limits())["properties"]) == CREATE_FIELDS
    assert set(job_patch(Limits())["properties"]) == OPTION_FIELDS


def test_preview_parameters_are_the_ones_the_handler_accepts() -> None:
    params = openapi.operations(Limits())["/v1/preview"]["get"]["parameters"]
    assert {p["name"] for p in params} == preview.QUERY_PARAMS


def test_path_parameters_match_the_placeholders() -> None:
    for path, ops in openapi.operations(Limits()).items():
        for method, op in ops.items():
            in_path = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            placeholders = {part[1:-1] for part in path.split("/") if part.startswith("{")}
            assert in_path == placeholders, f"{method.upper()} {path}"
            assert op["summary"] and op["responses"], f"{method.upper()} {path}"


def test_the_document_is_served() -> None:
    async def go() -> dict:
        async with TestClient(TestServer(api.make_app(stub_node(), leases=None))) as client:  # type: ignore[arg-type]
            resp = await client.get("/v1/openapi.json")
            assert resp.status == 200
            return await resp.json()

    doc = asyncio.run(go())
    assert doc["openapi"] == "3.1.0" and "/v1/jobs/{job_id}/runs" in doc["paths"]


def _option_schema(option: str) -> dict:
    name, _, part = option.partition(".")
    schema = job_create(Limits())["properties"][name]
    return schema["properties"][part] if part else schema


def _raw(option: str, value: float) -> dict:
    """The option alone; a backoff part beside the other part's value that allows it (max_ms >= base_ms)."""
    name, _, part = option.partition(".")
    if not part:
        return {name: value}
    room = {"base_ms": {"max_ms": RANGES["backoff.max_ms"][1]}, "max_ms": {"base_ms": 1}}.get(part, {})
    return {name: {part: value, **room}}


@pytest.mark.parametrize("option", sorted(RANGES))
def test_each_numeric_option_is_described_with_the_range_the_api_allows(option: str) -> None:
    low, high = RANGES[option]
    schema = _option_schema(option)
    assert (schema["minimum"], schema["maximum"]) == (low, high)
    parse_options(_raw(option, low), 0, Limits())
    parse_options(_raw(option, high), 0, Limits())
    for outside in (low - 1, high + 1):
        with pytest.raises(InvalidJob):
            parse_options(_raw(option, outside), 0, Limits())


def test_the_document_follows_the_nodes_limits_and_tokens() -> None:
    limits = Limits().overridden(["long_poll_s_max=2", "page_size_max=50"])
    doc = openapi.document("1", limits, tokens=True)
    poll = doc["paths"]["/v1/tasks/poll"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert poll["properties"]["wait_s"]["maximum"] == 2
    assert doc["security"] == [{"bearer": []}] and doc["paths"]["/healthz"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/v1/jobs"]["get"], "the document's bearer scheme applies"
    open_doc = openapi.document("1", Limits(), tokens=False)
    assert "security" not in open_doc and "components" not in open_doc

