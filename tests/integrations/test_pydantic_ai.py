"""pydantic-ai agents on Toren (toren.integrations.pydantic_ai), driven through
pydantic-ai's real OpenAI and Anthropic model classes against the loopback wire servers
(tests/providers/fakes.py), on SQLite and PostgreSQL. What the servers served and what
the side-effecting tools did is counted, never assumed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.integrations.pyai_agent import (
    OUTPUT_TOOL,
    call,
    outbox_lines,
    ticket,
    write_agent,
)
from tests.providers.fakes import Failure, FakeModelServer, serve_fake_models
from toren.runtime import Runtime, close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

VENDORS = ["openai", "anthropic"]


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def endpoint(fake: FakeModelServer, vendor: str) -> Any:
    return fake.openai if vendor == "openai" else fake.anthropic


def url_of(fake: FakeModelServer, vendor: str) -> str:
    return fake.openai_url if vendor == "openai" else fake.anthropic_url


async def opened(tmp_path: Path, db_url: str) -> Runtime:
    return await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))


async def run_once(runtime: Runtime, input: Any = "Where is A-17?") -> Any:
    run = await toren.start_run(runtime.store, runtime.resolver, "support", input)
    async with toren.LocalWorkerRuntime(runtime.deps):
        return await toren.wait_for_run(runtime.store, run.id, timeout=30)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_an_unmodified_agent_runs_as_steps(
    db_url: str, tmp_path: Path, fake: FakeModelServer, vendor: str
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", vendor, url_of(fake, vendor), outbox)
    server = endpoint(fake, vendor)
    server.script(
        call("c1", "lookup_order", order_id="A-17"),
        call("c2", "send_email", to="c@example.com", body="A-17 shipped"),
        ticket("c3", notes=["emailed"]),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
        assert final.status == "completed", final.error
        assert final.output == {"order": "A-17", "status": "shipped", "notes": ["emailed"]}
        assert server.served == 3
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
        events = await runtime.store.load_events(final.id)
        steps = [(e.type, e.position) for e in events if e.type.endswith("Recorded")]
        assert steps == [
            ("ModelCallRecorded", 0),
            ("ToolCallRecorded", 1),
            ("ModelCallRecorded", 2),
            ("ToolCallRecorded", 3),
            ("ModelCallRecorded", 4),
        ]
        models = [e.payload for e in events if e.type == "ModelCallRecorded"]
        assert {m.provider for m in models} == {vendor}
        assert sum(m.input_tokens for m in models) == final.input_tokens == 3 * 11
        assert final.output_tokens == 3 * 7
        assert final.cost_usd > 0  # priced from the default table, like any model step
        # What the provider saw: the instructions, the tools and the output tool.
        first = server.requests[0].body
        names = (
            {t["function"]["name"] for t in first["tools"]}
            if vendor == "openai"
            else {t["name"] for t in first["tools"]}
        )
        assert names == {"lookup_order", "send_email", "refund", OUTPUT_TOOL}
        assert first["temperature"] == 0.2
    finally:
        await close_runtime(runtime)


async def wait_status(runtime: Runtime, run_id: str, status: str) -> Any:
    return await toren.wait_for_run(runtime.store, run_id, timeout=30, until=(status,))  # type: ignore[arg-type]


@pytest.mark.parametrize("vendor", VENDORS)
async def test_approval_parks_survives_a_restart_and_an_edited_prompt(
    db_url: str, tmp_path: Path, fake: FakeModelServer, vendor: str
) -> None:
    """An approval-required tool parks the run (waiting, for 'approval'); a worker
    restart while it waits loses nothing; the instructions of the steps after the first
    tool answer are edited under it: `toren plan` predicts the one invalidation, the
    resumed run has exactly that one StreamInvalidated, requests no earlier step again,
    and the approved refund happens once."""
    outbox = tmp_path / "outbox.jsonl"
    agents = tmp_path / "agents"
    write_agent(agents, vendor, url_of(fake, vendor), outbox)
    server = endpoint(fake, vendor)
    server.script(
        call("c1", "lookup_order", order_id="A-17"),
        call("c2", "refund", order_id="A-17", amount=12.5),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "support", "Refund A-17")
        async with toren.LocalWorkerRuntime(runtime.deps):
            parked = await wait_status(runtime, run.id, "waiting")
        assert parked.status == "waiting" and parked.waiting_for == ["approval"]
        assert server.served == 2
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order"]

        # The worker that parked it is gone; a new one (below) resumes it from the log.
        # The deploy: the follow-up instructions (sent from the second model call on) change.
        write_agent(agents, vendor, url_of(fake, vendor), outbox, followup="Be brief.")
        deps = runtime.reload_deps()
        (plan,) = await toren_plan(deps, run.id)
        assert [(f.stream, f.from_pos) for f in plan.findings] == [("main", 2)]

        server.script(
            call("c3", "refund", order_id="A-17", amount=12.5),  # the re-requested step 2
            ticket("c4", notes=["refunded"]),
        )
        await toren.send_message(runtime.store, run.id, "approval", True)
        async with toren.LocalWorkerRuntime(deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        assert final.status == "completed", final.error
        assert final.output == {"order": "A-17", "status": "shipped", "notes": ["refunded"]}
        events = await runtime.store.load_events(run.id)
        invalidated = [e for e in events if e.type == "StreamInvalidated"]
        assert [(e.stream, e.payload.from_pos) for e in invalidated] == [("main", 2)]
        # Requests after the deploy: step 2 again and the final one, never step 0.
        assert server.served == 4
        assert "Be brief." in str(server.requests[2].body)
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "refund"]
    finally:
        await close_runtime(runtime)


async def toren_plan(deps: Any, run_id: str) -> list[Any]:
    from toren.core.drivers.plan import plan_run

    run = await deps.store.get_run(run_id)
    return [await plan_run(deps, run)]


async def test_structured_output_round_trips_through_replay(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    """A fork past the last step replays every step of a finished run: the Ticket that
    pydantic-ai validates from the replayed final call equals the one of the live run,
    and nothing is requested or executed again."""
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", "openai", fake.openai_url, outbox)
    fake.openai.script(
        call("c1", "lookup_order", order_id="A-17"),
        ticket("c2", status="delayed", notes=["a", "b"]),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        live = await run_once(runtime)
        assert live.status == "completed", live.error
        definition = runtime.resolver.load("support")
        ticket_type = sys.modules[f"_toren_agent_support_{definition.content_hash}.app"].Ticket
        expected = ticket_type(order="A-17", status="delayed", notes=["a", "b"])
        assert ticket_type.model_validate(live.output) == expected

        forked = await toren.fork_run(runtime.store, runtime.resolver, live.id, at="main:3")
        async with toren.LocalWorkerRuntime(runtime.deps):
            replayed = await toren.wait_for_run(runtime.store, forked.id, timeout=30)
        assert replayed.status == "completed", replayed.error
        assert ticket_type.model_validate(replayed.output) == expected
        assert replayed.output == live.output
        assert fake.openai.served == 2  # every step answered from the log
        assert len(outbox_lines(outbox)) == 1
        # The fork carries the source's steps with their recorded usage, paid once.
        assert (replayed.input_tokens, replayed.cost_usd) == (live.input_tokens, live.cost_usd)
    finally:
        await close_runtime(runtime)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ("max_steps: 2", "max_steps"),
        ("max_cost_usd: 0.000001", "max_cost_usd"),
    ],
)
async def test_limits_stop_a_pydantic_ai_run(
    db_url: str, tmp_path: Path, fake: FakeModelServer, limits: str, reason: str
) -> None:
    """agent.yaml's limits apply to a pydantic-ai run as to any other: it fails with the
    reason, after the step that reached the limit, and no further call is made."""
    outbox = tmp_path / "outbox.jsonl"
    directory = write_agent(tmp_path / "agents", "openai", fake.openai_url, outbox)
    (directory / "agent.yaml").write_text(f"name: support\nentry: app:agent\nlimits:\n  {limits}\n")
    fake.openai.script(
        call("c1", "lookup_order", order_id="A-17"),
        call("c2", "send_email", to="c@example.com", body="A-17 shipped"),
        ticket("c3"),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
        assert final.status == "failed"
        assert final.error["type"] == "LimitExceeded" and reason in final.error["message"]
        assert fake.openai.served == 1  # the limit stopped the run before a second call
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order"]
    finally:
        await close_runtime(runtime)


async def test_a_failed_pydantic_ai_run_is_retried_from_its_log(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    """A model call the provider refuses fails the run (recorded, with the status); a
    retry replays the steps before it from the log and runs that call again."""
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", "openai", fake.openai_url, outbox)
    fake.openai.script(
        call("c1", "lookup_order", order_id="A-17"),
        Failure(400, "the request was refused"),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        failed = await run_once(runtime)
        assert failed.status == "failed"
        assert "400" in failed.error["message"]
        fake.openai.script(ticket("c2"))
        await toren.retry_run(runtime.store, runtime.resolver, failed.id)
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, failed.id, timeout=30)
        assert final.status == "completed", final.error
        assert final.output == {"order": "A-17", "status": "shipped", "notes": []}
        assert fake.openai.served == 3  # step 0 once; the refused call, then its retry
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order"]
    finally:
        await close_runtime(runtime)
