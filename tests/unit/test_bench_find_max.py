"""bench/scenarios.py find_max: the rate search, and which system each step runs on."""
from __future__ import annotations

import pathlib
from typing import Any

import pytest

from bench import scenarios


def test_search_doubles_while_passing_then_bisects_between_the_last_pass_and_the_first_failure() -> None:
    tried: list[float] = []

    def ok(rate: float) -> bool:
        tried.append(rate)
        return rate <= 9_000

    assert scenarios.search_max(ok, 2_500, 20_000, 3) == 8_750
    assert tried == [2_500, 5_000, 10_000, 7_500, 8_750, 9_380]


def test_search_halves_when_the_first_rate_fails_and_answers_0_when_nothing_passes() -> None:
    assert scenarios.search_max(lambda rate: rate <= 300, 1_000, 20_000, 0) == 250
    assert scenarios.search_max(lambda rate: False, 1_000, 20_000, 3) == 0


class FakeSystem:
    def __init__(self, name: str, run_dir: str, made: list["FakeSystem"]) -> None:
        self.name, self.run_dir, self.up, self.steps = name, run_dir, False, 0
        made.append(self)

    def setup(self) -> None:
        self.up = True

    def teardown(self) -> None:
        self.up = False


@pytest.mark.parametrize("fresh", [False, True])
def test_steps_share_one_system_or_each_get_a_fresh_one_and_every_one_is_torn_down(
        fresh: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakeSystem] = []
    monkeypatch.setattr(scenarios, "make_system", lambda name, opts: FakeSystem(name, opts.run_dir, made))

    def steady_once(system: FakeSystem, rate: float, *_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        assert system.up, "a step ran on a system that is not set up"
        system.steps += 1
        p99 = 0.1 if rate <= 5_000 else 2.0
        return ({"missing": 0, "lateness_p50_s": p99 / 2, "lateness_p99_s": p99, "done_per_s": rate},
                {"box_slowdown": 1.0})

    monkeypatch.setattr(scenarios, "steady_once", steady_once)
    opts = scenarios.Options(str(tmp_path), peers=[])
    report = scenarios.find_max(opts, 2_500, 20_000, 20, 5, 30, 1, fresh_per_step=fresh)
    assert report.raw["best"] == {scenarios.SD: 5_000}
    steps = len(report.raw["steps"][scenarios.SD])  # 2,500, 5,000, 10,000 and the bisect's 7,500
    assert steps == 4
    assert [s.steps for s in made] == ([1] * steps if fresh else [steps])
    assert len({s.run_dir for s in made}) == len(made), "each fresh system has a run dir of its own"
    assert not any(s.up for s in made)
