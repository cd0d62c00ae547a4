"""A node whose data directory fills up answers writes with a clean 503, keeps
what it had, and takes writes again once space returns."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.harness import NodeProc, free_port_runs, wait_until

pytestmark = pytest.mark.integration

TMPFS_MB = 96


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_full_disk_gives_503_and_recovers(small_disk, tmp_path) -> None:
    http_port, raft_port = free_port_runs(2, 2)
    node = NodeProc("n0", http_port, f"127.0.0.1:{raft_port}", [], str(small_disk / "data"),
                    str(tmp_path / "n0.log"))
    node.start()
    try:
        wait_until(lambda: node.get("/readyz")[0] == 200, 30, "node ready")
        assert node.post("/v1/jobs", {"job_id": "before", "schedule": {"every": "1h"}})[0] == 201
        filler = small_disk / "filler"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        with open(filler, "wb") as f:  # leave less than disk_free_bytes_min (64 MiB)
            f.write(b"\0" * max(0, free - 32 * 1024 * 1024))

        def refused() -> bool:
            status, body = node.post("/v1/jobs", {"schedule": {"every": "1h"}})
            return status == 503 and "disk nearly full" in body["error"]["message"]
        wait_until(refused, 10, "writes refused with 503")
        assert node.get("/v1/jobs/before")[0] == 200, "reads still work and nothing was lost"

        filler.unlink()
        wait_until(lambda: node.post("/v1/jobs", {"job_id": "after", "schedule": {"every": "1h"}})[0] == 201,
                   10, "writes accepted once space returns")
        # (creates sent before the guard re-read free space may have landed too)
        assert {"before", "after"} <= {j["job_id"] for j in node.get("/v1/jobs")[1]["jobs"]}
    finally:
        node.stop()
