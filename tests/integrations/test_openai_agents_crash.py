"""SIGKILL at random points of an OpenAI Agents SDK run with a handoff and side-effecting
tools, through the SDK's real OpenAIResponsesModel and OpenAIChatCompletionsModel against
the loopback server, on SQLite and PostgreSQL (issue 36).

The run: triage looks the order up (a tool), hands off to billing (a handoff whose
callback has an effect), billing emails the customer (a side effect), and answers. A
seeded plan kills a real ``toren worker`` at three of its points (see
tests/integrations/crash.py: model calls held before or during their answer, effects held
before they happen) and a new worker resumes each time. Counted by the server and the
outbox: 0 model calls paid twice, 0 effects executed twice, and the same handoff taken
after every resume.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import toren
from tests.integrations.crash import Crasher, Point, kill_plan
from tests.integrations.oa_agent import conversation, outbox_lines, turn_of, write_agent
from tests.providers.fakes import FakeModelServer, serve_fake_models
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("agents")

APIS = ["responses", "chat"]
BACKENDS = ["sqlite", "postgres"]
KILLS = 3
# The seed of the four plans, chosen (as the first that does) so that together they kill
# at every point and hold model calls at every place (test_the_kill_plans_cover_every_point).
SEED = 1

# The run's points in order: a kill at any of them must lose and repeat nothing.
POINTS = [
    Point("model", ("triage", 0)),
    Point("effect", "lookup_order"),
    Point("model", ("triage", 1)),  # the call that decides the handoff
    Point("effect", "handoff"),  # inside the handoff step, before its callback's effect
    Point("model", ("billing", 2)),  # billing's first call, right after the handoff
    Point("effect", "send_email:c@example.com"),
    Point("model", ("billing", 3)),
]
HANDOFF_DECIDED = 3  # points from here on come after the call that chose billing

HANDOFF_CODE = """

from agents import handoff as _handoff


async def _handed_off(context):
    await _ahold("handoff")  # a kill here: inside the handoff step, before its effect
    _effect("handoff", agent="billing")


agent = agent.clone(handoffs=[_handoff(billing, on_handoff=_handed_off)])
"""


def plan_for(api: str, backend: str) -> list[Point]:
    return kill_plan(POINTS, KILLS, seed=zlib.crc32(f"oa-{SEED}-{api}-{backend}".encode()))


def test_the_kill_plans_cover_every_point() -> None:
    """Across the four runs (two APIs, two backends) the seeded plans kill at every point
    of the run at least once, and hold model calls both before and during their answer."""
    plans = [plan_for(api, backend) for api in APIS for backend in BACKENDS]
    chosen = [point for plan in plans for point in plan]
    assert {(p.kind, p.key) for p in chosen} == {(p.kind, p.key) for p in POINTS}, plans
    assert {p.after for p in chosen if p.kind == "model"} == {None, 1, 2}, plans


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


@pytest.mark.slow  # real worker or dev processes, several of them
@pytest.mark.parametrize("api", APIS)
async def test_sigkill_at_random_points_pays_nothing_twice_and_takes_the_same_handoff(
    db_url: str, tmp_path: Path, fake: FakeModelServer, api: str
) -> None:
    backend = "postgres" if db_url.startswith("postgres") else "sqlite"
    plan = plan_for(api, backend)
    outbox, agents = tmp_path / "outbox.jsonl", tmp_path / "agents"
    endpoint = fake.responses if api == "responses" else fake.openai
    crasher = Crasher(tmp_path, endpoint, conversation(), turn_of)
    directory = write_agent(agents, api, fake.openai_url, outbox)
    app = directory / "app.py"
    app.write_text(app.read_text() + crasher.hold_code() + HANDOFF_CODE)
    runtime = await open_runtime(agents, db_url, toren.Settings(poll_interval=0.05))
    try:
        final = await crasher.run(runtime, agents, db_url, plan)
        events = await runtime.store.load_events(final.id)
        verified = await toren.verify_run(runtime.store, final.id)
    finally:
        await close_runtime(runtime)
    why = f"kill plan {[str(p) for p in plan]}"
    assert final.status == "completed", (final.error, why)
    assert final.output == "Emailed you about A-17."
    assert final.lease_recoveries >= 1
    assert verified.ok, verified.to_dict()

    # Paid: each model call answered once; only a call held when its worker was killed
    # (never answered) was sent again, as the same request, by the next worker.
    crasher.check_held_calls()
    turns = [("triage", 0), ("triage", 1), ("billing", 2), ("billing", 3)]
    assert crasher.paid() == Counter(dict.fromkeys(turns, 1)), why
    assert [e.type for e in events].count("ModelCallRecorded") == 4
    # Executed: every effect once, the read, the handoff's callback and the email.
    assert [line["tool"] for line in outbox_lines(outbox)] == [
        "lookup_order",
        "handoff",
        "send_email",
    ], why
    # The same handoff: recorded once, and every worker resumed after the call that
    # chose it went on as billing (replayed from the log, not decided again).
    tools = [e.payload for e in events if e.type == "ToolCallRecorded"]
    assert [(t.name, t.result) for t in tools if t.name.startswith("transfer")] == [
        ("transfer_to_billing", {"agent": "billing"})
    ]
    assert [t.name for t in tools] == ["lookup_order", "transfer_to_billing", "send_email"]
    for point, served in crasher.kills:
        if POINTS.index(unplanned(point)) >= HANDOFF_DECIDED:
            after = [turn_of(r.body)[0] for r in endpoint.requests[served:]]
            assert after and set(after) == {"billing"}, (point, after)


def unplanned(point: Point) -> Point:
    """The point as POINTS lists it (a planned model point also says where it is held)."""
    return Point(point.kind, point.key)
