"""schedulerd/jobspec.py: what a request's options become in an entry."""
from __future__ import annotations

import pytest

from schedulerd.errors import InvalidJob
from schedulerd.jobspec import parse_options
from schedulerd.limits import Limits

NOW = 1_800_000_000_000_000
STORED = {"base_ms": 1000, "factor": 2.0, "max_ms": 300_000}


def test_a_create_completes_a_partial_backoff_from_the_defaults() -> None:
    assert parse_options({"backoff": {"factor": 3}}, NOW, Limits())["backoff"] == \
        {"base_ms": 1000, "factor": 3.0, "max_ms": 300_000}


def test_an_update_sends_only_the_backoff_parts_given() -> None:
    """Apply completes them from the job as stored when the entry applies, so a concurrent
    update of another part is not overwritten with what this node read."""
    assert parse_options({"backoff": {"factor": 3}}, NOW, Limits(), backoff_base=STORED)["backoff"] == {"factor": 3.0}


def test_an_update_is_checked_against_the_backoff_this_node_reads() -> None:
    with pytest.raises(InvalidJob, match=r"backoff.max_ms \(500\) must be at least backoff.base_ms \(1000\)"):
        parse_options({"backoff": {"max_ms": 500}}, NOW, Limits(), backoff_base=STORED)
