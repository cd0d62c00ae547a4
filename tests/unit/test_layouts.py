"""Job and run records stored in their layouts (storage/layouts.py): what apply builds
is stored as an array from entry version 10 on, reads back as the map stored before, and
any record of other keys still round-trips as a map."""
from __future__ import annotations

import hashlib
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedulerd.jobspec import parse_job
from schedulerd.limits import Limits
from schedulerd.storage import claims, codec, ops, queries
from schedulerd.storage.codec import Layouts
from schedulerd.storage.layouts import JOBS, RUNS
from schedulerd.storage.ops import Op
from schedulerd.timefmt import to_iso
from tests.unit.fsm_driver import S, T0, Driver

ARRAY16 = 0xDC
MAP_MARKERS = {*range(0x80, 0x90), 0xDE, 0xDF}
AT = to_iso(T0 + 10 * S)


def _play(d: Driver, version: int) -> None:
    """Jobs as the API builds them (one with an idempotency key, one repeating), each run
    claimed, leased and acked: every record shape a job's life stores."""
    jobs = [parse_job({"job_id": "once", "schedule": {"at": AT}, "queue": "q",
                       "payload": {"n": 1}}, T0, Limits()),
            parse_job({"job_id": "keyed", "schedule": {"at": AT}, "queue": "q",
                       "target": {"kind": "http", "url": "https://example.test/hook"}}, T0, Limits(),
                      idempotency_key="k1"),
            parse_job({"job_id": "cron", "schedule": {"every": "10s"}, "queue": "q"}, T0, Limits())]
    d.apply(Op.CREATE_JOBS, now=T0, jobs=jobs, version=version)
    due = d.due(T0 + 10 * S)
    d.apply(Op.CLAIM_BATCH, now=T0 + 10 * S, grace_us=5 * S, claims=[list(x) for x in due], version=version)
    granted = d.apply(Op.LEASE_BATCH, now=T0 + 11 * S, lease_until=T0 + 41 * S, grants=[["w", d.ready(T0 + 11 * S)]],
                      version=version)["grants"][0][1]
    d.apply(Op.ACK, now=T0 + 12 * S, worker_id="w", acks=[[t["run_id"], t["fence"], '"ok"'] for t in granted],
            version=version)


def _table(d: Driver, name: str) -> dict[bytes, bytes]:
    with d.store.read() as txn, txn.cursor(db=getattr(d.store.tables, name)) as cur:
        return {bytes(k): bytes(v) for k, v in cur}


def test_apply_stores_jobs_and_runs_as_arrays_that_read_back_as_the_maps_stored_before(tmp_path: pathlib.Path) -> None:
    before, now = Driver(str(tmp_path / "v9")), Driver(str(tmp_path / "v10"))
    _play(before, ops.ARRAY_RECORDS_SINCE - 1)
    _play(now, ops.ARRAY_RECORDS_SINCE)
    for name, layouts in (("jobs", JOBS), ("runs", RUNS)):
        maps, arrays = _table(before, name), _table(now, name)
        assert maps.keys() == arrays.keys() and len(arrays) == 3
        for key, raw in arrays.items():
            assert raw[0] == ARRAY16, f"{name} {key!r} was not stored in a layout"
            assert maps[key][0] in MAP_MARKERS
            assert layouts.unpack(raw) == codec.unpack(maps[key])
            assert list(layouts.unpack(raw)) == list(codec.unpack(maps[key]))  # the same key order, too
            assert len(raw) < 0.5 * len(maps[key])
    with now.store.read() as txn:
        parts = queries.task_parts(txn, now.store.tables, ["once", "keyed", "cron"])
    assert parts["once"] == queries.TaskPart('{"n":1}', None)
    assert parts["keyed"].target["url"] == "https://example.test/hook"
    assert parts["cron"] == queries.TaskPart("null", None)


