"""JSON as the API takes it: what json.loads accepts, less what no record can hold."""
from __future__ import annotations

import json
import re
from typing import Any

# A lone UTF-16 surrogate can only come in as an escape: strict UTF-8 refuses it raw.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of a repeated key; a caller who wrote two
    # `max_attempts` would get one of them without a word.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key!r} appears twice in one object")
            seen.add(key)
    return obj


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def parse_json(raw: bytes | str) -> Any:
    """Strict JSON: no NaN or Infinity, no key twice in one object, no string that is
    not Unicode text (a lone surrogate, which no stored record can encode), and a
    nesting Python can walk.
    Raises ValueError saying which."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw if isinstance(raw, bytes) else raw.encode()) and _has_lone_surrogate(data):
        raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text")
    return data


def integral(value: Any) -> int | None:
    """The integer a JSON number stands for, None for anything else: 3.0 is 3, as JSON
    Schema's `integer` says (a generated client may send it so); 3.5, true and "3" are not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
