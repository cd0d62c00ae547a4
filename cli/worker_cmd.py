"""`schedctl worker`: run tasks without writing a worker.

- `schedctl worker [run] --queue Q -- COMMAND`: a shell command for each task, the
  way a crontab line runs a command at its time, with schedulerd's at-least-once
  delivery, leases, retries and dead letters around it. The command gets the
  task's payload as JSON on stdin and the task's identity in the environment;
  exit status 0 acks the run, anything else nacks it (and so retries it with
  backoff until max_attempts, then dead-letters it).
- `schedctl worker http`: the built-in HTTP executor for jobs with an http target."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import threading
from typing import IO, Any, Sequence

import click

from schedulerd import timefmt
from schedulerd.cli.session import Session
from schedulerd.destinations import DestinationPolicy
from schedulerd.gctune import tune_gc
from schedulerd.sdk.http_executor import HttpExecutor
from schedulerd.sdk.worker import Task, Worker

# Kept of the command's stdout for the ack result; well under result_bytes_max (16 KiB).
STDOUT_TAIL_BYTES = 2048
# Kept of stderr for the nack error. The SDK keeps the first 1 KiB of an error's
# message line, so the tail must fit in it with the "CommandFailed: exit status N: " lead.
STDERR_TAIL_BYTES = 960
_READ_BYTES = 64 * 1024
# A command past the job's timeout_s gets SIGTERM, and SIGKILL this much later.
KILL_GRACE_S = 5.0


class CommandFailed(Exception):
    """The task's command exited non-zero or was killed; the message is what the nack says."""


def task_env(task: Task) -> dict[str, str]:
    """The variables a task's command finds in its environment, besides the worker's own."""
    return {
        "SCHEDULERD_RUN_ID": task.run_id,
        "SCHEDULERD_JOB_ID": task.job_id,
        "SCHEDULERD_QUEUE": task.queue,
        "SCHEDULERD_IDEMPOTENCY_KEY": task.idempotency_key,
        "SCHEDULERD_ATTEMPT": str(task.attempt),
        "SCHEDULERD_SCHEDULED_TIME": str(timefmt.to_iso(timefmt.from_datetime(task.scheduled_time))),
        "SCHEDULERD_FENCE": str(task.fence),
    }


class _Watch:
    """One command's ends: its exit, its lease lost, or a kill. Made before the command
    starts, so news that comes while it is starting is not missed."""

    def __init__(self) -> None:
        self.wake = threading.Event()  # set on exit or on a lost lease
        self.exited = False
        self.lost = False
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._proc = proc
            if self._killed:
                _signal_group(proc, signal.SIGKILL)

    def exit(self) -> None:
        self.exited = True
        self.wake.set()

    def lose(self) -> None:
        self.lost = True
        self.wake.set()

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            if self._proc is not None:
                _signal_group(self._proc, signal.SIGKILL)


class Commands:
    """Runs `command` for each task, and stops the ones whose lease is lost.

    Each command leads a process group of its own, so a stop reaches whatever it started
    too. A lost lease means the cluster may hand the run to another worker: the command is
    stopped then, so two copies of one run do not overlap (its nack is then refused as
    stale, which is expected)."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], _Watch] = {}

    def run(self, task: Task) -> dict[str, Any]:
        """The SDK's handler, in its thread: the ack result on exit 0, else CommandFailed."""
        key, watch = (task.run_id, task.fence), _Watch()
        with self._lock:
            self._running[key] = watch
        try:
            return run_command(self.command, task, watch)
        finally:
            with self._lock:
                self._running.pop(key, None)

    def lease_lost(self, task: Task) -> None:
        """The SDK's lease-lost hook, in the worker's loop: the command's thread stops it."""
        with self._lock:
            watch = self._running.get((task.run_id, task.fence))
        if watch is not None:
            watch.lose()

    def kill_all(self) -> None:
        """SIGKILL every command still running: the worker exits without its drain."""
        with self._lock:
            watches = list(self._running.values())
        for watch in watches:
            watch.kill()


