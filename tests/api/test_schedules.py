"""``/v1/schedules`` over HTTP with the Python client, on both databases: create, list,
pause and resume with a note, trigger, backfill, delete; bad definitions are 422s that
name the field; the worker behind the API fires what is due."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
import pytest

from toren.client import TorenAPIError
from toren.core.drivers.runs import wait_for_run

from .support import Api


async def test_schedules_over_http(api: Api) -> None:
    client = api.client
    made = await client.create_schedule(
        "echo", "beat", every="1s", input={"n": 1}, overlap="allow_all", catch_up="all"
    )
    assert made["id"] == "echo/beat" and made["source"] == "api" and made["every"] == 1
    assert len(made["upcoming"]) == 5 and not made["paused"]
    # The worker behind the API fires it: a run whose origin is the schedule.
    deadline = time.monotonic() + 60
    while not (await client.get_schedule("echo/beat"))["recent_runs"]:
        assert time.monotonic() < deadline, "the schedule never fired"
        await asyncio_sleep()
    first = (await client.get_schedule("echo/beat"))["recent_runs"][-1]
    run = await wait_for_run(api.store, first["id"])
    assert run.status == "completed"
    events = await client.events(first["id"])
    assert events.events[0].payload["schedule"] == {"id": "echo/beat", "nominal": first["nominal"]}
    shown = await client.get_run(first["id"])
    assert shown.schedule == {"id": "echo/beat", "nominal": first["nominal"]}

    async with api.http() as http:
        text = (await http.get("/metrics")).text
    fires = next(
        line for line in text.splitlines() if line.startswith("toren_schedule_fires_total{")
    )
    assert fires.startswith('toren_schedule_fires_total{schedule="echo/beat"} ')
    assert int(fires.split()[-1]) >= 1
    assert 'toren_schedule_skips_total{schedule="echo/beat"} 0' in text
    assert 'toren_schedule_paused{schedule="echo/beat"} 0' in text
    assert "toren_schedule_lateness_seconds_total" in text

    paused = await client.pause_schedule("echo/beat", note="quiet hours")
    assert paused["paused"] and paused["note"] == "quiet hours" and paused["upcoming"] == []
    listed = await client.schedules()
    assert [(s["id"], s["paused"], s["note"]) for s in listed] == [
        ("echo/beat", True, "quiet hours")
    ]
    resumed = await client.resume_schedule("echo/beat")
    assert not resumed["paused"]

    triggered = await client.trigger_schedule("echo/beat")
    assert triggered.agent == "echo"
    await client.pause_schedule("echo/beat")
    start = datetime(2026, 1, 1, 0, 0, tzinfo=UTC).isoformat()
    end = datetime(2026, 1, 1, 0, 1, tzinfo=UTC).isoformat()
    assert await client.backfill_schedule("echo/beat", start, end) == {
        "started": 60,
        "already_ran": 0,
        "refused": 0,
    }
    assert await client.backfill_schedule("echo/beat", start, end) == {
        "started": 0,
        "already_ran": 60,
        "refused": 0,
    }
    await client.delete_schedule("echo/beat")
    with pytest.raises(TorenAPIError) as raised:
        await client.get_schedule("echo/beat")
    assert raised.value.status == 404 and raised.value.code == "schedule_not_found"


async def asyncio_sleep() -> None:
    import asyncio

    await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"cron": "0 25 * * *"}, "not a valid cron expression"),
        ({"cron": "0 9 * * *", "zone": "Mars/Olympus"}, "IANA time zone"),
        ({"every": "0s"}, "at least 1 s"),
        ({"every": "soon"}, "bad duration"),
        ({}, "exactly one of 'cron'"),
        ({"every": 60, "overlap": "sometimes"}, "overlap"),
        ({"every": 60, "extra": 1}, "extra"),
    ],
)
async def test_a_bad_schedule_is_a_422_naming_the_field(
    api: Api, body: dict[str, object], expected: str
) -> None:
    async with api.http() as http:
        response = await http.post("/v1/schedules", json={"agent": "echo", "name": "x", **body})
    assert response.status_code == 422, response.text
    assert expected in response.text
    assert await api.store.schedules.all() == []


async def test_unknown_agent_and_schedule_are_404(api: Api) -> None:
    async with api.http() as http:
        response = await http.post(
            "/v1/schedules", json={"agent": "nobody", "name": "x", "every": 60}
        )
        assert response.status_code == 404
        for method, path in [
            ("GET", "/v1/schedules/echo/none"),
            ("POST", "/v1/schedules/echo/none/pause"),
            ("POST", "/v1/schedules/echo/none/trigger"),
            ("DELETE", "/v1/schedules/echo/none"),
        ]:
            response = await http.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["code"] == "schedule_not_found"
        response = await http.get(
            "/v1/schedules", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}
        )
        assert response.status_code == 401
    assert isinstance(httpx.__version__, str)
