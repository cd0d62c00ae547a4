"""A disk that forgets, under the real files the nodes write (on tmpfs).

Every fsync and fdatasync records how much of the file is durable; a machine crash
cuts each of the node's files back to that (keeping, as the seed decides, part of
what was written after: the kernel may have written some pages back on its own), and
removes files never synced. A rename, link or unlink moves the record as the directory
entry moves. LMDB's own files are left alone: the store's boot mark makes a node
discard its store after a machine crash and rebuild it from snapshot and journal, as
it does on a real machine. A full disk fails the node's writes with ENOSPC.

Not modelled (docs/decisions.md): overwrites in place after a sync are never undone;
a directory entry is durable once its file is synced (no lost renames); a partial
write of one call; the kernel's real write-back order."""
from __future__ import annotations

import os
import random
from typing import Any

import pysyncobj.serializer

from tests.sim.world import World, enospc

_STORE_FILES = frozenset({"data.mdb", "lock.mdb"})


class SimDisk:
    def __init__(self, world: World) -> None:
        self.world = world
        self.durable: dict[str, int] = {}  # path -> bytes that survive a machine crash
        self.syncs = 0

    def _path(self, fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    def installed(self, patch: Any) -> None:
        """Install the os patches through `patch(owner, name, value)` (the world puts them back)."""
        real = {name: getattr(os, name) for name in
                ("fsync", "fdatasync", "replace", "rename", "link", "remove", "unlink", "ftruncate", "pwrite", "write")}

        def synced(fd: int) -> None:
            path = self._path(fd)
            if path is not None and os.path.isfile(path):
                self.durable[path] = os.fstat(fd).st_size
                self.syncs += 1

        def fsync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            self._check_room(self._path(fd))
            real["fsync"](fd)
            synced(fd)

        def fdatasync(fd: Any) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            self._check_room(self._path(fd))
            real["fdatasync"](fd)
            synced(fd)

        def moved(name: str) -> Any:
            def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                real[name](src, dst, *args, **kwargs)
                src, dst = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))
                if src in self.durable:
                    self.durable[dst] = self.durable.pop(src)
                else:
                    self.durable.pop(dst, None)
            return move

        def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real["link"](src, dst, *args, **kwargs)
            src, dst = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))
            if src in self.durable:
                self.durable[dst] = self.durable[src]

        def gone(name: str) -> Any:
            def remove(path: Any, *args: Any, **kwargs: Any) -> None:
                real[name](path, *args, **kwargs)
                self.durable.pop(os.path.abspath(os.fspath(path)), None)
            return remove

        def ftruncate(fd: int, length: int) -> None:
            real["ftruncate"](fd, length)
            path = self._path(fd)
            if path in self.durable:
                self.durable[path] = min(self.durable[path], length)

        def writer(name: str) -> Any:
            def write(fd: int, *args: Any) -> int:
                if self.world.full_disks:
                    self._check_room(self._path(fd))
                return real[name](fd, *args)  # type: ignore[no-any-return]
            return write

        patch(os, "fsync", fsync)
        patch(os, "fdatasync", fdatasync)
        patch(os, "replace", moved("replace"))
        patch(os, "rename", moved("rename"))
        # pysyncobj's serializer bound os.rename at import (its atomicReplace on Linux).
        patch(pysyncobj.serializer, "atomicReplace", moved("rename"))
        patch(os, "link", link)
        patch(os, "remove", gone("remove"))
        patch(os, "unlink", gone("unlink"))
        patch(os, "ftruncate", ftruncate)
        patch(os, "pwrite", writer("pwrite"))
        patch(os, "write", writer("write"))

    def _check_room(self, path: str | None) -> None:
        if path is not None and self.world.full_disks and self.world.node_of_path(path) in self.world.full_disks:
            raise enospc(path)

    def mark_all_durable(self, root: str) -> None:
        """Files a node starts with (written before the simulation) are on disk."""
        for path in _files(root):
            self.durable[path] = os.path.getsize(path)

    def crash_machine(self, root: str, rng: random.Random) -> tuple[int, int]:
        """The machine under `root` lost power: cut every file back to what was synced.
        Returns (files cut, bytes lost)."""
        cut = lost = 0
        for path in _files(root):
            if os.path.basename(path) in _STORE_FILES:
                continue
            size = os.path.getsize(path)
            keep = self.durable.get(path)
            if keep is None:
                os.remove(path)
                cut, lost = cut + 1, lost + size
                continue
            if size > keep:
                # Part of the unsynced tail may have reached the disk before the power went.
                survived = keep + (rng.randrange(size - keep + 1) if rng.random() < 0.3 else 0)
                with open(path, "r+b") as f:
                    f.truncate(survived)
                self.durable[path] = survived
                cut, lost = cut + 1, lost + size - survived
        return cut, lost


def _files(root: str) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            found.append(os.path.join(dirpath, name))
    return sorted(found)
