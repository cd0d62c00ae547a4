"""`schedctl`: a thin command-line client of the schedulerd HTTP API.

Human tables by default, `--json` for scripts (the server's document, as one
JSON value). Whatever fails, stderr gets exactly one line,
`error: <code>: <message>`, and the exit status is 1 for an error the server
(or the network) reported, 2 for bad usage caught before any request.

The commands live by subject in cli/jobs.py, cli/runs.py, cli/backfill.py, cli/explain.py and
cli/worker_cmd.py; this module is the entry point (`schedctl = cli.main:main`) that gathers them.
"""
from __future__ import annotations

import os
from typing import Any

import click
import yaml
from click.shell_completion import get_completion_class

from schedulerd.cli import backfill, explain, jobs, live, runs
from schedulerd.cli.calendar import calendar
from schedulerd.cli.queue import queue
from schedulerd.cli.output import cluster_text, format_fields, format_table
from schedulerd.cli.session import CliError, OneLineGroup, Session
from schedulerd.cli.worker_cmd import worker
from schedulerd.sdk.client import Client

__all__ = ["CliError", "format_fields", "format_table", "main", "schedctl"]

DEFAULT_SERVER = "http://127.0.0.1:8080"
CONFIG_PATH = "~/.config/schedctl/config.yaml"


@click.group(cls=OneLineGroup)
@click.option("--server", envvar="SCHEDCTL_SERVER", default=DEFAULT_SERVER, show_default=True,
              metavar="URL[,URL...]", help="Server base URLs, tried in turn (env SCHEDCTL_SERVER).")
@click.option("--token", envvar="SCHEDCTL_TOKEN", metavar="TOKEN",
              help="API bearer token (env SCHEDCTL_TOKEN, or `token:` in the config file).")
@click.option("--namespace", "-n", envvar="SCHEDCTL_NAMESPACE", metavar="NAME",
              help="Namespace of the jobs, runs and queues [default] (env SCHEDCTL_NAMESPACE).")
@click.option("--ca-file", envvar="SCHEDCTL_CA_FILE", type=click.Path(exists=True, dir_okay=False),
              help="Verify https servers against this CA bundle (env SCHEDCTL_CA_FILE).")
@click.option("--config", "config_path", envvar="SCHEDCTL_CONFIG", default=CONFIG_PATH, show_default=True,
              help="YAML with server, token, ca_file: used for whatever flags and env leave unset.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON document.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, metavar="SECONDS",
              help="Overall time per command, failover and retries included.")
@click.pass_context
def schedctl(ctx: click.Context, server: str, token: str | None, namespace: str | None, ca_file: str | None,
             config_path: str, as_json: bool, timeout: float) -> None:
    """Schedule jobs on a schedulerd cluster and look at them.

    \b
    Example:
        schedctl --server https://10.0.0.1:8080,https://10.0.0.2:8080 --token "$TOKEN" list
    """
    config = _config(config_path)
    if ctx.get_parameter_source("server") == click.core.ParameterSource.DEFAULT and "server" in config:
        server = str(config["server"])
    token = token if token is not None else config.get("token")
    ca_file = ca_file if ca_file is not None else config.get("ca_file")
    try:
        client = Client(server, timeout_s=timeout, token=token, ca_file=ca_file, namespace=namespace)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--server'") from None
    ctx.obj = Session(client, as_json, _server_urls(server), token, ca_file, namespace)


def _config(path: str) -> dict[str, Any]:
    """The config file's settings; a missing default file is no error, a broken one is."""
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded):
        if path != CONFIG_PATH:
            raise click.BadParameter(f"no such file {path!r}", param_hint="'--config'")
        return {}
    try:
        with open(expanded, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"cannot read {path!r}: {exc}", param_hint="'--config'") from None
    unknown = sorted(set(data) - {"server", "token", "ca_file"}) if isinstance(data, dict) else ["(not a mapping)"]
    if unknown:
        raise click.BadParameter(f"{path!r}: unknown keys {', '.join(unknown)}; allowed: server, token, ca_file",
                                 param_hint="'--config'")
    return data


def _server_urls(server: str) -> tuple[str, ...]:
    # The client takes a bare host:port as http://; the worker SDK wants full URLs.
    urls = (url.strip().rstrip("/") for url in server.split(","))
    return tuple(url if "://" in url else f"http://{url}" for url in urls if url)


@click.group(invoke_without_command=True)
@click.pass_context
def cluster(ctx: click.Context) -> None:
    """Show the cluster's nodes (state, groups held and led) and this node's Raft groups.

    \b
    Examples:
        schedctl --server http://10.0.0.2:8080 cluster
        schedctl cluster remove-node n-3f2a9c01b7de
    """
    if ctx.invoked_subcommand is None:
        session: Session = ctx.obj
        session.show(session.client.cluster(), cluster_text)


@cluster.command("remove-node")
@click.argument("node_id")
@click.pass_obj
def remove_node(session: Session, node_id: str) -> None:
    """Drain NODE_ID out of the cluster (admin token): its replicas move to the other nodes,
    then it leaves every group and stops serving. `schedctl cluster` shows the progress.

    \b
    Example:
        schedctl --token "$ADMIN_TOKEN" cluster remove-node n-3f2a9c01b7de
    """
    answer = session.client.remove_node(node_id)
    session.show(answer, lambda a: f"node {a['node_id']} is {a['state']}: its replicas move to the other nodes")


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


@click.command("audit")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.pass_obj
def audit_command(session: Session, limit: int) -> None:
    """Show who changed what, newest first (needs an admin token).

    \b
    Example:
        schedctl --token "$ADMIN_TOKEN" audit --limit 20
    """
    page = session.client.audit(limit=limit)
    session.show(page, lambda doc: format_table(("AT", "WHO", "WHAT", "OUTCOME", "VIA"), [
        (r["at"], r["who"], r["what"], r["outcome"], r["via"]) for r in doc["records"]]))


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


for _command in (*jobs.COMMANDS, backfill.backfill, explain.explain, *runs.COMMANDS, cluster, top_command, audit_command, completion,
                 worker, calendar, queue):
    schedctl.add_command(_command)


def main() -> None:
    schedctl.main(prog_name="schedctl")


if __name__ == "__main__":
    main()
