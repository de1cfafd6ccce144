"""Sticky runs (toren.core.drivers.sticky): a parked run continues in place, under the
next lease of the same worker, without reloading or replaying its log; anything that may
have changed since it parked (another claim, a new code version, a cancel, a log that
grew, eviction) falls back to the full replay. The corpus test (tests/corpus, "(d)")
shows the logs are byte for byte the same cached and uncached."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

import toren
from toren.core.contract.records import Release
from toren.core.drivers.sticky import StickyRuns
from toren.core.drivers.tick import TickRunner
from toren.errors import StorageError
from toren.providers.scripted import ScriptedProvider
from toren.store import Store


def waiting_agent(steps_before: int = 3):
    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "count"}]
        for i in range(steps_before):
            messages.append({"role": "user", "content": f"step {i}"})
            messages.append((await ctx.model("scripted:echo", messages)).message())
        answer = await ctx.wait_for_message("go")
        messages.append({"role": "user", "content": f"answer {answer}"})
        reply = await ctx.model("scripted:echo", messages)
        await ctx.sleep(30)  # a durable timer: parks again (inline_wait is 2 s)
        return {"last": reply.text, "answer": answer}

    return agent


def registry(version: str = "A") -> toren.Registry:
    reg = toren.Registry()
    reg.add("waiter", waiting_agent(), code_version=version)
    return reg


def deps_for(store: Store, reg: toren.Registry, sticky: StickyRuns | None, **kw: Any):
    return toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": kw.pop("provider", ScriptedProvider())},
        sticky=sticky,
        **kw,
    )


async def test_a_parked_run_continues_in_place(store: Store) -> None:
    clock = toren.ManualClock(1_700_000_000.0)
    sticky = StickyRuns(64_000_000)
    provider = ScriptedProvider()
    deps = deps_for(store, registry(), sticky, provider=provider, clock=clock)
    run = await toren.start_run(store, registry(), "waiter", {}, clock=clock)
    first = await toren.tick(run.id, deps)
    assert first.status == "waiting" and provider.served == 3
    assert run.id in sticky and len(sticky) == 1
    await toren.send_message(store, run.id, "go", "yes", clock=clock)
    second = await toren.tick(run.id, deps)
    # Continued where it parked: nothing replayed, one new model call, parked on the timer.
    assert (second.status, second.replayed, provider.served) == ("waiting", 0, 4)
    assert (sticky.hits, sticky.continued, sticky.stale) == (1, 1, 0)
    await clock.advance(31)
    third = await toren.tick(run.id, deps)
    assert (third.status, third.replayed, provider.served) == ("completed", 0, 4)
    assert third.output == {"last": "answer yes", "answer": "yes"}  # scripted:echo echoes
    assert sticky.continued == 2 and len(sticky) == 0  # a finished run is not kept


async def test_without_the_cache_the_same_run_replays(store: Store) -> None:
    clock = toren.ManualClock(1_700_000_000.0)
    provider = ScriptedProvider()
    deps = deps_for(store, registry(), None, provider=provider, clock=clock)
    run = await toren.start_run(store, registry(), "waiter", {}, clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await toren.send_message(store, run.id, "go", "yes", clock=clock)
    second = await toren.tick(run.id, deps)
    assert (second.status, provider.served) == ("waiting", 4)
    assert second.replayed >= 3  # the three model steps, answered from the log


async def _parked(store: Store, sticky: StickyRuns, **kw: Any) -> tuple[Any, Any, Any]:
    clock = toren.ManualClock(1_700_000_000.0)
    provider = ScriptedProvider()
    deps = deps_for(store, registry(), sticky, provider=provider, clock=clock, **kw)
    run = await toren.start_run(store, registry(), "waiter", {}, clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    await toren.send_message(store, run.id, "go", "yes", clock=clock)
    return run, deps, provider


async def test_a_continued_wake_reads_neither_the_row_nor_the_log(
    store: Store, monkeypatch: Any
) -> None:
    """The claim read the run's row, its last event's seq and its inbox's oldest message
    (``Lease.record``, ``Lease.last_seq``, ``Lease.message``): the kept tick checks the
    first two without a read of its own and takes the message it waits for without
    reading the inbox, and an uncached tick starts from the row without reading it
    again."""
    reads: list[str] = []
    for name in ("get_run", "load_events", "next_message"):
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            reads.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(store, name, counted)
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    # The first tick: the log, not the row; not the inbox either: the claim saw it empty
    # (``Lease.unread``), and a message sent since is the park's to see.
    assert reads == ["load_events"]
    reads.clear()
    second = await toren.tick(run.id, deps)
    assert (second.status, second.replayed, sticky.continued) == ("waiting", 0, 1)
    assert reads == []
    events = await store.load_events(run.id)
    received = [e.payload for e in events if e.type == "MessageReceived"]
    assert [(r.name, r.payload) for r in received] == [("go", "yes")]  # type: ignore[attr-defined]


async def test_an_uncached_wake_takes_its_message_from_the_claim_too(
    store: Store, monkeypatch: Any
) -> None:
    reads: list[Any] = []
    real = store.next_message

    async def counted(run_id: str, names: Any) -> Any:
        reads.append(list(names))
        return await real(run_id, names)

    monkeypatch.setattr(store, "next_message", counted)
    run, deps, provider = await _parked(store, None)  # type: ignore[arg-type]
    assert reads == []  # the claim saw the inbox empty
    reads.clear()
    second = await toren.tick(run.id, deps)
    assert (second.status, provider.served) == ("waiting", 4)
    assert second.replayed >= 3 and reads == []


async def test_a_claim_by_another_worker_in_between_replays(store: Store) -> None:
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    # Another worker claims the run and gives it back untouched: the lease's epoch moved
    # twice, so what this worker kept may be stale.
    (lease,) = await store.claim("other", 1, now=deps.clock.now(), ttl=30, only=run.id)
    await store.release(lease, Release("waiting", waiting_for=["go"]), now=deps.clock.now())
    second = await toren.tick(run.id, deps)
    assert (second.status, provider.served) == ("waiting", 4)
    assert second.replayed >= 3
    assert (sticky.hits, sticky.continued, sticky.stale) == (1, 0, 1)


async def test_a_new_code_version_replays(store: Store) -> None:
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    new = deps_for(store, registry("B"), sticky, provider=provider, clock=deps.clock)
    second = await toren.tick(run.id, new)
    assert second.status == "waiting" and second.replayed >= 3
    assert sticky.continued == 0
    events = await store.load_events(run.id)
    assert events[-2].code_version == "B"  # the new model step was written by B


async def test_the_same_code_reloaded_replays(store: Store) -> None:
    """A reload (``toren dev``) resolves a new program object even for the same version:
    the suspended task runs the old one, so the run replays."""
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    deps.agents = registry("A")
    second = await toren.tick(run.id, deps)
    assert second.status == "waiting" and second.replayed >= 3
    assert (sticky.continued, sticky.stale) == (0, 1)


async def test_a_cancel_while_kept_ends_the_run(store: Store) -> None:
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    await store.request_cancel(run.id, now=deps.clock.now())
    result = await toren.tick(run.id, deps)
    assert result.status == "cancelled" and provider.served == 3
    assert sticky.continued == 0 and len(sticky) == 0


async def test_a_log_that_grew_since_replays(store: Store) -> None:
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    kept = sticky.take(run.id)
    assert kept is not None
    kept.state.journal.log.last_seq -= 1  # as if an event came after the kept tick's last
    sticky.keep(kept)
    second = await toren.tick(run.id, deps)
    assert second.status == "waiting" and second.replayed >= 3
    assert (sticky.continued, sticky.stale) == (0, 1)


async def test_the_cache_is_bounded_and_evicts_the_oldest(store: Store) -> None:
    one = StickyRuns(10**9)
    run, deps, _ = await _parked(store, one)
    kept = one.take(run.id)
    assert kept is not None
    size = StickyRuns.weight(kept)
    one.keep(kept)
    small = StickyRuns(size * 2 + size // 2)  # room for two
    deps.sticky = small
    clock = deps.clock
    ids = []
    for _ in range(3):
        r = await toren.start_run(store, deps.agents, "waiter", {}, clock=clock)
        assert (await toren.tick(r.id, deps)).status == "waiting"
        ids.append(r.id)
    assert [i in small for i in ids] == [False, True, True]
    assert small.evictions == 1 and small.bytes <= small.max_bytes
    too_small = StickyRuns(size // 2)
    deps.sticky = too_small
    r = await toren.start_run(store, deps.agents, "waiter", {}, clock=clock)
    assert (await toren.tick(r.id, deps)).status == "waiting"
    assert len(too_small) == 0


async def test_a_worker_continues_its_parked_runs_and_drops_them_on_stop(store: Store) -> None:
    provider = ScriptedProvider()
    reg = registry()
    deps = deps_for(store, reg, None, provider=provider)
    settings = toren.Settings(poll_interval=0.02)
    deps.settings = settings
    worker = toren.LocalWorkerRuntime(deps)
    assert deps.sticky is not None  # a worker makes one (Settings.sticky_cache_mb)
    sticky = deps.sticky
    async with worker:
        run = await toren.start_run(store, reg, "waiter", {})
        await until(lambda: run.id in sticky)
        await toren.send_message(store, run.id, "go", "yes")
        await until(lambda: sticky.continued == 1 and run.id in sticky)  # parked on the timer
        assert provider.served == 4
        assert worker.metrics.steps_replayed == 0
    assert len(sticky) == 0  # stopped: nothing kept


async def until(done: Any, tries: int = 2000) -> None:
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_metrics_show_what_the_cache_kept_and_continued(store: Store) -> None:
    """``/metrics`` of a process with a worker (``toren dev``, ``toren serve`` with one)
    shows the cache: runs and bytes kept, claims continued in place, stale or missed."""
    from toren.api.metrics import render

    clock = toren.ManualClock(1_700_000_000.0)
    sticky = StickyRuns(64_000_000)
    deps = deps_for(store, registry(), sticky, clock=clock)
    runtime = toren.LocalWorkerRuntime(deps)
    run = await toren.start_run(store, registry(), "waiter", {}, clock=clock)
    await toren.tick(run.id, deps)
    kept = render(await store.stats(), runtime).splitlines()
    assert "toren_worker_sticky_runs 1" in kept
    assert f"toren_worker_sticky_bytes {sticky.bytes}" in kept and sticky.bytes > 0
    assert 'toren_worker_sticky_claims_total{result="miss"} 1' in kept  # its first claim
    await toren.send_message(store, run.id, "go", "yes", clock=clock)
    await toren.tick(run.id, deps)
    lines = render(await store.stats(), runtime).splitlines()
    assert 'toren_worker_sticky_claims_total{result="continued"} 1' in lines
    assert 'toren_worker_sticky_claims_total{result="stale"} 0' in lines
    assert 'toren_worker_sticky_claims_total{result="miss"} 1' in lines
    assert "toren_worker_sticky_evictions_total 0" in lines
    assert "toren_worker_sticky_runs 1" in lines  # parked on its timer: kept again


async def test_a_kept_tick_that_cannot_check_its_run_stands_for_the_new_lease(
    store: Store, monkeypatch: Any
) -> None:
    """The database fails while a kept tick checks whether it may continue (its row, not
    read by the claim here): the kept tick is dropped, and the runner stands for the new
    lease, so what follows the failure goes by the new epoch (the one the run parked
    under no longer holds): the run is given back blocked, with the error, not left
    leased until its lease runs out, and its next tick replays it."""
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    (lease,) = await store.claim(deps.worker_id, 1, now=deps.clock.now(), ttl=60, only=run.id)
    lease = replace(lease, record=None)  # the kept tick reads the row itself
    real = store.get_run

    async def down(run_id: str) -> Any:
        raise StorageError("PostgreSQL error: the server closed the connection")

    monkeypatch.setattr(store, "get_run", down)
    runner = TickRunner.claimed(deps, lease)
    with pytest.raises(StorageError):
        await runner.run()
    assert runner.lease.epoch == lease.epoch
    assert run.id not in sticky
    assert (sticky.hits, sticky.continued, sticky.stale) == (1, 0, 1)  # counted as stale
    monkeypatch.setattr(store, "get_run", real)
    row = await store.get_run(run.id)
    assert row is not None and row.lease_owner is None
    assert row.blocked_error is not None and "closed the connection" in str(row.blocked_error)
    await deps.clock.advance(60)  # past the blocked run's retry time
    again = await toren.tick(run.id, deps)
    assert (again.status, again.replayed, provider.served) == ("waiting", 3, 4)


async def test_a_recovered_lease_replays(store: Store) -> None:
    """A lease that took the run over from a holder whose lease ran out
    (``Lease.recovered``) never continues a kept tick, even as the next epoch of the same
    worker: what the run did under the lost lease is the log's to say."""
    sticky = StickyRuns(64_000_000)
    run, deps, provider = await _parked(store, sticky)
    (lease,) = await store.claim(deps.worker_id, 1, now=deps.clock.now(), ttl=60, only=run.id)
    result = await TickRunner.claimed(deps, replace(lease, recovered=True)).run()
    assert (result.status, provider.served) == ("waiting", 4)
    assert result.replayed >= 3
    assert (sticky.hits, sticky.continued, sticky.stale) == (1, 0, 1)


