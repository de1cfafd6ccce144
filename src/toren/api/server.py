"""Serving the API with uvicorn, programmatically.

:func:`serve` is what ``toren serve`` and ``toren dev`` run. It refuses to expose an API
without tokens on anything but a loopback address (:func:`check_bind`). On shutdown, open
event streams are ended (clients resume elsewhere with ``Last-Event-ID``) so the server
does not wait on them. :func:`running_server` and :class:`ThreadedServer` serve on an
ephemeral port inside a program or a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from toren.errors import UserError


class InsecureBind(UserError):
    code = "insecure_bind"


class WeakToken(UserError):
    code = "weak_token"


# Shorter tokens are refused: they can be guessed, and the redactor (toren.redact) would
# not scrub them out of logs and responses (it ignores short strings, which would redact
# ordinary words).
MIN_TOKEN_LENGTH = 16


def check_tokens(tokens: Sequence[str]) -> None:
    """Every API token is at least :data:`MIN_TOKEN_LENGTH` characters of visible ASCII
    (a header value cannot carry anything else). The token itself is never quoted."""
    for i, token in enumerate(tokens, 1):
        problem = None
        if len(token) < MIN_TOKEN_LENGTH:
            problem = f"is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH}"
        elif not all("\x21" <= c <= "\x7e" for c in token):
            problem = "holds spaces, control or non-ASCII characters; use visible ASCII only"
        if problem is not None:
            raise WeakToken(
                f"API token #{i} of {len(tokens)} {problem}. Generate one with: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )


def url_for(host: str, port: int, scheme: str = "http") -> str:
    """``http://host:port``, with an IPv6 address in brackets (``http://[::1]:8000``)."""
    bare = host.strip("[]")
    try:
        shown = f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare
    except ValueError:
        shown = host
    return f"{scheme}://{shown}:{port}"


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname may resolve anywhere: not provably local


def check_bind(host: str, tokens: Sequence[str]) -> None:
    """Without an API token, only a loopback address may be bound: anyone who can reach
    the port could otherwise start runs (and spend model budget) and read every run."""
    if any(tokens) or is_loopback(host):
        return
    raise InsecureBind(
        f"refusing to serve the API on {host!r} without an API token: anyone who can reach "
        "it could start and read runs. Set TOREN_API_TOKEN (several, comma-separated, for "
        "rotation) or bind 127.0.0.1"
    )


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, handle_signals: bool) -> None:
        super().__init__(config)
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if self._handle_signals:
            with super().capture_signals():
                yield
        else:
            yield

    async def shutdown(self, sockets: Any = None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "toren", None)
        if state is not None:
            state.closing = True  # open SSE streams end within one poll interval
        await super().shutdown(sockets)


# Seconds an idle keep-alive connection stays open (uvicorn's default is 5). Whichever side
# closes an idle connection first races the other side's next request on it: a request
# sent as the server's close is on its way is lost without an answer, a dropped connection
# for the client (httpx raises RemoteProtocolError; a load balancer answers 502). Clients
# keep idle connections for about 5 s (httpx, Node) and proxies for 60 s (ALB, nginx
# upstreams vary), so a server that waits longer than they do is not the one that closes.
# Under load the race is not rare at 5 s: the server starts its timer when it has *written*
# a response, a busy client reads a large page seconds later and asks again at once.
# ``toren serve --keep-alive`` (TOREN_KEEP_ALIVE) sets it; docs/deploy.md.
KEEP_ALIVE = 75.0


def _config(app: FastAPI, host: str, port: int, **options: Any) -> uvicorn.Config:
    options.setdefault("timeout_keep_alive", KEEP_ALIVE)
    options.setdefault("log_level", "info")
    options.setdefault("timeout_graceful_shutdown", 5)
    options.setdefault("ws", "none")  # the API has no websockets
    return uvicorn.Config(app, host=host, port=port, **options)


async def serve(app: FastAPI, host: str, port: int, **uvicorn_options: object) -> None:
    """Serve ``app`` until SIGINT/SIGTERM. Extra options go to ``uvicorn.Config``."""
    check_tokens(getattr(app.state, "tokens", ()))
    check_bind(host, getattr(app.state, "tokens", ()))
    server = _Server(_config(app, host, port, **uvicorn_options), handle_signals=True)
    await server.serve()


@dataclass(frozen=True)
class RunningServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)


@asynccontextmanager
async def running_server(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: object
) -> AsyncIterator[RunningServer]:
    """Serve ``app`` on this event loop for the duration of the block (port 0: any free
    port; read it from the result). Signals are left to the host program."""
    check_bind(host, getattr(app.state, "tokens", ()))
    uvicorn_options.setdefault("log_level", "warning")
    uvicorn_options.setdefault("log_config", None)
    server = _Server(_config(app, host, port, **uvicorn_options), handle_signals=False)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()  # startup failed: raise its error
            raise RuntimeError("the API server stopped during startup")
        await asyncio.sleep(0.005)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield RunningServer(host, int(bound[1]))
    finally:
        server.should_exit = True
        await task


class ThreadedServer:
    """The API served by its own event loop in a thread, for synchronous callers (tests
    with a blocking client). ``build`` is an async context manager factory yielding the
    app; it runs inside the thread's loop, so the store and worker it opens live there."""

    def __init__(
        self,
        build: Callable[[], AbstractAsyncContextManager[FastAPI]],
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._build = build
        self._host = host
        self._port = port
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="toren-api", daemon=True)
        self.server: RunningServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None, "the server is not started"
        return self.server.url

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the API server did not start within {timeout}s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); the thread just ends
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self._build() as app, running_server(app, self._host, self._port) as srv:
            self.server = srv
            self._ready.set()
            await self._stop.wait()
