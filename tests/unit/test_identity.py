"""schedulerd/identity.py: a node's id is made once and kept with its data."""
from __future__ import annotations

import pathlib

import pytest

from schedulerd import identity


def test_the_id_is_made_at_the_first_start_and_kept(tmp_path: pathlib.Path) -> None:
    first = identity.node_id(str(tmp_path / "data"))
    assert identity.NODE_ID_RE.fullmatch(first)
    assert identity.node_id(str(tmp_path / "data")) == first
    assert identity.node_id(str(tmp_path / "wiped")) != first  # a wiped disk is a new node


def test_a_damaged_id_file_is_refused_not_replaced(tmp_path: pathlib.Path) -> None:
    (tmp_path / identity.FILE).write_text("garbage\n")
    with pytest.raises(ValueError, match="not a node id"):
        identity.node_id(str(tmp_path))
    assert (tmp_path / identity.FILE).read_text() == "garbage\n"
