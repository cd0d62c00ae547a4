"""YAML as schedulerd reads it (tokens files, schedctl's job files): PyYAML's safe
loader, less its silent last-wins on a key given twice in one mapping. In a tokens
file, a second `scopes:` under one token would otherwise change what it may do."""
from __future__ import annotations

from typing import IO, Any

import yaml


_MERGE = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue  # `<<: *base` then a key of base's: the key given overrides, as YAML says
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:
                continue  # an unhashable key: the safe loader refuses it below, with its own message
            if repeated:
                raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark,
                                                        f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(stream: str | IO[str]) -> Any:
    """yaml.safe_load, refusing a key given twice in one mapping (yaml.YAMLError, with its line)."""
    return yaml.load(stream, Loader=_UniqueKeyLoader)
