"""A pydantic-ai agent's MCP server (an MCPToolset over stdio, the test server of
tests/agents/mcp_server.py) on Toren: its tool calls are tool steps, replayed from the
log, not called again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import toren
from tests.providers.fakes import FAKE_KEY, Completion, FakeToolCall, serve_fake_models
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai.mcp")

SERVER = Path(__file__).parents[1] / "agents" / "mcp_server.py"

APP = """\
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset, StdioTransport
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

tools = MCPToolset(
    StdioTransport(command={python!r}, args=[{server!r}]), id="calc", init_timeout=60
)
agent = Agent(
    OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url={url!r}, api_key={key!r})),
    toolsets=[tools],
)
"""


async def test_mcp_tool_calls_are_tool_steps(db_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "agents" / "calc"
    directory.mkdir(parents=True)
    (directory / "agent.yaml").write_text("name: calc\nentry: app:agent\n")
    with serve_fake_models() as fake:
        (directory / "app.py").write_text(
            APP.format(python=sys.executable, server=str(SERVER), url=fake.openai_url, key=FAKE_KEY)
        )
        fake.openai.script(
            Completion(tool_calls=(FakeToolCall("c1", "add", {"a": 2, "b": 3}),)),
            Completion(text="2 + 3 = 5"),
        )
        runtime = await open_runtime(
            tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05)
        )
        try:
            run = await toren.start_run(runtime.store, runtime.resolver, "calc", "2+3?")
            async with toren.LocalWorkerRuntime(runtime.deps):
                final = await toren.wait_for_run(runtime.store, run.id, timeout=60)
            assert final.status == "completed", final.error
            assert final.output == "2 + 3 = 5"
            events = await runtime.store.load_events(run.id)
            (tool,) = [e.payload for e in events if e.type == "ToolCallRecorded"]
            assert (tool.name, tool.args) == ("add", {"a": 2, "b": 3})
            assert "5" in str(tool.result)
            # The tool list went to the model from the MCP server.
            assert [t["function"]["name"] for t in fake.openai.requests[0].body["tools"]] == [
                "add",
                "shout",
                "fail",
            ]

            # A fork past the end replays both steps: no request, no MCP call recorded anew.
            forked = await toren.fork_run(runtime.store, runtime.resolver, run.id, at="main:3")
            async with toren.LocalWorkerRuntime(runtime.deps):
                again = await toren.wait_for_run(runtime.store, forked.id, timeout=60)
            assert again.status == "completed" and again.output == final.output
            assert fake.openai.served == 2
        finally:
            await close_runtime(runtime)
