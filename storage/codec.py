"""The one msgpack codec for everything stored and replicated: Raft entries,
job and run records, snapshot headers, journal meta.

msgspec, not msgpack-python: the same bytes (maps, arrays, str, bin, ints of the
smallest width), written 1.9x and read 2.2x faster, and a record is packed or
unpacked several times per job on every replica (docs/decisions.md). Stores,
journals and snapshots written by msgpack-python read back unchanged. Both
objects are thread-safe (msgspec >= 0.16), so one of each serves every thread."""
from __future__ import annotations

from typing import Any, Callable, TypeVar, Union

import msgspec
import msgspec.structs

T = TypeVar("T")

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


# The bound methods themselves, not functions calling them: a Python frame fewer for each
# of the ~6 packs and unpacks per job on every replica.
pack: Callable[[Any], bytes] = _ENCODER.encode
unpack: Callable[[bytes], Any] = _DECODER.decode


_MAP_MARKERS = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})
_NO_LAYOUT: tuple[int, list[str] | None] = (-1, None)  # no list of keys equals None


class Layouts:
    """Stores one kind of record in fewer bytes: a record whose keys are, in order, those
    of one of its layouts is written as the array `[layout number, *values]`, and any
    other as a map. Both read back as the same dict.

    Most of a job or run map's bytes are its key names: as arrays, a bench job takes
    179 bytes, not 422, and a run 146, not 374. That is the page cache each replica
    dirties per commit, and the pages LMDB copies and splits. A layout's number and
    fields are part of the stored format:
    add layouts, never change or renumber one."""

    def __init__(self, kind: str, layouts: tuple[tuple[str, ...], ...]) -> None:
        self.layouts = layouts
        # By length, so a record is matched by one list comparison (the cheapest exact
        # check of keys and their order) and not by hashing its keys.
        self._by_length = {len(fields): (n, list(fields)) for n, fields in enumerate(layouts)}
        if len(self._by_length) != len(layouts):
            raise ValueError(f"{kind} layouts must differ in length")
        structs = [msgspec.defstruct(f"{kind}Layout{n}", [(name, Any) for name in fields], array_like=True, tag=n)
                   for n, fields in enumerate(layouts)]
        self._decoder = msgspec.msgpack.Decoder(Union[(dict, *structs)])  # type: ignore[valid-type]

    def pack(self, record: dict[str, Any]) -> bytes:
        number, fields = self._by_length.get(len(record), _NO_LAYOUT)
        return _ENCODER.encode([number, *record.values()] if list(record) == fields else record)

    def unpack(self, raw: bytes) -> dict[str, Any]:
        record = self._decoder.decode(raw)
        return record if type(record) is dict else msgspec.structs.asdict(record)

    def partial_decoder(self, fields: type[T]) -> Callable[[bytes], T]:
        """A decoder of the fields named by the Struct `fields` out of a record stored
        either way, the others skipped unbuilt: a job read for its payload and target
        alone costs a quarter of a full unpack.
        Every layout must hold those fields but trailing ones with defaults that none holds
        (a newer optional field): only a record stored as a map has those."""
        by_map = msgspec.msgpack.Decoder(fields)
        names = tuple(name for name in fields.__struct_fields__ if all(name in layout for layout in self.layouts))
        assert names == fields.__struct_fields__[:len(names)], f"{fields.__name__}: laid-out fields come first"
        parts = []
        for n, layout in enumerate(self.layouts):
            last = max(layout.index(name) for name in names)
            parts.append(msgspec.defstruct(
                f"{fields.__name__}Layout{n}",
                [(name, Any if name in names else msgspec.Raw) for name in layout[:last + 1]],
                array_like=True, tag=n))
        by_array = msgspec.msgpack.Decoder(Union[tuple(parts)])  # type: ignore[valid-type]

        def decode(raw: bytes) -> T:
            if raw[0] in _MAP_MARKERS:
                return by_map.decode(raw)
            part = by_array.decode(raw)
            return fields(*[getattr(part, name) for name in names])
        return decode
