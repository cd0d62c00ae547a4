"""The client side (schedulerd.sdk) imports nothing of the daemon: a worker process
needs aiohttp, not LMDB, Raft or the HTTP server. The old import paths still work."""
from __future__ import annotations

import subprocess
import sys
import warnings

# What the client side may load of schedulerd besides itself: the error types both
# sides speak, the server's limits and the destination policy the http executor applies.
SHARED = {"schedulerd", "schedulerd.errors", "schedulerd.destinations", "schedulerd.limits"}  # and schedulerd.sdk.*
DAEMON_ONLY = ("lmdb", "pysyncobj", "schedulerd.storage", "schedulerd.raft", "schedulerd.api", "schedulerd.node")


def test_the_sdk_loads_no_module_of_the_daemon() -> None:
    probe = ("import sys, schedulerd.sdk, schedulerd.sdk.http_executor\n"
             "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(out.stdout.split())
    ours = {m for m in loaded if m == "schedulerd" or m.startswith("schedulerd.")}
    assert {m for m in ours if not m.startswith("schedulerd.sdk")} <= SHARED, ours
    assert not [m for m in loaded if m.startswith(DAEMON_ONLY)]


def test_the_old_import_paths_are_the_sdk_modules_with_a_warning() -> None:
    for name in ("worker", "client"):
        sys.modules.pop(f"schedulerd.{name}", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = __import__(f"schedulerd.{name}", fromlist=["_"])
        new = __import__(f"schedulerd.sdk.{name}", fromlist=["_"])
        assert old is new
        assert any(issubclass(w.category, DeprecationWarning) and f"schedulerd.sdk.{name}" in str(w.message)
                   for w in caught)
    from schedulerd.worker import Worker
    from schedulerd.sdk import Worker as SdkWorker
    assert Worker is SdkWorker


def test_the_client_loads_without_aiohttp() -> None:
    """A caller that only schedules jobs imports the client, stdlib only, not the worker's stack."""
    probe = "import sys, schedulerd.sdk.client\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(out.stdout.split())
    assert not {"aiohttp", "uvloop", "schedulerd.sdk.worker"} & loaded
