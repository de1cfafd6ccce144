"""What the API's routes share (``app.state.toren``), apart from the app that serves them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, cast

from fastapi import Depends, Request

from toren.api import models
from toren.api.errors import STATUS_CODES
from toren.api.render import Pages
from toren.api.sse import StreamSettings
from toren.core.agent_api.program import AgentResolver
from toren.core.contract.ports import Store
from toren.core.drivers.live import LiveHub
from toren.core.drivers.scheduler import Scheduler
from toren.core.drivers.tick import TickDeps
from toren.core.drivers.upkeep import WorkerMetrics
from toren.redact import Redactor, redact_prefix

PUBLIC_PATHS = frozenset({"/v1/health"})


class InProcessWorker(Protocol):
    """What the API reads of a worker running in its own process (``toren dev``, ``toren
    serve`` with a worker): :class:`toren.core.drivers.worker.LocalWorkerRuntime`, or ``toren
    dev``'s switch to whichever worker runs now."""

    @property
    def deps(self) -> TickDeps: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def active_runs(self) -> list[str]: ...
    def cancel_local(self, run_id: str) -> bool:
        """Cancel the run at once if this worker is executing it (True if it was)."""
        ...


@dataclass
class ApiState:
    """What the routes share; ``app.state.toren``. The console may add public paths."""

    store: Store
    agents: AgentResolver
    live: LiveHub | None
    runtime: InProcessWorker | None
    redact: Redactor
    stream: StreamSettings
    public_paths: set[str] = field(default_factory=lambda: set(PUBLIC_PATHS))
    pages: Pages = field(default_factory=Pages)  # list pages rendered lately (api/render.py)
    closing: bool = False  # set on shutdown: open streams end so the server can stop
    # Agent paths in messages to clients, relative to the agents root (api/errors.py).
    paths: Callable[[str], str] = str

    def __post_init__(self) -> None:
        # A list preview as it may be shown (api/app.py ``_safe_previews``), remembered by
        # its text: the runs of a busy list or search page come back request after request,
        # and their previews (at most 256 characters) are redacted once, not each time.
        self.safe_preview: Callable[[str], str] = functools.lru_cache(maxsize=4096)(
            functools.partial(redact_prefix, self.redact)
        )

    def is_public(self, path: str) -> bool:
        return path in self.public_paths


async def get_state(request: Request) -> ApiState:
    # A coroutine: FastAPI would run a plain function in a worker thread, on every request.
    return cast(ApiState, request.app.state.toren)


State = Annotated[ApiState, Depends(get_state)]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's documented error responses (plus those every route may give)."""
    always = (401, 413, 500)
    return {
        s: {"model": models.ErrorBody, "description": STATUS_CODES.get(s, "internal_error")}
        for s in sorted({*statuses, *always})
    }
