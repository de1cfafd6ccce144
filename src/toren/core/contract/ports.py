"""The ports the engine calls through, owned here so that every adapter depends on core and
core on none of them: storage (split by consumer), a model provider, telemetry.

Storage is two Protocols that the same store classes (``toren.store``) implement:

- :class:`JournalStore`, what a tick and a worker need: read and append a run's log under a
  lease, claim, renew and release leases, take inbox messages, register and heartbeat
  workers, wait for work, prune finished runs;
- :class:`RunStore`, what the API, the CLI and a host need: start, read, list, message,
  cancel and retry runs, read bodies, the counts behind ``/metrics``.

:class:`Store` is both, plus ``migrate`` and ``close``: what a backend chosen by URL
(``toren.store.connect``) returns. A consumer annotates with the narrowest one it uses.
The records that cross these ports are in :mod:`toren.core.contract.records`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

from toren.config import RateLimit
from toren.core.contract.events import Event
from toren.core.contract.flow import FlowView, Queued
from toren.core.contract.model_types import DeltaCallback, ModelRequest, ModelResponse
from toren.core.contract.ratelimit import Grant
from toren.core.contract.records import (
    InboxMessage,
    Lease,
    NewRun,
    Release,
    RunDelta,
    RunRecord,
    SearchBacklog,
    WorkerInfo,
)
from toren.core.contract.schedule import ScheduleStore
from toren.core.contract.values import RunStatus

__all__ = ["BlobStore", "JournalStore", "ModelProvider", "RunStore", "Store", "Telemetry"]


class BlobStore(Protocol):
    """Content-addressed message bodies by hash: what replay, a plan and a reader need."""

    async def get_blobs(self, hashes: Sequence[str]) -> dict[str, Any]: ...


class JournalStore(BlobStore, Protocol):
    """What a tick and a worker need of a database: the log of a run under a lease."""

    async def get_run(self, run_id: str) -> RunRecord | None: ...
    async def load_events(
        self, run_id: str, *, after_seq: int = 0, limit: int | None = None, at_least: int = 0
    ) -> list[Event]: ...

    async def append(
        self,
        lease: Lease,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None = None,
        delta: RunDelta | None = None,
        consume_inbox: int | None = None,
        now: float,
    ) -> list[Event]: ...
    async def claim(
        self, worker_id: str, limit: int, *, now: float, ttl: float, only: str | None = None
    ) -> list[Lease]: ...
    async def renew(
        self, worker_id: str, run_ids: Sequence[str], *, expires_at: float
    ) -> tuple[set[str], set[str]]: ...
    async def renew_lease(self, lease: Lease, *, expires_at: float) -> bool: ...
    async def release(self, lease: Lease, release: Release, *, now: float) -> list[Event]: ...
    async def block(
        self,
        lease: Lease,
        error: dict[str, object],
        *,
        status: RunStatus,
        retry_at: float,
        now: float,
    ) -> int: ...
    async def clear_blocked(self, lease: Lease, *, now: float) -> None: ...
    async def lease_holders(self, *, now: float) -> list[WorkerInfo]: ...
    async def expire_leases(self, worker_id: str, *, now: float) -> int: ...

    async def next_message(self, run_id: str, names: Sequence[str]) -> InboxMessage | None: ...

    async def register_worker(self, info: WorkerInfo) -> None: ...
    async def heartbeat_worker(self, worker_id: str, *, now: float, draining: bool) -> None: ...
    async def live_workers(self, *, now: float, ttl: float) -> list[WorkerInfo]: ...
    async def wait_for_work(self, timeout: float) -> bool: ...
    async def next_due(self, *, now: float) -> float | None: ...
    @property
    def schedules(self) -> ScheduleStore: ...
    async def set_concurrency_limits(
        self, limits: Sequence[tuple[str, str, int | None]]
    ) -> int: ...
    async def take_rate_slot(
        self, key: str, limit: RateLimit, *, owner: str, tokens: int, now: float
    ) -> Grant: ...
    async def settle_rate_slot(
        self, key: str, grant_id: int, *, tokens: int, ok: bool, now: float
    ) -> None: ...
    async def throttle_rate(
        self, key: str, grant_id: int | None, *, retry_after: float | None, now: float
    ) -> float: ...
    async def declare_rate_limits(
        self, agents: Sequence[str], limits: Mapping[str, RateLimit], *, now: float
    ) -> int: ...

    async def prune_finished(self, *, before: float, limit: int) -> int: ...
    async def sweep_blobs(self, *, page: int = 200) -> int: ...


class RunStore(BlobStore, Protocol):
    """What the API, the CLI and a host need of a database: runs from the outside."""

    url: str

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]: ...
    async def get_run(self, run_id: str) -> RunRecord | None: ...
    async def queued_because(self, run: RunRecord) -> Queued | None: ...
    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        process: str | None = None,
        limit: int = 50,
        before: str | None = None,
        search: str | None = None,
        summary: bool = False,
        updated_after: float | None = None,
    ) -> list[RunRecord]: ...
    async def load_events(
        self, run_id: str, *, after_seq: int = 0, limit: int | None = None, at_least: int = 0
    ) -> list[Event]: ...
    async def search_backlog(self, *, since: float, limit: int) -> SearchBacklog: ...
    async def put_search_texts(self, texts: Sequence[tuple[str, str, str]]) -> None: ...

    async def payload_texts(self, run_id: str) -> dict[int, str]: ...

    async def send_message(self, run_id: str, name: str, payload: object, *, now: float) -> int: ...
    async def request_cancel(self, run_id: str, *, now: float) -> RunRecord: ...
    async def retry_run(self, run_id: str, event: Event, *, now: float) -> RunRecord: ...

    async def lease_holders(self, *, now: float) -> list[WorkerInfo]: ...
    async def expire_leases(self, worker_id: str, *, now: float) -> int: ...
    async def live_workers(self, *, now: float, ttl: float) -> list[WorkerInfo]: ...
    async def notify(self) -> None: ...
    async def stats(self) -> dict[str, Any]: ...
    async def flow_view(self, *, now: float) -> FlowView: ...
    async def queue_depth(self, *, now: float) -> int: ...


class Store(JournalStore, RunStore, Protocol):
    """Both ports, and the database's lifetime: what ``toren.store.connect(url)`` returns."""

    async def migrate(self) -> None: ...
    async def close(self) -> None: ...


@runtime_checkable
class ModelProvider(Protocol):
    """What the engine needs of a provider. ``on_delta`` receives text deltas as they
    stream in; only the returned final response is recorded. A provider that reported
    usage for a call before it was cancelled raises
    :class:`~toren.core.contract.model_types.CancelledWithUsage`."""

    name: str

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaCallback | None = None
    ) -> ModelResponse: ...


class Telemetry(Protocol):
    """The hooks the engine calls (``toren.agents.telemetry`` implements them).
    Implementations must never raise into the engine."""

    def run_span(
        self, run_id: str, *, agent: str, process: str, code_version: str = ""
    ) -> contextlib.AbstractContextManager[None]: ...

    def on_model_call(
        self,
        run_id: str,
        stream: str,
        position: int,
        request: ModelRequest,
        response: ModelResponse | None,
        latency: float,
        replayed: bool,
        *,
        error: str | None = None,
        cost_usd: Decimal | None = None,
    ) -> None: ...

    def on_tool_call(
        self,
        run_id: str,
        stream: str,
        position: int,
        name: str,
        latency: float,
        replayed: bool,
        *,
        error: str | None = None,
    ) -> None: ...
