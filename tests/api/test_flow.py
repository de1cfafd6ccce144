"""Concurrency keys over HTTP: a start with a key and a limit, a queued run's reason and
place in `GET /v1/runs/{id}`, a bad key or limit is a 422."""

from __future__ import annotations

import asyncio

from .support import Api


async def _status(api: Api, run_id: str, status: str) -> dict:  # type: ignore[type-arg]
    deadline = asyncio.get_running_loop().time() + 30
    async with api.http() as http:
        while True:
            body = (await http.get(f"/v1/runs/{run_id}")).json()
            if body["status"] == status:
                return body  # type: ignore[no-any-return]
            assert asyncio.get_running_loop().time() < deadline, body
            await asyncio.sleep(0.05)


async def test_a_key_over_its_limit_waits_queued_and_says_why(api: Api) -> None:
    first = await api.client.start_run(
        "approval", None, concurrency_key="desk-7", concurrency_limit=1
    )
    second = await api.client.start_run(
        "approval", None, concurrency_key="desk-7", concurrency_limit=1
    )
    await _status(api, first.id, "waiting")
    queued = await _status(api, second.id, "queued")
    assert queued["concurrency"] == {"key": "desk-7", "limit": 1, "priority": 0}
    assert queued["queue"]["position"] == 1 and queued["queue"]["holding"] == 1
    assert "at its limit of 1" in queued["queue"]["reason"]
    again = await api.client.get_run(second.id)
    assert again.queue is not None and again.queue["key"] == "desk-7"
    await api.client.send_message(first.id, "approve", "yes")
    await _status(api, second.id, "waiting")  # its turn came


async def test_bad_flow_fields_are_422(api: Api) -> None:
    async with api.http() as http:
        for body in (
            {"concurrency_key": "k"},
            {"concurrency_key": "k", "concurrency_limit": 0},
            {"concurrency_key": "", "concurrency_limit": 1},
            {"priority": "high"},
        ):
            response = await http.post("/v1/runs", json={"agent": "approval", **body})
            assert response.status_code == 422, (body, response.text)
