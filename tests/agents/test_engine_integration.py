"""The agents layer on the real engine: DirectoryResolver + built-in loop + scripted
provider through ``toren.tick`` on SQLite and PostgreSQL.

Skipped only while the engine (``toren.core.drivers.tick``) is not importable.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("toren.core.drivers.tick")

import toren
from toren.agents import DirectoryResolver
from toren.agents.pricing import cost
from toren.agents.telemetry import NoopTelemetry
from toren.core.agent_api.context import Context
from toren.store import Store

from ..core.test_combinators import Spy

EXAMPLE = Path(__file__).parents[2] / "examples" / "support-agent"

HITL_SCRIPT = """
responses:
  - tool_calls: [{name: ask_human, arguments: {question: "May I email the customer?"}}]
  - tool_calls:
      - {name: lookup_order, arguments: {order_id: "A-17"}}
      - {name: send_email, arguments: {to: "c@example.com", subject: "A-17", body: "shipped"}}
  - tool_calls: [{name: lookup_order, arguments: {order_id: "Z-9"}}]
  - text: "Done. Last tool said: {last_tool}"
default: {text: "done"}
"""


def test_the_context_offers_what_the_loop_uses() -> None:
    for name in ("model", "tool", "wait_for_message", "gather", "usage", "run_id", "process"):
        assert hasattr(Context, name), name


def _agent_dir(tmp_path: Path, script: str | None = None, limits: str = "") -> Path:
    root = shutil.copytree(EXAMPLE, tmp_path / "agents" / "support-agent")
    if script is not None:
        (root / "script.yaml").write_text(script)
    if limits:
        text = (root / "agent.yaml").read_text()
        text = text.replace("  max_steps: 20\n", limits)
        (root / "agent.yaml").write_text(text)
    return root


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(path))
    return path


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("TOREN_SCRIPTED_LEDGER", str(path))
    return path


async def test_example_agent_runs_on_the_engine(
    store: Store, tmp_path: Path, outbox: Path, ledger: Path
) -> None:
    _agent_dir(tmp_path)
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "support-agent", "Where is A-17?")
        result = await toren.tick(run.id, deps)
    assert result.status == "completed", result
    assert result.output["answer"].startswith("Your order A-17 has shipped")
    assert result.output["tool_calls"] == 2
    assert len(_lines(outbox)) == 1 and len(_lines(ledger)) == 3
    events = await store.load_events(run.id)
    kinds = [e.type for e in events]
    assert kinds.count("ModelCallRecorded") == 3 and kinds.count("ToolCallRecorded") == 2


async def test_human_in_the_loop_waits_then_resumes_without_repeating_work(
    store: Store, tmp_path: Path, outbox: Path, ledger: Path
) -> None:
    # 4 model calls + 1 wait + 3 tool calls = exactly 8 steps: the limit must hold on replay.
    _agent_dir(tmp_path, HITL_SCRIPT, limits="  max_steps: 8\n")
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "support-agent", {"message": "A-17?"})
        first = await toren.tick(run.id, deps)
        assert first.status == "waiting", first
        stored = await store.get_run(run.id)
        assert stored is not None and stored.status == "waiting"
        assert len(_lines(ledger)) == 1 and _lines(outbox) == []

        await store.send_message(run.id, "human", {"message": "yes"}, now=time.time())
        second = await toren.tick(run.id, deps)
    assert second.status == "completed", second
    assert second.output["answer"].startswith("Done. Last tool said: error: tool 'lookup_order'")
    assert "no order 'Z-9'" in second.output["answer"]
    assert len(_lines(ledger)) == 4  # the first model call was replayed, not paid again
    assert len(_lines(outbox)) == 1  # the email went out once


async def test_max_steps_ends_the_run_with_a_clear_reason(
    store: Store, tmp_path: Path, outbox: Path, ledger: Path
) -> None:
    script = HITL_SCRIPT.replace(
        '{name: ask_human, arguments: {question: "May I email the customer?"}}',
        '{name: lookup_order, arguments: {order_id: "B-3"}}',
    )
    _agent_dir(tmp_path, script, "  max_steps: 4\n")
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "support-agent", "hi")
        result = await toren.tick(run.id, deps)
    assert result.status == "failed"
    assert result.error is not None and result.error["code"] == "limit_exceeded"
    assert "max_steps=4" in result.error["message"]


# -- the tool calls of one turn are structured (a task group, not a bare gather) ----------

TWO_TOOLS_TOOLS = """
import asyncio
import os


async def slow_email() -> str:
    \"\"\"Sends an email after a while.\"\"\"
    await asyncio.sleep(0.3)
    with open(os.environ["TWO_TOOLS_OUTBOX"], "a", encoding="utf-8") as fh:
        fh.write("sent\\n")
    return "sent"


def fast() -> str:
    \"\"\"Answers at once.\"\"\"
    return "fast"
