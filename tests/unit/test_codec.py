"""storage/codec.py writes the bytes msgpack-python wrote and reads what it wrote:
stores, journals and snapshots from earlier builds read back unchanged, and
replicas on either build keep byte-identical stores during a rolling upgrade."""
from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from schedulerd.storage import codec, ops
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.model import RunState
from schedulerd.storage.ops import Op

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=40), st.binary(max_size=40))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=6)),
                      max_leaves=40)


@given(VALUES)
def test_writes_the_bytes_msgpack_python_wrote(value: object) -> None:
    assert codec.pack(value) == msgpack.packb(value, use_bin_type=True)


@given(VALUES)
def test_reads_what_msgpack_python_wrote(value: object) -> None:
    assert codec.unpack(msgpack.packb(value, use_bin_type=True)) == value


def test_a_create_entry_and_a_run_record_round_trip_as_before() -> None:
    spec = dict(SPEC_DEFAULTS, job_id="nightly", schedule={"kind": "cron", "expr": "0 2 * * *", "tz": "UTC"},
                schedule_spec={"cron": "0 2 * * *"}, queue="backups", payload_json='{"db": "main"}')
    entry = ops.encode(Op.CREATE_JOBS, {"now": 1_800_000_000_000_000, "jobs": [spec]})
    assert entry == msgpack.packb([int(Op.CREATE_JOBS), ops.VERSION, {"now": 1_800_000_000_000_000, "jobs": [spec]}],
                                  use_bin_type=True)
    assert ops.decode(entry) == (Op.CREATE_JOBS, ops.VERSION, {"now": 1_800_000_000_000_000, "jobs": [spec]})
    run = {"run_id": "0-17-0", "job_id": "nightly", "state": RunState.QUEUED, "fence": 0, "lease_until_us": None}
    assert codec.pack(run) == msgpack.packb(dict(run, state="queued"), use_bin_type=True)
