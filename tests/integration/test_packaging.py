"""What `pip install schedulerd` puts on sys.path: one name, schedulerd. The state
machine, the Raft layer and the command line are schedulerd.storage, schedulerd.raft
and schedulerd.cli, from a wheel and from a checkout alike."""
from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ("schedulerd", "storage", "raft", "cli")
CODE = SOURCES + ("tests", "bench", "jepsen-style")
GENERIC = {"storage", "raft", "cli"}


def _python_files() -> list[pathlib.Path]:
    files = [p for top in CODE for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return files + [ROOT / "jepsen-style" / "run"]


def test_no_code_imports_the_folders_by_their_bare_names() -> None:
    found = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in GENERIC]
    assert found == []


@pytest.mark.integration
def test_the_wheel_holds_one_top_level_package_and_its_modules_import(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    for top in SOURCES:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path / "dist"),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("schedulerd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"schedulerd"}, tops
    for module in ("storage/fsm.py", "raft/group.py", "cli/main.py", "sdk/worker.py", "api/routes.py",
                   "static/dashboard.html"):
        assert f"schedulerd/{module}" in names, module

    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    # From outside any checkout, with the wheel's copy first on the path.
    probe = ("import schedulerd.storage.fsm, schedulerd.raft.group, schedulerd.cli.main, schedulerd.main, sys; "
             "print(sorted({m.__file__.split('/site/')[0] for m in map(sys.modules.get, "
             "['schedulerd.storage.fsm', 'schedulerd.raft.group', 'schedulerd.cli.main'])}))")
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == repr([str(tmp_path)]), out.stdout
