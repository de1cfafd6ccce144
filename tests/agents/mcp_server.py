"""A tiny stdio MCP server for the tests, written with the official SDK's FastMCP
(``MCPServer`` in mcp 2.x, ``FastMCP`` in mcp 1.x)."""

from __future__ import annotations

import os

try:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp >= 2
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

server = FastMCP("toren-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper() + os.environ.get("SHOUT_SUFFIX", "")


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"failed on purpose: {reason}")


if __name__ == "__main__":
    server.run()
