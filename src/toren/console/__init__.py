"""The web console: a run viewer served by the HTTP API (``toren serve``, ``toren dev``).

``create_app(..., console=True)`` calls :func:`mount`. The console is server-rendered HTML
shells plus small hand-written JavaScript (no build step, no third-party code):

- ``/`` runs, ``/runs/{id}`` one run, ``/agents``, ``/plan`` the replay plan, ``/login``.
  These pages and ``/console/static/*`` carry no data, so they are served without a token;
  every piece of data is fetched by the page's script from ``/v1`` (and the few
  console-only JSON routes under ``/console/api``, which need the token like ``/v1``).
- Auth: the page keeps the API token in ``sessionStorage`` (``localStorage`` when the user
  ticks "remember") and sends it as ``Authorization: Bearer``. Live streams are read with
  ``fetch()`` and a ``ReadableStream`` (``EventSource`` cannot send headers), so the token
  is never in a URL and there is no cookie (hence no CSRF surface). docs/console.md.
"""

from __future__ import annotations

from toren.console.routes import mount

__all__ = ["mount"]
