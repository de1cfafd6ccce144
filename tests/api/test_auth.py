"""Bearer-token auth on every route but /v1/health, and the loopback-only rule."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi.routing import APIRoute

from toren.api import InsecureBind, check_bind, create_app, running_server, serve
from toren.store import Store

from .support import OLD_TOKEN, TOKEN, Api, registry


def protected_requests(api: Api) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, path parameters filled in, health excluded."""
    out = []
    for route in api.app.routes:
        if not isinstance(route, APIRoute):
            continue
        path = re.sub(r"\{[^}]+\}", "run_0000", route.path)
        for method in sorted(route.methods):
            if path != "/v1/health":
                out.append((method, path))
    return out


async def test_every_protected_route_needs_a_valid_token(api: Api) -> None:
    routes = protected_requests(api)
    assert len(routes) >= 11 and ("GET", "/metrics") in routes and ("GET", "/v1/plan") in routes
    paths = {p for _, p in routes}
    assert "/v1/openapi.json" not in paths  # not an APIRoute; checked explicitly below
    routes.append(("GET", "/v1/openapi.json"))
    wrong = [
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"X-API-Key": "nope"},
        {"X-API-Key": ""},
    ]
    async with httpx.AsyncClient(base_url=api.url) as http:
        for method, path in routes:
            for headers in wrong:
                r = await http.request(method, path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["error"]["code"] == "unauthorized"
                assert r.headers["www-authenticate"].startswith("Bearer")
        for headers in (
            {"Authorization": f"Bearer {TOKEN}"},
            {"authorization": f"bearer {OLD_TOKEN}"},  # rotation: the previous token too
            {"X-API-Key": TOKEN},
        ):
            assert (await http.get("/v1/runs", headers=headers)).status_code == 200
            assert (await http.get("/v1/openapi.json", headers=headers)).status_code == 200
        health = await http.get("/v1/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        # Unknown routes do not reveal themselves to anonymous callers.
        assert (await http.get("/v1/secret-admin")).status_code == 401


async def test_openapi_declares_the_security(api: Api) -> None:
    doc = (await api.client._http.get("/v1/openapi.json")).json()
    assert doc["security"] == [{"bearer": []}, {"apiKey": []}]
    assert doc["paths"]["/v1/health"]["get"]["security"] == []
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}


async def test_no_tokens_means_no_auth_on_loopback(store: Store) -> None:
    app = create_app(store, registry(), console=False)
    async with running_server(app) as server, httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/v1/runs")).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_loopback_binds_without_a_token(host: str) -> None:
    check_bind(host, [])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "example.com", ""])
def test_exposed_binds_need_a_token(host: str) -> None:
    with pytest.raises(InsecureBind, match="TOREN_API_TOKEN"):
        check_bind(host, [])
    with pytest.raises(InsecureBind):
        check_bind(host, [""])
    check_bind(host, ["t0ken"])


async def test_serve_refuses_an_exposed_bind_without_tokens(store: Store) -> None:
    app = create_app(store, registry(), console=False)
    with pytest.raises(InsecureBind) as info:
        await serve(app, "0.0.0.0", 0)
    assert info.value.code == "insecure_bind"
