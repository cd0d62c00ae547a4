"""`schedctl`: a thin command-line client of the schedulerd HTTP API.

Human tables by default, `--json` for scripts (the server's document, as one
JSON value). Whatever fails, stderr gets exactly one line,
`error: <code>: <message>`, and the exit status is 1 for an error the server
(or the network) reported, 2 for bad usage caught before any request.

The commands live by subject in cli/jobs.py, cli/runs.py and cli/worker_cmd.py;
this module is the entry point (`schedctl = cli.main:main`) that gathers them.
"""
from __future__ import annotations

import click

from click.shell_completion import get_completion_class

from cli import jobs, live, runs
from cli.output import cluster_text, format_fields, format_table
from cli.session import CliError, OneLineGroup, Session
from cli.worker_cmd import worker
from schedulerd.client import Client

__all__ = ["CliError", "format_fields", "format_table", "main", "schedctl"]

DEFAULT_SERVER = "http://127.0.0.1:8080"


@click.group(cls=OneLineGroup)
@click.option("--server", envvar="SCHEDCTL_SERVER", default=DEFAULT_SERVER, show_default=True,
              metavar="URL[,URL...]", help="Server base URLs, tried in turn (env SCHEDCTL_SERVER).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON document.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="SECONDS",
              help="Overall time per command, failover and retries included.")
@click.pass_context
def schedctl(ctx: click.Context, server: str, as_json: bool, timeout: float) -> None:
    """Schedule jobs on a schedulerd cluster and look at them."""
    try:
        client = Client(server, timeout_s=timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    ctx.obj = Session(client, as_json, _server_urls(server))


def _server_urls(server: str) -> tuple[str, ...]:
    # The client takes a bare host:port as http://; the worker SDK wants full URLs.
    urls = (url.strip().rstrip("/") for url in server.split(","))
    return tuple(url if "://" in url else f"http://{url}" for url in urls if url)


@click.command()
@click.pass_obj
def cluster(session: Session) -> None:
    """Show this node's Raft groups: leader, term, commit and applied index.

    \b
    Example:
        schedctl --server http://10.0.0.2:8080 cluster
    """
    session.show(session.client.cluster(), cluster_text)


@click.command("top")
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, metavar="SECONDS")
@click.option("--once", is_flag=True, help="Print one frame (totals since the node started) and exit.")
@click.pass_obj
def top_command(session: Session, interval: float, once: bool) -> None:
    """Live view of one node: Raft leaders, queues (ready, waiting, oldest), dispatch
    lateness p50/p99 and run events per second (Ctrl-C stops).

    \b
    Examples:
        schedctl top
        schedctl --json top --once
    """
    live.top(session, interval, once)


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
    Examples:
        eval "$(schedctl completion bash)"          # in ~/.bashrc
        schedctl completion fish > ~/.config/fish/completions/schedctl.fish
    """
    cls = get_completion_class(shell)
    assert cls is not None  # every choice above has a class in click
    click.echo(cls(schedctl, {}, "schedctl", "_SCHEDCTL_COMPLETE").source())


for _command in (*jobs.COMMANDS, *runs.COMMANDS, cluster, top_command, completion, worker):
    schedctl.add_command(_command)


def main() -> None:
    schedctl.main(prog_name="schedctl")


if __name__ == "__main__":
    main()
