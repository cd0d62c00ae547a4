"""Log output: `--log-format text` (one line, as written) or `json` (one object per line).

Messages follow one convention, `event_name key=value key=value`, so the JSON
form can carry the event and its fields as keys a log pipeline can index. A
value runs until the next ` key=`; a value with spaces (an error text) stays whole."""
from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

FORMATS = ("text", "json")
_KEY = re.compile(r"^[a-z_][a-z0-9_]*=")


def parse_event(message: str) -> dict[str, str]:
    """'job_claimed job_id=a raft_index=7' -> {'event': 'job_claimed', 'job_id': 'a', 'raft_index': '7'}."""
    head, _, rest = message.partition(" ")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", head):
        return {"event": "message"}
    fields: dict[str, str] = {"event": head}
    key = None
    for token in rest.split(" ") if rest else []:
        if _KEY.match(token):
            key, _, val = token.partition("=")
            fields[key] = val
        elif key is not None:
            fields[key] += " " + token
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name}
        out.update((k, v) for k, v in parse_event(message).items() if k not in out)
        out["msg"] = message
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
