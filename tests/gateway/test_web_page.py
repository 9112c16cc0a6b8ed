"""The browser page is served only when WEB_PAGE is on: its files, their content types and
the Content-Security-Policy that keeps it to its own origin (no browser; the Chromium test
is tests/e2e/test_web_page.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.web_page import WEB_PAGE_CSP
from runtime.config import from_env
from runtime.embedded import EmbeddedServer, start_server

pytestmark = pytest.mark.timeout(30)

ASSETS = {
    "/web/page.js": "text/javascript; charset=utf-8",
    "/web/microphone-worklet.js": "text/javascript; charset=utf-8",
    "/web/page.css": "text/css; charset=utf-8",
    "/web/icon.svg": "image/svg+xml",
}


@pytest.fixture(scope="module")
def redis() -> Iterator[EmbeddedServer]:
    """A real Redis for the gateway's lifespan (the page itself never touches it)."""
    server = start_server("auto")
    yield server
    server.stop()


def gateway(redis: EmbeddedServer, *, web_page: bool) -> TestClient:
    """A gateway application, its lifespan run, with the page on or off."""
    return TestClient(create_app(GatewaySettings(redis_url=redis.url, web_page=web_page)))


def test_the_page_is_off_by_default_and_then_every_path_of_it_is_404(
        redis: EmbeddedServer) -> None:
    """WEB_PAGE defaults to false; off, / and every asset answer 404 as any unknown path."""
    assert GatewaySettings().web_page is False
    with gateway(redis, web_page=False) as client:
        for path in ["/", *ASSETS]:
            answer = client.get(path)
            assert answer.status_code == 404, path
            assert "content-security-policy" not in answer.headers


def test_the_variable_turns_the_page_on() -> None:
    """DUPLEX_GATEWAY_WEB_PAGE=true is how `dev` (and an operator of `serve`) turns it on."""
    assert from_env(GatewaySettings, {"DUPLEX_GATEWAY_WEB_PAGE": "true"}).web_page is True
    assert from_env(GatewaySettings, {"DUPLEX_GATEWAY_WEB_PAGE": "0"}).web_page is False


def test_on_the_page_and_its_assets_are_served_with_their_types_and_the_csp(
        redis: EmbeddedServer) -> None:
    """/ is the HTML page and each asset has the content type a browser needs to run it (a
    module script or a worklet with another type is refused), each under the strict CSP."""
    with gateway(redis, web_page=True) as client:
        for path, media in {"/": "text/html; charset=utf-8", **ASSETS}.items():
            answer = client.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["content-type"] == media, path
            assert answer.headers["content-security-policy"] == WEB_PAGE_CSP, path
            assert answer.headers["x-content-type-options"] == "nosniff", path
            assert answer.content, path


def test_the_csp_allows_only_this_origin_and_no_inline_code() -> None:
    """Nothing is loaded from elsewhere (no CDN), nothing inline or evaluated runs, and the
    page cannot be framed."""
    directives = dict(part.strip().split(" ", 1) for part in WEB_PAGE_CSP.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src", "img-src"):
        assert directives[name] == "'self'", name
    assert "unsafe" not in WEB_PAGE_CSP and "http" not in WEB_PAGE_CSP
    assert directives["frame-ancestors"] == "'none'"


def test_everything_the_page_refers_to_is_served_from_this_origin(
        redis: EmbeddedServer) -> None:
    """Each src and href of the page and each path its script loads (the worklet) answers
    200; none points to another origin, and the page holds no inline script or style that
    the CSP would block."""
    with gateway(redis, web_page=True) as client:
        html = client.get("/").text
        script = client.get("/web/page.js").text
        referred = re.findall(r'(?:src|href)="([^"]+)"', html)
        referred += re.findall(r'"(/web/[^"]+)"', script)
        assert "/web/page.js" in referred and "/web/microphone-worklet.js" in referred
        for path in referred:
            assert path.startswith("/web/"), path
            assert client.get(path).status_code == 200, path
        assert "<style" not in html and " style=" not in html
        assert re.findall(r"<script[^>]*>\s*[^<\s]", html) == [], "inline script"
        assert re.search(r"\son[a-z]+=", html) is None, "inline event handler"


@pytest.mark.parametrize("path", ["/web/", "/web/index.html", "/web/..%2Fapp.py",
                                  "/web/%2e%2e/settings.py", "/web/missing.js", "/index.html"])
def test_only_the_listed_files_are_served(redis: EmbeddedServer, path: str) -> None:
    """A name outside the page's fixed list is 404, whatever it spells: no request path
    reaches the file system."""
    with gateway(redis, web_page=True) as client:
        assert client.get(path).status_code == 404
