import os
from types import SimpleNamespace

import pytest

from schedulerd import diskguard
from schedulerd.diskguard import DiskGuard
from schedulerd.errors import Unavailable


def test_refuses_below_the_minimum_and_recovers(tmp_path, monkeypatch) -> None:
    free = {"blocks": 10}
    monkeypatch.setattr(diskguard.os, "statvfs", lambda p: SimpleNamespace(f_bavail=free["blocks"], f_frsize=4096))
    monkeypatch.setattr(diskguard, "RECHECK_S", 0)
    guard = DiskGuard(str(tmp_path), free_bytes_min=100 * 4096)
    with pytest.raises(Unavailable, match="disk_free_bytes_min"):
        guard.check()
    assert guard.refusals == 1
    free["blocks"] = 1000
    guard.check()


def test_real_statvfs(tmp_path) -> None:
    guard = DiskGuard(str(tmp_path), free_bytes_min=1)
    guard.check()
    assert guard.free_bytes() > 0 and os.path.isdir(guard.path)
