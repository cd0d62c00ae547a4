"""raft/pysyncobj_patches.py is the one place that reaches into pysyncobj, and it
refuses a pysyncobj it was not written against."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# pysyncobj's private names, as Python mangles them.
PRIVATE = re.compile(r"_(SyncObj|Serializer|TcpConnection|Journal|FileJournal|Poller)__\w+")


def test_no_other_module_touches_pysyncobj_internals() -> None:
    found = []
    for top in ("schedulerd", "storage", "raft", "cli"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "pysyncobj_patches.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line) or re.search(r"pysyncobj\.\w+\.\w+\s*=", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_another_pysyncobj_version_is_refused_at_import() -> None:
    probe = ("import importlib.metadata as m\n"
             "real = m.version\n"
             "m.version = lambda name: '0.3.18' if name == 'pysyncobj' else real(name)\n"
             "import schedulerd.raft.pysyncobj_patches\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "patches pysyncobj 0.3.17's internals, and pysyncobj 0.3.18 is installed" in out.stderr
    assert "install pysyncobj==0.3.17" in out.stderr
