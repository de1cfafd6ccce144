"""A tick whose message step is refused keeps the run's totals whole.

A step that takes a message carries the tick's pending totals when a flush is due (the
usage of steps already in the log). If another writer consumed the message first, the
store refuses the step and writes nothing, totals included (tests/store/
test_inbox_consume.py). The lease still holds, so the tick goes on (the step takes the
next message, or the run parks: tests/core/test_refused_consume.py): the totals the
refused write had taken go back to the tick's tally and are written by its next write or
its release. The steps are counted once, never twice, and the row is never ahead of its
log, nor (once the tick is over) behind it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import toren
from toren.core.contract.journal import log_totals
from toren.core.contract.values import Totals
from toren.core.drivers.tickstate import TickState
from toren.errors import MessageConsumed
from toren.providers.scripted import ScriptedProvider
from toren.store import Store
from toren.store.base import InboxMessage, RunRecord
from toren.store.sqlite import parse_sqlite_url


def _consume_elsewhere(db_url: str, message_id: int) -> None:
    """Another writer takes the message (its own transaction, committed)."""
    sql = "UPDATE inbox SET consumed_seq = 0 WHERE id = {p} AND consumed_seq IS NULL"
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(parse_sqlite_url(db_url)[0], timeout=30, isolation_level=None)
        try:
            assert conn.execute(sql.format(p="?"), (message_id,)).rowcount == 1
        finally:
            conn.close()
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute(sql.format(p="%s"), (message_id,)).rowcount == 1


def _race(
    store: Store,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    then: Callable[[], Awaitable[object]] | None = None,
) -> list[int]:
    """Consume the first message a tick's read returns elsewhere before the step writes
    it (then ``then()``); the ids of the messages taken from under the step. The read is
    the tick's (``TickState.next_message``), whether the claim answered it
    (``Lease.message``) or the store."""
    plain_next = TickState.next_message
    raced: list[int] = []

    async def racing_next(state: TickState, name: str, **kw: Any) -> InboxMessage | None:
        message = await plain_next(state, name, **kw)
        if message is not None and not raced:
            raced.append(message.id)
            _consume_elsewhere(db_url, message.id)
            if then is not None:
                await then()
        return message

    monkeypatch.setattr(TickState, "next_message", racing_next)
    return raced


def _row_totals(row: RunRecord | None) -> tuple[int, ...]:
    assert row is not None
    return (row.input_tokens, row.output_tokens, row.cost_nanousd, row.steps, row.invalidations)


def _log(totals: Totals) -> tuple[int, ...]:
    t = totals
    return (t.input_tokens, t.output_tokens, t.cost_nanousd, t.steps, t.invalidations)


async def _agent(ctx: toren.Context, input: Any) -> Any:
    messages: list[dict[str, Any]] = []
    for i in range(3):
        messages.append({"role": "user", "content": f"step {i} " + "words " * 10})
        reply = await ctx.model("scripted:echo", messages)
        messages.append(reply.message())
    return await ctx.wait_for_message("go")


async def _started(store: Store) -> tuple[toren.ManualClock, toren.TickDeps, Any]:
    """A run of ``_agent`` started under a manual clock, and the deps to tick it."""
    clock = toren.ManualClock()
    reg = toren.Registry()
    reg.add("waits", _agent)
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": ScriptedProvider()}, clock=clock
    )
    return clock, deps, await toren.start_run(store, reg, "waits", clock=clock)


async def test_a_refused_message_step_leaves_the_totals_counted_once(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, deps, run = await _started(store)
    await store.send_message(run.id, "go", "first", now=clock.now())
    # The first message read is consumed by another writer before the step writes, and a
    # flush of the pending totals falls due with that step.
    raced = _race(store, db_url, monkeypatch, then=lambda: clock.advance(2))
    first = await toren.tick(run.id, deps)
    assert first.status == "waiting" and raced, first.error
    events = await store.load_events(run.id)
    assert [e.type for e in events].count("ModelCallRecorded") == 3
    assert "MessageReceived" not in [e.type for e in events]
    in_log = _log(log_totals(events))
    assert in_log[0] > 0 and in_log[3] == 3
    # The run parked (the message is gone): its release wrote what the log says, once.
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner is None
    assert _row_totals(row) == in_log

    await store.send_message(run.id, "go", "second", now=clock.now())
    second = await toren.tick(run.id, deps)
    assert second.status == "completed" and second.output == "second"
    events = await store.load_events(run.id)
    final = await store.get_run(run.id)
    assert _row_totals(final) == _log(log_totals(events)) == in_log


async def test_a_refused_message_step_gives_its_totals_to_the_next_write(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused step carried the flush; the step that takes the next message in the
    same tick carries it instead (the run row is right before the run even ends)."""
    clock, deps, run = await _started(store)
    await store.send_message(run.id, "go", "first", now=clock.now())
    await store.send_message(run.id, "go", "second", now=clock.now())
    plain_append = store.append
    _race(store, db_url, monkeypatch, then=lambda: clock.advance(2))
    carried: list[Any] = []

    async def watched_append(*args: Any, **kw: Any) -> Any:
        """The totals each step that takes a message carries, and whether it was written."""
        if kw.get("consume_inbox") is None:
            return await plain_append(*args, **kw)
        try:
            stored = await plain_append(*args, **kw)
        except MessageConsumed:
            carried.append(("refused", kw.get("delta")))
            raise
        carried.append(("written", kw.get("delta")))
        return stored

    monkeypatch.setattr(store, "append", watched_append)
    result = await toren.tick(run.id, deps)
    assert result.status == "completed" and result.output == "second"
    events = await store.load_events(run.id)
    in_log = _log(log_totals(events))
    (refused, lost), (written, delta) = carried
    assert (refused, written) == ("refused", "written")
    assert lost is not None and lost.steps > 0  # a flush was due with the refused step
    assert delta == lost  # the same totals, written once, by the step that was written
    assert _row_totals(await store.get_run(run.id)) == in_log
