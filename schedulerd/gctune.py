"""The cyclic garbage collector's settings for a process that handles thousands of jobs
a second: the daemon (schedulerd.main), and a worker running the SDK (`schedctl worker
run`, or any program around `Worker.run` that calls `tune_gc` first).

Both make and drop a few dozen small containers per job, nearly all freed by reference
counting. At CPython's default of a young-generation run every 700 allocations the
collector took 10-20% of a node's apply and about a fifth of a busy worker's CPU."""
from __future__ import annotations

import gc

YOUNG_OBJECTS = 50_000
YOUNG_OBJECTS_RANGE = (700, 1_000_000)  # 700 is CPython's default


def tune_gc(young_objects: int = YOUNG_OBJECTS) -> None:
    """Collect cycles less often, and never walk what start-up built: the modules, config
    and tables live as long as the process (freezing them keeps every full collection
    from visiting them again). Call it once, after imports and set-up."""
    low, high = YOUNG_OBJECTS_RANGE
    if not low <= young_objects <= high:
        raise ValueError(f"young_objects must be within {low}..{high} ({low} is CPython's default)")
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_objects, *gc.get_threshold()[1:])
