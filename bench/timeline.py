"""A timeline of the box while a bench runs beside it: every --step-s, the box's busy
cores, each schedulerd node's two busiest threads (under load, its Raft tick thread and
its event loop) and its stores' dirty bytes (where cachestat(2) can say), the bench's
worker processes and the bench process itself, and the disk: bytes written per second,
and the page cache's dirty and under-writeback bytes.

    python -m bench.timeline SECONDS [--step-s 2] [--disk vda]

Run it in a second shell as a bench starts. A bench's own figures are per 10 s window;
this shows what happens inside one, such as the kernel writing back a gigabyte of the
nodes' LMDB files at once."""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from dataclasses import dataclass

from schedulerd.raft.writeback import file_dirty_bytes

HZ = os.sysconf("SC_CLK_TCK")
ROLES = (("schedulerd.main", "node"), ("bench.sdworker", "workers"), ("-m bench ", "bench"))
SECTOR_BYTES = 512


@dataclass
class Sample:
    at: float
    busy: int  # jiffies, all CPUs, not idle or iowait
    total: int
    roles: dict[int, str]
    threads: dict[int, dict[str, int]]  # pid -> thread id -> CPU jiffies
    stores: dict[int, int | None]  # node pid -> dirty bytes of its LMDB files (None: unknown)
    sectors_written: int
    dirty_kb: int
    writeback_kb: int


def _roles() -> tuple[dict[int, str], dict[int, str]]:
    """Each process of interest's role, and each node's data dir."""
    roles, data_dirs = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        cmd = " ".join(args)
        for needle, role in ROLES:
            if needle in cmd:
                roles[int(pid)] = role
                if role == "node" and "--data-dir" in args[:-1]:
                    data_dirs[int(pid)] = args[args.index("--data-dir") + 1]
                break
    return roles, data_dirs


def _store_dirty(data_dir: str) -> int | None:
    readings = [file_dirty_bytes(path) for path in glob.glob(os.path.join(data_dir, "group-*.lmdb", "data.mdb"))]
    return None if not readings or None in readings else sum(r for r in readings if r is not None)


def _threads(pid: int) -> dict[str, int]:
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            out[tid] = int(fields[11]) + int(fields[12])  # utime + stime
    except OSError:
        pass
    return out


def _disk(device: str) -> tuple[int, int, int]:
    written = 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] == device:
                written = int(fields[9])
    with open("/proc/meminfo") as f:
        mem = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return written, mem["Dirty"], mem["Writeback"]


def sample(device: str) -> Sample:
    roles, data_dirs = _roles()
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    total = sum(cpu)
    return Sample(time.time(), total - cpu[3] - cpu[4], total, roles, {pid: _threads(pid) for pid in roles},
                  {pid: _store_dirty(d) for pid, d in data_dirs.items()}, *_disk(device))


def line(a: Sample, b: Sample) -> str:
    wall_s = b.at - a.at
    cores = os.cpu_count() or 1

    def used(pid: int, tid: str) -> float:
        return (b.threads[pid][tid] - a.threads.get(pid, {}).get(tid, 0)) / HZ / wall_s

    parts = [time.strftime("%H:%M:%S", time.localtime(b.at)),
             f"box {(b.busy - a.busy) / max(1, b.total - a.total) * cores:.2f}"]
    others: dict[str, float] = {}
    for pid, role in sorted(b.roles.items()):
        if pid not in a.roles:
            continue
        per_thread = sorted((used(pid, tid) for tid in b.threads[pid]), reverse=True)
        if role == "node":
            parts.append("node " + "/".join(f"{c:.2f}" for c in per_thread[:2]))
            if b.stores.get(pid) is not None:
                parts.append(f"store {b.stores[pid] >> 20} MB")
        else:
            others[role] = others.get(role, 0.0) + sum(per_thread)
    parts += [f"{role} {c:.2f}" for role, c in sorted(others.items())]
    mb = 1 << 20
    parts.append(f"disk {(b.sectors_written - a.sectors_written) * SECTOR_BYTES / mb / wall_s:.0f} MB/s, "
                 f"dirty {b.dirty_kb >> 10} MB, writeback {b.writeback_kb >> 10} MB")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("seconds", type=float)
    p.add_argument("--step-s", type=float, default=2.0)
    p.add_argument("--disk", default="vda", help="the block device the run dirs are on (/proc/diskstats name)")
    a = p.parse_args(argv)
    print("node a/b: CPU cores of its two busiest threads (under load, the Raft tick thread, then the "
          "event loop), store: its LMDB files' dirty bytes; workers, bench: CPU cores of those processes")
    end = time.time() + a.seconds
    before = sample(a.disk)
    while time.time() < end:
        time.sleep(a.step_s)
        after = sample(a.disk)
        print(line(before, after), flush=True)
        before = after
    return 0


if __name__ == "__main__":
    sys.exit(main())
