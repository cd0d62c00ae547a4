"""`schedulerd`: run one node (the embedded single-node default with no flags),
or `schedulerd dev-cluster` to start three local nodes for trying it out."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import subprocess
import sys

import click
import uvloop
from aiohttp import web

from raft import snapshot
from raft.conf import RaftConfig
from schedulerd import logfmt
from schedulerd.api import make_app
from schedulerd.clock import Clock
from schedulerd.config import NodeConfig
from schedulerd.leader import LeaderLoops
from schedulerd.lease_queue import LeaseQueue
from schedulerd.node import Node

log = logging.getLogger("schedulerd")

RAFT_PORT_OFFSET = 1000  # default --raft port = --http port + this


def _addr(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{what} must be HOST:PORT, got {text!r}")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def serve(config: NodeConfig, clock: Clock) -> None:
    loop = asyncio.get_running_loop()
    node = Node(config, clock)
    node.start(loop)
    leases = LeaseQueue(node)
    loops = LeaderLoops(node)
    loops.start()
    runner = web.AppRunner(make_app(node, leases), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.http_host, config.http_port, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("node_started http=%s:%d raft=%s peers=%s data_dir=%s", config.http_host, config.http_port,
             config.raft.self_addr, ",".join(config.raft.peers) or "-", config.raft.data_dir)
    await stop.wait()
    log.info("node_stopping")
    await runner.cleanup()
    await loops.stop()
    node.stop()


@click.group(invoke_without_command=True)
@click.option("--data-dir", default="./schedulerd-data", show_default=True, help="Journal, snapshots and LMDB.")
@click.option("--http", "http_addr", default="127.0.0.1:8080", show_default=True, help="HTTP API HOST:PORT.")
@click.option("--raft", "raft_addr", default=None,
              help="Raft HOST:PORT [default: 127.0.0.1, HTTP port + 1000; Raft is never exposed by default].")
@click.option("--peers", default="", help="The other nodes' --raft addresses, comma-separated.")
@click.option("--groups", default=1, show_default=True, help="Raft groups per node (each uses raft port + g).")
@click.option("--lease-s", default=30.0, show_default=True, help="Lease length per delivery, seconds.")
@click.option("--compaction-entries", default=RaftConfig.compaction_entries_min, show_default=True,
              help="Snapshot LMDB and compact the Raft log after this many entries.")
@click.option("--clock-offset-file", default=None, type=click.Path(dir_okay=False),
              help="Testing: shift this node's wall clock by the seconds written in FILE (re-read on change).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logfmt.FORMATS),
              help="text: one line per event; json: one object per line, the event's key=value fields as keys.")
@click.pass_context
def cli(ctx: click.Context, data_dir: str, http_addr: str, raft_addr: str | None, peers: str, groups: int,
        lease_s: float, compaction_entries: int, clock_offset_file: str | None, log_level: str,
        log_format: str) -> None:
    """Run a schedulerd node. With no flags: a single-node cluster on 127.0.0.1:8080."""
    if ctx.invoked_subcommand is not None:
        return
    logfmt.configure(log_level, log_format)
    host, port = _addr(http_addr, "--http")
    # Raft is pickle on the wire (pysyncobj): loopback unless the operator names an address.
    raft_addr = raft_addr or f"127.0.0.1:{port + RAFT_PORT_OFFSET}"
    raft_host, _ = _addr(raft_addr, "--raft")
    if not _is_loopback(raft_host):
        log.warning("raft_exposed addr=%s: Raft traffic is unauthenticated pickle; keep this port on a "
                    "private network that only the cluster's nodes can reach", raft_addr)
    peer_list = tuple(p.strip() for p in peers.split(",") if p.strip())
    for p in peer_list:
        _addr(p, "--peers entry")
    config = NodeConfig(raft=RaftConfig(self_addr=raft_addr, peers=peer_list, data_dir=data_dir, groups=groups,
                                        compaction_entries_min=compaction_entries),
                        http_host=host, http_port=port, lease_s=lease_s)
    try:
        config.validate()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    uvloop.run(serve(config, Clock(offset_file=clock_offset_file)))


@cli.command("dev-cluster")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(1, 7))
@click.option("--base-port", default=8080, show_default=True, help="Node i serves HTTP on base-port + i.")
@click.option("--data-dir", default="./schedulerd-dev", show_default=True, help="Node i keeps data in DIR/node-i.")
def dev_cluster(nodes: int, base_port: int, data_dir: str) -> None:
    """Start NODES local nodes in one command (Ctrl-C stops them all)."""
    raft = [f"127.0.0.1:{base_port + RAFT_PORT_OFFSET + 100 * i}" for i in range(nodes)]
    # SIGTERM must stop the children too, not orphan them: turn it into the Ctrl-C path.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    procs = []
    for i in range(nodes):
        args = [sys.executable, "-m", "schedulerd.main", "--data-dir", os.path.join(data_dir, f"node-{i}"),
                "--http", f"127.0.0.1:{base_port + i}", "--raft", raft[i],
                "--peers", ",".join(r for j, r in enumerate(raft) if j != i)]
        procs.append(subprocess.Popen(args))
        click.echo(f"node-{i}: http://127.0.0.1:{base_port + i}  raft {raft[i]}  pid {procs[-1].pid}")
    try:
        for p in procs:
            p.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()


@cli.command("backup")
@click.option("--data-dir", required=True, help="The node's data dir (the node may be running).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Backup file to write.")
@click.option("--group", default=0, show_default=True, help="Raft group to back up.")
def backup(data_dir: str, out_path: str, group: int) -> None:
    """Write a consistent copy of one group's store (safe while the node runs).

    \b
    Example:
        schedulerd backup --data-dir /var/lib/schedulerd --out /backups/sched-$(date +%F).snap
    """
    lmdb_path = os.path.join(data_dir, f"group-{group}.lmdb")
    if not os.path.isdir(lmdb_path):
        raise click.BadParameter(f"no store at {lmdb_path}", param_hint="'--data-dir'")
    try:
        applied = snapshot.write_backup(lmdb_path, out_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"backup of group {group} at raft index {applied}: {out_path} ({os.path.getsize(out_path)} bytes)")


@cli.command("restore")
@click.option("--from", "backup_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", required=True, help="An empty data dir for a node of the new cluster.")
@click.option("--group", default=0, show_default=True)
def restore(backup_path: str, data_dir: str, group: int) -> None:
    """Seed an empty data dir from a backup; do it on every node of a new cluster,
    with the same file, then start them. The cluster continues after the backup.

    \b
    Example:
        schedulerd restore --from /backups/sched-2026-11-30.snap --data-dir /var/lib/schedulerd
    """
    os.makedirs(data_dir, exist_ok=True)
    taken = sorted(name for name in os.listdir(data_dir) if name.startswith(f"group-{group}."))
    if taken:
        raise click.ClickException(f"{data_dir} already holds {', '.join(taken)}: restore needs an empty data "
                                   "dir (to rebuild one node of a running cluster, wipe it and let it catch up)")
    try:
        applied = snapshot.install_backup(backup_path, os.path.join(data_dir, f"group-{group}.snapshot"))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"group {group} of {data_dir} starts from the backup at raft index {applied}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
