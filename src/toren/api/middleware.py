"""Pure ASGI middleware: bearer-token auth, the request body limit, and the last-resort
500. Pure ASGI (not ``BaseHTTPMiddleware``) so streaming responses pass through untouched.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toren.api.errors import BodyTooLarge, error_response, internal_error_response

log = logging.getLogger("toren.api")


class Auth:
    """Every request needs a valid token (``Authorization: Bearer T`` or ``X-API-Key: T``)
    unless its path is public. It runs before routing and body parsing, so an anonymous
    client learns nothing (not even which routes exist) and costs no body parsing."""

    def __init__(
        self, app: ASGIApp, *, tokens: Sequence[str], is_public: Callable[[str], bool]
    ) -> None:
        self.app = app
        self.tokens = [t.encode() for t in tokens if t]
        self.is_public = is_public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens or self.is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        presented = _presented(scope["headers"])
        if presented and any(self._valid(p) for p in presented):
            await self.app(scope, receive, send)
            return
        message = (
            "invalid API token"
            if presented
            else "missing API token: send 'Authorization: Bearer <token>' or 'X-API-Key: <token>'"
        )
        response = error_response(
            401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="toren"'}
        )
        await response(scope, receive, send)

    def _valid(self, presented: bytes) -> bool:
        # Compare against every token (rotation keeps several), each in constant time.
        ok = False
        for token in self.tokens:
            ok |= hmac.compare_digest(presented, token)
        return ok


def _presented(headers: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    found = []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"bearer" and credentials.strip():
                found.append(credentials.strip())
        elif name == b"x-api-key" and value.strip():
            found.append(value.strip())
    return found


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a 413: by ``Content-Length`` up
    front, and by counting for chunked uploads."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                exc = BodyTooLarge(self.limit)
                await error_response(413, exc.code, exc.message)(scope, receive, send)
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)  # an HTTPException: answered as JSON
            return message

        await self.app(scope, limited, send)


class CatchAll:
    """The last resort: an unexpected exception is logged here with its traceback and the
    client gets the generic JSON 500 (if nothing was sent yet), never the traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await internal_error_response()(scope, receive, send)


class NoSniff:
    """``X-Content-Type-Options: nosniff`` on every response (JSON, static files, errors):
    a browser must not guess a script or a page out of run data served as JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() != b"x-content-type-options"
                ]
                headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_header)
