"""How the tick stops agent code from the outside: the ``Abort`` family.

Each is a ``BaseException``: user code cannot swallow it. The run's state
(:class:`toren.core.drivers.tickstate.TickState`) raises one into the agent task and keeps the
first; the driver (:class:`toren.core.drivers.tick.TickRunner`) reads which one ended the tick.
"""

from __future__ import annotations

from toren.errors import LeaseLost, RunCancelledSignal, StorageError

__all__ = [
    "Abort",
    "BackingOff",
    "Cancelling",
    "Draining",
    "LeaseGone",
    "Parking",
    "StoreFailed",
]


class Abort(BaseException):
    """Stops agent code from the outside. BaseException: user code cannot swallow it."""


class BackingOff(Abort):
    """A newer live code version wrote the stream: this worker gives the run back."""

    def __init__(self, newer_version: str) -> None:
        super().__init__(newer_version)
        self.newer_version = newer_version


class Parking(Abort):
    """Every branch waits durably: the run parks (status waiting)."""


class Draining(Abort):
    """The worker drains: steps in flight are abandoned and run again elsewhere."""


class Cancelling(Abort, RunCancelledSignal):
    """The run's cancel was requested."""


class LeaseGone(Abort):
    """Another worker holds the run now."""

    def __init__(self, cause: LeaseLost) -> None:
        super().__init__(str(cause))
        self.cause = cause


class StoreFailed(Abort):
    """The store failed under a step (unreachable, a statement refused, a row that cannot
    be read). Like a lost lease it ends the tick, and the run is retried once its lease
    runs out; it is not the agent's error to see, nor to swallow: an ``except Exception``
    around ``ctx.model`` that carried on would take a branch no replay can reproduce."""

    def __init__(self, cause: StorageError) -> None:
        super().__init__(str(cause))
        self.cause = cause
