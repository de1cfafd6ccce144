"""The console end to end: headless Chromium against a real server and worker."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from toren.store import Store

from .support import TOKEN, Server, serve, use

WAIT = 10_000  # ms


def expect(locator: Any) -> Any:
    from playwright.async_api import expect as pw_expect

    return pw_expect(locator)


async def page_with_token(chromium: Any, server: Server, **options: Any) -> Any:
    """A page of a fresh browser context that already holds the token in sessionStorage
    (as the token page leaves it), with a log of every URL it requested."""
    context = await chromium.new_context(**options)
    await context.add_init_script(f"sessionStorage.setItem('toren.token', {json.dumps(TOKEN)})")
    page = await context.new_page()
    page.set_default_timeout(WAIT)
    page.requested = []
    page.on("request", lambda r: page.requested.append((r.url, r.headers.get("authorization"))))
    return page


def assert_token_never_in_a_url(page: Any) -> None:
    assert page.requested
    assert not [url for url, _ in page.requested if TOKEN in url]


async def test_start_a_run_watch_it_complete_live_and_stream_tokens(
    store: Store, chromium: Any
) -> None:
    """On SQLite and PostgreSQL: start a run from the runs page's form, watch its row go
    from running to completed without a reload, then open a second run while its model
    call streams and see the token deltas arrive before the recorded step and the output."""
    async with serve(store, chunk_delay=0.08) as server:
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/")
        await page.evaluate("window.__sameDocument = true")
        await page.get_by_text("Start a run").click()
        await page.locator("#start-agent").select_option("writer")
        await page.get_by_label("Input (JSON)").fill('{"topic": "replay"}')
        await page.get_by_role("button", name="Start run").click()
        started = page.locator("#start-status a")
        await expect(started).to_have_text(re.compile(r"^run_"))
        run_id = await started.text_content()
        row = page.locator(f'tr[data-run-id="{run_id}"]')
        await expect(row.locator(".pill")).to_have_text(re.compile("queued|running"))
        await expect(row.locator(".pill")).to_have_text("completed")
        assert await page.evaluate("window.__sameDocument")  # updated live, not reloaded
        await expect(row).to_contain_text("writer")
        await expect(page.locator("#t-status")).to_contain_text("1 completed")

        # A second run, opened while it streams: deltas show up, then the recorded step.
        await page.get_by_label("Input (JSON)").fill('{"topic": "deltas"}')
        await page.get_by_role("button", name="Start run").click()
        await expect(started).not_to_have_text(run_id)
        second = await started.text_content()
        await started.click()
        await expect(page).to_have_url(f"{server.url}/runs/{second}")
        live = page.locator(".step.pending .live-delta")
        await expect(live).to_have_text(re.compile(r"\S"))
        streamed = await live.text_content()
        await expect(live).not_to_have_text(streamed)  # it grows as tokens arrive
        assert streamed and len(streamed) < 120  # seen mid-stream, not only the final text
        step = page.locator('.stream[data-stream="main"] .step[data-kind="model"]')
        await expect(step).to_contain_text("demo:slow")
        await expect(page.locator("#run-status")).to_have_text("completed")
        await expect(page.locator(".step.pending")).to_have_count(0)
        await expect(page.locator("#run-output")).to_contain_text("re-run only when the code")
        await expect(step.locator(".facts")).to_contain_text("tok")
        await expect(step.locator(".digest")).to_have_attribute(
            "title", re.compile("^[0-9a-f]{64}$")
        )
        assert_token_never_in_a_url(page)


async def test_an_edited_prompt_shows_the_superseded_suffix_and_the_digests(
    sqlite_store: Store, chromium: Any
) -> None:
    """A run recorded under v1 waits for approval; v2 edits the drafting prompt; the
    approval sent from the page resumes it under v2, and the page shows, live, the
    invalidation at step #3 with both digests, the greyed superseded v1 steps, the new
    steps, the e-mail tool call reused (not sent twice), and the child stream nested."""
    async with serve(sqlite_store) as server:
        run_id = await server.start("support", {"question": "Where is my order A-17?"})
        await server.wait_status(run_id, "waiting")
        use(server.registry, "v2")  # deploy the edited prompt

        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        await expect(page.locator("#run-status")).to_have_text("waiting")
        await expect(page.locator("[data-waiting]")).to_contain_text("“approve”")
        child = page.locator('.stream[data-stream="main"] .children .stream[data-stream="main/2"]')
        await expect(child).to_contain_text("Order A-17: two items")
        await expect(page.get_by_label("Name")).to_have_value("approve")
        await page.get_by_label("Payload").fill('{"by": "ada"}')
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#msg-status")).to_contain_text("Message sent")

        await expect(page.locator("#run-status")).to_have_text("completed")
        inv = page.locator('.stream[data-stream="main"] > .steps > .invalidation')
        await expect(inv).to_have_count(1)
        await expect(inv).to_contain_text("Invalidated from #3")
        await expect(inv).to_contain_text("the request changed")
        # Which part of the request changed, not only the two digests: v2 edited the
        # drafting instruction, the conversation's message 3.
        await expect(inv.get_by_role("list", name="What changed")).to_have_text(
            "message 3 (user) changed"
        )
        (event,) = [
            e for e in await sqlite_store.load_events(run_id) if e.type == "StreamInvalidated"
        ]
        digests = inv.locator(".inv-digests .digest")
        await expect(digests.nth(0)).to_have_attribute("title", event.payload.expected_digest)
        await expect(digests.nth(1)).to_have_attribute("title", event.payload.actual_digest)
        await digests.nth(0).click()  # expands to the full digest
        await expect(digests.nth(0)).to_have_text(event.payload.expected_digest)

        old = inv.locator(".superseded .step")
        await expect(old).to_have_count(2)
        await expect(old.nth(0)).to_contain_text("Dear customer")  # v1's draft, greyed
        await expect(old.nth(1)).to_contain_text("send_email")
        await expect(old.nth(0)).to_have_css("opacity", re.compile(r"^0(\.\d+)?$"))  # greyed

        new = page.locator('.stream[data-stream="main"] > .steps > .step')
        await expect(new.locator("> .step-row > .pos")).to_have_text(
            ["#0", "#1", "#2", "#3", "#4", "#5"]
        )
        await expect(new.nth(3)).to_contain_text("Hi Ada! Great news")
        await expect(new.nth(3).locator(".digest")).to_have_attribute(
            "title", event.payload.actual_digest
        )
        await expect(new.nth(4).locator(".badge.reused")).to_contain_text("reused result")
        await expect(new.nth(5)).to_contain_text("“approve”")
        # Both counts say what they count (issue 40 item 10): the run's every recorded
        # step, superseded ones included; the stream's current steps.
        run = await sqlite_store.get_run(run_id)
        steps = page.locator("#s-steps")
        await expect(page.locator("dt", has_text="Steps recorded")).to_be_visible()
        assert run is not None and run.steps > 6  # the superseded v1 steps count here
        await expect(steps).to_have_text(str(run.steps))
        heading = page.locator('.stream[data-stream="main"] > h3')
        await expect(heading).to_contain_text("6 current steps")
        await expect(page.locator("#run-output")).to_contain_text("Hi Ada! Great news")
        await expect(page.locator("#controls")).to_be_hidden()

        # The request behind a model call, read from the content-addressed history.
        await new.nth(3).get_by_text("Details").click()
        await new.nth(3).get_by_role("button", name=re.compile("Show the request")).click()
        await expect(new.nth(3).locator(".msg.system")).to_contain_text("support agent")
        await expect(new.nth(3).locator(".msg.user").last).to_contain_text("friendly, warm")
        assert_token_never_in_a_url(page)


async def test_send_a_message_to_a_waiting_run(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        run_id = await server.start("approval", {"customer": "ada"})
        await server.wait_status(run_id, "waiting")
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        await expect(page.locator("#waiting-hint")).to_contain_text("waiting for “approve”")
        payload = page.get_by_label("Payload")
        await payload.fill("{approved: yes}")
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#msg-status")).to_contain_text("not valid JSON")
        await expect(payload).to_have_attribute("aria-invalid", "true")
        assert (await server.store.get_run(run_id)).status == "waiting"  # nothing was sent

        await payload.fill('{"approved": true, "by": "ada"}')
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#msg-status")).to_contain_text("Message sent")
        await expect(page.locator("#run-status")).to_have_text("completed")
        await expect(page.locator("#run-output")).to_contain_text('"approved": true')
        received = page.locator('.step[data-kind="message"]')
        await expect(received).to_contain_text("message “approve”")
        run = await server.store.get_run(run_id)
        assert run.output == {"decision": {"approved": True, "by": "ada"}}


async def test_a_plain_text_message_is_sent_as_a_string_under_the_name_waited_for(
    sqlite_store: Store, chromium: Any
) -> None:
    """Issue 40 item 7: as the start form and `toren runs send` do, text that is not JSON
    is a string; the name is pre-filled with the one the run waits for; a name it does not
    wait for is kept, and the page says which names it waits for."""
    async with serve(sqlite_store) as server:
        run_id = await server.start("approval", {"customer": "ada"})
        await server.wait_status(run_id, "waiting")
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        name = page.get_by_label("Name")
        await expect(name).to_have_value("approve")
        await name.fill("aprove")
        await page.get_by_label("Payload").fill("not yet")
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#msg-status")).to_contain_text(
            "is waiting for 'approve', not 'aprove'"
        )
        await name.fill("approve")
        await page.get_by_label("Payload").fill("Yes please")
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#msg-status")).to_contain_text("Message sent")
        await expect(page.locator("#run-status")).to_have_text("completed")
        run = await server.store.get_run(run_id)
        assert run.output == {"decision": "Yes please"}


async def test_cancel_a_run(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        run_id = await server.start("approval", {"customer": "eve"})
        await server.wait_status(run_id, "waiting")
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        cancel = page.get_by_role("button", name="Cancel run")
        await cancel.click()  # the first click only arms the button
        await expect(page.get_by_role("button", name="Click again to cancel")).to_be_visible()
        assert not (await server.store.get_run(run_id)).cancel_requested
        await page.get_by_role("button", name="Click again to cancel").click()
        await expect(page.locator("#cancel-status")).to_have_text("Cancellation requested.")
        await expect(page.locator("#run-status")).to_have_text("cancelled")
        await expect(page.locator("#controls")).to_be_hidden()
        assert (await server.store.get_run(run_id)).status == "cancelled"


async def test_token_page_with_auth_on(sqlite_store: Store, chromium: Any) -> None:
    """Without a token a page redirects to the token page; a wrong token is refused; the
    right one is kept in sessionStorage only, sent as a header, never in a URL."""
    async with serve(sqlite_store) as server:
        run_id = await server.start("writer", {"topic": "auth"})
        await server.wait_status(run_id, "completed")
        context = await chromium.new_context()
        page = await context.new_page()
        page.set_default_timeout(WAIT)
        requested: list[tuple[str, str | None]] = []
        page.on("request", lambda r: requested.append((r.url, r.headers.get("authorization"))))

        await page.goto(f"{server.url}/runs/{run_id}")
        await expect(page).to_have_url(re.compile(r"/login\?next=%2Fruns%2F"))
        await page.get_by_label("API token").fill("wrong-token")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#login-status")).to_contain_text("not accepted")

        await page.get_by_label("API token").fill(TOKEN)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page).to_have_url(f"{server.url}/runs/{run_id}")  # back where it was
        await expect(page.locator("#run-status")).to_have_text("completed")
        assert await page.evaluate("sessionStorage.getItem('toren.token')") == TOKEN
        assert await page.evaluate("localStorage.getItem('toren.token')") is None
        assert not [url for url, _ in requested if TOKEN in url or "wrong-token" in url]
        api_calls = [auth for url, auth in requested if "/v1/runs/" in url]
        assert api_calls and all(auth == f"Bearer {TOKEN}" for auth in api_calls[-2:])
        cookies = await context.cookies()
        assert cookies == []  # no session cookie: the token travels only as a header

        await page.get_by_role("button", name="Sign out").click()
        await expect(page).to_have_url(f"{server.url}/login")
        assert await page.evaluate("sessionStorage.getItem('toren.token')") is None
        await context.close()


async def test_loopback_dev_without_tokens_needs_no_sign_in(
    sqlite_store: Store, chromium: Any
) -> None:
    async with serve(sqlite_store, tokens=()) as server:
        await server.wait_status(await server.start("writer", {}), "completed")
        page = await chromium.new_page()
        page.set_default_timeout(WAIT)
        await page.goto(server.url + "/")
        await expect(page.locator("#runs-body .pill")).to_have_text(["completed"])
        await page.goto(server.url + "/login")
        await expect(page.locator("#login-status")).to_contain_text("no sign-in needed")
        await page.close()


async def test_replay_plan_view(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        run_id = await server.start("support", {})
        await server.wait_status(run_id, "waiting")
        clean = await server.start("approval", {})
        await server.wait_status(clean, "waiting")
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/plan")
        await expect(page.locator("#p-runs")).to_have_text("2")
        await expect(page.locator("#p-inval")).to_have_text("0")
        use(server.registry, "v2")
        await page.get_by_role("button", name="Re-plan").click()
        await expect(page.locator("#p-inval")).to_have_text("1")
        card = page.get_by_role("article", name=re.compile(f"{run_id}: would be invalidated"))
        await expect(card.locator(".finding")).to_contain_text("#3")
        await expect(card.locator(".finding")).to_contain_text("digest mismatch")
        await expect(card.locator(".finding")).to_contain_text("2 steps, 1 model call")
        await expect(card.get_by_role("list", name="What changed")).to_have_text(
            "message 3 (user) changed"
        )
        await expect(page.get_by_role("article", name=f"{clean}: replays cleanly")).to_be_visible()
        assert (await server.store.get_run(run_id)).invalidations == 0  # planning wrote nothing


async def test_narrow_screen_and_accessible_markup(sqlite_store: Store, chromium: Any) -> None:
    async with serve(sqlite_store) as server:
        await server.wait_status(await server.start("writer", {}), "completed")
        run_id = await server.start("support", {})
        await server.wait_status(run_id, "waiting")
        page = await page_with_token(chromium, server, viewport={"width": 375, "height": 740})
        for path, ready in (("/", "td.id a"), (f"/runs/{run_id}", ".step"), ("/agents", "h2")):
            await page.goto(server.url + path)
            await page.locator(ready).first.wait_for()
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 375, (path, width)  # no horizontal scrolling on a phone
            assert await page.locator("header.top").count() == 1
            assert await page.locator("main#main").count() == 1
            unlabelled = await page.evaluate(
                """() => [...document.querySelectorAll('input, select, textarea, button')]
                    .filter(e => !e.closest('[hidden]'))
                    .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                                 && !e.textContent.trim())
                    .map(e => e.outerHTML)"""
            )
            assert unlabelled == [], (path, unlabelled)
        await expect(page.locator("#announcer")).to_have_attribute("aria-live", "polite")
        # Keyboard: the start link of an agent is reachable and opens the prefilled form.
        await page.get_by_role("link", name="Start support main").focus()
        await page.keyboard.press("Enter")
        await expect(page.locator("#start-panel")).to_have_attribute("open", "")
        await expect(page.locator("#start-agent")).to_have_value("support")


async def test_a_run_of_ten_thousand_steps_renders_only_a_window(
    sqlite_store: Store, chromium: Any
) -> None:
    """The timeline of a 10,000-step run shows its newest 200 steps and a button for
    earlier ones, not 10,000 list items; the button shows 200 more each time."""
    import time

    from toren.core.contract.events import RunCompleted, ValueRecorded, make_event
    from toren.core.contract.replay import step_slot
    from toren.core.drivers.runs import start_run
    from toren.store.sql import INSERT_EVENT, event_params

    from .support import registry

    run = await start_run(sqlite_store, registry(), "writer", {"topic": "long"})
    now = time.time()
    events = [
        make_event(
            run.id,
            ValueRecorded(what="random", value=i),
            stream="main",
            position=i,
            slot=step_slot("main", 0, i),
            digest=f"{i:064x}",
            created_at=now,
        )
        for i in range(10_000)
    ]
    events.append(make_event(run.id, RunCompleted(output={"n": 10_000}), slot="run:end"))
    sql_store: Any = sqlite_store

    def write(cur: Any) -> None:
        cur.executemany(INSERT_EVENT, [event_params(e) for e in events])
        cur.execute(
            "UPDATE runs SET status = 'completed', output = ?, steps = ? WHERE id = ?",
            ('{"n": 10000}', 10_000, run.id),
        )

    await sql_store._run(write)
    async with serve(sqlite_store) as server:
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run.id}")
        main = page.locator('.stream[data-stream="main"]')
        await expect(main.locator("h3")).to_contain_text("10000 current steps", timeout=60_000)
        await expect(page.locator("#timeline-legend")).to_contain_text("10002 events")
        await expect(main.locator(".step[data-kind]")).to_have_count(200)
        earlier = main.locator(".step.earlier")
        await expect(earlier).to_contain_text("9800 earlier steps not shown")
        await expect(main.locator(".step[data-kind] .pos").last).to_have_text("#9999")
        await expect(main.locator(".step[data-kind] .pos").first).to_have_text("#9800")
        await earlier.get_by_role("button", name="Show 200 earlier steps").click()
        await expect(main.locator(".step[data-kind]")).to_have_count(400)
        await expect(main.locator(".step[data-kind] .pos").first).to_have_text("#9600")
        await expect(earlier).to_contain_text("9600 earlier steps not shown")


async def test_a_model_call_cut_off_in_flight_is_shown_and_its_cost_explained(
    store: Store, chromium: Any
) -> None:
    """On SQLite and PostgreSQL: a reload past its drain window (the worker stopped with no
    window, a fresh one started) cuts the writer's model call off mid-stream. The engine
    records it as ``ModelCallCutOff``, a run-level event billed and counted in the run's
    cost, and the step runs again. The page, watching live, drops the call's streaming row
    and shows the cut-off call greyed at main #0, with its model, tokens, cost, latency,
    reason and details, before the recorded call of #0; the header's cost is the sum of
    the costs the timeline shows."""
    from decimal import Decimal

    async with serve(store) as server:
        server.provider.hold = asyncio.Event()  # the answer stalls after its first chunk
        run_id = await server.start("writer", {"topic": "reloads"})
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        main = page.locator('.stream[data-stream="main"]')
        await expect(main.locator(".step.pending .live-delta")).to_have_text(re.compile(r"\S"))

        await server.stop_worker()  # the drain window is over: the call is cut off
        [cut_event] = [e for e in await store.load_events(run_id) if e.type == "ModelCallCutOff"]
        cut = cut_event.payload
        assert (cut.stream, cut.position, cut.input_tokens, cut.output_tokens) == ("main", 0, 46, 1)
        assert Decimal(cut.cost_usd) > 0
        row = main.locator("> .steps > .step.cut-off")
        await expect(row).to_have_count(1)
        await expect(page.locator("#announcer")).to_contain_text("cut off")
        await expect(main.locator(".step.pending")).to_have_count(0)  # its text ended there
        await expect(main.locator("h3")).to_contain_text("0 current steps · 1 model call cut off")

        server.provider.hold.set()
        await server.start_worker()  # the step runs again on the next worker
        await expect(page.locator("#run-status")).to_have_text("completed")
        steps = main.locator("> .steps > .step")
        await expect(steps.locator("> .step-row > .pos")).to_have_text(["#0", "#0"])
        await expect(steps.nth(0)).to_have_attribute("data-cut-off", "")
        await expect(steps.nth(1)).to_have_attribute("data-kind", "model")
        await expect(steps.nth(1)).not_to_have_class(re.compile("cut-off"))
        await expect(main.locator("h3")).to_contain_text("1 current step · 1 model call cut off")
        await expect(page.locator("#timeline-legend")).to_contain_text("1 model call cut off")

        await expect(row.locator(".badge.cut")).to_have_text("✂ cut off")
        await expect(row.locator(".name")).to_have_text("demo:slow")
        await expect(row).to_contain_text(cut.reason)
        await expect(row).to_have_css("opacity", re.compile(r"^0(\.\d+)?$"))  # greyed
        facts = row.locator(".facts > span")
        await expect(facts.nth(0)).to_have_text(re.compile(r"^(<1 ms|\d+ ms|\d+\.\d+ s)$"))
        await expect(facts.nth(1)).to_have_text("46 → 1 tok")
        await expect(row.locator(".cost")).to_have_attribute("title", f"${cut.cost_usd} exactly")
        [recorded] = [e for e in await store.load_events(run_id) if e.type == "ModelCallRecorded"]
        assert cut.request_digest == recorded.digest  # the same request, sent again
        await expect(row.locator(".digest")).to_have_attribute("title", cut.request_digest)
        await row.get_by_text("Details").click()
        await expect(row.locator("details")).to_contain_text("after the provider had reported")
        await expect(row.locator("details")).to_contain_text(f'"cost_usd": "{cut.cost_usd}"')

        # Every cost in the header has its row: the timeline's costs add up to the total.
        final = await store.get_run(run_id)
        shown = await page.locator("#timeline .cost").evaluate_all("els => els.map((e) => e.title)")
        costs = [Decimal(t.removeprefix("$").removesuffix(" exactly")) for t in shown]
        assert costs == [Decimal(cut.cost_usd), Decimal(recorded.payload.cost_usd)]
        assert sum(costs) == final.cost_usd
        total = await page.locator("#s-cost").get_attribute("title")
        assert Decimal(total.removeprefix("$").removesuffix(" exactly")) == final.cost_usd
        assert (final.input_tokens, final.output_tokens) == (
            cut.input_tokens + recorded.payload.input_tokens,
            cut.output_tokens + recorded.payload.output_tokens,
        )
        assert server.provider.served == 1  # completed once; the cut call was billed anyway
        assert_token_never_in_a_url(page)


async def edited_approval(ctx: Any, input: Any) -> Any:
    await ctx.model("demo:fast", [{"role": "user", "content": "Prepare a refund of $25"}])
    decision = await ctx.wait_for_message("approve")
    return {"decision": decision}


async def test_a_call_cut_off_in_a_superseded_suffix_is_shown_with_it(
    sqlite_store: Store, chromium: Any
) -> None:
    """The call at main #0 is cut off by a reload and runs again; then an edited prompt
    invalidates the stream from #0. The cut-off call was an attempt at the superseded step:
    it sits greyed in the superseded group, before that step, and is no longer beside the
    new #0. Its cost still counts, so the timeline's costs still add up to the total."""
    from decimal import Decimal

    async with serve(sqlite_store) as server:
        server.provider.hold = asyncio.Event()
        run_id = await server.start("approval", {"customer": "ada"})
        page = await page_with_token(chromium, server)
        await page.goto(f"{server.url}/runs/{run_id}")
        main = page.locator('.stream[data-stream="main"]')
        await expect(main.locator(".step.pending .live-delta")).to_have_text(re.compile(r"\S"))
        await server.stop_worker()
        server.provider.hold.set()
        await server.start_worker()
        await expect(page.locator("#run-status")).to_have_text("waiting")
        await expect(main.locator("> .steps > .step.cut-off")).to_have_count(1)

        server.registry.add("approval", edited_approval, code_version="a2")
        await page.get_by_label("Payload").fill('{"by": "ada"}')
        await page.get_by_role("button", name="Send message").click()
        await expect(page.locator("#run-status")).to_have_text("completed")

        inv = main.locator("> .steps > .invalidation")
        await expect(inv).to_contain_text("Invalidated from #0")
        superseded = inv.locator(".superseded")
        await expect(superseded.locator("> p")).to_contain_text("1 model call cut off")
        old = superseded.locator("> .steps > .step")
        await expect(old.nth(0)).to_have_attribute("data-cut-off", "")
        await expect(old.nth(1)).to_have_attribute("data-kind", "model")
        await expect(old.locator("> .step-row > .pos").nth(0)).to_have_text("#0")
        await expect(old.nth(0)).to_have_css("opacity", re.compile(r"^0(\.\d+)?$"))
        await expect(main.locator("> .steps > .step.cut-off")).to_have_count(0)
        await expect(main.locator("h3").first).not_to_contain_text("cut off")
        await expect(page.locator("#timeline-legend")).to_contain_text("1 model call cut off")
        new = main.locator("> .steps > .step[data-kind=model]")
        await expect(new).to_contain_text("Understood: Prepare a refund of $25")

        final = await sqlite_store.get_run(run_id)
        assert final is not None and final.invalidations == 1
        shown = await page.locator("#timeline .cost").evaluate_all("els => els.map((e) => e.title)")
        costs = [Decimal(t.removeprefix("$").removesuffix(" exactly")) for t in shown]
        assert len(costs) == 3 and all(costs)  # the cut-off, the superseded and the new call
        assert sum(costs) == final.cost_usd
