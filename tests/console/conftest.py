from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from toren.store import Store, connect

from .support import browser


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await connect(f"sqlite:///{tmp_path}/toren.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    async with browser() as b:
        yield b
