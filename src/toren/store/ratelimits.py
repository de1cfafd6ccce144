"""Provider rate limits' SQL (both dialects; toren.core.contract.ratelimit says what it means).

One ``rate_limits`` row per "provider:model" key: the limit last declared, the fleet's
429 state (``blocked_until``, ``strikes``, the ``probe`` slot) and counters for /metrics.
One ``rate_grants`` row per slot taken: its time, its tokens (estimated, then corrected),
its owner (``run/stream:position``: the step, the same across replays) and its state:
0 reserved for later, 1 sent, 2 settled. Every change of a key happens with its
``rate_limits`` row locked (``FOR UPDATE`` on PostgreSQL; SQLite's writes are already one
after the other), so two workers never take the same room of one window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from toren.config import RateLimit
from toren.core.contract.flow import RateLimitView
from toren.core.contract.ratelimit import PROBE_HOLD, Grant, next_slot, throttle_backoff

Cursor = Any  # a DB-API cursor (toren.store.sql.Cursor; sql imports this module)

RESERVED, SENT, SETTLED = 0, 1, 2
# A slot this close to now is taken as now (the call goes at once).
NOW = 0.001
# A call sent and never answered (its worker died) counts this long past the window.
STALE = 600.0


class Host(Protocol):
    dialect: str

    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor: ...


def _lock(store: Host, cur: Cursor, key: str, limit: RateLimit | None, now: float) -> Any:
    """The key's row, created if new, locked for this transaction."""
    x = store._x
    x(
        cur,
        "INSERT INTO rate_limits (key, rpm, tpm, period, updated_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (key) DO NOTHING",
        (
            key,
            limit.rpm if limit else None,
            limit.tpm if limit else None,
            limit.period if limit else 60.0,
            now,
        ),
    )
    lock = " FOR UPDATE" if store.dialect == "postgres" else ""
    return x(
        cur,
        f"SELECT rpm, tpm, period, blocked_until, strikes, probe FROM rate_limits "
        f"WHERE key = ?{lock}",
        (key,),
    ).fetchone()


def _wake(store: Host, cur: Cursor, key: str, now: float) -> int:
    """The runs parked on ``key`` become claimable now (they take a slot again)."""
    done = store._x(
        cur,
        "UPDATE runs SET not_before = ? WHERE paced = ? AND status = 'waiting' AND not_before > ?",
        (now, key, now),
    )
    return max(int(done.rowcount), 0)


def take(
    store: Host, cur: Cursor, key: str, limit: RateLimit, owner: str, tokens: int, now: float
) -> Grant:
    """A slot for the call ``owner`` (its reservation if it holds one), or, while the key
    is blocked by 429s, the block's end. See toren.core.contract.ratelimit."""
    x = store._x
    rpm, tpm, period, blocked_until, strikes, probe = _lock(store, cur, key, limit, now)
    if (rpm, tpm, float(period)) != (limit.rpm, limit.tpm, float(limit.period)):
        # A new limit: slots reserved under the old one are taken again under this one.
        x(
            cur,
            "UPDATE rate_limits SET rpm = ?, tpm = ?, period = ?, updated_at = ? WHERE key = ?",
            (limit.rpm, limit.tpm, limit.period, now, key),
        )
        x(cur, "DELETE FROM rate_grants WHERE key = ? AND state = ?", (key, RESERVED))
        _wake(store, cur, key, now)
    blocked = blocked_until is not None and blocked_until > now
    x(
        cur,
        "DELETE FROM rate_grants WHERE key = ? AND at <= ? AND (state = ? OR at <= ?)",
        (key, now - limit.period, SETTLED, now - limit.period - STALE),
    )
    mine = x(
        cur,
        "SELECT id, at FROM rate_grants WHERE owner = ? AND key = ? AND state = ?",
        (owner, key, RESERVED),
    ).fetchone()
    if mine is not None:
        grant_id, at = int(mine[0]), float(mine[1])
        if blocked and grant_id != probe:
            return _held(store, cur, key, blocked_until, now)
        if at > now + NOW:
            return Grant(grant_id, at, key, go=False)
        if _fits(store, cur, key, limit, tokens, now):
            # Sent now: the slot holds the time the call really goes out.
            x(
                cur,
                "UPDATE rate_grants SET state = ?, at = ? WHERE id = ?",
                (SENT, now, grant_id),
            )
            return Grant(grant_id, now, key, go=True)
        # Calls sent before it still fill the window (they went out later than their slots,
        # or took long to answer): its slot moves to when the calls sent leave room.
        sent = _grants(store, cur, key, now, SENT, SETTLED)
        at = max(next_slot(limit, sent, tokens, now), now + NOW * 10)
        x(cur, "UPDATE rate_grants SET at = ? WHERE id = ?", (at, grant_id))
        return Grant(grant_id, at, key, go=False)
    if blocked:
        return _held(store, cur, key, blocked_until, now)
    grants = _grants(store, cur, key, now, RESERVED, SENT, SETTLED)
    at = next_slot(limit, grants, tokens, now)
    go = at <= now + NOW
    row = x(
        cur,
        "INSERT INTO rate_grants (key, owner, at, tokens, state) VALUES (?, ?, ?, ?, ?) "
        "RETURNING id",
        (key, owner, now if go else at, tokens, SENT if go else RESERVED),
    ).fetchone()
    grant_id = int(row[0])
    if strikes:  # the first call after a block: the probe; the others wait for its answer
        x(
            cur,
            "UPDATE rate_limits SET probe = ?, blocked_until = ? WHERE key = ?",
            (grant_id, at + PROBE_HOLD, key),
        )
    x(
        cur,
        "UPDATE rate_limits SET calls = calls + ?, paced = paced + ?, waited = waited + ? "
        "WHERE key = ?",
        (1 if mine is None else 0, 0 if go else 1, 0.0 if go else at - now, key),
    )
    return Grant(grant_id, now if go else at, key, go=go)


