"""Taking over the runs of a worker that is gone, without waiting out their leases.

A lease is the only proof that a worker still executes a run, so by default a run held by
a crashed worker waits until its lease expires (``Settings.lease.ttl``). Two cases are
known for sure earlier, and only those are taken over at once:

- the worker **deregistered**: it stopped (its row says draining with heartbeat 0) yet
  still holds a lease, because giving the run back failed;
- the worker ran **on this host and its process no longer exists** (``os.kill(pid, 0)``
  fails with ``ProcessLookupError``), and it has not heartbeated for two heartbeat
  intervals. The second condition guards against a live worker in another PID namespace
  under the same host name (a container with host networking): a live worker
  heartbeats, a dead one cannot. A stopped (SIGSTOP) process still exists, so it is
  never taken over early: its in-flight step might still complete.

Everything else (another host, no pid recorded) waits for the lease, and every surface
shows the wait ("held by worker w1 until 12:03:10").
"""

from __future__ import annotations

import logging
import os
import socket

from toren.core.contract.ports import JournalStore
from toren.core.contract.records import WorkerInfo

log = logging.getLogger("toren.worker")


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    except OSError:
        return True  # cannot tell: assume alive (the safe side)
    return True


def _pid_here(worker: WorkerInfo, hostname: str) -> int | None:
    """``worker``'s pid if its process can be looked at (it ran on this host), else None."""
    return worker.pid if worker.hostname == hostname and worker.pid else None


def _silent_since(worker: WorkerInfo, heartbeat: float) -> float:
    """From when ``worker`` has missed two heartbeats (a live worker never does)."""
    return worker.heartbeat_at + 2 * heartbeat


def why_gone(worker: WorkerInfo, *, hostname: str, now: float, heartbeat: float) -> str | None:
    """Why ``worker`` is known to be gone, or None when that cannot be known safely."""
    if worker.draining and worker.heartbeat_at <= 0.0:
        return "it deregistered"
    pid = _pid_here(worker, hostname)
    if pid and _silent_since(worker, heartbeat) < now and not pid_exists(pid):
        return f"its process {pid} on this host no longer exists"
    return None


async def gone_in(
    store: JournalStore,
    worker_id: str,
    *,
    now: float,
    heartbeat: float,
    hostname: str | None = None,
) -> float | None:
    """Seconds until ``worker_id`` counts as gone by its process: it ran on this host and
    its process no longer exists, but it heartbeated less than two intervals ago (a
    process killed a moment ago). None if it will not (its process exists, another host,
    no pid) or is not holding anything: then only its lease tells."""
    host = hostname or socket.gethostname()
    for worker in await store.lease_holders(now=now):
        pid = _pid_here(worker, host)
        if worker.id == worker_id and pid:
            if pid_exists(pid):
                return None
            return max(0.0, _silent_since(worker, heartbeat) - now)
    return None


async def take_over_gone(
    store: JournalStore,
    *,
    me: str,
    now: float,
    heartbeat: float,
    hostname: str | None = None,
) -> list[tuple[str, str]]:
    """Make the leases of every worker known to be gone claimable now. Returns the
    (worker id, reason) of each worker whose runs were freed."""
    host = hostname or socket.gethostname()
    freed = []
    for worker in await store.lease_holders(now=now):
        if worker.id == me:
            continue
        why = why_gone(worker, hostname=host, now=now, heartbeat=heartbeat)
        if why is None:
            continue
        count = await store.expire_leases(worker.id, now=now)
        if count:
            log.warning(
                "worker %s is gone (%s): %d run(s) it held are taken over now, not when "
                "their leases expire",
                worker.id,
                why,
                count,
            )
            freed.append((worker.id, why))
    return freed