def run_command(command: Sequence[str], task: Task, watch: _Watch | None = None) -> dict[str, Any]:
    """Run `command` for one task: the ack result on exit 0, CommandFailed otherwise.

    A job's timeout_s ends the attempt on the server: the run is retried, maybe on this
    worker. The command is stopped then too, so two copies of one run do not overlap
    and a hung command does not hold its slot for good; and so it is when `watch`
    hears that the lease was lost."""
    watch = watch or _Watch()
    stdin = json.dumps(task.payload, separators=(",", ":")).encode()
    proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **task_env(task)}, process_group=0)
    assert proc.stdin and proc.stdout and proc.stderr  # all three were asked for as pipes
    watch.started(proc)
    # One thread per pipe: a command that fills stderr while we wait on stdout (or
    # never reads its stdin) must not deadlock, and only the tails are kept.
    tails = [bytearray(), bytearray()]
    threads = [threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True),
               threading.Thread(target=_keep_tail, args=(proc.stdout, tails[0], STDOUT_TAIL_BYTES),
                                daemon=True),
               threading.Thread(target=_keep_tail, args=(proc.stderr, tails[1], STDERR_TAIL_BYTES),
                                daemon=True)]
    for thread in threads:
        thread.start()
    threading.Thread(target=lambda: (proc.wait(), watch.exit()), daemon=True).start()
    watch.wake.wait(task.timeout_s)
    stopped = None
    if not watch.exited:
        stopped = "lease lost" if watch.lost else f"timed out after {task.timeout_s:g}s (the job's timeout_s)"
        _stop(proc)
    code = proc.wait()
    for thread in threads:
        # A child the command left behind may hold its pipes open: do not wait on it.
        thread.join(KILL_GRACE_S)
    stdout_tail, stderr_tail = (_text(tail) for tail in tails)
    if code == 0 and stopped is None:
        return {"exit_code": 0, "stdout_tail": stdout_tail}
    exit_text = f"{stopped}, {_exit_text(code)}" if stopped else _exit_text(code)
    raise CommandFailed(f"{exit_text}: {stderr_tail}" if stderr_tail else exit_text)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, then SIGKILL after KILL_GRACE_S."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)  # what the command left behind, if it exited


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass  # the group is empty: everyone in it has exited


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    except BrokenPipeError:
        pass  # the command did not read its payload: its choice, not a failure
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


def _keep_tail(pipe: IO[bytes], tail: bytearray, bytes_max: int) -> None:
    while chunk := pipe.read1(_READ_BYTES):  # type: ignore[attr-defined]
        tail += chunk
        del tail[:-bytes_max]
    pipe.close()


