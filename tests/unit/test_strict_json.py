"""schedulerd/strict_json.py: the JSON the API and schedctl take."""
from __future__ import annotations

import pytest

from schedulerd.strict_json import parse_json


@pytest.mark.parametrize("raw, message", [
    (b'{"a": NaN}', "NaN is not JSON"), (b"[Infinity]", "Infinity is not JSON"),
    (b"[-Infinity]", "-Infinity is not JSON"), (b"[" * 100_000, "nested too deeply"),
    (b'{"a": "\\ud800"}', "lone UTF-16 surrogate"), (b'{"\\uDFFF": 1}', "lone UTF-16 surrogate"),
    (b'["ok", ["\\ud83d"]]', "lone UTF-16 surrogate"),
    (b'{"a": 1, "b": {"c": 1, "c": 2}}', "'c' appears twice"), (b"\xff", "not UTF-8"), (b"{", "Expecting"),
])
def test_what_no_record_can_hold_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_json(raw)


def test_text_that_only_looks_like_a_surrogate_and_a_real_pair_are_taken() -> None:
    assert parse_json(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == {"a": "\U0001F600", "b": "\\ud800"}
    assert parse_json('{"x": [1, 2.5, null]}') == {"x": [1, 2.5, None]}


def test_the_same_key_in_sibling_objects_is_not_a_repeat() -> None:
    assert parse_json(b'[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]') == [{"a": 1}, {"a": 2}, {"b": {"a": 3}}]
