"""A wait that would park does not read an inbox the claim saw empty.

A claim counts the run's unconsumed messages, up to 2 (``Lease.unread``), beside the
oldest one it returns (``Lease.message``). Once the tick has taken every message the claim
saw (none, or that one), a wait without a deadline that finds nothing parks: it does not
ask the store, because a message sent since the claim is the park's to see (the release
looks at the inbox again and wakes the run, as it does for a message sent just after a
read). Anything else reads the inbox: more than one message at the claim, a message the
claim left out, a wait with a deadline (it may time out instead of parking), a lease made
without the count.

Each test counts the store's inbox reads and checks what the run did: a message sent
during the tick, after the claim, is not lost and not taken twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import pytest

import toren
from tests.core.test_refused_consume import _count_store_reads
from toren.core.contract.values import TickStatus
from toren.providers.base import ToolSpec
from toren.store import Store


def _registry(store: Store, run: list[str], sent: list[int]) -> toren.Registry:
    async def tell() -> None:
        """A message sent to the run itself during its tick: after the claim, before the
        wait that would take it."""
        sent.append(await store.send_message(run[0], "go", f"sent {len(sent)}", now=1.0))

    async def two_waits(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.wait_for_message("go", timeout=input)
        await ctx.tool("tell")
        second = await ctx.wait_for_message("go", timeout=input)
        return [first, second]

    reg = toren.Registry()
    reg.add("two_waits", two_waits, tools={"tell": toren.ToolDef("tell", tell, ToolSpec("tell"))})
    return reg


async def _start(store: Store, timeout: float | None) -> tuple[Any, list[int], toren.TickDeps]:
    run: list[str] = []
    sent: list[int] = []
    reg = _registry(store, run, sent)
    record = await toren.start_run(store, reg, "two_waits", timeout)
    run.append(record.id)
    return record, sent, toren.TickDeps(store=store, agents=reg)


async def test_a_message_sent_after_the_claim_wakes_the_run_at_its_park(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sent, deps = await _start(store, None)
    await store.send_message(run.id, "go", "before", now=1.0)
    reads = _count_store_reads(store, monkeypatch)

    first = await toren.tick(run.id, deps)
    # The first wait took the claim's message; the second did not read the inbox (the
    # claim saw one message, now taken) and parked, and the park saw the message the
    # tool sent meanwhile: the run is claimable at once, not parked away.
    assert reads == [] and len(sent) == 1
    assert first.status == TickStatus.WAITING
    row = await store.get_run(run.id)
    assert row is not None and row.status == "waiting" and row.not_before is not None

    done = await toren.tick(run.id, deps)
    assert done.status == TickStatus.COMPLETED and done.output == ["before", "sent 0"]
    received = [e.payload for e in await store.load_events(run.id) if e.type == "MessageReceived"]
    assert [r.inbox_id for r in received][1:] == sent  # type: ignore[attr-defined]
    assert await store.next_message(run.id, ["go"]) is None


async def test_more_than_one_message_at_the_claim_is_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, sent, deps = await _start(store, None)
    await store.send_message(run.id, "go", "one", now=1.0)
    await store.send_message(run.id, "go", "two", now=1.0)
    reads = _count_store_reads(store, monkeypatch)

    done = await toren.tick(run.id, deps)
    assert reads == [["go"]]  # the second wait: the claim saw two
    assert done.status == TickStatus.COMPLETED and done.output == ["one", "two"]
    # The tool's message stays for a later wait (none here).
    assert (await store.next_message(run.id, ["go"])) is not None


async def test_a_wait_with_a_deadline_reads_an_inbox_the_claim_saw_empty(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait with a timeout may time out instead of parking: a message sent since the
    claim, before the deadline, must be seen by its read, not only by a park."""
    run, sent, deps = await _start(store, 3600.0)
    reads = _count_store_reads(store, monkeypatch)

    parked = await toren.tick(run.id, deps)
    assert parked.status == TickStatus.WAITING and reads == [["go"]]


@pytest.mark.parametrize("lease_knows", ["nothing", "a left-out message"])
async def test_a_claim_that_did_not_see_the_whole_inbox_leaves_the_wait_to_read(
    store: Store, monkeypatch: pytest.MonkeyPatch, lease_knows: str
) -> None:
    run, sent, deps = await _start(store, None)
    waiting = await store.send_message(run.id, "go", "there", now=1.0)
    (lease,) = await store.claim("w1", 1, now=toren.SystemClock().now(), ttl=60, only=run.id)
    assert lease.unread == 1 and lease.message is not None and lease.message.id == waiting
    # A lease made without the count, or whose claim left its one message out (too
    # large to carry): the tick cannot know the inbox, so it reads it.
    unread = None if lease_knows == "nothing" else 1
    lease = replace(lease, message=None, unread=unread)
    reads = _count_store_reads(store, monkeypatch)

    done = await toren.tick(run.id, deps, lease=lease)
    assert reads == [["go"], ["go"]]
    assert done.status == TickStatus.COMPLETED and done.output == ["there", "sent 0"]


def _branches_registry(store: Store, run: list[str], timeline: list[str]) -> toren.Registry:
    """Two branches: ``chat`` takes a message, sends the run another (after the claim),
    waits for it and records that it took it; ``busy`` holds a tool open until then (30 s
    at most, so a message left untaken fails the test rather than hanging it)."""
    taken = asyncio.Event()

    async def tell() -> None:
        await store.send_message(run[0], "go", "sent during the tick", now=1.0)

    async def took() -> None:
        timeline.append("taken")
        taken.set()

    async def hold() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(taken.wait(), 30)
        timeline.append("busy done")

    async def chat(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.wait_for_message("go")
        await ctx.tool("tell")
        second = await ctx.wait_for_message("go")
        await ctx.tool("took")
        return [first, second]

    async def busy(ctx: toren.Context, input: Any) -> None:
        await ctx.tool("hold")

    async def main(ctx: toren.Context, input: Any) -> Any:
        got, _ = await ctx.gather(ctx.spawn("chat"), ctx.spawn("busy"))
        return got

    tools = {
        n: toren.ToolDef(n, f, ToolSpec(n))
        for n, f in (("tell", tell), ("took", took), ("hold", hold))
    }
    reg = toren.Registry()
    for process, fn in (("main", main), ("chat", chat), ("busy", busy)):
        reg.add("branches", fn, process=process, tools=tools)
    return reg


async def test_a_wait_beside_other_work_reads_the_inbox(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait whose park would not be the run's at once (another branch is at work) reads
    the inbox although the claim saw it empty after its one message: a message sent since
    the claim is taken now, not after the other work ends, and costs no park."""
    run: list[str] = []
    timeline: list[str] = []
    reg = _branches_registry(store, run, timeline)
    record = await toren.start_run(store, reg, "branches", None)
    run.append(record.id)
    await store.send_message(record.id, "go", "before", now=1.0)
    reads = _count_store_reads(store, monkeypatch)

    done = await toren.tick(record.id, toren.TickDeps(store=store, agents=reg))
    assert reads == [["go"]]  # the second wait's, beside the busy branch
    assert timeline == ["taken", "busy done"]
    assert done.status == TickStatus.COMPLETED
    assert done.output == ["before", "sent during the tick"]
    assert "RunWaiting" not in [e.type for e in await store.load_events(record.id)]
