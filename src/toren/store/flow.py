"""Flow control's SQL (both dialects; toren.core.contract.flow says what it means).

A run of a concurrency key holds a slot while it is ``running`` or ``waiting``. The claim
of a ``queued`` run of a key (:func:`claim_keyed`) counts the key's holders and takes at
most ``limit - holders`` of its queued runs, by priority then start order, in the claim's
own transaction. On PostgreSQL each key is first locked with a transaction-scoped advisory
lock, so two workers claiming runs of one key at once count one after the other (the
second sees the first's claims when the first commits). SQLite has one writer: its
transactions are already one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from toren.core.contract.flow import KeyQueue, Queued
from toren.core.contract.records import Lease
from toren.core.contract.values import RunStatus

Cursor = Any  # a DB-API cursor (toren.store.sql.Cursor; sql imports this module)

# What the claim of unkeyed runs adds: a queued run of a key goes through claim_keyed.
# A queued run asked to cancel is claimed at once too (its tick ends it before any step).
UNKEYED = "AND (concurrency_key IS NULL OR status <> 'queued' OR cancel_requested <> 0) "
# Keys with a queued run that could start now (at most KEYS per claim).
KEYS = 64
_READY = (
    "status = 'queued' AND concurrency_key IS NOT NULL "
    "AND (not_before IS NULL OR not_before <= ?) "
    "AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?)"
)
HOLDING = "concurrency_key = ? AND status IN ('running', 'waiting')"


class Host(Protocol):
    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor: ...


def claim_keyed(
    store: Host,
    cur: Cursor,
    *,
    dialect: str,
    worker_id: str,
    limit: int,
    now: float,
    ttl: float,
    only: str | None,
) -> list[Lease]:
    """Lease up to ``limit`` queued runs of concurrency keys that have room."""
    x = store._x
    only_sql, only_params = ("AND id = ? ", (only,)) if only else ("", ())
    keys = [
        row[0]
        for row in x(
            cur,
            # Only keys with room (a key at its limit would take a place among the KEYS
            # looked at and starve the others), in one order for every worker.
            f"SELECT DISTINCT concurrency_key FROM runs r WHERE {_READY} {only_sql}"
            "AND (SELECT COUNT(id) FROM runs h WHERE h.concurrency_key = r.concurrency_key "
            "AND h.status IN ('running', 'waiting')) < COALESCE(r.concurrency_limit, 1) "
            "ORDER BY concurrency_key LIMIT ?",
            (now, now, *only_params, KEYS),
        ).fetchall()
    ]
    leases: list[Lease] = []
    for key in sorted(keys):  # one order for every worker: locks never wait in a cycle
        if len(leases) >= limit:
            break
        if dialect == "postgres":
            x(cur, "SELECT pg_advisory_xact_lock(hashtextextended(?, 7031))", (key,))
        holding = x(cur, f"SELECT COUNT(id) FROM runs WHERE {HOLDING}", (key,)).fetchone()[0]
        head = x(
            cur,
            f"SELECT concurrency_limit FROM runs WHERE concurrency_key = ? AND {_READY} "
            "ORDER BY priority DESC, created_at, id LIMIT 1",
            (key, now, now),
        ).fetchone()
        if head is None:
            continue
        room = min((head[0] or 1) - holding, limit - len(leases))
        if room <= 0:
            continue
        lock = " FOR UPDATE SKIP LOCKED" if dialect == "postgres" else ""
        rows = x(
            cur,
            f"SELECT id, lease_owner, lease_epoch FROM runs WHERE concurrency_key = ? AND "
            f"{_READY} {only_sql}ORDER BY priority DESC, created_at, id LIMIT ?{lock}",
            (key, now, now, *only_params, room),
        ).fetchall()
        for run_id, old_owner, epoch in rows:
            recovered = old_owner is not None
            x(
                cur,
                "UPDATE runs SET lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, "
                "status = 'running', lease_recoveries = lease_recoveries + ? WHERE id = ?",
                (worker_id, epoch + 1, now + ttl, int(recovered), run_id),
            )
            leases.append(Lease(run_id, worker_id, epoch + 1, recovered, RunStatus.QUEUED))
    return leases


def queued_because(store: Host, cur: Cursor, run_id: str, key: str, limit: int) -> Queued:
    """Why a queued run of ``key`` waits: the key's holders and the run's place."""
    x = store._x
    holding = x(cur, f"SELECT COUNT(id) FROM runs WHERE {HOLDING}", (key,)).fetchone()[0]
    row = x(cur, "SELECT priority, created_at FROM runs WHERE id = ?", (run_id,)).fetchone()
    priority, created_at = row if row else (0, 0.0)
    ahead = x(
        cur,
        "SELECT COUNT(id) FROM runs WHERE concurrency_key = ? AND status = 'queued' AND "
        "id <> ? AND (priority > ? OR (priority = ? AND (created_at < ? OR "
        "(created_at = ? AND id < ?))))",
        (key, run_id, priority, priority, created_at, created_at, run_id),
    ).fetchone()[0]
    return Queued(key=key, limit=limit, holding=int(holding), position=int(ahead) + 1)


def unfinished_of(store: Host, cur: Cursor, key: str) -> list[str]:
    """The unfinished runs of a key (a start's ``on_conflict`` policy looks at them)."""
    rows = store._x(
        cur,
        "SELECT id FROM runs WHERE concurrency_key = ? AND "
        "status NOT IN ('completed', 'failed', 'cancelled') ORDER BY id",
        (key,),
    ).fetchall()
    return [row[0] for row in rows]


def set_limits(store: Host, cur: Cursor, limits: Sequence[tuple[str, str, int | None]]) -> int:
    """Apply a deploy's ``concurrency:`` to the runs still queued under the keys it
    derives (``agent/process`` and ``agent/process:...``): a new limit for each, or, for a
    process that no longer declares one, no key at all (they are released). The rows
    changed."""
    changed = 0
    for agent, process, limit in limits:
        base = f"{agent}/{process}"
        where = (
            "agent = ? AND process = ? AND status = 'queued' AND "
            "(concurrency_key = ? OR substr(concurrency_key, 1, ?) = ?)"
        )
        params = (agent, process, base, len(base) + 1, base + ":")
        if limit is None:
            done = store._x(
                cur,
                f"UPDATE runs SET concurrency_key = NULL, concurrency_limit = NULL WHERE {where}",
                params,
            )
        else:
            done = store._x(
                cur,
                f"UPDATE runs SET concurrency_limit = ? WHERE {where} AND "
                "(concurrency_limit IS NULL OR concurrency_limit <> ?)",
                (limit, *params, limit),
            )
        changed += max(done.rowcount, 0)
    return changed


KEYS_SHOWN = 500  # concurrency keys a flow view lists (the busiest first)


def key_queues(store: Host, cur: Cursor) -> list[KeyQueue]:
    """Each concurrency key with unfinished runs: its limit, the runs holding a slot and
    those queued for one (most queued first)."""
    rows = store._x(
        cur,
        "SELECT concurrency_key, MAX(concurrency_limit), "
        "SUM(CASE WHEN status IN ('running', 'waiting') THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END), "
        "MIN(CASE WHEN status = 'queued' THEN created_at END) "
        "FROM runs WHERE concurrency_key IS NOT NULL "
        "AND status IN ('queued', 'running', 'waiting') "
        "GROUP BY concurrency_key ORDER BY 4 DESC, 1 LIMIT ?",
        (KEYS_SHOWN,),
    ).fetchall()
    return [
        KeyQueue(
            key=str(key),
            limit=None if limit is None else int(limit),
            holding=int(holding),
            queued=int(queued),
            oldest_queued_at=None if oldest is None else float(oldest),
        )
        for key, limit, holding, queued, oldest in rows
    ]
