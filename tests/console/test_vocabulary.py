"""The console's scripts take Toren's fixed sets from the page the server renders
(``toren.core.contract.values.vocabulary``), never from lists of their own."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from toren.core.contract.values import STATUSES, TERMINAL_STATUSES, InvalidationCause, vocabulary
from toren.store import Store

from .support import serve
from .test_browser import expect, page_with_token

STATIC = files("toren.console") / "static"
TEMPLATES = files("toren.console") / "templates"


async def test_scripts_read_the_vocabulary_the_server_renders(
    sqlite_store: Store, chromium: Any
) -> None:
    """In Chromium: app.js exports exactly the sets of core.contract.values, the status filter
    offers every status in the enum's order, and the totals link each status a run has."""
    async with serve(sqlite_store) as server:
        run_id = await server.start("writer", {"topic": "vocabulary"})
        await server.wait_status(run_id, "completed")
        page = await page_with_token(chromium, server)
        await page.goto(server.url + "/")
        exported = await page.evaluate(
            """import("/console/static/app.js").then((m) => ({
                statuses: [...m.STATUSES], terminal: [...m.TERMINAL],
                kinds: m.KIND, causes: m.CAUSE, status: m.STATUS }))"""
        )
        assert exported["statuses"] == [s.value for s in STATUSES]
        assert set(exported["terminal"]) == set(TERMINAL_STATUSES)
        assert exported["kinds"] == vocabulary()["StepKind"]
        assert exported["causes"] == vocabulary()["InvalidationCause"]
        assert exported["status"] == vocabulary()["RunStatus"]
        options = await page.locator("#f-status option").all_text_contents()
        assert options == ["any", *(s.value for s in STATUSES)]
        await expect(page.locator('#t-status a[href="/?status=completed"]')).to_have_text(
            "1 completed"
        )


def test_no_script_or_template_spells_a_status_or_a_cause() -> None:
    """A status or an invalidation cause written as a string literal in a console script
    or template would be a second place to change: they come from ``app.js``'s
    ``STATUS``, ``TERMINAL``, ``STATUSES`` and ``CAUSE``."""
    words = {*(s.value for s in STATUSES), *(c.value for c in InvalidationCause)}
    alternatives = "|".join(sorted(words))
    literal = re.compile(rf"""["'`>]({alternatives})["'`<]""")
    found = []
    for folder, suffix in ((STATIC, ".js"), (TEMPLATES, ".html")):
        for item in folder.iterdir():
            if item.name.endswith(suffix):
                text = item.read_text("utf-8")
                found += [f"{item.name}: {m.group(0)}" for m in literal.finditer(text)]
    assert found == []
