"""The OpenAPI document as a contract a generated client can trust: schemathesis,
run as a user of API tooling would (every check, a fixed seed, a bounded number of
examples per operation), against a live node, open and with tokens."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.integration.test_security import token

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 30
# With tokens the same contract is checked with the header added: fewer examples find what
# auth changes (every route still answers as documented) at a third of the time.
EXAMPLES_WITH_TOKENS = 10
SEED = 44
# One at a time: with two, schemathesis's threads build hypothesis strategies at once and
# CPython 3.11 fails in its AST constructor ("recursion depth mismatch").
WORKERS = 1
# Long polls would each hold a worker for long_poll_s_max when no task is due.
NODE_ARGS = ["--limit", "long_poll_s_max=1"]
# Every check runs (the CLI's --checks all would override these lines), except where one says why not.
CONFIG = """
[checks]
enabled = true

[checks.use_after_free]
# DELETE /v1/jobs/{id} cancels: the job stays readable, in state cancelled, by design.
enabled = false

[[operations]]
include-path = ["/v1/jobs", "/v1/jobs:batch", "/v1/jobs/{job_id}"]
include-method = ["POST", "PATCH"]
# A job's schedule and target are judged past what JSON Schema can state (does a cron expression
# ever fire, 1s <= every <= 366d in total, the destination policy): schema-valid may still be 400.
checks.positive_data_acceptance.enabled = false

[[operations]]
include-path = "/v1/preview"
# cron and every are exclusive query parameters, which OpenAPI cannot state (and cron as above).
checks.positive_data_acceptance.enabled = false

[[operations]]
include-path = "/v1/calendars/{name}"
include-method = "PUT"
# Whether a zone name exists in tzdata, which days a month has and that a range does not end
# before it starts are past JSON Schema: schema-valid may still be 400.
checks.positive_data_acceptance.enabled = false

[[operations]]
include-path = "/v1/jobs/{job_id}/occurrences/{time}"
# The time's pattern cannot state which days a month has, nor that an offset moves an instant
# at the range's ends (1970-01-01T00:00:00+01:00) out of it: schema-valid may still be 400.
checks.positive_data_acceptance.enabled = false
"""


def schemathesis(tmp_path: pathlib.Path, url: str, *extra: str, examples: int = EXAMPLES_PER_OPERATION) -> None:
    st = shutil.which("schemathesis") or os.path.join(os.path.dirname(sys.executable), "schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    args = [st, "--config-file", str(config), "--no-color", "run", f"{url}/v1/openapi.json", "--max-examples", str(examples), "--seed", str(SEED), "--workers", str(WORKERS),
            "--generation-database", "none", "--report-dir", str(tmp_path / "report"), *extra]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]


def test_an_open_node_keeps_its_documented_contract(make_cluster, tmp_path: pathlib.Path) -> None:
    node = make_cluster(1, NODE_ARGS).nodes[0]
    schemathesis(tmp_path, node.url)


def test_a_node_with_tokens_keeps_its_documented_contract(make_cluster, tmp_path: pathlib.Path) -> None:
    tokens_file = tmp_path / "tokens.yaml"
    admin = token(tokens_file, "api-tester", "admin")
    node = make_cluster(1, [*NODE_ARGS, "--tokens-file", str(tokens_file)], token=admin).nodes[0]
    schemathesis(tmp_path, node.url, "--header", f"Authorization: Bearer {admin}", examples=EXAMPLES_WITH_TOKENS)