def test_jobs_with_their_retention_are_stored_in_a_layout_too(tmp_path: pathlib.Path) -> None:
    """From entry version 11 a job carries finished_ttl_us, history_ttl_us and
    keep_dead_letters, last of its request's fields: layouts 2 and 3 hold them."""
    d = Driver(str(tmp_path / "v11"))
    _play(d, ops.RETENTION_SINCE)
    for name, layouts in (("jobs", JOBS), ("runs", RUNS)):
        for key, raw in _table(d, name).items():
            assert raw[0] == ARRAY16, f"{name} {key!r} was not stored in a layout"
            assert name == "runs" or layouts.unpack(raw)["keep_dead_letters"] is False


def test_a_job_stored_as_a_map_is_stored_in_its_layout_once_a_newer_entry_changes_it(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path / "d"))
    spec = parse_job({"job_id": "a", "schedule": {"every": "10s"}}, T0, Limits())
    d.apply(Op.CREATE_JOBS, now=T0, jobs=[spec], version=ops.ARRAY_RECORDS_SINCE - 1)
    assert _table(d, "jobs")[b"a"][0] in MAP_MARKERS
    d.apply(Op.PAUSE_JOB, now=T0 + S, job_id="a")
    assert _table(d, "jobs")[b"a"][0] == ARRAY16
    assert d.job("a")["state"] == "paused"


def test_the_first_run_layout_is_the_run_template_of_claims() -> None:
    assert tuple(claims._RUN_TEMPLATE) == RUNS.layouts[0]


# Per kind: how many layouts were released, and a hash of them.
RELEASED = {"jobs": (2, "6baba1cdf7726e377cae84ae8e8b2034cae034ccc45132a1fa80ee14b9e5f905"),
            "runs": (2, "153a5f03c7e5bb8d61d04b5a73c41883df9223b61a32186a751aa8bb4bc0c539")}


def test_released_layouts_never_change() -> None:
    """A layout's number and fields are in every store written since entry version 10:
    a new record shape gets a new layout, appended (then count it here)."""
    for name, layouts in (("jobs", JOBS), ("runs", RUNS)):
        count, fingerprint = RELEASED[name]
        assert hashlib.sha256(repr(layouts.layouts[:count]).encode()).hexdigest() == fingerprint, \
            f"storage/layouts.py changed a released {name} layout: append a new one instead"


LAYOUTS = Layouts("Sample", (("a", "b", "c"), ("a", "b", "c", "d")))
INTS = st.integers(-2**63, 2**64 - 1)  # msgpack's
VALUES = st.none() | st.booleans() | INTS | st.text(max_size=8) | st.binary(max_size=4) \
    | st.lists(INTS, max_size=2) | st.dictionaries(st.text(max_size=3), INTS, max_size=2)


@given(st.dictionaries(st.sampled_from("abcdez"), VALUES))
def test_any_record_reads_back_as_written_keys_order_included(record: dict[str, Any]) -> None:
    raw = LAYOUTS.pack(record)
    assert LAYOUTS.unpack(raw) == record and list(LAYOUTS.unpack(raw)) == list(record)
    in_a_layout = tuple(record) in LAYOUTS.layouts
    assert (raw[0] not in MAP_MARKERS) == in_a_layout


@given(st.permutations("abc"), st.lists(VALUES, min_size=3, max_size=3))
def test_a_record_of_a_layouts_keys_in_another_order_is_stored_as_a_map(order: list[str], values: list[Any]) -> None:
    record = dict(zip(order, values))
    raw = LAYOUTS.pack(record)
    assert (raw[0] in MAP_MARKERS) == (order != ["a", "b", "c"])
    assert LAYOUTS.unpack(raw) == record


def test_layouts_of_one_kind_differ_in_length() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        Layouts("Bad", (("a", "b"), ("b", "a")))


def test_a_run_with_a_catch_up_summary_has_its_own_layout() -> None:
    run = dict(claims._RUN_TEMPLATE, run_id="0-1-0", job_id="a", skipped_count=7, skipped_until_us=T0)
    raw = RUNS.pack(run)
    assert raw[0] == ARRAY16 and RUNS.unpack(raw) == run
