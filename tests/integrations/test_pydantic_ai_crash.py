"""SIGKILL at random points of a 10-step pydantic-ai run (five model calls, each asking
for a side-effecting tool, then the final answer), through pydantic-ai's real OpenAI and
Anthropic model classes against the loopback server, on SQLite and PostgreSQL (issue 35).

A seeded plan kills a real ``toren worker`` at four of the run's points (see
tests/integrations/crash.py: model calls held before or during their answer, the tool
held before its effect) and a new worker resumes each time. The run completes with the
uninterrupted run's output; counted by the server and the outbox: 0 model calls paid
twice, 0 emails sent twice.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.crash import Crasher, Point, kill_plan
from tests.integrations.pyai_agent import OUTPUT_TOOL, outbox_lines, write_agent
from tests.providers.fakes import Completion, FakeToolCall, serve_fake_models
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

EMAILS = 5  # five model calls asking for send_email, five tool steps: 10 steps, then the answer
KILLS = 4
VENDORS = ["openai", "anthropic"]
BACKENDS = ["sqlite", "postgres"]
# The seed of the four plans, chosen (as the first that does) so that together they kill
# at every point and hold model calls at every place (test_the_kill_plans_cover_every_point).
SEED = 12

POINTS = [
    point
    for n in range(EMAILS + 1)
    for point in (Point("model", n), Point("effect", f"send_email:user{n}@example.com"))
][:-1]
TICKET = {"order": "A-17", "status": "shipped", "notes": [f"{EMAILS} emails"]}


def answer(body: dict[str, Any]) -> Completion:
    """The model: the n-th call asks for email n, the last one gives the ticket."""
    n = step_of(body)
    if n < EMAILS:
        args = {"to": f"user{n}@example.com", "body": f"update {n}"}
        return Completion(tool_calls=(FakeToolCall(f"c{n}", "send_email", args),))
    return Completion(tool_calls=(FakeToolCall("fin", OUTPUT_TOOL, TICKET),))


def step_of(body: dict[str, Any]) -> Hashable:
    """Which model call of the run a request is: how many tool results it carries (as
    Chat Completions ``tool`` messages, or Anthropic ``tool_result`` blocks)."""
    results = 0
    for message in body["messages"]:
        if message.get("role") == "tool":
            results += 1
        elif isinstance(message.get("content"), list):
            results += sum(1 for b in message["content"] if b.get("type") == "tool_result")
    return results


def plan_for(vendor: str, backend: str) -> list[Point]:
    return kill_plan(POINTS, KILLS, seed=zlib.crc32(f"pyai-{SEED}-{vendor}-{backend}".encode()))


def test_the_kill_plans_cover_every_point() -> None:
    """Across the four runs (two vendors, two backends) the seeded plans kill at every
    point of the run at least once, and hold model calls both before and during their
    answer."""
    plans = [plan_for(vendor, backend) for vendor in VENDORS for backend in BACKENDS]
    chosen = [point for plan in plans for point in plan]
    assert {(p.kind, p.key) for p in chosen} == {(p.kind, p.key) for p in POINTS}, plans
    assert {p.after for p in chosen if p.kind == "model"} == {None, 1, 2}, plans


@pytest.mark.slow  # real worker or dev processes, several of them
@pytest.mark.parametrize("vendor", VENDORS)
async def test_sigkill_at_random_points_pays_no_call_twice_and_runs_no_tool_twice(
    db_url: str, tmp_path: Path, vendor: str
) -> None:
    backend = "postgres" if db_url.startswith("postgres") else "sqlite"
    plan = plan_for(vendor, backend)
    outbox, agents = tmp_path / "outbox.jsonl", tmp_path / "agents"
    with serve_fake_models() as fake:
        endpoint = fake.openai if vendor == "openai" else fake.anthropic
        url = fake.openai_url if vendor == "openai" else fake.anthropic_url
        crasher = Crasher(tmp_path, endpoint, answer, step_of)
        app = write_agent(agents, vendor, url, outbox) / "app.py"
        app.write_text(app.read_text() + crasher.hold_code())
        runtime = await open_runtime(agents, db_url)
        try:
            final = await crasher.run(runtime, agents, db_url, plan)
            events = await runtime.store.load_events(final.id)
        finally:
            await close_runtime(runtime)
    why = f"kill plan {[str(p) for p in plan]}"
    assert final.status == "completed", (final.error, why)
    assert final.output == TICKET
    assert final.lease_recoveries >= 1

    # Paid: each model call answered once; only a call held when its worker was killed
    # (never answered) was sent again, as the same request, by the next worker.
    crasher.check_held_calls()
    assert crasher.paid() == Counter(dict.fromkeys(range(EMAILS + 1), 1)), why
    models = sorted(e.position for e in events if e.type == "ModelCallRecorded")
    tools = sorted(e.position for e in events if e.type == "ToolCallRecorded")
    assert models == list(range(0, 2 * EMAILS + 1, 2))
    assert tools == list(range(1, 2 * EMAILS, 2))
    # Executed: each email once, never twice.
    sent = Counter(line["to"] for line in outbox_lines(outbox))
    assert sent == Counter({f"user{n}@example.com": 1 for n in range(EMAILS)}), why
