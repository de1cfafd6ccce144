"""Typed results of the client: frozen dataclasses read from the API's JSON.

Readers ignore fields they do not know (a newer server may add some) and default fields
that are missing (an older server may not send them yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any, Self, TypeVar

from toren.core.contract.values import JSON, TERMINAL_STATUSES, RunStatus

T = TypeVar("T")


def _known(cls: type[T], data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    saved_by_replay_usd: Decimal = Decimal("0")
    steps: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Usage:
        values = _known(cls, data or {})
        for key in ("cost_usd", "saved_by_replay_usd"):
            if key in values:
                values[key] = Decimal(str(values[key]))
        return cls(**values)


@dataclass(frozen=True)
class Run:
    id: str
    agent: str
    process: str = "main"
    status: str = RunStatus.QUEUED  # as the server spells it (a newer one may add some)
    input: JSON = None
    output: JSON = None
    error: dict[str, Any] | None = None
    idempotency_key: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    waiting_for: list[str] | None = None
    not_before: float | None = None
    cancel_requested: bool = False
    usage: Usage = field(default_factory=Usage)
    code_version: str | None = None
    lease_recoveries: int = 0
    invalidations: int = 0
    retries: int = 0
    tool_errors: int = 0  # tool calls that failed (docs/http-api.md#runs)
    forked_from: dict[str, Any] | None = None  # {"run_id": ..., "at": "main:5"}
    schedule: dict[str, Any] | None = None  # {"id": "agent/name", "nominal": ISO time}
    concurrency: dict[str, Any] | None = None  # {"key", "limit", "priority"}
    # A queued run of a concurrency key: {"key", "limit", "holding", "position", "reason"}.
    queue: dict[str, Any] | None = None
    # A waiting run parked for its next slot of a provider rate limit:
    # {"key", "next_slot_at", "reason"} (docs/flow-control.md#provider-rate-limits).
    rate_limit: dict[str, Any] | None = None
    # Why an unfinished run does not move (docs/http-api.md#runs): blocked on an
    # infrastructure error ({error, attempts, since, retry_at}), held by {worker, expires_at}.
    blocked: dict[str, Any] | None = None
    lease: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        values = _known(cls, data)
        values["usage"] = Usage.from_json(data.get("usage"))
        return cls(**values)


@dataclass(frozen=True)
class Event:
    """One event of a run's log (format v1). ``seq`` orders events and is the SSE id."""

    seq: int
    run_id: str
    type: str
    stream: str = ""
    position: int | None = None
    generation: int = 0
    digest: str | None = None
    code_version: str = ""
    worker_id: str = ""
    slot: str | None = None  # since 0.2; the event's unique key in its run
    created_at: float = 0.0
    format_version: int = 1
    chain: str | None = None  # since 0.2; the event's link in its run's hash chain
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Delta:
    """A chunk of model output while the call is in flight (not part of the log)."""

    stream: str
    position: int | None
    text: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Delta:
        return cls(str(data.get("stream", "")), data.get("position"), str(data.get("text", "")))


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    next_cursor: str | None


@dataclass(frozen=True)
class EventPage:
    events: list[Event]
    next_after: int | None


@dataclass(frozen=True)
class Agent:
    name: str
    processes: list[str]
    error: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Agent:
        return cls(**_known(cls, data))
