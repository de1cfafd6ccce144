"""Issue 34 item 4, hosts: a top-level navigation from another site gets a console page
(and nothing else cross-site gets through), and a tokenless server on another loopback
address answers to that address. On SQLite and PostgreSQL."""

from __future__ import annotations

import httpx

from toren.api import create_app, running_server
from toren.api.hosts import LOOPBACK_HOSTS, default_allowed_hosts, rebindable
from toren.store import Store

from .support import registry

NAVIGATE = {
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Dest": "document",
    "Sec-Fetch-User": "?1",
}


async def test_a_cross_site_navigation_gets_a_console_page_only(store: Store) -> None:
    app = create_app(store, registry())  # toren dev: no token, loopback
    async with running_server(app) as server, httpx.AsyncClient(base_url=server.url) as http:
        # Every console page, a run's deep link included (a link shared in a chat).
        for path in ("/", "/agents", "/flow", "/runs/run_0123456789abcdef012345"):
            page = await http.get(path, headers=NAVIGATE)
            assert page.status_code == 200, (path, page.status_code)
            assert "text/html" in page.headers["content-type"], path
        # The API stays refused, navigated to or fetched, and so does any other method.
        for method, path, headers in (
            ("GET", "/v1/runs", NAVIGATE),
            ("GET", "/metrics", NAVIGATE),
            ("POST", "/", NAVIGATE),
            ("GET", "/", {**NAVIGATE, "Sec-Fetch-Dest": "iframe"}),
            ("GET", "/", {**NAVIGATE, "Sec-Fetch-Mode": "cors"}),
        ):
            r = await http.request(method, path, headers=headers)
            assert r.status_code == 403, (method, path, headers, r.status_code)
            assert r.json()["error"]["code"] == "cross_site_request"


async def test_a_tokenless_server_on_another_loopback_address_accepts_its_own(
    store: Store,
) -> None:
    assert default_allowed_hosts("127.0.0.1", ()) == LOOPBACK_HOSTS
    hosts = default_allowed_hosts("127.0.0.2", ())
    app = create_app(store, registry(), allowed_hosts=hosts)
    async with (
        running_server(app, host="127.0.0.2") as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        assert (await http.get("/v1/runs")).status_code == 200
        r = await http.get("/v1/runs", headers={"Host": "127.0.0.3"})
        assert r.status_code == 400


def test_which_allowed_hosts_can_be_rebound() -> None:
    assert all(rebindable(n) for n in ("*", ".example.com", "toren.internal"))
    assert not any(rebindable(n) for n in ("localhost", "127.0.0.1", "[::1]", "10.0.0.7"))
