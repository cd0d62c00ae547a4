"""docs/decisions.md's index lists every record, in order, so a new one is findable."""
from __future__ import annotations

import pathlib
import re

DECISIONS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "decisions.md"


def test_the_index_lists_every_record_in_order() -> None:
    text = DECISIONS.read_text()
    index, _, body = text.partition("\n## Index\n")[2].partition("\n## ")
    listed = re.findall(r"^- \[(.+)\]\(#[^)]+\)$", index, flags=re.M)
    records = re.findall(r"^## (.+)$", "## " + body, flags=re.M)
    assert listed == records
