"""Toren's domain vocabulary, defined once.

Every fixed set the engine, the stores, the API, the CLI and the console speak of (a run's
status, a step's kind, why a stream was invalidated, how a tick ended) is a ``StrEnum``
here. A member *is* its string (``RunStatus.COMPLETED == "completed"``), so rows, events
and JSON bodies keep exactly the bytes they had: these names type the code, they do not
change the log.

Money is one representation inside: integer nano-USD (``Nano``). ``Decimal`` appears only at
the edges (prices in provider tables, ``max_cost_usd``, API and CLI output), converted by
:func:`to_nano` and :func:`from_nano`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Literal, TypeAlias, TypedDict

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
"""A value JSON can carry: run inputs and outputs, tool arguments and results."""

Nano: TypeAlias = int
"""An amount of money in nano-USD (10⁻⁹ USD)."""

NANO = Decimal("1e9")


def to_nano(usd: Decimal | float | str) -> Nano:
    """USD at an edge (a price, a limit, a recorded ``cost_usd``) to nano-USD, rounded half
    to even at the ninth decimal."""
    return int((Decimal(str(usd)) * NANO).to_integral_value())


_RECORDED_NANO: dict[str, Nano] = {}


def recorded_nano(cost_usd: str) -> Nano:
    """:func:`to_nano` of a recorded ``cost_usd`` text, remembered: a fold reads one per
    model call, and a run's calls cost the same few amounts over and over."""
    nano = _RECORDED_NANO.get(cost_usd)
    if nano is None:
        nano = to_nano(cost_usd)
        if type(cost_usd) is str:
            if len(_RECORDED_NANO) >= 4096:
                _RECORDED_NANO.clear()
            _RECORDED_NANO[cost_usd] = nano
    return nano


def usd_to_nano(value: object) -> Nano | None:
    """A USD amount from outside (a number, a ``Decimal`` or its text; not a bool) as
    nano-USD, read as the decimal it spells (``0.1`` -> 100,000,000); None if it is not a
    finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        return None
    try:
        amount = Decimal(str(value))
    except ArithmeticError:  # decimal.InvalidOperation: text that is not a number
        return None
    return to_nano(amount) if amount.is_finite() else None


def whole(value: object) -> int | None:
    """An integer given as an int or an integral float (``3`` or ``3.0``; not a bool),
    else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def retry_limits(raises: Mapping[str, object]) -> dict[str, int]:
    """A ``RunRetried.raise_limits`` as integers: ``max_steps`` and ``max_cost_nanousd``.
    Logs of earlier releases hold numbers where this one writes integers (``max_steps``
    3.0) and the cost as USD (``max_cost_usd``: 1.0): both are read. Values of other
    types, and unknown names (a newer release's), are left out."""
    out: dict[str, int] = {}
    steps = whole(raises.get("max_steps"))
    if steps is not None:
        out["max_steps"] = steps
    cost = whole(raises.get("max_cost_nanousd"))
    if cost is None and isinstance(raises.get("max_cost_usd"), int | float):
        cost = usd_to_nano(raises["max_cost_usd"])
    if cost is not None:
        out["max_cost_nanousd"] = cost
    return out


def from_nano(nano: Nano) -> Decimal:
    """Nano-USD back to a normalised ``Decimal`` for output (``0`` for zero)."""
    return (Decimal(nano) / NANO).normalize() if nano else Decimal("0")


class RunStatus(StrEnum):
    """A run's status: queued, running or waiting while it is in flight; completed, failed
    or cancelled once it has finished."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: frozenset[str] = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
)
STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)
# In flight: not finished, so a deploy replays it (``toren plan``, the retention sweep
# never selects it).
IN_FLIGHT_STATUSES: tuple[RunStatus, ...] = (
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.WAITING,
)


class StepKind(StrEnum):
    """What a step at a position of a stream is. Part of every digest, so a step replaced by
    a different kind of step at the same position is caught by the kind check."""

    MODEL = "model"
    TOOL = "tool"
    VALUE = "value"
    CHILD = "child"
    MESSAGE = "message"  # a message wait (with or without a timeout)
    SLEEP = "sleep"
    UNKNOWN = "unknown"  # an event type from a newer minor that this reader skips


class InvalidationCause(StrEnum):
    """Why a ``StreamInvalidated`` event cut a stream's suffix."""

    DIGEST_MISMATCH = "digest_mismatch"
    KIND_MISMATCH = "kind_mismatch"
    STREAM_ENDED = "stream_ended"
    PARENT_INVALIDATED = "parent_invalidated"


class TickStatus(StrEnum):
    """How one tick of a run ended (``TickResult.status``)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"
    RUNNING = "running"  # released to run again (a turn boundary, a due timer)
    QUEUED = "queued"
    BACKED_OFF = "backed_off"
    DRAINED = "drained"
    LEASE_LOST = "lease_lost"
    DEFERRED = "deferred"
    NOT_CLAIMED = "not_claimed"
    ERROR = "error"


VerdictState = Literal["idle", "ready", "busy", "unknown"]
"""What the branches of a run's streams are doing
(``toren.core.agent_api.branches.Verdict.state``)."""


class RecordedError(TypedDict):
    """A failure as it is recorded (``RunFailed.error``, a failed tool or model step, a
    run's ``blocked`` error): the exception's class name, its stable code and its message.
    A step's error may carry the exception's details as further keys."""

    type: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Totals:
    """Usage that adds up: tokens, money in nano-USD, steps and invalidations. One type for
    what a step adds to a run, what a tick has pending, and what ``ctx.usage`` reports."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: Nano = 0
    saved_nanousd: Nano = 0
    steps: int = 0
    invalidations: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost_nanousd + other.cost_nanousd,
            self.saved_nanousd + other.saved_nanousd,
            self.steps + other.steps,
            self.invalidations + other.invalidations,
        )

    @property
    def cost_usd(self) -> Decimal:
        return from_nano(self.cost_nanousd)

    @property
    def saved_usd(self) -> Decimal:
        return from_nano(self.saved_nanousd)


ZERO = Totals()


def vocabulary() -> dict[str, JSON]:
    """The fixed sets as JSON, for clients that must not spell them again (the console
    reads this from its pages): each enum as ``{NAME: value}``, and the terminal statuses
    in the enum's order."""
    sets: dict[str, JSON] = {
        cls.__name__: {m.name: m.value for m in cls}
        for cls in (RunStatus, StepKind, InvalidationCause)
    }
    sets["terminal"] = [s.value for s in STATUSES if s in TERMINAL_STATUSES]
    return sets
