"""A malformed Raft entry from a peer must fail loudly (FatalApplyError: the node
stops and replays) and never leave a half-applied change in LMDB."""
from __future__ import annotations

import os
import tempfile

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedulerd.storage import fsm, ops
from schedulerd.storage.jobs import SPEC_DEFAULTS
from schedulerd.storage.ops import Op
from schedulerd.storage.tables import DB_NAMES
from tests.unit.fsm_driver import S, T0, Driver

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=20), st.binary(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)
FIELDS = ["now", "jobs", "claims", "grants", "acks", "leases", "runs", "job_id", "run_id", "fence", "worker_id",
          "error", "changes", "lease_until", "grace_us"]
PAYLOADS = st.one_of(VALUES, st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6))
ENTRIES = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda op, payload: msgpack.packb([op, ops.VERSION, payload], use_bin_type=True),
              st.sampled_from([int(op) for op in Op]), PAYLOADS),
    st.builds(lambda op, version, payload: msgpack.packb([op, version, payload], use_bin_type=True),
              st.integers(-5, 300), st.integers(-2, 5), PAYLOADS),
)


def seeded(path: str) -> Driver:
    d = Driver(path)
    spec = dict(SPEC_DEFAULTS, job_id="a", schedule={"kind": "every", "every_us": 60 * S}, schedule_spec={},
                queue="q", payload_json="{}")
    d.apply(Op.CREATE_JOBS, now=T0, jobs=[spec])
    (run_id,) = d.apply(Op.CLAIM_BATCH, now=T0 + 60 * S, claims=[["a", T0 + 60 * S]])["runs"]
    d.apply(Op.LEASE_BATCH, now=T0 + 60 * S, lease_until=T0 + 90 * S, grants=[["w", [run_id]]])
    return d


@settings(max_examples=int(os.environ.get("SCHEDULERD_FUZZ_EXAMPLES", 200)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blob=ENTRIES)
def test_a_malformed_entry_fails_loudly_or_applies_whole(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = seeded(tmp)
        before = d.digest()
        d.index += 1
        try:
            fsm.apply(d.store, d.index, blob)
        except fsm.FatalApplyError:
            d.store.abort_applied()
            assert d.digest() == before, "a failed entry left changes behind"
            return
        d.store.commit_applied()
        # Applied: it was a well-formed command this build understands; the store still reads.
        with d.store.read() as txn:
            for name in DB_NAMES:
                txn.stat(getattr(d.store.tables, name))
