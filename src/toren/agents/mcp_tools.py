"""Tools served by MCP servers over stdio (the official ``mcp`` package, extra ``mcp``).

Each configured server is one long-lived client session. The session lives on its own
event loop in a background thread because an MCP session is bound to the task that
opened it (anyio cancel scopes), while the engine calls tools from whatever loop and task
runs the tick, and the resolver that lists the tools is synchronous. Calls cross threads
with ``run_coroutine_threadsafe``; the session multiplexes concurrent requests itself.

Works with the 1.x and 2.x lines of ``mcp``, which spell some fields differently
(``inputSchema``/``input_schema``, ``isError``/``is_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toren.agents.config import McpServerConfig
from toren.core.agent_api.program import ToolDef
from toren.errors import AgentConfigError
from toren.providers.base import ToolSpec

__all__ = ["McpServer", "McpToolError"]


class McpToolError(RuntimeError):
    """The MCP server answered a tool call with ``isError``; the text is for the model."""


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


class McpServer:
    """One stdio MCP server: start it, list its tools as :class:`ToolDef`, call them."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        root: Path,
        source: str = "agent.yaml",
        startup_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.config = config
        self.root = root
        self.source = source
        self.startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._session: Any = None
        self._listed: list[object] = []
        self._error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and list its tools; blocks up to ``startup_timeout``."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and self._session:
                return
            self._ready.clear()
            self._error = None
            self._thread = threading.Thread(
                target=self._run, name=f"toren-mcp-{self.name}", daemon=True
            )
            self._thread.start()
            if not self._ready.wait(self.startup_timeout):
                self.close()
                raise self._config_error(f"no answer within {self.startup_timeout:g}s")
            if self._error is not None:
                error, self._error = self._error, None
                self.close()
                raise self._config_error(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._thread = None
        self._session = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); never lost in the thread
            self._error = self._error or exc
        finally:
            self._session = None
            self._ready.set()
            loop.close()

    async def _serve(self) -> None:
        try:
            from mcp import ClientSession, StdioServerParameters
            from mcp.client.stdio import stdio_client
        except ImportError as exc:
            raise ImportError(
                "MCP servers need the 'mcp' package: pip install 'toren-run[mcp]'"
            ) from exc
        cwd = self.root / self.config.cwd if self.config.cwd else self.root
        params = StdioServerParameters(
            command=self.config.command,
            args=list(self.config.args),
            env=dict(self.config.env) or None,
            cwd=str(cwd),
        )
        self._stop = asyncio.Event()
        async with (
            stdio_client(params) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            self._listed = await _list_all_tools(session)
            self._session = session
            self._ready.set()
            await self._stop.wait()

    def _config_error(self, problem: str) -> AgentConfigError:
        return AgentConfigError(
            f"{self.source}: at 'mcp_servers.{self.name}': found a server that failed to "
            f"start ({problem}); expected a stdio MCP server started by "
            f"{[self.config.command, *self.config.args]!r}. Check the command runs on its own.",
            file=self.source,
            key=f"mcp_servers.{self.name}",
        )

    # -- tools -----------------------------------------------------------------------

    @property
    def listing(self) -> object:
        """The server's tool listing as its current session gave it: a new object once a
        restarted session lists its tools again (what a resolver's program depends on)."""
        return self._listed

    def tools(self) -> dict[str, ToolDef]:
        """The server's tools (after ``start``), filtered and prefixed as configured."""
        available = {str(_field(t, "name")): t for t in self._listed}
        wanted = self.config.tools if self.config.tools is not None else list(available)
        missing = [name for name in wanted if name not in available]
        if missing:
            raise AgentConfigError(
                f"{self.source}: at 'mcp_servers.{self.name}.tools': found {missing[0]!r}, "
                f"expected one of the server's tools: {sorted(available)}",
                file=self.source,
                key=f"mcp_servers.{self.name}.tools",
            )
        return {self.config.prefix + name: self._tooldef(available[name]) for name in wanted}

    def _tooldef(self, tool: object) -> ToolDef:
        remote = str(_field(tool, "name"))
        schema = dict(_field(tool, "input_schema", "inputSchema", default={}))
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        annotations = _field(tool, "annotations")
        read_only = bool(_field(annotations, "read_only_hint", "readOnlyHint", default=False))

        async def call(**arguments: object) -> object:
            return await self.call(remote, arguments)

        name = self.config.prefix + remote
        return ToolDef(
            name=name,
            fn=call,
            spec=ToolSpec(
                name=name,
                description=str(_field(tool, "description", default="") or ""),
                parameters=schema,
            ),
            side_effects=not read_only,
        )

    async def call(self, tool: str, arguments: Mapping[str, object]) -> object:
        """Call a tool on the server from any event loop."""
        if self._session is None or self._loop is None:
            await asyncio.to_thread(self.start)
        loop, session = self._loop, self._session
        assert loop is not None and session is not None
        future = asyncio.run_coroutine_threadsafe(session.call_tool(tool, dict(arguments)), loop)
        result = await asyncio.wrap_future(future)
        return _result_value(result)


async def _list_all_tools(session: Any) -> list[Any]:
    tools: list[object] = []
    result = await session.list_tools()
    tools.extend(result.tools)
    cursor = _field(result, "next_cursor", "nextCursor")
    while cursor:
        try:  # mcp 2.x
            from mcp.types import PaginatedRequestParams

            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        except (ImportError, TypeError):  # mcp 1.x
            result = await session.list_tools(cursor=cursor)
        tools.extend(result.tools)
        cursor = _field(result, "next_cursor", "nextCursor")
    return tools


def _result_value(result: object) -> object:
    """Structured content when the server gives it, else the text parts joined."""
    texts = []
    for part in _field(result, "content", default=[]):
        text = getattr(part, "text", None)
        texts.append(text if text is not None else f"[{getattr(part, 'type', 'content')}]")
    text = "\n".join(texts)
    if _field(result, "is_error", "isError", default=False):
        raise McpToolError(text or "the MCP tool reported an error")
    structured = _field(result, "structured_content", "structuredContent")
    if structured is not None:
        return structured
    return text
