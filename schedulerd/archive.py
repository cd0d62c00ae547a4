"""The archive the sweep writes before it deletes (--archive-dir).

Layout, one file per group per hour of the sweep's time (UTC):

    DIR/group-0/2026-12-06T14.jsonl.gz

Each file is gzip (one member per sweep entry: `zcat` and DuckDB read the
members as one stream), each line a JSON object: the job or run view the API
showed, plus `kind` ("job" or "run"), `group` and `archived_at`. A job's line
follows its runs' lines. The file is fsynced before the deletion is proposed,
so a record is in the archive before it can leave the store; a crash between
the two archives the same records again at the next sweep (a reader dedupes on
`run_id`, or `job_id` with `created_at`)."""
from __future__ import annotations

import gzip
import json
import os
from datetime import datetime, timezone
from typing import Any

import msgspec

from schedulerd.units import US_PER_S

ARCHIVE_SUFFIX = ".jsonl.gz"
# Views hold a job's payload and a run's result as the JSON text stored (msgspec.Raw).
_ENCODER = msgspec.json.Encoder()


def path_of(root: str, group_id: int, at_us: int) -> str:
    hour = datetime.fromtimestamp(at_us / US_PER_S, tz=timezone.utc).strftime("%Y-%m-%dT%H")
    return os.path.join(root, f"group-{group_id}", hour + ARCHIVE_SUFFIX)


def write(root: str, group_id: int, at_us: int, records: list[dict[str, Any]]) -> str:
    """Append records to their hour's file and fsync it (and its folder, when new); returns
    the path. Blocking: call it off the event loop."""
    path = path_of(root, group_id, at_us)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    lines = b"".join(_ENCODER.encode(record) + b"\n" for record in records)
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        data = memoryview(gzip.compress(lines, compresslevel=6))
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def read(path: str) -> list[dict[str, Any]]:
    """Every record of one archive file (all its members)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
