"""The simulated disk's rules: a power loss keeps what was synced and forgets the rest."""
from __future__ import annotations

import errno
import os
import pathlib

import pytest

from tests.sim.disk import SimDisk
from tests.sim.world import World


def _write(path: pathlib.Path, data: bytes, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _machine(tmp_path: pathlib.Path) -> tuple[World, SimDisk, pathlib.Path]:
    world = World(seed=1)
    disk = SimDisk(world)
    root = tmp_path / "n1"
    root.mkdir()
    world.data_roots["n1"] = str(root)
    return world, disk, root


def test_power_loss_keeps_what_was_synced(tmp_path: pathlib.Path) -> None:
    world, disk, root = _machine(tmp_path)
    with world.installed(disk.installed):
        _write(root / "journal", b"a" * 100, sync=True)
        _write(root / "journal", b"b" * 50, sync=False)
        _write(root / "never-synced", b"c" * 10, sync=False)
        _write(root / "snapshot.tmp", b"d" * 20, sync=True)
        os.replace(root / "snapshot.tmp", root / "snapshot")
        world.rng.random = lambda: 1.0  # type: ignore[method-assign]  # no unsynced page survives
        disk.crash_machine(str(root), world.rng)
    assert (root / "journal").read_bytes() == b"a" * 100
    assert not (root / "never-synced").exists()
    assert (root / "snapshot").read_bytes() == b"d" * 20


def test_a_full_disk_fails_writes_and_syncs(tmp_path: pathlib.Path) -> None:
    world, disk, root = _machine(tmp_path)
    with world.installed(disk.installed):
        world.full_disks.add("n1")
        with pytest.raises(OSError) as failed:
            _write(root / "journal", b"x", sync=True)
        assert failed.value.errno == errno.ENOSPC
        assert os.statvfs(root).f_bavail == 0
        world.full_disks.clear()
        _write(root / "journal", b"y", sync=True)
    assert (root / "journal").read_bytes() == b"y"
