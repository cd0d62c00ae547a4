"""schedulerd/labels.py: Kubernetes label syntax, and selectors over it."""
from __future__ import annotations

import pytest

from schedulerd.errors import InvalidJob, InvalidRequest
from schedulerd.labels import check_labels, parse_selector

JOBS = {
    "a": {"team": "billing", "env": "prod", "tier": "web"},
    "b": {"team": "billing", "env": "staging"},
    "c": {"team": "search", "owner": ""},
    "d": {},
}


def selected(text: str) -> list[str]:
    selector = parse_selector(text)
    return sorted(job for job, labels in JOBS.items() if selector.matches(labels))


@pytest.mark.parametrize("text, jobs", [
    ("team=billing", ["a", "b"]),
    ("team==billing,env!=prod", ["b"]),
    ("env!=prod", ["b", "c", "d"]),  # a job without the key matches !=, as in Kubernetes
    ("env in (prod, staging)", ["a", "b"]),
    ("team notin (billing),owner", ["c"]),
    ("!env", ["c", "d"]),
    ("tier", ["a"]),
    ("owner=", ["c"]),
    ("team=billing, tier in (web)", ["a"]),
])
def test_selectors_pick_the_jobs_kubernetes_would(text: str, jobs: list[str]) -> None:
    assert selected(text) == jobs


@pytest.mark.parametrize("text, message", [
    ("", "an empty selector would match every job"),
    ("team=billing,,env=prod", "an empty requirement"),
    ("team=bil ling", "is not one of key=value"),
    ("env in prod", "is not one of key=value"),
    ("-team=x", "label key '-team' must be a name of 1-63 characters"),
    ("team in (a,b c)", "value 'b c' must be empty, or 1-63 characters"),
])
def test_a_selector_that_cannot_be_read_says_why(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_selector(text)
    assert message in str(refused.value)


def test_labels_follow_kubernetes_syntax_and_the_named_limit() -> None:
    assert check_labels({"example.com/tier": "web", "team": "", "a.b_c-d": "X.1"}, 4) == {
        "example.com/tier": "web", "team": "", "a.b_c-d": "X.1"}
    for raw, message in (({"team": 1}, "value 1 must be"), ({"-x": "a"}, "label key '-x'"),
                         ({"x" * 64: "a"}, "must be a name of 1-63"), ({"Example.com/x": "a"}, "label key"),
                         ({"t": "a" * 64}, "must be empty, or 1-63"), (["team"], "labels must be an object"),
                         ({f"k{i}": "v" for i in range(5)}, "at most 4 labels (labels_max); got 5")):
        with pytest.raises(InvalidJob, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_labels(raw, 4)
