"""bench --queue-max-*: the options, the PUT on the bench's queue (409 retried until a
deadline), and the lease rate a spike reads once the bucket's burst is spent."""
from __future__ import annotations

import math
import pathlib
from typing import Any

import pytest

from bench import __main__ as cli
from bench import sd
from bench.common import BenchError, Record
from bench.scenarios import starts_per_s_after_burst


def test_spike_and_steady_take_the_limits_and_nothing_given_means_no_limit() -> None:
    a = cli.parse_args(["spike", "--jobs", "20000", "--queue-max-starts-per-s", "2000"])
    assert cli.queue_limits(a) == sd.QueueLimits(None, 2000.0)
    a = cli.parse_args(["steady", "--queue-max-running", "1000000", "--queue-max-starts-per-s", "1000000"])
    assert cli.queue_limits(a) == sd.QueueLimits(1_000_000, 1_000_000.0)
    assert cli.queue_limits(cli.parse_args(["spike"])) is None
    assert str(sd.QueueLimits(None, 2000.0)) == "queue 'bench' limits: max_running none, max_starts_per_s 2,000"


def test_limits_are_refused_with_peers_they_would_not_bind() -> None:
    a = cli.parse_args(["spike", "--queue-max-running", "10", "--peers", "celery"])
    with pytest.raises(BenchError, match="without --peers"):
        cli.queue_limits(a)


def _system(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, answers: list[int]) -> list[Any]:
    """An SdSystem whose PUTs get `answers` in turn (the last one repeated); returns the PUTs."""
    sent: list[Any] = []

    def http_json(method: str, url: str, body: Any = None, timeout_s: float = 5.0) -> tuple[int, Any]:
        sent.append((method, url.rpartition(":")[2].partition("/")[2], body))
        status = answers[min(len(sent), len(answers)) - 1]
        return status, {"max_running": body["max_running"]} if status == 200 else {"error": "x"}

    monkeypatch.setattr(sd, "http_json", http_json)
    monkeypatch.setattr(sd.time, "sleep", lambda s: None)
    return sent


def test_a_409_is_retried_until_the_cluster_takes_the_limits(tmp_path: pathlib.Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _system(tmp_path, monkeypatch, [409, 409, 200])
    answer = sd.SdSystem(str(tmp_path)).limit_queue(sd.QueueLimits(1_000_000, 1_000_000.0))
    assert answer == {"max_running": 1_000_000}
    assert sent == [("PUT", "v1/queues/bench", {"max_running": 1_000_000, "max_starts_per_s": 1_000_000.0})] * 3


@pytest.mark.parametrize("answers, timeout_s", [([400], 30.0), ([409], 0.0)])
def test_another_refusal_or_a_409_past_the_deadline_fails_the_run(
        answers: list[int], timeout_s: float, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _system(tmp_path, monkeypatch, answers)
    with pytest.raises(BenchError, match=f"HTTP {answers[0]}"):
        sd.SdSystem(str(tmp_path)).limit_queue(sd.QueueLimits(max_running=5), timeout_s)
    assert len(sent) == 1


def test_the_rate_after_the_burst_is_the_buckets_not_the_bursts() -> None:
    burst = [Record(f"b{k}", 0.0, 0.001 * k, 1.0) for k in range(100)]  # 100 starts within 0.1 s
    paced = [Record(f"p{k}", 0.0, 0.1 + k / 100, 1.0) for k in range(400)]  # then 100/s
    assert starts_per_s_after_burst(burst + paced, 100) == pytest.approx(100, rel=0.01)
    assert math.isnan(starts_per_s_after_burst(burst, 100))
