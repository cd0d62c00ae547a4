"""What every `schedctl` command shares: the session (client, output mode,
servers) and the rule that any failure is one line on stderr,
`error: <code>: <message>`, with exit status 1 for an error the server (or the
network) reported and 2 for bad usage caught before any request."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator

import click

from schedulerd.errors import SchedulerError
from schedulerd.sdk.client import Client

EXIT_SERVER_ERROR = 1
EXIT_USAGE = 2  # what click uses for usage errors


class CliError(click.ClickException):
    """A failure shown as the one line `error: <code>: <message>`."""

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.code}: {self.message}", file=file, err=True)


@contextmanager
def one_line_errors() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # bare `schedctl`: click prints the help, which is what the user wants
    except click.UsageError as exc:
        raise CliError("usage", exc.format_message(), EXIT_USAGE) from exc
    except SchedulerError as exc:
        raise CliError(exc.code, exc.message, EXIT_SERVER_ERROR) from exc


class OneLineGroup(click.Group):
    """A click group whose errors, its own and its commands', are one line each.

    Click's usage errors come from parsing (here and in the subcommand, which
    `invoke` parses) and print several lines; the client raises typed errors."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        with one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors():
            return super().invoke(ctx)


@dataclass(frozen=True)
class Session:
    client: Client
    as_json: bool
    servers: tuple[str, ...]  # base URLs as given to --server, with a scheme
    token: str | None = None  # for the workers schedctl runs
    ca_file: str | None = None
    namespace: str | None = None

    def show(self, document: Any, human: Callable[[Any], str]) -> None:
        click.echo(json.dumps(document, indent=2) if self.as_json else human(document))
        if not self.as_json and isinstance(document, dict):
            for warning in document.get("warnings", ()):  # the server accepted it, and has a word of advice
                click.echo(f"warning: {warning}", err=True)
