"""A second daemon on a data dir in use stops with one line naming the process holding it."""
from __future__ import annotations

import os
import pathlib

import pytest
from click.testing import CliRunner

from schedulerd import datadir_lock
from schedulerd.main import cli


def test_a_held_data_dir_is_refused_naming_its_holder_until_it_is_let_go(tmp_path: pathlib.Path) -> None:
    fd = datadir_lock.hold(str(tmp_path))
    with pytest.raises(datadir_lock.DataDirInUse, match=f"in use by process {os.getpid()} "):
        datadir_lock.hold(str(tmp_path))
    os.close(fd)  # as when the holder ends, kill -9 included
    os.close(datadir_lock.hold(str(tmp_path)))


def test_schedulerd_on_a_data_dir_in_use_prints_one_line_and_no_traceback(tmp_path: pathlib.Path) -> None:
    fd = datadir_lock.hold(str(tmp_path))
    try:
        for args in (["--data-dir", str(tmp_path), "--http", "127.0.0.1:1"],
                     ["restore", "--from", __file__, "--data-dir", str(tmp_path)]):
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 1
            (line,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
            assert f"data dir {tmp_path} is in use by process {os.getpid()}" in line
            assert "Traceback" not in result.output
    finally:
        os.close(fd)
