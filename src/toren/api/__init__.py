"""Toren's HTTP API (``/v1``, JSON, Server-Sent Events). Reference: docs/http-api.md."""

from toren.api.app import ApiState, create_app
from toren.api.server import (
    InsecureBind,
    RunningServer,
    ThreadedServer,
    check_bind,
    running_server,
    serve,
)

__all__ = [
    "ApiState",
    "InsecureBind",
    "RunningServer",
    "ThreadedServer",
    "check_bind",
    "create_app",
    "running_server",
    "serve",
]
