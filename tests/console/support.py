"""A real server (uvicorn on 127.0.0.1 + an in-process worker) with demo agents, and
headless Chromium driven by Playwright, for the console's end-to-end tests and the
screenshots in docs/ (``python -m tests.console.screenshots``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import pytest

import toren
from toren.api import create_app, running_server
from toren.providers.base import CancelledWithUsage, ModelRequest, ModelResponse, ToolSpec, Usage
from toren.store import Store

TOKEN = "console-test-token-0123456789"
CHROMIUM = os.environ.get("TOREN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class DemoProvider:
    """An offline model that answers from the last user message and streams its answer in
    small chunks with a delay (so a browser can watch the tokens arrive). Like a streaming
    API (Anthropic's ``message_start``), it reports the input tokens and a first output
    token before the text: a call cut off mid-stream raises ``CancelledWithUsage``."""

    name = "demo"

    def __init__(self, chunk_delay: float = 0.0) -> None:
        self.chunk_delay = chunk_delay
        self.served = 0
        # An unset event holds every streamed answer after its first chunk until it is set:
        # a long answer in flight, for as long as a test needs one.
        self.hold: asyncio.Event | None = None

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        last = next(
            (str(m.get("content")) for m in reversed(request.messages) if m.get("role") == "user"),
            "",
        )
        text = _reply(request.model, last)
        delay = self.chunk_delay if request.model == "slow" else 0.0
        words = sum(len(str(m.get("content") or "").split()) for m in request.messages)
        usage = Usage(input_tokens=40 + words * 3, output_tokens=len(text.split()) * 2)
        if on_delta is not None:
            try:
                for i in range(0, len(text), 6):
                    on_delta(text[i : i + 6])
                    if self.hold is not None:
                        await self.hold.wait()
                    await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise CancelledWithUsage(Usage(usage.input_tokens, 1)) from None
        self.served += 1
        return ModelResponse(text=text, usage=usage, model=request.model)


def _reply(model: str, last: str) -> str:
    if "Summarize" in last:
        return "Order A-17: two items, shipped Tuesday by DHL, arriving Friday."
    if "Draft" in last:
        tone = "Hi Ada! Great news" if "friendly" in last else "Dear customer"
        return f"{tone}: your order A-17 shipped on Tuesday and arrives on Friday."
    if model == "slow":
        return (
            "Durable runs survive crashes and deploys. Every step is recorded once, "
            "replayed for free, and re-run only when the code really changed."
        )
    return f"Understood: {last[:60]}"


def price(_ref: str, usage: Usage) -> Decimal:
    return (Decimal("0.15") * usage.input_tokens + Decimal("0.60") * usage.output_tokens) / 10**6


# -- the demo agents -------------------------------------------------------------------------

PROMPT = "You are Toren's support agent. Answer from the order system only."
TONE = {"v1": "Draft a formal reply.", "v2": "Draft a friendly, warm reply."}


async def lookup_order(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL", "eta": "Friday"}


async def send_email(to: str, template: str) -> dict[str, Any]:
    return {"sent": True, "to": to, "template": template}


TOOLS = {
    "lookup_order": toren.ToolDef("lookup_order", lookup_order, ToolSpec("lookup_order")),
    "send_email": toren.ToolDef("send_email", send_email, ToolSpec("send_email")),
}


def support(version: str) -> Any:
    """Looks an order up, summarizes it in a child, drafts a reply in the tone of
    ``version``, e-mails a notice, and waits for a human's approval. v2 edits the drafting
    prompt: a run started under v1 and resumed under v2 is invalidated from that step."""

    async def main(ctx: toren.Context, input: Any) -> Any:
        question = (input or {}).get("question", "Where is my order A-17?")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": PROMPT},
            {"role": "user", "content": question},
        ]
        first = await ctx.model("demo:fast", messages)
        order = await ctx.tool("lookup_order", {"order_id": "A-17"})
        summary = await ctx.spawn("summarize", {"order": order})
        messages += [
            first.message(),
            {"role": "user", "content": f"{TONE[version]} Facts: {summary}"},
        ]
        draft = await ctx.model("demo:fast", messages)
        await ctx.tool("send_email", {"to": "ada@example.com", "template": "order-update"})
        approved = await ctx.wait_for_message("approve")
        return {"answer": draft.text, "approved": approved}

    return main


async def summarize(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model("demo:fast", [{"role": "user", "content": f"Summarize {input}"}])
    return reply.text


async def writer(ctx: toren.Context, input: Any) -> Any:
    topic = (input or {}).get("topic", "durable execution")
    reply = await ctx.model("demo:slow", [{"role": "user", "content": f"Explain {topic}"}])
    return {"answer": reply.text}


async def approval(ctx: toren.Context, input: Any) -> Any:
    await ctx.model("demo:fast", [{"role": "user", "content": "Prepare a refund of $20"}])
    decision = await ctx.wait_for_message("approve")
    return {"decision": decision}


def registry(version: str = "v1") -> toren.Registry:
    reg = toren.Registry()
    use(reg, version)
    reg.add("writer", writer, code_version="w1")
    reg.add("approval", approval, code_version="a1")
    return reg


def use(reg: toren.Registry, version: str) -> None:
    """(Re)register the support agent at ``version``: what a deploy of edited code does."""
    reg.add("support", support(version), tools=TOOLS, code_version=version)
    reg.add("support", summarize, process="summarize", code_version=version)


# -- the server ------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    store: Store
    registry: toren.Registry
    provider: DemoProvider
    runtime: toren.LocalWorkerRuntime

    async def start(self, agent: str, input: Any = None) -> str:
        run = await toren.start_run(self.store, self.registry, agent, input)
        return run.id

    async def wait_status(self, run_id: str, *statuses: str, timeout: float = 15) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            run = await self.store.get_run(run_id)
            if run is not None and run.status in statuses:
                return run
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"run {run_id} is {run and run.status}, not {statuses}")
            await asyncio.sleep(0.05)

    async def stop_worker(self, drain_window: float = 0.0) -> None:
        """Stop the in-process worker, as a reload or a shutdown does. Past the drain window
        a model call in flight is cut off: the engine records what it billed
        (``ModelCallCutOff``) and the step runs again on the next worker."""
        await self.runtime.stop(drain_window=drain_window)

    async def start_worker(self) -> None:
        """A fresh worker in place of the stopped one (the same registry, provider, pricing
        and live hub): the second half of a reload. The app still tells cancellations to
        the first worker; the fresh one learns of them by polling."""
        self.runtime = toren.LocalWorkerRuntime(replace(self.runtime.deps), concurrency=20)
        await self.runtime.start()


@contextlib.asynccontextmanager
async def serve(
    store: Store, *, tokens: tuple[str, ...] = (TOKEN,), chunk_delay: float = 0.05
) -> AsyncIterator[Server]:
    reg = registry()
    hub = toren.LiveHub()
    provider = DemoProvider(chunk_delay)
    deps = toren.TickDeps(
        store=store,
        agents=reg,  # the API resolves the same registry: `use()` swaps code for both
        providers={"demo": provider},
        live=hub,
        pricing=price,
        settings=toren.Settings(poll_interval=0.05),
    )
    runtime = toren.LocalWorkerRuntime(deps, concurrency=20)
    await runtime.start()
    served: Server | None = None
    try:
        app = create_app(store, reg, tokens=tokens, live=hub, runtime=runtime, heartbeat=1.0)
        async with running_server(app) as server:
            served = Server(server.url, store, reg, provider, runtime)
            yield served
    finally:
        await (served.runtime if served is not None else runtime).stop(drain_window=0.5)


EXPECT_TIMEOUT_MS = 20_000


@contextlib.asynccontextmanager
async def browser() -> AsyncIterator[Any]:
    """Headless Debian Chromium. Missing: a skip locally, a failure under CI=true."""
    try:
        from playwright.async_api import async_playwright, expect
    except ImportError as exc:  # pragma: no cover - depends on the machine
        _missing(f"the playwright package is not installed ({exc})")
    # Playwright's assertions wait 5 s by default: a run streaming for seconds on a machine
    # busy with the parallel suite was once still "running" after 5 s. How fast the page
    # gets there is not what these tests check; that it gets there is.
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires the browser tests: {reason}")
    pytest.skip(reason)
