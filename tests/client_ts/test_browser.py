"""``@toren-run/client`` in a real browser: headless Chromium (Playwright, as the console's
tests) loads ``clients/typescript/examples/browser.html`` from the API's own origin, with
the built package and eventsource-parser beside it, starts a run, streams its tokens and
events, sends the message the run waits for, and shows the outcome. What the page showed
is compared with the run's event log."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import FileResponse

import toren
from tests.api.support import TOKEN, registry, worker
from tests.client_ts.openapi import PACKAGE
from tests.client_ts.support import ensure_built
from tests.console.support import browser
from toren.api import create_app, running_server
from toren.store import Store, connect

PAGE = PACKAGE / "examples" / "browser.html"
# Both files build the package in clients/typescript (dist/, .build/, node_modules/):
# one process, one after the other, under pytest-xdist.
pytestmark = pytest.mark.xdist_group("clients_typescript")

MIME = {".js": "text/javascript", ".html": "text/html"}


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await connect(f"sqlite:///{tmp_path}/toren.db")
    try:
        yield store
    finally:
        await store.close()


def _serve_example(app: FastAPI) -> None:
    """The page at /example/browser.html, the package's dist/ at /example/client/ and
    eventsource-parser at /example/eventsource-parser/, on the API's origin: exactly these
    files, public (the page itself holds no secret; the API still needs the token)."""
    files = {"/example/browser.html": PAGE}
    for path in (PACKAGE / "dist").rglob("*.js"):
        files[f"/example/client/{path.relative_to(PACKAGE / 'dist').as_posix()}"] = path
    parser = PACKAGE / "node_modules" / "eventsource-parser" / "dist" / "index.js"
    files["/example/eventsource-parser/index.js"] = parser

    async def static(request: Any) -> FileResponse:
        path = files[request.url.path]
        return FileResponse(path, media_type=MIME[path.suffix])

    for url in files:
        app.add_route(url, static, methods=["GET"])
    app.state.toren.public_paths.update(files)


async def test_the_example_page_streams_a_run_in_chromium(sqlite_store: Store) -> None:
    ensure_built()
    from playwright.async_api import expect

    hub = toren.LiveHub()
    async with worker(sqlite_store, hub) as runtime, browser() as chromium:
        app = create_app(sqlite_store, registry(), tokens=[TOKEN], live=hub, runtime=runtime)
        _serve_example(app)
        async with running_server(app) as server:
            page = await chromium.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(f"{server.url}/example/browser.html#token={TOKEN}")
            await page.get_by_label("Agent").fill("approval")
            await page.get_by_role("button", name="Start").click()

            # The run drafts (one model call), then waits for "approve": the page offers it.
            reply = page.locator("#reply")
            await expect(reply).to_be_visible()
            await expect(page.get_by_label("Message")).to_have_value("approve")
            await page.get_by_label("Payload").fill('{"ok": true}')
            await page.get_by_role("button", name="Send").click()
            status = page.locator("#status")
            await expect(status).to_have_attribute("data-status", "completed")

            text = await status.text_content() or ""
            run_id = text.split(":")[0]
            assert json.loads(text.split(" completed ", 1)[1]) == {"decision": {"ok": True}}
            shown = await page.locator("#events li").evaluate_all(
                "items => items.map(li => [Number(li.dataset.seq), li.textContent])"
            )
            log = await sqlite_store.load_events(run_id, after_seq=0, limit=1000)
            assert shown == [[e.seq, f"{e.seq} {e.type}"] for e in log]
            # Both answers of the scripted echo model, and the second one (generated after the
            # page saw RunWaiting, so while its stream was open) arrived as token deltas.
            tokens = await page.locator("#tokens").text_content()
            assert tokens == "draft a refund\ndecided {'ok': True}\n"
            deltas = int(await page.locator("#tokens").get_attribute("data-deltas") or 0)
            assert deltas >= len(re.findall(".{1,8}", "decided {'ok': True}"))
            assert errors == []
