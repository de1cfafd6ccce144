"""The console for runs that do not move and for day-to-day use, in headless Chromium
against a real server and worker: a blocked run says why, how often and when next; the
runs table summarises and searches inputs; the Start form takes plain text; the waiting
panel shows the agent's question; replayed steps are marked; a page opened mid-stream
shows the whole partial answer; an agent's load error fits its card."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import toren
from toren.agents.readiness import missing_key_message
from toren.api import create_app, running_server
from toren.config import BlockedRetry
from toren.errors import AgentConfigError, ProviderUnavailable
from toren.providers.base import ModelRequest, ModelResponse, ToolCall, Usage
from toren.store import Store

from .support import TOKEN, DemoProvider
from .test_browser import expect, page_with_token

ANSWER = (
    "Durable runs survive crashes and deploys. Every step is recorded once, replayed for "
    "free, and re-run only when the code really changed."
)
LONG_PATH = "/srv/agents/" + "very-long-directory-name-" * 8 + "agent.yaml"


class KeyedProvider:
    """A vendor provider whose key can be taken away: without it, every call fails the
    way the real ones do when no key is configured (``ProviderUnavailable``)."""

    name = "keyed"

    def __init__(self) -> None:
        self.has_key = True
        self.attempts = 0

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        self.attempts += 1
        if not self.has_key:
            raise ProviderUnavailable(missing_key_message("openai", "openai"))
        last = str(request.messages[-1].get("content"))
        if last == "ask":  # the built-in loop's ask_human call, as it is recorded
            call = ToolCall("c1", "ask_human", {"question": "Which city are you flying to?"})
            return ModelResponse(text="", tool_calls=(call,), usage=Usage(5, 5))
        return ModelResponse(text=f"answer to {last}", usage=Usage(5, 5))


async def asker(ctx: toren.Context, input: Any) -> Any:
    await ctx.model("keyed:m", [{"role": "user", "content": "ask"}])
    city = await ctx.wait_for_message("human")
    reply = await ctx.model("keyed:m", [{"role": "user", "content": str(city)}])
    return {"answer": reply.text}


async def echo(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model("keyed:m", [{"role": "user", "content": str(input)}])
    return {"answer": reply.text}


async def writer(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model("demo:slow", [{"role": "user", "content": "Explain it"}])
    return {"answer": reply.text}


class WithBroken:
    """The registry, plus an agent that does not load (a long error, as real ones are)."""

    def __init__(self, reg: toren.Registry) -> None:
        self.reg = reg

    def names(self) -> list[str]:
        return [*self.reg.names(), "broken"]

    def resolve(self, agent: str, process: str) -> Any:
        if agent == "broken":
            raise AgentConfigError(
                f"{LONG_PATH}: at 'tools[0]': found 'lookup_order_in_the_warehouse_system', "
                "which tools.py does not define; expected one of: "
                + ", ".join(f"tool_number_{i}_with_a_long_name" for i in range(12))
            )
        return self.reg.resolve(agent, process)


@dataclass
class Server:
    url: str
    store: Store
    registry: toren.Registry
    keyed: KeyedProvider
    hub: toren.LiveHub


@contextlib.asynccontextmanager
async def serve(store: Store) -> AsyncIterator[Server]:
    reg = toren.Registry()
    reg.add("asker", asker)
    reg.add("echo", echo)
    reg.add("writer", writer)
    hub = toren.LiveHub()
    keyed = KeyedProvider()
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"keyed": keyed, "demo": DemoProvider(chunk_delay=0.25)},
        live=hub,
        # No sticky cache: a resumed run replays its steps, and the page marks them
        # (a run the worker continues in place replays nothing; tests/core/test_sticky.py).
        settings=toren.Settings(
            poll_interval=0.05,
            blocked_retry=BlockedRetry(first=0.5, maximum=1.0),
            sticky_cache_mb=0,
        ),
    )
    runtime = toren.LocalWorkerRuntime(deps, concurrency=10)
    await runtime.start()
    try:
        app = create_app(
            store, WithBroken(reg), tokens=(TOKEN,), live=hub, runtime=runtime, heartbeat=1.0
        )
        async with running_server(app) as server:
            yield Server(server.url, store, reg, keyed, hub)
    finally:
        await runtime.stop(drain_window=0.5)


async def _until(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_blocked_run_shows_why_and_completes_once_the_key_is_back(
    store: Store, chromium: Any
) -> None:
    """On SQLite and PostgreSQL."""
    async with serve(store) as server:
        server.keyed.has_key = False
        run = await toren.start_run(store, server.registry, "echo", "hello")

        async def blocked_twice() -> bool:
            row = await store.get_run(run.id)
            return row is not None and row.blocked_attempts >= 2

        await _until(blocked_twice, "two failed attempts")
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/")
        row = page.locator(f'tr[data-run-id="{run.id}"]')
        await expect(row.locator(".blocked")).to_have_text(re.compile(r"blocked ×\d+"))
        await page.goto(f"{server.url}/runs/{run.id}")
        box = page.locator("#run-blocked")
        await expect(box).to_be_visible()
        await expect(box).to_contain_text(
            "blocked: no OpenAI API key — set OPENAI_API_KEY or `api_key_env`"
        )
        await expect(box).to_contain_text(re.compile(r"attempt \d+ · next try \d\d:\d\d:\d\d"))
        await expect(page.locator("#run-meta")).not_to_contain_text("recovered from a dead")

        server.keyed.has_key = True  # the key is back: the next try completes the run
        await expect(page.locator("#run-status")).to_have_text("completed", timeout=15_000)
        await expect(box).to_be_hidden()
        await expect(page.locator("#run-output")).to_contain_text("answer to hello")


async def test_day_to_day_console(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        page = await page_with_token(chromium, server)

        # The Start form: a default the built-in loop takes, and plain text accepted.
        await page.goto(server.url + "/")
        await page.get_by_text("Start a run").click()
        field = page.get_by_label("Input (JSON)")
        await expect(field).to_have_value('{"message": "Hello"}')
        await page.locator("#start-agent").select_option("echo")
        await field.fill("What is the weather in Paris?")
        await page.get_by_role("button", name="Start run").click()
        started = page.locator("#start-status a")
        await expect(started).to_have_text(re.compile(r"^run_"))
        paris = await started.text_content()
        stored = await sqlite_store.get_run(str(paris))
        assert stored is not None and stored.input == "What is the weather in Paris?"
        await field.fill('{"message": "Where is order A-17?"}')
        await page.get_by_role("button", name="Start run").click()
        await expect(started).not_to_have_text(str(paris))
        order = await started.text_content()
        await field.fill('{"message": "broken')  # meant as JSON: refused, not guessed
        await page.get_by_role("button", name="Start run").click()
        await expect(page.locator("#start-status")).to_contain_text("not valid JSON")

        # The runs table summarises each input and searches by it.
        rows = page.locator("#runs-body tr")
        await expect(page.locator(f'tr[data-run-id="{paris}"] .input-summary')).to_have_text(
            "What is the weather in Paris?"
        )
        await expect(page.locator(f'tr[data-run-id="{order}"] .input-summary')).to_have_text(
            "Where is order A-17?"
        )
        await page.get_by_label("Input contains").fill("PARIS")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run-id", str(paris))
        await page.get_by_label("Input contains").fill("")
        await expect(page.locator(f'tr[data-run-id="{order}"]')).to_have_count(1)

        # The waiting panel shows the question the agent asked.
        asking = await toren.start_run(sqlite_store, server.registry, "asker", "Plan a trip")

        async def waiting() -> bool:
            row = await sqlite_store.get_run(asking.id)
            return row is not None and row.status == "waiting"

        await _until(waiting, "the question")
        await page.goto(f"{server.url}/runs/{asking.id}")
        await expect(page.locator("#waiting-question")).to_have_text(
            "The agent asks: Which city are you flying to?"
        )
        await expect(page.locator("[data-waiting]")).to_contain_text(
            "the agent asks “Which city are you flying to?”"
        )
        # Answered from the page: the recorded question is replayed, and marked so.
        await page.get_by_label("Payload").fill('"Lisbon"')
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#run-status")).to_have_text("completed")
        first = page.locator('.stream[data-stream="main"] .step[data-pos="0"]')
        await expect(first.locator(".badge.replayed")).to_have_text("↺ replayed")
        later = page.locator('.stream[data-stream="main"] .step[data-pos="2"]')
        await expect(later).to_contain_text("answer to Lisbon")
        await expect(later.locator(".badge.replayed")).to_have_count(0)

        # A page opened while a step streams shows the answer from its first word.
        writing = await toren.start_run(sqlite_store, server.registry, "writer", None)

        async def streaming() -> bool:  # several chunks are out before the page opens
            return any(len(text) >= 24 for _, _, text in server.hub.partial(writing.id))

        await _until(streaming, "the writer to stream")
        await page.goto(f"{server.url}/runs/{writing.id}")
        live = page.locator(".step.pending .live-delta")
        await expect(live).to_have_text(re.compile(r"^Durable runs survive"))
        # Who holds the run, and until when.
        await expect(page.locator("#run-lease")).to_have_text(
            re.compile(r"^held by worker \S+ until \d\d:\d\d:\d\d$")
        )

        # An agent's load error fits its card (no horizontal overflow, nothing cut).
        await page.set_viewport_size({"width": 900, "height": 800})
        await page.goto(server.url + "/agents")
        error = page.locator(".cards .error")
        await expect(error).to_contain_text("very-long-directory-name-")
        fits = await error.evaluate(
            "e => e.scrollWidth <= e.clientWidth + 1 && "
            "e.closest('li').getBoundingClientRect().right <= window.innerWidth"
        )
        assert fits
