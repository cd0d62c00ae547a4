"""--log-format json: the event name and its key=value fields become JSON keys."""
from __future__ import annotations

import json
import logging

from schedulerd.logfmt import JsonFormatter, parse_event


def test_event_fields_are_split_and_values_with_spaces_stay_whole() -> None:
    assert parse_event("leases_expired group=0 count=3 dead_letter=1") == \
        {"event": "leases_expired", "group": "0", "count": "3", "dead_letter": "1"}
    assert parse_event("leader_scan_failed group=0 error=no leader for 2 s") == \
        {"event": "leader_scan_failed", "group": "0", "error": "no leader for 2 s"}
    assert parse_event("Some library's sentence.") == {"event": "message"}


def test_json_lines_carry_level_logger_event_fields_and_the_whole_message() -> None:
    record = logging.LogRecord("schedulerd.leader", logging.WARNING, __file__, 1,
                               "leader_scan_failed group=%d error=%s", (0, "disk full"), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["logger"] == "schedulerd.leader"
    assert line["event"] == "leader_scan_failed" and line["group"] == "0" and line["error"] == "disk full"
    assert line["msg"] == "leader_scan_failed group=0 error=disk full" and line["ts"].endswith("+00:00")


def test_per_run_events_are_debug_only_with_their_ids(caplog) -> None:
    from schedulerd.node import log_applied
    from schedulerd.storage.ops import Op

    lease = {"grants": [["w1", [{"run_id": "0-7-0", "job_id": "backup", "fence": 9}]]], "skipped": 0, "now": 1}
    with caplog.at_level(logging.DEBUG, logger="schedulerd.node"):
        log_applied(0, 9, Op.LEASE_BATCH, lease)
        log_applied(0, 5, Op.CREATE_JOBS, {"results": [{"job_id": "backup", "ok": True}], "runs": ["0-5-0"],
                                           "skipped": 0, "skipped_reasons": {}})
    assert "run_leased run_id=0-7-0 job_id=backup worker_id=w1 fence=9 raft_index=9" in caplog.text
    assert "job_created job_id=backup group=0 raft_index=5" in caplog.text
    assert "run_claimed run_id=0-5-0 group=0 raft_index=5" in caplog.text  # claimed by its create
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
