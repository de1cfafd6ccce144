"""``POST /v1/runs/{id}/retry`` bounds its limits (docs/http-api.md), strictly."""

from __future__ import annotations

from typing import Any


async def test_retry_limits_are_strict_numbers_in_range(api: Any) -> None:
    """Issue 34 item 4: ``true`` and ``"5"`` are not limits; out-of-range ones neither."""
    async with api.http() as http:
        url = "/v1/runs/run_0123456789abcdef012345/retry"
        for body in (
            {"max_steps": True},
            {"max_steps": "5"},
            {"max_steps": 0},
            {"max_steps": 1_000_001},
            {"max_steps": 2.5},
            {"max_cost_usd": True},
            {"max_cost_usd": "5"},
            {"max_cost_usd": 0},
            {"max_cost_usd": 1e7},
        ):
            response = await http.post(url, json=body)
            assert response.status_code == 422, (body, response.text)
        # In range, the documented edges included: validated, then the run is looked up
        # (there is none).
        for body in (
            {"max_steps": 5, "max_cost_usd": 2},
            {"max_steps": 1, "max_cost_usd": 0.01},
            {"max_steps": 1_000_000, "max_cost_usd": 1_000_000},
        ):
            response = await http.post(url, json=body)
            assert response.status_code == 404, (body, response.text)
