from __future__ import annotations

from typing import Any

from toren.errors import TorenError


class TorenAPIError(TorenError):
    """The API answered with an error. ``code`` is the server's code (``run_not_found``,
    ``unauthorized``, ``invalid_request``...), ``status`` the HTTP status."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{message} (HTTP {status}, {code})" if status else message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class TorenConnectionError(TorenAPIError):
    """The server could not be reached (or the connection broke and could not resume)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_error", message)