async def test_a_childs_completion_continues_its_parent_in_place(store: Store) -> None:
    """A child process (``ctx.spawn``) parks the run on its own durable timer while its
    parent waits for it; when the timer fires, the kept tick continues in place: the child
    finishes, the parent takes its result and goes on, nothing replayed."""

    async def parent(ctx: toren.Context, input: Any) -> Any:
        first = await ctx.model("scripted:echo", [{"role": "user", "content": "plan"}])
        found = await ctx.spawn("research", {"topic": "tides"})
        last = await ctx.model("scripted:echo", [{"role": "user", "content": str(found)}])
        return {"first": first.text, "last": last.text}

    async def research(ctx: toren.Context, input: Any) -> Any:
        await ctx.sleep(30)  # durable (inline_wait is 2 s): the run parks
        note = await ctx.model("scripted:echo", [{"role": "user", "content": input["topic"]}])
        return note.text

    reg = toren.Registry()
    reg.add("lab", parent)
    reg.add("lab", research, process="research")
    clock = toren.ManualClock(1_700_000_000.0)
    sticky = StickyRuns(64_000_000)
    provider = ScriptedProvider()
    deps = deps_for(store, reg, sticky, provider=provider, clock=clock)
    run = await toren.start_run(store, reg, "lab", {}, clock=clock)
    first = await toren.tick(run.id, deps)
    assert (first.status, provider.served) == ("waiting", 1)
    assert run.id in sticky
    await clock.advance(31)
    second = await toren.tick(run.id, deps)
    assert (second.status, second.replayed, provider.served) == ("completed", 0, 3)
    assert second.output == {"first": "plan", "last": "tides"}  # scripted:echo echoes
    assert (sticky.hits, sticky.continued, sticky.stale) == (1, 1, 0)
    events = await store.load_events(run.id)
    assert [e.type for e in events].count("ChildCompleted") == 1

    # The child's code registered anew while a run is kept: the run replays under it.
    async def research_v2(ctx: toren.Context, input: Any) -> Any:
        await ctx.sleep(30)
        note = await ctx.model("scripted:echo", [{"role": "user", "content": "v2"}])
        return note.text

    run = await toren.start_run(store, reg, "lab", {}, clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting" and run.id in sticky
    reg.add("lab", research_v2, process="research")
    await clock.advance(31)
    third = await toren.tick(run.id, deps)
    assert (third.status, third.output) == ("completed", {"first": "plan", "last": "v2"})
    assert third.replayed >= 1 and (sticky.continued, sticky.stale) == (1, 1)


AGENT_APP = """
async def agent(ctx, input):
    messages = [{"role": "user", "content": "start"}]
    messages.append((await ctx.model("scripted:echo", messages)).message())
    for _ in range(2):
        answer = await ctx.wait_for_message("go")
        messages.append({"role": "user", "content": str(answer)})
        messages.append((await ctx.model("scripted:echo", messages)).message())
    return len(messages)
"""


async def test_a_worker_over_an_agent_directory_continues_in_place(
    store: Store, tmp_path: Any
) -> None:
    """As ``toren worker`` and ``toren dev`` run agents: from an agent directory
    (``DirectoryResolver``), whose program is the same object from one resolve to the
    next while the directory is unchanged, so a kept tick continues in place; after an
    edit of the agent's code, the run replays under the new code."""
    from toren.agents import DirectoryResolver

    directory = tmp_path / "agents" / "w"
    directory.mkdir(parents=True)
    (directory / "agent.yaml").write_text("name: w\nentry: app:agent\n")
    (directory / "app.py").write_text(AGENT_APP)
    provider = ScriptedProvider()
    resolver = DirectoryResolver(tmp_path / "agents", provider_factory=None)
    deps = deps_for(store, resolver, None, provider=provider)
    deps.settings = toren.Settings(poll_interval=0.02)
    async with toren.LocalWorkerRuntime(deps) as worker:
        sticky = deps.sticky
        assert sticky is not None
        run = await toren.start_run(store, resolver, "w", None)
        await until(lambda: run.id in sticky)
        await toren.send_message(store, run.id, "go", "one")
        await until(lambda: sticky.continued == 1 and run.id in sticky)
        assert (provider.served, worker.metrics.steps_replayed) == (2, 0)
        (directory / "app.py").write_text(AGENT_APP + "\n# edited\n")  # a new code version
        await toren.send_message(store, run.id, "go", "two")
        final = await toren.wait_for_run(store, run.id, timeout=30)
        assert (final.status, final.output) == ("completed", 6)
    # Counted once the tick ended (the worker has stopped: every tick has).
    assert (sticky.continued, sticky.stale, provider.served) == (1, 1, 3)
    # Under the new code: the two model steps and the first message, from the log.
    assert worker.metrics.steps_replayed == 3
