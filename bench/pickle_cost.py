"""What pysyncobj's pickling costs one create entry, at the protocol it defaults to (2)
and the one raft/group.py sets (5).

    python -m bench.pickle_cost [--jobs 150] [--repeat 3000]

The entry is a create of --jobs one-off jobs as the steady bench's feeder sends them.
For each protocol it prints what pysyncobj does to it on its way through the cluster:
pickle the `(method, (blob,))` command (the proposer), unpickle it (the leader's vet
and every replica's apply), and pickle and zlib an append message carrying it (the
leader, once per follower; tcp_connection.py)."""
from __future__ import annotations

import argparse
import pickle
import sys
import timeit
import zlib
from typing import Callable

from bench.common import uptime_line
from storage import ops
from storage.ops import Op

S = 1_000_000
T0 = 1_800_000_000 * S


def create_entry(jobs: int) -> bytes:
    specs = [{"job_id": f"bench-{i:08d}", "schedule": {"kind": "at", "at_us": T0 + 60 * S + i},
              "schedule_spec": {}, "queue": "bench", "payload_json": '{"n": 1}'} for i in range(jobs)]
    return ops.encode(Op.CREATE_JOBS, {"now": T0, "jobs": specs, "grace_us": 5 * S, "claim_ahead_us": 12 * S})


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    return min(timeit.repeat(fn, number=repeat, repeat=3)) / repeat * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pickle_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=150)
    p.add_argument("--repeat", type=int, default=3000)
    args = p.parse_args(argv)
    blob = create_entry(args.jobs)
    command = (0, (blob,))
    print(f"bench.pickle_cost: a create entry of {args.jobs} jobs, {len(blob):,} bytes; {uptime_line()}")
    print(f"  {'protocol':>8} {'command B':>10} {'pickle µs':>10} {'unpickle µs':>12} {'append+zlib µs':>15}")
    for protocol in (2, 5):
        pickled = pickle.dumps(command, protocol)
        message = {"type": "append_entries", "term": 3, "commit_index": 100, "prevLogIdx": 99,
                   "prevLogTerm": 3, "entries": [(b"\x00" + pickled, 100, 3)]}

        times = [per_call_us(fn, args.repeat) for fn in (lambda: pickle.dumps(command, protocol),
                                                         lambda: pickle.loads(pickled),
                                                         lambda: zlib.compress(pickle.dumps(message, protocol), 3))]
        print(f"  {protocol:>8} {len(pickled):>10,} {times[0]:>10.1f} {times[1]:>12.1f} {times[2]:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
