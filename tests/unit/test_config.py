"""Daemon configuration checks that tie limits to what Raft can carry."""
from __future__ import annotations

import dataclasses

import pytest

from schedulerd.config import NodeConfig
from schedulerd.limits import Limits
from schedulerd.raft.conf import RaftConfig


def config(**limits: int) -> NodeConfig:
    return NodeConfig(raft=RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x"),
                      limits=dataclasses.replace(Limits(), **limits))


def test_the_defaults_fit_in_one_raft_entry() -> None:
    config().validate()


@pytest.mark.parametrize("limits", [{"request_bytes_max": 3 << 20}, {"ack_weight_bytes": 16 << 10}])
def test_limits_that_could_build_an_entry_over_entry_bytes_max_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="entry_bytes_max"):
        config(**limits).validate()


def test_a_raft_entry_size_below_64_kib_is_refused() -> None:
    with pytest.raises(ValueError, match="entry_bytes_max must be at least 64 KiB"):
        RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x", entry_bytes_max=1024).validate()


def test_lookahead_may_exceed_the_misfire_grace_but_each_stays_in_range() -> None:
    assert config().lookahead_s > config().misfire_grace_s  # the defaults: 12 s ahead, 5 s late
    for field, value, message in (("misfire_grace_s", 0.0, "misfire_grace_s must be more than 0"),
                                  ("lookahead_s", 61.0, "lookahead_s must be within 0..60")):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(config(), **{field: value}).validate()


@pytest.mark.parametrize("limits, message", [
    ({"lease_entry_runs_max": 499}, "lease_entry_runs_max must hold at least one poll"),
    ({"ack_entry_weight_max": 499}, "ack_entry_weight_max must hold at least one batch"),
])
def test_an_entry_limit_below_its_request_limit_is_refused(limits: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**limits).validate()



def test_a_tuned_process_collects_cycles_less_often_and_skips_what_start_up_built() -> None:
    import gc

    from schedulerd import gctune

    before = gc.get_threshold()
    try:
        gctune.tune_gc(50_000)
        assert gc.get_threshold() == (50_000, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_tune_gc_refuses_a_young_generation_outside_its_range_and_changes_nothing() -> None:
    import gc

    from schedulerd import gctune

    before = gc.get_threshold()
    with pytest.raises(ValueError, match="700..1000000"):
        gctune.tune_gc(10)
    assert gc.get_threshold() == before


def test_reconnect_must_come_before_an_election_timeout() -> None:
    with pytest.raises(ValueError, match="reconnect_s must be above 0 and below election_timeout_s_min"):
        RaftConfig(self_addr="127.0.0.1:7000", data_dir="/tmp/x", reconnect_s=0.5).validate()




@pytest.mark.parametrize("settings, message", [
    (["nope=1"], "NAME one of"), (["page_size_max"], "expected NAME=VALUE"),
    (["page_size_max=ten"], "expected an integer"), (["long_poll_s_max=x"], "expected a number"),
])
def test_a_bad_limit_setting_names_what_is_allowed(settings: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Limits().overridden(settings)
