"""Retry and fork in the console, in headless Chromium, on both backends: a run failed by
a tool that raised shows its traceback; after tools.py is fixed on disk, the Retry button
completes it with 0 new requests at the loopback model server and no email sent twice;
the Fork form makes a new run that shows where it was forked from."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.cli.test_fixforward import fix_tools, outbox, three_replies, write_agents
from tests.providers.fakes import FAKE_KEY, Completion, FakeModelServer, serve_fake_models
from toren.api import create_app
from toren.api.server import running_server
from toren.runtime import close_runtime, open_runtime

from .support import TOKEN
from .test_browser import expect, page_with_token


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("DESK_OUTBOX", str(tmp_path / "outbox.jsonl"))
    with serve_fake_models() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        yield server


async def test_retry_button_and_fork_form(
    db_url: str, tmp_path: Path, fake: FakeModelServer, chromium: Any
) -> None:
    root = write_agents(tmp_path / "agents")
    runtime = await open_runtime(root, db_url, toren.Settings(poll_interval=0.05))
    try:
        worker = toren.LocalWorkerRuntime(runtime.deps)
        app = create_app(
            runtime.store, runtime.resolver, runtime=worker, tokens=[TOKEN], live=runtime.live
        )
        async with worker, running_server(app) as server:
            three_replies(fake)
            run = await toren.start_run(runtime.store, runtime.resolver, "desk", "open the desk")
            failed = await toren.wait_for_run(runtime.store, run.id, timeout=30)
            assert failed.status == "failed" and fake.openai.served == 3

            page = await page_with_token(chromium, server)
            await page.goto(f"{server.url}/runs/{run.id}")
            await expect(page.locator("#run-status")).to_have_text("failed")
            await expect(page.locator("#run-traceback")).to_contain_text("in file_report")
            await expect(page.locator("#run-traceback")).to_contain_text("NameError")
            retry = page.get_by_role("button", name="Retry run")
            await expect(retry).to_be_visible()

            fix_tools(root)
            await retry.click()
            await expect(page.locator("#run-status")).to_have_text("completed")
            await expect(page.locator("#run-output")).to_contain_text("reports")
            await expect(page.locator("#run-meta")).to_contain_text("retried 1×")
            await expect(page.locator("#retry-zone")).to_be_hidden()
            assert fake.openai.served == 3  # 0 new requests for the three recorded calls
            assert len(outbox(tmp_path)) == 2  # the emails were not sent again

            # Fork at main:4 from the form: a new run, live from there.
            fake.openai.script(Completion(text="again"))
            await page.locator("#fork-at").fill("main:4")
            await page.get_by_role("button", name="Fork run").click()
            await expect(page).not_to_have_url(f"{server.url}/runs/{run.id}")
            await expect(page).to_have_url(re.compile(r"/runs/run_"))
            await expect(page.locator("#run-meta")).to_contain_text(f"forked from run {run.id}")
            await expect(page.locator("#run-meta")).to_contain_text("at main:4")
            await expect(page.locator("#run-status")).to_have_text("completed")
            # Positions 0-3 replayed (two model calls, two emails); the third model call
            # (position 4) ran live, then the report.
            assert fake.openai.served == 4 and len(outbox(tmp_path)) == 2
            await page.locator("#forked-from").click()
            await expect(page).to_have_url(f"{server.url}/runs/{run.id}")
    finally:
        await close_runtime(runtime)
