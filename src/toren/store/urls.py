"""Database URLs as messages and logs may show them: never with the password."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit


def shown_url(url: str) -> str:
    """``url`` without its password (in the user info or a ``password`` query parameter),
    for messages and logs. Whatever cannot be parsed is cut to what follows the last
    ``@``, which is where a password would end."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("@")[-1]
    if not _passwords(url):
        return url  # as given: rebuilding would respell some (``sqlite:///x`` -> ``sqlite:/x``)
    user_info, at, host = parts.netloc.rpartition("@")
    user = user_info.partition(":")[0]
    netloc = f"{user}@{host}" if at and user else host
    query = "&".join(p for p in parts.query.split("&") if p and not _is_password(p))
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def without_secrets(text: str, url: str) -> str:
    """``text`` (a driver's error message, say) with any password of ``url`` taken out."""
    for secret in _passwords(url):
        text = text.replace(secret, "***")
    return text


def _is_password(param: str) -> bool:
    return param.partition("=")[0].lower() == "password"


def _passwords(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        user_info, query = parts.netloc.rpartition("@")[0], parts.query
    except ValueError:  # an unencoded '[' in a password, say (libpq takes it): by hand
        user_info = url.partition("://")[2].rpartition("@")[0]
        query = url.partition("?")[2]
    raw = [user_info.partition(":")[2]]
    raw += [p.partition("=")[2] for p in query.split("&") if _is_password(p)]
    found = {s for r in raw for s in (r, unquote(r)) if s}
    return sorted(found, key=len, reverse=True)  # the longest first
