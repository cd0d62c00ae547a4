"""Log compaction snapshots written beside the tick thread, not in it.

pysyncobj calls the serializer in its tick thread, the thread that also sends
heartbeats. At 1M jobs the LMDB copy, its CRC pass and fsync of a 736 MB file
held that thread for seconds: followers timed out and elected a new leader, and
the scale bench's p99 lateness went from 34 ms to 3.7 s. Given a
`serializeChecker`, pysyncobj lets the serializer return at once, asks every
tick whether it is done, and deletes log entries only once it reports success.

Two details keep that safe. pysyncobj renames `<snapshot>.tmp` over the
snapshot as soon as the serializer returns; the serializer leaves a hard link to
the current snapshot there, so that rename changes nothing and the previous
snapshot, which the journal continues from, stays until the new one is whole
and fsynced. The new file is put in place by the checker, in the tick thread,
so it can never race that rename. A store restored from a received snapshot
meanwhile makes the copy in progress stale: it is waited for and thrown away.

Replicas reach a compaction at the same log index. Copying at once, all three
slow down together; one at a time, a majority is always at full speed. So a
copy starts after `delay_s()` (the group puts followers first, one after the
other, and the leader last).

The first snapshot of a data dir (no previous one to keep) is written in the
call, as before, and unpaced: pacing it would hold the tick thread longer. A
background copy is paced (`snapshot_write_bytes_per_s`), and staged in memory first
where there is room (`STAGE_DIR`), so its LMDB read txn is open for the
fraction of a second the staging takes instead of the whole paced write. Apply goes
on meanwhile; the copy may hold entries after the ones named in its header, which
replay skips."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from pysyncobj import SERIALIZER_STATE

from schedulerd.raft import fileio, snapshot
from schedulerd.raft.store import Store

log = logging.getLogger("schedulerd.snapshot")

SIZE_READ_EVERY_S = 1.0
# A background copy is first made into an unlinked file here, in memory, where it has
# room for the store; the paced write then reads it with no LMDB read txn open
# (raft/snapshot.py). No room: LMDB copies through a pipe as the write goes, holding its
# read txn all that time, and the store writes more back afterwards.
STAGE_DIR = "/dev/shm"


class SnapshotWriter:
    def __init__(self, store: Store, path: str, delay_s: Callable[[], float] = lambda: 0.0,
                 bytes_per_s: int = 0, stage_dir: str | None = STAGE_DIR) -> None:
        self.store = store
        self.path = path
        self._delay_s = delay_s
        self._bytes_per_s = bytes_per_s
        self._stage_dir = stage_dir
        self._cancel = threading.Event()
        self._next = path + ".next"
        self._tmp_link = path + ".tmp"
        # The previous snapshot's file, kept for the next copy to write over (raft/snapshot.py).
        self._retired = path + ".retired"
        self._keep_next_for_reuse()  # a copy cut short by a stop
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished: int | None = None  # a SERIALIZER_STATE to report once
        self._size = 0
        self._size_read_at = 0.0

    def write(self, tmp_path: str, data: tuple[Any, ...]) -> None:
        """pysyncobj's serializer (tick thread): start a snapshot as of the last applied entry.

        A failure here is raised (pysyncobj then leaves its .tmp alone) and reported
        as FAILED by the next state(): pysyncobj waits for an outcome before it
        compacts again, so a missing one would stop compaction for good."""
        try:
            if not os.path.exists(self.path):
                snapshot.write(self.store, tmp_path, data)
                self._finished = SERIALIZER_STATE.SUCCESS
                return
            self._tmp_link = tmp_path
            if os.path.lexists(tmp_path):
                os.remove(tmp_path)
            os.link(self.path, tmp_path)
            self._error = None
            self._cancel.clear()
            self._thread = threading.Thread(target=self._copy, args=(data, self._delay_s()),
                                            name="snapshot-writer", daemon=True)
            self._thread.start()
        except Exception as exc:
            log.error("snapshot_failed path=%s error=%r", self.path, exc)
            self._finished = SERIALIZER_STATE.FAILED
            raise

    def _copy(self, data: tuple[Any, ...], delay_s: float) -> None:
        if self._cancel.wait(delay_s):
            self._error = RuntimeError("abandoned before it started")
            return
        try:
            if os.path.exists(self._retired):
                os.replace(self._retired, self._next)
            snapshot.write(self.store, self._next, data, self._bytes_per_s, self._stage_dir)
        except BaseException as exc:  # reported to the tick thread by state()
            self._error = exc

    def busy(self) -> bool:
        """A snapshot is being written, or its outcome is not yet reported to pysyncobj."""
        return self._thread is not None or self._finished is not None

    def size_bytes(self) -> int:
        """The current snapshot's size; 0 before the first. Once there is one, read from
        the file at most every SIZE_READ_EVERY_S: the compaction check asks at every tick,
        and py-spy put the stat at 0.4-1.2% of a busy tick thread. A new snapshot's size
        is seen up to that late, which moves the next compaction by as much."""
        now = time.monotonic()
        if self._size and now < self._size_read_at + SIZE_READ_EVERY_S:
            return self._size
        try:
            self._size = os.path.getsize(self.path)
        except FileNotFoundError:
            self._size = 0
        self._size_read_at = now
        return self._size

    def state(self) -> int:
        """pysyncobj's serializeChecker (tick thread). Never raises: an exception out of
        pysyncobj's tick would stop the node's Raft work."""
        if self._finished is not None:
            finished, self._finished = self._finished, None
            return finished
        thread = self._thread
        if thread is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if thread.is_alive():
            return SERIALIZER_STATE.SERIALIZING
        self._thread = None
        error = self._error
        if error is None:
            try:
                os.replace(self._next, self.path)
                fileio.fsync_dir(self.path)
                self._retire_previous()
                return SERIALIZER_STATE.SUCCESS
            except Exception as exc:
                error = exc
        log.error("snapshot_failed path=%s error=%r", self.path, error)
        self._clean_up_failed()
        return SERIALIZER_STATE.FAILED

    def _clean_up_failed(self) -> None:
        try:
            self._remove_tmp_link()
            self._keep_next_for_reuse()
        except OSError as exc:
            log.error("snapshot_cleanup_failed path=%s error=%r", self.path, exc)

    def _remove_tmp_link(self) -> None:
        if os.path.lexists(self._tmp_link):
            os.remove(self._tmp_link)

    def _retire_previous(self) -> None:
        """Keep the previous snapshot's file for the next copy to write over: never
        freeing it spares the disk a 740 MB unlink per compaction."""
        if os.path.lexists(self._tmp_link):
            os.replace(self._tmp_link, self._retired)

    def abandon(self) -> None:
        """Wait for a copy in progress and drop it (before a restore replaces the store, or at close)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._cancel.set()
            thread.join()
            self._clean_up_failed()
            log.info("snapshot_abandoned path=%s: a restore or shutdown came before the copy was done", self.path)
            self._finished = SERIALIZER_STATE.FAILED

    def _keep_next_for_reuse(self) -> None:
        """An unfinished copy's file is not a snapshot; the next copy writes over it."""
        if os.path.exists(self._next):
            os.replace(self._next, self._retired)