def _grants(
    store: Host, cur: Cursor, key: str, now: float, *states: int
) -> list[tuple[float, int]]:
    """The key's slots in these states as (time, tokens), oldest first. A call in flight
    counts from now: the provider counted it somewhere between its sending and its
    answer, and its slot moves to the answer's time when it settles."""
    marks = ", ".join("?" for _ in states)
    rows = store._x(
        cur,
        f"SELECT at, tokens, state FROM rate_grants WHERE key = ? AND state IN ({marks})",
        (key, *states),
    ).fetchall()
    return sorted((now if state == SENT else float(at), int(used)) for at, used, state in rows)


def _fits(store: Host, cur: Cursor, key: str, limit: RateLimit, tokens: int, now: float) -> bool:
    """Whether a call sent now keeps the calls really sent (not the reservations) within
    the limit over the window ending now: those in flight, and those answered within the
    last period."""
    count, used = store._x(
        cur,
        "SELECT COUNT(id), COALESCE(SUM(tokens), 0) FROM rate_grants WHERE key = ? AND "
        "(state = ? OR (state = ? AND at > ?))",
        (key, SENT, SETTLED, now - limit.period),
    ).fetchone()
    if limit.rpm is not None and int(count) + 1 > limit.rpm:
        return False
    return limit.tpm is None or int(used) + min(tokens, limit.tpm) <= limit.tpm


def _held(store: Host, cur: Cursor, key: str, until: float, now: float) -> Grant:
    store._x(
        cur,
        "UPDATE rate_limits SET paced = paced + 1, waited = waited + ? WHERE key = ?",
        (until - now, key),
    )
    return Grant(None, until, key, go=False)


def settle(
    store: Host, cur: Cursor, key: str, grant_id: int, tokens: int, ok: bool, now: float
) -> bool:
    """A sent call's real tokens, and its slot's time moved to its answer (the provider
    counted it no later: the window is never overrun, whatever the call's latency); a
    served call unblocks its key. True: the key was blocked (its parked runs wake)."""
    x = store._x
    x(
        cur,
        "UPDATE rate_grants SET tokens = ?, state = ?, at = CASE WHEN at < ? THEN ? ELSE at "
        "END WHERE id = ?",
        (max(0, tokens), SETTLED, now, now, grant_id),
    )
    if not ok:
        return False
    done = x(
        cur,
        "UPDATE rate_limits SET strikes = 0, blocked_until = NULL, probe = NULL "
        "WHERE key = ? AND strikes > 0",
        (key,),
    )
    if done.rowcount > 0:
        _wake(store, cur, key, now)
        return True
    return False


