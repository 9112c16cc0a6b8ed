"""The browser page (``gateway/web/``): its routes, served when ``DUPLEX_GATEWAY_WEB_PAGE`` is on.

The page is plain files (HTML, one JS module, an AudioWorklet, a style sheet, an icon), read
once at start and served from memory with a strict Content-Security-Policy; it speaks the
Realtime protocol over ``/v1/realtime`` like any other client.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["WEB_PAGE_CSP", "web_page_routes"]

# The browser page's files (gateway/web/), by the name they are served under /web/; the page
# itself is index.html at /. A fixed list, so no request path ever reaches the file system.
_WEB_FILES = {
    "page.js": "text/javascript; charset=utf-8",
    "microphone-worklet.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
_WEB_INDEX = "index.html"
# Only this origin's scripts, styles, image and websocket (CSP 3's 'self' covers ws: and wss:
# of the same host); no inline code, no frames, no forms, no plugins.
WEB_PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
                " connect-src 'self'; base-uri 'none'; form-action 'none';"
                " frame-ancestors 'none'")
_WEB_HEADERS = {
    "Content-Security-Policy": WEB_PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Permissions-Policy": "microphone=(self)",
    "Cache-Control": "no-cache",
}


def _web_file(name: str) -> bytes:
    return resources.files("gateway").joinpath("web", name).read_bytes()


def web_page_routes() -> list[BaseRoute]:
    """``/`` (the page) and ``/web/<file>`` (its script, worklet, style and icon), read once
    at start; any other name under ``/web/`` is a 404, as is the whole page when it is off."""
    assets = {name: (_web_file(name), media) for name, media in _WEB_FILES.items()}
    index = _web_file(_WEB_INDEX)

    async def page(request: Request) -> Response:
        return Response(index, media_type="text/html; charset=utf-8", headers=_WEB_HEADERS)

    async def asset(request: Request) -> Response:
        found = assets.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("Not Found", status_code=404)
        body, media = found
        return Response(body, media_type=media, headers=_WEB_HEADERS)

    return [Route("/", page), Route("/web/{name}", asset)]
