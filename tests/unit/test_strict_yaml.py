"""schedulerd/strict_yaml.py, and the two files read with it: a tokens file and a
`schedctl create --file` job file."""
from __future__ import annotations

import pathlib

import click
import pytest
import yaml

from schedulerd import strict_yaml
from schedulerd.auth import TokenFile, add_token
from schedulerd.cli.files import read_jobs


def test_a_key_twice_in_one_mapping_is_refused_with_its_line() -> None:
    with pytest.raises(yaml.YAMLError, match=r"(?s)key 'x' appears twice.*line 5"):
        strict_yaml.load("a: 1\nb:\n  x: 1\n  y: 2\n  x: 3\n")


def test_merge_keys_sibling_mappings_and_unhashable_keys_behave_as_in_the_safe_loader() -> None:
    text = "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\nl: [{a: 1}, {a: 2}]\n"
    assert strict_yaml.load(text) == yaml.safe_load(text) == {
        "base": {"x": 1, "y": 2}, "d": {"x": 3, "y": 2}, "l": [{"a": 1}, {"a": 2}]}
    with pytest.raises(yaml.YAMLError, match="unhashable key"):
        strict_yaml.load("? [1, 2]\n: 3\n")


def test_a_tokens_file_with_a_scope_given_twice_is_refused_and_the_old_tokens_stay(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.yaml"
    secret = add_token(str(path), "ci", ["read"], ["*"])
    tokens = TokenFile(str(path))
    path.write_text(path.read_text().replace("  - read\n", "  - read\n  scopes:\n  - admin\n"))
    with pytest.raises(ValueError, match="key 'scopes' appears twice"):
        tokens.load()
    assert tokens.authenticate(f"Bearer {secret}").scopes == frozenset({"read"})


def test_a_job_file_with_a_key_twice_is_refused_before_any_request(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("- job_id: a\n  schedule: {every: 1h}\n  max_attempts: 1\n  max_attempts: 9\n")
    with pytest.raises(click.BadParameter, match=r"(?s)is not valid YAML: .*key 'max_attempts' appears twice.*line 4"):
        read_jobs(str(path))
