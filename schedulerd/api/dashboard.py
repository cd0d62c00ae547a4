"""GET /ui: the dashboard, one static page served by the daemon (no build step,
no other server). It reads the same public API as schedctl and refreshes itself."""
from __future__ import annotations

from importlib.resources import files

from aiohttp import web

_PAGE = files("schedulerd").joinpath("static/dashboard.html").read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_PAGE, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})
