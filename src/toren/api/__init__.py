"""Toren's HTTP API (``/v1``, JSON, Server-Sent Events). Reference: docs/http-api.md."""

from toren.api.app import create_app
from toren.api.server import (
    InsecureBind,
    RunningServer,
    ThreadedServer,
    check_bind,
    running_server,
    serve,
)
from toren.api.state import ApiState

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
