from __future__ import annotations

import pathlib
from typing import Iterator

import pytest

from tests.integration.harness import Cluster


@pytest.fixture
def make_cluster(tmp_path: pathlib.Path) -> Iterator:
    clusters: list[Cluster] = []

    def make(n: int, extra_args: list[str] | None = None, token: str | None = None, ready: bool = True,
             groups: int = 1) -> Cluster:
        cluster = Cluster.create(str(tmp_path), n, extra_args, token, groups)
        clusters.append(cluster)
        cluster.start(wait=ready)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


@pytest.fixture(autouse=True)
def _print_logs_on_failure(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[None]:
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for log in sorted(tmp_path.glob("*.log")):
            print(f"==== {log.name} (last 60 lines) ====")
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
