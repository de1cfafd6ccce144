"""Stored JSON that cannot be read is a storage error naming the row, as a corrupt event
payload is (``tests/core/test_engine.py::test_corrupt_event_payload_is_named``).

A garbled ``inbox`` payload used to reach the agent as a bare ``JSONDecodeError`` and fail
the run as the agent's error; a garbled ``runs`` column or ``blobs`` body raised the bare
decode error too. Now each is a :class:`CorruptRow` (a blob, part of the event log, a
:class:`CorruptEventLog`): the run is neither failed nor skipped, and once the row is
repaired it goes on with nothing lost.
"""

from __future__ import annotations

from typing import Any

import pytest

import toren
from toren.core.drivers.history import load_messages
from toren.errors import CorruptEventLog, CorruptRow
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

BROKEN = "{broken"


async def _waiter(ctx: toren.Context, input: Any) -> Any:
    return await ctx.wait_for_message("go")


async def _chat(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model("scripted:echo", [{"role": "user", "content": "hello"}])
    return reply.text


def _deps(store: Store, reg: toren.Registry, **kw: Any) -> toren.TickDeps:
    return toren.TickDeps(store=store, agents=reg, providers={"scripted": ScriptedProvider()}, **kw)


async def _sql(store: Store, sql: str, params: tuple[Any, ...]) -> list[Any]:
    def tx(cur: Any) -> list[Any]:
        cur = store._x(cur, sql, params)  # type: ignore[attr-defined]
        return list(cur.fetchall()) if cur.description else []

    return await store._run(tx)  # type: ignore[attr-defined, no-any-return]


async def _forgiving(ctx: toren.Context, input: Any) -> Any:
    try:
        return await ctx.wait_for_message("go")
    except Exception as exc:  # what an agent author might well write
        return {"swallowed": type(exc).__name__}


@pytest.mark.parametrize("agent", [_waiter, _forgiving], ids=["waiter", "forgiving"])
async def test_a_corrupt_inbox_payload_leaves_the_run_for_repair(store: Store, agent: Any) -> None:
    """Also when the agent wraps the wait in ``except Exception``: the store failing under
    a step is not the agent's to see, so the repaired run takes the branch a replay can
    reproduce, not the one the swallowed error would have sent it down."""
    reg = toren.Registry()
    reg.add("waiter", agent)
    run = await toren.start_run(store, reg, "waiter")
    assert (await toren.tick(run.id, _deps(store, reg))).status == "waiting"
    message_id = await store.send_message(run.id, "go", {"ok": True}, now=1.0)
    await _sql(store, "UPDATE inbox SET payload = ? WHERE id = ?", (BROKEN, message_id))

    result = await toren.tick(run.id, _deps(store, reg))
    assert result.status == "error" and result.error is not None
    assert result.error["code"] == "corrupt_row"
    text = result.error["message"]
    assert "inbox" in text and f"id={message_id}" in text and run.id in text
    assert "payload" in text and "not valid JSON" in text
    with pytest.raises(CorruptRow, match="inbox"):
        await store.next_message(run.id, ["go"])
    # Not failed as the agent's error, and the message not consumed nor skipped.
    row = await store.get_run(run.id)
    assert row is not None and row.status == "running" and row.error is None
    assert row.output is None
    types = [e.type for e in await store.load_events(run.id)]
    assert "RunFailed" not in types and "RunCompleted" not in types

    # Given back blocked, with the error and the time of its next try.
    assert row.lease_owner is None and row.blocked_attempts == 1
    assert row.blocked_error is not None and row.blocked_error["code"] == "corrupt_row"
    assert row.not_before is not None and row.not_before > 0

    # Repaired, the run takes the message at its next try.
    await _sql(store, "UPDATE inbox SET payload = ? WHERE id = ?", ('{"ok": true}', message_id))
    later = toren.ManualClock(row.not_before + 1)
    resumed = await toren.tick(run.id, _deps(store, reg, clock=later))
    assert resumed.status == "completed" and resumed.output == {"ok": True}


@pytest.mark.parametrize("column", ["input", "output", "error", "waiting_for"])
async def test_a_corrupt_runs_column_is_named(store: Store, column: str) -> None:
    reg = toren.Registry()
    reg.add("waiter", _waiter)
    run = await toren.start_run(store, reg, "waiter", {"q": 1})
    await _sql(store, f"UPDATE runs SET {column} = ? WHERE id = ?", (BROKEN, run.id))

    for read in (store.get_run(run.id), store.list_runs()):
        with pytest.raises(CorruptRow) as info:
            await read
        assert f"the {column} of runs row id={run.id!r} is not valid JSON" in info.value.message
        assert info.value.details == {"table": "runs", "column": column, "id": run.id}
    with pytest.raises(CorruptRow, match=column):
        await toren.tick(run.id, _deps(store, reg))
    (status,) = await _sql(store, "SELECT status FROM runs WHERE id = ?", (run.id,))
    assert status[0] != "failed"


async def test_a_corrupt_blob_body_is_named(store: Store) -> None:
    reg = toren.Registry()
    reg.add("chat", _chat)
    run = await toren.start_run(store, reg, "chat")
    assert (await toren.tick(run.id, _deps(store, reg))).status == "completed"
    (call,) = [e for e in await store.load_events(run.id) if e.type == "ModelCallRecorded"]
    node = call.payload.message_list  # type: ignore[attr-defined]
    await _sql(store, "UPDATE blobs SET body = ? WHERE hash = ?", (BROKEN, node))

    with pytest.raises(CorruptEventLog) as info:
        await load_messages(store, node)
    assert f"the body of blobs row hash={node!r} is not valid JSON" in info.value.message
    assert info.value.details == {"table": "blobs", "column": "body", "hash": node}


async def test_an_agent_cannot_swallow_a_failed_step_write(store: Store) -> None:
    """The same for the commit of a live step: the database refuses the event insert."""

    async def forgiving(ctx: toren.Context, input: Any) -> Any:
        try:
            return (await _chat(ctx, input)) + " (recorded)"
        except Exception as exc:
            return {"swallowed": type(exc).__name__}

    reg = toren.Registry()
    reg.add("forgiving", forgiving)
    run = await toren.start_run(store, reg, "forgiving")
    if store.dialect == "sqlite":  # a statement SQLite refuses at run time
        failing = ["CREATE TRIGGER toren_t_fail BEFORE INSERT ON events BEGIN SELECT nope(); END"]
    else:
        failing = [
            "CREATE FUNCTION toren_t_fail() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'the disk is on fire'; END $$",
            "CREATE TRIGGER toren_t_fail BEFORE INSERT ON events "
            "FOR EACH ROW EXECUTE FUNCTION toren_t_fail()",
        ]
    for sql in failing:
        await _sql(store, sql, ())

    result = await toren.tick(run.id, _deps(store, reg))
    assert result.status == "error" and result.error is not None
    assert result.error["code"] == "storage_error"
    row = await store.get_run(run.id)
    assert row is not None and row.status == "running" and row.output is None

    await _sql(
        store, "DROP TRIGGER toren_t_fail" + ("" if store.dialect == "sqlite" else " ON events"), ()
    )
    assert row.blocked_error is not None and row.blocked_error["code"] == "storage_error"
    assert row.not_before is not None
    later = toren.ManualClock(row.not_before + 1)
    resumed = await toren.tick(run.id, _deps(store, reg, clock=later))
    assert resumed.status == "completed" and str(resumed.output).endswith("(recorded)")
    done = await store.get_run(run.id)
    assert done is not None and done.blocked_error is None and done.to_dict()["blocked"] is None