def throttle(
    store: Host,
    cur: Cursor,
    key: str,
    grant_id: int | None,
    retry_after: float | None,
    now: float,
) -> float:
    """A 429 answered the call of slot ``grant_id``: block the key for the fleet and drop
    the slots reserved for later (they are taken again after the block). A 429 of a call
    sent before the block began (one of many in flight) extends the block without
    counting a strike: only the first, and a probe's, double the backoff. The block's end."""
    x = store._x
    _rpm, _tpm, _period, blocked_until, strikes, probe = _lock(store, cur, key, None, now)
    if probe == grant_id or blocked_until is None or blocked_until <= now or not strikes:
        strikes = int(strikes) + 1
        until = now + throttle_backoff(strikes, retry_after)
    else:
        until = max(float(blocked_until), now + (retry_after or 0.0))
    x(
        cur,
        "UPDATE rate_limits SET strikes = ?, blocked_until = ?, probe = NULL, "
        "throttled = throttled + 1, updated_at = ? WHERE key = ?",
        (strikes, until, now, key),
    )
    if grant_id is not None:
        x(
            cur,
            "UPDATE rate_grants SET tokens = 0, state = ?, at = ? WHERE id = ?",
            (SETTLED, now, grant_id),
        )
    x(cur, "DELETE FROM rate_grants WHERE key = ? AND state = ?", (key, RESERVED))
    return until


def declare(
    store: Host,
    cur: Cursor,
    agents: Sequence[str],
    limits: Mapping[str, RateLimit],
    now: float,
) -> int:
    """A worker's limits as it starts, for the runs parked on them: a changed limit drops
    the slots reserved under the old one and wakes its runs (they take a slot under the
    new one); runs of ``agents`` parked on a key their code no longer limits wake and
    go on (removing a limit releases its runs). The runs woken."""
    x = store._x
    woken = 0
    for key, limit in sorted(limits.items()):
        row = x(cur, "SELECT rpm, tpm, period FROM rate_limits WHERE key = ?", (key,)).fetchone()
        if row is None or (row[0], row[1], float(row[2])) == (
            limit.rpm,
            limit.tpm,
            float(limit.period),
        ):
            continue
        x(
            cur,
            "UPDATE rate_limits SET rpm = ?, tpm = ?, period = ?, updated_at = ? WHERE key = ?",
            (limit.rpm, limit.tpm, limit.period, now, key),
        )
        x(cur, "DELETE FROM rate_grants WHERE key = ? AND state = ?", (key, RESERVED))
        woken += _wake(store, cur, key, now)
    if not agents:
        return woken
    marks = ", ".join("?" for _ in agents)
    kept = sorted(limits)
    kept_sql = f" AND paced NOT IN ({', '.join('?' for _ in kept)})" if kept else ""
    done = x(
        cur,
        f"UPDATE runs SET not_before = ? WHERE status = 'waiting' AND paced IS NOT NULL "
        f"AND agent IN ({marks}){kept_sql} AND not_before > ?",
        (now, *agents, *kept, now),
    )
    return woken + max(int(done.rowcount), 0)


def _parked(store: Host, cur: Cursor) -> dict[str, int]:
    """Runs parked now for a slot, by key."""
    rows = store._x(
        cur,
        "SELECT paced, COUNT(id) FROM runs WHERE status = 'waiting' AND paced IS NOT NULL "
        "GROUP BY paced",
    ).fetchall()
    return {str(key): int(n) for key, n in rows}


def stats(store: Host, cur: Cursor) -> list[tuple[str, int, int, float, int, int]]:
    """Per key: calls, paced calls, seconds waited, 429s, runs parked on it now."""
    rows = store._x(
        cur,
        "SELECT key, calls, paced, waited, throttled FROM rate_limits ORDER BY key",
    ).fetchall()
    parked = _parked(store, cur)
    return [
        (str(k), int(c), int(p), float(w), int(t), int(parked.get(k, 0))) for k, c, p, w, t in rows
    ]


def views(store: Host, cur: Cursor, now: float) -> list[RateLimitView]:
    """Each declared rate limit with what the fleet uses of it now: the slots taken in
    the current window (those reserved ahead included), the 429 block, the parked runs."""
    rows = store._x(
        cur,
        "SELECT key, rpm, tpm, period, blocked_until, calls, paced, throttled "
        "FROM rate_limits ORDER BY key",
    ).fetchall()
    parked = _parked(store, cur)
    found = []
    for key, rpm, tpm, period, blocked, calls, paced, throttled in rows:
        used, tokens = store._x(
            cur,
            "SELECT COUNT(id), COALESCE(SUM(tokens), 0) FROM rate_grants WHERE key = ? AND at > ?",
            (key, now - float(period)),
        ).fetchone()
        found.append(
            RateLimitView(
                key=str(key),
                rpm=None if rpm is None else int(rpm),
                tpm=None if tpm is None else int(tpm),
                period=float(period),
                calls_in_window=int(used),
                tokens_in_window=int(tokens),
                blocked_until=float(blocked) if blocked is not None and blocked > now else None,
                parked=int(parked.get(key, 0)),
                calls=int(calls),
                paced=int(paced),
                throttled=int(throttled),
            )
        )
    return found
