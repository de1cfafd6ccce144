"""The client's errors, all under :class:`TorenAPIError` (itself a ``TorenError``)::

    TorenAPIError                the API answered with an error (status, code, message)
    ├── TorenConnectionError     the server could not be reached, or a stream broke and
    │   │                        could not resume within ``max_reconnects``
    │   └── TorenStreamTimeout   a stream sent nothing (not even a heartbeat) for
    │                            ``stream_timeout`` seconds, ``max_reconnects`` + 1 times
    ├── TorenResponseError       something answered that is not the Toren API: HTML from a
    │                            proxy, JSON of the wrong shape, a 200 that is no event
    │                            stream
    └── TorenTokenError          the token given to the client cannot be sent (a line
                                 break, a non-ASCII character): nothing was sent

No message quotes the token.
"""

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

    def __init__(self, message: str, code: str = "connection_error") -> None:
        super().__init__(0, code, message)


class TorenStreamTimeout(TorenConnectionError):
    """A run's stream stayed silent past ``stream_timeout`` on every reconnect."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "stream_timeout")


class TorenResponseError(TorenAPIError):
    """The answer is not one the Toren API gives (``code``: ``unexpected_response``): a
    proxy's or a captive portal's page, another service on that port, an incompatible
    server. ``status`` is the HTTP status it came with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, "unexpected_response", message)


class TorenTokenError(TorenAPIError):
    """The token cannot go into an ``Authorization`` header (``code``: ``invalid_token``).
    Raised when the client is created, before anything is sent."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "invalid_token", message)


class TorenMessageWarning(UserWarning):
    """``send_message`` to a run that waits for other names: the server kept the message
    (a later ``wait_for_message`` of its name takes it) but it does not wake the run. The
    text names the names the run waits for."""
