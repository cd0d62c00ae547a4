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
