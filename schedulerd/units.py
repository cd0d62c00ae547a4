"""Units every layer shares. Time is integer microseconds since the Unix epoch
everywhere in the store, in Raft entries and on the wire (`*_us`); the API's
seconds fields (`*_s`) convert at its edge."""
from __future__ import annotations

US_PER_S = 1_000_000
