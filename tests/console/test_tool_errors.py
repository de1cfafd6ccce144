"""Tool errors in the console (issue 40, item 3), headless Chromium against a real server
and worker: the runs list marks a completed run whose tool calls failed, the run page
counts them, and the API's run carries ``tool_errors``."""

from __future__ import annotations

from typing import Any

import httpx

import toren
from toren.providers.base import ToolSpec
from toren.store import Store

from .support import TOKEN, serve
from .test_browser import expect, page_with_token


async def down(order_id: str) -> dict[str, Any]:
    raise RuntimeError(f"the order service is down for {order_id}")


async def careful(ctx: toren.Context, input: Any) -> Any:
    """Tries the tool twice, and answers anyway (as the built-in loop does by default)."""
    for _ in range(2):
        try:
            await ctx.tool("down", {"order_id": "A-17"})
        except toren.ToolFailed:
            pass
    return {"answer": "sorry, try later"}


async def test_the_list_and_the_run_page_show_tool_errors(
    sqlite_store: Store, chromium: Any
) -> None:
    async with serve(sqlite_store) as server:
        tools = {"down": toren.ToolDef("down", down, ToolSpec("down"))}
        server.registry.add("careful", careful, tools=tools, code_version="c1")
        failing = await server.start("careful")
        clean = await server.start("writer", {"topic": "tools"})
        await server.wait_status(failing, "completed")
        await server.wait_status(clean, "completed")

        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            body = (await http.get(f"{server.url}/v1/runs/{failing}")).json()
            assert body["status"] == "completed" and body["tool_errors"] == 2
            listed = (await http.get(f"{server.url}/v1/runs")).json()
            by_id = {r["id"]: r for r in listed["runs"]}
            assert by_id[failing]["tool_errors"] == 2 and by_id[clean]["tool_errors"] == 0

        page = await page_with_token(chromium, server)
        await page.goto(server.url)
        row = page.locator(f'tr[data-run-id="{failing}"]')
        await expect(row.locator(".tool-errors")).to_have_text("⚠ 2 tool errors")
        await expect(page.locator(f'tr[data-run-id="{clean}"] .tool-errors')).to_have_count(0)

        await page.goto(f"{server.url}/runs/{failing}")
        await expect(page.locator("#s-toolerr")).to_have_text("2")
        await expect(page.locator("#s-toolerr")).to_have_class("bad")
        await page.goto(f"{server.url}/runs/{clean}")
        await expect(page.locator("#s-toolerr")).to_have_text("0")
