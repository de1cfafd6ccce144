"""``toren runs verify`` covers responses, usage and the event chain (issue 40, item 6).

Runs recorded on SQLite and PostgreSQL by the real engine (concurrent streams, concurrent
runs through group commit, a second tick, a message, a retry and a cancel, which are
written outside a step) verify end to end: every response digest re-derives and every
event links to the one before it. Then, on a copy of the database, a tampered response
text, token count and cost, and a deleted event are each reported with their position,
and the command exits non-zero."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import toren
from tests.compat.test_v0_1_fixtures import Raw
from tests.conftest import PG_ADMIN, drop_pg_database, pg_url
from toren.cli.main import cli
from toren.cli.verify import EXIT_MISMATCH
from toren.core.contract.model_types import Usage
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

GATE: dict[str, bool] = {"open": False}


def note(text: str) -> dict[str, Any]:
    return {"noted": text}


def boom(text: str) -> dict[str, Any]:
    raise RuntimeError(f"boom {text}")


def gate() -> str:
    if not GATE["open"]:
        raise RuntimeError("the gate is shut")
    return "through"


async def audited(ctx: toren.Context, input: Any) -> Any:
    first = await ctx.model("scripted:echo", [{"role": "user", "content": f"hello {input}"}])
    # Concurrent streams of one run: their events share the run's chain.
    await ctx.gather(
        *(ctx.tool("note", {"text": str(i)}) for i in range(3)),
        ctx.model("scripted:echo", [{"role": "user", "content": f"aside {input}"}]),
    )
    try:
        await ctx.tool("boom", {"text": str(input)})
    except toren.ToolFailed:
        pass
    await ctx.now()
    go = await ctx.wait_for_message("go")  # parks: the next tick continues the chain
    return {"answer": first.text, "go": go}


async def retried(ctx: toren.Context, input: Any) -> Any:
    await ctx.model("scripted:echo", [{"role": "user", "content": "try"}])
    return {"gate": await ctx.tool("gate", {})}  # fails the run until the gate opens


async def waits(ctx: toren.Context, input: Any) -> Any:
    return await ctx.wait_for_message("never")


def registry() -> toren.Registry:
    tools = {
        name: toren.ToolDef(name, fn, ToolSpec(name))
        for name, fn in (("note", note), ("boom", boom), ("gate", gate))
    }
    reg = toren.Registry()
    reg.add("audited", audited, tools=tools, code_version="v1")
    reg.add("retried", retried, tools=tools, code_version="v1")
    reg.add("waits", waits, code_version="v1")
    return reg


def price(_ref: str, usage: Usage) -> Decimal:
    return Decimal("0.000002") * usage.input_tokens + Decimal("0.000008") * usage.output_tokens


async def record(store: Store) -> dict[str, str]:
    """Runs of every path that writes events; their ids by role."""
    reg = registry()
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": ScriptedProvider()}, pricing=price
    )
    audited_runs = [await toren.start_run(store, reg, "audited", n) for n in range(4)]
    ticks = await asyncio.gather(*(toren.tick(r.id, deps) for r in audited_runs))  # batched
    assert {t.status for t in ticks} == {"waiting"}, ticks
    for r in audited_runs:
        await store.send_message(r.id, "go", {"ok": True}, now=time.time())
    ticks = await asyncio.gather(*(toren.tick(r.id, deps) for r in audited_runs))
    assert {t.status for t in ticks} == {"completed"}, ticks

    GATE["open"] = False
    again = await toren.start_run(store, reg, "retried", None)
    assert (await toren.tick(again.id, deps)).status == "failed"
    GATE["open"] = True
    await toren.retry_run(store, reg, again.id)  # RunRetried: written outside a tick
    assert (await toren.tick(again.id, deps)).status == "completed"

    cancelled = await toren.start_run(store, reg, "waits", None)
    assert (await toren.tick(cancelled.id, deps)).status == "waiting"
    await store.request_cancel(cancelled.id, now=time.time())
    assert (await toren.tick(cancelled.id, deps)).status == "cancelled"
    # A fork: its copied history is inserted with its RunStarted (at run creation).
    forked = await toren.fork_run(store, reg, audited_runs[0].id, at="main:2")
    await store.send_message(forked.id, "go", {"ok": "fork"}, now=time.time())
    assert (await toren.tick(forked.id, deps)).status == "completed"
    ids = {f"audited{i}": r.id for i, r in enumerate(audited_runs)}
    return {**ids, "retried": again.id, "cancelled": cancelled.id, "forked": forked.id}


def _verify(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["runs", "verify", "--database-url", url, *args])


def _report(url: str, run_id: str) -> dict[str, Any]:
    done = _verify(url, run_id, "--json")
    return json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))


@pytest.fixture
def recorded(db_url: str) -> dict[str, str]:
    async def go() -> dict[str, str]:
        store = await toren.connect(db_url)
        try:
            return await record(store)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.fixture
def copy_of(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A copy of the recorded database (taken after ``recorded``), to tamper with."""
    if db_url.startswith("sqlite:///"):
        target = tmp_path / "copy.db"
        shutil.copy(db_url.removeprefix("sqlite:///"), target)
        yield f"sqlite:///{target}"
        return
    import psycopg

    source = db_url.rpartition("/")[2]
    name = f"toren_copy_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


