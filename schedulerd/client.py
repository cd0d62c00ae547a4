"""Moved to schedulerd.sdk.client; this name still imports it, with a DeprecationWarning."""
from __future__ import annotations

import sys
import warnings

from schedulerd.sdk import client as _moved

warnings.warn("schedulerd.client is now schedulerd.sdk.client (Worker, Task and Client: from schedulerd.sdk)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
