"""A model call cut off in flight is still counted (issue 20, "Reload without re-paying").

When a drain window runs out, the steps still in flight are abandoned: they have no event
and run again. A model call among them had already been billed for what the provider
reported before the cut (Anthropic's ``message_start`` gives the input tokens first), so
that usage lands in the log as ``ModelCallCutOff`` and in the run's totals. Driven through
the real ``anthropic`` SDK against the loopback fake of its wire format.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

import toren
from tests.providers.fakes import FAKE_KEY, Completion, serve_fake_models
from toren.agents.pricing import default_table
from toren.config import LeaseSettings
from toren.core.agent_api.program import Limits
from toren.core.contract.events import ModelCallCutOff, ModelCallRecorded
from toren.providers.anthropic import AnthropicProvider
from toren.providers.base import CancelledWithUsage, ModelRequest, Usage, usage_cut_off
from toren.store import Store

MODEL = "anthropic:claude-sonnet-4-5"


def _settings() -> toren.Settings:
    return toren.Settings(lease=LeaseSettings(ttl=5.0, heartbeat=0.2), poll_interval=0.05)


async def _one_call(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model(MODEL, [{"role": "user", "content": "a long answer, please"}])
    return reply.text


async def test_a_call_cut_off_by_the_drain_window_is_counted(store: Store) -> None:
    prices = default_table()
    cut = Completion(text="x" * 20, chunk_size=1, input_tokens=1200, output_tokens=20, pace=0.1)
    again = Completion(text="done", input_tokens=1200, output_tokens=5)
    reg = toren.Registry()
    reg.add("long", _one_call)
    streaming = asyncio.Event()

    def live(run_id: str, item: dict[str, Any]) -> None:
        if item.get("type") == "delta":  # message_start (the usage) came before any text
            streaming.set()

    with serve_fake_models() as fake:
        fake.anthropic.script(cut, again)
        provider = AnthropicProvider(api_key=FAKE_KEY, base_url=fake.anthropic_url)
        deps = toren.TickDeps(
            store=store,
            agents=reg,
            providers={"anthropic": provider},
            settings=_settings(),
            pricing=prices.cost,
            live=live,
        )
        run = await toren.start_run(store, reg, "long")
        worker = toren.LocalWorkerRuntime(deps)
        await worker.start()
        await asyncio.wait_for(streaming.wait(), 20)
        await worker.stop(drain_window=0.0)  # the window is over: the call is cut off

        events = await store.load_events(run.id)
        assert [e.type for e in events] == ["RunStarted", "ModelCallCutOff"]
        cut_event = events[-1]
        payload = cut_event.payload
        assert isinstance(payload, ModelCallCutOff)
        assert cut_event.stream == "" and cut_event.position is None and cut_event.digest is None
        assert (payload.stream, payload.position, payload.provider) == ("main", 0, "anthropic")
        assert len(payload.request_digest) == 64
        # What message_start reported: the input and the first output token.
        assert (payload.input_tokens, payload.output_tokens) == (1200, 1)
        cut_cost = prices.cost(MODEL, Usage(1200, 1))
        assert Decimal(payload.cost_usd) == cut_cost > 0
        row = await store.get_run(run.id)
        assert row is not None and row.status == "running" and row.steps == 0

        # The next worker runs the step again (it was never recorded) and the run's
        # totals hold both calls the provider served.
        deps.live = None
        async with toren.LocalWorkerRuntime(deps):
            final = await toren.wait_for_run(store, run.id, timeout=30)
        await provider.aclose()
        assert fake.anthropic.served == 2

    assert final.status == "completed" and final.output == "done"
    assert (final.input_tokens, final.output_tokens, final.steps) == (2400, 6, 1)
    assert final.cost_usd == cut_cost + prices.cost(MODEL, Usage(1200, 5))


async def test_the_retry_loop_hands_the_reported_usage_to_a_cancellation() -> None:
    """The provider side alone: a call cancelled after its stream reported usage raises
    ``CancelledWithUsage`` (still a ``CancelledError``: the task ends cancelled); one
    cancelled before any report raises the plain cancellation."""
    with serve_fake_models() as fake:
        fake.anthropic.script(
            Completion(text="y" * 20, chunk_size=1, input_tokens=77, pace=0.1),
            Completion(text="z", delay=2),
        )
        provider = AnthropicProvider(api_key=FAKE_KEY, base_url=fake.anthropic_url)
        request = ModelRequest(
            "anthropic", "claude-sonnet-4-5", ({"role": "user", "content": "hi"},)
        )
        begun = asyncio.Event()
        task = asyncio.ensure_future(provider.complete(request, on_delta=lambda _: begun.set()))
        await asyncio.wait_for(begun.wait(), 20)
        task.cancel()
        await asyncio.wait({task})
        assert task.cancelled()
        with pytest.raises(CancelledWithUsage) as cut:
            task.result()
        assert cut.value.usage == Usage(77, 1) == usage_cut_off(cut.value)

        silent = asyncio.ensure_future(provider.complete(request, on_delta=lambda _: None))
        while fake.anthropic.served < 2:  # the request is at the server, nothing answered
            await asyncio.sleep(0.01)
        silent.cancel()
        await asyncio.wait({silent})
        with pytest.raises(asyncio.CancelledError) as plain:
            silent.result()
        assert not isinstance(plain.value, CancelledWithUsage)
        await provider.aclose()


async def test_a_step_timeout_keeps_the_usage_of_the_call_it_cut(store: Store) -> None:
    """``limits.step_timeout`` cuts a call off too: the recorded failure carries (and the
    run's totals count) what the provider reported before the timeout."""
    prices = default_table()
    reg = toren.Registry()
    # The timeout must fall after the stream's first event (which carries the usage so
    # far) reached the client, and before its end: 3 s of a 10 s answer leaves a loaded
    # machine room for the first (a 1 s timeout was once reached before it).
    reg.add("long", _one_call, limits=Limits(step_timeout=3.0))
    with serve_fake_models() as fake:
        fake.anthropic.script(
            Completion(text="x" * 100, chunk_size=1, input_tokens=900, output_tokens=100, pace=0.1)
        )
        provider = AnthropicProvider(api_key=FAKE_KEY, base_url=fake.anthropic_url)
        deps = toren.TickDeps(
            store=store,
            agents=reg,
            providers={"anthropic": provider},
            settings=_settings(),
            pricing=prices.cost,
        )
        run = await toren.start_run(store, reg, "long")
        async with toren.LocalWorkerRuntime(deps):
            final = await toren.wait_for_run(store, run.id, timeout=30)
        await provider.aclose()
    assert final.status == "failed"
    [call] = [e.payload for e in await store.load_events(run.id) if e.type == "ModelCallRecorded"]
    assert isinstance(call, ModelCallRecorded) and call.error is not None
    assert "timed out" in call.error["message"]
    assert call.error["usage"] == {"input_tokens": 900, "output_tokens": 1}
    assert (final.input_tokens, final.output_tokens) == (900, 1)
    assert final.cost_usd == prices.cost(MODEL, Usage(900, 1))


def test_a_reader_that_does_not_know_the_event_skips_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Additive: a release without ``ModelCallCutOff`` keeps it as an unknown run-level
    event, which the fold and the totals skip (it then counts the run's cost without the
    cut-off call, which is what it did before)."""
    from toren.core.contract import events as event_types
    from toren.core.contract.events import UnknownEvent, make_event, parse_payload
    from toren.core.contract.replay import RunLog
    from toren.core.drivers.tick import log_totals

    payload = ModelCallCutOff(stream="main", position=3, input_tokens=10, cost_usd="0.5")
    known = make_event("r", payload, seq=7)
    assert log_totals([known]).cost_nanousd == 500_000_000 and log_totals([known]).steps == 0
    monkeypatch.delitem(event_types.EVENT_TYPES, "ModelCallCutOff")
    text = known.payload_json()
    unknown = make_event("r", parse_payload("ModelCallCutOff", text, run_id="r", seq=7), seq=7)
    assert isinstance(unknown.payload, UnknownEvent)
    assert log_totals([unknown]).cost_nanousd == 0
    assert RunLog.fold("r", [unknown]).streams == {}
