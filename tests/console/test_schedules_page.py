"""The console's Schedules page in headless Chromium: each schedule's timing, paused or not
with its note, the overlap policy, the next times, its last runs and the last skip."""

from __future__ import annotations

import asyncio
from typing import Any

from toren.core.contract.clock import SystemClock
from toren.core.contract.schedule import ScheduleDef, ScheduleSpec
from toren.store import Store

from .support import serve
from .test_browser import expect, page_with_token


async def test_the_schedules_page_shows_each_schedule(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        schedules = server.store.schedules
        now = SystemClock().now()
        await schedules.create(
            ScheduleDef("writer", "beat", ScheduleSpec(every=1), input={}), now=now
        )
        nightly = ScheduleSpec(cron="30 2 * * *", zone="Europe/Paris", overlap="buffer_one")
        await schedules.create(ScheduleDef("support", "nightly", nightly), now=now)
        await schedules.set_paused("support/nightly", True, "migration tonight", now=now)
        # An agent the newest deploy no longer has: its schedule is orphaned, with why.
        await schedules.create(ScheduleDef("gone", "old", ScheduleSpec(every=60)), now=now)
        await schedules.declare(
            [], agents=["writer", "support"], code_version="v9", started_at=now, now=now
        )
        # The one-second schedule fires in the server's worker; its runs are listed.
        deadline = now + 30
        while not await schedules.runs_of("writer/beat", limit=1):
            assert SystemClock().now() < deadline, "the schedule never fired"
            await asyncio.sleep(0.05)
        await schedules.set_paused("writer/beat", True, None, now=SystemClock().now())
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/schedules")
        beat = page.locator('[data-schedule="writer/beat"]')
        await expect(beat.locator("h2")).to_contain_text("writer/beat")
        await expect(beat.locator("dl")).to_contain_text("every 1 s")
        await expect(
            beat.get_by_role("list", name="Runs of writer/beat").locator("li").first
        ).to_contain_text("for ")
        night = page.locator('[data-schedule="support/nightly"]')
        await expect(night.locator("h2")).to_contain_text("paused")
        await expect(night).to_contain_text("Paused: migration tonight")
        await expect(night.locator("[data-overlap]")).to_have_text("buffer_one")
        await expect(night).to_contain_text("cron 30 2 * * * (Europe/Paris)")
        await expect(night).to_contain_text("No run yet.")
        old = page.locator('[data-schedule="gone/old"]')
        await expect(old.locator("h2")).to_contain_text("orphaned")
        await expect(old).to_contain_text("Orphaned: agent 'gone' is not in code version 'v9'")
        await expect(old.locator(".next")).to_have_text("– (orphaned)")
        # The nav links to it from every page.
        await page.goto(server.url + "/")
        await page.get_by_role("link", name="Schedules").click()
        await expect(page.locator("h1")).to_have_text("Schedules")
