"""Tools from an MCP server over stdio (official ``mcp`` package), end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from toren.agents import DirectoryResolver, load_agent
from toren.agents.config import McpServerConfig
from toren.agents.mcp_tools import McpServer, McpToolError
from toren.errors import AgentConfigError

pytest.importorskip("mcp")

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def _server(**overrides: object) -> McpServer:
    config = McpServerConfig.model_validate(
        {"command": sys.executable, "args": [SERVER], **overrides}
    )
    return McpServer("calc", config, root=Path(__file__).parent)


async def test_lists_and_calls_tools() -> None:
    server = _server(env={"SHOUT_SUFFIX": "!"})
    try:
        await _start(server)
        tools = server.tools()
        assert sorted(tools) == ["add", "fail", "shout"]
        add = tools["add"]
        assert add.spec.description == "Add two integers."
        assert add.spec.parameters["properties"]["a"]["type"] == "integer"
        assert add.spec.parameters["required"] == ["a", "b"]
        result = await add.fn(a=2, b=3)
        assert result in (5, {"result": 5}, "5")
        assert "HI!" in str(await tools["shout"].fn(text="hi"))
        with pytest.raises(McpToolError, match="failed on purpose: because"):
            await tools["fail"].fn(reason="because")
    finally:
        server.close()


async def test_allow_list_and_prefix() -> None:
    server = _server(tools=["add"], prefix="calc_")
    try:
        await _start(server)
        tools = server.tools()
        assert list(tools) == ["calc_add"]
        assert tools["calc_add"].spec.name == "calc_add"
        assert "5" in str(await tools["calc_add"].fn(a=2, b=3))
    finally:
        server.close()


async def test_unknown_allow_listed_tool_is_a_config_error() -> None:
    server = _server(tools=["multiply"])
    try:
        await _start(server)
        with pytest.raises(AgentConfigError, match="found 'multiply', expected one of"):
            server.tools()
    finally:
        server.close()


def test_server_that_cannot_start_is_a_config_error(tmp_path: Path) -> None:
    config = McpServerConfig(command=sys.executable, args=["-c", "import sys; sys.exit(3)"])
    server = McpServer("broken", config, root=tmp_path, startup_timeout=10)
    with pytest.raises(AgentConfigError, match="at 'mcp_servers.broken'"):
        server.start()


async def test_resolver_adds_mcp_tools_to_the_program(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text("def local(x: int) -> int:\n    return x\n")
    (tmp_path / "agent.yaml").write_text(
        f"""
name: mcp-agent
model: openai:gpt-4o-mini
mcp_servers:
  calc:
    command: {sys.executable}
    args: [{SERVER}]
    tools: [add]
processes:
  plain: {{mcp_servers: []}}
"""
    )
    assert load_agent(tmp_path).processes["main"].mcp_servers == ("calc",)
    with DirectoryResolver(tmp_path) as resolver:
        program = await _resolve(resolver, "main")
        assert sorted(program.tools) == ["add", "local"]
        assert "5" in str(await program.tools["add"].fn(a=2, b=3))
        plain = await _resolve(resolver, "plain")
        assert sorted(plain.tools) == ["local"]
        # The same program while nothing it is made of changed (a kept, sticky, tick
        # continues only under it); a new one once the server's session restarted and
        # listed its tools again.
        assert await _resolve(resolver, "main") is program
        (handle,) = [h for _, h in resolver._mcp.values()]
        handle.close()  # the session ends; the next call starts a new one
        assert "7" in str(await program.tools["add"].fn(a=3, b=4))
        again = await _resolve(resolver, "main")
        assert again is not program and sorted(again.tools) == ["add", "local"]
        assert await _resolve(resolver, "main") is again


async def _start(server: McpServer) -> None:
    import asyncio

    await asyncio.to_thread(server.start)


async def _resolve(resolver: DirectoryResolver, process: str):  # type: ignore[no-untyped-def]
    import asyncio

    return await asyncio.to_thread(resolver.resolve, "mcp-agent", process)
