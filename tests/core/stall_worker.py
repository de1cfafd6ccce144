"""A worker process for the stalled-worker tests: serves the `mailer` and `napper` agents
(model calls through the real ``openai`` SDK, a side-effecting tool between them; the
napper parks on a durable timer after each round) until SIGTERM, then drains and exits 0;
meanwhile it prints its sticky cache's counters as they change. The tests freeze it with
SIGSTOP, thaw it with SIGCONT and kill it with SIGKILL, and count what the loopback model
server and the tool actually did.

    python -m tests.core.stall_worker DB_URL OPENAI_BASE_URL EFFECTS_FILE TTL HEARTBEAT

The tool appends one JSON line per execution to EFFECTS_FILE, noting whether its step was
already recorded in the log when it ran (which must never happen: that would be a side
effect re-executed after the step was durable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

import toren
from toren.config import LeaseSettings
from toren.core.agent_api.program import ToolDef
from toren.providers.base import ToolSpec
from toren.providers.openai import OpenAIProvider
from toren.store.sqlite import parse_sqlite_url

FAKE_KEY = "sk-test-SECRET-0123456789abcdef"


async def mailer(ctx: toren.Context, input: Any) -> Any:
    """``steps`` rounds of: a model call, a plain ``await`` (``pause`` s), the email."""
    tag, replies = input["tag"], []
    for k in range(input["steps"]):
        reply = await ctx.model("openai:gpt-4o-mini", [{"role": "user", "content": f"{tag} {k}"}])
        replies.append(reply.text)
        await asyncio.sleep(input["pause"])
        await ctx.tool("send_email", {"tag": tag, "k": k})
    return {"replies": replies}


async def napper(ctx: toren.Context, input: Any) -> Any:
    """``steps`` rounds of: a model call, the email, then a durable nap (``ctx.sleep``:
    the run parks, the worker keeps it in its sticky cache, and whichever worker claims
    it when the timer fires continues it, in place if it is the one that kept it)."""
    tag, replies = input["tag"], []
    for k in range(input["steps"]):
        reply = await ctx.model("openai:gpt-4o-mini", [{"role": "user", "content": f"{tag} {k}"}])
        replies.append(reply.text)
        await ctx.tool("send_email", {"tag": tag, "k": k})
        await ctx.sleep(input["nap"])
    return {"replies": replies}


NAP = "nap-"  # the tags of napper runs start so: three positions a round, not two


def position(tag: str, k: int, kind: str) -> int:
    """The stream position of round ``k``'s model call or email in the run tagged
    ``tag``: a mailer round takes two (the call, the email), a napper round three (its
    timer too)."""
    stride = 3 if tag.startswith(NAP) else 2
    return stride * k + (kind == "ToolCallRecorded")


def recorded(url: str, run_tag: str, position: int, kind: str) -> bool:
    """Whether the step at ``position`` of the run tagged ``run_tag`` is in the log."""
    sql = (
        "SELECT COUNT(*) FROM events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.input LIKE {p} AND e.stream = 'main' AND e.position = {p} AND e.type = {p}"
    )
    params = (f"%{run_tag}%", position, kind)  # tags are unique: no other run matches
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(parse_sqlite_url(url)[0], timeout=30) as conn:
            row = conn.execute(sql.format(p="?"), params).fetchone()
    else:
        import psycopg

        # Its own application name: an outage test kills the worker's connections only.
        with psycopg.connect(url, autocommit=True, application_name="toren-test-probe") as conn:
            row = conn.execute(sql.format(p="%s"), params).fetchone()
    return bool(row and row[0])


def registry(url: str = "", effects: str = "") -> toren.Registry:
    async def send_email(tag: str, k: int) -> str:
        # Checked before the effect: a stall between the two lines would hide a repeat,
        # never invent one.
        again = recorded(url, tag, position(tag, k, "ToolCallRecorded"), "ToolCallRecorded")
        with open(effects, "a") as out:
            out.write(json.dumps({"tag": tag, "k": k, "pid": os.getpid(), "again": again}))
            out.write("\n")
        await asyncio.sleep(0.3)  # the mail server's answer
        return f"sent {tag} {k}"

    spec = ToolSpec("send_email", "send one email", {"type": "object"})
    reg = toren.Registry()
    tools = {"send_email": ToolDef("send_email", send_email, spec)}
    reg.add("mailer", mailer, tools=tools)
    reg.add("napper", napper, tools=tools)
    return reg


async def report_sticky(sticky: Any) -> None:
    """What this process's sticky cache did, as it changes (a killed worker's last word
    stays in its log): ``sticky pid=P hits=H continued=C stale=S``."""
    said = None
    while sticky is not None:
        now = (sticky.hits, sticky.continued, sticky.stale)
        if now != said:
            said = now
            hits, continued, stale = now
            line = f"sticky pid={os.getpid()} hits={hits} continued={continued} stale={stale}"
            print(line, file=sys.stderr, flush=True)
        await asyncio.sleep(0.05)


async def main(url: str, base_url: str, effects: str, ttl: str, heartbeat: str) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    store = await toren.connect(url)
    provider = OpenAIProvider(api_key=FAKE_KEY, base_url=base_url)
    settings = toren.Settings(
        lease=LeaseSettings(ttl=float(ttl), heartbeat=float(heartbeat)),
        poll_interval=0.05,
        drain_window=5.0,
        inline_wait=0.0,  # every ctx.sleep parks (the napper's naps are short)
    )
    deps = toren.TickDeps(
        store=store,
        agents=registry(url, effects),
        providers={"openai": provider},
        settings=settings,
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=20)
    await worker.start()
    worker.install_signal_handlers()  # SIGTERM drains
    print(f"ready {worker.worker_id}", file=sys.stderr, flush=True)
    report = asyncio.ensure_future(report_sticky(deps.sticky))
    await worker.wait_stopped()
    report.cancel()
    await store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:6])))
