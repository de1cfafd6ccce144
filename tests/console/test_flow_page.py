"""The console's Flow page in headless Chromium: a concurrency key with its holder and
queue, and a provider rate limit with its window's use."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from toren.config import RateLimit
from toren.store import Store

from .support import TOKEN, serve
from .test_browser import expect, page_with_token


async def test_the_flow_page_shows_queues_and_limits(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        store = server.store
        # Two runs of one key at limit 1: the first waits for its approval, holding the
        # key's slot; the second is queued behind it.
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
            ids = []
            for _ in range(2):
                started = await http.post(
                    "/v1/runs",
                    json={"agent": "approval", "concurrency_key": "desk-1", "concurrency_limit": 1},
                )
                assert started.status_code in (200, 201), started.text
                ids.append(started.json()["id"])
            for _ in range(600):  # the first one holds the slot once it waits
                if (await http.get(f"/v1/runs/{ids[0]}")).json()["status"] == "waiting":
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the first run never waited")
        limit = RateLimit(rpm=600, period=60)
        assert (
            await store.take_rate_slot("openai:m", limit, owner="x/:0", tokens=9, now=time.time())
        ).go
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/flow")
        row = page.locator('[data-key="desk-1"]')
        await expect(row).to_contain_text("desk-1")
        await expect(row.locator("td").nth(1)).to_have_text("1")  # the limit
        await expect(row.locator("td").nth(2)).to_have_text("1")  # holding
        await expect(row.locator("td").nth(3)).to_have_text("1")  # queued
        limits = page.locator('[data-limit="openai:m"]')
        await expect(limits.locator("td").nth(1)).to_have_text("1 / 600 per min")
        await expect(limits.locator("td").nth(2)).to_have_text("9 (no limit)")
        await page.goto(server.url + "/")
        await page.get_by_role("link", name="Flow").click()
        await expect(page.locator("h1")).to_have_text("Flow")