def _text(tail: bytearray) -> str:
    # The cut may split a UTF-8 sequence at the front: drop the broken character.
    return bytes(tail).decode("utf-8", errors="ignore")


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class _WorkerGroup(click.Group):
    """`schedctl worker --queue Q -- COMMAND` keeps working: no subcommand means `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_WorkerGroup)
def worker() -> None:
    """Run tasks without writing a worker: a shell command per task (`run`, the
    default) or the built-in HTTP executor (`http`).

    \b
    Examples:
        schedctl worker --queue backups -- /usr/local/bin/backup --full
        schedctl worker http --queue webhooks --concurrency 200
    """


def _start(session: Session, worker_id: str | None, concurrency: int) -> Worker:
    try:
        return Worker(list(session.servers), worker_id=worker_id, concurrency=concurrency, token=session.token,
                      ca_file=session.ca_file, namespace=session.namespace)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run(runner: Worker) -> None:
    # The SDK logs each task (started, acked, nacked) and lease trouble: show them.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    tune_gc()
    runner.run()


@worker.command("run", context_settings={"allow_interspersed_args": False})
@click.option("--queue", "queues", multiple=True, required=True, metavar="QUEUE",
              help="Queue to take tasks from; repeat for more.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Commands running at once.")
@click.option("--worker-id", metavar="ID", help="Name in leases and logs [host-pid-random].")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def run_worker(session: Session, queues: tuple[str, ...], concurrency: int,
               worker_id: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND for every task of the given queues, until SIGINT or SIGTERM.

    \b
    COMMAND gets the task's payload as JSON on stdin, and in its environment
    SCHEDULERD_RUN_ID, SCHEDULERD_JOB_ID, SCHEDULERD_QUEUE, SCHEDULERD_ATTEMPT,
    SCHEDULERD_SCHEDULED_TIME (ISO 8601 UTC), SCHEDULERD_FENCE and
    SCHEDULERD_IDEMPOTENCY_KEY (the same on every retry of one occurrence: the
    key to dedupe on, since a run may be delivered more than once).
    Exit status 0 acks the run with the last 2 KiB of stdout; anything else
    nacks it with the exit status and the last part of stderr, so it is retried
    with backoff and dead-lettered after max_attempts. A command still running
    at the job's timeout_s, or when its lease is lost (the cluster may then run
    it elsewhere), gets SIGTERM (SIGKILL 5 s later), with every process it
    started: each command leads a process group of its own. SIGINT or SIGTERM
    lets running commands finish and settle; a second SIGINT kills them.

    \b
    A crontab line such as
        30 2 * * *  /usr/local/bin/backup --full
    becomes a job and a worker:
        schedctl create --id backup --cron '30 2 * * *' --tz Europe/Berlin --queue backups
        schedctl worker --queue backups -- /usr/local/bin/backup --full
    Put `--` before COMMAND when it has options of its own.

    \b
    Example:
        schedctl worker run --queue backups --concurrency 2 -- /usr/local/bin/backup --full
    """
    if shutil.which(command[0]) is None:
        raise click.BadParameter(f"{command[0]!r} is not an executable file or on PATH",
                                 param_hint="'COMMAND'")
    runner = _start(session, worker_id, concurrency)
    commands = Commands(command)
    for queue in queues:
        runner.handler(queue)(commands.run)
    runner.on_lease_lost(commands.lease_lost)
    try:
        _run(runner)
    finally:
        # Reached with commands still running only on a second SIGINT (the drain cut
        # short): their leases will lapse, so they must not run on beside a retry.
        commands.kill_all()


@worker.command("http")
@click.option("--queue", "queues", multiple=True, default=("default",), show_default=True, metavar="QUEUE",
              help="Queue to take tasks from; repeat for more.")
@click.option("--concurrency", type=click.IntRange(min=1), default=50, show_default=True,
              help="Calls in flight at once (and the connection pool's size).")
@click.option("--worker-id", metavar="ID", help="Name in leases and logs [host-pid-random].")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              help="Verify https targets against this CA bundle instead of the system's.")
@click.option("--allow-private-targets", is_flag=True,
              help="Call loopback, link-local and cloud-metadata addresses too (refused by default: a job "
                   "could otherwise reach this host's own services); for a local test.")
@click.pass_obj
def http_worker(session: Session, queues: tuple[str, ...], concurrency: int, worker_id: str | None,
                ca_file: str | None, allow_private_targets: bool) -> None:
    """Call each task's http target, until SIGINT or SIGTERM.

    \b
    A job's target says what to call:
        schedctl create --id close-day --cron '0 0 * * *' --queue webhooks \\
            --target-url https://billing.internal/close-day
    Each call sends Idempotency-Key: <job_id>:<scheduled_time> (the same on every
    retry of one occurrence: dedupe on it). 2xx acks with the status and the start
    of the body; any other status (a redirect too: it is not followed), a
    timeout (target timeout_s, else the job's
    timeout_s, else 30 s) or a connection error nacks, so the run is retried with
    backoff and dead-lettered after max_attempts. A target that is, or whose
    name resolves to, a loopback, link-local or cloud-metadata address is
    refused and nacked (--allow-private-targets: called anyway).

    \b
    Example:
        schedctl worker http --queue webhooks --concurrency 200
    """
    ssl_context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    executor = HttpExecutor(concurrency, ssl=ssl_context,
                            policy=None if allow_private_targets else DestinationPolicy())
    runner = _start(session, worker_id, concurrency)
    for queue in queues:
        runner.handler(queue)(executor)
    runner.on_stopped(executor.close)
    _run(runner)
