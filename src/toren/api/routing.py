"""HTTP method plumbing the route table implies: ``OPTIONS`` and ``405`` answers whose
``Allow`` header lists every method the path's routes take, ``HEAD`` wherever ``GET``
is served (the GET's status and headers, no body), and the trailing-slash redirect with
a path-only ``Location`` (never built from the ``Host`` header, which the client chose).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toren.api.errors import error_response


class _HeadDone(Exception):
    """Raised into the app once a HEAD response's headers are sent: its body (an endless
    event stream, say) is not wanted."""


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> set[str]:
    """Every method some route serves at ``scope``'s path (HEAD with GET, OPTIONS always)."""
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches({**scope, "method": "GET"})
        if match is Match.NONE:
            continue
        route_methods = getattr(route, "methods", None)
        methods |= set(route_methods) if route_methods else {"GET", "HEAD"}
    if "GET" in methods:
        methods.add("HEAD")
    return methods | {"OPTIONS"} if methods else set()


def allow_header(methods: set[str]) -> str:
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return ", ".join(sorted(methods, key=lambda m: (order.index(m) if m in order else 99, m)))


class Methods:
    def __init__(self, app: ASGIApp, *, routes: Callable[[], Iterable[BaseRoute]]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(self.routes(), scope)
        method = scope["method"]
        if not methods:
            if await self._redirect_slash(scope, receive, send):
                return
            await self.app(scope, receive, send)
            return
        if method == "OPTIONS":
            headers = {"Allow": allow_header(methods)}
            from starlette.responses import Response

            await Response(status_code=204, headers=headers)(scope, receive, send)
            return
        if method not in methods:
            message = f"method {method} is not allowed on {scope['path']!r}"
            response = error_response(
                405,
                "method_not_allowed",
                message,
                headers={"Allow": allow_header(methods)},
            )
            await response(scope, receive, send)
            return
        if method == "HEAD":
            await self._head(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _head(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                raise _HeadDone

        try:
            await self.app({**scope, "method": "GET"}, receive, headers_only)
        except _HeadDone:
            pass
        except BaseExceptionGroup as group:  # raised inside a streaming response's task group
            _, rest = group.split(_HeadDone)
            if rest is not None:
                raise rest from None

    async def _redirect_slash(self, scope: Scope, receive: Receive, send: Send) -> bool:
        path: str = scope["path"]
        if path == "/" or not path.endswith("/"):
            return False
        bare = path.rstrip("/")
        if (
            not bare
            or bare.startswith("//")
            or not allowed_methods(self.routes(), {**scope, "path": bare})
        ):
            return False
        query = scope.get("query_string", b"").decode("latin-1")
        location = bare + (f"?{query}" if query else "")
        from starlette.responses import RedirectResponse

        # Path-only: the browser resolves it against the URL it asked for.
        await RedirectResponse(location, status_code=307)(scope, receive, send)
        return True
