"""What a user types: `schedctl` and `schedulerd dev-cluster` as subprocesses."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from schedulerd.main import RAFT_PORT_OFFSET
from tests.integration.harness import ROOT, free_ports, http, wait_until

pytestmark = pytest.mark.integration


def schedctl(server: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedulerd.cli.main", "--server", server, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_schedctl_against_a_real_node(make_cluster) -> None:
    cluster = make_cluster(1)
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    server = f"{dead},{cluster.urls[0]}"  # the first server is down: schedctl fails over

    out = schedctl(server, "create", "--id", "nightly", "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
                   "--queue", "backups", "--payload", '{"db": "main"}')
    assert out.returncode == 0, out.stderr
    assert "nightly" in out.stdout and "scheduled" in out.stdout

    out = schedctl(server, "--json", "get", "nightly")
    job = json.loads(out.stdout)
    assert job["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert job["next_fire_time"].endswith(("T01:00:00Z", "T00:00:00Z"))  # 02:00 Berlin in winter or summer

    for i in range(3):
        assert schedctl(server, "create", "--every", "1h", "--id", f"hourly-{i}").returncode == 0
    out = schedctl(server, "list")
    lines = out.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["JOB_ID", "STATE", "QUEUE"] and len(lines) == 5

    page = json.loads(schedctl(server, "--json", "list", "--limit", "2").stdout)
    assert len(page["jobs"]) == 2 and page["next_cursor"]
    every = json.loads(schedctl(server, "--json", "list", "--all", "--limit", "2").stdout)
    assert sorted(j["job_id"] for j in every["jobs"]) == ["hourly-0", "hourly-1", "hourly-2", "nightly"]

    out = schedctl(server, "cancel", "nightly")
    assert out.returncode == 0 and "cancelled" in out.stdout
    assert "RUN_ID" in schedctl(server, "runs", "nightly").stdout
    assert "GROUP" in schedctl(server, "cluster").stdout

    out = schedctl(server, "get", "nope")
    assert out.returncode == 1 and out.stderr.strip().startswith("error: not_found:")
    assert len(out.stderr.strip().splitlines()) == 1
    out = schedctl(server, "create", "--cron", "99 * * * *")
    assert out.returncode == 1 and out.stderr.startswith("error: invalid_job:")
    out = schedctl(dead, "list")
    assert out.returncode == 1 and "error: unavailable:" in out.stderr


def _dev_cluster_ports(base: int, nodes: int) -> list[int]:
    """Every port `dev-cluster --base-port base` binds: HTTP base + i, Raft as main.dev_cluster lays it out."""
    return [base + i for i in range(nodes)] + [base + RAFT_PORT_OFFSET + 100 * i + k for i in range(nodes) for k in (0, 1)]


def _all_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _dev_cluster_base(nodes: int) -> int:
    """A base port whose whole layout is free now. One free port alone was not enough: under the
    full suite a node's HTTP or Raft port above it was sometimes held by another socket, that
    node could not start, and the test waited out its 40 s for it."""
    for _ in range(50):
        base = free_ports(1)[0]
        ports = _dev_cluster_ports(base, nodes)
        if max(ports) <= 65535 and _all_free(ports):
            return base
    pytest.skip("found no base port with the whole dev-cluster layout free")


def test_dev_cluster_starts_three_nodes_and_stops_them(tmp_path) -> None:
    base = _dev_cluster_base(3)
    proc = subprocess.Popen([sys.executable, "-m", "schedulerd.main", "dev-cluster", "--nodes", "3",
                             "--base-port", str(base), "--data-dir", str(tmp_path / "dev")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]
        for url in urls:
            wait_until(lambda: http("GET", url + "/readyz", timeout_s=2)[0] == 200, 40, f"{url} ready")
        status, job = http("POST", urls[1] + "/v1/jobs", {"job_id": "x", "schedule": {"every": "1h"}})
        assert status == 201
        wait_until(lambda: http("GET", urls[2] + "/v1/jobs/x")[0] == 200, 10, "the job on node 2")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    for i in range(3):
        assert os.path.exists(tmp_path / "dev" / f"node-{i}" / "group-0.lmdb")
    wait_until(lambda: all(_refused(f"http://127.0.0.1:{base + i}/healthz") for i in range(3)), 10,
               "every dev-cluster node to stop")


def _refused(url: str) -> bool:
    try:
        http("GET", url, timeout_s=1)
    except OSError:
        return True
    return False


def test_raft_stays_on_loopback_unless_named(tmp_path) -> None:
    """pysyncobj speaks pickle: even with the API on all interfaces (--insecure: no tokens here),
    Raft binds loopback by default."""
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "schedulerd.main", "--data-dir", str(tmp_path / "d"),
                             "--http", f"0.0.0.0:{port}", "--insecure"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http("GET", url + "/readyz", timeout_s=2)[0] == 200, 30, "node ready")
        status, info = http("GET", url + "/v1/cluster")
        assert info["node"] == f"127.0.0.1:{port + 1000}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
