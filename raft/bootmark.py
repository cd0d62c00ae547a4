"""Whether a node's LMDB store can be trusted when it is opened again.

The store commits without fsync. The Raft journal (fsynced before any entry is
acknowledged) and the snapshot file (fsynced when written) are the durable
record; the store is what they add up to. A process crash (kill -9, the OOM
killer) leaves every LMDB commit whole in the OS page cache. Only a crash of the
machine can leave the file torn: a meta page on disk that points at data pages
which never got there, which LMDB would read as garbage or fault on.

So the store notes the boot it is written in (`boot_id`, a new random value at
every Linux boot) and whether it was closed cleanly, after an env sync. Opened
in another boot without that clean close, it is thrown away before LMDB reads
it, and the node rebuilds from its snapshot and journal like a wiped node.
Where the kernel gives no boot id, the store keeps fsyncing every commit."""
from __future__ import annotations

import os

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MARKER = "boot.marker"
_CLEAN, _DIRTY = "clean", "dirty"


def current_boot() -> str | None:
    """This boot's id, or None where the kernel does not give one."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def torn_by_reboot(store_dir: str, boot: str) -> bool:
    """True if the store was being written in another boot and never closed cleanly."""
    try:
        with open(os.path.join(store_dir, MARKER), encoding="ascii") as f:
            marked_boot, _, state = f.read().strip().partition(" ")
    except FileNotFoundError:
        return False  # a new store, or one written by a build that fsynced every commit
    return state != _CLEAN and marked_boot != boot


def mark(store_dir: str, boot: str, clean: bool) -> None:
    """Durably record the boot and state; dirty must be on disk before the first unsynced commit."""
    path = os.path.join(store_dir, MARKER)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{boot} {_CLEAN if clean else _DIRTY}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(store_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
