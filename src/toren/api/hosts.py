"""DNS-rebinding and cross-site protection: which ``Host`` a request may name, and which
browser origins may call the API without a token.

A server on 127.0.0.1 without tokens (``toren dev``) trusts whoever can connect, which
includes any web page the developer visits: the page rebinds its own name to 127.0.0.1
and its requests then reach the server with ``Host: attacker.example``. So a request is
served only when its ``Host`` is on the allow-list (by default the loopback names when
the server is bound to loopback), and a browser request from another origin (its
``Origin`` header, or ``Sec-Fetch-Site: cross-site``) is refused unless it carries a
token. A page on another origin never has the token: the console keeps it in the tab's
storage and sends it as a header, never as a cookie.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from toren.api.errors import error_response
from toren.errors import UserError

# The names a loopback-bound server answers to by default (any port).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"


class BadAllowedHost(UserError):
    code = "bad_allowed_host"


def normalize_host(value: str) -> str:
    """An allow-list entry: a host name or address (no scheme, no port), lowercase;
    ``*`` for any; ``.example.com`` for the domain and its subdomains. IPv6 addresses
    may be given with or without brackets."""
    text = value.strip().lower()
    if text in ("", ANY_HOST):
        return ANY_HOST if text else ""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    bare = text[1:] if text.startswith(".") else text
    if not bare or any(not (c.isascii() and (c.isalnum() or c in "-.")) for c in bare):
        raise BadAllowedHost(
            f"{value!r} is not a host name: give a name like 'toren.example.com', an IP "
            "address, '.example.com' for a domain and its subdomains, or '*' for any host "
            "(no scheme, no port)"
        )
    return text


def default_allowed_hosts(bind_host: str, tokens: Sequence[str]) -> tuple[str, ...]:
    """Loopback names when bound to loopback; any host otherwise (a token is then required,
    and a page rebinding its name cannot know it)."""
    from toren.api.server import is_loopback

    if is_loopback(bind_host) or not any(tokens):
        # Bound to another loopback address (127.0.0.2): that address is its own name.
        bound = normalize_host(bind_host) if is_loopback(bind_host) else ""
        return LOOPBACK_HOSTS if bound in ("", *LOOPBACK_HOSTS) else (*LOOPBACK_HOSTS, bound)
    return (ANY_HOST,)


def rebindable(entry: str) -> bool:
    """An allow-list entry a web page can make its own by DNS: ``*``, a domain, any name
    but ``localhost`` (an IP address cannot be rebound)."""
    name = normalize_host(entry)
    if name in ("", "localhost"):
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return True
    return False


def split_host(value: str) -> str | None:
    """The host name of a ``Host`` header value (port removed), lowercase; None when the
    value is not a host at all."""
    text = value.strip().lower()
    if not text or any(c in text for c in "/?#@\\ "):
        return None
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end > 0 else ""
        if end < 0 or (rest and not (rest.startswith(":") and _is_port(rest[1:]))):
            return None
        name = text[1:end]
    elif text.count(":") == 1:
        name, _, port = text.partition(":")
        if not _is_port(port):
            return None
    else:
        name = text
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.rstrip(".") or None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5


class HostPolicy:
    def __init__(self, allowed: Iterable[str]) -> None:
        entries = {normalize_host(a) for a in allowed} - {""}
        self.any = ANY_HOST in entries
        self.names = frozenset(e for e in entries if not e.startswith(".") and e != ANY_HOST)
        self.domains = tuple(e for e in entries if e.startswith("."))
        self.shown = ", ".join(sorted(entries)) or "(none)"

    def allows(self, host: str | None) -> bool:
        if host is None:
            return False
        if self.any or host in self.names:
            return True
        return any(host.endswith(d) or host == d[1:] for d in self.domains)


class HostGuard:
    """Pure ASGI middleware: refuse a ``Host`` off the allow-list (421-style 400) and an
    anonymous cross-site browser request (403). Runs before auth and routing."""

    def __init__(self, app: ASGIApp, *, allowed: Iterable[str]) -> None:
        self.app = app
        self.policy = HostPolicy(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        raw_host = headers.get("host")
        if raw_host is None:
            server = scope.get("server")
            raw_host = f"{server[0]}:{server[1]}" if server else ""
        host = split_host(raw_host)
        if not self.policy.allows(host):
            message = (
                f"the Host header {raw_host!r} is not one this server answers to (allowed: "
                f"{self.policy.shown}). This protects against DNS rebinding; if you reach "
                "the server under that name, add it with --allowed-host or "
                "TOREN_ALLOWED_HOSTS"
            )
            await error_response(400, "host_not_allowed", message)(scope, receive, send)
            return
        if (
            _cross_site(headers, raw_host)
            and not _has_credentials(headers)
            and not _navigation(scope, headers)
        ):
            message = (
                "cross-site request refused: a page on another origin "
                f"({headers.get('origin') or 'unknown'!s}) may not call this API without an API "
                "token (send 'Authorization: Bearer <token>')"
            )
            await error_response(403, "cross_site_request", message)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _headers(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1").lower()
        if key not in found:
            found[key] = value.decode("latin-1")
    return found


def _cross_site(headers: dict[str, str], host: str) -> bool:
    """A browser request made by a page of another origin. Browsers send ``Origin`` on
    every cross-origin request and on same-origin ones other than GET/HEAD; a same-origin
    ``Origin`` names the ``Host`` the request went to."""
    if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
        return True
    origin = headers.get("origin")
    if origin is None:
        return False
    if origin.strip().lower() == "null":
        return True  # a sandboxed frame, a file:// page, a redirect across origins
    parts = urlsplit(origin.strip())
    return parts.scheme not in ("http", "https") or parts.netloc.lower() != host.strip().lower()


def _navigation(scope: Scope, headers: dict[str, str]) -> bool:
    """A top-level navigation to a console page (a link from another site, a bookmark
    opened from a mail client). The page holds no data: it reads through the API with the
    token in the tab's storage, and API requests stay refused cross-site."""
    path = str(scope.get("path", ""))
    return (
        scope.get("method") in ("GET", "HEAD")
        and headers.get("sec-fetch-mode", "").lower() == "navigate"
        and headers.get("sec-fetch-dest", "").lower() == "document"
        and not (path == "/v1" or path.startswith("/v1/") or path == "/metrics")
    )


def _has_credentials(headers: dict[str, str]) -> bool:
    auth = headers.get("authorization", "")
    return bool(headers.get("x-api-key", "").strip()) or auth.lower().startswith("bearer ")
