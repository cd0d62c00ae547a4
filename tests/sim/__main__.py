"""`python -m tests.sim --seed N --sim-hours H`: run one simulation (or, with --soak,
many seeds) and end with `verdict=PASS|FAIL sim_hours=H digest=HEX`."""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

# Set iteration order depends on string hashes: a replay must hash as the run did.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, "-m", "tests.sim", *sys.argv[1:]])

from tests.sim.run import Options, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sim-hours", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--spares", type=int, default=0,
                        help="machines that join, and replace removed or dead nodes, during the run")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--net", choices=("tcp", "chaos"), default="tcp")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--soak", type=int, default=0, metavar="SEEDS",
                        help="run this many seeds from --seed on; report each, fail if any fails")
    args = parser.parse_args()
    seeds = range(args.seed, args.seed + args.soak) if args.soak else [args.seed]
    failed = []
    total_hours = total_wall = 0.0
    result = None
    digests = hashlib.sha256()
    for seed in seeds:
        options = Options(seed=seed, sim_hours=args.sim_hours, nodes=args.nodes, spares=args.spares, groups=args.groups,
                          net=args.net, faults=not args.no_faults)
        started = time.monotonic()
        result = run(options)
        wall = time.monotonic() - started
        total_hours += result.sim_hours
        total_wall += wall
        digests.update(result.digest.encode())
        print(f"seed={seed} {result.last_line()} wall_s={wall:.1f} "
              f"sim_hours_per_min={result.sim_hours / wall * 60:.1f} "
              + " ".join(f"{k}={v}" for k, v in sorted(result.figures.items())), flush=True)
        if result.verdict != "PASS":
            failed.append(seed)
            print(f"replay: python -m tests.sim --seed {seed} --sim-hours {args.sim_hours:g} --nodes {args.nodes} "
                  f"--spares {args.spares} --groups {args.groups} --net {args.net}{' --no-faults' if args.no_faults else ''}")
            print("problems:\n  " + "\n  ".join(result.problems[:50]))
            print("last events:\n  " + "\n  ".join(result.tail))
            print("last daemon log lines:\n  " + "\n  ".join(result.log_tail))
    if args.soak:
        print(f"soak seeds={len(seeds)} failed={failed} sim_hours={total_hours:.1f} wall_s={total_wall:.0f}")
        verdict = "FAIL" if failed else "PASS"
        print(f"verdict={verdict} sim_hours={total_hours:g} digest={digests.hexdigest()[:16]}")
        return 1 if failed else 0
    assert result is not None
    print(result.last_line())
    return 0 if result.verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
