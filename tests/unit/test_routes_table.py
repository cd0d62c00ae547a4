"""api/routes.py is the one table of a node's routes, and every handler in it is a
module-level function that can be imported and called alone."""
from __future__ import annotations

import importlib
import inspect

from schedulerd.api.routes import ROUTES
from tests.unit.test_preview_route import stub_node


def test_every_handler_is_a_module_level_coroutine_function() -> None:
    for method, path, handler in ROUTES:
        assert inspect.iscoroutinefunction(handler), (method, path)
        assert handler.__qualname__ == handler.__name__, f"{method} {path}: {handler.__qualname__} is nested"
        assert getattr(importlib.import_module(handler.__module__), handler.__name__) is handler


def test_the_app_serves_the_table_and_nothing_else() -> None:
    from schedulerd.api.app import make_app
    app = make_app(stub_node(), leases=None)  # type: ignore[arg-type]
    served = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.method != "HEAD"}
    assert served == {(method, path) for method, path, _ in ROUTES}
    assert len(ROUTES) == len({(method, path) for method, path, _ in ROUTES})
