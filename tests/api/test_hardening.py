"""Issue 23 against a real server on SQLite and PostgreSQL: DNS rebinding and cross-site
requests, strict integers, methods (OPTIONS, HEAD, 405) that match the routes, the
trailing-slash redirect, nosniff, over-long integers, and short tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from toren.api import create_app, running_server
from toren.store import Store

from .support import TOKEN, Api, registry

ATTACKER = "attacker.example"


@pytest.fixture
async def open_api(store: Store) -> AsyncIterator[str]:
    """``toren dev``'s situation: no tokens, bound to loopback."""
    app = create_app(store, registry())
    async with running_server(app) as server:
        yield server.url


async def test_a_rebound_host_is_refused_before_anything_runs(open_api: str, store: Store) -> None:
    async with httpx.AsyncClient(base_url=open_api) as http:
        for method, path in (("POST", "/v1/runs"), ("GET", "/v1/runs"), ("GET", "/")):
            for host in (ATTACKER, f"{ATTACKER}:80", "127.0.0.1.nip.io", "[::2]", "localhost@x"):
                r = await http.request(
                    method, path, json={"agent": "echo", "input": {}}, headers={"Host": host}
                )
                assert r.status_code == 400, (method, path, host, r.status_code)
                error = r.json()["error"]
                assert error["code"] == "host_not_allowed"
                assert repr(host) in error["message"] and "--allowed-host" in error["message"]
        # The loopback names themselves are served, with or without a port.
        for host in ("localhost", "127.0.0.1", "[::1]:8000", "LOCALHOST:1"):
            r = await http.get("/v1/runs", headers={"Host": host})
            assert r.status_code == 200, host
    assert await store.list_runs() == []


async def test_cross_site_requests_without_a_token_are_refused(open_api: str, store: Store) -> None:
    run = {"agent": "echo", "input": {}}
    async with httpx.AsyncClient(base_url=open_api) as http:
        same = open_api  # Origin of the console itself
        for headers in (
            {"Origin": f"http://{ATTACKER}"},
            {"Origin": "null"},
            {"Origin": open_api.replace("127.0.0.1", "localhost")},  # another origin
            {"Sec-Fetch-Site": "cross-site"},
        ):
            r = await http.post("/v1/runs", json=run, headers=headers)
            assert r.status_code == 403, headers
            assert r.json()["error"]["code"] == "cross_site_request"
            assert "token" in r.json()["error"]["message"]
        assert await store.list_runs() == []
        ok = await http.post("/v1/runs", json=run, headers={"Origin": same})
        assert ok.status_code == 201, ok.text


async def test_with_tokens_any_host_is_served_but_cross_site_needs_the_token(api: Api) -> None:
    async with api.http(token=None) as anonymous, api.http() as http:
        assert (
            await http.get("/v1/runs", headers={"Host": "toren.example.com"})
        ).status_code == 200
        r = await anonymous.get("/v1/runs", headers={"Origin": f"http://{ATTACKER}"})
        assert r.status_code == 403
        r = await http.get("/v1/runs", headers={"Origin": f"http://{ATTACKER}"})
        assert r.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs?limit={n}",
        "/v1/runs/run_x/events?after={n}",
        "/v1/runs/run_x/events?limit={n}",
        "/v1/runs/run_x/stream?after={n}",
        "/v1/plan?limit={n}",
        "/console/api/runs/run_x/calls/{n}",
    ],
)
async def test_integers_are_ascii_digits_only(api: Api, path: str) -> None:
    async with api.http() as http:
        for bad in ("²", "¹²", "①", "٢", "１", " 5", "+5", "5_0", "5.0", "0x1"):
            r = await http.get(path.format(n=bad))
            # The console's route keeps its 404 for what is not a seq; /v1 says 422.
            expected = 404 if path.startswith("/console") else 422
            assert r.status_code == expected, (bad, r.status_code, r.text)
            assert "ASCII digits" in r.json()["error"]["message"]


def _documented(doc: dict, path: str) -> set[str]:  # type: ignore[type-arg]
    return {m.upper() for m in doc["paths"][path]}


async def test_options_allow_and_405_match_the_routes(api: Api) -> None:
    async with api.http() as http:
        doc = (await http.get("/v1/openapi.json")).json()
        for path in doc["paths"]:
            concrete = path.replace("{run_id}", "run_x")
            documented = _documented(doc, path)
            expected = documented | {"OPTIONS"} | ({"HEAD"} if "GET" in documented else set())
            r = await http.options(concrete)
            assert r.status_code == 204, (path, r.status_code)
            assert set(r.headers["Allow"].split(", ")) == expected, path
            missing = next(m for m in ("DELETE", "PUT", "PATCH") if m not in documented)
            r = await http.request(missing, concrete)
            assert r.status_code == 405 and set(r.headers["Allow"].split(", ")) == expected


async def test_head_answers_like_get_without_a_body(api: Api) -> None:
    run = await api.client.start_run("echo", {"n": 1})
    await api.client.wait(run.id, timeout=20)
    async with api.http() as http:
        for path in ("/v1/runs", f"/v1/runs/{run.id}", "/v1/agents", "/v1/health", "/metrics"):
            get, head = await http.get(path), await http.head(path)
            assert head.status_code == get.status_code == 200, path
            assert head.content == b""
            assert head.headers["content-type"] == get.headers["content-type"]
        stream = await http.head(f"/v1/runs/{run.id}/stream")
        assert stream.status_code == 200 and stream.content == b""
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert (await http.head("/v1/runs/run_nope")).status_code == 404


async def test_trailing_slash_redirect_ignores_the_host_header(api: Api) -> None:
    async with api.http() as http:
        r = await http.get("/v1/runs/?limit=5", headers={"Host": ATTACKER})
        assert r.status_code == 307 and r.headers["location"] == "/v1/runs?limit=5"
        r = await http.get("/v1/agents/")
        assert r.status_code == 307 and r.headers["location"] == "/v1/agents"


async def test_nosniff_on_json_errors_pages_and_static_files(api: Api) -> None:
    async with api.http() as http, api.http(token=None) as anonymous:
        for response in (
            await http.get("/v1/runs"),
            await http.get("/v1/runs/run_nope"),
            await anonymous.get("/v1/runs"),
            await http.get("/console/static/app.js"),
            await http.get("/console/static/console.css"),
            await http.get("/login"),
            await http.get("/metrics"),
        ):
            assert response.headers["x-content-type-options"] == "nosniff", response.url


async def test_a_5000_digit_integer_in_a_body_is_named(api: Api) -> None:
    body = b'{"agent": "echo", "input": {"n": ' + b"9" * 5000 + b"}}"
    async with api.http() as http:
        r = await http.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "integer with more than 4300 digits" in message and "UTF-8" not in message


@pytest.mark.parametrize(
    "token", ["short", "fifteen-chars15", "sixteen chars 16", "tok\nen-0123456789"]
)
def test_short_or_unprintable_tokens_are_refused_at_start(store: Store, token: str) -> None:
    from toren.api.server import WeakToken

    with pytest.raises(WeakToken) as info:
        create_app(store, registry(), tokens=[TOKEN, token])
    assert token not in info.value.message and "#2" in info.value.message
