"""metrics.BulkHistogram exposes what prometheus_client's Histogram would for the same values,
one series per label value."""
from __future__ import annotations

from hypothesis import given, strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from schedulerd.metrics import LATENESS_BUCKETS_S, BulkHistogram

NAME = "schedulerd_dispatch_lateness_seconds"


def exposition(values_per_entry: list[list[float]], bulk: bool) -> list[str]:
    registry = CollectorRegistry()
    if bulk:
        histogram = BulkHistogram(NAME, "doc", LATENESS_BUCKETS_S, "queue")
        registry.register(histogram)
        for i, values in enumerate(values_per_entry):
            histogram.observe_many(values, f"q{i % 2}")
    else:
        reference = Histogram(NAME, "doc", ["queue"], buckets=LATENESS_BUCKETS_S, registry=registry)
        for i, values in enumerate(values_per_entry):
            for v in values:
                reference.labels(f"q{i % 2}").observe(v)
    # Sorted: the reference lists its series in the order they were first observed.
    return sorted(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


# Bucket bounds themselves are drawn often: a value equal to a bound counts in that bound's bucket.
VALUES = st.one_of(st.sampled_from(LATENESS_BUCKETS_S), st.floats(0, 400, allow_nan=False),
                   st.integers(0, 10**7).map(lambda us: us / 1_000_000))


@given(st.lists(st.lists(VALUES, max_size=20), max_size=8))
def test_bulk_histogram_matches_prometheus_client(values_per_entry: list[list[float]]) -> None:
    assert exposition(values_per_entry, bulk=True) == exposition(values_per_entry, bulk=False)