def test_recorded_runs_verify_with_responses_and_chain_covered(
    db_url: str, recorded: dict[str, str]
) -> None:
    done = _verify(db_url, "--all", "--strict")
    assert done.exit_code == 0, done.output
    for role, run_id in recorded.items():
        report = _report(db_url, run_id)
        assert report["ok"], (role, report)
        chain = report["chain"]
        assert chain["breaks"] == [] and chain["not_covered"] == 0
        assert chain["linked"] >= 3 and re.fullmatch(r"[0-9a-f]{64}", chain["head"])
        for check in report["checks"]:
            expected = "verified" if check["kind"] in ("model", "tool") else "none"
            assert check["response"] == expected, (role, check)
    audited = _report(db_url, recorded["audited0"])
    # RunStarted, 2 model calls, 4 tool calls, now, RunWaiting, MessageReceived,
    # RunCompleted: every event of the log is linked.
    assert audited["chain"]["linked"] == 11
    assert audited["responses"] == {"verified": 6, "mismatch": 0, "not_covered": 0}
    assert "response and usage verified" in done.output
    assert "chain: ok" in done.output


def _one(raw: Raw, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
    rows = raw.all(sql, params)
    assert rows, (sql, params)
    return rows[0]


def test_tampered_responses_usage_and_a_deleted_event_are_each_reported(
    recorded: dict[str, str], copy_of: str
) -> None:
    backend = "sqlite" if copy_of.startswith("sqlite") else "postgres"
    raw = Raw(backend, copy_of)
    model_call = (
        "SELECT seq, stream, position, payload FROM events WHERE run_id = ? "
        "AND type = 'ModelCallRecorded' ORDER BY seq LIMIT 1"
    )
    tampered: dict[str, tuple[int, str, int]] = {}
    try:
        # 1. The response text.
        seq, stream, pos, payload = _one(raw, model_call, (recorded["audited0"],))
        assert "hello 0" in payload
        raw.x(
            "UPDATE events SET payload = ? WHERE seq = ?",
            (payload.replace("hello 0", "HELLO 0"), seq),
        )
        tampered["text"] = (seq, stream, pos)
        # 2. A token count.
        seq, stream, pos, payload = _one(raw, model_call, (recorded["audited1"],))
        count = json.loads(payload)["output_tokens"]
        assert count > 0
        edited = payload.replace(f'"output_tokens":{count}', f'"output_tokens":{count + 1000}')
        assert edited != payload
        raw.x("UPDATE events SET payload = ? WHERE seq = ?", (edited, seq))
        tampered["tokens"] = (seq, stream, pos)
        # 3. The cost.
        seq, stream, pos, payload = _one(raw, model_call, (recorded["audited2"],))
        cost = json.loads(payload)["cost_usd"]
        assert Decimal(cost) > 0
        raw.x(
            "UPDATE events SET payload = ? WHERE seq = ?",
            (payload.replace(f'"cost_usd":"{cost}"', '"cost_usd":"0.00000001"'), seq),
        )
        tampered["cost"] = (seq, stream, pos)
        # 4. A deleted event: the first tool call of the run.
        ((deleted,),) = raw.all(
            "SELECT seq FROM events WHERE run_id = ? AND type = 'ToolCallRecorded' "
            "ORDER BY seq LIMIT 1",
            (recorded["audited3"],),
        )
        ((after,),) = raw.all(
            "SELECT seq FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT 1",
            (recorded["audited3"], deleted),
        )
        raw.x("DELETE FROM events WHERE seq = ?", (deleted,))
    finally:
        raw.close()

    for what, run in (("text", "audited0"), ("tokens", "audited1"), ("cost", "audited2")):
        seq, stream, pos = tampered[what]
        done = _verify(copy_of, recorded[run])
        assert done.exit_code == EXIT_MISMATCH, (what, done.output)
        assert re.search(rf"MISMATCH\s+seq {seq}\s+{re.escape(stream)}:{pos} ", done.output), what
        assert "response or usage MISMATCH" in done.output
        assert f"CHAIN BREAK  seq {seq} (ModelCallRecorded, stream {stream!r} position {pos})" in (
            done.output
        )
        report = _report(copy_of, recorded[run])
        assert not report["ok"]
        (bad,) = [c for c in report["checks"] if c["response"] == "mismatch"]
        assert (bad["seq"], bad["stream"], bad["position"]) == (seq, stream, pos)
        assert bad["verdict"] == "verified"  # the request itself was not touched
        assert [b["seq"] for b in report["chain"]["breaks"]] == [seq]

    done = _verify(copy_of, recorded["audited3"])
    assert done.exit_code == EXIT_MISMATCH, done.output
    assert f"CHAIN BREAK  seq {after} " in done.output
    report = _report(copy_of, recorded["audited3"])
    assert [b["seq"] for b in report["chain"]["breaks"]] == [after]
    assert "deleted" in report["chain"]["breaks"][0]["note"]
    assert report["mismatch"] == 0  # no request digest changed

    # The untouched runs of the copy, and the original database, still verify.
    for run in ("retried", "cancelled", "forked"):
        assert _verify(copy_of, recorded[run]).exit_code == 0
    everything = _verify(copy_of, "--all")
    assert everything.exit_code == EXIT_MISMATCH
    assert "4 breaks" in everything.output
