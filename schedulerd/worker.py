"""Moved to schedulerd.sdk.worker; this name still imports it, with a DeprecationWarning."""
from __future__ import annotations

import sys
import warnings

from schedulerd.sdk import worker as _moved

warnings.warn("schedulerd.worker is now schedulerd.sdk.worker (Worker, Task and Client: from schedulerd.sdk)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
