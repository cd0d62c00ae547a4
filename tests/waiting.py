"""The one way a test waits: for a condition, with a deadline, never a bare sleep."""
from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "the condition",
               interval_s: float = 0.02) -> Any:
    """predicate()'s first truthy value, asked every interval_s until timeout_s has passed.
    An exception counts as not yet (a node may be restarting) and is reported if time runs out."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f"; last error: {last_error!r}" if last_error is not None else ""))
        time.sleep(interval_s)
