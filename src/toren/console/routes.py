"""The console's routes: public HTML shells, static files, and two JSON helpers.

The JSON helpers live under ``/console/api`` because ``/v1`` does not (yet) serve them:
totals in money (``/metrics`` has them, but as Prometheus text) and a recorded model
call's request messages. The replay plan comes from ``GET /v1/plan``.
They need the API token exactly like ``/v1`` (the API's auth middleware guards them).

Routes are plain Starlette routes, not FastAPI ones: they stay out of the OpenAPI document
of the versioned API, which is a contract the console is not part of.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles

from toren.console import pages
from toren.core.contract.events import ModelCallRecorded
from toren.core.contract.ports import RunStore
from toren.core.contract.values import from_nano
from toren.core.drivers.history import load_messages

STATIC = Path(__file__).parent / "static"
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as the API's run routes accept
SEQ = re.compile(r"[0-9]{1,18}", re.ASCII)  # ASCII digits only: int() also takes '٢'

# The pages hold no data, so they are safe to serve without a token; strict CSP keeps any
# injected markup inert (no inline script or style, only same-origin fetches).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class _Runtime(Protocol):
    @property
    def active_runs(self) -> Sequence[str]: ...


class ConsoleState(Protocol):
    """What the console reads of the API's shared state (``toren.api.state.ApiState``,
    ``app.state.toren``). A Protocol, so that the API mounts the console and the console
    does not import the API back."""

    public_paths: set[str]

    @property
    def store(self) -> RunStore: ...

    @property
    def runtime(self) -> _Runtime | None: ...

    def redact(self, value: object) -> object: ...


class PublicPaths(set[str]):
    """The API's public path set (``ApiState.public_paths``), plus the console's pages.

    The API checks ``path in public_paths``; the run page's path has a run id in it, and
    static files live under a prefix, so membership also accepts those patterns."""

    PATTERN = re.compile(
        r"^(/|/login|/agents|/schedules|/flow|/plan|/runs/[A-Za-z0-9_-]{1,64}|/console/static/.+)$"
    )

    def __contains__(self, path: object) -> bool:
        if isinstance(path, str) and self.PATTERN.match(path) and ".." not in path:
            return True
        return super().__contains__(path)


def mount(app: FastAPI, state: ConsoleState) -> None:
    """Add the console to an API app built by :func:`toren.api.create_app`."""
    state.public_paths = PublicPaths(state.public_paths)
    for path, page in (
        ("/", "runs"),
        ("/agents", "agents"),
        ("/schedules", "schedules"),
        ("/flow", "flow"),
        ("/plan", "plan"),
        ("/login", "login"),
    ):
        app.add_route(path, _page(page), methods=["GET"], include_in_schema=False)
    app.add_route("/runs/{run_id}", run_page, methods=["GET"], include_in_schema=False)
    app.add_route("/console/api/summary", summary, methods=["GET"], include_in_schema=False)
    app.add_route(
        "/console/api/runs/{run_id}/calls/{seq}",
        model_call,
        methods=["GET"],
        include_in_schema=False,
    )
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")


def _state(request: Request) -> ConsoleState:
    return cast(ConsoleState, request.app.state.toren)


def _page(name: str) -> Any:
    async def endpoint(request: Request) -> Response:
        return HTMLResponse(pages.render(name), headers=HEADERS)

    endpoint.__name__ = f"console_{name}"
    return endpoint


async def run_page(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    if not RUN_ID.match(run_id):
        return HTMLResponse(pages.render("missing"), status_code=404, headers=HEADERS)
    return HTMLResponse(pages.render("run", run_id=run_id), headers=HEADERS)


def _usd(nano: int) -> str:
    return str(from_nano(nano))


async def summary(request: Request) -> Response:
    """Totals over the whole database (what ``/metrics`` reports, as JSON)."""
    state = _state(request)
    stats = await state.store.stats()
    by_status = {str(k): int(v) for k, v in stats.get("runs_by_status", {}).items()}
    body = {
        "runs_by_status": by_status,
        "runs": sum(by_status.values()),
        "steps": stats.get("steps", 0),
        "input_tokens": stats.get("input_tokens", 0),
        "output_tokens": stats.get("output_tokens", 0),
        "cost_usd": _usd(stats.get("cost_nanousd", 0)),
        "saved_by_replay_usd": _usd(stats.get("saved_nanousd", 0)),
        "invalidations": stats.get("invalidations", 0),
        "lease_recoveries": stats.get("lease_recoveries", 0),
        "active_runs": _active(state),
    }
    return JSONResponse(body)


def _active(state: ConsoleState) -> int | None:
    return len(state.runtime.active_runs) if state.runtime is not None else None


async def model_call(request: Request) -> Response:
    """The messages (and tool specs' count) a recorded model call sent, oldest first."""
    state = _state(request)
    run_id = request.path_params["run_id"]
    seq_text = request.path_params["seq"]
    if not SEQ.fullmatch(seq_text) or not RUN_ID.match(run_id):
        # Not a seq at all (as before: a 404), and said so: only ASCII digits name one.
        raise HTTPException(
            404,
            f"no model call {seq_text[:40]!r} in run {run_id!r}: a seq is 1-18 ASCII digits 0-9",
        )
    seq = int(seq_text)
    found = await state.store.load_events(run_id, after_seq=seq - 1, limit=1) if seq else []
    event = found[0] if found and found[0].seq == seq else None
    if event is None or not isinstance(event.payload, ModelCallRecorded):
        raise HTTPException(404, f"no model call with seq {seq} in run {run_id!r}")
    messages = await load_messages(state.store, event.payload.message_list)
    return JSONResponse(state.redact({"seq": seq, "messages": messages}))
