"""Issue 23: a secret never reaches the SSE byte stream, not even split across the live
token deltas of a model call in flight (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

from .support import SECRET, Api


async def test_secret_split_across_deltas_never_reaches_the_sse_bytes(api: Api) -> None:
    run = await api.client.start_run("approval", {})
    raw = b""
    async with api.http() as http, http.stream("GET", f"/v1/runs/{run.id}/stream") as response:
        sent = False
        async for chunk in response.aiter_bytes():
            raw += chunk
            if not sent and b'"type":"RunWaiting"' in raw:
                # Subscribed: the model call after this message streams its reply in
                # 8-character deltas, and the reply quotes the secret.
                await api.client.send_message(run.id, "approve", f"key {SECRET} ok")
                sent = True
            if b"event: end" in raw:
                break
    text = raw.decode()
    deltas = [
        json.loads(block.split("data: ", 1)[1])
        for block in text.split("\n\n")
        if block.startswith("event: delta")
    ]
    assert deltas, "the model call streamed no deltas"
    stored = await api.store.load_events(run.id)
    call = [e for e in stored if e.type == "ModelCallRecorded"][-1]
    assert SECRET in call.payload.response["text"]  # recorded as sent: replay needs it
    streamed = "".join(d["text"] for d in deltas if d["position"] == call.position)
    assert SECRET not in streamed and SECRET not in text
    for i in range(len(SECRET) - 6):  # not one piece of it either
        assert SECRET[i : i + 6] not in text, SECRET[i : i + 6]
    assert streamed == "decided key [redacted] ok"
