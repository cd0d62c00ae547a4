"""Every schedctl verb answers --help with at least one example."""
from __future__ import annotations

from typing import Iterator

import click
from click.testing import CliRunner

from schedulerd.cli.main import schedctl


def verbs(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from verbs(command, (*path, name))


def test_every_verb_has_help_with_an_example() -> None:
    missing = []
    for path in verbs(schedctl):
        result = CliRunner().invoke(schedctl, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if "Example" not in result.output:
            missing.append(" ".join(path))
    assert not missing, f"no example in --help of: {', '.join(missing)}"


def test_completion_scripts_are_printed_for_each_shell() -> None:
    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "compdef"), ("fish", "complete --no-files")):
        result = CliRunner().invoke(schedctl, ["completion", shell])
        assert result.exit_code == 0 and marker in result.output and "_SCHEDCTL_COMPLETE" in result.output


def test_update_help_says_backoff_parts_not_given_keep_the_jobs_values() -> None:
    """As apply does (test_semantics: updates of different backoff parts both land)."""
    text = " ".join(CliRunner().invoke(schedctl, ["update", "--help"]).output.split())
    assert "the job keeps its current values of the others" in text
    assert "defaults" not in text
