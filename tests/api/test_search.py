"""``GET /v1/runs?search=``: found through the database's text index over each run's
redacted search text (docs/http-api.md#search), never over what runs store. On SQLite and
PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from toren.store import Store

from .support import SECRET, serve_api

# A password the server knows as a secret (``secrets=``) and a provider key (the
# OPENAI_API_KEY the ``api`` fixture sets): responses show both as [redacted].
PASSWORD = "Zq8Xv3Kp9Wm2Yt7R"


async def _search(http: httpx.AsyncClient, query: str) -> list[str]:
    response = await http.get("/v1/runs", params={"search": query})
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()["runs"]]


async def _until_found(http: httpx.AsyncClient, query: str, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while run_id not in await _search(http, query):
        assert time.monotonic() < deadline, f"{query!r} never found {run_id}"
        await asyncio.sleep(0.05)


async def test_the_secret_oracle_gives_no_signal(store: Store, monkeypatch: Any) -> None:
    """The attack of issue 34: a known prefix of a secret, extended one character at a
    time, finds no run for any extension (the stored input holds both secrets whole),
    while ordinary words of the input, the output and the error still find their runs."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    async with serve_api(store, secrets=[PASSWORD], search_interval=0.05) as api:
        note = f"the password is {PASSWORD} and the key {SECRET}; marmalade-order 42"
        run = await api.client.start_run("echo", {"n": 1, "note": note})
        leaky = await api.client.start_run("leaky", {"why": "refunds"})
        await api.client.wait(run.id)
        failed = await api.client.wait(leaky.id)
        assert SECRET not in str(failed.error) and "[redacted]" in str(failed.error)
        async with api.http() as http:
            await _until_found(http, "something", run.id)  # a word of the output
            await _until_found(http, "refused", leaky.id)  # a word of the error
            assert await _search(http, "marmalade") == [run.id]  # of the input
            assert await _search(http, '"marmalade order 42"') == [run.id]
            assert await _search(http, "marmalade-order") == [run.id]
            assert await _search(http, "MARMA*") == [run.id]
            assert await _search(http, "marmalade refunds") == []  # every word must match
            assert set(await _search(http, "redacted")) == {run.id, leaky.id}
            probes = [PASSWORD[:k] for k in range(1, len(PASSWORD) + 1)]
            known = len("sk-test-")
            probes += [SECRET[:k] for k in range(known + 1, len(SECRET) + 1)]
            # The key's unknown part on its own ("S" alone is a word of other text).
            probes += [SECRET[known:k] for k in range(known + 2, len(SECRET) + 1)]
            for probe in probes:
                for query in (probe, f"{probe}*", f'"{probe}"*'):
                    assert await _search(http, query) == [], query


async def test_a_search_without_letters_or_digits_finds_nothing(store: Store) -> None:
    async with serve_api(store, search_interval=0.05) as api:
        run = await api.client.start_run("echo", {"n": 1, "note": "100% sure"})
        await api.client.wait(run.id)
        async with api.http() as http:
            await _until_found(http, "100", run.id)
            for query in ("%", "***", '""', "_"):
                assert await _search(http, query) == [], query


async def test_a_secret_straddling_the_preview_cut_shows_in_no_prefix(
    store: Store, monkeypatch: Any
) -> None:
    """A list's ``input_summary.preview`` is the first 256 characters of a large input's
    JSON text; wherever that cut falls in a secret or a key shape, no part of it shows."""
    key = "sk-proj-QJxW7v0q9ZzY2x5KbNNu"
    async with serve_api(store, secrets=[PASSWORD], search_interval=60) as api:
        ids = []
        for secret in (PASSWORD, key):
            for pad in range(220, 260):
                big = {"n": 0, "pad": "a" * pad + " " + secret + " " + "b" * 5000}
                ids.append((secret, (await api.client.start_run("slow", big)).id))
        async with api.http() as http:
            listed = (await http.get("/v1/runs", params={"limit": 200})).json()["runs"]
        previews = {r["id"]: r["input_summary"]["preview"] for r in listed}
        for secret, run_id in ids:
            preview = previews[run_id]
            assert secret[:3] not in preview, preview
            for k in range(1, len(secret)):
                assert not preview.endswith(secret[:k]), (k, preview)
