"""The console's HTML shells. Each page is static markup plus one script that fetches the
data with the user's token; the values spliced in are a (validated, escaped) run id and
Toren's vocabulary (:func:`toren.core.contract.values.vocabulary`: statuses, step kinds,
invalidation causes), so the scripts never spell those sets themselves."""

from __future__ import annotations

import json
from html import escape
from importlib.resources import files

import toren
from toren.core.contract.values import STATUSES, vocabulary

_TEMPLATES = files("toren.console") / "templates"

NAV = (
    ("/", "Runs", "runs"),
    ("/agents", "Agents", "agents"),
    ("/schedules", "Schedules", "schedules"),
    ("/flow", "Flow", "flow"),
    ("/plan", "Replay plan", "plan"),
)
TITLES = {
    "runs": "Runs",
    "run": "Run",
    "agents": "Agents",
    "schedules": "Schedules",
    "flow": "Flow",
    "plan": "Replay plan",
    "login": "Sign in",
    "missing": "Not found",
}


# Read by app.js (the CSP allows no inline script, so it travels as an attribute).
_VOCABULARY = escape(json.dumps(vocabulary(), separators=(",", ":")), quote=True)


def render(page: str, *, run_id: str = "") -> str:
    body = (_TEMPLATES / f"{page}.html").read_text("utf-8")
    body = body.replace("{{run_id}}", escape(run_id, quote=True))
    body = body.replace("{{status_options}}", "".join(f"<option>{s}</option>" for s in STATUSES))
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if key == page else ""}>{label}</a>'
        for href, label, key in NAV
    )
    title = TITLES[page] + (f" {escape(run_id)}" if run_id else "")
    script = (
        ""
        if page == "missing"
        else (f'<script type="module" src="/console/static/{page}.js"></script>')
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{title} · Toren</title>
<link rel="icon" href="/console/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/console/static/console.css">
{script}
</head>
<body data-page="{page}" data-vocabulary="{_VOCABULARY}">
<a class="skip" href="#main">Skip to content</a>
<header class="top">
  <a class="brand" href="/"><img src="/console/static/favicon.svg" alt="" width="20"
    height="20">Toren</a>
  <nav aria-label="Console">{nav}</nav>
  <div class="session" id="session"></div>
</header>
<main id="main" tabindex="-1">
<noscript><p class="notice">The console needs JavaScript to load data from the API.</p>
</noscript>
{body}
</main>
<div id="announcer" class="visually-hidden" aria-live="polite" aria-atomic="true"></div>
<footer class="foot">Toren {escape(toren.__version__)}</footer>
</body>
</html>
"""
