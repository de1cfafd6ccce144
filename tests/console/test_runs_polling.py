"""Issue 23 in Chromium: the runs page asks only for what it shows and what changed since
its last poll. Runs with large inputs cost a poll a few kilobytes, not their inputs."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlsplit

from toren.store import Store

from .support import serve
from .test_browser import expect, page_with_token

BIG = "x" * 600_000


async def test_runs_page_polls_changes_only_and_never_downloads_big_inputs(
    sqlite_store: Store, chromium: Any
) -> None:
    async with serve(sqlite_store) as server:
        ids = [await server.start("approval", {"blob": BIG, "i": i}) for i in range(3)]
        for run_id in ids:
            await server.wait_status(run_id, "waiting")
        page = await page_with_token(chromium, server)
        lists: list[tuple[dict[str, list[str]], int]] = []

        async def on_response(response: Any) -> None:
            if urlsplit(response.url).path == "/v1/runs" and response.request.method == "GET":
                body = await response.body()
                lists.append((parse_qs(urlsplit(response.url).query), len(body)))

        page.on("response", lambda r: asyncio.ensure_future(on_response(r)))
        await page.goto(server.url + "/")
        await expect(page.locator("#runs-body tr")).to_have_count(3)

        # A run changes while the page polls: only the change is asked for, and shown.
        from toren.core.drivers.runs import send_message

        await send_message(server.store, ids[0], "approve", "yes")
        await server.wait_status(ids[0], "completed")
        row = page.locator(f'#runs-body tr[data-run-id="{ids[0]}"] .pill')
        await expect(row).to_have_text("completed")
        newer = await server.start("writer", {"topic": "polling"})
        await expect(page.locator(f'#runs-body tr[data-run-id="{newer}"]')).to_have_count(1)

        assert lists[0][0].get("updated_after") is None  # the first load is a full page
        deltas = [q for q, _ in lists if "updated_after" in q]
        assert deltas, lists
        # Every list the page asked for stayed small: no 600 kB input came along.
        assert max(size for _, size in lists) < 20_000, lists
        await page.context.close()
