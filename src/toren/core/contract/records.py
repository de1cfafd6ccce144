"""The records that cross the storage port (:mod:`toren.core.contract.ports`): a run's row, a new
run, a worker's lease on a run and how it gives the run back, a worker's registration, an
inbox message, what one append adds to a run's totals.

They are defined in core, with the port, so that the stores depend on the engine's
vocabulary and never the other way round; ``toren.store.base`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from toren.core.contract.events import Event
from toren.core.contract.values import JSON, TERMINAL_STATUSES, RecordedError, RunStatus, from_nano

__all__ = [
    "Appended",
    "InboxMessage",
    "Lease",
    "NewRun",
    "Release",
    "RunDelta",
    "RunRecord",
    "ValueSummary",
    "WorkerInfo",
]


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
    status: str  # a RunStatus, as the row spells it
    input: JSON
    output: JSON = None
    error: dict[str, Any] | None = None  # a RecordedError (with a step's details)
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
    # Set while the run's ticks fail on an infrastructure error (the worker records it):
    # the error, the failed ticks in a row, when the first of them failed. Cleared by
    # the next tick that makes progress.
    blocked_error: RecordedError | None = None
    blocked_attempts: int = 0
    blocked_since: float | None = None
    # A scheduled run's origin (toren.core.contract.schedule): the schedule's id and nominal time.
    # Read by a run's own endpoint; a list of runs leaves it unset.
    schedule_id: str | None = None
    scheduled_for: float | None = None
    # Flow control (toren.core.contract.flow): the key whose limit the run counts against.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0
    # Tool calls that failed (recorded with an error), counted as they are written: a
    # built-in loop shows the model the error and may still complete (docs/agent-yaml.md,
    # on_tool_error). 0 on runs recorded before 0.2.
    tool_errors: int = 0
    # The "provider:model" rate limit the run waits on for its next slot (status
    # waiting, not_before the slot; toren.core.contract.ratelimit). None otherwise.
    paced: str | None = None
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
            "tool_errors": self.tool_errors,
            "forked_from": (
                None
                if self.forked_from is None
                else {"run_id": self.forked_from, "at": self.forked_at}
            ),
            "schedule": (
                None
                if self.schedule_id is None
                else {"id": self.schedule_id, "nominal": _utc(self.scheduled_for)}
            ),
            "concurrency": (
                None
                if self.concurrency_key is None
                else {
                    "key": self.concurrency_key,
                    "limit": self.concurrency_limit,
                    "priority": self.priority,
                }
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
    input: JSON
    idempotency_key: str | None
    created_at: float
    started_event: Event
    # A fork: the events that follow RunStarted (RunForked, the copied steps) and its
    # lineage, written in the same transaction as the run.
    events: Sequence[Event] = ()
    forked_from: str | None = None
    forked_at: str | None = None
    # A scheduled run: its schedule's id and nominal time (toren.core.contract.schedule).
    schedule_id: str | None = None
    scheduled_for: float | None = None
    # Flow control (toren.core.contract.flow): the run's concurrency key and its limit, its
    # priority in the key's queue, and what a start does while the key has unfinished
    # runs (``reject``: refused; ``cancel_previous``: they are asked to cancel).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0
    on_conflict: str = "enqueue"


@dataclass(frozen=True)
class Lease:
    """A worker's claim on a run. ``epoch`` is a fencing token: every write checks it,
    so a worker whose lease was taken over can never write again."""

    run_id: str
    worker_id: str
    epoch: int
    recovered: bool = False  # claimed from a dead worker's expired lease
    previous_status: str = RunStatus.QUEUED  # the run's status when claimed
    # What the claim read of the run, in the claim's own statement (None: not read): the
    # run's row as the claim left it, and the seq of its last event. A tick starts from
    # the row instead of reading it again, and a kept tick (toren.core.drivers.resume)
    # learns from the seq whether the log grew since it parked: on the wake-up path of a
    # parked run, two round trips fewer. Not part of the lease's identity.
    record: RunRecord | None = field(default=None, compare=False, repr=False)
    last_seq: int | None = field(default=None, compare=False)
    # And the oldest unconsumed message of its inbox, of any name (None: none, or not
    # read): the wake-up of a run parked on its inbox takes it without reading the inbox
    # (toren.core.drivers.tickstate.TickState.next_message); one round trip fewer.
    message: InboxMessage | None = field(default=None, compare=False, repr=False)
    # And how many unconsumed messages its inbox held, counted up to 2 (None: not read):
    # once the tick has taken the one it was given, it knows the inbox held nothing more
    # at the claim, and a wait that would park does not read it again (see next_message).
    unread: int | None = field(default=None, compare=False)


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
    tool_errors: int = 0  # set by the store, from the events it writes


@dataclass(frozen=True)
class Release:
    """How a worker gives a run back: parked (waiting), backed off, or finished."""

    status: RunStatus
    not_before: float | None = None
    waiting_for: list[str] | None = None
    output: JSON = None
    error: dict[str, Any] | None = None
    events: Sequence[Event] = ()
    delta: RunDelta | None = None
    paced: str | None = None  # parked for its next slot of this rate limit


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
    payload: JSON
    created_at: float


@dataclass(frozen=True)
class Appended:
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class SearchSource:
    """What a run's search text is built from: its stored JSON texts as they are (the
    search indexer parses and redacts them)."""

    run_id: str
    updated_at: float
    phase: str  # "open", or the final status the text includes the outcome of
    agent: str
    input: str | None
    output: str | None
    error: str | None


@dataclass(frozen=True)
class SearchBacklog:
    runs: list[SearchSource]
    latest_change: float | None  # the newest ``updated_at`` of any run


def _utc(moment: float | None) -> str | None:
    if moment is None:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(moment, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
