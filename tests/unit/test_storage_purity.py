"""storage/ is the pure state machine: every replica applying the same entries to the
same store must write the same bytes. So it reads no clock, no randomness, no
environment and no file, and starts no thread; time, jitter and ids arrive in the
entry. This reads its source as Python (not as text, where `from time import time`
or `os.urandom` slip past a pattern) and holds it to an allow-list."""
from __future__ import annotations

import ast
import pathlib

import pytest

STORAGE = pathlib.Path(__file__).resolve().parents[2] / "storage"

# What storage/ may import: its own modules (schedulerd.storage), its libraries (LMDB, msgpack through
# msgspec, croniter), and stdlib modules that do no I/O. zoneinfo reads the zone's
# tzdata file, a pure function of the zone's name.
ALLOWED_MODULES = {
    "__future__", "bisect", "calendar", "collections", "contextlib", "copy", "croniter", "dataclasses", "datetime", "enum",
    "functools", "hashlib", "itertools", "lmdb", "math", "msgspec", "struct", "threading", "typing", "zlib",
    "zoneinfo",
}
OWN = "schedulerd.storage"
SHARED_CONSTANTS = {"schedulerd.units"}  # constants only, no I/O
# threading is there for the lock that guards the cron memo, and nothing else of it.
ALLOWED_ATTRIBUTES = {"threading": {"Lock", "RLock"}}
FORBIDDEN_CALLS = {"open", "eval", "exec", "compile", "__import__", "input", "print", "breakpoint", "hash"}
# Any call of these reads a clock: datetime.now(), date.today() and the like.
CLOCK_METHODS = {"now", "utcnow", "today"}
# Opening an environment touches files: raft/store.py does that.
FORBIDDEN_ATTRIBUTES = {"lmdb": {"open", "Environment"}}


def _allowed(module: str) -> bool:
    return (module.split(".")[0] in ALLOWED_MODULES or module == OWN or module.startswith(OWN + ".")
            or module in SHARED_CONSTANTS)


def violations(source: str, name: str = "<source>") -> list[str]:
    """What in source breaks the rules above, as 'name:line: what'."""
    tree = ast.parse(source, name)
    imported: dict[str, str] = {}  # local name -> the module it is
    out: list[str] = []

    def bad(node: ast.AST, what: str) -> None:
        out.append(f"{name}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                imported[alias.asname or top] = top
                if not _allowed(alias.name):
                    bad(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level == 0 and not _allowed(node.module or ""):
                bad(node, f"imports from {node.module}")
            for alias in node.names:
                allowed = ALLOWED_ATTRIBUTES.get(top)
                if allowed is not None and alias.name not in allowed:
                    bad(node, f"imports {alias.name} from {top}")
                if alias.name in FORBIDDEN_ATTRIBUTES.get(top, ()):
                    bad(node, f"imports {alias.name} from {top}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = imported.get(node.value.id)
            allowed = ALLOWED_ATTRIBUTES.get(module or "")
            if allowed is not None and node.attr not in allowed:
                bad(node, f"uses {node.value.id}.{node.attr}")
            if node.attr in FORBIDDEN_ATTRIBUTES.get(module or "", ()):
                bad(node, f"uses {node.value.id}.{node.attr}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                bad(node, f"calls {func.id}()")
            elif isinstance(func, ast.Attribute) and func.attr in CLOCK_METHODS:
                bad(node, f"calls .{func.attr}() (a clock)")
    return out


def test_storage_reads_no_clock_randomness_environment_or_file() -> None:
    files = sorted(STORAGE.glob("*.py"))
    assert len(files) > 10
    found = [v for path in files for v in violations(path.read_text(), path.name)]
    assert found == []


@pytest.mark.parametrize("snippet", [
    "import time\nt = time.time_ns()",
    "from time import time",
    "from time import monotonic as m",
    "import os\nkey = os.urandom(8)",
    "import os\nv = os.getenv('X')",
    "from os import environ",
    "import random",
    "import uuid",
    "import secrets",
    "import socket",
    "import threading\nthreading.Thread(target=print).start()",
    "from threading import Thread",
    "import threading as t\nt.Timer(1, None)",
    "import subprocess",
    "import ctypes",
    "from datetime import datetime\nd = datetime.now()",
    "import datetime\nd = datetime.date.today()",
    "f = open('x')",
    "h = hash('x')",
    "import lmdb\nenv = lmdb.open('x')",
    "import importlib",
    "import pathlib",
    "import logging",
    "from schedulerd.raft import store",
    "from schedulerd import errors",
    "import schedulerd.node",
])
def test_the_check_finds_each_way_in(snippet: str) -> None:
    assert violations(snippet), snippet


def test_the_check_lets_a_memo_lock_and_pure_imports_through() -> None:
    assert violations("import threading\n_LOCK = threading.Lock()\n"
                      "from schedulerd.storage import keys\nfrom schedulerd.storage.ops import Op\nimport zlib\n"
                      "from datetime import datetime, timezone\nd = datetime.fromtimestamp(0, timezone.utc)") == []
