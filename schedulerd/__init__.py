"""schedulerd: a distributed job scheduler in one daemon.

Its state machine, its Raft layer and its command line are `schedulerd.storage`,
`schedulerd.raft` and `schedulerd.cli`. An installed wheel holds them inside this
package; a checkout keeps them as storage/, raft/ and cli/ beside it, and this
package looks there too, so code run from a checkout and code installed import the
same names (pyproject.toml maps the folders for the wheel)."""
from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT = os.path.dirname(_HERE)
if not os.path.isdir(os.path.join(_HERE, "storage")) and os.path.isfile(os.path.join(_CHECKOUT, "storage", "fsm.py")):
    __path__.append(_CHECKOUT)
