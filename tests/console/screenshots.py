"""Regenerate the console screenshots in docs/: ``python -m tests.console.screenshots``.

Seeds a fresh SQLite database with demo runs (one invalidated by an edited prompt), serves
it, and captures the runs page and that run's page in headless Chromium."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from toren.store import connect

from .support import Server, browser, serve, use

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def seed(server: Server) -> str:
    """Runs in every state; returns the id of the run with an invalidation."""
    edited = await server.start("support", {"question": "Where is my order A-17?"})
    await server.wait_status(edited, "waiting")
    for topic in ("durable execution", "event sourcing", "replay"):
        await server.wait_status(await server.start("writer", {"topic": topic}), "completed")
    waiting = await server.start("approval", {"customer": "ada"})
    await server.wait_status(waiting, "waiting")
    done = await server.start("approval", {"customer": "bob"})
    await server.wait_status(done, "waiting")
    await server.store.send_message(done, "approve", {"ok": True}, now=0)
    await server.wait_status(done, "completed")
    cancelled = await server.start("approval", {"customer": "eve"})
    await server.wait_status(cancelled, "waiting")
    await server.store.request_cancel(cancelled, now=0)
    server.runtime.cancel_local(cancelled)
    await server.wait_status(cancelled, "cancelled")
    use(server.registry, "v2")  # deploy the edited prompt, then resume the v1 run
    await server.store.send_message(edited, "approve", {"by": "ada"}, now=0)
    await server.wait_status(edited, "completed")
    await server.wait_status(await server.start("support", {"question": "Refund?"}), "waiting")
    return edited


async def capture(page: Any, url: str, path: Path, ready: str) -> None:
    await page.goto(url)
    await page.wait_for_selector(ready)
    await page.wait_for_timeout(300)
    await page.screenshot(path=str(path), full_page=True)


async def main(out: Path = DOCS) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await connect(f"sqlite:///{tmp}/toren.db")
        try:
            async with serve(store, tokens=(), chunk_delay=0.0) as server:
                edited = await seed(server)
                async with browser() as chromium:
                    page = await chromium.new_page(viewport={"width": 1280, "height": 800})
                    await page.emulate_media(color_scheme="light", reduced_motion="reduce")
                    await capture(page, server.url + "/", out / "console-runs.png", "td.id a")
                    await capture(
                        page,
                        f"{server.url}/runs/{edited}",
                        out / "console-run.png",
                        ".invalidation .superseded",
                    )
        finally:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS))
