"""Fencing before effects: a worker proves its lease is still its own before any live step.

The store fences every *write* by the lease's epoch, so a worker whose lease was taken over
can never change the log. That alone does not stop a worker that stalled past its lease (a
SIGSTOP, a VM or container pause, a long GC or swap stall) from *starting* effects the log
cannot take back once it thaws: a model call is paid, an email is sent, and only the write
that follows is refused. So each tick keeps a local deadline for its lease, measured on a
clock that keeps counting while the process is frozen, and the one gate every live step
passes (``toren.core.drivers.tickstate.Busy``) asks :meth:`LeaseFence.due` first:

* more than ``margin`` seconds left: proceed (no I/O; the heartbeat keeps the deadline far);
* otherwise: renew the lease in one round trip fenced by its epoch
  (:meth:`~toren.core.contract.ports.JournalStore.renew_lease`); if another worker claimed
  the run in the meantime the renewal finds another epoch, and the tick stops before the effect.

The deadline is the time a renewal (or the claim) was *sent* plus the TTL: the database
set the expiry to the worker's ``now + ttl`` at some point after that, so the local
deadline is never later than the real one. ``margin`` covers what the local clock cannot
see: wall-clock skew between workers (expiry is compared on each claimer's clock) and the
instants between the check and the effect leaving the process. See docs/storage.md,
"Stalled workers", for the guarantee and its remaining window.
"""

from __future__ import annotations

import time

from toren.core.contract.clock import Clock
from toren.core.contract.ports import JournalStore
from toren.core.contract.records import Lease
from toren.errors import LeaseLost, StorageError

# CLOCK_BOOTTIME keeps counting through a system suspend (CLOCK_MONOTONIC does not);
# both keep counting while the process itself is stopped (SIGSTOP, a cgroup freeze).
_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)
RENEW_ATTEMPTS = 3


def lease_clock() -> float:
    """Seconds on a clock that never goes back and counts while this process is frozen."""
    if _CLOCK is not None:
        return time.clock_gettime(_CLOCK)
    return time.monotonic()


class LeaseFence:
    """The local deadline of one lease. ``granted_at`` is a :func:`lease_clock` reading
    taken before the claim (or renewal) that granted it was sent; ``None`` means unknown,
    and the first effect renews before it starts."""

    __slots__ = ("deadline", "lease", "margin", "ttl")

    def __init__(self, lease: Lease, ttl: float, margin: float, granted_at: float | None) -> None:
        self.lease = lease
        self.ttl = ttl
        self.margin = margin
        self.deadline = granted_at + ttl if granted_at is not None else float("-inf")

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (a :func:`lease_clock` reading) succeeded."""
        self.deadline = max(self.deadline, sent_at + self.ttl)

    def remaining(self) -> float:
        return self.deadline - lease_clock()

    def due(self) -> bool:
        """Whether the lease must be proven (renewed) before the next effect starts."""
        return self.remaining() <= self.margin

    async def prove(self, store: JournalStore, clock: Clock) -> None:
        """Renew the lease, fenced by its epoch, until it holds for more than the margin.
        Raises :class:`LeaseLost` if the run is another worker's (or released), and
        :class:`StorageError` if the database cannot confirm it in a few round trips."""
        for _ in range(RENEW_ATTEMPTS):
            sent = lease_clock()
            if not await store.renew_lease(self.lease, expires_at=clock.now() + self.ttl):
                raise LeaseLost(
                    f"worker {self.lease.worker_id!r} no longer holds run "
                    f"{self.lease.run_id!r} (lease epoch {self.lease.epoch}): it stalled past "
                    "its lease and another worker claimed the run; no further step starts here"
                )
            self.renewed(sent)
            if not self.due():
                return
        raise StorageError(
            f"could not prove the lease on run {self.lease.run_id!r}: {RENEW_ATTEMPTS} "
            f"renewals each took longer than the lease's TTL minus its margin "
            f"({self.ttl - self.margin:.1f}s); the tick stops before starting another step"
        )
