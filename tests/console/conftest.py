"""Fixtures of the console's tests.

One headless Chromium serves every browser test of the session: launching it (and
Playwright's driver) costs seconds a test on a small machine, and a test gets nothing from
a fresh process that a fresh browser context does not give it (its own cookies, storage
and cache). Playwright's objects belong to the event loop they were made in, so the
browser lives in pytest-asyncio's session loop, and so do this directory's async tests
(marked below) and the store fixtures they use. Every context a test opened is closed
when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.conftest import opened_store
from toren.store import Store

from .support import browser

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    session_loop = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        if item.path.is_relative_to(HERE) and pytest_asyncio.is_async_test(item):
            item.add_marker(session_loop, append=False)


@pytest_asyncio.fixture(loop_scope="session")
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    async with opened_store(f"sqlite:///{tmp_path}/toren.db") as store:
        yield store


@pytest_asyncio.fixture(loop_scope="session")
async def store(db_url: str) -> AsyncIterator[Store]:
    """The root ``store`` fixture, in the session loop the browser tests run in."""
    async with opened_store(db_url) as s:
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _shared_chromium() -> AsyncIterator[Any]:
    async with browser() as b:
        yield b


@pytest_asyncio.fixture(loop_scope="session")
async def chromium(_shared_chromium: Any) -> AsyncIterator[Any]:
    """The session's browser, with no context left open by an earlier test; the contexts
    (and pages) this test opens are closed after it."""
    assert not _shared_chromium.contexts, "an earlier test left a browser context open"
    yield _shared_chromium
    for context in list(_shared_chromium.contexts):
        await context.close()