"""


def _two_tools_agent(tmp_path: Path, script: str, *, human: bool = False) -> Path:
    root = tmp_path / "agents" / "two-tools"
    root.mkdir(parents=True)
    tools = "[slow_email, fast, ask_human]" if human else "[slow_email, fast]"
    (root / "agent.yaml").write_text(
        f"name: two-tools\nmodel: scripted:script.yaml\ntools: {tools}\n"
    )
    (root / "tools.py").write_text(TWO_TOOLS_TOOLS)
    (root / "script.yaml").write_text(script)
    return root


class _TelemetryBug(NoopTelemetry):
    """Breaks the Telemetry contract (never raise into the engine) on the tool ``fast``:
    an error that is not a ToolFailed, raised inside one tool call of a turn."""

    def on_tool_call(self, *args: Any, **kwargs: Any) -> None:
        if args[3] == "fast":
            raise RuntimeError("telemetry bug")


async def test_a_failing_tool_call_stops_its_siblings_before_the_run_fails(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = tmp_path / "two-tools-outbox.txt"
    monkeypatch.setenv("TWO_TOOLS_OUTBOX", str(outbox))
    script = "responses:\n  - tool_calls: [{name: slow_email}, {name: fast}]\n"
    _two_tools_agent(tmp_path, script)
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, telemetry=_TelemetryBug())
        run = await toren.start_run(store, resolver, "two-tools", "go")
        result = await toren.tick(run.id, deps)
        assert result.status == "failed", result
        assert result.error is not None and result.error["message"] == "telemetry bug"
        await asyncio.sleep(0.5)  # long enough for an orphaned slow_email to finish
    assert not outbox.exists()  # the email of a failed run was never sent
    events = await store.load_events(run.id)
    assert [e.type for e in events][-1] == "RunFailed"
    tools = [e.payload.name for e in events if e.type == "ToolCallRecorded"]
    assert tools == ["fast"]


async def test_a_turn_with_a_tool_and_ask_human_parks_and_resumes_in_the_same_positions(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger: Path
) -> None:
    outbox = tmp_path / "two-tools-outbox.txt"
    monkeypatch.setenv("TWO_TOOLS_OUTBOX", str(outbox))
    script = (
        "responses:\n"
        "  - tool_calls: [{name: slow_email}, {name: ask_human, arguments: {question: 'ok'}}]\n"
        "  - text: 'last tool: {last_tool}'\n"
    )
    _two_tools_agent(tmp_path, script, human=True)
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "two-tools", "go")
        first = await toren.tick(run.id, deps)
        assert first.status == "waiting", first
        assert outbox.read_text() == "sent\n"  # the busy sibling finished before parking
        await store.send_message(run.id, "human", {"message": "yes"}, now=time.time())
        second = await toren.tick(run.id, deps)
    assert second.status == "completed", second
    assert second.output["answer"] == "last tool: yes"
    assert outbox.read_text() == "sent\n" and len(_lines(ledger)) == 2
    assert second.replayed == 2 and second.invalidations == 0  # model call, slow_email
    steps = [(e.type, e.position) for e in await store.load_events(run.id) if e.digest]
    assert steps == [
        ("ModelCallRecorded", 0),
        ("ToolCallRecorded", 1),  # slow_email, first in the model's order
        ("MessageReceived", 2),  # ask_human
        ("ModelCallRecorded", 3),
    ]


# -- scripted:echo ------------------------------------------------------------------------


async def test_an_agent_on_scripted_echo_loads_and_runs(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "agents" / "echo"
    root.mkdir(parents=True)
    (root / "agent.yaml").write_text(
        "name: echo\nmodel: scripted:echo\ninstructions: Repeat after me.\n"
        "processes:\n  other: {model: offline:echo}\n"
        "providers:\n  offline: {type: scripted}\n"
    )
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        for process in ("main", "other"):
            run = await toren.start_run(store, resolver, "echo", "hello", process=process)
            result = await toren.tick(run.id, deps)
            assert result.status == "completed", result
            assert result.output["answer"] == "hello"


async def test_the_loop_s_parallel_tool_calls_park_from_facts(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger: Path
) -> None:
    """A turn whose calls all wait on a human (two ask_human calls) parks on what the
    engine was told by ctx.gather, not on asyncio's internals, and holds no task."""
    spy = Spy(monkeypatch)
    script = (
        "responses:\n"
        "  - tool_calls: [{name: fast}, {name: ask_human, arguments: {question: 'a'}},\n"
        "                 {name: ask_human, arguments: {question: 'b'}}]\n"
        "  - text: 'last tool: {last_tool}'\n"
    )
    _two_tools_agent(tmp_path, script, human=True)
    with DirectoryResolver(tmp_path / "agents") as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "two-tools", "go")
        first = await toren.tick(run.id, deps)
        assert first.status == "waiting", first
        assert spy.parked_from_facts(), spy.verdicts
        assert spy.nothing_held()
        for answer in ("yes", "no"):
            await store.send_message(run.id, "human", {"message": answer}, now=time.time())
        second = await toren.tick(run.id, deps)
    assert second.status == "completed", second
    assert second.output["answer"] == "last tool: no"
    assert second.invalidations == 0
    steps = [(e.type, e.position) for e in await store.load_events(run.id) if e.digest]
    assert steps == [
        ("ModelCallRecorded", 0),
        ("ToolCallRecorded", 1),  # fast, in the model's order
        ("MessageReceived", 2),
        ("MessageReceived", 3),
        ("ModelCallRecorded", 4),
    ]
