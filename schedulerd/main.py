"""`schedulerd`: run one node (the embedded single-node default with no flags),
or `schedulerd dev-cluster` to start three local nodes for trying it out."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import signal
import ssl
import subprocess
import sys

import click
import uvloop
from aiohttp import web

from schedulerd import auth, datadir_lock, join, jobspec, logfmt, tracing
from schedulerd.api.app import make_app, server_options
from schedulerd.auth import TokenFile
from schedulerd.clock import Clock
from schedulerd.config import NodeConfig
from schedulerd.datadir_lock import DataDirInUse
from schedulerd.destinations import DestinationPolicy
from schedulerd.errors import SchedulerError
from schedulerd.gctune import tune_gc
from schedulerd.leader import LeaderLoops
from schedulerd.lease_queue import LeaseQueue
from schedulerd.limits import Limits
from schedulerd.node import Node
from schedulerd.raft import snapshot
from schedulerd.raft.conf import RaftConfig
from schedulerd.units import US_PER_S

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


async def serve(config: NodeConfig, clock: Clock, tokens: TokenFile | None = None,
                tls: ssl.SSLContext | None = None) -> None:
    loop = asyncio.get_running_loop()
    tracing.setup(os.environ)  # spans only with the otel extra and OTEL_* set: else nothing is imported
    node = Node(config, clock)
    node.start(loop)
    leases = LeaseQueue(node)
    loops = LeaderLoops(node)
    loops.start()
    runner = web.AppRunner(make_app(node, leases, tokens), **server_options(config.limits))
    await runner.setup()
    site = web.TCPSite(runner, config.http_host, config.http_port, reuse_address=True, ssl_context=tls)
    await site.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Always handled: the default action would end the node, and a unit's ExecReload sends it.
    loop.add_signal_handler(signal.SIGHUP, tokens.reload if tokens is not None else _nothing_to_reload)
    log.info("node_started node_id=%s http=%s:%d raft=%s peers=%s data_dir=%s",
             node.topology.node_id if node.topology else "-", config.http_host, config.http_port,
             config.raft.self_addr, ",".join(config.raft.peers) or "-", config.raft.data_dir)
    await stop.wait()
    log.info("node_stopping")
    leases.close()
    await runner.cleanup()
    await loops.stop()
    node.stop()
    tracing.disable()  # the spans still batched go out


def _nothing_to_reload() -> None:
    log.info("reload_ignored reason=no --tokens-file; the node has nothing else to reload")


@click.group(invoke_without_command=True)
@click.option("--data-dir", default="./schedulerd-data", show_default=True, help="Journal, snapshots and LMDB.")
@click.option("--http", "http_addr", default="127.0.0.1:8080", show_default=True, help="HTTP API HOST:PORT.")
@click.option("--raft", "raft_addr", default=None,
              help="Raft HOST:PORT [default: 127.0.0.1, HTTP port + 1000; Raft is never exposed by default].")
@click.option("--peers", default="", help="The other first nodes' --raft addresses, comma-separated (a new "
              "cluster's nodes; a node added later uses --join).")
@click.option("--join", "join_urls", default="", metavar="URL,...",
              help="Join a running cluster as a new node through any of its members' HTTP addresses "
                   "(http://HOST:PORT); start with the cluster's --groups and --cluster-secret-file.")
@click.option("--join-token-file", type=click.Path(exists=True, dir_okay=False),
              help="An admin token (one line) the join presents, where the cluster uses tokens.")
@click.option("--groups", default=1, show_default=True,
              help="Data Raft groups (group g uses the Raft port + g, the metadata group the Raft port + groups). "
                   "Fixed when the cluster is bootstrapped.")
@click.option("--replication-factor", type=click.Choice(["1", "3", "5"]), default=None,
              help="Replicas of each data group, fixed when the cluster is bootstrapped "
                   "[default: 3, or 1 when the cluster starts with fewer than 3 nodes].")
@click.option("--meta-replicas", type=click.Choice(["3", "5"]), default="5", show_default=True,
              help="Voters of the metadata group (the node registry and the placement) once the cluster has "
                   "that many nodes (3 while it has 3 or 4); the other nodes follow its log without a vote. "
                   "Fixed when the cluster is bootstrapped.")
@click.option("--dead-node-timeout", default="10m", show_default=True,
              help="Silence after which a node is declared dead: its replicas are re-created on the "
                   "others and it never serves again (wipe it and join it as a new node).")
@click.option("--lease-s", default=30.0, show_default=True, help="Lease length per delivery, seconds.")
@click.option("--compaction-entries", default=RaftConfig.compaction_entries_min, show_default=True,
              help="Snapshot LMDB and compact the Raft log once it holds more than this many entries "
                   "and its journal weighs --compaction-journal-ratio x the last snapshot.")
@click.option("--compaction-journal-ratio", default=RaftConfig.compaction_journal_ratio, show_default=True,
              type=click.FloatRange(0, 10),
              help="Journal bytes per snapshot byte before a compaction: the copying stays proportional "
                   "to what was written, however big the store (0: by entries alone).")
@click.option("--clock-offset-file", default=None, type=click.Path(dir_okay=False),
              help="Testing: shift this node's wall clock by the seconds written in FILE (re-read on change).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logfmt.FORMATS),
              help="text: one line per event; json: one object per line, the event's key=value fields as keys.")
@click.option("--tokens-file", type=click.Path(exists=True, dir_okay=False),
              help="API bearer tokens (hashes and scopes; `schedulerd token create` writes it). Re-read on SIGHUP.")
@click.option("--cluster-secret-file", type=click.Path(exists=True, dir_okay=False),
              help="Shared secret (16+ chars, same on every node): Raft traffic is encrypted and authenticated.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM certificate (chain) for HTTPS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key for --tls-cert.")
@click.option("--allowed-hosts", default="", metavar="NAME,...",
              help="Host names clients use to reach the API besides its own (localhost, the machine's name, "
                   "the bind address; any IP address on a 0.0.0.0/:: bind). .example.com: its subdomains; "
                   "*: any (turns the DNS-rebinding guard off).")
@click.option("--allowed-origins", default="", metavar="ORIGIN,...",
              help="Web origins (https://ops.example.com) whose pages may change things here; the node's own "
                   "origin (its dashboard) always may.")
@click.option("--target-allow", default="", metavar="CIDR|HOST,...",
              help="Let http targets reach these although refused by default (loopback, link-local, "
                   "cloud metadata), e.g. 127.0.0.0/8 for a local test.")
@click.option("--target-deny", default="", metavar="CIDR|HOST,...",
              help="Refuse http targets in these too, e.g. 10.0.0.0/8 or .corp.example.com.")
@click.option("--finished-ttl", default="7d", show_default=True, metavar="DURATION",
              help="Delete a finished one-off or a cancelled job (with its runs), and a repeating job's "
                   "runs, this long after they finished, unless the job says otherwise (finished_ttl_s, "
                   "history_ttl_s). 0: keep everything forever.")
@click.option("--archive-dir", type=click.Path(file_okay=False),
              help="Write what the sweep deletes here first: gzip JSON Lines, one file per group per hour.")
@click.option("--limit", "limit_settings", multiple=True, metavar="NAME=VALUE",
              help="Set one of the limits of schedulerd/limits.py, e.g. payload_bytes_max=131072 or "
                   "long_poll_s_max=10; repeat for more.")
@click.option("--insecure", is_flag=True,
              help="Allow a non-loopback --http without --tokens-file, or --raft without --cluster-secret-file.")
@click.pass_context
def cli(ctx: click.Context, data_dir: str, http_addr: str, raft_addr: str | None, peers: str, join_urls: str,
        join_token_file: str | None, groups: int,
        replication_factor: str | None, meta_replicas: str, dead_node_timeout: str, lease_s: float, compaction_entries: int, compaction_journal_ratio: float,
        clock_offset_file: str | None, log_level: str,
        log_format: str, tokens_file: str | None, cluster_secret_file: str | None, tls_cert: str | None,
        tls_key: str | None, allowed_hosts: str, allowed_origins: str, target_allow: str, target_deny: str,
        finished_ttl: str, archive_dir: str | None, limit_settings: tuple[str, ...], insecure: bool) -> None:
    """Run a schedulerd node. With no flags: a single-node cluster on 127.0.0.1:8080.

    \b
    Example (one of three machines):
        schedulerd --data-dir /var/lib/schedulerd --http 0.0.0.0:8080 --raft 10.0.0.1:9080 \\
            --peers 10.0.0.2:9080,10.0.0.3:9080 --tokens-file /etc/schedulerd/tokens.yaml \\
            --cluster-secret-file /etc/schedulerd/cluster.secret --tls-cert cert.pem --tls-key key.pem
    """
    if ctx.invoked_subcommand is not None:
        return
    logfmt.configure(log_level, log_format)
    host, port = _addr(http_addr, "--http")
    raft_addr = raft_addr or f"127.0.0.1:{port + RAFT_PORT_OFFSET}"
    raft_host, _ = _addr(raft_addr, "--raft")
    secret = _read_secret(cluster_secret_file) if cluster_secret_file else None
    _check_exposure(host, raft_host, tokens_file is not None, secret is not None, insecure)
    tokens = _load_tokens(tokens_file) if tokens_file else None
    peer_list = _listed(peers)
    for p in peer_list:
        _addr(p, "--peers entry")
    joining = _listed(join_urls)
    if joining and peer_list:
        raise click.UsageError("--join and --peers exclude each other: first nodes name their --peers, "
                               "a node added later joins")
    join_token = _read_secret(join_token_file) if join_token_file else None
    _hold_data_dir(data_dir)
    meta_peers = _join_meta_peers(joining, join_token, data_dir, groups)
    try:
        config = NodeConfig(raft=RaftConfig(self_addr=raft_addr, peers=peer_list, data_dir=data_dir,
                                            groups=groups, compaction_entries_min=compaction_entries,
                                            compaction_journal_ratio=compaction_journal_ratio, secret=secret),
                            http_host=host, http_port=port, http_tls=tls_cert is not None, lease_s=lease_s,
                            replication_factor=int(replication_factor) if replication_factor else None,
                            meta_replicas=int(meta_replicas),
                            dead_node_timeout_s=_duration_s(dead_node_timeout, "--dead-node-timeout"),
                            join=joining, join_token=join_token, join_meta_peers=meta_peers,
                            limits=Limits().overridden(limit_settings), archive_dir=archive_dir,
                            finished_ttl_s=_ttl_s(finished_ttl),
                            allowed_hosts=_listed(allowed_hosts), allowed_origins=_listed(allowed_origins),
                            destinations=DestinationPolicy.build(_listed(target_allow), _listed(target_deny)))
        config.validate()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if config.finished_ttl_s == 0:
        log.warning("retention_off --finished-ttl 0: finished jobs and their runs are kept forever and the "
                    "store only grows; jobs may still set finished_ttl_s")
    tune_gc()
    uvloop.run(serve(config, Clock(offset_file=clock_offset_file), tokens, _tls_context(tls_cert, tls_key)))


def _hold_data_dir(data_dir: str) -> None:
    """Take the data dir for the life of this process, or stop with one line naming its holder."""
    try:
        datadir_lock.hold(data_dir)  # the fd stays open, and the lock held, until the process ends
    except DataDirInUse as exc:
        raise click.ClickException(str(exc)) from None


def _join_meta_peers(urls: tuple[str, ...], token: str | None, data_dir: str, groups: int) -> tuple[str, ...]:
    """The metadata group's members a joining node starts with, from the cluster; none when
    not joining or when this data dir already holds its metadata log (a restart)."""
    if not urls or os.path.exists(os.path.join(data_dir, "meta.journal")):
        return ()
    try:
        shape = join.discover(urls, token)
    except join.JoinError as exc:
        raise click.ClickException(str(exc)) from None
    if shape.groups != groups:
        raise click.UsageError(f"the cluster has {shape.groups} data groups: start this node with --groups {shape.groups}")
    return shape.meta_members


def _ttl_s(text: str) -> float:
    if text.strip() == "0":
        return 0.0
    return _duration_s(text, "--finished-ttl")


def _duration_s(text: str, flag: str) -> float:
    try:
        return jobspec.parse_duration_us(text, flag) / US_PER_S
    except SchedulerError as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{flag}'") from None


def _listed(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _check_exposure(http_host: str, raft_host: str, has_tokens: bool, has_secret: bool, insecure: bool) -> None:
    """Refuse to expose an open API or plain Raft beyond loopback; say so loudly when open on loopback."""
    problems = []
    if not has_tokens and not _is_loopback(http_host):
        problems.append(f"--http {http_host} is not loopback and there is no --tokens-file: anyone who reaches "
                        "it could create, read and run jobs")
    if not has_secret and not _is_loopback(raft_host):
        problems.append(f"--raft {raft_host} is not loopback and there is no --cluster-secret-file: Raft would "
                        "be unauthenticated pickle (remote code execution for anyone who reaches it)")
    if problems and not insecure:
        raise click.UsageError("; ".join(problems) + ". Add the file(s), or --insecure on a network you trust.")
    for problem in problems:
        log.warning("insecure %s (--insecure given)", problem)
    if not has_tokens and _is_loopback(http_host):
        log.warning("auth_off the API has no --tokens-file: every local caller is admin. Fine for a "
                    "single-node trial on loopback; never for a shared machine or a cluster")


def _read_secret(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        secret = f.read().strip()
    if os.stat(path).st_mode & 0o077:
        log.warning("secret_file_readable path=%s: chmod 600 it; anyone who reads it can join the cluster", path)
    return secret


def _load_tokens(path: str) -> TokenFile:
    try:
        return TokenFile(path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tokens-file'") from None


def _tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if (cert is None) != (key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.BadParameter(f"cannot load the certificate/key: {exc}", param_hint="'--tls-cert'") from None
    return context


@cli.group("token")
def token_group() -> None:
    """Manage API tokens in a tokens file (the file holds only their hashes)."""


@token_group.command("create")
@click.option("--tokens-file", required=True, type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="Who or what uses it; shown in errors and the audit log.")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(auth.SCOPES))
@click.option("--namespace", "namespaces", multiple=True, help="Limit to these namespaces [all].")
def token_create(tokens_file: str, name: str, scopes: tuple[str, ...], namespaces: tuple[str, ...]) -> None:
    """Add a token; prints it once (only its hash is stored). SIGHUP the nodes to load it.

    \b
    Example:
        schedulerd token create --tokens-file /etc/schedulerd/tokens.yaml --name ci --scope scheduler
    """
    try:
        token = auth.add_token(tokens_file, name, list(scopes), list(namespaces) or [auth.ALL_NAMESPACES])
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(token)


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
@click.option("--group", type=click.IntRange(min=0),
              help="Raft group to back up: required when the node runs more than one (--groups).")
def backup(data_dir: str, out_path: str, group: int | None) -> None:
    """Write a consistent copy of one group's store (safe while the node runs).

    \b
    Example:
        schedulerd backup --data-dir /var/lib/schedulerd --out /backups/sched-$(date +%F).snap
    """
    if group is None:
        group = _only_group(data_dir)
    lmdb_path = os.path.join(data_dir, f"group-{group}.lmdb")
    if not os.path.isdir(lmdb_path):
        raise click.BadParameter(f"no store at {lmdb_path}", param_hint="'--data-dir'")
    try:
        applied = snapshot.write_backup(lmdb_path, out_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"backup of group {group} at raft index {applied}: {out_path} ({os.path.getsize(out_path)} bytes)")


def _only_group(data_dir: str) -> int:
    """The one group a data dir holds; a node of several needs each backed up on purpose,
    not group 0 alone by default."""
    groups = sorted(int(m.group(1)) for m in (re.fullmatch(r"group-(\d+)\.lmdb", name)
                                             for name in (os.listdir(data_dir) if os.path.isdir(data_dir) else []))
                    if m)
    if len(groups) > 1:
        raise click.UsageError(f"{data_dir} holds groups {', '.join(map(str, groups))}: back up each with "
                               "--group N, to a file of its own, and restore each with the same --group")
    return groups[0] if groups else 0


@cli.command("restore")
@click.option("--from", "backup_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", required=True, help="An empty data dir for a node of the new cluster.")
@click.option("--group", default=0, show_default=True, type=click.IntRange(min=0),
              help="The group the backup is of (the --group given to backup).")
def restore(backup_path: str, data_dir: str, group: int) -> None:
    """Seed an empty data dir from a backup; do it on every node of a new cluster,
    with the same file, then start them. The cluster continues after the backup.

    \b
    Example:
        schedulerd restore --from /backups/sched-2026-11-30.snap --data-dir /var/lib/schedulerd
    """
    _hold_data_dir(data_dir)
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
