"""Issue 23: the Python clients raise their own typed errors for tokens that cannot be
sent, answers that are not the Toren API's (a proxy's HTML, JSON of another shape, a 200
that is no event stream), streams that stay silent, and they retry what is worth it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from toren.api import running_server
from toren.client import (
    AsyncTorenClient,
    TorenClient,
    TorenConnectionError,
    TorenResponseError,
    TorenStreamTimeout,
    TorenTokenError,
)

from .support import TOKEN, Api

PORTAL = "<html><body>Please sign in to the corporate proxy</body></html>"


@pytest.mark.parametrize(
    ("token", "what"),
    [
        (TOKEN + "\n", "a line break"),
        ("tok-cur\rrent-0123456789", "a line break"),
        ("tok-çurrent-0123456789", "a non-ASCII character"),
        ("tok current 0123456789", "a space or control character"),
    ],
)
def test_a_token_that_cannot_be_sent_is_named_never_echoed(token: str, what: str) -> None:
    for make in (TorenClient, AsyncTorenClient):
        with pytest.raises(TorenTokenError) as info:
            make("http://127.0.0.1:9", token)  # type: ignore[operator]
        error = info.value
        assert not isinstance(error, TorenConnectionError)
        assert error.code == "invalid_token" and what in error.message
        assert "0123456789" not in str(error) and "rrent" not in str(error)


@contextlib.asynccontextmanager
async def impostor(**bodies: Any) -> AsyncIterator[tuple[str, list[str]]]:
    """A server that is not Toren's: answers every request from ``bodies`` by kind."""
    seen: list[str] = []

    async def anything(request: Request) -> Response:
        seen.append(request.url.path)
        kind = bodies["kind"]
        if kind == "html":
            return HTMLResponse(PORTAL)
        if kind == "json":
            return JSONResponse(bodies["json"])
        if kind == "empty_stream":
            return Response(b"", media_type="text/event-stream")
        raise AssertionError(kind)

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
    async with running_server(app) as server:  # type: ignore[arg-type]
        yield server.url, seen


async def test_a_proxy_page_is_a_response_error() -> None:
    async with impostor(kind="html") as (url, _), AsyncTorenClient(url, TOKEN) as client:
        for call in (client.get_run("run_1"), client.list_runs(), client.health()):
            with pytest.raises(TorenResponseError) as info:
                await call
            assert info.value.status == 200 and "text/html" in info.value.message
            assert "proxy" in info.value.message and TOKEN not in str(info.value)


@pytest.mark.parametrize(
    "body", [{"runs": 5}, {"unexpected": True}, [], {"runs": [{"no": "id"}]}, "text"]
)
async def test_json_of_the_wrong_shape_is_a_response_error(body: Any) -> None:
    async with impostor(kind="json", json=body) as (url, _):
        async with AsyncTorenClient(url, TOKEN) as client:
            with pytest.raises(TorenResponseError, match="not what the Toren API sends"):
                await client.list_runs()
            with pytest.raises(TorenResponseError):
                await client.get_run("run_1")
        with TorenClient(url, TOKEN) as sync, pytest.raises(TorenResponseError):
            await asyncio.to_thread(sync.agents)


@pytest.mark.parametrize("kind", ["html", "empty_stream"])
async def test_stream_honours_its_reconnect_limit_on_a_200(kind: str) -> None:
    async with impostor(kind=kind, json=None) as (url, seen):
        async with AsyncTorenClient(url, TOKEN, max_reconnects=2) as client:
            expected = TorenResponseError if kind == "html" else TorenConnectionError
            with pytest.raises(expected) as info:
                async with asyncio.timeout(30):
                    [item async for item in client.stream("run_1")]
            assert "3 times in a row" in info.value.message
        assert len(seen) == 3  # the first try and two reconnects, then it stops

        def sync_stream() -> None:
            with TorenClient(url, TOKEN, max_reconnects=1) as sync:
                list(sync.stream("run_1"))

        with pytest.raises(expected):
            await asyncio.wait_for(asyncio.to_thread(sync_stream), 30)


@contextlib.asynccontextmanager
async def silent_server(send_headers: bool) -> AsyncIterator[tuple[str, list[int]]]:
    """Accepts, reads the request, (optionally) starts an event stream, then says nothing."""
    connections: list[int] = []
    held: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        held.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        if send_headers:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        for writer in held:
            writer.transport.abort()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("send_headers", [True, False], ids=["after-headers", "no-answer"])
async def test_a_stream_that_sends_nothing_times_out(send_headers: bool) -> None:
    async with silent_server(send_headers) as (url, connections):
        async with AsyncTorenClient(url, TOKEN, stream_timeout=0.3, max_reconnects=1) as client:
            with pytest.raises(TorenStreamTimeout) as info:
                async with asyncio.timeout(30):
                    [item async for item in client.stream("run_1")]
        assert isinstance(info.value, TorenConnectionError)  # still a connection problem
        assert info.value.code == "stream_timeout" and "sent nothing" in info.value.message
        assert len(connections) == 2


class FlakyFront:
    """A TCP front that resets its first ``failures`` connections, then forwards."""

    def __init__(self, upstream_port: int, failures: int) -> None:
        self.upstream_port = upstream_port
        self.failures = failures
        self.reset = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.reset < self.failures:
            self.reset += 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_wait_retries_connection_errors_with_backoff(api: Api) -> None:
    run = await api.client.start_run("echo", {"n": 1})
    port = int(api.url.rsplit(":", 1)[1])
    front = FlakyFront(port, failures=3)
    server = await asyncio.start_server(front.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with AsyncTorenClient(url, TOKEN) as client:
            done = await client.wait(run.id, timeout=30)
        assert done.status == "completed" and front.reset == 3
        front.reset = 0
        with TorenClient(url, TOKEN) as sync:
            assert (await asyncio.to_thread(sync.wait, run.id, 30)).status == "completed"
        assert front.reset == 3
        # A server that stays away: the last connection error, once the timeout is spent.
        front.failures = 10**6
        async with AsyncTorenClient(url, TOKEN) as client:
            with pytest.raises(TorenConnectionError):
                await client.wait(run.id, timeout=0.5)
    finally:
        server.close()
        await server.wait_closed()
