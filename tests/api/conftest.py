from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from toren.store import Store

from .support import SECRET, Api, serve_api


@pytest.fixture
async def api(store: Store, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # the app must redact it everywhere
    async with serve_api(store) as running:
        yield running
