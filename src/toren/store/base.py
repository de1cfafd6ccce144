"""The storage interface: one Protocol, the records that cross it, and the backend chosen
by URL. All SQL of a dialect lives in that dialect's module; shared statements (written
with ``?`` placeholders, every column named) live in :mod:`toren.store.queries`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from toren.core.events import Event
from toren.core.values import NANO as NANO
from toren.core.values import STATUSES as STATUSES
from toren.core.values import TERMINAL_STATUSES as TERMINAL_STATUSES
from toren.core.values import from_nano as from_nano
from toren.core.values import to_nano as to_nano
from toren.errors import CorruptRow


@dataclass(frozen=True)
class ValueSummary:
    """A run's input, output or error left out of a list of runs: its size (bytes of its
    JSON text) and the start of that text. The run's own read has the whole value."""

    bytes: int
    preview: str

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "preview": self.preview, "truncated": True}


@dataclass(frozen=True)
class RunRecord:
    id: str
    agent: str
    process: str
    status: str
    input: Any
    output: Any = None
    error: dict[str, Any] | None = None
    idempotency_key: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None
    not_before: float | None = None
    cancel_requested: bool = False
    waiting_for: list[str] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: int = 0
    saved_nanousd: int = 0
    steps: int = 0
    code_version: str | None = None
    lease_recoveries: int = 0
    invalidations: int = 0
    retries: int = 0  # how many times the run was retried (RunRetried)
    forked_from: str | None = None  # the run this one was forked from (RunForked)
    forked_at: str | None = None  # ... at this point of it, "STREAM:POSITION"
    # Set while the run's ticks fail on an infrastructure error (toren.core.blocked):
    # the error, the failed ticks in a row, when the first of them failed. Cleared by
    # the next tick that makes progress.
    blocked_error: dict[str, Any] | None = None
    blocked_attempts: int = 0
    blocked_since: float | None = None
    # Set only in a list's summary rows (``list_runs(summary=True)``), for a value too
    # large to list whole; the value itself is then None.
    summaries: Mapping[str, ValueSummary] | None = None

    @property
    def cost_usd(self) -> Decimal:
        return from_nano(self.cost_nanousd)

    @property
    def saved_usd(self) -> Decimal:
        return from_nano(self.saved_nanousd)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """The public JSON shape of a run (HTTP API, CLI ``--json``)."""
        return {
            "id": self.id,
            "agent": self.agent,
            "process": self.process,
            "status": self.status,
            "input": self.input,
            "output": self.output,
            "error": self.error,
            "idempotency_key": self.idempotency_key,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "waiting_for": self.waiting_for,
            "not_before": self.not_before,
            "cancel_requested": self.cancel_requested,
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "cost_usd": str(self.cost_usd),
                "saved_by_replay_usd": str(self.saved_usd),
                "steps": self.steps,
            },
            "code_version": self.code_version,
            "lease_recoveries": self.lease_recoveries,
            "invalidations": self.invalidations,
            "retries": self.retries,
            "forked_from": (
                None
                if self.forked_from is None
                else {"run_id": self.forked_from, "at": self.forked_at}
            ),
            "blocked": self.blocked_dict(),
            "lease": (
                {"worker": self.lease_owner, "expires_at": self.lease_expires_at}
                if self.lease_owner is not None and not self.terminal
                else None
            ),
            **{f"{k}_summary": v.to_dict() for k, v in (self.summaries or {}).items()},
        }

    def blocked_dict(self) -> dict[str, Any] | None:
        """The run's blocked state in its public shape, or None when it is not blocked."""
        if self.blocked_error is None or self.terminal:
            return None
        return {
            "error": self.blocked_error,
            "attempts": self.blocked_attempts,
            "since": self.blocked_since,
            "retry_at": self.not_before,
        }


@dataclass(frozen=True)
class NewRun:
    id: str
    agent: str
    process: str
    input: Any
    idempotency_key: str | None
    created_at: float
    started_event: Event
    # A fork: the events that follow RunStarted (RunForked, the copied steps) and its
    # lineage, written in the same transaction as the run.
    events: Sequence[Event] = ()
    forked_from: str | None = None
    forked_at: str | None = None


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a run. ``epoch`` is a fencing token: every write checks it,
    so a worker whose lease was taken over can never write again."""

    run_id: str
    worker_id: str
    epoch: int
    recovered: bool = False  # claimed from a dead worker's expired lease
    previous_status: str = "queued"  # the run's status when claimed


@dataclass(frozen=True)
class RunDelta:
    """What one append adds to the run row's totals."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: int = 0
    saved_nanousd: int = 0
    steps: int = 0
    invalidations: int = 0
    code_version: str | None = None


@dataclass(frozen=True)
class Release:
    """How a worker gives a run back: parked (waiting), backed off, or finished."""

    status: str
    not_before: float | None = None
    waiting_for: list[str] | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    events: Sequence[Event] = ()
    delta: RunDelta | None = None


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    code_version: str
    started_at: float
    heartbeat_at: float
    draining: bool = False
    hostname: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class InboxMessage:
    id: int
    run_id: str
    name: str
    payload: Any
    created_at: float


@dataclass(frozen=True)
class Appended:
    events: list[Event] = field(default_factory=list)


class Store(Protocol):
    """What the engine, the API and the CLI need of a database."""

    url: str

    async def migrate(self) -> None: ...
    async def close(self) -> None: ...

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]: ...
    async def get_run(self, run_id: str) -> RunRecord | None: ...
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
        self, run_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[Event]: ...
    async def get_blobs(self, hashes: Sequence[str]) -> dict[str, Any]: ...

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
        self, lease: Lease, error: dict[str, Any], *, status: str, retry_at: float, now: float
    ) -> int: ...
    async def clear_blocked(self, lease: Lease, *, now: float) -> None: ...
    async def lease_holders(self, *, now: float) -> list[WorkerInfo]: ...
    async def expire_leases(self, worker_id: str, *, now: float) -> int: ...

    async def send_message(self, run_id: str, name: str, payload: Any, *, now: float) -> int: ...
    async def next_message(self, run_id: str, names: Sequence[str]) -> InboxMessage | None: ...
    async def request_cancel(self, run_id: str, *, now: float) -> RunRecord: ...
    async def retry_run(self, run_id: str, event: Event, *, now: float) -> RunRecord: ...

    async def register_worker(self, info: WorkerInfo) -> None: ...
    async def heartbeat_worker(self, worker_id: str, *, now: float, draining: bool) -> None: ...
    async def live_workers(self, *, now: float, ttl: float) -> list[WorkerInfo]: ...

    async def wait_for_work(self, timeout: float) -> bool: ...
    async def next_due(self, *, now: float) -> float | None: ...
    async def notify(self) -> None: ...
    async def stats(self) -> dict[str, Any]: ...
    async def queue_depth(self, *, now: float) -> int: ...


def read_json(
    text: str | None,
    table: str,
    column: str,
    error: type[CorruptRow] = CorruptRow,
    **row: Any,
) -> Any:
    """The value of a stored JSON column (None for NULL). Unreadable text is ``error``
    naming the table, the row (``row``: its key columns) and the column: a bare decode
    error raised inside a step would be taken for the agent's own and fail the run."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        key = ", ".join(f"{name}={value!r}" for name, value in row.items())
        raise error(
            f"the {column} of {table} row {key} is not valid JSON ({exc}); Toren does not "
            "skip unreadable data: repair the row, then retry",
            table=table,
            column=column,
            **row,
        ) from None
