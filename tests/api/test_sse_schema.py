"""Issue 23: every message of ``GET /v1/runs/{run_id}/stream`` (events, deltas, the end,
an error) matches what the OpenAPI document says of it, ``data`` included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema

from .support import Api, read_sse


def _branches(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    media = doc["paths"]["/v1/runs/{run_id}/stream"]["get"]["responses"]["200"]["content"]
    one_of = media["text/event-stream"]["schema"]["oneOf"]
    return {b["properties"]["event"]["const"]: b for b in one_of}


def _check(doc: dict[str, Any], message: dict[str, Any]) -> None:
    """``message`` as read_sse gives it: event, id and the JSON-decoded data."""
    branches = _branches(doc)
    raw = {k: v for k, v in message.items() if k in ("event", "id")}
    raw["data"] = json.dumps(message["data"])
    validator = jsonschema.Draft202012Validator
    whole = {"components": doc["components"], **branches[message["event"]]}
    validator(whole).validate(raw)
    content = {"components": doc["components"], **whole["properties"]["data"]["contentSchema"]}
    validator(content).validate(message["data"])


async def test_stream_messages_match_the_openapi_document(api: Api) -> None:
    async with api.http() as http:
        doc = (await http.get("/v1/openapi.json")).json()
        assert set(_branches(doc)) == {"event", "delta", "replayed", "end", "error"}
        # No sticky cache: the run replays the steps before its wait when it resumes, so
        # the stream carries a "replayed" message (a run continued in place has none).
        api.runtime.deps.sticky = None
        run = await api.client.start_run("approval", {})
        seen: dict[str, int] = {}
        pending: list[Any] = []

        def until(message: dict[str, Any]) -> bool:
            if not pending and message.get("data", {}).get("type") == "RunWaiting":
                # The model call after this message streams deltas: send it now.
                pending.append(
                    asyncio.ensure_future(api.client.send_message(run.id, "approve", "yes"))
                )
            return message.get("event") in ("end", "error")

        async with http.stream("GET", f"/v1/runs/{run.id}/stream") as response:
            messages = await read_sse(response, until=until)
        await asyncio.gather(*pending)
        for message in messages:
            if "comment" in message:
                continue
            _check(doc, message)
            seen[message["event"]] = seen.get(message["event"], 0) + 1
        assert seen.get("event") and seen.get("delta") and seen.get("end") == 1, seen
        # The tick after the message replays the steps before the wait: announced, valid.
        assert seen.get("replayed"), seen
        # An error message: a resume point that is not an event of this run.
        async with http.stream("GET", f"/v1/runs/{run.id}/stream?after=999999") as response:
            errors = [m for m in await read_sse(response) if "comment" not in m]
        assert [m["event"] for m in errors] == ["error"]
        _check(doc, errors[0])
