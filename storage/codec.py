"""The one msgpack codec for everything stored and replicated: Raft entries,
job and run records, snapshot headers, journal meta.

msgspec, not msgpack-python: the same bytes (maps, arrays, str, bin, ints of the
smallest width), written 1.9x and read 2.2x faster, and a record is packed or
unpacked several times per job on every replica (docs/decisions.md). Stores,
journals and snapshots written by msgpack-python read back unchanged. Both
objects are thread-safe (msgspec >= 0.16), so one of each serves every thread."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import msgspec

T = TypeVar("T")

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


# The bound methods themselves, not functions calling them: a Python frame fewer for each
# of the ~6 packs and unpacks per job on every replica.
pack: Callable[[Any], bytes] = _ENCODER.encode
unpack: Callable[[bytes], Any] = _DECODER.decode


def partial_decoder(fields: type[T]) -> "msgspec.msgpack.Decoder[T]":
    """A decoder that reads only `fields` (a msgspec Struct) out of a stored map and
    skips the other keys without building them: a job record read for its payload
    alone costs a quarter of a full unpack (docs/performance.md, eleventh round)."""
    return msgspec.msgpack.Decoder(fields)
