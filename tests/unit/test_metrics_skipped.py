"""schedulerd_runs_skipped_total counts every skipped record apply makes, whichever
command makes it: a claim's, and from entry version 9 a pause's and a PATCH's."""
from __future__ import annotations

import pathlib
from types import SimpleNamespace

from schedulerd.metrics import Metrics
from schedulerd.storage.model import SKIP_REASONS
from schedulerd.storage.ops import Op
from tests.unit.fsm_driver import S, T0, Driver


def test_skips_made_by_a_pause_and_a_patch_are_counted_by_reason(tmp_path: pathlib.Path) -> None:
    d = Driver(str(tmp_path / "db"))
    metrics = Metrics(SimpleNamespace(), lambda: 0)  # on_applied reads only the entry's result
    every5 = {"kind": "every", "every_us": 5 * S, "anchor_us": T0}
    d.create("p", every5, catchup_limit=2)
    d.create("u", every5)
    for op, payload in ((Op.PAUSE_JOB, {"job_id": "p"}),
                        (Op.UPDATE_JOB, {"job_id": "u", "changes": {"schedule": {"kind": "every", "every_us": S}}}),
                        (Op.UPDATE_JOB, {"job_id": "nope", "changes": {}})):
        metrics.on_applied(op, d.apply(op, now=T0 + 21 * S, **payload))
    counted = {s.labels["reason"]: s.value for f in metrics.skipped.collect() for s in f.samples
               if s.name.endswith("_total")}
    assert {reason: n for reason, n in counted.items() if n} == {"paused": 2, "catchup_limit": 1, "rescheduled": 4}
    assert set(counted) == {r.value for r in SKIP_REASONS}  # every reason's series exists from the start
    assert sum(r["state"] == "skipped" for job in ("p", "u") for r in d.runs(job)) == 7


def test_the_operations_guide_lists_exactly_the_skip_reasons() -> None:
    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    (row,) = [line for line in guide.splitlines() if line.startswith("| `schedulerd_runs_skipped_total{reason}`")]
    listed = row.split("by reason:")[1].strip(" |").split(", ")
    assert listed == [r.value for r in SKIP_REASONS]
