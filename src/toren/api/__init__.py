"""Toren's HTTP API (``/v1``, JSON, Server-Sent Events). Reference: docs/http-api.md.

The names below are imported on first use: ``toren.api.redact`` (which the clients use)
must import without FastAPI and uvicorn, which take about a second to import."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toren.api.app import ApiState, create_app
    from toren.api.server import (
        InsecureBind,
        RunningServer,
        ThreadedServer,
        check_bind,
        running_server,
        serve,
    )

_HOMES = {
    "ApiState": "toren.api.app",
    "create_app": "toren.api.app",
    "InsecureBind": "toren.api.server",
    "RunningServer": "toren.api.server",
    "ThreadedServer": "toren.api.server",
    "check_bind": "toren.api.server",
    "running_server": "toren.api.server",
    "serve": "toren.api.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'toren.api' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


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
